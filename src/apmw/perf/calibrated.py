"""Step time composed from measured kernel times (the ``calibrated`` source).

For a GQA or MLA model on a GPU with measured tables (H100-SXM, H200-SXM, B200, B300, GB200, GB300;
see :mod:`apmw.perf.tables`), one engine iteration on each tensor-parallel rank is

    t = layers * overhead(engine)                         fitted, see ENGINE_OVERHEAD_S_PER_LAYER
      + layers * [GEMM(QKV) + GEMM(O) + MLP](m = padded tokens)
      + GEMM(lm_head)(m = sequences sampled)
      + layers * decode_attention(batch, mean context)    measured (FA3, FlashInfer or XQA)
      + prefill attention FLOPs / measured prefill-attention rate
      + layers * elementwise bytes / (HBM bandwidth * eta_bw)   norms, adds, SiLU, RoPE
      + 2 * layers * all_reduce(tokens * hidden)          measured engine custom all-reduce

where MLP is GEMM(gate_up) + GEMM(down) for a dense layer, and for a MoE layer the measured
fused-MoE kernel time for the model's own shape (experts, expert width, top-k, expert dtype, TP)
plus the router GEMM and any shared expert's GEMMs. Sliding-window layers read the
decode-attention table at the window, not the context.

MLA (DeepSeek-V2/V3/R1, Kimi-K2) replaces QKV and the attention terms with what its engines run
(:func:`_mla_curves`): the latent down-projections, q's up-projection and the output projection for
every token; for a prompt token also kv_b's up-projection and the measured prefill (MHA-form)
kernel; for a decoding token the absorbed form's two measured batched GEMMs and the measured
latent decode kernel. Those kernel tables are shipped for SGLang on Blackwell
(``scripts/build_calibration.py`` ``MLA_BUILDS`` says why not elsewhere); elsewhere MLA and every
other attention kind (DSA, DeepSeek-V4's compressed attention, linear attention) take the roofline.

Each GEMM and attention time is interpolated in the measured tables at the model's
own shapes per rank (heads / TP, intermediate / TP, ...), not scaled from a generic
efficiency. Decode batches are padded to vLLM's CUDA-graph capture sizes (1, 2, 4,
then multiples of 8 up to 512: ``vllm/config/compilation.py`` default
``cudagraph_capture_sizes``) because the padded rows are computed too.

Whose kernels: the engine's own tables where they were measured on this GPU and cover the
replica (TensorRT-LLM 1.3.0rc20 on B200, B300, GB200 and GB300; SGLang 0.5.14 on all six
calibrated GPUs, with its default kernels: FA3 on Hopper, trtllm_mha on Blackwell), else vLLM 0.24.0's
(``source_detail`` says which; ``catalog/data/calibration/SOURCES.md`` says why the others
were not shipped). NVFP4 weights (``fp4``) use the
measured NVFP4 GEMM and fused-MoE tables where the GPU has them (Blackwell); elsewhere
:mod:`apmw.perf.scaled` reads them from the fp8 tables.

The model is built once per replica: per-model curves over the tables' token grid
are precomputed, so an iteration costs a few ``np.interp`` calls and stays vectorised
over the capacity layer's (batch x prefills) arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from apmw.arch import Architecture
from apmw.catalog.gpus import GpuSpec, get_gpu
from apmw.errors import UnknownNameError
from apmw.perf.efficiency import DEFAULT_EFFICIENCY
from apmw.perf.parallelism import Layout
from apmw.perf.served_moe import ceiling_from_kernel
from apmw.perf.comm_time import ACTIVATION_BYTES
from apmw.perf.step import IterationLoad, RooflineFigures
from apmw.perf.serving_policy import (DEFAULT_ENGINE, ENGINE_OVERHEAD_S_PER_LAYER, OWN_KERNELS_OVERHEAD_S_PER_LAYER,
                                     engine_overhead_s, engine_overhead_s_per_layer, graph_padded)
from apmw.perf.tables import (BASE_ENGINE, KernelTables, bilinear_log2, gemm_latency_s, interp_extrapolate, load_tables,
                              moe_key)

# Weight dtype -> GEMM table. "fp4" is NVFP4 (W4A4, measured on Blackwell only; a GPU without the
# table reads fp4 weights from its fp8 table through apmw.perf.scaled).
_GEMM_DTYPE = {"bf16": "bf16", "fp16": "bf16", "fp8": "fp8", "fp4": "nvfp4", "nvfp4": "nvfp4"}
_KV_DTYPE = {"bf16": "bf16", "fp16": "bf16", "fp8": "fp8"}

# Compute ceiling of routed-expert GEMMs as served, TFLOP/s per GPU (None: the table alone).
# The fused-MoE tables (vLLM 0.24 kernels, synthetic power-law 1.01 routing) reach 310-440
# TFLOP/s per GPU at prefill sizes (8-16k tokens), but served MoE prefill is slower: gpt-oss
# TTFT on InferenceMAX (vLLM, Marlin MXFP4) and MiniMax-M2.5 TTFT in NVIDIA's silicon runs
# (vLLM 0.16, fp8 block) both came out 1.4-1.8x the table's. FITTED at 150 on the InferenceMAX
# h100 gpt-oss rows (`python bench/accuracy.py --fit`, jointly with that harness's request
# overhead); held out: h200 gpt-oss and MiniMax-M2.5 (docs/accuracy.md). Decode-sized batches
# stay on the table: their FLOPs are far below the ceiling. This figure holds on Hopper; on Blackwell
# the ceiling is a fitted share of the replica's own measured kernel (apmw.perf.served_moe).
SERVED_MOE_TFLOPS_PER_GPU: float | None = (DEFAULT_EFFICIENCY.served_moe_flops_per_s or 0.0) / 1e12 or None

# Engines whose fp8-KV decode attention reads KV at the bandwidth of a bf16 kernel.
# The measured tables are vLLM's FlashAttention-3, whose fp8-KV path reads KV at about
# 0.5 of HBM peak against 0.8 for bf16 (bench/derive_efficiencies.py). TensorRT-LLM's
# XQA decode kernel reads fp8 KV natively ("Multi-Head, Multi-Query, and Group-Query
# Attention", TensorRT-LLM docs: XQA with fp8 KV cache), so for it an fp8 read of
# context L costs what the measured bf16 kernel costs for the same bytes, i.e. context
# L/2. SGLang, like vLLM, dequantises fp8 KV on read (sgl-project/sglang issue #10083),
# so it keeps the measured fp8 table. Checked on MLPerf Offline rows: docs/accuracy.md.
# It corrects vLLM's tables standing in for the engine only: with the engine's own tables the
# measured fp8 table already is its kernel (``_curves`` applies it only where ``tables.engine`` is
# another engine's). TensorRT-LLM 1.3.0rc20's own fp8 / bf16 decode time (32/8 heads, head_dim 128)
# is 0.51-0.59 at 32-128 sequences x 4-8k context on B200, B300, GB200 and GB300 and 0.42-0.53 at
# 4-128 x 1-8k on H200 (aiconfigurator generation_attention_perf, kernel source torch_flow): the
# fp8 read at about the bf16 kernel's bandwidth, as this rule assumes, and no further correction.
# SGLang's own tables (0.5.14, its default backends: FA3 on Hopper, trtllm_mha on Blackwell; they are
# read whenever they cover the replica, so this rule never touches them) confirm it stays out: at 32-128
# sequences x 4-8k context (32/8 heads) its FA3 fp8 / bf16 decode time is 0.72-0.76 on H100 and
# 0.90-0.94 on H200 (vLLM's FA3: 0.56-0.61, 0.69-0.76), i.e. it dequantises on read; on Blackwell its
# trtllm_mha gives 0.55-0.67, a native fp8 read like TensorRT-LLM's.
# Its per-layer overhead (apmw.perf.serving_policy, 28 us, ASSUMED) is left as it is: the only
# calibrated SGLang rows (GPUStack Qwen3-8B on H100, batch 4, bench/accuracy.py) imply 20 us (bf16)
# and 43 us (fp8) a layer once SGLang's own kernels are subtracted: one on each side of 28 us,
# so they do not pin it.
BANDWIDTH_BOUND_FP8_KV_ENGINES = ("trtllm",)
# That correction applies only where the measured decode kernel is FlashAttention 3 (Hopper vLLM).
# On Blackwell vLLM decodes with FlashInfer's TensorRT-LLM-generated kernel, which reads fp8 KV
# natively: its fp8 / bf16 time at 4-128 sequences x 1-8k context is 0.58-0.66 (B200, GB300,
# 32/8 heads), as TensorRT-LLM's own table (0.59-0.65), where H200's FA3 gives 0.73-0.83.
_DEQUANTISING_FP8_KV_KERNELS = ("vllm_flash_attn_fa3",)



def calibration_gap(arch: Architecture, gpu: GpuSpec, gpus: int, weight_dtype: str, kv_dtype: str,
                    layout: Layout | None = None, engine: str = DEFAULT_ENGINE,
                    mxfp4_activations: str = "bf16") -> str | None:
    """Why the measured tables cannot model this replica, or None when they can (``engine``'s own
    tables, or vLLM's standing in for them: :func:`covering_tables`)."""
    return covering_tables(arch, gpu, gpus, weight_dtype, kv_dtype, layout, engine, mxfp4_activations)[1]


def covering_tables(arch: Architecture, gpu: GpuSpec, gpus: int, weight_dtype: str, kv_dtype: str,
                    layout: Layout | None = None, engine: str = DEFAULT_ENGINE,
                    mxfp4_activations: str = "bf16") -> tuple[KernelTables | None, str | None]:
    """The tables that model this replica and None, or None and why none can.

    ``engine``'s own tables where they were measured on this GPU and cover the replica, else vLLM's.
    """
    if layout is not None and not layout.is_tensor_parallel:
        return None, f"layout {layout.describe()}: the tables compose tensor-parallel replicas only"
    own = load_tables(gpu.name, engine)
    if own is None:
        return None, f"no measured kernel tables for {gpu.name}"
    try:
        if get_gpu(gpu.name) != gpu:
            return None, f"{gpu.name} has overridden fields; the measured tables are for the stock part"
    except UnknownNameError:
        return None, f"no measured kernel tables for {gpu.name}"
    gap = _tables_gap(own, arch, gpus, weight_dtype, kv_dtype, mxfp4_activations)
    if gap is not None and own.engine != BASE_ENGINE:
        base = load_tables(gpu.name, BASE_ENGINE)
        if base is not None and _tables_gap(base, arch, gpus, weight_dtype, kv_dtype, mxfp4_activations) is None:
            return base, None
    return (own, None) if gap is None else (None, gap)


def _tables_gap(tables: KernelTables, arch: Architecture, gpus: int, weight_dtype: str,
                kv_dtype: str, mxfp4_activations: str = "bf16") -> str | None:
    if arch.attention == "mla":
        gap = _mla_gap(tables, arch, gpus, kv_dtype, weight_dtype)
        if gap:
            return gap
    elif arch.attention != "gqa" or arch.linear_attention_layers:
        return f"attention kind '{arch.attention}' (or linear-attention layers) is not in the tables"
    if gpus > 1 and not tables.has(f"ar_{gpus}"):
        have = sorted(int(k[3:]) for k in tables.keys("ar_") if k[3:].isdigit())
        return (f"tensor parallelism {gpus} has no measured all-reduce on {tables.gpu} "
                f"(have {', '.join(map(str, [1, *have]))})")
    if arch.moe_layers:
        gap = _moe_gap(arch, tables, gpus, weight_dtype, mxfp4_activations)
        if gap:
            return gap
    if not arch.moe_layers or weight_dtype.lower() not in ("fp4", "mxfp4", "nvfp4"):
        dt = _GEMM_DTYPE.get(weight_dtype.lower())
        if dt is None or not tables.has("gemm_" + dt):
            have = ", ".join(k[5:] for k in tables.keys("gemm_") if k not in ("gemm_m", "gemm_n", "gemm_k"))
            return f"weight dtype {weight_dtype} has no measured GEMM table on {tables.gpu} (have {have})"
    if kv_dtype.lower() not in _KV_DTYPE:
        return f"KV dtype {kv_dtype} has no measured attention table (have bf16, fp8)"
    key = _attn_key(arch, gpus, kv_dtype)
    if arch.attention == "gqa" and not (tables.has("dec_" + key) and tables.has("ctx_" + key)):
        return f"attention shape {key} (kv_dtype_heads_kvheads_headdim per rank) was not measured"
    return None


def _mla_gap(tables: KernelTables, arch: Architecture, gpus: int, kv_dtype: str, weight_dtype: str) -> str | None:
    """Why the MLA kernel tables cannot price this replica, or None (scripts/build_calibration.py MLA_BUILDS
    says where they were shipped and why not elsewhere)."""
    if arch.mla is None or arch.attention_topk is not None or arch.sliding_window_layers:
        return "MLA with sparse attention (a DSA indexer) or sliding-window layers is not in the tables"
    key = _mla_key(arch, gpus, kv_dtype)
    if not (tables.has("mladec_" + key) and tables.has("mlactx_" + key)):
        return (f"MLA attention with {arch.num_heads // gpus} query heads per rank and {kv_dtype} KV was not measured "
                f"on {tables.gpu} for {tables.engine} (MLA kernel tables: SGLang on Blackwell)")
    if weight_dtype.lower() not in _GEMM_DTYPE:
        return f"weight dtype {weight_dtype} has no measured GEMM table"
    bmm = _mla_bmm_dtype(_dense_gemm_dtype(arch, tables, weight_dtype))
    if not all(tables.has(f"mlabmm_{op}_{bmm}_{arch.num_heads // gpus}") for op in ("pre", "post")):
        return f"the absorbed MLA decode GEMMs with {arch.num_heads // gpus} heads per rank were not measured"
    return None


def _mla_key(arch: Architecture, gpus: int, kv_dtype: str) -> str:
    return f"{_KV_DTYPE.get(kv_dtype.lower(), kv_dtype)}_{arch.num_heads // gpus}"


def _mla_bmm_dtype(weight_dtype: str) -> str:
    """The absorbed decode GEMMs run in fp8 once the weights are quantised (aiconfigurator's DeepSeek model:
    mla_bmm_quant_mode is fp8 unless the GEMMs are bf16), else bf16."""
    return "bf16" if weight_dtype.lower() in ("bf16", "fp16") else "fp8"


def _moe_gap(arch: Architecture, tables, gpus: int, weight_dtype: str, mxfp4_activations: str = "bf16") -> str | None:
    dense_dt = _ffn_gemm_dtype(arch, tables, weight_dtype) if weight_dtype.lower() in _GEMM_DTYPE else "?"
    if (arch.moe_layers != arch.num_layers or arch.shared_expert_params) and not tables.has("gemm_" + dense_dt):
        return (f"the dense and shared-expert layers' GEMMs ({dense_dt}, as the {weight_dtype} checkpoint stores them) "
                f"have no measured table on {tables.gpu}")
    if moe_key(arch, tables, gpus, weight_dtype, mxfp4_activations) is None:
        acts = " (MXFP4 experts with MXFP8 activations)" if mxfp4_activations == "mxfp8" else ""
        return (f"no measured MoE kernel for {arch.num_experts} experts x {arch.expert_intermediate_size} "
                f"(top-{arch.experts_per_token}, hidden {arch.hidden_size}) in {weight_dtype}{acts} at TP {gpus}")
    return None


def _dense_gemm_dtype(arch: Architecture, tables: KernelTables, weight_dtype: str) -> str:
    """The GEMM table of the attention projections: the dtype the checkpoint stores them in."""
    return _part_gemm_dtype(arch.part_dtypes(weight_dtype.lower())[0], tables)


def _ffn_gemm_dtype(arch: Architecture, tables: KernelTables, weight_dtype: str) -> str:
    """The GEMM table of the shared experts and dense MLPs: the dtype the checkpoint stores them in."""
    return _part_gemm_dtype(arch.part_dtypes(weight_dtype.lower())[2], tables)


def _part_gemm_dtype(dtype: str, tables: KernelTables) -> str:
    """The GEMM table of weights stored as ``dtype``, or bf16 for 4-bit weights on a GPU without an FP4 table
    (W4A16: dequantised and multiplied in bf16, as apmw.catalog.gpus's rate chain has it); "?" for a dtype
    without tables."""
    dt = _GEMM_DTYPE.get(dtype.lower(), "?")
    return "bf16" if dt == "nvfp4" and not tables.has("gemm_nvfp4") else dt


def _lm_head_gemm_dtype(arch: Architecture, weight_dtype: str) -> str:
    """The GEMM table of lm_head (:meth:`Architecture.unquantised_gemm_dtype`)."""
    return _GEMM_DTYPE[arch.unquantised_gemm_dtype(weight_dtype.lower())]


def _attn_key(arch: Architecture, gpus: int, kv_dtype: str) -> str:
    heads = arch.num_heads // gpus
    kv_heads = max(arch.num_kv_heads // gpus, 1)
    return f"{_KV_DTYPE.get(kv_dtype.lower(), kv_dtype)}_{heads}_{kv_heads}_{arch.head_dim}"


@dataclass(frozen=True)
class _Curves:
    m: np.ndarray                 # token grid of the GEMM tables
    layers_gemm_s: np.ndarray     # all layers' GEMMs at each m
    lm_head_s: np.ndarray
    dec_batch: np.ndarray
    dec_step: np.ndarray
    dec_s: np.ndarray             # all full-attention layers, (batch x context)
    dec_ctx_scale: float          # context at which to read dec_s (0.5: fp8 KV on a bf16 table)
    dec_window_s: np.ndarray      # all sliding-window layers, (batch x context), read at the window
    window: float
    ctx_isl: np.ndarray
    ctx_s_per_flop: np.ndarray    # seconds per replica attention FLOP at each prefill length
    ar_size: np.ndarray
    ar_s: np.ndarray              # all layers' all-reduces at each message size (elements)
    elementwise_s_per_token: float
    source: str
    tables_engine: str            # whose kernels were measured (vLLM's stand in for an engine without tables)
    served_moe: str = ""          # the served MoE ceiling on the routed experts, and where it comes from
    decode_gemm_s: np.ndarray | None = None    # all layers' GEMMs only decoding tokens run (MLA's absorbed form)
    prefill_gemm_s: np.ndarray | None = None   # all layers' GEMMs only prompt tokens run (MLA's kv_b)


def _curves(t: KernelTables, arch: Architecture, gpu: GpuSpec, g: int, weight_dtype: str, kv_dtype: str,
            bandwidth_eff: float, engine: str = DEFAULT_ENGINE, mxfp4_activations: str = "bf16") -> _Curves:
    dt, ffn_dt = _dense_gemm_dtype(arch, t, weight_dtype), _ffn_gemm_dtype(arch, t, weight_dtype)
    h, L = arch.hidden_size, arch.num_layers
    served_source = ""
    dense_layers = L - arch.moe_layers
    mlp = dense_layers * _mlp_s(t, ffn_dt, arch.dense_intermediate_size / g, h)
    inter = arch.dense_intermediate_size / g
    if arch.moe_layers:
        # routed experts from the measured fused-MoE table (tokens -> seconds), the bf16 router and any
        # always-active shared expert (a gated MLP, split over the TP ranks like a dense one)
        inter = arch.experts_per_token * arch.expert_intermediate_size / g
        key = moe_key(arch, t, g, weight_dtype, mxfp4_activations)
        moe_s = interp_extrapolate(t["gemm_m"], t["moe_tokens"], t[key])
        if SERVED_MOE_TFLOPS_PER_GPU:
            # the routed experts' FLOPs on this rank run no faster than the served ceiling: the Hopper fit,
            # or on Blackwell a fitted share of this kernel (apmw.perf.served_moe)
            served = ceiling_from_kernel(SERVED_MOE_TFLOPS_PER_GPU * 1e12, t, key)
            ceiling, served_source = served.flops_per_s, served.source
            flops = t["gemm_m"] * arch.experts_per_token * 6 * h * arch.expert_intermediate_size / g
            moe_s = np.maximum(moe_s, flops / ceiling)
        moe_layer = moe_s + gemm_latency_s(t, "bf16", arch.num_experts, h)
        if arch.shared_expert_params:
            moe_layer = moe_layer + _mlp_s(t, ffn_dt, arch.shared_expert_params // (3 * h) / g, h)
        mlp = mlp + arch.moe_layers * moe_layer
    if arch.attention == "mla":
        attn = _mla_curves(t, arch, g, dt, kv_dtype)
    else:
        attn = _gqa_curves(t, arch, g, dt, kv_dtype, engine)
    lm_head = gemm_latency_s(t, _lm_head_gemm_dtype(arch, weight_dtype), arch.vocab_size / g, h)
    # Elementwise traffic per token per layer on one rank (16-bit activations): two
    # residual-add + RMSNorm passes over the hidden state (read x, read residual, write
    # both), SiLU-and-mul over the gate/up output (read 2*inter, write inter), RoPE on q, k.
    elem_bytes = ACTIVATION_BYTES * (2 * 4 * h + 3 * inter + attn.rope_elements)
    elem_s = L * elem_bytes / (gpu.hbm_bandwidth_bytes_per_s * bandwidth_eff)
    ar_size = t["ar_size"]
    ar_s = 2 * L * t[f"ar_{g}"] if g > 1 else np.zeros_like(ar_size)
    return _Curves(m=t["gemm_m"], layers_gemm_s=L * attn.gemm_s + mlp, lm_head_s=lm_head,
                   dec_batch=attn.dec_batch, dec_step=attn.dec_step,
                   dec_s=arch.full_attention_layers * attn.dec_s, dec_ctx_scale=attn.dec_ctx_scale,
                   dec_window_s=arch.sliding_window_layers * attn.dec_s,
                   window=float(arch.sliding_window or 0), ctx_isl=attn.ctx_isl,
                   ctx_s_per_flop=attn.ctx_s_per_flop, ar_size=ar_size, ar_s=ar_s,
                   elementwise_s_per_token=elem_s, source=t.source, tables_engine=t.engine,
                   served_moe=served_source,
                   decode_gemm_s=None if attn.decode_gemm_s is None else L * attn.decode_gemm_s,
                   prefill_gemm_s=None if attn.prefill_gemm_s is None else L * attn.prefill_gemm_s)


def _mlp_s(t: KernelTables, dt: str, inter: float, h: int) -> np.ndarray:
    """A gated MLP of ``inter`` per rank: the fused gate/up GEMM and the down GEMM, over the token grid."""
    if not inter:
        return np.zeros_like(t["gemm_m"])
    return gemm_latency_s(t, dt, 2 * inter, h) + gemm_latency_s(t, dt, h, inter)


@dataclass(frozen=True)
class _AttentionCurves:
    """One layer's attention on one rank: its GEMMs over the token grid (all tokens; decode or prefill tokens
    only), the measured decode table and the prefill rate."""
    gemm_s: np.ndarray
    decode_gemm_s: np.ndarray | None      # None: no GEMM runs on decoding or prompt tokens only
    prefill_gemm_s: np.ndarray | None
    dec_batch: np.ndarray
    dec_step: np.ndarray
    dec_s: np.ndarray
    dec_ctx_scale: float
    ctx_isl: np.ndarray
    ctx_s_per_flop: np.ndarray
    rope_elements: float          # per token: the q and k elements RoPE rewrites


def _gqa_curves(t: KernelTables, arch: Architecture, g: int, dt: str, kv_dtype: str, engine: str) -> _AttentionCurves:
    h, hd = arch.hidden_size, arch.head_dim
    heads, kv_heads = arch.num_heads // g, max(arch.num_kv_heads // g, 1)
    gemm = gemm_latency_s(t, dt, (heads + 2 * kv_heads) * hd, h) + gemm_latency_s(t, dt, h, heads * hd)
    key = _attn_key(arch, g, kv_dtype)
    dec_key, dec_ctx_scale = key, 1.0
    bf16_key = _attn_key(arch, g, "bf16")
    if (engine in BANDWIDTH_BOUND_FP8_KV_ENGINES and t.engine != engine and _KV_DTYPE[kv_dtype.lower()] == "fp8"
            and any(k in _DEQUANTISING_FP8_KV_KERNELS for k in t.kernels.get("generation_attention_perf", ()))
            and t.has("dec_" + bf16_key)):
        dec_key, dec_ctx_scale = bf16_key, 0.5
    isl = t["ctx_isl"]
    # FLOPs of one causal batch-1 prefill of `isl` tokens on one rank, one layer.
    flops_rank_layer = 4 * heads * hd * isl * (isl + 1) / 2
    # seconds per replica-wide attention FLOP: the replica's FLOPs are spread over g ranks.
    return _AttentionCurves(gemm_s=gemm, decode_gemm_s=None, prefill_gemm_s=None, dec_batch=t["dec_batch"],
                            dec_step=t["dec_step"], dec_s=t["dec_" + dec_key], dec_ctx_scale=dec_ctx_scale,
                            ctx_isl=isl, ctx_s_per_flop=t["ctx_" + key] / (flops_rank_layer * g),
                            rope_elements=2 * (heads + kv_heads) * hd)


def _mla_curves(t: KernelTables, arch: Architecture, g: int, dt: str, kv_dtype: str) -> _AttentionCurves:
    """Multi-head latent attention as DeepSeek's engines run it (aiconfigurator's DeepSeek model composes the
    same kernels). Every token: the down-projection of q and the KV latent (q_lora + kv_lora + rope wide,
    replicated on every rank), q's up-projection and the output projection (split over the heads). A prompt
    token also up-projects the latent to each head's K and V (kv_b) and attends in that materialised form
    (the measured prefill kernel); a decoding token attends in the absorbed form instead: its query is
    projected into the latent (the "pre" batched GEMM), attends over the latent cache (the measured decode
    kernel) and is projected back (the "post" one)."""
    mla, h = arch.mla, arch.hidden_size
    heads = arch.num_heads // g
    qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    down = mla.kv_lora_rank + mla.qk_rope_head_dim
    if mla.q_lora_rank:
        gemm = (gemm_latency_s(t, dt, mla.q_lora_rank + down, h)
                + gemm_latency_s(t, dt, heads * qk, mla.q_lora_rank))
    else:
        gemm = gemm_latency_s(t, dt, down, h) + gemm_latency_s(t, dt, heads * qk, h)
    gemm = gemm + gemm_latency_s(t, dt, h, heads * mla.v_head_dim)
    prefill_gemm = gemm_latency_s(t, dt, heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank)
    bmm = _mla_bmm_dtype(dt)
    decode_gemm = sum(interp_extrapolate(t["gemm_m"], t["mla_bmm_tokens"], t[f"mlabmm_{op}_{bmm}_{heads}"])
                      for op in ("pre", "post"))
    key = _mla_key(arch, g, kv_dtype)
    isl = t["mla_ctx_isl"]
    flops_rank_layer = 2 * heads * (qk + mla.v_head_dim) * isl * (isl + 1) / 2
    return _AttentionCurves(gemm_s=gemm, decode_gemm_s=decode_gemm, prefill_gemm_s=prefill_gemm,
                            dec_batch=t["mla_dec_batch"], dec_step=t["mla_dec_step"], dec_s=t["mladec_" + key],
                            dec_ctx_scale=1.0, ctx_isl=isl, ctx_s_per_flop=t["mlactx_" + key] / (flops_rank_layer * g),
                            rope_elements=(heads + 1) * mla.qk_rope_head_dim)


@dataclass(frozen=True)
class CalibratedStepModel(RooflineFigures):
    """The calibrated estimator: an iteration's time from measured kernel tables (module docstring)."""

    curves: _Curves | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        tables, gap = covering_tables(self.arch, self.gpu, self.gpus, self.weight_dtype, self.kv_dtype, self.layout,
                                      self.engine, self.mxfp4_moe_activations)
        if tables is None:
            raise UnknownNameError(f"no calibrated step model: {gap}; use apmw.perf.roofline.RooflineStepModel")
        if self.engine not in ENGINE_OVERHEAD_S_PER_LAYER:
            raise UnknownNameError(f"unknown engine '{self.engine}'; "
                                   f"use one of: {', '.join(ENGINE_OVERHEAD_S_PER_LAYER)}")
        object.__setattr__(self, "curves", _curves(tables, self.arch, self.gpu, self.gpus, self.weight_dtype,
                                                   self.kv_dtype, self.efficiency.elementwise_bandwidth, self.engine,
                                                   self.mxfp4_moe_activations))

    @property
    def source(self) -> str:
        return "calibrated"

    @property
    def prices_own_kernels(self) -> bool:
        """Whether the engine's own measured kernels price the iteration (not vLLM's standing in)."""
        return self.curves is not None and self.curves.tables_engine == self.engine

    @property
    def source_detail(self) -> str:
        own = self.prices_own_kernels
        how = "fitted" if self.engine == "vllm" or (own and self.engine in OWN_KERNELS_OVERHEAD_S_PER_LAYER) else "assumed"
        per_layer = engine_overhead_s_per_layer(self.engine, own)
        kernels = (f"{self.engine}'s own kernel tables" if own else
                   f"{self.curves.tables_engine}'s kernel tables standing in for {self.engine}'s "
                   f"(none measured for {self.engine} on {self.gpu.name})")
        return (f"calibrated: {kernels}, {self.curves.source}; overhead {per_layer * 1e6:.0f} us x {self.arch.num_layers} "
                f"layers = {per_layer * self.arch.num_layers * 1e3:.2f} ms per iteration ({self.engine}, {how})"
                + (f"; {self.curves.served_moe}" if self.curves.served_moe else "")
                + ("; MLA from its measured decode, prefill and absorbed-GEMM kernels (ASSUMPTIONS: the GEMMs' fp8 "
                   "rows are per-tensor scaled where DeepSeek's fp8 checkpoints are block-scaled; kv_b's up-projection "
                   "is charged on a prompt's new tokens only, where SGLang's chunked-prefix path also runs it over "
                   "the cached prefix)"
                   if self.arch.attention == "mla" else ""))

    def iteration_time_s(self, load: IterationLoad) -> np.ndarray:
        return sum(self.iteration_parts_s(load))

    def iteration_parts_s(self, load: IterationLoad) -> tuple[float, np.ndarray, np.ndarray]:
        """(engine overhead, TP all-reduces, every other kernel) of one iteration, in seconds.

        They sum to :meth:`iteration_time_s`; :mod:`apmw.perf.scaled` scales each part
        differently when it carries this GPU's measured iteration to another GPU.
        """
        c = self.curves
        decode = np.asarray(load.decode_seqs, dtype=float)
        prefill = np.asarray(load.prefill_tokens, dtype=float)
        decode, prefill = np.broadcast_arrays(decode, prefill)
        tokens = decode + prefill
        gemm = interp_extrapolate(graph_padded(decode, prefill), c.m, c.layers_gemm_s)
        if c.decode_gemm_s is not None:
            gemm = (gemm + np.where(decode > 0, interp_extrapolate(graph_padded(decode, 0.0), c.m, c.decode_gemm_s), 0.0)
                    + np.where(prefill > 0, interp_extrapolate(prefill, c.m, c.prefill_gemm_s), 0.0))
        sampled = np.maximum(decode + (prefill > 0), 1.0)
        lm = interp_extrapolate(sampled, c.m, c.lm_head_s)
        attn = self._attention_s(load, decode, prefill)
        comm = np.interp(np.maximum(tokens, 1.0) * self.arch.hidden_size, c.ar_size, c.ar_s) if self.gpus > 1 else 0.0
        if self.gpus > 1:
            big = tokens * self.arch.hidden_size > c.ar_size[-1]
            comm = np.where(big, c.ar_s[-1] * tokens * self.arch.hidden_size / c.ar_size[-1], comm)
        kernels = gemm + lm + attn + c.elementwise_s_per_token * tokens
        overhead = engine_overhead_s(self.engine, self.arch.num_layers, self.prices_own_kernels)
        return overhead, comm + np.zeros_like(kernels), kernels

    def _attention_s(self, load: IterationLoad, decode: np.ndarray, prefill: np.ndarray) -> np.ndarray:
        """Decode attention from the measured (batch x context) table; prefill from the measured rate.

        The load gives totals only, so the decode context is the mean KV tokens per
        decoding sequence, and the prefill share of ``attention_flops`` is what is left
        after the decode sequences' own attention FLOPs.
        """
        c = self.curves
        kv_tokens = np.asarray(load.kv_read_bytes, dtype=float) / self.kv_bytes_per_token
        ctx = np.where(decode > 0, kv_tokens / np.maximum(decode, 1.0), 0.0)
        batch = np.maximum(decode, 1.0)
        dec = np.where(decode > 0, bilinear_log2(c.dec_s, c.dec_batch, c.dec_step, batch,
                                                 np.maximum(ctx * c.dec_ctx_scale, 1.0)), 0.0)
        if self.arch.sliding_window_layers:
            # a sliding-window layer reads at most the window's KV
            windowed = np.maximum(np.minimum(ctx, c.window) * c.dec_ctx_scale, 1.0)
            dec = dec + np.where(decode > 0, bilinear_log2(c.dec_window_s, c.dec_batch, c.dec_step, batch,
                                                           windowed), 0.0)
        flops = np.asarray(load.attention_flops, dtype=float)
        pre_flops = np.maximum(flops - decode * np.asarray(self.arch.attention_flops_per_token(ctx)), 0.0)
        # Equivalent from-scratch prefill length with the same FLOPs, where the measured rate applies.
        per_rank_layer = pre_flops / (self.gpus * max(self.arch.full_attention_layers, 1))
        per_pair = self.arch.attn_flops_per_context_token or 4 * self.arch.num_heads * self.arch.head_dim
        isl_eq = np.sqrt(2 * per_rank_layer / (per_pair / self.gpus))
        rate = np.interp(np.maximum(isl_eq, prefill), c.ctx_isl, c.ctx_s_per_flop)
        return dec + np.where(prefill > 0, pre_flops * rate, 0.0)
