"""The served MoE ceiling (apmw.perf.served_moe): Hopper's fitted figure, Blackwell's measured kernel."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from apmw.arch import load_architecture
from apmw.catalog.gpus import get_gpu
from apmw.errors import ApmwError
from apmw.perf import IterationLoad, build_step_model, served_moe
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


def test_blackwell_serves_moe_at_a_share_of_its_own_measured_kernel():
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
    # the module's figures: the kernel runs 2,068 TFLOP/s at expert TP 1, served 755, against the 379 the
    # bf16-peak scaling gave; the fitted share is Hopper's share of its own kernel (150 of 411)
    assert kernel_flops_per_s(trt, "moe_nvfp4_7168_2048_8_256_tp1") == pytest.approx(2068e12, rel=0.005)
    assert served_moe_ceiling(FITTED, arch, gb200, "fp4", 1, "trtllm").flops_per_s == pytest.approx(755e12, rel=0.005)
    assert FITTED * gb200.bf16_flops / 989e12 == pytest.approx(379e12, rel=0.005)
    hopper_share = FITTED / kernel_flops_per_s(load_tables(served_moe.REFERENCE_GPU), served_moe.REFERENCE_KEY)
    assert served_moe.BLACKWELL_SHARE == pytest.approx(hopper_share, abs=0.0005)


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


def test_the_calibrated_path_holds_blackwell_moe_prefill_to_the_share_of_its_kernel(monkeypatch):
    # gpt-oss-120b on B200 (vLLM's tables): at a prefill chunk the routed experts take the measured kernel's
    # time over the share; decode-sized batches keep the table (far below the ceiling)
    from apmw.perf import calibrated

    arch = load_architecture("openai/gpt-oss-120b")
    b200 = get_gpu("B200")
    t = load_tables(b200.name)
    monkeypatch.setattr(calibrated, "SERVED_MOE_TFLOPS_PER_GPU", None)
    table = build_step_model(arch, b200, 1, "fp4", "bf16").curves
    monkeypatch.setattr(calibrated, "SERVED_MOE_TFLOPS_PER_GPU", 150.0)
    served = build_step_model(arch, b200, 1, "fp4", "bf16").curves
    i, k = int(np.flatnonzero(table.m == 8192)[0]), int(np.flatnonzero(table.m == 8)[0])
    moe = float(np.interp(8192, t["moe_tokens"], t["moe_mxfp4_2880_2880_4_128_tp1"]))
    extra = arch.num_layers * moe * (1 / served_moe.BLACKWELL_SHARE - 1)
    assert served.layers_gemm_s[i] - table.layers_gemm_s[i] == pytest.approx(extra, rel=1e-9)
    assert served.layers_gemm_s[k] == table.layers_gemm_s[k]


def test_mxfp8_activations_read_the_w4a8_kernel_where_the_experts_are_mxfp4():
    # vLLM's B200 tables hold FlashInfer's MXFP4 x MXFP8 kernel as SGLang measured it (scripts/build_calibration.py,
    # MOE_BORROWED): the same numbers as SGLang's own table
    arch = load_architecture("openai/gpt-oss-120b")
    b200 = get_gpu("B200")
    vllm, sgl = load_tables(b200.name), load_tables(b200.name, "sglang")
    key = "moe_mxfp4mxfp8_2880_2880_4_128_tp1"
    np.testing.assert_array_equal(vllm[key], np.interp(vllm["moe_tokens"], sgl["moe_tokens"], sgl[key]))
    w4a8 = build_step_model(arch, b200, 1, "fp4", "fp8", mxfp4_moe_activations="mxfp8")
    w4a16 = build_step_model(arch, b200, 1, "fp4", "fp8")
    assert w4a16.mxfp4_moe_activations == "bf16" and key in w4a8.source_detail
    # raw rows (b200_sxm/moe/sglang/0.5.14/moe_perf.parquet, power_law_1.01, TP 1): 64 tokens 0.227 ms a layer
    # against the W4A16 kernel's 0.294 ms (vLLM 0.24.0), kept by the builder
    j = int(np.flatnonzero(vllm["moe_tokens"] == 64)[0])
    assert vllm[key][j] == pytest.approx(0.227e-3, rel=0.01)
    assert vllm["moe_mxfp4_2880_2880_4_128_tp1"][j] == pytest.approx(0.294e-3, rel=0.01)
    load = IterationLoad(decode_seqs=np.array([64.0]), prefill_tokens=np.array([0.0]),
                         kv_read_bytes=np.array([64 * 1024 * w4a8.kv_bytes_per_token]), attention_flops=np.zeros(1))
    saved = float(w4a16.iteration_time_s(load)[0] - w4a8.iteration_time_s(load)[0])
    assert saved == pytest.approx(arch.num_layers * (vllm["moe_mxfp4_2880_2880_4_128_tp1"][j] - vllm[key][j]), rel=1e-6)
    # NVFP4 experts are not MXFP4: the setting leaves their kernel alone
    r1 = load_architecture("deepseek-ai/DeepSeek-R1")
    gb200 = get_gpu("GB200")
    assert (served_moe_ceiling(FITTED, r1, gb200, "fp4", 1, "trtllm", "mxfp8")
            == served_moe_ceiling(FITTED, r1, gb200, "fp4", 1, "trtllm", "bf16"))


@pytest.mark.parametrize("model, gpu, weights, why", [
    ("deepseek-ai/DeepSeek-R1", "B200", "fp8", "applies to MXFP4 routed experts .* its routed experts are fp8"),
    # a dense model's experts were called 'not routed' (fuzzing, session 45)
    ("meta-llama/Meta-Llama-3.1-8B", "B200", "fp8", "this model has no routed experts"),
    ("openai/gpt-oss-120b", "H200", "fp4", "needs NVIDIA's FP4/MX tensor cores"),
    # AMD's MX cores run no FlashInfer kernel: the setting was accepted and ignored (fuzzing, session 43)
    ("openai/gpt-oss-120b", "MI355X", "fp4", "needs NVIDIA's FP4/MX tensor cores .* MI355X is priced with MXFP4"),
])
def test_mxfp8_activations_are_refused_where_they_cannot_run(model, gpu, weights, why):
    with pytest.raises(ApmwError, match=why):
        build_step_model(load_architecture(model), get_gpu(gpu), 8, weights, "fp8", mxfp4_moe_activations="mxfp8")


def test_tensorrt_llm_feeds_mxfp4_experts_mxfp8_on_blackwell_only():
    arch = load_architecture("openai/gpt-oss-120b")
    assert build_step_model(arch, get_gpu("B200"), 1, "fp4", "fp8", engine="trtllm").mxfp4_moe_activations == "mxfp8"
    assert build_step_model(arch, get_gpu("H200"), 1, "fp4", "fp8", engine="trtllm").mxfp4_moe_activations == "bf16"
    assert build_step_model(arch, get_gpu("B200"), 1, "fp4", "fp8", engine="sglang").mxfp4_moe_activations == "bf16"


def test_the_setting_is_named_as_the_spec_and_the_cli_name_it():
    from typer.testing import CliRunner

    from apmw.cli import _register_verbs, app
    from apmw.perf import replica_from_spec
    from apmw.spec import load_spec

    spec = load_spec("examples/coding-agent.yaml")
    w4a8 = spec.model_copy(update={"serving": spec.serving.model_copy(update={"mxfp4_moe_activations": "mxfp8"})})
    with pytest.raises(ApmwError, match=r"^examples/coding-agent\.yaml: line \d+: serving\.mxfp4_moe_activations 'mxfp8' applies to MXFP4 routed experts"):
        replica_from_spec(w4a8)
    _register_verbs()   # every verb, as the `apmw` entry point does
    base = ["predict", "--model", "openai/gpt-oss-120b", "--tp", "1", "--weight-dtype", "fp4", "--kv-dtype", "fp8",
            "--isl", "1024", "--osl", "1024", "--concurrency", "64", "--json"]
    r = CliRunner().invoke(app, [*base, "--gpu", "H200", "--mxfp4-moe-activations", "mxfp8"])
    assert r.exit_code == 1 and "--mxfp4-moe-activations 'mxfp8' needs NVIDIA's FP4/MX tensor cores" in r.output
    tpot = {acts: json.loads(CliRunner().invoke(app, [*base, "--gpu", "B200", "--mxfp4-moe-activations", acts]).output)
            ["tpot_s"] for acts in ("bf16", "mxfp8")}
    assert tpot["mxfp8"] < 0.9 * tpot["bf16"]
