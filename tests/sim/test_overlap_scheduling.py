"""Engines that form the next iteration's batch while the current one runs (apmw.perf.serving_policy):
a prompt arriving at a busy engine waits for the iteration already scheduled, one at an idle
engine does not. The simulator and apmw predict price the same wait."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from apmw.perf import replica_with_step
from apmw.spec import Serving
from apmw.perf import replica_from_spec
from apmw.capacity.benchmark import predict_with
from apmw.sim import simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from predict_vs_sim import benchmark_spec  # noqa: E402


def _spec(overlap: bool, spread: float = 0.2, isl: int | None = None, osl: int | None = None):
    # Llama-3.1-8B bf16 on one H200, 1024/512 tokens unless given, vLLM's rules
    return benchmark_spec(spread, isl, osl, overlap_scheduling=overlap)


def _ttft(overlap: bool, clients: int) -> float:
    return simulate(_spec(overlap), clients, duration_s=60, warmup_s=15, seed=1,
                    start_together=True).to_dict()["ttft_s"]["mean"]


def test_a_busy_engine_makes_an_arriving_prompt_wait_one_more_iteration():
    # 64 clients with spread-out lengths: a returning prompt finds the next batch already formed
    step = replica_from_spec(_spec(True)).step
    kw = dict(requests_per_client=10**9, length_spread=0.2)
    ahead, plain = (predict_with(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=1024,
                                                                 overlap_scheduling=o)), 1024, 512, 64, **kw)
                    for o in (True, False))
    assert (ahead.iterations_scheduled_ahead, plain.iterations_scheduled_ahead) == (1, 0)
    simulated_extra = _ttft(True, 64) - _ttft(False, 64)
    # the prediction charges one whole mean iteration more; the simulator agrees on the extra wait
    share = ahead.mixed_iteration_share
    mean_iteration_s = share * ahead.mixed_iteration_s + (1 - share) * ahead.decode_iteration_s
    assert ahead.ttft_s - plain.ttft_s == pytest.approx(mean_iteration_s, rel=1e-6)
    assert simulated_extra == pytest.approx(ahead.ttft_s - plain.ttft_s, rel=0.25)
    assert ahead.tpot_s == plain.tpot_s


def test_an_idle_engine_takes_an_arrival_at_once():
    # one client: its previous request has ended when the next prompt comes, so nothing is scheduled
    assert _ttft(True, 1) == pytest.approx(_ttft(False, 1), rel=1e-9)
    step = replica_from_spec(_spec(True)).step
    one = [predict_with(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=1024, overlap_scheduling=o)), 1024, 512, 1, requests_per_client=10**9).ttft_s
           for o in (True, False)]
    assert one[0] == one[1]


def test_a_lone_lock_step_group_comes_back_to_an_idle_engine():
    # equal lengths, four clients whose 200-token prompts all fit one iteration: they start, finish and
    # come back together, to an engine with nothing in flight, so scheduling ahead costs them nothing
    from apmw.perf import replica_from_spec as replica

    ttft = {}
    for overlap in (True, False):
        s = _spec(overlap, spread=0.0, isl=200, osl=200)
        ttft[overlap] = simulate(s, 4, duration_s=60, warmup_s=15, seed=1, start_together=True).to_dict()["ttft_s"]["mean"]
        p = predict_with(replica_with_step(replica(s).step, Serving(max_batched_tokens=8192, max_batch=1024, overlap_scheduling=overlap)), 200, 200, 4, requests_per_client=10**9, length_spread=0.0)
        assert p.lockstep_share == 1.0
        ttft[(overlap, "predict")] = p.ttft_s
    assert ttft[True] == pytest.approx(ttft[False], rel=1e-9)
    assert ttft[(True, "predict")] == ttft[(False, "predict")]


def test_apmw_plan_prices_the_iteration_scheduled_ahead_like_the_simulator():
    # coding-agent at 20 agents: the engine is always busy, so each call waits one more mean
    # iteration before its prefill (about the time per output token) in the plan's TTFT and task
    # latency; the simulator's TTFT p95 moves the same way (docs/simulate.md)
    from apmw.capacity import plan
    from apmw.spec import load_spec

    s = load_spec(Path(__file__).resolve().parents[2] / "examples" / "coding-agent.yaml")
    off = s.model_copy(update={"serving": s.serving.model_copy(update={"overlap_scheduling": False})})
    a_on, a_off = plan(s, agents=20).to_dict(), plan(off, agents=20).to_dict()
    iteration_s = a_on["time_per_output_token_s"]
    assert a_on["ttft_p95_s"] - a_off["ttft_p95_s"] == pytest.approx(iteration_s, rel=0.1)
    extra_task_s = a_on["task_latency_s"]["mean"] - a_off["task_latency_s"]["mean"]
    assert extra_task_s == pytest.approx(a_on["calls_per_session"] * iteration_s, rel=0.2)
