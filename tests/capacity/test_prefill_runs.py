"""A prefill-first engine (SGLang) runs a prefill iteration whenever a prompt waits: how many, and how full."""

from __future__ import annotations

import numpy as np
import pytest

from apmw.capacity.engine_curve import prefill_runs


def _linear(base_s: float, per_chunk_s: float):
    return lambda chunks: base_s + per_chunk_s * chunks


def test_rare_prompts_each_get_their_own_prefill_iteration():
    arriving = np.array([1e-4, 1e-3])
    runs, chunks, _ = prefill_runs(arriving, np.full(2, 0.03), _linear(0.02, 0.005))
    assert runs == pytest.approx(arriving, rel=2e-3) and chunks == pytest.approx(1.0, rel=2e-3)


def test_the_runs_are_the_poisson_counts_of_their_own_cycle():
    # 1.6 prompts a decode iteration, prefill iterations nearly as dear as decode ones (a large MoE's weights)
    t_dec, prefill = np.array([0.03]), _linear(0.02, 0.003)
    runs, chunks, _ = prefill_runs(np.array([1.6]), t_dec, prefill)
    cycle = t_dec + runs * prefill(chunks)
    rate = 1.6 / cycle
    expected = (1 - np.exp(-rate * t_dec)) / np.exp(-rate * prefill(chunks))
    assert runs == pytest.approx(expected, rel=1e-9)
    assert runs * chunks == pytest.approx(1.6)
    # more than one run per decode iteration once prompts keep arriving during prefill iterations
    assert 0.9 < runs[0] < 1.6 and 1.0 < chunks[0] < 1.8


def test_a_scheduler_that_polls_less_often_runs_fewer_fuller_prefill_iterations():
    args = (np.array([0.8]), np.array([0.03]), _linear(0.02, 0.003))
    every, every_chunks, _ = prefill_runs(*args, recv_interval=1)
    tenth, tenth_chunks, _ = prefill_runs(*args, recv_interval=10)
    assert tenth[0] < 0.5 * every[0] and tenth_chunks[0] > every_chunks[0]


def test_a_prefill_iteration_holds_no_more_chunks_than_the_budget():
    runs, chunks, _ = prefill_runs(np.array([50.0]), np.array([0.01]), _linear(0.001, 0.0001), max_chunks=4.0)
    assert chunks[0] <= 4.0 and runs[0] >= 50.0 / 4.0 - 1e-9


def test_how_many_follow_one_decode_iteration_is_none_or_one_plus_a_geometric_number():
    t_dec, prefill = np.array([0.03]), _linear(0.02, 0.003)
    runs, chunks, variance = prefill_runs(np.array([1.6]), t_dec, prefill)
    rate = 1.6 / (t_dec + runs * prefill(chunks))
    first, again = 1 - np.exp(-rate * t_dec), 1 - np.exp(-rate * prefill(chunks))
    rng = np.random.default_rng(0)
    count = np.where(rng.random(400_000) < first[0], rng.geometric(1 - again[0], 400_000), 0)
    assert count.mean() == pytest.approx(runs[0], rel=0.01)
    assert count.var() == pytest.approx(variance[0], rel=0.02)
