"""The engine curve draws an iteration's prompt chunks from the sampled calls (their tokens, attention and the
context they read), and under attention data parallelism prices the busiest rank: its decoders above an even
split by the spread of their contexts, and the chunks that landed on it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from apmw import plan
from apmw.capacity.engine_curve import MAX_PREFILLS_PER_ITERATION, ChunksOnRanks, build_engine_curve, chunks_on_ranks
from apmw.capacity.sessions import sample_sessions
from apmw.perf import replica_from_spec
from apmw.perf.parallelism import Layout, busiest_rank_spread, expected_max_of_normals
from apmw.sim import simulate
from tests.sim.test_attention_dp import _dp_spec


def _sample(ranks: int):
    spec = _dp_spec(ranks=ranks)
    replica = replica_from_spec(spec)
    return replica, sample_sessions(spec, replica, seed=0)


def _chunk_attn(s) -> float:
    return s.call_prefill_attn_flops / s.call_prefill_iters


def test_the_expected_largest_of_normals():
    assert expected_max_of_normals(1) == 0.0
    assert expected_max_of_normals(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-9)
    draws = np.random.default_rng(0).standard_normal((200_000, 8)).max(axis=1).mean()
    assert expected_max_of_normals(8) == pytest.approx(draws, abs=0.01)


def test_the_busiest_ranks_decoders_lie_above_an_even_split_by_their_spread():
    dp8 = Layout(tp=1, dp=8)
    seqs = np.array([8.0, 32.0, 128.0])
    spread = busiest_rank_spread(dp8, seqs, 0.5)
    assert spread == pytest.approx(1 + expected_max_of_normals(8) * 0.5 / np.sqrt(seqs / 8))
    assert (np.diff(spread) < 0).all()              # more sequences a rank, the closer to the mean
    assert busiest_rank_spread(dp8, seqs, 0.0) == pytest.approx(1.0)
    assert busiest_rank_spread(Layout(tp=8), seqs, 0.5) == pytest.approx(1.0)


def test_one_rank_carries_every_chunk_and_many_ranks_carry_the_largest():
    replica, s = _sample(ranks=8)
    mean = _chunk_attn(s)
    one = chunks_on_ranks(replica_from_spec(_dp_spec(ranks=1)).step, s)
    eight = chunks_on_ranks(replica.step, s)
    k = np.arange(MAX_PREFILLS_PER_ITERATION + 2)
    assert one.weight.sum() == pytest.approx(1.0) and (one.attention_flops[0] == 0).all()
    # a single rank holds all k chunks: on average k mean chunks (the draws' sampling aside: a chunk's attention
    # has a CV of 1.7 here, so 4,096 draws of one chunk read its mean to a standard error of 2.7 %), in tokens too
    assert one.attention_flops @ one.weight == pytest.approx(k * mean, rel=0.08)
    chunk = s.call_prefill_tokens / s.call_prefill_iters
    assert one.tokens @ one.weight == pytest.approx(k * chunk, rel=0.03)
    assert (eight.tokens @ eight.weight) == pytest.approx(k * chunk, rel=0.03)   # tokens are the replica's
    # one chunk is on some rank whatever the ranks; more chunks spread, so the busiest holds fewer than all
    assert (eight.attention_flops @ eight.weight)[1] == pytest.approx(mean, rel=0.03)
    assert ((eight.attention_flops @ eight.weight)[2:] < (one.attention_flops @ one.weight)[2:]).all()
    assert (np.diff(eight.attention_flops @ eight.weight) >= 0).all()
    # the strata are ordered, and the top one (the 0.5 % largest) is far above the mean chunk
    assert (np.diff(eight.attention_flops[1]) >= 0).all()
    assert eight.attention_flops[1, -1] > 3 * mean


def test_chunks_drawn_cost_the_busiest_rank_more_than_the_mean_chunk():
    """A rank's time is a max of its attention and the rest: below the rest a small chunk is free and a long
    one is not, so the drawn chunks price an iteration above chunks of the mean size."""
    replica, s = _sample(ranks=8)
    mean = _chunk_attn(s)
    k = np.arange(MAX_PREFILLS_PER_ITERATION + 2)[:, None]
    chunk = s.call_prefill_tokens / s.call_prefill_iters
    at_mean = ChunksOnRanks(np.ceil(k / 8) * mean, np.ceil(k / 8) * s.call_prefill_kv_bytes, np.ones(1), k * chunk)
    drawn, flat = _drawn_and_at_mean(replica, s, at_mean)
    assert (drawn.decode_iteration_s >= flat.decode_iteration_s - 1e-12).all()
    assert drawn.decode_iteration_s[63] > flat.decode_iteration_s[63]


def _drawn_and_at_mean(replica, s, at_mean: ChunksOnRanks):
    """The engine curve with the chunks drawn, and with every chunk ``at_mean``."""
    import apmw.capacity.engine_curve as curves

    drawn = build_engine_curve(replica.step, s, 128)
    original = curves.chunks_on_ranks
    try:
        curves.chunks_on_ranks = lambda step, sample: at_mean
        flat = build_engine_curve(replica.step, s, 128)
    finally:
        curves.chunks_on_ranks = original
    return drawn, flat


def test_chunks_of_every_size_spread_the_decode_iterations_of_one_replica():
    """Without attention DP too: a decode iteration beside a short follow-up and one beside a long prompt differ
    by more than the count of chunks says, so the per-call TPOT spread (``stall_variance_s2``) is wider with
    the chunks' sizes drawn than at the mean size."""
    spec = _dp_spec(ranks=1)
    replica = replica_from_spec(spec)
    s = sample_sessions(spec, replica, seed=0)
    k = np.arange(MAX_PREFILLS_PER_ITERATION + 2)[:, None]
    chunk = s.call_prefill_tokens / s.call_prefill_iters
    at_mean = ChunksOnRanks(k * _chunk_attn(s), k * s.call_prefill_kv_bytes, np.ones(1), k * chunk)
    drawn, flat = _drawn_and_at_mean(replica, s, at_mean)
    assert (drawn.stall_variance_s2[8:] > 2 * flat.stall_variance_s2[8:]).all()
    # a call's own chunk is priced at the mean size either way: the same prefill line at one running call
    assert drawn.prefill_iteration_s[0] == pytest.approx(flat.prefill_iteration_s[0], rel=1e-9)


def test_a_curve_under_ranks_is_deterministic():
    replica, s = _sample(ranks=4)
    a, b = build_engine_curve(replica.step, s, 64), build_engine_curve(replica.step, s, 64)
    assert np.array_equal(a.decode_iteration_s, b.decode_iteration_s)


@pytest.mark.slow
def test_the_analytic_time_per_token_under_ranks_agrees_with_the_simulator():
    """DP8 of the small workload at 64 agents: priced at an even split with mean chunks the analytic model was
    6.8 % faster than the simulator (7.25 against 7.78 ms); now 1.7 % (docs/simulate.md)."""
    spec = _dp_spec(ranks=8)
    analytic = plan(spec, agents=64).to_dict()["time_per_output_token_s"]
    simulated = simulate(spec, 64, duration_s=900, seed=1).tpot["mean"]
    assert analytic == pytest.approx(simulated, rel=0.04)


def test_the_per_call_tpot_p95_of_one_replica_agrees_with_the_simulator():
    """The small workload on one GPU at 64 agents: with every chunk at the mean size the analytic TPOT p95 was
    3.1 % under the simulator's (14.09 against 14.54 ms); with the chunks' sizes drawn, 0.9 %."""
    spec = _dp_spec(ranks=1)
    analytic = plan(spec, agents=64).to_dict()["tpot_p95_s"]
    simulated = simulate(spec, 64, duration_s=1800, seed=1).tpot["p95"]
    assert analytic == pytest.approx(simulated, rel=0.02)


def test_under_ranks_a_full_chunk_on_its_own_rank_costs_more_than_the_mean_chunks_line_says():
    """Under attention DP the iteration waits for the busiest rank: a call's own full chunk (its rank's budget)
    outweighs the other ranks' chunks and paces it, so it costs more than the line through the mean chunk
    extrapolates to. Without DP the curve keeps that line (the field is the mean prefill iteration)."""
    replica, s = _sample(ranks=8)
    curve = build_engine_curve(replica.step, s, 64, token_budget=replica.policy.token_budget)
    chunk = s.call_prefill_tokens / s.call_prefill_iters
    slope = (curve.prefill_iteration_s - curve.decode_iteration_s) / chunk
    line = curve.decode_iteration_s + slope * replica.chunk_tokens
    assert replica.chunk_tokens > 4 * chunk
    assert (curve.full_chunk_iteration_s > 1.2 * line).all()
    one, s1 = _sample(ranks=1)
    flat = build_engine_curve(one.step, s1, 64, token_budget=one.policy.token_budget)
    assert np.array_equal(flat.full_chunk_iteration_s, flat.prefill_iteration_s)


def test_a_calls_own_prefill_under_ranks_is_its_full_chunks_and_the_rest_on_two_lines():
    from types import SimpleNamespace

    from apmw.capacity.evaluate import own_prefill_on_rank_s

    loop = SimpleNamespace(decode_iteration_s=0.05, prefill_iteration_s=0.07, full_chunk_iteration_s=1.5)
    tokens = np.array([0.0, 100.0, 200.0, 1000.0, 8192.0, 2 * 8192.0 + 200.0])
    s = SimpleNamespace(call_prefill_tokens=200.0, call_prefill_iters=1.0, call_prefill_tokens_sample=tokens,
                        call_prefill_iters_sample=np.ceil(tokens / 8192))
    t = own_prefill_on_rank_s(s, loop, 8192)
    above = 0.07 + (1000 - 200) * (1.5 - 0.07) / (8192 - 200)
    assert t == pytest.approx([0.0, 0.06, 0.07, above, 1.5, 2 * 1.5 + 0.07], rel=1e-12)


@pytest.mark.slow
def test_the_ttft_p95_under_ranks_agrees_with_the_simulator():
    """DP8 of the small workload at 64 agents: with a call's own chunk on the line through the mean and one
    prefill queue for the replica, the analytic TTFT p95 was 15 % under the simulator's (20.1 against 23.5 and
    23.7 ms, seeds 1 and 2); with its full chunks on its rank and a queue per rank, 6 % (22.2 ms)."""
    spec = _dp_spec(ranks=8)
    analytic = plan(spec, agents=64).to_dict()["ttft_p95_s"]
    simulated = simulate(spec, 64, duration_s=1800, seed=1).ttft["p95"]
    assert analytic == pytest.approx(simulated, rel=0.10)
