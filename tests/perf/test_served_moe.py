"""The served MoE ceiling (apmw.perf.served_moe): Hopper's fitted figure, Blackwell's measured kernel."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from apmw.arch import load_architecture
from apmw.catalog.gpus import get_gpu
from apmw.perf import build_step_model, served_moe
from apmw.perf.served_moe import kernel_flops_per_s, served_moe_ceiling
from apmw.perf.tables import load_tables

FITTED = 150e12


def test_a_kernels_rate_is_its_flops_over_the_measured_time_at_a_prefill_chunk():
    # H100, vLLM 0.24.0, gpt-oss-120b's experts in MXFP4 at TP 1: 8,192 is a measured grid point, so the
    # rate is the raw row's (aiconfigurator h100_sxm/moe/vllm/0.24.0/moe_perf.parquet): about 411 TFLOP/s
    t = load_tables(served_moe.REFERENCE_GPU)
    seconds = float(t[served_moe.REFERENCE_KEY][int(np.flatnonzero(t["moe_tokens"] == 8192)[0])])
    rate = kernel_flops_per_s(t, served_moe.REFERENCE_KEY)
    assert rate == pytest.approx(8192 * 6 * 2880 * 2880 * 4 / seconds, rel=1e-12)
    assert rate == pytest.approx(411e12, rel=0.005)


def test_blackwell_serves_moe_at_its_own_measured_kernel():
    # NVFP4 DeepSeek-R1 experts on GB200 with TensorRT-LLM's tables: expert TP 1 (wide EP) runs the whole
    # experts' kernel, expert TP 4 the quarter-width one, each at its own measured rate
    arch = load_architecture("deepseek-ai/DeepSeek-R1")
    gb200 = get_gpu("GB200")
    trt = load_tables(gb200.name, "trtllm")
    for tp in (1, 4):
        c = served_moe_ceiling(FITTED, arch, gb200, "fp4", tp, "trtllm")
        kernel = kernel_flops_per_s(trt, f"moe_nvfp4_7168_2048_8_256_tp{tp}")
        assert c.flops_per_s == pytest.approx(served_moe.BLACKWELL_SHARE * kernel, rel=1e-12)
        assert f"moe_nvfp4_7168_2048_8_256_tp{tp}" in c.source and "trtllm" in c.source
    # the module's figure: 2,068 TFLOP/s at expert TP 1, against the 379 the bf16-peak scaling gave
    assert served_moe_ceiling(FITTED, arch, gb200, "fp4", 1, "trtllm").flops_per_s == pytest.approx(2068e12, rel=0.005)
    assert FITTED * gb200.bf16_flops / 989e12 == pytest.approx(379e12, rel=0.005)


def test_hopper_keeps_the_fitted_figure_and_gpus_without_the_kernel_scale_it_by_the_bf16_peak():
    arch = load_architecture("deepseek-ai/DeepSeek-R1")
    assert served_moe_ceiling(FITTED, arch, get_gpu("H200"), "fp8", 8, "sglang").flops_per_s == FITTED
    mi355x = get_gpu("MI355X")
    c = served_moe_ceiling(FITTED, arch, mi355x, "fp8", 8, "sglang")
    assert c.flops_per_s == pytest.approx(FITTED * mi355x.bf16_flops / 989e12, rel=1e-12)
    assert "ASSUMPTION" in c.source
    # a catalogue part with an overridden field is not the part the tables measured
    faster = replace(get_gpu("GB200"), hbm_bandwidth_bytes_per_s=get_gpu("GB200").hbm_bandwidth_bytes_per_s * 2)
    c = served_moe_ceiling(FITTED, arch, faster, "fp4", 1, "trtllm")
    assert c.flops_per_s == pytest.approx(FITTED * faster.bf16_flops / 989e12, rel=1e-12)


def test_the_calibrated_path_caps_blackwell_moe_at_the_kernel_so_the_table_alone_prices_prefill(monkeypatch):
    # gpt-oss-120b on B200 (vLLM's tables): with a share of 1 the ceiling equals the kernel at 8,192 tokens,
    # so the layer's curve there is the table's; Hopper's share of its kernel (0.365) would slow it
    from apmw.perf import calibrated

    arch = load_architecture("openai/gpt-oss-120b")
    b200 = get_gpu("B200")
    monkeypatch.setattr(calibrated, "SERVED_MOE_TFLOPS_PER_GPU", None)
    table = build_step_model(arch, b200, 1, "fp4", "bf16").curves
    monkeypatch.setattr(calibrated, "SERVED_MOE_TFLOPS_PER_GPU", 150.0)
    served = build_step_model(arch, b200, 1, "fp4", "bf16").curves
    i = int(np.flatnonzero(table.m == 8192)[0])
    assert served.layers_gemm_s[i] == pytest.approx(table.layers_gemm_s[i], rel=1e-9)
    monkeypatch.setattr(served_moe, "BLACKWELL_SHARE", 0.365)
    slowed = build_step_model(arch, b200, 1, "fp4", "bf16").curves
    assert slowed.layers_gemm_s[i] > 1.5 * table.layers_gemm_s[i]
