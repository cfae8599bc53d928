"""The engine curve's chunk draws: the weighted choice searched in sorted order picks what numpy's does."""

import numpy as np
import pytest

from apmw.capacity.engine_curve import weighted_choice


@pytest.mark.parametrize("seed", range(12))
def test_the_weighted_choice_picks_what_numpy_picks_from_the_same_stream(seed):
    g = np.random.default_rng(seed)
    n = int(g.integers(1, 25_000))
    weights = g.integers(1, 8, n).astype(float)       # prefill iterations per call, as the curve weighs calls
    if seed % 3 == 0:
        weights[g.random(n) < 0.3] = 0.0             # calls that never prefill are never picked
        weights[0] = max(weights[0], 1.0)
    p = weights / weights.sum()
    shape = (33, 4096) if seed % 2 else (5, 7)
    a, b = np.random.default_rng([seed, 1]), np.random.default_rng([seed, 1])
    expected = a.choice(n, size=shape, p=p)
    picked = weighted_choice(b, p, shape)
    assert picked.shape == expected.shape and np.array_equal(picked, expected)
    assert a.random() == b.random()                   # the stream is left where numpy leaves it
    assert (weights[picked] > 0).all()


def test_replicas_that_serve_one_sample_share_its_chunk_draws():
    """A sample priced on two replicas (two GPU counts of one workload: copies that share the sample's arrays,
    apmw.capacity.prefill_queue.priced_on) is drawn once; a sample drawn anew (another seed) is drawn again."""
    from apmw.capacity.engine_curve import chunks_on_ranks
    from apmw.capacity.prefill_queue import priced_on
    from apmw.capacity.sessions import sample_sessions
    from apmw.perf import replica_from_spec
    from apmw.spec import spec_from_dict
    from tests.conftest import small_spec_dict

    one, two = (spec_from_dict(small_spec_dict() | {"hardware": {**small_spec_dict()["hardware"],
                                                                  "gpus_per_replica": g}}) for g in (1, 2))
    r1, r2 = replica_from_spec(one), replica_from_spec(two)
    s = sample_sessions(one, r1)
    a, b = priced_on(r1.step, s), priced_on(r2.step, s)
    assert a is not b and a.call_prefill_tokens_sample is b.call_prefill_tokens_sample
    assert chunks_on_ranks(r1.step, a) is chunks_on_ranks(r2.step, b)
    other = sample_sessions(one, r1, seed=one.seed + 1)
    drawn = chunks_on_ranks(r1.step, priced_on(r1.step, other))
    assert drawn is not chunks_on_ranks(r1.step, a)
    assert not np.array_equal(drawn.attention_flops, chunks_on_ranks(r1.step, a).attention_flops)
