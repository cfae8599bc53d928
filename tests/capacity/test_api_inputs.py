"""The Python API's plan and simulate refuse what the CLI's parser would: a path where a loaded spec belongs, and
a seed that is no whole number from 0 to 2**63 - 1; each with what to do instead."""

from __future__ import annotations

import numpy as np
import pytest

from apmw import load_spec, plan, simulate
from apmw.errors import ApmwError
from apmw.examples import bundled_examples


@pytest.mark.parametrize("verb", [plan, lambda s: simulate(s, 2, 60)])
def test_a_path_given_for_a_spec_says_to_load_it(verb):
    with pytest.raises(ApmwError, match=r"takes a Spec, got str; load the file first: .*apmw.load_spec\('s.yaml'\)"):
        verb("s.yaml")


@pytest.mark.parametrize("seed", [-1, 1.5, "7", True, 2**63])
def test_a_seed_that_is_no_whole_number_in_range_is_refused(seed):
    spec = load_spec(bundled_examples()["support-chat"])
    with pytest.raises(ApmwError, match="give a whole number from 0 to 9223372036854775807"):
        simulate(spec, 2, 60, seed=seed)


def test_a_numpy_integer_seed_is_a_seed():
    spec = load_spec(bundled_examples()["support-chat"])
    assert simulate(spec, 2, 60, seed=np.int64(3)).seed == 3


@pytest.mark.parametrize("prompt,output,rate,said", [
    ([100, -5], [10, 10], 1.0, "finite token counts >= 0"),
    ([100, float("nan")], [10, 10], 1.0, "finite token counts >= 0"),
    ([100] * 20, [10] * 5, 1.0, "two lists of the same length"),
    ([], [], 1.0, "two lists of the same length of at least one"),
    ([100], [10], float("inf"), "rate_per_s must be a finite number > 0"),
])
def test_an_open_loop_simulation_refuses_lengths_and_rates_it_would_have_bent(prompt, output, rate, said):
    """Negative and NaN lengths were served as one token, unmatched lists as the shorter one's requests."""
    from apmw.sim import simulate_open_loop

    spec = load_spec(bundled_examples()["support-chat"])
    with pytest.raises(ApmwError, match=said):
        simulate_open_loop(spec, np.array(prompt), np.array(output), rate)


@pytest.mark.parametrize("call,said", [
    (lambda: load_spec(5), "load_spec takes a spec file's path (a str or pathlib.Path), got int"),
    (lambda: __import__("apmw").architecture_summary(5), "architecture_summary takes an Architecture, got int"),
    (lambda: __import__("apmw").predict("meta-llama/Meta-Llama-3.1-8B", "H100", "1", "bf16", "bf16", 100, 10, 4),
     "tp must be a whole number of at least 1 (got '1')"),
    (lambda: __import__("apmw").predict_rate("meta-llama/Meta-Llama-3.1-8B", "H100", 1.5, "bf16", "bf16", 100, 10,
                                             1.0), "tp must be a whole number of at least 1 (got 1.5)"),
    # fuzz round 9
    (lambda: simulate(load_spec(bundled_examples()["support-chat"]), 2.5, 60),
     "agents must be a whole number between 1 and 200,000"),
    (lambda: plan(load_spec(bundled_examples()["support-chat"]), guess=2.5), "guess 2.5: give a whole number"),
    (lambda: __import__("apmw").predict("meta-llama/Meta-Llama-3.1-8B", "H100", 1, "bf16", "bf16", 100, 10, 4,
                                        layout="x"), "layout must be a mapping of parallel sizes"),
    (lambda: __import__("apmw").predict("meta-llama/Meta-Llama-3.1-8B", "H100", 1, "bf16", "bf16", 100, 10, 4,
                                        layout={"tp": 2}), "layout gives tp 2 and the tp argument 1"),
    (lambda: __import__("apmw").predict("meta-llama/Meta-Llama-3.1-8B", "H100", 1, "bf16", "bf16", 100, 10, 4,
                                        request_overhead_s=float("inf")),
     "request_overhead_s must be a finite non-negative number of seconds (got inf)"),
    (lambda: __import__("apmw").predict_rate("meta-llama/Meta-Llama-3.1-8B", "H100", 1, "bf16", "bf16", 100, 10,
                                             "1"), "request_rate_per_s must be a finite positive number (got '1'"),
])
def test_an_argument_of_the_wrong_type_is_said_not_raised_from_deep_inside(call, said):
    """A TypeError or AttributeError from deep inside (fuzz round 8): the CLI's parser checks these; the API did not."""
    from apmw.spec import SpecError

    with pytest.raises((ApmwError, SpecError), match=said.replace("(", r"\(").replace(")", r"\)")):
        call()
