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
