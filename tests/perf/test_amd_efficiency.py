"""AMD Instinct parts' matrix rate, fitted on AMD's own MLPerf runs (apmw.perf.efficiency.AMD_FP8_FLOPS_EFFICIENCY).

No AMD kernel table exists here, so an AMD part priced the plain roofline with NVIDIA's measured efficiencies; against
AMD's MLPerf v5.1 llama2-70b Offline runs that put its throughput 23-87 % too high. The fitted share of the fp8 peak
brings those runs within a few per cent and must be re-derivable from the data (bench/accuracy.py --fit)."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

from apmw.perf import build_step_model, resolve_gpu
from apmw.perf.efficiency import (AMD_FP8_FLOPS_EFFICIENCY, DEFAULT_EFFICIENCY, efficiency_for_gpu,
                                  roofline_caveat)
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
    assert efficiency_for_gpu("MI355X") is DEFAULT_EFFICIENCY       # no run of its own here


def test_a_compute_bound_prefill_on_mi300x_is_priced_at_the_fitted_rate():
    arch = load_architecture("meta-llama/Meta-Llama-3.1-70B")
    step = build_step_model(arch, resolve_gpu("MI300X"), 1, "fp8", "fp8", engine="vllm")
    default = build_step_model(arch, resolve_gpu("MI300X"), 1, "fp8", "fp8", DEFAULT_EFFICIENCY, engine="vllm")
    load = IterationLoad(0.0, 16384.0, 0.0, 0.0)
    slower = float(step.iteration_time_s(load)) / float(default.iteration_time_s(load))
    # prefill of 16k tokens is compute-bound: its GEMMs take the fitted share's inverse ratio, attention less
    assert 1.2 < slower <= DEFAULT_EFFICIENCY.flops_for("fp8") / AMD_FP8_FLOPS_EFFICIENCY["MI300X"] + 1e-9


def test_the_caveat_names_where_the_figures_come_from():
    assert "matrix rate fitted on AMD's MLPerf v5.1 llama2-70b Offline runs" in roofline_caveat("MI325X", "AMD")
    assert "matrix rate" not in roofline_caveat("MI355X", "AMD")


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
