"""Regression guard: median |TPOT error| on a fixed subset of held-out MLPerf rows.

The subset (tests/fixtures/accuracy/mlperf_heldout_latency.csv, source in the README
beside it) is the held-out v5.1 Server/Interactive dense-model rows of bench/accuracy.py.
The bound is the figure documented in docs/accuracy.md; the test fails if the step-time
model gets worse on these rows.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

from apmw.arch import load_architecture
from apmw.perf import build_step_model, resolve_gpu
from apmw.predict import DEFAULT_TOKEN_BUDGET, predict_open_loop

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "accuracy" / "mlperf_heldout_latency.csv"
TRTLLM_MAX_BATCH = 2048
# docs/accuracy.md: held-out median |TPOT error| 16.5 %, TTFT 35.4 % (bench/accuracy.py).
MAX_MEDIAN_TPOT_ERROR_PCT = 17.0
MAX_MEDIAN_TTFT_ERROR_PCT = 36.0


def _errors():
    tpot, ttft = [], []
    for r in csv.DictReader(FIXTURE.open()):
        model = str(ROOT / r["model"]) if r["model"].startswith("tests/") else r["model"]
        step = build_step_model(load_architecture(model), resolve_gpu(r["gpu"]), int(r["tp"]), r["weight_dtype"],
                                r["kv_dtype"], engine=r["engine"])
        assert step.source == "calibrated"
        p = predict_open_loop(step, int(r["isl"]), int(r["osl"]), float(r["rate_per_replica_per_s"]),
                              DEFAULT_TOKEN_BUDGET, TRTLLM_MAX_BATCH)
        tpot.append(abs(p.tpot_s / float(r["measured_tpot_s"]) - 1) * 100)
        ttft.append(abs(p.ttft_s / float(r["measured_ttft_s"]) - 1) * 100)
    return tpot, ttft


def test_median_tpot_error_does_not_rise_above_documented_figure():
    tpot, ttft = _errors()
    assert len(tpot) >= 10
    assert statistics.median(tpot) <= MAX_MEDIAN_TPOT_ERROR_PCT
    assert statistics.median(ttft) <= MAX_MEDIAN_TTFT_ERROR_PCT
