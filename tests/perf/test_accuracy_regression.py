"""Regression guard: median |TPOT| and |TTFT| error on published fixed-concurrency runs.

The rows are every published dense-model run in bench/data/published_dense_fixed_concurrency.csv
(NVIDIA NIM Llama-3.1-8B / Llama-3.3-70B, GPUStack Qwen3-8B and NVIDIA's Qwen3-32B on H100; sources and
assumptions in bench/data/SOURCES.md), predicted through ``apmw.capacity.benchmark.predict``, the
function behind ``apmw predict``. The bounds are the figures documented in
docs/accuracy.md (``python bench/accuracy.py``) plus a little room; the test fails if
the step-time or benchmark model gets worse on these rows.
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

from apmw.capacity.benchmark import predict

ROOT = Path(__file__).resolve().parents[2]
ROWS = ROOT / "bench" / "data" / "published_dense_fixed_concurrency.csv"
# docs/accuracy.md: median |TPOT error| 5.1 %, |TTFT error| 28.2 % on these 91 rows.
MAX_MEDIAN_TPOT_ERROR_PCT = 5.7
MAX_MEDIAN_TTFT_ERROR_PCT = 29.0


def _errors(keep=lambda row: True) -> tuple[list[float], list[float]]:
    """|TPOT| and |TTFT| errors (%) of the published rows ``keep`` accepts."""
    tpot, ttft = [], []
    for r in filter(keep, csv.DictReader(ROWS.open())):
        # ShareGPT lengths (GPUStack) vary by more than their mean; NIM's are all equal
        kw = {"length_spread": 1.0} if r["source"].startswith("gpustack") else {}
        if r["overlap_scheduling"]:
            # whether the run's engine formed the next batch while the current one ran, by its
            # version (bench/data/SOURCES.md); empty: the engine's default
            kw["overlap_scheduling"] = r["overlap_scheduling"] == "true"
        p = predict(r["model"], r["gpu"], int(r["tp"]), r["weight_dtype"], r["kv_dtype"], round(float(r["isl"])),
                    round(float(r["osl"])), int(r["concurrency"]), engine=r["engine"], **kw)
        assert p.source == "calibrated"
        tpot.append(abs(p.tpot_s * 1e3 / float(r["tpot_ms"]) - 1) * 100)
        ttft.append(abs(p.ttft_s * 1e3 / float(r["ttft_ms"]) - 1) * 100)
    return tpot, ttft


def test_median_errors_on_published_runs_do_not_rise_above_documented_figures():
    tpot, ttft = _errors()
    assert len(tpot) == 91
    assert statistics.median(tpot) <= MAX_MEDIAN_TPOT_ERROR_PCT
    assert statistics.median(ttft) <= MAX_MEDIAN_TTFT_ERROR_PCT


def test_concurrency_one_tpot_fits_a_32_and_an_80_layer_model_on_one_engine():
    """The engine's fixed cost is per layer (apmw.perf.calibrated.ENGINE_OVERHEAD_S_PER_LAYER).

    NIM's Llama-3.1-8B (32 layers, TP1) and Llama-3.3-70B (80 layers, TP2) ran on the same engine
    and harness; at concurrency 1 their TPOT is mostly weight streaming plus that fixed cost. One
    figure per iteration for any model (before session 7) left the 8B rows up to +10.7 % and the
    70B rows down to -10.1 %; per layer, every one of the ten is within 8 % (7.8 % at most since
    session 30 stopped counting a request's own prefill in its time per output token, 6.9 % before;
    the bound leaves a little room, and still fails the per-iteration form).
    """
    tpot, _ = _errors(lambda r: r["source"].startswith("nim") and r["concurrency"] == "1")
    assert len(tpot) == 10
    assert max(tpot) <= 8.0


# A fixed subset of the shared benchmarks: the 51 held-out InferenceMAX gpt-oss-120b rows on
# H200 (vLLM, MXFP4 experts on the calibrated MoE path), copied by
# `python bench/accuracy.py --write-fixture` (source and licence: tests/fixtures/accuracy/README.md).
GPTOSS_H200 = ROOT / "tests" / "fixtures" / "accuracy" / "inferencemax_gptoss_h200.csv"
# docs/accuracy.md: median |TPOT error| 5.1 %, |TTFT error| 7.4 %, |output tokens/s per GPU error| 4.2 %
# on these rows, predicted with InferenceMAX's own request overhead (12.5 ms, fitted on its h100
# rows with the served MoE ceiling: bench/accuracy.py HARNESS_OVERHEAD_S, `--fit`).
INFERENCEMAX_REQUEST_OVERHEAD_S = 0.0125
MAX_GPTOSS_TPOT_ERROR_PCT = 5.6
MAX_GPTOSS_TTFT_ERROR_PCT = 8.0
MAX_GPTOSS_THROUGHPUT_ERROR_PCT = 4.8


def test_gpt_oss_on_h200_stays_within_the_documented_errors():
    tpot, ttft, thr = [], [], []
    for r in csv.DictReader(GPTOSS_H200.open()):
        p = predict(r["model"], r["gpu"], int(r["tp"]), r["weight_dtype"], r["kv_dtype"], int(r["isl"]),
                    int(r["osl"]), int(r["concurrency"]), engine=r["engine"], length_spread=float(r["length_spread"]),
                    request_overhead_s=INFERENCEMAX_REQUEST_OVERHEAD_S)
        assert p.source == "calibrated"
        tpot.append(abs(p.tpot_s / float(r["measured_tpot_s"]) - 1) * 100)
        ttft.append(abs(p.ttft_s / float(r["measured_ttft_s"]) - 1) * 100)
        thr.append(abs(p.output_tokens_per_s_per_gpu / float(r["measured_output_tokens_per_s_per_gpu"]) - 1) * 100)
    assert len(tpot) == 51
    assert statistics.median(tpot) <= MAX_GPTOSS_TPOT_ERROR_PCT
    assert statistics.median(ttft) <= MAX_GPTOSS_TTFT_ERROR_PCT
    assert statistics.median(thr) <= MAX_GPTOSS_THROUGHPUT_ERROR_PCT


# docs/accuracy.md ("Steady-state TTFT against InferenceMAX's measured median TTFT"): on the 32
# rows with 1024-token prompts, median |error| 5.4 % with overlap scheduling, 7.0 % without it
# (each with the request overhead its own fit gives on the h100 rows: 12.5 and 17.5 ms).
MAX_STEADY_TTFT_VS_MEDIAN_ERROR_PCT = 6.0
WITHOUT_OVERLAP_REQUEST_OVERHEAD_S = 0.0175


def test_steady_state_ttft_follows_the_measured_median_better_with_overlap_scheduling():
    # A run of ten prompts per client has its first, simultaneous wave in its slowest tenth, so
    # the median TTFT is a steady-state figure: a prompt's wait for the iteration in flight and
    # the one already scheduled (vLLM's async scheduling, apmw.perf.serving_policy), then its prefill.
    errs = {True: [], False: []}
    for r in csv.DictReader(GPTOSS_H200.open()):
        if int(r["isl"]) != 922:        # the 1024-token prompts (mean 0.9 x 1024)
            continue
        for overlap in (True, False):
            p = predict(r["model"], r["gpu"], int(r["tp"]), r["weight_dtype"], r["kv_dtype"], int(r["isl"]),
                        int(r["osl"]), int(r["concurrency"]), engine=r["engine"],
                        length_spread=float(r["length_spread"]), requests_per_client=10**9,
                        overlap_scheduling=overlap,
                        request_overhead_s=INFERENCEMAX_REQUEST_OVERHEAD_S if overlap
                        else WITHOUT_OVERLAP_REQUEST_OVERHEAD_S)
            errs[overlap].append(abs(p.ttft_s / float(r["measured_median_ttft_s"]) - 1) * 100)
    assert len(errs[True]) == 32
    assert statistics.median(errs[True]) <= MAX_STEADY_TTFT_VS_MEDIAN_ERROR_PCT
    assert statistics.median(errs[True]) < statistics.median(errs[False])


def test_the_70b_nim_runs_cannot_hold_a_first_wave_at_three_prompts_per_client():
    """docs/accuracy.md's argument about NIM's run length: NVIDIA's guide sends 3 x concurrency
    requests, the first simultaneous wave counted. The 8B rows are consistent with that (measured
    mean above a third of a first wave's mean TTFT); the 70B rows are not (below a third)."""
    ratios: dict[str, list[float]] = {"70B": [], "8B": []}
    for r in csv.DictReader(ROWS.open()):
        if not r["source"].startswith("nim") or int(r["concurrency"]) < 25:
            continue
        wave = predict(r["model"], r["gpu"], int(r["tp"]), r["weight_dtype"], r["kv_dtype"], int(r["isl"]),
                       int(r["osl"]), int(r["concurrency"]), engine=r["engine"], requests_per_client=1,
                       request_overhead_s=0.0)
        if wave.queued_requests:            # past the KV limit the queue, not the wave, dominates
            continue
        ratios["70B" if r["model"].endswith("70B") else "8B"].append(float(r["ttft_ms"]) / (wave.ttft_s * 1e3))
    assert len(ratios["70B"]) >= 15 and len(ratios["8B"]) >= 15
    # three prompts per client would put every row at or above a third (the wave's share)
    assert sum(x < 1 / 3 for x in ratios["70B"]) >= 0.8 * len(ratios["70B"])
    assert statistics.median(ratios["70B"]) < 0.2
    assert sum(x > 1 / 3 for x in ratios["8B"]) >= 0.8 * len(ratios["8B"])


def test_no_scheduling_hypothesis_fits_both_nim_tables():
    """docs/accuracy.md, "Where the model is weak": the NIM 8B TTFT gap is not an engine behaviour
    apmw leaves out. Lock-step groups, SGLang-style prefill-first scheduling or a smaller token
    budget bring the 8B table closer (52.8 % -> 32.4 % at best) but push the 70B table from the same
    page, engine and harness off (12.1 % -> 15-151 %), so none is adopted. The test fails if a
    variant comes to fit both within the issue's 25 %, which would make it a candidate."""
    sys.path.insert(0, str(ROOT / "bench"))
    from nim_scheduling import NIM_SCHEDULING_VARIANTS, nim_scheduling_errors

    errors = nim_scheduling_errors(ROWS)
    assert len(errors) == len(NIM_SCHEDULING_VARIANTS)
    shipped = errors[NIM_SCHEDULING_VARIANTS[0][0]]
    assert shipped["70B"] <= 25 < shipped["8B"]
    for med in errors.values():
        assert not (med["8B"] <= 25 and med["70B"] <= 25)
    # the variant that helps the 8B most breaks the 70B worst
    best_8b = min(errors.values(), key=lambda med: med["8B"])
    assert best_8b["8B"] < shipped["8B"] and best_8b["70B"] > 100
