"""apmw predict --disagg: a fixed-concurrency benchmark on prefill and decode workers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from apmw.capacity.benchmark import predict
from apmw.capacity.disaggregated_benchmark import Workers, predict_disaggregated

R1 = ("deepseek-ai/DeepSeek-R1", "H200", "fp8", "fp8")
DP8 = Workers(1, 1, {"dp_attention": 8, "ep": 8})


def test_littles_law_holds_over_the_whole_deployment():
    p = predict_disaggregated(*R1, 1024, 1024, 512, Workers(2, 8), DP8, engine="sglang")
    gpus = 2 * 8 + 8
    rate = p.output_tokens_per_s_per_gpu * gpus / 1024
    assert rate * p.e2e_latency_s == pytest.approx(512, rel=1e-6)
    assert p.e2e_latency_s == pytest.approx(p.ttft_s + 1023 * p.tpot_s, rel=0.01)


def test_the_kv_hand_off_delays_the_first_token_the_decode_worker_streams():
    """The decode worker streams every token, the first once the prompt's KV has landed: a slower link adds its
    time to TTFT (named in its parts), not to TPOT, and E2E stays TTFT + (osl - 1) x TPOT."""
    fast, slow = (predict_disaggregated(*R1, 8192, 256, 1, Workers(1, 8), DP8, engine="sglang",
                                        kv_transfer_bandwidth_bytes_per_s=link) for link in (50e9, 0.05e9))
    handoff = 8192 * 61 * 576 / (0.05e9 * 8)      # fp8 latent KV of 61 layers a token, over each prefill GPU's link
    assert slow.ttft_parts_s["kv_handoff"] == pytest.approx(handoff, rel=1e-9)
    assert slow.ttft_s > fast.ttft_s + 0.9 * handoff
    assert slow.tpot_s == pytest.approx(fast.tpot_s, rel=1e-6)
    for p in (fast, slow):
        assert p.e2e_latency_s == pytest.approx(p.ttft_s + 255 * p.tpot_s, rel=1e-9)
        assert sum(p.ttft_parts_s.values()) == pytest.approx(p.ttft_s, rel=1e-9)


def test_with_prefill_all_but_free_the_decode_side_is_the_aggregated_decode_iteration():
    """A one-token prompt and a long output: the decode workers run the aggregated model's decode-only
    iteration at the same batch."""
    agg = predict(R1[0], R1[1], 1, R1[2], R1[3], 1, 8192, 64, engine="sglang", layout={"dp_attention": 8, "ep": 8})
    dis = predict_disaggregated(*R1, 1, 8192, 64, Workers(1, 8), DP8, engine="sglang")
    assert dis.running_requests == agg.running_requests == 64
    assert dis.tpot_s == pytest.approx(agg.decode_iteration_s, rel=0.01)


def test_more_prefill_workers_never_slow_the_first_token_or_the_deployment_per_request():
    ps = [predict_disaggregated(*R1, 4096, 512, 512, Workers(w, 8), DP8, engine="sglang") for w in (1, 2, 4)]
    assert ps[0].ttft_s > ps[1].ttft_s > ps[2].ttft_s
    assert ps[0].e2e_latency_s > ps[1].e2e_latency_s > ps[2].e2e_latency_s


def test_the_cli_names_the_side_and_its_flag():
    apmw = Path(sys.executable).with_name("apmw")
    r = subprocess.run([str(apmw), "predict", "--model", R1[0], "--gpu", "H200", "--disagg", "--prefill-tp", "3",
                        "--isl", "1024", "--osl", "1024", "--concurrency", "64", "--weight-dtype", "fp8"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "prefill workers: --prefill-tp 3 does not divide" in r.stderr
    none = subprocess.run([str(apmw), "predict", "--model", R1[0], "--gpu", "H200", "--disagg", "--prefill-workers", "0",
                           "--isl", "1024", "--osl", "1024", "--concurrency", "64", "--weight-dtype", "fp8"],
                          capture_output=True, text=True, timeout=120)
    assert none.returncode == 1 and "Traceback" not in none.stderr
    assert "needs at least one prefill worker (--prefill-workers): got 0" in none.stderr
    ok = subprocess.run([str(apmw), "predict", "--model", R1[0], "--gpu", "H200", "--disagg", "--prefill-workers", "2",
                         "--prefill-tp", "8", "--decode-tp", "1", "--decode-dp-attention", "8", "--decode-ep", "8",
                         "--isl", "1024", "--osl", "1024", "--concurrency", "64", "--weight-dtype", "fp8", "--json"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert '"source_detail": "disaggregated: 2 prefill worker(s) of TP8' in ok.stdout
