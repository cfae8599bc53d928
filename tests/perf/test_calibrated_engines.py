"""Issue 22: TensorRT-LLM's own kernel tables on B200, B300, GB200 and GB300
(catalog/data/calibration/<system>__trtllm.npz, TensorRT-LLM 1.3.0rc20 from aiconfigurator-core 0.12.0,
scripts/build_calibration.py); vLLM's stand in elsewhere (H100/H200: SOURCES.md says why). SGLang 0.5.14's
own tables on all six calibrated GPUs (<system>__sglang.npz), with SGLang's default kernel per table."""

from __future__ import annotations

import json

import numpy as np
import pytest

from apmw.arch import load_architecture
from apmw.catalog.gpus import get_gpu
from apmw.perf import CalibratedStepModel, IterationLoad, build_step_model
from apmw.perf import tables as tables_module
from apmw.perf.tables import bilinear_log2, gemm_latency_s, has_engine_tables, interp_extrapolate, load_tables
from tests.perf.loads import assert_never_faster

BLACKWELL = ["B200-SXM-180GB", "B300-SXM-288GB", "GB200 (per GPU)", "GB300 (per GPU)"]
HOPPER = ["H100-SXM5-80GB", "H200-SXM-141GB"]
LLAMA8 = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA70 = "meta-llama/Llama-3.1-70B-Instruct"
# bundled package data: 2.7 MB of vLLM tables before TensorRT-LLM's (4.1 MB with them, 6.1 MB with
# SGLang's); about 10 MB in all is the budget
BUNDLE_BUDGET_BYTES = 10e6




@pytest.mark.parametrize("gpu", BLACKWELL)
def test_trtllm_tables_are_exact_at_their_measured_points(gpu):
    t = load_tables(gpu, "trtllm")
    assert t is not None and (t.engine, t.engine_version) == ("trtllm", "1.3.0rc20")
    assert t is not load_tables(gpu) and has_engine_tables(gpu, "trtllm")
    meta = json.loads(str(t._npz["meta"]))
    assert meta["files"]["gemm_perf"].endswith("gemm/trtllm/1.3.0rc20/gemm_perf.parquet")
    # the kernels kept: TensorRT-LLM's default attention backend, the CUTLASS MoE first; its own all-reduce
    assert t.kernels["generation_attention_perf"] == ["torch_flow"] == t.kernels["context_attention_perf"]
    assert "moe_torch_flow_min_latency" not in t.kernels["moe_perf"]
    assert not t.keys("moe_mxfp4_") and meta["selection"]["moe_dtypes_skipped"] == ["w4a16_mxfp4"]
    assert meta["selection"]["allreduce_rows"] == "implementation=trtllm"
    ns, ks = t["gemm_n"], t["gemm_k"]
    for dt in ("bf16", "fp8", "nvfp4"):
        cube = t[f"gemm_{dt}"]
        for i, j in ((3, 5), (12, 12), (16, 8)):
            assert np.array_equal(gemm_latency_s(t, dt, ns[i], ks[j]), cube[:, i, j]), (dt, i, j)
        d = np.diff(cube, axis=0)
        assert np.all(d[~np.isnan(d)] >= 0), dt                    # monotone in tokens
    b, s = np.meshgrid(t["dec_batch"], t["dec_step"], indexing="ij")
    for kv in ("bf16", "fp8"):
        dec = f"dec_{kv}_32_8_128"
        np.testing.assert_allclose(bilinear_log2(t[dec], t["dec_batch"], t["dec_step"], b.ravel(), s.ravel()),
                                   t[dec].ravel(), rtol=1e-12)
        ctx = f"ctx_{kv}_32_8_128"
        np.testing.assert_array_equal(np.interp(t["ctx_isl"], t["ctx_isl"], t[ctx]), t[ctx])
    for dt in ("nvfp4", "fp8", "bf16"):
        moe = t.keys(f"moe_{dt}_")
        assert moe, dt
        np.testing.assert_array_equal(interp_extrapolate(t["moe_tokens"], t["moe_tokens"], t[moe[0]]), t[moe[0]])
    ars = [k for k in t.keys("ar_") if k != "ar_size"]
    assert ars
    for ar in ars:
        np.testing.assert_array_equal(np.interp(t["ar_size"], t["ar_size"], t[ar]), t[ar])
    for key in t.keys("moe_") + t.keys("dec_") + t.keys("ctx_") + t.keys("ar_"):
        a = t[key]
        for axis in range(a.ndim):
            assert np.all(np.diff(a, axis=axis) >= 0), (key, axis)


def test_trtllm_prefill_attention_is_read_in_the_math_dtype_of_its_kv():
    """TensorRT-LLM runs its context FMHA in fp8 with an fp8 KV cache (paged context FMHA): the fp8
    table is that kernel, not the bf16 one (B200: 1.1-1.4x faster at 1-8k tokens, 32/8 heads)."""
    t = load_tables("B200-SXM-180GB", "trtllm")
    isl = t["ctx_isl"]
    long = isl >= 1024
    ratio = t["ctx_fp8_32_8_128"][long] / t["ctx_bf16_32_8_128"][long]
    assert np.all(ratio < 1.0), ratio
    assert json.loads(str(t._npz["meta"]))["selection"]["context_attention_math_dtype_by_kv_dtype"] == {
        "bfloat16": "bfloat16", "fp8": "fp8"}


def test_the_prediction_for_trtllm_reads_trtllms_file():
    arch = load_architecture(LLAMA8)
    for gpu in BLACKWELL:
        trt = build_step_model(arch, get_gpu(gpu), 1, "fp8", "fp8", engine="trtllm")
        vllm = build_step_model(arch, get_gpu(gpu), 1, "fp8", "fp8", engine="vllm")
        assert isinstance(trt, CalibratedStepModel) and trt.curves.tables_engine == "trtllm"
        assert "trtllm's own kernel tables" in trt.source_detail
        assert load_tables(gpu, "trtllm").source in trt.source_detail and "TensorRT-LLM 1.3.0rc20" in trt.source_detail
        assert vllm.curves.tables_engine == "vllm"
        t = load_tables(gpu, "trtllm")
        g = arch.hidden_size
        down = gemm_latency_s(t, "fp8", g, arch.dense_intermediate_size)
        assert not np.array_equal(down, gemm_latency_s(load_tables(gpu), "fp8", g, arch.dense_intermediate_size))
        # the per-layer GEMM curve is trtllm's own: its fp8 QKV + O + gate_up + down at each m
        h, hd = arch.hidden_size, arch.head_dim
        shapes = [((arch.num_heads + 2 * arch.num_kv_heads) * hd, h), (h, arch.num_heads * hd),
                  (2 * arch.dense_intermediate_size, h), (h, arch.dense_intermediate_size)]
        layer = sum(gemm_latency_s(t, "fp8", n, k) for n, k in shapes)
        np.testing.assert_allclose(trt.curves.layers_gemm_s, arch.num_layers * layer, rtol=1e-12)
    # gpt-oss's MXFP4 experts: TensorRT-LLM feeds them MXFP8 activations on Blackwell, and the W4A8 kernel in its
    # tables (its own measurement at TP 1, SGLang's of the same FlashInfer kernel elsewhere) makes them cover the
    # replica; its W4A16 kernel is not kept, so with bf16 activations vLLM's tables stand in whole
    oss_arch = load_architecture("openai/gpt-oss-120b")
    for tp in (1, 2):
        oss = build_step_model(oss_arch, get_gpu("B200"), tp, "fp4", "fp8", engine="trtllm")
        assert isinstance(oss, CalibratedStepModel) and oss.curves.tables_engine == "trtllm"
        assert oss.mxfp4_moe_activations == "mxfp8" and f"moe_mxfp4mxfp8_2880_2880_4_128_tp{tp}" in oss.source_detail
    oss = build_step_model(oss_arch, get_gpu("B200"), 1, "fp4", "fp8", engine="trtllm", mxfp4_moe_activations="bf16")
    assert isinstance(oss, CalibratedStepModel) and oss.curves.tables_engine == "vllm"
    # Hopper has no TensorRT-LLM tables shipped: vLLM's stand in and say so
    h200 = build_step_model(arch, get_gpu("H200"), 1, "fp8", "fp8", engine="trtllm")
    assert not has_engine_tables("H200-SXM-141GB", "trtllm")
    assert "vllm's kernel tables standing in for trtllm's" in h200.source_detail


@pytest.mark.parametrize("gpu, tp, w, kv", [("B200-SXM-180GB", 1, "fp4", "fp8"), ("GB300 (per GPU)", 4, "fp8", "fp8"),
                                            ("B300-SXM-288GB", 2, "bf16", "bf16"), ("GB200 (per GPU)", 2, "fp8", "bf16")])
def test_trtllm_more_tokens_or_more_context_is_never_faster(gpu, tp, w, kv):
    step = build_step_model(load_architecture(LLAMA70), get_gpu(gpu), tp, w, kv, engine="trtllm")
    assert isinstance(step, CalibratedStepModel) and step.curves.tables_engine == "trtllm"
    assert_never_faster(step)


@pytest.mark.parametrize("gpu", BLACKWELL)
def test_fp8_kv_rule_does_not_apply_to_trtllms_own_tables(gpu):
    """BANDWIDTH_BOUND_FP8_KV_ENGINES corrects vLLM's FA3 tables standing in for TensorRT-LLM. With its
    own XQA tables the fp8 table is read as measured: at the same context, not the bf16 table at half
    of it; and that measured fp8 read costs 0.5-0.6 of the bf16 one once KV reads dominate (32-128
    sequences x 4-8k context), i.e. KV at the bf16 kernel's bandwidth, with no correction needed."""
    arch = load_architecture(LLAMA8)
    step = build_step_model(arch, get_gpu(gpu), 1, "fp8", "fp8", engine="trtllm")
    assert step.curves.dec_ctx_scale == 1.0
    t = load_tables(gpu, "trtllm")
    np.testing.assert_array_equal(step.curves.dec_s, arch.full_attention_layers * t["dec_fp8_32_8_128"])
    b, s = t["dec_batch"], t["dec_step"]
    r = (t["dec_fp8_32_8_128"] / t["dec_bf16_32_8_128"])[np.ix_((b >= 32) & (b <= 128), (s >= 4000) & (s <= 8200))]
    assert 0.45 <= r.min() and r.max() <= 0.62, r
    load = IterationLoad(decode_seqs=np.array([64.0]), prefill_tokens=np.array([0.0]),
                         kv_read_bytes=np.array([64 * 4095 * step.kv_bytes_per_token]),
                         attention_flops=np.array([64 * float(arch.attention_flops_per_token(4095))]))
    j, i = int(np.flatnonzero(s == 4095)[0]), int(np.flatnonzero(b == 64)[0])
    assert step._attention_s(load, load.decode_seqs, load.prefill_tokens)[0] == pytest.approx(
        arch.full_attention_layers * t["dec_fp8_32_8_128"][i, j], rel=1e-9)


def test_the_bundle_stays_within_its_budget():
    files = list(tables_module._DIR.glob("*.npz"))
    sizes = {f.name: f.stat().st_size for f in files}
    assert sum(sizes.values()) < 0.7 * BUNDLE_BUDGET_BYTES, sizes
    assert all(v < 500_000 for v in sizes.values()), sizes
    assert all(v < 400_000 for k, v in sizes.items() if k.endswith("__sglang.npz")), sizes
    assert {k for k in sizes if k.endswith("__sglang.npz")} == {
        f"{tables_module.CALIBRATED_GPUS[g]}__sglang.npz" for g in HOPPER + BLACKWELL}


# SGLang's default attention backend per GPU (python/sglang/srt/server_args.py _get_default_attn_backend):
# FA3 on Hopper, trtllm_mha on SM100 Blackwell.
SGLANG_ATTENTION = {**{g: "fa3" for g in HOPPER}, **{g: "trtllm_mha" for g in BLACKWELL}}


@pytest.mark.parametrize("gpu", HOPPER + BLACKWELL)
def test_sglang_tables_are_exact_at_their_measured_points(gpu):
    t = load_tables(gpu, "sglang")
    assert t is not None and (t.engine, t.engine_version) == ("sglang", "0.5.14")
    assert t is not load_tables(gpu) and has_engine_tables(gpu, "sglang")
    meta = json.loads(str(t._npz["meta"]))
    assert meta["files"]["generation_attention_perf"].endswith(
        "attention/sglang/0.5.14/generation_attention_perf.parquet")
    # SGLang's default kernels only: one attention backend per GPU, never FlashInfer's or Triton's rows
    assert t.kernels["generation_attention_perf"] == [SGLANG_ATTENTION[gpu]] == t.kernels["context_attention_perf"]
    assert set(t.kernels["moe_perf"]) <= {"sglang_fused_moe_triton", "sglang_flashinfer_trtllm_moe"}
    assert "sglang_fused_moe_triton" in t.kernels["moe_perf"]
    assert t.kernels["custom_allreduce_perf"] == ["SGLang_CustomAllReduce_graph"]
    assert meta["selection"]["allreduce_rows"] == "backend=sglang_graph"
    assert "sglang_deepgemm_gemm_nt_f8f8bf16" not in t.kernels["gemm_perf"]
    ns, ks = t["gemm_n"], t["gemm_k"]
    gemm_dtypes = ("bf16", "fp8", "nvfp4") if gpu in BLACKWELL else ("bf16", "fp8")
    assert t.has("gemm_nvfp4") == (gpu in BLACKWELL)
    for dt in gemm_dtypes:
        cube = t[f"gemm_{dt}"]
        for i, j in ((3, 5), (12, 12), (16, 8)):
            assert np.array_equal(gemm_latency_s(t, dt, ns[i], ks[j]), cube[:, i, j]), (dt, i, j)
        d = np.diff(cube, axis=0)
        assert np.all(d[~np.isnan(d)] >= 0), dt
    b, s = np.meshgrid(t["dec_batch"], t["dec_step"], indexing="ij")
    for kv in ("bf16", "fp8"):
        for heads in ("32_8_128", "64_8_128", "8_1_128"):
            dec = f"dec_{kv}_{heads}"
            np.testing.assert_allclose(bilinear_log2(t[dec], t["dec_batch"], t["dec_step"], b.ravel(), s.ravel()),
                                       t[dec].ravel(), rtol=1e-12)
            ctx = f"ctx_{kv}_{heads}"
            np.testing.assert_array_equal(np.interp(t["ctx_isl"], t["ctx_isl"], t[ctx]), t[ctx])
    moe_dtypes = ("bf16", "fp8block", "nvfp4", "mxfp4") if gpu in BLACKWELL else ("bf16", "fp8block", "mxfp4")
    for dt in moe_dtypes:
        moe = t.keys(f"moe_{dt}_")
        assert moe, dt
        for key in (moe[0], moe[-1]):
            np.testing.assert_array_equal(interp_extrapolate(t["moe_tokens"], t["moe_tokens"], t[key]), t[key])
    ars = [k for k in t.keys("ar_") if k != "ar_size"]
    assert "ar_2" in ars and "ar_4" in ars
    for ar in ars:
        np.testing.assert_array_equal(np.interp(t["ar_size"], t["ar_size"], t[ar]), t[ar])
    for key in t.keys("moe_") + t.keys("dec_") + t.keys("ctx_") + t.keys("ar_"):
        a = t[key]
        for axis in range(a.ndim):
            assert np.all(np.diff(a, axis=axis) >= 0), (key, axis)


def test_the_prediction_for_sglang_reads_sglangs_file():
    arch = load_architecture(LLAMA8)
    for gpu in HOPPER + BLACKWELL:
        sgl = build_step_model(arch, get_gpu(gpu), 1, "fp8", "bf16", engine="sglang")
        assert isinstance(sgl, CalibratedStepModel) and sgl.curves.tables_engine == "sglang"
        assert "sglang's own kernel tables" in sgl.source_detail and "SGLang 0.5.14" in sgl.source_detail
        t = load_tables(gpu, "sglang")
        h, hd = arch.hidden_size, arch.head_dim
        shapes = [((arch.num_heads + 2 * arch.num_kv_heads) * hd, h), (h, arch.num_heads * hd),
                  (2 * arch.dense_intermediate_size, h), (h, arch.dense_intermediate_size)]
        layer = sum(gemm_latency_s(t, "fp8", n, k) for n, k in shapes)
        np.testing.assert_allclose(sgl.curves.layers_gemm_s, arch.num_layers * layer, rtol=1e-12)
        np.testing.assert_array_equal(sgl.curves.dec_s, arch.full_attention_layers * t["dec_bf16_32_8_128"])
        assert not np.array_equal(layer, sum(gemm_latency_s(load_tables(gpu), "fp8", n, k) for n, k in shapes))
    # TP 2 reads SGLang's own all-reduce
    tp2 = build_step_model(load_architecture(LLAMA70), get_gpu("H200"), 2, "fp8", "fp8", engine="sglang")
    t = load_tables("H200-SXM-141GB", "sglang")
    np.testing.assert_allclose(tp2.curves.ar_s, 2 * 80 * t["ar_2"], rtol=1e-12)
    # fp8 (per-tensor) MoE is not measured for SGLang: a model whose only cover is vLLM's falls back to it whole
    assert not t.keys("moe_fp8_")


@pytest.mark.parametrize("gpu, tp, w, kv", [("H100-SXM5-80GB", 1, "fp8", "fp8"), ("H200-SXM-141GB", 4, "bf16", "bf16"),
                                            ("B200-SXM-180GB", 1, "fp4", "fp8"), ("GB300 (per GPU)", 4, "fp8", "fp8"),
                                            ("B300-SXM-288GB", 2, "bf16", "bf16"), ("GB200 (per GPU)", 2, "fp8", "bf16")])
def test_sglang_more_tokens_or_more_context_is_never_faster(gpu, tp, w, kv):
    step = build_step_model(load_architecture(LLAMA70), get_gpu(gpu), tp, w, kv, engine="sglang")
    assert isinstance(step, CalibratedStepModel) and step.curves.tables_engine == "sglang"
    assert_never_faster(step)


@pytest.mark.parametrize("gpu", HOPPER + BLACKWELL)
def test_sglang_fp8_kv_decode_is_its_measured_kernel(gpu):
    """SGLang is not in BANDWIDTH_BOUND_FP8_KV_ENGINES: with its own tables the fp8 table is read as
    measured. Its Hopper FA3 dequantises fp8 KV on read (fp8 / bf16 time 0.7-0.95 at 32-128 sequences x
    4-8k context, above vLLM's FA3), its Blackwell trtllm_mha reads it natively (0.5-0.7)."""
    arch = load_architecture(LLAMA8)
    step = build_step_model(arch, get_gpu(gpu), 1, "fp8", "fp8", engine="sglang")
    assert step.curves.dec_ctx_scale == 1.0
    t = load_tables(gpu, "sglang")
    np.testing.assert_array_equal(step.curves.dec_s, arch.full_attention_layers * t["dec_fp8_32_8_128"])
    b, s = t["dec_batch"], t["dec_step"]
    window = np.ix_((b >= 32) & (b <= 128), (s >= 4000) & (s <= 8200))
    r = (t["dec_fp8_32_8_128"] / t["dec_bf16_32_8_128"])[window]
    lo, hi = (0.7, 0.95) if gpu in HOPPER else (0.5, 0.7)
    assert lo <= r.min() and r.max() <= hi, r
    if gpu in HOPPER:
        v = load_tables(gpu)
        assert r.min() > ((v["dec_fp8_32_8_128"] / v["dec_bf16_32_8_128"])[window]).max()


def test_tensorrt_llm_pays_its_fixed_cost_per_layer_only_where_vllms_kernels_stand_in():
    # Blackwell: TensorRT-LLM's own measured kernels price the iteration, and the fitted fixed cost beside them
    # is OWN_KERNELS_OVERHEAD_S_PER_LAYER; Hopper: vLLM's kernels stand in and the assumed 28 us a layer stays
    from apmw.perf.serving_policy import ENGINE_OVERHEAD_S_PER_LAYER, OWN_KERNELS_OVERHEAD_S_PER_LAYER

    arch = load_architecture(LLAMA8)
    load = IterationLoad(decode_seqs=np.array([8.0]), prefill_tokens=np.array([0.0]),
                         kv_read_bytes=np.array([8.0 * 1024]), attention_flops=np.zeros(1))
    own = build_step_model(arch, get_gpu("B200"), 1, "fp8", "fp8", engine="trtllm")
    stand_in = build_step_model(arch, get_gpu("H200"), 1, "fp8", "fp8", engine="trtllm")
    assert own.curves.tables_engine == "trtllm" and stand_in.curves.tables_engine == "vllm"
    assert own.iteration_parts_s(load)[0] == OWN_KERNELS_OVERHEAD_S_PER_LAYER["trtllm"] * arch.num_layers
    assert stand_in.iteration_parts_s(load)[0] == ENGINE_OVERHEAD_S_PER_LAYER["trtllm"] * arch.num_layers == 28e-6 * 32
    assert "(trtllm, fitted)" in own.source_detail and "(trtllm, assumed)" in stand_in.source_detail
    # and the replica's serving policy reports the figure its step model charges
    from apmw.capacity.benchmark import replica_for_benchmark

    for gpu, per_layer in (("B200", OWN_KERNELS_OVERHEAD_S_PER_LAYER["trtllm"]), ("H200", 28e-6)):
        replica = replica_for_benchmark(LLAMA8, gpu, 1, "fp8", "fp8", 1024, 128, "trtllm")
        assert replica.policy.overhead_s_per_layer == per_layer
