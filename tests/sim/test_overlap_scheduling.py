"""Engines that form the next iteration's batch while the current one runs (apmw.perf.scheduling):
a prompt arriving at a busy engine waits for the iteration already scheduled, one at an idle
engine does not. The simulator and apmw predict price the same wait."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from apmw.perf import replica_from_spec
from apmw.predict import predict_with
from apmw.sim import simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from predict_vs_sim import benchmark_spec  # noqa: E402


def _spec(overlap: bool, spread: float = 0.2):
    s = benchmark_spec(spread)      # Llama-3.1-8B bf16 on one H200, 1024/512 tokens, vLLM's rules
    return s.model_copy(update={"serving": s.serving.model_copy(update={"overlap_scheduling": overlap})})


def _ttft(overlap: bool, clients: int) -> float:
    return simulate(_spec(overlap), clients, duration_s=60, warmup_s=15, seed=1,
                    start_together=True).to_dict()["ttft_s"]["mean"]


def test_a_busy_engine_makes_an_arriving_prompt_wait_one_more_iteration():
    # 64 clients with spread-out lengths: a returning prompt finds the next batch already formed
    step = replica_from_spec(_spec(True)).step
    kw = dict(requests_per_client=10**9, length_spread=0.2)
    ahead = predict_with(step, 1024, 512, 64, 8192, 1024, overlap_scheduling=True, **kw)
    plain = predict_with(step, 1024, 512, 64, 8192, 1024, overlap_scheduling=False, **kw)
    assert (ahead.iterations_scheduled_ahead, plain.iterations_scheduled_ahead) == (1, 0)
    simulated_extra = _ttft(True, 64) - _ttft(False, 64)
    # the prediction charges one whole mean iteration more (spread out, the mean iteration is the
    # time per output token); the simulator agrees on the extra wait
    assert ahead.ttft_s - plain.ttft_s == pytest.approx(ahead.tpot_s, rel=1e-6)
    assert simulated_extra == pytest.approx(ahead.ttft_s - plain.ttft_s, rel=0.25)
    assert ahead.tpot_s == plain.tpot_s


def test_an_idle_engine_takes_an_arrival_at_once():
    # one client: its previous request has ended when the next prompt comes, so nothing is scheduled
    assert _ttft(True, 1) == pytest.approx(_ttft(False, 1), rel=1e-9)
    step = replica_from_spec(_spec(True)).step
    one = [predict_with(step, 1024, 512, 1, 8192, 1024, requests_per_client=10**9, overlap_scheduling=o).ttft_s
           for o in (True, False)]
    assert one[0] == one[1]
