"""AMD Instinct parts' matrix rate and GEMM launch cost, fitted on AMD's own runs (apmw.perf.efficiency.
AMD_FP8_FLOPS_EFFICIENCY, AMD_GEMM_LAUNCH_S_BY_DIE).

No AMD kernel table exists here, so an AMD part priced the plain roofline with NVIDIA's measured efficiencies; against
AMD's MLPerf v5.1 llama2-70b Offline runs that put its throughput 23-87 % too high, and against InferenceMAX's
DeepSeek-R1 runs its time per output token 29-55 % too short, by a near-constant time per iteration. The fitted share
of the fp8 peak and cost per GEMM launch bring those runs within a few per cent, hold out on the runs they were not
fitted on, and must be re-derivable from the data (bench/accuracy.py --fit-amd)."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

from apmw.perf import build_step_model, resolve_gpu
from dataclasses import replace

from apmw.perf.efficiency import (AMD_DIE, AMD_FP8_FLOPS_EFFICIENCY, AMD_GEMM_LAUNCH_S_BY_DIE, AMD_HELD_OUT_TPOT_ERROR,
                                  DEFAULT_EFFICIENCY, efficiency_for_gpu, roofline_caveat)
from apmw.arch import load_architecture
from apmw.perf.step import IterationLoad

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data" / "benchmarks"


def test_the_power_capped_part_sustains_less_of_its_peak():
    """MI300X and MI325X share a compute die; the 750 W part sustains less of the same peak than the 1,000 W one."""
    mi300x, mi325x = efficiency_for_gpu("MI300X"), efficiency_for_gpu("MI325X")
    assert mi300x.flops_for("fp8") == AMD_FP8_FLOPS_EFFICIENCY["MI300X"]
    assert mi300x.flops_for("fp8") < mi325x.flops_for("fp8") < DEFAULT_EFFICIENCY.flops_for("fp8")
    for eff in (mi300x, mi325x):        # bf16 at NVIDIA's measured bf16:fp8 ratio; 4- and 8-bit take fp8's figure
        ratio = DEFAULT_EFFICIENCY.flops_for("bf16") / DEFAULT_EFFICIENCY.flops_for("fp8")
        assert eff.flops_for("bf16") == pytest.approx(eff.flops_for("fp8") * ratio)
        assert eff.flops_for("int8") == eff.flops_for("fp4") == eff.flops_for("fp8")
        assert eff.bandwidth_by_dtype == DEFAULT_EFFICIENCY.bandwidth_by_dtype
    # no MLPerf run of MI355X here: the defaults but for its die's launch cost
    mi355x = efficiency_for_gpu("MI355X")
    assert replace(mi355x, gemm_launch_s=DEFAULT_EFFICIENCY.gemm_launch_s, source="") == replace(DEFAULT_EFFICIENCY,
                                                                                                     source="")
    assert mi355x.gemm_launch_s == AMD_GEMM_LAUNCH_S_BY_DIE["CDNA4"] == efficiency_for_gpu("MI350X").gemm_launch_s


def test_a_decode_step_on_amd_pays_its_dies_launch_cost_per_gemm():
    """The fitted launch cost adds a constant to every iteration, whatever its batch: the step's GEMM launches
    times the difference from NVIDIA's 4 us, and nothing else."""
    arch = load_architecture("deepseek-ai/DeepSeek-R1")
    for gpu in ("MI300X", "MI355X"):
        fitted = efficiency_for_gpu(gpu)
        step = build_step_model(arch, resolve_gpu(gpu), 8, "fp8", "fp8", engine="sglang")
        nvidia = build_step_model(arch, resolve_gpu(gpu), 8, "fp8", "fp8",
                                  replace(fitted, gemm_launch_s=DEFAULT_EFFICIENCY.gemm_launch_s), engine="sglang")
        extra = step.gemm_launches * (AMD_GEMM_LAUNCH_S_BY_DIE[AMD_DIE[gpu]] - DEFAULT_EFFICIENCY.gemm_launch_s)
        for seqs in (1.0, 16.0, 64.0):
            load = IterationLoad(seqs, 0.0, seqs * 2048 * step.kv_bytes_per_token, 0.0)
            assert float(step.iteration_time_s(load)) - float(nvidia.iteration_time_s(load)) == pytest.approx(extra)
        assert 2e-3 < extra < 30e-3      # DeepSeek-R1's 486 GEMMs a step: milliseconds, as the rows show


def test_a_compute_bound_prefill_on_mi300x_is_priced_at_the_fitted_rate():
    arch = load_architecture("meta-llama/Meta-Llama-3.1-70B")
    step = build_step_model(arch, resolve_gpu("MI300X"), 1, "fp8", "fp8", engine="vllm")
    same_launch = replace(DEFAULT_EFFICIENCY, gemm_launch_s=AMD_GEMM_LAUNCH_S_BY_DIE["CDNA3"])
    default = build_step_model(arch, resolve_gpu("MI300X"), 1, "fp8", "fp8", same_launch, engine="vllm")
    load = IterationLoad(0.0, 16384.0, 0.0, 0.0)
    slower = float(step.iteration_time_s(load)) / float(default.iteration_time_s(load))
    # prefill of 16k tokens is compute-bound: its GEMMs take the fitted share's inverse ratio, attention less
    assert 1.2 < slower <= DEFAULT_EFFICIENCY.flops_for("fp8") / AMD_FP8_FLOPS_EFFICIENCY["MI300X"] + 1e-9


def test_the_caveat_names_where_the_figures_come_from():
    assert "its matrix rate on AMD's MLPerf v5.1 llama2-70b Offline runs" in roofline_caveat("MI325X", "AMD")
    assert "matrix rate" not in roofline_caveat("MI355X", "AMD")
    assert "GEMM launch cost fitted on AMD's InferenceMAX DeepSeek-R1 SGLang runs on its die (CDNA4)" in \
        roofline_caveat("MI350X", "AMD")
    assert "unverified" in roofline_caveat("MI350X", "AMD") and "unverified" not in roofline_caveat("MI355X", "AMD")
    assert "Held out, against MI325X's InferenceMAX DeepSeek-R1 SGLang runs" in roofline_caveat("MI300X", "AMD")


@pytest.mark.skipif(not (DATA / "mlperf_inference").is_dir(), reason="needs ../shared/data (the MLPerf CSVs)")
def test_the_fitted_share_reproduces_amds_offline_runs():
    pytest.importorskip("pandas")
    sys.path.insert(0, str(ROOT / "bench"))
    import accuracy  # noqa: E402  (bench/accuracy.py)

    rows = accuracy.mlperf_rows(DATA, 1.0)
    for gpu in AMD_FP8_FLOPS_EFFICIENCY:
        train = accuracy._amd_offline_rows(rows, gpu)
        assert len(train) >= 5
        for r in train:
            accuracy.predict_row(r)
        assert statistics.median(abs(x) for x in accuracy.errors(train, "output_tokens_per_s_per_gpu")) < 2.0


@pytest.mark.skipif(not (DATA / "inferencemax").is_dir(), reason="needs ../shared/data (the InferenceMAX CSV)")
def test_the_launch_cost_fits_its_runs_and_holds_out_on_the_others():
    """Each die's launch cost reproduces its training runs' time per output token, and the caveat's held-out medians
    are what bench/accuracy.py finds on the runs no fit saw."""
    pytest.importorskip("pandas")
    sys.path.insert(0, str(ROOT / "bench"))
    import accuracy  # noqa: E402  (bench/accuracy.py)

    rows = accuracy.imax_rows(DATA)
    for die, part in accuracy.AMD_LAUNCH_TRAINING_PART.items():
        train = accuracy._amd_launch_rows(rows, part)
        assert len(train) >= 15 and AMD_DIE[part] == die
        for r in train:
            accuracy.predict_row(r)
        assert statistics.median(abs(x) for x in accuracy.errors(train, "tpot_s")) < 6.0
    for gpu, (err, n, _, _) in AMD_HELD_OUT_TPOT_ERROR.items():
        held_out = accuracy.amd_held_out_rows(rows, gpu)
        assert not set(map(id, held_out)) & {id(r) for p in accuracy.AMD_LAUNCH_TRAINING_PART.values()
                                             for r in accuracy._amd_launch_rows(rows, p)}
        for r in held_out:
            accuracy.predict_row(r)
        found = accuracy.errors(held_out, "tpot_s")
        assert len(found) == n
        assert statistics.median(found) / 100 == pytest.approx(err, abs=0.005)
        assert statistics.median(abs(x) for x in found) < 10.0
