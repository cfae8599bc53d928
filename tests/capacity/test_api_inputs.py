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
