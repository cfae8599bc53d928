"""Plans in one process share a priced session sample where nothing pricing reads differs."""

import numpy as np
import pytest

from apmw.capacity.sessions import sample_sessions
from apmw.perf import replica_from_spec
from apmw.spec import spec_from_dict
from tests.conftest import small_spec_dict


def _sample(**changes):
    d = small_spec_dict()
    for section, fields in changes.items():
        d[section] = {**d.get(section, {}), **fields}
    spec = spec_from_dict(d)
    return sample_sessions(spec, replica_from_spec(spec))


def test_a_batch_limit_or_memory_share_reuses_the_sample():
    base = _sample()
    assert _sample(serving={"max_batch": 17}) is base
    assert _sample(serving={"kv_memory_fraction": 0.8}) is base


@pytest.mark.parametrize("changes", [{"model": {"kv_dtype": "fp8"}}, {"serving": {"max_batched_tokens": 512}},
                                     {"serving": {"tool_wait_kv_policy": "evict"}}, {"seed": 7}])
def test_what_pricing_reads_gets_its_own_sample(changes):
    if "seed" in changes:
        d = small_spec_dict() | {"seed": 7}
        spec = spec_from_dict(d)
        other = sample_sessions(spec, replica_from_spec(spec))
    else:
        other = _sample(**changes)
    assert other is not _sample()


def test_a_shared_sample_cannot_be_changed_by_one_of_its_users():
    s = _sample()
    with pytest.raises(ValueError, match="read-only"):
        s.calls[0] = 1.0
    assert isinstance(s.calls, np.ndarray)
