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


def test_the_kept_samples_are_bounded_by_the_bytes_they_hold(monkeypatch):
    """Every sample is kept while their arrays fit SAMPLE_CACHE_BYTES (a search cycling through 24 keeps them
    all); past it the oldest go, and the newest is kept whatever its size."""
    from apmw.capacity import sessions

    sessions._SAMPLES.clear()
    kept = [_sample(serving={"max_batched_tokens": 256 + 64 * i}) for i in range(6)]
    assert len(sessions._SAMPLES) == 6
    assert all(_sample(serving={"max_batched_tokens": 256 + 64 * i}) is s for i, s in enumerate(kept))
    one = sessions._held_bytes(next(iter(sessions._SAMPLES.values())))
    assert one > 0
    monkeypatch.setattr(sessions, "SAMPLE_CACHE_BYTES", int(2.5 * one))
    _sample(serving={"max_batched_tokens": 4096})
    assert len(sessions._SAMPLES) == 2
    monkeypatch.setattr(sessions, "SAMPLE_CACHE_BYTES", 1)
    newest = _sample(serving={"max_batched_tokens": 8192})
    assert len(sessions._SAMPLES) == 1 and any(s is newest for s in next(iter(sessions._SAMPLES.values())))
