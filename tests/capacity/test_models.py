"""Direct tests of the closed-loop model's parts: the closed network solved at one N, the engine
curve, and the LRU survival model of the prefix cache."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from apmw.capacity.closed_network import solve_at
from apmw.capacity.engine_curve import EngineCurve, engine_curve
from apmw.capacity.prefix_cache import LruSurvival
from apmw.capacity.sessions import sample_sessions
from apmw.perf import IterationLoad, replica_from_spec
from tests.sim.helpers import BASE
from apmw.spec import spec_from_dict


def _flat_curve(mu: float, max_batch: int, t_iter: float = 0.01) -> EngineCurve:
    """A load-independent engine: it completes calls at ``mu`` per second whatever the batch."""
    b = np.arange(1, max_batch + 1, dtype=float)
    rate = np.full(max_batch, mu)
    return EngineCurve(batch=b, iteration_s=np.full(max_batch, t_iter), prefill_iteration_s=np.full(max_batch, t_iter),
                       decode_iteration_s=np.full(max_batch, t_iter), completion_rate=rate, decode_share=1.0,
                       iterations_per_call=1.0, compute_share=np.zeros(max_batch), decoding=b,
                       stall_variance_s2=np.zeros(max_batch), full_chunk_iteration_s=np.full(max_batch, t_iter))


def test_closed_network_at_one_n_is_the_machine_repairman_model():
    """N agents thinking Z seconds on average, one server of rate mu: the textbook closed M/M/1//N
    (Kleinrock vol. 1, 3.10) has p(j) proportional to N!/(N-j)! (1/(mu Z))^j, X = mu (1 - p0)."""
    n, z, mu = 12, 4.0, 2.5
    weights = [math.factorial(n) / math.factorial(n - j) * (1 / (mu * z)) ** j for j in range(n + 1)]
    p0 = weights[0] / sum(weights)
    x = mu * (1 - p0)
    loop = solve_at(_flat_curve(mu, max_batch=1), z, n)
    assert loop.call_throughput_per_s == pytest.approx(x, rel=1e-12)
    assert loop.engine_utilisation == pytest.approx(1 - p0, rel=1e-12)
    # Little's law on the whole loop: N = X (R_engine + Z)
    assert n == pytest.approx(loop.call_throughput_per_s * (loop.engine_residence_per_call_s + z), rel=1e-12)
    # a batch limit that lets every agent run at once, each call served at mu whatever the batch:
    # an infinite-server station, so nobody queues and X = N / (1/mu + Z)
    curve = _flat_curve(mu, max_batch=n, t_iter=1 / mu)
    wide = solve_at(EngineCurve(**{**curve.__dict__, "completion_rate": curve.batch * mu}), z, n)
    assert wide.call_throughput_per_s == pytest.approx(n / (1 / mu + z), rel=1e-12)
    assert wide.queue_per_call_s == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("agents", [70_000, 1_000_000])
@pytest.mark.parametrize("think_s", [0.5, 30.0, 3e4])
def test_a_loop_of_many_agents_sums_only_the_states_with_weight(monkeypatch, agents, think_s):
    """Above SPARSE_AGENTS, of the states past the batch limit only those within e^-60 of the largest weight are
    summed: the loop is the one every state gives (the engine backlogged, near its limit, or mostly idle), from a
    twentieth of the states or fewer."""
    from apmw.capacity import closed_network
    spec = spec_from_dict(BASE)
    replica = replica_from_spec(spec)
    curve = engine_curve(replica.step, sample_sessions(spec, replica), 64)
    sparse = solve_at(curve, think_s, agents)
    cum = np.concatenate(([0.0], np.cumsum(np.log(curve.completion_rate))))
    assert len(closed_network.states(cum, think_s, agents)) < agents / 20
    monkeypatch.setattr(closed_network, "SPARSE_AGENTS", 10**9)
    assert len(closed_network.states(cum, think_s, agents)) == agents + 1
    full = solve_at(curve, think_s, agents)
    for name, value in vars(full).items():
        np.testing.assert_allclose(getattr(sparse, name), value, rtol=1e-12, atol=1e-18, err_msg=name)


def test_engine_curve_prices_each_batch_with_the_replica_step_model():
    spec = spec_from_dict(BASE)
    replica = replica_from_spec(spec)
    s = sample_sessions(spec, replica)
    curve = engine_curve(replica.step, s, 16, decode_only=True)
    # decode only: every iteration is b decoders, each reading its call's mean decode KV
    b = np.arange(1, 17, dtype=float)
    want = replica.step.iteration_time_s(IterationLoad(decode_seqs=b, prefill_tokens=np.zeros(16),
                                                       kv_read_bytes=b * s.call_decode_kv_bytes,
                                                       attention_flops=b * s.call_decode_attn_flops))
    np.testing.assert_allclose(curve.iteration_s, want, rtol=1e-12)
    np.testing.assert_allclose(curve.completion_rate, b / (curve.iterations_per_call * curve.iteration_s))
    mixed = engine_curve(replica.step, s, 16)
    # prompts in the mix make iterations longer and calls slower; batching still pays
    assert np.all(mixed.iteration_s > curve.iteration_s)
    assert np.all(np.diff(mixed.completion_rate) > 0)
    assert mixed.iterations_per_call == pytest.approx(s.call_prefill_iters + s.call_decode_iters)


def test_lru_survival_solves_the_characteristic_time_and_reads_the_miss_share():
    """Three freed contexts per task waiting 1, 5 and 20 s, of 1, 2 and 3 GB, plus a 4 GB last context."""
    sample = SimpleNamespace(freed_s=np.array([1.0, 5.0, 20.0]), freed_kv_bytes=np.array([1e9, 2e9, 3e9]),
                             final_kv_bytes=np.array([4e9]), sessions=1)
    lru = LruSurvival.from_sample(sample)
    # per task, held for min(wait, T): at T = 10 s, 1x1 + 2x5 + 3x10 + 4x10 GB s
    assert lru.cached_byte_seconds(10.0) == pytest.approx((1 + 10 + 30 + 40) * 1e9)
    sessions_per_s = 0.5
    free = sessions_per_s * 81e9
    t = lru.characteristic_time(free, sessions_per_s)
    assert t == pytest.approx(10.0)
    assert sessions_per_s * lru.cached_byte_seconds(t) == pytest.approx(free)
    assert lru.miss_share(t) == pytest.approx(1 / 3)      # only the 20 s wait outlasts T
    assert lru.characteristic_time(0.0, sessions_per_s) == 0.0
    assert lru.miss_share(0.5) == 1.0 and lru.miss_share(25.0) == 0.0
