"""Model architecture from a HuggingFace ``config.json``: parameters, bytes, KV, FLOPs.

The planner needs four numbers per model (MODEL.md section 3): weight bytes (what must
fit), active weight bytes (what a decode step reads), KV bytes per token of context
(what limits concurrency) and FLOPs per token (what limits prefill). They are counted
here from the config, layer by layer, so that MoE, MLA, sliding-window and hybrid
linear-attention models each get their own memory and traffic shape.

Supported config families (the bundled ones): Llama 3.x (GQA), Llama 4 (interleaved
MoE + shared expert, chunked local attention), Qwen3 dense/MoE, Qwen3.5 (Gated DeltaNet
hybrid, nested ``text_config``), Mixtral, MiniMax-M2, gpt-oss (sliding/full layers),
DeepSeek-V3/R1 and Kimi-K2 (MLA), GLM-5 (MLA + DeepSeek sparse-attention indexer).

Deliberately ignored, because serving memory and time barely depend on them or because
they are not part of the served text model:
  * vision towers / multimodal projectors (``vision_config``);
  * multi-token-prediction (MTP) layers (``num_nextn_predict_layers``,
    ``mtp_num_hidden_layers``, ``num_mtp_modules``): DeepSeek-V3's 671B excludes its
    14B MTP module, and speculative decoding is not modelled;
  * q/k-norm weights, attention sinks (gpt-oss: one scalar per head), rotary tables:
    each below 0.01 % of parameters.
Every MLP and expert is assumed gated (SwiGLU: gate, up, down), true for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from apmw.catalog.models import load_config, local_path, on_disk, resolve_model_name
from apmw.config_fields import refusal
from apmw.errors import ConfigError, UnknownNameError
from apmw.spec.model import AUTO_DTYPE_HINT, dtype_key

# Nominal bytes per element.
DTYPE_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "fp4": 0.5, "int4": 0.5}

# Stored bytes per weight including block scales. 4-bit formats carry a scale per block:
# MXFP4 (OCP MX v1.0, gpt-oss's format) has one 8-bit E8M0 scale per 32 values ->
# 4.25 bits; int4 AWQ/GPTQ with group size 128 keeps a 16-bit scale and zero point per
# group -> 4.25 bits. FP8 block scales (one fp32 per 128x128 block, DeepSeek-V3) add
# 0.02 % and are ignored.
WEIGHT_STORAGE_BYTES = {**DTYPE_BYTES, "fp4": 4.25 / 8, "int4": 4.25 / 8}

# Stored bytes per KV element. FP4 KV cache is NVFP4 (one FP8 scale per 16 values ->
# 4.5 bits, NVIDIA TensorRT Model Optimizer); int4 KV is treated the same.
KV_STORAGE_BYTES = {**DTYPE_BYTES, "fp4": 4.5 / 8, "int4": 4.5 / 8}

# Parameters that stay in bf16 when the weights are quantised: embeddings, lm_head,
# norms and MoE routers. This is what the FP8 DeepSeek/MiniMax checkpoints and the MXFP4
# gpt-oss checkpoints do (their ``modules_to_not_convert`` / unquantised tensors).
_UNQUANTISED_BYTES = 2.0

_HF_DTYPE_BYTES = {"float32": 4.0, "fp32": 4.0, "float16": 2.0, "bfloat16": 2.0,
                   "float8_e4m3fn": 1.0}

_LAYER_KIND = {"full_attention": "full", "attention": "full",
               "sliding_attention": "sliding", "chunked_attention": "sliding",
               "linear_attention": "linear"}


@dataclass(frozen=True)
class Architecture:
    """Shape of one served text model, with the per-token costs the planner needs.

    ``num_kv_heads`` is 1 for MLA: the compressed latent is one KV "head" shared by all
    query heads, so tensor parallelism replicates it rather than splitting it.
    ``head_dim`` is the query/key head size (for MLA: qk_nope + qk_rope).
    The fields after ``linear_state_bytes_per_sequence`` are bookkeeping for the methods.
    """

    name: str
    model_type: str
    source: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    params: int
    active_params: int
    num_experts: int
    experts_per_token: int
    attention: str
    full_attention_layers: int
    sliding_window_layers: int
    sliding_window: int | None
    linear_attention_layers: int
    kv_elements_per_token_per_layer: int
    linear_state_bytes_per_sequence: float
    embedding_params: int = 0            # input table that is only looked up (0 if tied)
    unquantized_params: int = 0          # kept in bf16: embeddings, lm_head, norms, routers
    active_unquantized_params: int = 0   # of those, read per decode step (not the lookup)
    attn_flops_per_context_token: int = 0       # per full layer, per attended token
    linear_attn_flops_per_token: int = 0        # per linear-attention layer
    attention_topk: int | None = None           # sparse attention: tokens attended
    indexer_flops_per_context_token: int = 0    # sparse attention indexer, per layer
    max_context_tokens: int | None = None       # config's max_position_embeddings, if given
    moe_layers: int = 0                         # layers whose MLP is a routed MoE
    expert_intermediate_size: int = 0           # one routed expert's MLP width
    dense_intermediate_size: int = 0            # a dense layer's MLP width (0: every layer is MoE)
    shared_expert_params: int = 0               # per MoE layer: always-active shared expert(s)
    mtp_modules: int = 0                        # multi-token-prediction modules (not in params; a draft)
    attention_params: int = 0                   # attention (and linear-attention) projections, all layers
    notes: tuple[str, ...] = ()

    def weight_bytes(self, weight_dtype: str) -> float:
        """Bytes of all weights with linear layers stored as ``weight_dtype``.

        Embeddings, lm_head, norms and routers stay bf16 (see ``_UNQUANTISED_BYTES``),
        so bf16 gives exactly 2 bytes per parameter.
        """
        quantised = self.params - self.unquantized_params
        return (quantised * _weight_storage(weight_dtype)
                + self.unquantized_params * _UNQUANTISED_BYTES)

    def active_weight_bytes(self, weight_dtype: str) -> float:
        """Bytes one decode step of batch 1 reads: active layers plus lm_head.

        The input embedding table is excluded: a token reads one row of it.
        """
        quantised = self.active_params - self.embedding_params - self.active_unquantized_params
        return (quantised * _weight_storage(weight_dtype)
                + self.active_unquantized_params * _UNQUANTISED_BYTES)

    def kv_bytes_per_token(self, kv_dtype: str) -> float:
        """KV bytes per token of context beyond every sliding window (full layers only)."""
        return float(self.full_attention_layers * self._kv_bytes_per_layer_token(kv_dtype))

    def kv_bytes_for_context(self, context_tokens, kv_dtype: str):
        """KV bytes one sequence holds at ``context_tokens`` (float or numpy array).

        Full layers grow with the context, sliding/chunked layers stop at the window,
        linear-attention layers hold a fixed recurrent state.
        """
        ctx = np.asarray(context_tokens, dtype=float)
        per_layer = self._kv_bytes_per_layer_token(kv_dtype)
        total = (self.full_attention_layers * ctx * per_layer
                 + self.sliding_window_layers * self._windowed(ctx) * per_layer
                 + self.linear_state_bytes_per_sequence)
        return _like_input(total)

    def flops_per_token(self) -> float:
        """Matmul FLOPs per token: 2 per active parameter that is a matmul weight.

        The input embedding is a lookup, not a matmul, so it is left out (equal to
        2 * active_params when embeddings are tied). Attention scores are separate.
        """
        return 2.0 * (self.active_params - self.embedding_params)

    def attention_flops_per_token(self, context_tokens):
        """Score + value FLOPs for one new token attending over ``context_tokens``.

        GQA/MHA: 4 * heads * head_dim per attended token per layer. MLA counts the
        materialised form, 2 * heads * (qk_head_dim + v_head_dim) (decode kernels that
        absorb the up-projection do more FLOPs but are bandwidth-bound). Sliding layers
        attend at most the window; sparse attention (DSA) attends ``attention_topk``
        tokens plus an indexer pass over the whole context; linear-attention layers
        cost a constant per token.
        """
        ctx = np.asarray(context_tokens, dtype=float)
        per_ctx = self.attn_flops_per_context_token or 4 * self.num_heads * self.head_dim
        attended = ctx if self.attention_topk is None else np.minimum(ctx, self.attention_topk)
        full = per_ctx * attended + self.indexer_flops_per_context_token * ctx
        total = (self.full_attention_layers * full
                 + self.sliding_window_layers * per_ctx * self._windowed(ctx)
                 + self.linear_attention_layers * self.linear_attn_flops_per_token)
        return _like_input(total)

    def _windowed(self, ctx):
        return ctx if self.sliding_window is None else np.minimum(ctx, self.sliding_window)

    def _kv_bytes_per_layer_token(self, kv_dtype: str) -> float:
        return self.kv_elements_per_token_per_layer * _kv_storage(kv_dtype)


def canonical_dtype(dtype: str, what: str) -> str:
    """apmw's name for ``dtype`` ("bfloat16" -> "bf16", apmw.spec.model.DTYPE_SPELLINGS); a clear
    error for unknown ones."""
    key = str(dtype_key(dtype))
    if key in DTYPE_BYTES:
        return key
    hint = f" ({AUTO_DTYPE_HINT})" if key == "auto" else ""
    raise UnknownNameError(f"unknown {what} dtype '{dtype}'; use one of: {', '.join(DTYPE_BYTES)}{hint}")


def _storage(table: dict[str, float], dtype: str, what: str) -> float:
    try:
        return table[dtype.lower()]
    except KeyError:
        raise UnknownNameError(f"unknown {what} dtype '{dtype}'; use one of: "
                               + ", ".join(table)) from None


def _weight_storage(dtype: str) -> float:
    return _storage(WEIGHT_STORAGE_BYTES, dtype, "weight")


def _kv_storage(dtype: str) -> float:
    return _storage(KV_STORAGE_BYTES, dtype, "KV-cache")


def _like_input(value):
    """Return a float for scalar input, the array otherwise (vectorised callers)."""
    return float(value) if np.ndim(value) == 0 else value


# --------------------------------------------------------------------------- parsing


class _Cfg:
    """A text-model config dict that names the model and field when something is missing."""

    def __init__(self, data: dict[str, Any], name: str):
        self.data, self.name = data, name
        self.model_type = str(data.get("model_type", "unknown"))

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value

    def req(self, key: str, why: str) -> int:
        """A required size field: present and a positive integer."""
        value = self.data.get(key)
        if value is None:
            raise ConfigError(
                f"{self.name}: config has no '{key}', needed for {why}. Add '{key}' to "
                "the config.json (copy it from the model's HuggingFace config).")
        number = self._int(key, value)
        if number <= 0:
            raise ConfigError(f"{self.name}: '{key}' is {value!r}; it must be positive.")
        return number

    def first(self, keys: tuple[str, ...], default: int = 0) -> int:
        """Value of the first key present (families spell the same field differently)."""
        key = next((k for k in keys if self.data.get(k) is not None), None)
        return default if key is None else self._int(key, self.data[key])

    def _int(self, key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
            raise ConfigError(f"{self.name}: '{key}' is {value!r}; expected a whole number. "
                              "Fix the value in the config.json.")
        return int(value)


def _text_config(cfg: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The language-model part of a config; multimodal wrappers nest it in text_config."""
    notes = []
    if "vision_config" in cfg:
        notes.append("vision tower ignored (text model only)")
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        return cfg, notes
    inherited = {k: cfg[k] for k in ("tie_word_embeddings", "torch_dtype", "dtype") if k in cfg}
    return {**inherited, **text}, notes


@dataclass(frozen=True)
class _Attn:
    """Per-layer attention of the full/sliding layers."""
    kind: str                   # "mha" | "gqa" | "mla"
    params: int
    kv_elements: int
    flops_per_context_token: int
    num_kv_heads: int
    head_dim: int
    topk: int | None = None
    indexer_flops: int = 0


def _attention(c: _Cfg, hidden: int, heads: int) -> _Attn:
    if c.get("kv_lora_rank"):
        return _mla_attention(c, hidden, heads)
    return _gqa_attention(c, hidden, heads)


def _gqa_attention(c: _Cfg, hidden: int, heads: int) -> _Attn:
    """GQA/MHA: q, k, v, o projections; Qwen3.5's output gate doubles q_proj."""
    kv_heads = c.first(("num_key_value_heads",), heads)
    head_dim = c.first(("head_dim",), hidden // heads)
    q_out = heads * head_dim * (2 if c.get("attn_output_gate") else 1)
    params = hidden * q_out + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
    if c.get("attention_bias"):
        params += q_out + 2 * kv_heads * head_dim + hidden
    return _Attn(kind="mha" if kv_heads == heads else "gqa", params=params,
                 kv_elements=2 * kv_heads * head_dim,
                 flops_per_context_token=4 * heads * head_dim,
                 num_kv_heads=kv_heads, head_dim=head_dim)


def _mla_attention(c: _Cfg, hidden: int, heads: int) -> _Attn:
    """Multi-head latent attention (DeepSeek-V2/V3): KV cache is the latent + rope key.

    Cache per token per layer = kv_lora_rank + qk_rope_head_dim elements (DeepSeek-V2
    paper, section 2.1). With a DSA indexer (GLM-5, DeepSeek-V3.2) the indexer's keys
    (index_head_dim per token per layer) are cached too and counted here.
    """
    why = "MLA attention"
    rope = c.req("qk_rope_head_dim", why)
    nope = c.req("qk_nope_head_dim", why)
    v_dim = c.req("v_head_dim", why)
    kv_rank = c.req("kv_lora_rank", why)
    q_rank = c.get("q_lora_rank")
    qk_dim = nope + rope
    q = (hidden * q_rank + q_rank + q_rank * heads * qk_dim) if q_rank else hidden * heads * qk_dim
    kv = hidden * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + v_dim)
    attn = _Attn(kind="mla", params=q + kv + heads * v_dim * hidden,
                 kv_elements=kv_rank + rope,
                 flops_per_context_token=2 * heads * (qk_dim + v_dim),
                 num_kv_heads=1, head_dim=qk_dim)
    return _with_indexer(c, attn, hidden, q_rank or hidden) if c.get("index_topk") else attn


def _with_indexer(c: _Cfg, attn: _Attn, hidden: int, q_in: int) -> _Attn:
    """DeepSeek sparse attention: a small indexer scores all tokens, top-k are attended."""
    why = "the sparse-attention indexer (index_topk is set)"
    n = c.req("index_n_heads", why)
    dim = c.req("index_head_dim", why)
    params = q_in * n * dim + hidden * dim + 2 * dim + hidden * n  # wq_b, wk, k_norm, weights
    return _Attn(kind=attn.kind, params=attn.params + params,
                 kv_elements=attn.kv_elements + dim,
                 flops_per_context_token=attn.flops_per_context_token,
                 num_kv_heads=attn.num_kv_heads, head_dim=attn.head_dim,
                 topk=c.req("index_topk", why), indexer_flops=2 * n * dim)


@dataclass(frozen=True)
class _Linear:
    """Per-layer Gated DeltaNet (Qwen3-Next / Qwen3.5 linear attention)."""
    params: int
    state_bytes: float
    flops_per_token: int


_NO_LINEAR = _Linear(params=0, state_bytes=0.0, flops_per_token=0)


def _gated_deltanet(c: _Cfg, hidden: int) -> _Linear:
    """Parameters and fixed per-sequence state of one Gated DeltaNet layer.

    State = recurrent matrix (value heads x key dim x value dim) at ``mamba_ssm_dtype``
    plus the causal-conv window ((kernel - 1) x conv channels) at the model dtype, as
    vLLM's mamba cache stores them. Per-token work is about 8 FLOPs per state element
    (decay, delta-rule rank-1 update, read-out).
    """
    why = "linear-attention (Gated DeltaNet) layers"
    nk = c.req("linear_num_key_heads", why)
    dk = c.req("linear_key_head_dim", why)
    nv = c.req("linear_num_value_heads", why)
    dv = c.req("linear_value_head_dim", why)
    kernel = c.req("linear_conv_kernel_dim", why)
    key_dim, value_dim = nk * dk, nv * dv
    conv_dim = 2 * key_dim + value_dim
    params = (hidden * (2 * key_dim + 2 * value_dim) + hidden * 2 * nv  # in_proj qkvz, ba
              + conv_dim * kernel + 2 * nv + dv + value_dim * hidden)    # conv, A/dt, norm, out
    model_bytes = _hf_dtype_bytes(c.get("torch_dtype", c.get("dtype", "bfloat16")))
    ssm_bytes = _hf_dtype_bytes(c.get("mamba_ssm_dtype", "bfloat16"), model_bytes)
    state = nv * dk * dv * ssm_bytes + conv_dim * (kernel - 1) * model_bytes
    return _Linear(params=params, state_bytes=state, flops_per_token=8 * nv * dk * dv)


def _hf_dtype_bytes(name: Any, default: float = 2.0) -> float:
    return _HF_DTYPE_BYTES.get(str(name).lower().removeprefix("torch."), default)


def _layer_kinds(c: _Cfg, num_layers: int) -> tuple[list[str], int | None]:
    """Per-layer 'full' | 'sliding' | 'linear', and the window of the sliding layers."""
    types = c.get("layer_types")
    if types is not None:
        return _kinds_from_layer_types(c, types, num_layers), c.get("sliding_window")
    if c.model_type.startswith("llama4") and c.get("attention_chunk_size"):
        return _llama4_kinds(c, num_layers), c.get("attention_chunk_size")
    window = c.get("sliding_window")
    if window and c.get("use_sliding_window", True):
        start = c.get("max_window_layers", 0) if "use_sliding_window" in c.data else 0
        return ["sliding" if i >= start else "full" for i in range(num_layers)], window
    return ["full"] * num_layers, None


def _kinds_from_layer_types(c: _Cfg, types: list, num_layers: int) -> list[str]:
    if len(types) != num_layers:
        raise ConfigError(f"{c.name}: layer_types has {len(types)} entries but "
                          f"num_hidden_layers is {num_layers}; make them agree.")
    unknown = sorted({t for t in types if t not in _LAYER_KIND})
    if unknown:
        raise ConfigError(f"{c.name}: layer_types has unsupported {unknown}; supported: "
                          f"{sorted(_LAYER_KIND)}.")
    kinds = [_LAYER_KIND[t] for t in types]
    if "sliding" in kinds and not c.get("sliding_window"):
        raise ConfigError(f"{c.name}: layer_types has sliding layers but 'sliding_window' "
                          "is missing; add the window size in tokens.")
    return kinds


def _llama4_kinds(c: _Cfg, num_layers: int) -> list[str]:
    """Llama 4: every 4th layer is global NoPE attention, the rest chunked local.

    Chunked layers attend within their attention_chunk_size block, so their KV never
    exceeds one chunk: modelled as a window of that size (HF Llama4TextConfig
    ``no_rope_layers`` default, interval 4).
    """
    interval = c.get("no_rope_layer_interval", 4)
    rope = c.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(num_layers)]
    return ["sliding" if rope[i] else "full" for i in range(num_layers)]


@dataclass(frozen=True)
class _Ffn:
    total: int
    active: int
    router: int   # unquantised part (router / shared-expert gate)


def _ffn_layers(c: _Cfg, hidden: int, num_layers: int) -> tuple[list[_Ffn], int, int]:
    """Per-layer MLP/MoE parameters, the number of routed experts and top-k."""
    n_experts = c.first(("n_routed_experts", "num_local_experts", "num_experts"))
    dense_inter = c.first(("intermediate_size_mlp", "intermediate_size"))
    bias = bool(c.get("mlp_bias") or c.model_type == "gpt_oss")
    if not n_experts:
        return [_dense_ffn(hidden, c.req("intermediate_size", "the MLP"), bias)] * num_layers, 0, 0
    top_k = c.first(("num_experts_per_tok", "experts_per_token"))
    if not top_k:
        c.req("num_experts_per_tok", "MoE routing (experts per token)")
    moe = _moe_layer(c, hidden, n_experts, top_k, bias)
    dense = _dense_ffn(hidden, dense_inter, bias)
    layers = [moe if _is_moe_layer(c, i, num_layers) else dense for i in range(num_layers)]
    return layers, n_experts, top_k


def _mlp_params(hidden: int, inter: int, bias: bool) -> int:
    """Gated MLP: gate and up (hidden -> inter) and down (inter -> hidden)."""
    return 3 * hidden * inter + (2 * inter + hidden if bias else 0)


def _dense_ffn(hidden: int, inter: int, bias: bool) -> _Ffn:
    params = _mlp_params(hidden, inter, bias)
    return _Ffn(total=params, active=params, router=0)


def _moe_layer(c: _Cfg, hidden: int, n_experts: int, top_k: int, bias: bool) -> _Ffn:
    inter = c.first(("moe_intermediate_size",)) or c.req("intermediate_size", "MoE experts")
    expert = _mlp_params(hidden, inter, bias)
    shared, gate = _shared_expert(c, hidden, inter)
    router_bias = (c.model_type == "gpt_oss" or c.get("topk_method") == "noaux_tc"
                   or bool(c.get("use_routing_bias")))
    router = hidden * n_experts + (n_experts if router_bias else 0) + gate
    return _Ffn(total=n_experts * expert + shared + router,
                active=top_k * expert + shared + router, router=router)


def _shared_expert(c: _Cfg, hidden: int, expert_inter: int) -> tuple[int, int]:
    """(shared-expert parameters, its gate parameters) for the families that have one."""
    if c.get("n_shared_experts"):                      # DeepSeek / Kimi / GLM
        return 3 * hidden * expert_inter * c.get("n_shared_experts"), 0
    if c.get("shared_expert_intermediate_size"):       # Qwen MoE: shared expert + sigmoid gate
        return 3 * hidden * c.get("shared_expert_intermediate_size"), hidden
    if c.get("shared_intermediate_size"):              # MiniMax
        return 3 * hidden * c.get("shared_intermediate_size"), 0
    if c.model_type.startswith("llama4"):              # one shared expert, expert-sized
        return 3 * hidden * c.req("intermediate_size", "the Llama 4 shared expert"), 0
    return 0, 0


def _is_moe_layer(c: _Cfg, i: int, num_layers: int) -> bool:
    """Which layers are MoE, following each family's HF modelling code."""
    if "first_k_dense_replace" in c.data or "moe_layer_freq" in c.data:   # DeepSeek-style
        return i >= c.get("first_k_dense_replace", 0) and i % c.get("moe_layer_freq", 1) == 0
    if c.model_type.startswith("llama4"):
        step = c.get("interleave_moe_layer_step", 1)
        return i in (c.get("moe_layers") or range(step - 1, num_layers, step))
    if "decoder_sparse_step" in c.data or "mlp_only_layers" in c.data:    # Qwen MoE
        step = c.get("decoder_sparse_step", 1)
        return i not in c.get("mlp_only_layers", []) and (i + 1) % step == 0
    return True


def _ignored_notes(c: _Cfg) -> list[str]:
    notes = []
    mtp = c.first(("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules"))
    if mtp:
        notes.append(f"{mtp} multi-token-prediction module(s) not in params (serving.speculative draft: mtp uses them)")
    if c.model_type == "gpt_oss":
        notes.append("attention sinks ignored (one scalar per head)")
    if c.get("index_topk"):
        notes.append("DSA indexer keys counted in the KV cache at the KV dtype")
    return notes


def architecture_from_config(cfg: dict[str, Any], name: str, source: str = "") -> Architecture:
    """Build an Architecture from a HuggingFace config dict (see module docstring)."""
    text, notes = _text_config(cfg)
    why = refusal(cfg, text)
    if why:
        raise ConfigError(f"{name}: {why}")
    c = _Cfg(text, name)
    hidden = c.req("hidden_size", "every parameter count")
    heads = c.req("num_attention_heads", "attention")
    num_layers = c.req("num_hidden_layers", "every per-layer count")
    vocab = c.req("vocab_size", "the embedding and lm_head")
    kinds, window = _layer_kinds(c, num_layers)
    attn = _attention(c, hidden, heads)
    linear = _gated_deltanet(c, hidden) if "linear" in kinds else _NO_LINEAR
    ffn, n_experts, top_k = _ffn_layers(c, hidden, num_layers)
    moe = [f for f in ffn if f.router > 0]
    expert_inter = (c.first(("moe_intermediate_size",)) or c.get("intermediate_size", 0)) if moe else 0
    dense_inter = c.first(("intermediate_size_mlp", "intermediate_size")) or 0 if len(moe) < num_layers else 0
    shared_expert, _ = _shared_expert(c, hidden, expert_inter) if moe else (0, 0)

    n_linear = kinds.count("linear")
    attn_params = (num_layers - n_linear) * attn.params + n_linear * linear.params
    tied = bool(c.get("tie_word_embeddings", False))
    lookup = 0 if tied else vocab * hidden          # input table (only looked up)
    head = vocab * hidden                           # lm_head (shared with input if tied)
    norms = 2 * hidden * num_layers + hidden
    routers = sum(f.router for f in ffn)
    shared = lookup + head + norms + attn_params
    return Architecture(
        name=name, model_type=c.model_type, source=source,
        num_layers=num_layers, hidden_size=hidden, num_heads=heads,
        num_kv_heads=attn.num_kv_heads, head_dim=attn.head_dim, vocab_size=vocab,
        params=shared + sum(f.total for f in ffn),
        active_params=shared + sum(f.active for f in ffn),
        num_experts=n_experts, experts_per_token=top_k,
        attention="hybrid" if n_linear else attn.kind,
        full_attention_layers=kinds.count("full"),
        sliding_window_layers=kinds.count("sliding"),
        sliding_window=window if "sliding" in kinds else None,
        linear_attention_layers=n_linear,
        kv_elements_per_token_per_layer=attn.kv_elements,
        linear_state_bytes_per_sequence=n_linear * linear.state_bytes,
        embedding_params=lookup,
        unquantized_params=lookup + head + norms + routers,
        active_unquantized_params=head + norms + routers,
        attn_flops_per_context_token=attn.flops_per_context_token,
        linear_attn_flops_per_token=linear.flops_per_token,
        attention_topk=attn.topk, indexer_flops_per_context_token=attn.indexer_flops,
        moe_layers=len(moe), expert_intermediate_size=expert_inter, dense_intermediate_size=dense_inter,
        shared_expert_params=shared_expert, attention_params=attn_params,
        max_context_tokens=c.get("max_position_embeddings"),
        mtp_modules=c.first(("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules")),
        notes=tuple(notes + _ignored_notes(c)),
    )


def load_architecture(name_or_path: str) -> Architecture:
    """Architecture for a bundled model name, a checkpoint directory or a path to a HuggingFace config.json."""
    cfg, source = load_config(name_or_path)
    name = resolve_model_name(name_or_path) if not on_disk(name_or_path) else None
    return architecture_from_config(cfg, name or _name_from_path(name_or_path), source)


def _name_from_path(path: str) -> str:
    """A checkpoint directory and its config.json are named after the directory (HF layout),
    other files after their name less ``.json``; a bundled-style 'org--name' becomes 'org/name'."""
    p = local_path(path)
    if p.is_dir():
        stem = p.resolve().name
    elif p.name == "config.json" and p.parent.name:
        stem = p.parent.name
    else:
        stem = p.name.removesuffix(".json")     # not .stem: "Llama-3.1-8B" has a dot
    return stem.replace("--", "/", 1)


def summary(arch: Architecture) -> dict[str, Any]:
    """JSON-ready description: shape, counts, and bytes at common dtypes."""
    dtypes = ("bf16", "fp8", "fp4")
    return {
        "name": arch.name, "source": arch.source, "model_type": arch.model_type,
        "attention": arch.attention,
        "params": arch.params, "active_params": arch.active_params,
        "num_layers": arch.num_layers, "hidden_size": arch.hidden_size,
        "num_heads": arch.num_heads, "num_kv_heads": arch.num_kv_heads,
        "head_dim": arch.head_dim, "vocab_size": arch.vocab_size,
        "num_experts": arch.num_experts, "experts_per_token": arch.experts_per_token,
        "full_attention_layers": arch.full_attention_layers,
        "sliding_window_layers": arch.sliding_window_layers,
        "sliding_window": arch.sliding_window,
        "linear_attention_layers": arch.linear_attention_layers,
        "kv_elements_per_token_per_layer": arch.kv_elements_per_token_per_layer,
        "linear_state_bytes_per_sequence": arch.linear_state_bytes_per_sequence,
        "flops_per_token": arch.flops_per_token(),
        "weight_bytes": {d: arch.weight_bytes(d) for d in dtypes},
        "active_weight_bytes": {d: arch.active_weight_bytes(d) for d in dtypes},
        "kv_bytes_per_token": {d: arch.kv_bytes_per_token(d) for d in dtypes},
        "notes": list(arch.notes),
    }
