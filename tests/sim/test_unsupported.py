"""The simulator refuses what it does not model instead of silently dropping it."""

from __future__ import annotations

import pytest

from apmw.errors import ApmwError
from apmw.sim import simulate, unsupported
from apmw.spec import spec_from_dict
from tests.conftest import small_spec_dict


@pytest.mark.parametrize("section,field,value,words", [
    ("serving", "disaggregation", {"prefill_gpus": 1}, "disaggregated prefill"),
])
def test_unmodelled_features_are_refused(section, field, value, words):
    d = small_spec_dict()
    d[section][field] = value
    spec = spec_from_dict(d)
    assert words in unsupported(spec)
    with pytest.raises(ApmwError, match=words):
        simulate(spec, 2, duration_s=60)


def test_plain_spec_is_supported():
    assert unsupported(spec_from_dict(small_spec_dict())) is None


def test_speculative_decoding_is_simulated():
    d = small_spec_dict()
    d["serving"]["speculative"] = {"draft_tokens": 4, "acceptance_rate": 0.7}
    assert unsupported(spec_from_dict(d)) is None


def test_a_workload_past_the_context_window_is_refused_by_the_python_api_too():
    """`apmw simulate` refused a workload whose calls overrun the model's window, but `apmw.sim.simulate` ran it
    with every such call refused by the engine and no task recorded (session 44's note): the rule is the
    simulator's now, as `apmw plan`'s, and replayed task shapes (a trace) are not held to the spec's workload."""
    from apmw.sim import TaskShape

    d = small_spec_dict()
    d["workload"]["new_input_tokens_per_call"] = {"mean": 200_000, "p95": 300_000}   # past the 131,072 window
    spec = spec_from_dict(d)
    with pytest.raises(ApmwError, match="context window of 131,072 tokens"):
        simulate(spec, 2, duration_s=60)
    shapes = [TaskShape(new_input_tokens=(300, 200), output_tokens=(100, 100), wait_after_s=(2.0, 0.0))]
    r = simulate(spec, 2, duration_s=120, tasks=shapes)
    assert r.completed_tasks > 0
