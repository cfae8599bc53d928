"""Step times under load read off token arrival times (apmw.loadgen.loop_steps), on a known engine."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from apmw.loadgen.loop_steps import steps_under_load
from tests.loadgen.test_bench import APMW

# The engine of these tests: an iteration carries every decoding call and at most one whole prompt, and
# takes FIXED + PER_SEQ x decoding calls + PER_TOKEN x prompt tokens. It sends the iteration's tokens one
# call after another, SEND_S apart, as llama.cpp's server does.
FIXED, PER_SEQ, PER_TOKEN, SEND_S = 1e-3, 2e-3, 4e-4, 3e-4


def _engine_records(arrivals: list[tuple[float, int, int]]) -> list[dict]:
    """Call records (as apmw bench writes them) of calls ``(arrival_s, prompt_tokens, output_tokens)``."""
    waiting = sorted(range(len(arrivals)), key=lambda i: arrivals[i][0])
    times: dict[int, list[float]] = {i: [] for i in range(len(arrivals))}
    decoding: list[int] = []
    now = 0.0
    while waiting or decoding:
        ready = [i for i in waiting if arrivals[i][0] <= now]
        if not decoding and not ready:
            now = arrivals[waiting[0]][0]
            continue
        prompt = ready[0] if ready else None
        now += FIXED + PER_SEQ * len(decoding) + (PER_TOKEN * arrivals[prompt][1] if prompt is not None else 0.0)
        sent = decoding + ([prompt] if prompt is not None else [])
        for k, i in enumerate(sent):
            times[i].append(now + k * SEND_S)
        if prompt is not None:
            waiting.remove(prompt)
            decoding.append(prompt)
        decoding = [i for i in decoding if len(times[i]) < arrivals[i][2]]
    return [{"type": "call", "ok": True, "segment": 0, "start_s": a, "latency_s": times[i][-1] - a,
             "ttft_s": times[i][0] - a, "prompt_tokens": n, "cached_tokens": 0, "token_times_s": [t - a for t in times[i]]} for i, (a, n, _) in enumerate(arrivals)]


def test_decode_and_prefill_steps_are_the_engines_own():
    rng = np.random.default_rng(0)
    arrivals = [(float(t), int(rng.integers(50, 120)), int(rng.integers(30, 80)))
                for t in np.cumsum(rng.exponential(0.15, 400))]
    rows = steps_under_load(_engine_records(arrivals))
    decode = [r for r in rows if r["prefill_tokens"] == 0]
    prefill = [r for r in rows if r["prefill_tokens"] > 0]
    assert {r["decode_seqs"] for r in decode} >= {1, 2, 3}
    for r in decode:
        assert r["step_s_p50"] == pytest.approx(FIXED + PER_SEQ * r["decode_seqs"], rel=0.02), r
    assert prefill
    for r in prefill:       # the prompts of one group differ by up to a bin: the median is within it
        assert r["step_s_p50"] == pytest.approx(FIXED + PER_SEQ * r["decode_seqs"] + PER_TOKEN * r["prefill_tokens"],
                                                rel=0.15), r


def test_runs_on_their_own_clocks_are_read_apart_and_grouped_together():
    rng = np.random.default_rng(1)
    runs = []
    for _ in range(2):      # two results files: each segment 0, each clock from 0
        arrivals = [(float(t), int(rng.integers(50, 120)), int(rng.integers(30, 80)))
                    for t in np.cumsum(rng.exponential(0.15, 200))]
        runs.append(_engine_records(arrivals))
    rows = steps_under_load(*runs)
    alone = {(r["decode_seqs"], r["context_tokens"] > 0, r["prefill_tokens"] > 0): r["samples"]
             for r in steps_under_load(runs[0])}
    decode = [r for r in rows if r["prefill_tokens"] == 0]
    assert {r["decode_seqs"] for r in decode} >= {1, 2, 3}
    for r in decode:        # read as one clock, the second run's tokens would fall inside the first's gaps
        assert r["step_s_p50"] == pytest.approx(FIXED + PER_SEQ * r["decode_seqs"], rel=0.02), r
    assert sum(r["samples"] for r in rows) > sum(alone.values())


def test_calls_without_token_times_give_no_rows():
    records = _engine_records([(0.0, 100, 40), (0.05, 80, 40)])
    for r in records:
        r.pop("token_times_s")
    assert steps_under_load(records) == []


def _calibrate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*APMW, "bench", "--calibrate", "cal.json", "--endpoint", "http://127.0.0.1:9",
                           "--model", "tiny", *args], capture_output=True, text=True, timeout=60)


def test_loop_results_that_cannot_give_steps_are_refused_before_the_server_is_asked(tmp_path):
    missing = _calibrate("--loop-results", str(tmp_path / "none.jsonl"))
    assert missing.returncode == 1 and "results file not found" in missing.stderr
    old = tmp_path / "old.jsonl"        # a results file written before calls carried token times
    records = _engine_records([(0.0, 100, 40), (0.05, 80, 40)])
    for r in records:
        r.pop("token_times_s")
    config = {"endpoint": "http://127.0.0.1:8000", "model": "tiny", "agents": 2, "duration_s": 10.0, "warmup_s": 0.0,
              "seed": 1, "workload": None, "slo": {"task_latency_p95_s": 60.0}}
    run = {"type": "run", "segment": 0, "config": config, "started_at": "2026-12-01T00:00:00+00:00"}
    old.write_text("".join(json.dumps(r) + "\n" for r in [run, *records]))
    bare = _calibrate("--loop-results", str(old))
    assert bare.returncode == 1 and "too few calls in those results carry token times" in bare.stderr
    second_missing = _calibrate("--loop-results", str(old), "--loop-results", str(tmp_path / "none.jsonl"))
    assert second_missing.returncode == 1 and "none.jsonl: results file not found" in second_missing.stderr
    assert "Traceback" not in missing.stderr + bare.stderr + second_missing.stderr
