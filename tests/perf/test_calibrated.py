"""The calibrated step model: exact at measured points, monotone, tagged with its source."""

from __future__ import annotations

import numpy as np
import pytest

from apmw.arch import load_architecture
from apmw.catalog.gpus import get_gpu
from apmw.perf import CalibratedStepModel, IterationLoad, StepModel, build_step_model, replica_from_spec
from apmw.perf.calibrated import calibration_gap, graph_padded
from apmw.perf.tables import bilinear_log2, gemm_latency_s, load_tables
from apmw.spec import spec_from_dict
from tests.conftest import small_spec_dict

LLAMA8 = "meta-llama/Meta-Llama-3.1-8B"


def _cal(model=LLAMA8, gpu="H200", tp=1, w="bf16", kv="bf16") -> CalibratedStepModel:
    return CalibratedStepModel(arch=load_architecture(model), gpu=get_gpu(gpu), gpus=tp, weight_dtype=w, kv_dtype=kv)


# Raw aiconfigurator rows (h200_sxm/gemm/vllm/0.24.0/gemm_perf.parquet, bfloat16, n = k = 4096;
# ai-dynamo/aiconfigurator@095f58a5, Apache-2.0), latency in ms: the builder must keep them.
RAW_H200_BF16_4096 = {1: 0.012557, 4096: 0.168069, 32768: 1.462356}


@pytest.mark.parametrize("m, latency_ms", RAW_H200_BF16_4096.items())
def test_gemm_interpolation_is_exact_at_measured_points(m, latency_ms):
    t = load_tables("H200-SXM-141GB")
    curve = gemm_latency_s(t, "bf16", 4096.0, 4096.0)
    i = int(np.flatnonzero(t["gemm_m"] == m)[0])
    assert curve[i] == pytest.approx(latency_ms * 1e-3, rel=1e-4)   # raw values quoted to 6 decimals


# Raw aiconfigurator rows (same file, fp8, n = 16384, k = 8192), ms: the measured time falls from
# m = 160 to 256 before it rises again at 512 (vLLM's CUTLASS fp8 kernel, as measured).
RAW_H200_FP8_16384_8192 = {160: 0.079221, 192: 0.068098, 224: 0.059274, 256: 0.054362, 512: 0.094316}


def test_gemm_table_pools_a_measured_dip_to_its_mean_not_its_peak():
    # The builder's monotone fit (isotonic regression) replaces a falling run by its mean, so
    # measurement scatter moves the table neither up nor down; a running maximum would hold the
    # run's first and highest value (0.0792 ms) all the way to m = 256, 46 % above the measurement.
    t = load_tables("H200-SXM-141GB")
    curve = gemm_latency_s(t, "fp8", 16384.0, 8192.0)

    def stored_ms(m: int) -> float:
        return float(curve[int(np.flatnonzero(t["gemm_m"] == m)[0])]) * 1e3

    dip = [RAW_H200_FP8_16384_8192[m] for m in (160, 192, 224, 256)]
    for m in (160, 192, 224, 256):
        assert stored_ms(m) == pytest.approx(sum(dip) / len(dip), rel=1e-4)
    assert stored_ms(512) == pytest.approx(RAW_H200_FP8_16384_8192[512], rel=1e-4)   # rising again: kept


@pytest.mark.parametrize("gpu", ["h100_sxm", "h200_sxm"])
def test_every_shipped_table_is_monotone_along_its_axes(gpu):
    # scripts/build_calibration.py fits every table monotone (more tokens, batch, context or
    # message size is never faster); the step model's monotonicity rests on it
    from apmw.perf.tables import _DIR

    z = np.load(_DIR / f"{gpu}.npz")
    checked = 0
    for key in z.files:
        a = z[key]
        if key.startswith("gemm_") and a.ndim == 3:
            axes = (0,)                        # m
        elif key.startswith("dec_") and a.ndim == 2:
            axes = (0, 1)                      # batch, context
        elif key.split("_")[0] in ("ctx", "ar", "moe") and key not in ("ctx_isl", "ar_size", "moe_tokens"):
            axes = (a.ndim - 1,)               # prompt length, message size, tokens
        else:
            continue
        for axis in axes:
            d = np.diff(a, axis=axis)
            assert np.all(d[np.isfinite(d)] >= 0), f"{gpu} {key} falls along axis {axis}"
        checked += 1
    assert checked > 500


def test_gemm_interpolation_between_grid_points_is_between_neighbours():
    t = load_tables("H100-SXM5-80GB")
    lo, mid, hi = (gemm_latency_s(t, "fp8", n, 8192.0) for n in (12288.0, 14336.0, 16384.0))
    assert np.all(lo <= mid + 1e-15) and np.all(mid <= hi + 1e-15)


def test_decode_attention_interpolation_is_exact_at_grid_points():
    t = load_tables("H100-SXM5-80GB")
    table = t["dec_fp8_32_8_128"]
    b, s = t["dec_batch"], t["dec_step"]
    bi, si = np.meshgrid(np.arange(len(b)), np.arange(len(s)), indexing="ij")
    got = bilinear_log2(table, b, s, b[bi], s[si])
    np.testing.assert_allclose(got, table, rtol=1e-12)


def test_dense_mlp_width_is_read_from_the_config_and_agrees_with_the_parameter_count():
    """config.json's intermediate_size, kept by apmw.arch; the gated MLP's 3 matrices of the
    parameter count give the same width back."""
    for name, width in ((LLAMA8, 14336), ("meta-llama/Meta-Llama-3.1-70B", 28672), ("Qwen/Qwen3-32B", 25600)):
        a = load_architecture(name)
        assert a.dense_intermediate_size == width
        h, layers = a.hidden_size, a.num_layers
        attn = h * a.num_heads * a.head_dim * 2 + h * a.num_kv_heads * a.head_dim * 2
        linear = a.active_params - a.embedding_params - (2 * layers * h + h) - a.vocab_size * h
        assert round((linear / layers - attn) / (3 * h)) == width
    assert load_architecture("deepseek-ai/DeepSeek-V3").dense_intermediate_size == 18432   # its 3 dense layers


def _load(step: StepModel, decode, prefill, ctx):
    a = step.arch
    decode, prefill, ctx = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (decode, prefill, ctx)))
    return IterationLoad(decode_seqs=decode, prefill_tokens=prefill,
                         kv_read_bytes=decode * ctx * step.kv_bytes_per_token,
                         attention_flops=decode * a.attention_flops_per_token(ctx) + prefill * a.attention_flops_per_token(ctx / 2 + prefill / 2))


@pytest.mark.parametrize("model, gpu, tp, w, kv", [(LLAMA8, "H200", 1, "bf16", "bf16"),
                                                   ("meta-llama/Meta-Llama-3.1-70B", "H100", 4, "fp8", "fp8"),
                                                   ("Qwen/Qwen3-32B", "H200", 2, "fp8", "bf16"),
                                                   ("openai/gpt-oss-120b", "H200", 2, "fp4", "bf16"),
                                                   ("Qwen/Qwen3-30B-A3B", "H100", 1, "fp8", "fp8")])
def test_more_tokens_or_more_kv_is_never_faster(model, gpu, tp, w, kv):
    step = _cal(model, gpu, tp, w, kv)
    decode = np.arange(1, 1025, dtype=float)
    for ctx in (1.0, 500.0, 8000.0, 100_000.0):
        t = step.iteration_time_s(_load(step, decode, 0.0, ctx))
        assert np.all(np.diff(t) >= -1e-12), f"decode batch, ctx {ctx}"
    prefill = np.arange(0, 40_000, 97, dtype=float)
    for d in (0.0, 8.0, 200.0):
        t = step.iteration_time_s(_load(step, d, prefill, 2000.0))
        assert np.all(np.diff(t) >= -1e-12), f"prefill tokens, decode {d}"
    ctx = np.geomspace(1, 300_000, 400)
    for d in (1.0, 64.0, 700.0):
        t = step.iteration_time_s(_load(step, d, 0.0, ctx))
        assert np.all(np.diff(t) >= -1e-12), f"context, decode {d}"


def test_vectorised_over_the_capacity_layers_2d_arrays():
    step = _cal()
    b = np.arange(1, 257, dtype=float)[:, None]
    others = np.minimum(np.arange(0, 33, dtype=float)[None, :], b - 1)
    t = step.iteration_time_s(_load(step, b - others, others * 1500, 3000.0))
    assert t.shape == (256, 33) and np.all(np.isfinite(t)) and np.all(t > 0)


def test_cuda_graph_padding_rounds_decode_batches_up():
    d = np.array([1, 2, 3, 5, 9, 16, 17, 512, 513], dtype=float)
    np.testing.assert_array_equal(graph_padded(d, np.zeros_like(d)), [1, 2, 4, 8, 16, 16, 24, 512, 513])
    assert graph_padded(np.array([9.0]), np.array([100.0]))[0] == 109   # mixed batches run eager


def test_source_tagging():
    arch = load_architecture(LLAMA8)
    assert build_step_model(arch, get_gpu("H100"), 1, "bf16", "bf16").source == "calibrated"
    assert build_step_model(arch, get_gpu("B200"), 1, "bf16", "bf16").source == "calibrated"   # its own tables
    assert build_step_model(arch, get_gpu("H100-PCIe"), 1, "bf16", "bf16").source == "scaled"
    assert build_step_model(arch, get_gpu("H100"), 1, "fp4", "bf16").source == "scaled"   # from its fp8 tables
    assert build_step_model(arch, get_gpu("H100"), 1, "bf16", "bf16", calibrated=False).source == "roofline"
    moe = load_architecture("Qwen/Qwen3-30B-A3B")
    assert build_step_model(moe, get_gpu("H200"), 1, "bf16", "bf16").source == "calibrated"
    # a shared expert is composed from the GEMM tables (session 24); MLA off Blackwell SGLang stays on the roofline
    scout = load_architecture("meta-llama/Llama-4-Scout-17B-16E-Instruct")
    assert calibration_gap(scout, get_gpu("H200"), 8, "bf16", "bf16") is None
    ds = load_architecture("deepseek-ai/DeepSeek-V3")
    assert "MLA attention with 16 query heads per rank" in calibration_gap(ds, get_gpu("H200"), 8, "fp8", "fp8")
    assert build_step_model(ds, get_gpu("H200"), 8, "fp8", "fp8").source == "roofline"
    assert replica_from_spec(spec_from_dict(small_spec_dict())).step.source in ("calibrated", "roofline")


def test_calibrated_model_refuses_what_it_cannot_model():
    from apmw.errors import ApmwError
    with pytest.raises(ApmwError, match="roofline"):
        CalibratedStepModel(arch=load_architecture(LLAMA8), gpu=get_gpu("H100-PCIe"), gpus=1,
                            weight_dtype="bf16", kv_dtype="bf16")


def test_batch_one_decode_is_close_to_weight_streaming():
    """Sanity: at batch 1 the measured GEMMs stream the weights at 60-90% of spec bandwidth."""
    step = _cal(gpu="H100")
    t = float(step.iteration_time_s(_load(step, 1.0, 0.0, 100.0)))
    ideal = step.weight_bytes / get_gpu("H100").hbm_bandwidth_bytes_per_s
    assert ideal / 0.9 < t < ideal / 0.6 + 2e-3


@pytest.mark.parametrize("gpu", ["H100-SXM5-80GB", "H200-SXM-141GB"])
def test_decode_attention_never_reads_kv_faster_than_hbm_peak(gpu):
    # aiconfigurator measured each batch only up to ~2^18 KV tokens; the builder must scale
    # the unmeasured long contexts with the KV they read, not copy the last value (which made
    # batch 256 at context 2047 read KV at 1.6x the H200's peak bandwidth).
    t = load_tables(gpu)
    peak = get_gpu(gpu).hbm_bandwidth_bytes_per_s
    b, s = np.meshgrid(t["dec_batch"], t["dec_step"], indexing="ij")
    for key in [k for k in t._names if k.startswith("dec_bf16_")]:
        _, _, heads, kv_heads, head_dim = key.split("_")
        kv_bytes = b * s * 2 * int(kv_heads) * int(head_dim) * 2          # K and V, 2 bytes each
        assert np.all(kv_bytes / t[key] <= peak), key


def test_trtllm_reads_fp8_kv_at_the_bf16_kernels_bandwidth():
    # vLLM's FA3 fp8-KV kernel (the measured table) streams KV at ~0.5 of peak; TensorRT-LLM's
    # XQA reads fp8 natively, so its fp8 read costs the bf16 kernel's time for the same bytes.
    arch = load_architecture(LLAMA8)
    vllm = build_step_model(arch, get_gpu("H200"), 1, "fp8", "fp8", engine="vllm")
    trt = build_step_model(arch, get_gpu("H200"), 1, "fp8", "fp8", engine="trtllm")
    bf16 = build_step_model(arch, get_gpu("H200"), 1, "fp8", "bf16", engine="trtllm")
    load = IterationLoad(decode_seqs=np.array([128.0]), prefill_tokens=np.array([0.0]),
                         kv_read_bytes=np.array([128 * 4096 * vllm.kv_bytes_per_token]),
                         attention_flops=np.array([128 * float(arch.attention_flops_per_token(4096))]))
    bf16_load = IterationLoad(decode_seqs=load.decode_seqs, prefill_tokens=load.prefill_tokens,
                              kv_read_bytes=np.array([128 * 2048 * bf16.kv_bytes_per_token]),
                              attention_flops=np.array([128 * float(arch.attention_flops_per_token(2048))]))
    t_vllm, t_trt = vllm.iteration_time_s(load)[0], trt.iteration_time_s(load)[0]
    assert t_trt < 0.9 * t_vllm
    # same bytes as a bf16 read of half the context (engine overheads are equal)
    assert bf16._attention_s(bf16_load, bf16_load.decode_seqs, bf16_load.prefill_tokens)[0] == pytest.approx(
        trt._attention_s(load, load.decode_seqs, load.prefill_tokens)[0], rel=1e-9)


def test_moe_layers_come_from_the_measured_fused_moe_table(monkeypatch):
    from apmw.perf import calibrated

    monkeypatch.setattr(calibrated, "SERVED_MOE_TFLOPS_PER_GPU", None)     # the table alone
    t = load_tables("H200-SXM-141GB")
    arch = load_architecture("openai/gpt-oss-120b")
    step = build_step_model(arch, get_gpu("H200"), 1, "fp4", "bf16")
    assert step.source == "calibrated"
    moe = t["moe_mxfp4_2880_2880_4_128_tp1"]
    tokens = t["moe_tokens"]
    # raw aiconfigurator rows (h200_sxm/moe/vllm/0.24.0/moe_perf.parquet, this shape, TP 1,
    # EP 1, power_law_1.01; Apache-2.0), ms: kept exactly by the builder
    for n, ms in ((1, 0.060320), (8192, 3.942496)):
        assert moe[int(np.flatnonzero(tokens == n)[0])] == pytest.approx(ms * 1e-3, rel=1e-5)
    # the per-layer curve over the GEMM grid passes through the measured MoE points
    c = step.curves
    i = int(np.flatnonzero(c.m == 8192)[0])
    j = int(np.flatnonzero(tokens == 8192)[0])
    attn = sum(gemm_latency_s(t, "bf16", n, k)[i] for n, k in ((5120, 2880), (2880, 4096)))
    router = gemm_latency_s(t, "bf16", 128, 2880)[i]
    assert c.layers_gemm_s[i] == pytest.approx(36 * (attn + moe[j] + router), rel=1e-6)
    # 4-bit experts are cheaper to stream than bf16 ones of the same shape would be at batch 1,
    # and a MoE iteration is never faster with more tokens
    load = IterationLoad(decode_seqs=np.array([1.0, 64.0, 64.0]), prefill_tokens=np.array([0.0, 0.0, 4096.0]),
                         kv_read_bytes=np.array([1, 64, 64]) * 2048 * step.kv_bytes_per_token,
                         attention_flops=np.zeros(3))
    t_iter = step.iteration_time_s(load)
    assert np.all(np.diff(t_iter) > 0)


def test_served_moe_ceiling_slows_prefill_sized_batches_only(monkeypatch):
    # the routed experts' GEMMs run no faster than SERVED_MOE_TFLOPS_PER_GPU per GPU: prefill-sized
    # batches (8k tokens: the table's 413 TFLOP/s at TP 1) are capped, decode-sized ones keep the table
    from apmw.perf import calibrated

    arch = load_architecture("openai/gpt-oss-120b")
    t = load_tables("H200-SXM-141GB")
    monkeypatch.setattr(calibrated, "SERVED_MOE_TFLOPS_PER_GPU", None)
    table = build_step_model(arch, get_gpu("H200"), 1, "fp4", "bf16").curves
    monkeypatch.setattr(calibrated, "SERVED_MOE_TFLOPS_PER_GPU", 150.0)
    capped = build_step_model(arch, get_gpu("H200"), 1, "fp4", "bf16").curves
    i, k = int(np.flatnonzero(table.m == 8192)[0]), int(np.flatnonzero(table.m == 8)[0])
    flops = 8192 * arch.experts_per_token * 6 * arch.hidden_size * arch.expert_intermediate_size
    moe = t["moe_mxfp4_2880_2880_4_128_tp1"][int(np.flatnonzero(t["moe_tokens"] == 8192)[0])]
    assert capped.layers_gemm_s[i] - table.layers_gemm_s[i] == pytest.approx(36 * (flops / 150e12 - moe), rel=1e-6)
    assert capped.layers_gemm_s[k] == table.layers_gemm_s[k]


def test_sliding_window_layers_read_only_the_window():
    from dataclasses import replace

    arch = load_architecture("openai/gpt-oss-120b")
    all_full = replace(arch, full_attention_layers=arch.num_layers, sliding_window_layers=0, sliding_window=None)

    def growth(a):
        # decode attention added by doubling a long context, 64 sequences
        step = build_step_model(a, get_gpu("H200"), 2, "fp4", "bf16")
        out = []
        for ctx in (8192, 16384):
            load = IterationLoad(decode_seqs=np.array([64.0]), prefill_tokens=np.array([0.0]),
                                 kv_read_bytes=np.array([64 * ctx * step.kv_bytes_per_token]),
                                 attention_flops=np.array([64 * float(a.attention_flops_per_token(ctx))]))
            out.append(step._attention_s(load, load.decode_seqs, load.prefill_tokens)[0])
        return out[1] - out[0]

    # gpt-oss: 18 full layers grow with the context, 18 window-128 layers do not
    assert growth(arch) == pytest.approx(growth(all_full) / 2, rel=1e-6)


def test_roofline_efficiencies_are_the_gpus_own_where_measured():
    # A100 has no aiconfigurator table; its bf16 efficiencies come from Vidur's linear layers
    # (bench/derive_efficiencies.py), other spec-sheet-only GPUs take the Hopper defaults
    from apmw.perf import DEFAULT_EFFICIENCY, efficiency_for_gpu

    arch = load_architecture(LLAMA8)
    a100 = build_step_model(arch, get_gpu("A100"), 1, "bf16", "bf16")
    b200 = build_step_model(arch, get_gpu("H100-PCIe"), 1, "bf16", "bf16")
    assert (a100.source, b200.source) == ("roofline", "scaled")
    assert a100.efficiency is efficiency_for_gpu("A100-SXM4-80GB") and a100.efficiency.bandwidth_for("bf16") == 0.77
    assert "Vidur" in a100.source_detail
    assert b200.efficiency is DEFAULT_EFFICIENCY
    # batch-1 decode streams the active weights (not the input embedding, only looked up) at the measured
    # A100 bandwidth, plus the fixed cost
    t = float(a100.iteration_time_s(_load(a100, 1.0, 0.0, 1.0)))
    assert t == pytest.approx(arch.active_weight_bytes("bf16") / (2.039e12 * 0.70) + 1e-3, rel=0.05)


def test_decode_attention_past_the_measured_context_costs_the_marginal_kv_read():
    # aiconfigurator measures batch 128 up to context 4095 and batch 256 only up to 1023
    # (h200_sxm generation_attention_perf.parquet, fp8 KV, 32/8 heads). Past that the builder
    # extends at the measured marginal cost per KV token (scripts/build_calibration.py), so a
    # larger batch at the same context is no slower per token than the smaller one measured
    # there; extending in proportion to the context (before session 9) made it 1.26x slower.
    t = load_tables("H200-SXM-141GB")
    d, b, s = t["dec_fp8_32_8_128"], list(t["dec_batch"]), list(t["dec_step"])
    per_token = {n: d[b.index(n), s.index(4095)] / (n * 4095) for n in (128, 256)}
    assert per_token[256] <= per_token[128]
    # far past every measurement the per-token cost settles at the marginal read, above the HBM peak
    far = d[b.index(256), s.index(131071)] / (256 * 131071)
    assert 2 * 8 * 128 / 4.8e12 < far < 0.7e-9
