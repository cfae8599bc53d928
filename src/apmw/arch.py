"""Model architecture from a HuggingFace ``config.json``: parameters, bytes, KV, FLOPs.

The planner needs four numbers per model (MODEL.md section 3): weight bytes (what must
fit), active weight bytes (what a decode step reads), KV bytes per token of context
(what limits concurrency) and FLOPs per token (what limits prefill). They are counted
here from the config, layer by layer, so that MoE, MLA, sliding-window and hybrid
linear-attention models each get their own memory and traffic shape.

Supported config families (the bundled ones): Llama 3.x (GQA), Llama 4 (interleaved
MoE + shared expert, chunked local attention), Qwen3 dense/MoE, Qwen3.5 (Gated DeltaNet
hybrid, nested ``text_config``), Mixtral, MiniMax-M2, gpt-oss (sliding/full layers),
DeepSeek-V3/R1 and Kimi-K2 (MLA), GLM-5 (MLA + DeepSeek sparse-attention indexer),
DeepSeek-V4 (compressed attention: per-layer compression ratios, a top-k indexer on the
ratio-4 layers, a 128-token local window per sequence; mHC; hash-routed layers), whose
shapes follow DeepSeek's reference ``inference/model.py`` (docs/models.md).

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
class CompressedAttention:
    """DeepSeek-V4's attention: every layer a local window, most a compressed history.

    Each layer has a compression ratio r (config ``compress_ratios``). Every layer keeps the
    last ``window_tokens`` tokens' KV (one ``entry_elements``-wide entry per token, the same
    vector serving as K and V) in a ring buffer: a fixed state per sequence. A layer with r > 0
    also stores one compressed entry per r tokens; at r == ``sparse_ratio`` (4, CSA) a lightning
    indexer keeps its own ``index_key_elements``-wide key per compressed entry and picks the
    ``index_topk`` entries each query attends; at other ratios (128, HCA) every compressed entry
    is attended. Compression happens every r tokens from an uncompressed tail state
    (``compressor_state_bytes``, fp32 in the reference code) that each compressed layer holds per
    sequence. Entries per token are counted as ctx / r (the mean over the r tokens between two
    compressions; the stored count is floor(ctx / r)).
    """

    window_tokens: int
    entry_elements: int
    layers_by_ratio: tuple[tuple[int, int], ...]    # (compress ratio, layers), ratios ascending
    sparse_ratio: int
    index_topk: int
    index_key_elements: int
    index_flops_per_key: int        # per query token, per index key scored (2 * heads * dim)
    attend_flops_per_entry: int     # per query token, per attended entry (scores + values)
    compressor_state_bytes: float   # per sequence, all layers
    mtp_ratio: int | None = None    # the MTP module's own ratio (last entry of compress_ratios)

    def layers(self, ratio: int) -> int:
        return dict(self.layers_by_ratio).get(ratio, 0)

    @property
    def num_layers(self) -> int:
        return sum(n for _, n in self.layers_by_ratio)

    def elements_per_token(self) -> float:
        """Cached elements per token of context beyond the window: compressed entries and index keys."""
        return sum(n * (self.entry_elements + self._index(r)) / r for r, n in self.layers_by_ratio if r)

    def window_elements(self, ctx):
        """Window elements one sequence holds at ``ctx`` tokens (every layer, up to the window)."""
        return self.num_layers * np.minimum(ctx, self.window_tokens) * self.entry_elements

    def read_elements(self, ctx):
        """Elements one decode step of one sequence reads: the window, the compressed entries it
        attends (at most index_topk on sparse layers) and, there, every index key."""
        total = self.window_elements(ctx)
        for r, n in self.layers_by_ratio:
            if r == self.sparse_ratio:
                total = total + n * (np.minimum(ctx / r, self.index_topk) * self.entry_elements
                                     + ctx / r * self.index_key_elements)
            elif r:
                total = total + n * ctx / r * self.entry_elements
        return total

    def attention_flops(self, ctx):
        """Score + value FLOPs of one query token over ``ctx`` tokens, all layers, and the indexer's."""
        attended = self.num_layers * np.minimum(ctx, self.window_tokens)
        indexed = 0.0
        for r, n in self.layers_by_ratio:
            if r == self.sparse_ratio:
                attended = attended + n * np.minimum(ctx / r, self.index_topk)
                indexed = indexed + n * ctx / r
            elif r:
                attended = attended + n * ctx / r
        return self.attend_flops_per_entry * attended + self.index_flops_per_key * indexed

    def linear_from_tokens(self) -> int:
        """Context beyond which reads and FLOPs grow linearly (window full, top-k saturated)."""
        sparse = self.sparse_ratio * self.index_topk if self.layers(self.sparse_ratio) else 0
        return max(self.window_tokens, sparse)

    def _index(self, ratio: int) -> int:
        return self.index_key_elements if ratio == self.sparse_ratio else 0


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
    indexer_elements_per_token_per_layer: int = 0   # DSA: the indexer's key, part of kv_elements_per_token_per_layer
    compressed: CompressedAttention | None = None   # DeepSeek-V4 compressed attention (attention == "csa")
    routed_expert_params: int = 0               # all routed experts of all MoE layers
    active_routed_expert_params: int = 0        # the top-k of them a token runs
    expert_dtype_in_checkpoint: str | None = None   # dtype the published checkpoint stores routed experts in
    lookup_table_bytes: float = 0.0             # non-parameter tables stored with the weights (V4 hash routing)
    notes: tuple[str, ...] = ()

    def weight_bytes(self, weight_dtype: str, expert_dtype: str | None = None) -> float:
        """Bytes of all weights with linear layers stored as ``weight_dtype``.

        Embeddings, lm_head, norms and routers stay bf16 (see ``_UNQUANTISED_BYTES``),
        so bf16 gives exactly 2 bytes per parameter. ``expert_dtype`` prices the routed
        experts apart (DeepSeek-V4 ships them in FP4, the rest in FP8).
        """
        return self._priced(self.params - self.unquantized_params, self.routed_expert_params,
                            self.unquantized_params, weight_dtype, expert_dtype) + self.lookup_table_bytes

    def active_weight_bytes(self, weight_dtype: str, expert_dtype: str | None = None) -> float:
        """Bytes one decode step of batch 1 reads: active layers plus lm_head.

        The input embedding table is excluded: a token reads one row of it.
        """
        quantised = self.active_params - self.embedding_params - self.active_unquantized_params
        return self._priced(quantised, self.active_routed_expert_params, self.active_unquantized_params,
                            weight_dtype, expert_dtype)

    def _priced(self, quantised: int, experts: int, unquantised: int, weight_dtype: str,
                expert_dtype: str | None) -> float:
        expert_bytes = _weight_storage(expert_dtype or weight_dtype)
        return ((quantised - experts) * _weight_storage(weight_dtype) + experts * expert_bytes
                + unquantised * _UNQUANTISED_BYTES)

    def kv_bytes_per_token(self, kv_dtype: str) -> float:
        """KV bytes per token of context beyond every window: full layers, or V4's compressed
        entries and index keys. What the pool is sized in tokens by."""
        if self.compressed is not None:
            return float(self.compressed.elements_per_token() * _kv_storage(kv_dtype))
        return float(self.full_attention_layers * self._kv_bytes_per_layer_token(kv_dtype))

    def kv_bytes_for_context(self, context_tokens, kv_dtype: str):
        """KV bytes one sequence holds at ``context_tokens`` (float or numpy array): storage.

        Full layers grow with the context, sliding/chunked layers stop at the window,
        linear-attention layers hold a fixed recurrent state; V4 holds its window, its
        compressed entries and the compressors' tail state.
        """
        ctx = np.asarray(context_tokens, dtype=float)
        if self.compressed is not None:
            c = self.compressed
            elements = c.elements_per_token() * ctx + c.window_elements(ctx)
            return _like_input(elements * _kv_storage(kv_dtype) + c.compressor_state_bytes)
        per_layer = self._kv_bytes_per_layer_token(kv_dtype)
        total = (self.full_attention_layers * ctx * per_layer
                 + self.sliding_window_layers * self._windowed(ctx) * per_layer
                 + self.linear_state_bytes_per_sequence)
        return _like_input(total)

    def kv_read_bytes_for_context(self, context_tokens, kv_dtype: str):
        """KV bytes one decode step of one sequence reads at ``context_tokens``.

        Dense attention reads all it stores. Sparse attention stores more than it reads: DSA
        (GLM-5, DeepSeek-V3.2) reads the top-k entries' latents plus every index key (the
        indexer scores them all); V4 reads its window, at most index_topk compressed entries
        and every index key on the ratio-4 layers, and every entry on the others. The
        compressors' tail state is written as tokens arrive and read once per r tokens;
        it is not counted here.
        """
        ctx = np.asarray(context_tokens, dtype=float)
        kv = _kv_storage(kv_dtype)
        if self.compressed is not None:
            return _like_input(self.compressed.read_elements(ctx) * kv)
        if self.attention_topk is None:
            return self.kv_bytes_for_context(context_tokens, kv_dtype)
        index = self.indexer_elements_per_token_per_layer
        full = (np.minimum(ctx, self.attention_topk) * (self.kv_elements_per_token_per_layer - index)
                + ctx * index) * kv
        total = (self.full_attention_layers * full
                 + self.sliding_window_layers * self._windowed(ctx) * self._kv_bytes_per_layer_token(kv_dtype)
                 + self.linear_state_bytes_per_sequence)
        return _like_input(total)

    def sequence_state_bytes(self, kv_dtype: str) -> float:
        """Fixed bytes one sequence holds whatever its length once its windows are full:
        sliding windows, linear-attention state, V4's window and compressor state."""
        if self.compressed is not None:
            c = self.compressed
            return float(c.window_elements(c.window_tokens) * _kv_storage(kv_dtype) + c.compressor_state_bytes)
        window = self.sliding_window_layers * (self.sliding_window or 0) * self._kv_bytes_per_layer_token(kv_dtype)
        return float(window + self.linear_state_bytes_per_sequence)

    @property
    def kv_reads_linear_from_tokens(self) -> int:
        """Context beyond which KV reads and attention FLOPs per sequence are affine in the context
        (every window full, every top-k saturated); below it a batch's sum is not b times its mean."""
        if self.compressed is not None:
            return self.compressed.linear_from_tokens()
        return max(self.sliding_window or 0, self.attention_topk or 0)

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
        cost a constant per token. DeepSeek-V4: 4 * heads * head_dim per attended entry
        (window, top-k or all compressed entries) plus the indexer's 2 * heads * dim per
        index key (:class:`CompressedAttention`).
        """
        ctx = np.asarray(context_tokens, dtype=float)
        if self.compressed is not None:
            return _like_input(self.compressed.attention_flops(ctx))
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


def weight_storage_bytes(dtype: str) -> float:
    """Bytes one weight parameter takes stored as ``dtype`` (block scales included)."""
    return _weight_storage(dtype)


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
    index_elements: int = 0     # of kv_elements: the DSA indexer's key


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
                 topk=c.req("index_topk", why), indexer_flops=2 * n * dim, index_elements=dim)


# DeepSeek-V4 (reference inference/model.py, DeepSeek-V4-Pro/Flash model pages, MIT). The ratios
# its code builds: 0 = window only, 4 = compressed with overlapping windows and a lightning
# indexer (CSA), any other = compressed, every entry attended (HCA: the checkpoints use 128).
_V4_SPARSE_RATIO = 4
_V4_RATIOS = (0, _V4_SPARSE_RATIO, 128)
_FP32_BYTES = 4.0


@dataclass(frozen=True)
class _V4:
    """DeepSeek-V4's attention and hyper-connection counts, all layers."""
    attn_params: int            # attention + compressors + indexers, every layer
    attn_unquantised: int       # of those, kept bf16/fp32 in the checkpoint
    hc_params: int              # mHC mixing weights of every block and the head (fp32)
    compressed: CompressedAttention


def _v4_compressor(ratio: int, hidden: int, dim: int) -> tuple[int, float]:
    """Parameters (ape, wkv, wgate, norm) and per-sequence tail state bytes of one Compressor.

    At ratio 4 windows overlap, so it projects to twice ``dim`` and keeps 2 x ratio tokens; the
    state holds kv and gate scores in fp32 (reference ``kv_state`` / ``score_state``).
    """
    coff = 2 if ratio == _V4_SPARSE_RATIO else 1
    params = ratio * coff * dim + 2 * hidden * coff * dim + dim
    return params, 2 * coff * ratio * coff * dim * _FP32_BYTES


def _v4_attention_layer(c: _Cfg, ratio: int, hidden: int, heads: int) -> tuple[int, int, float]:
    """(parameters, of them unquantised, compressor state bytes) of one V4 attention layer.

    wq_a, q_norm, wq_b (low-rank query), wkv and kv_norm (one head_dim-wide KV head), wo_a (grouped:
    o_groups blocks of heads*head_dim/o_groups -> o_lora_rank, bf16) and wo_b, one attention sink
    per head; a Compressor when ratio > 0; at ratio 4 an Indexer (wq_b, weights_proj, its own
    Compressor over index_head_dim).
    """
    why = "DeepSeek-V4 attention"
    q_rank, dim = c.req("q_lora_rank", why), c.req("head_dim", why)
    groups, o_rank = c.req("o_groups", why), c.req("o_lora_rank", why)
    if heads % groups:
        raise ConfigError(f"{c.name}: o_groups {groups} does not divide num_attention_heads {heads}; "
                          "fix the config.json.")
    wo_a = heads * dim // groups * groups * o_rank
    params = hidden * q_rank + q_rank + q_rank * heads * dim + hidden * dim + dim + wo_a + groups * o_rank * hidden
    unquantised, state = wo_a + heads, 0.0
    if ratio:
        comp, state = _v4_compressor(ratio, hidden, dim)
        params, unquantised = params + comp, unquantised + comp
    if ratio == _V4_SPARSE_RATIO:
        why = "the DeepSeek-V4 indexer (compress ratio 4)"
        n, idim = c.req("index_n_heads", why), c.req("index_head_dim", why)
        comp, comp_state = _v4_compressor(ratio, hidden, idim)
        params += q_rank * n * idim + hidden * n + comp
        unquantised += hidden * n + comp
        state += comp_state
    return params + heads, unquantised, state


def _v4_ratios(c: _Cfg, num_layers: int, mtp: int) -> list[int]:
    ratios = c.get("compress_ratios")
    if not isinstance(ratios, list) or len(ratios) != num_layers + mtp:
        raise ConfigError(f"{c.name}: compress_ratios must list one ratio per layer and per MTP module "
                          f"({num_layers} + {mtp}); it has {len(ratios) if isinstance(ratios, list) else ratios!r}.")
    odd = sorted({r for r in ratios if r not in _V4_RATIOS}, key=str)
    if odd:
        raise ConfigError(f"{c.name}: compress_ratios has {odd}; apmw models the published ratios "
                          f"{list(_V4_RATIOS)} (0 window only, 4 sparse with an indexer, 128 dense).")
    return [int(r) for r in ratios]


def _deepseek_v4(c: _Cfg, hidden: int, heads: int, num_layers: int) -> _V4:
    """Attention, compressed-KV shape and mHC of a DeepSeek-V4 config (docs/models.md)."""
    if c.get("attention_bias"):
        raise ConfigError(f"{c.name}: attention_bias is true; DeepSeek-V4's attention has no biases.")
    if c.first(("num_key_value_heads",), 1) != 1:
        raise ConfigError(f"{c.name}: num_key_value_heads must be 1 for DeepSeek-V4 (one shared KV entry).")
    mtp = c.first(("num_nextn_predict_layers",))
    ratios = _v4_ratios(c, num_layers, mtp)
    layers = [_v4_attention_layer(c, r, hidden, heads) for r in ratios[:num_layers]]
    hc = c.req("hc_mult", "DeepSeek-V4 hyper-connections")
    mix = (2 + hc) * hc                                     # pre (hc), post (hc), comb (hc x hc)
    per_block = 2 * (mix * hc * hidden + mix + 3)           # hc_attn_* and hc_ffn_*: fn, base, scale
    dim = c.req("head_dim", "DeepSeek-V4 attention")
    why = "the DeepSeek-V4 indexer"
    counts = tuple((r, ratios[:num_layers].count(r)) for r in _V4_RATIOS if r in ratios[:num_layers])
    index_n = c.req("index_n_heads", why) if _V4_SPARSE_RATIO in ratios else 0
    index_dim = c.req("index_head_dim", why) if _V4_SPARSE_RATIO in ratios else 0
    compressed = CompressedAttention(
        window_tokens=c.req("sliding_window", "the DeepSeek-V4 local window"), entry_elements=dim,
        layers_by_ratio=counts, sparse_ratio=_V4_SPARSE_RATIO,
        index_topk=c.req("index_topk", why) if index_n else 0, index_key_elements=index_dim,
        index_flops_per_key=2 * index_n * index_dim, attend_flops_per_entry=4 * heads * dim,
        compressor_state_bytes=sum(state for _, _, state in layers),
        mtp_ratio=ratios[num_layers] if mtp else None)
    return _V4(attn_params=sum(p for p, _, _ in layers), attn_unquantised=sum(u for _, u, _ in layers),
               hc_params=num_layers * per_block + hc * hc * hidden + hc + 1, compressed=compressed)


def _v4_notes(c: _Cfg, v4: _V4, vocab: int, top_k: int) -> list[str]:
    comp = v4.compressed
    per_ratio = ", ".join(f"{n} at ratio {r}" for r, n in comp.layers_by_ratio)
    return [
        f"compressed attention: {per_ratio}; every layer keeps a {comp.window_tokens}-token window per sequence",
        f"decode reads per step: the window, at most {comp.index_topk} compressed entries plus every index key on "
        f"ratio-{comp.sparse_ratio} layers, every compressed entry on ratio-128 layers",
        f"compressor tail state counted per sequence in fp32 as the reference code keeps it "
        f"({comp.compressor_state_bytes / 2**20:,.1f} MiB)",
        f"mHC: hc_mult {c.get('hc_mult')}, {v4.hc_params:,} mixing parameters priced as bf16 (fp32 in the "
        "checkpoint); the widened residual's elementwise mixing is not counted in FLOPs",
        f"{c.get('num_hash_layers', 0)} hash-routed MoE layer(s): experts from a token-id table "
        f"({vocab:,} x {top_k} int32, stored beside the weights), no routing bias",
    ]


def _checkpoint_expert_dtype(c: _Cfg) -> str | None:
    """The dtype the published checkpoint stores routed experts in: ``expert_dtype`` (V4), else the
    checkpoint's quantisation method, else its torch_dtype; None when none of them says."""
    spelled = c.get("expert_dtype")
    if spelled is None:
        spelled = (c.get("quantization_config") or {}).get("quant_method")
    if spelled is None:
        spelled = c.get("torch_dtype", c.get("dtype"))
    return _CHECKPOINT_DTYPES.get(str(spelled).lower()) if spelled is not None else None


_CHECKPOINT_DTYPES = {"fp4": "fp4", "mxfp4": "fp4", "nvfp4": "fp4", "fp8": "fp8", "bfloat16": "bf16",
                      "bf16": "bf16", "float16": "fp16", "fp16": "fp16"}


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
        notes.append(("V4" if c.model_type == "deepseek_v4" else "DSA")
                     + " indexer keys counted in the KV cache at the KV dtype")
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
    if c.model_type == "deepseek_v4":
        return _v4_architecture(c, name, source, notes, hidden, heads, num_layers, vocab)
    kinds, window = _layer_kinds(c, num_layers)
    attn = _attention(c, hidden, heads)
    linear = _gated_deltanet(c, hidden) if "linear" in kinds else _NO_LINEAR
    n_linear = kinds.count("linear")
    attn_params = (num_layers - n_linear) * attn.params + n_linear * linear.params
    ffn = _ffn_counts(c, hidden, num_layers, vocab)
    return Architecture(
        name=name, model_type=c.model_type, source=source,
        num_layers=num_layers, hidden_size=hidden, num_heads=heads,
        num_kv_heads=attn.num_kv_heads, head_dim=attn.head_dim, vocab_size=vocab,
        params=ffn.shared + attn_params + ffn.total, active_params=ffn.shared + attn_params + ffn.active,
        attention="hybrid" if n_linear else attn.kind,
        full_attention_layers=kinds.count("full"),
        sliding_window_layers=kinds.count("sliding"),
        sliding_window=window if "sliding" in kinds else None,
        linear_attention_layers=n_linear,
        kv_elements_per_token_per_layer=attn.kv_elements,
        indexer_elements_per_token_per_layer=attn.index_elements,
        linear_state_bytes_per_sequence=n_linear * linear.state_bytes,
        attn_flops_per_context_token=attn.flops_per_context_token,
        linear_attn_flops_per_token=linear.flops_per_token,
        attention_topk=attn.topk, indexer_flops_per_context_token=attn.indexer_flops,
        attention_params=attn_params, notes=tuple(notes + _ignored_notes(c)), **ffn.fields,
    )


def _v4_architecture(c: _Cfg, name: str, source: str, notes: list[str], hidden: int, heads: int,
                     num_layers: int, vocab: int) -> Architecture:
    """DeepSeek-V4: compressed attention, mHC, hash-routed layers (:func:`_deepseek_v4`)."""
    v4 = _deepseek_v4(c, hidden, heads, num_layers)
    ffn = _ffn_counts(c, hidden, num_layers, vocab, extra_unquantised=v4.attn_unquantised + v4.hc_params)
    shared = ffn.shared + v4.attn_params + v4.hc_params
    comp = v4.compressed
    return Architecture(
        name=name, model_type=c.model_type, source=source,
        num_layers=num_layers, hidden_size=hidden, num_heads=heads, num_kv_heads=1,
        head_dim=comp.entry_elements, vocab_size=vocab,
        params=shared + ffn.total, active_params=shared + ffn.active, attention="csa",
        full_attention_layers=0, sliding_window_layers=0, sliding_window=comp.window_tokens,
        linear_attention_layers=0, kv_elements_per_token_per_layer=0, linear_state_bytes_per_sequence=0.0,
        attn_flops_per_context_token=comp.attend_flops_per_entry, attention_topk=comp.index_topk or None,
        attention_params=v4.attn_params, compressed=comp,
        lookup_table_bytes=c.get("num_hash_layers", 0) * vocab * ffn.fields["experts_per_token"] * 4.0,
        notes=tuple(notes + _ignored_notes(c) + _v4_notes(c, v4, vocab, ffn.fields["experts_per_token"])),
        **ffn.fields,
    )


@dataclass(frozen=True)
class _FfnCounts:
    shared: int             # embeddings, lm_head, norms (not attention)
    total: int              # MLP / MoE parameters, all layers
    active: int             # of them, run per token
    fields: dict[str, Any]  # the Architecture fields they fill


def _ffn_counts(c: _Cfg, hidden: int, num_layers: int, vocab: int, extra_unquantised: int = 0) -> _FfnCounts:
    """MLP/MoE, embedding, head and norm counts shared by every family; ``extra_unquantised``
    adds a family's other bf16/fp32 parameters (all active) to the unquantised ones."""
    ffn, n_experts, top_k = _ffn_layers(c, hidden, num_layers)
    if c.model_type == "deepseek_v4":        # hash-routed layers have no routing bias
        unbiased = _Ffn(total=-n_experts, active=-n_experts, router=-n_experts)
        ffn = [_add(f, unbiased) if i < c.get("num_hash_layers", 0) else f for i, f in enumerate(ffn)]
    moe = [f for f in ffn if f.router > 0]
    expert_inter = (c.first(("moe_intermediate_size",)) or c.get("intermediate_size", 0)) if moe else 0
    dense_inter = c.first(("intermediate_size_mlp", "intermediate_size")) or 0 if len(moe) < num_layers else 0
    shared_expert, _ = _shared_expert(c, hidden, expert_inter) if moe else (0, 0)
    bias = bool(c.get("mlp_bias") or c.model_type == "gpt_oss")
    expert = _mlp_params(hidden, expert_inter, bias) if moe else 0
    tied = bool(c.get("tie_word_embeddings", False))
    lookup = 0 if tied else vocab * hidden          # input table (only looked up)
    head = vocab * hidden                           # lm_head (shared with input if tied)
    norms = 2 * hidden * num_layers + hidden
    routers = sum(f.router for f in ffn) + extra_unquantised
    return _FfnCounts(
        shared=lookup + head + norms, total=sum(f.total for f in ffn), active=sum(f.active for f in ffn),
        fields=dict(
            num_experts=n_experts, experts_per_token=top_k, embedding_params=lookup,
            unquantized_params=lookup + head + norms + routers, active_unquantized_params=head + norms + routers,
            moe_layers=len(moe), expert_intermediate_size=expert_inter, dense_intermediate_size=dense_inter,
            shared_expert_params=shared_expert, routed_expert_params=len(moe) * n_experts * expert,
            active_routed_expert_params=len(moe) * top_k * expert,
            expert_dtype_in_checkpoint=_checkpoint_expert_dtype(c) if moe else None,
            max_context_tokens=c.get("max_position_embeddings"),
            mtp_modules=c.first(("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules"))))


def _add(a: _Ffn, b: _Ffn) -> _Ffn:
    return _Ffn(total=a.total + b.total, active=a.active + b.active, router=a.router + b.router)


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
        "sequence_state_bytes": {d: arch.sequence_state_bytes(d) for d in dtypes},
        "kv_read_bytes_per_decode_step_at_128k": {d: arch.kv_read_bytes_for_context(131_072, d) for d in dtypes},
        "expert_dtype_in_checkpoint": arch.expert_dtype_in_checkpoint,
        **_compressed_summary(arch),
        "notes": list(arch.notes),
    }


def _compressed_summary(arch: Architecture) -> dict[str, Any]:
    """V4's per-ratio layer counts and what one decode step reads; empty for other attention."""
    c = arch.compressed
    if c is None:
        return {}
    return {
        "layers_by_compress_ratio": {str(r): n for r, n in c.layers_by_ratio},
        "index_topk": c.index_topk,
        "window_tokens": c.window_tokens,
        "compressor_state_bytes_per_sequence": c.compressor_state_bytes,
        "mtp_compress_ratio": c.mtp_ratio,
        "decode_reads": (f"per layer the {c.window_tokens}-token window; ratio-{c.sparse_ratio} layers at most "
                         f"{c.index_topk} compressed entries plus all ctx/{c.sparse_ratio} index keys; other "
                         "compressed layers all ctx/ratio entries"),
    }
