"""The Architecture of one served text model: its shape and the per-token weight, KV and FLOP
costs the planner reads; and summary(), its JSON-ready description."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from apmw.arch.attention import MlaShape
from apmw.arch.compressed_attention import CompressedAttention
from apmw.arch.dtypes import (FOUR_BIT_DTYPES, FOUR_BIT_MOE_ATTENTION_DTYPE, UNQUANTISED_BYTES,
                              UNQUANTISED_GEMM_DTYPE, kv_storage_bytes, weight_storage_bytes)
from apmw.catalog.checkpoint_formats import CheckpointFormat
from apmw.errors import ApmwError


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
    mla: MlaShape | None = None                     # MLA's projection widths (attention == "mla")
    routed_expert_params: int = 0               # all routed experts of all MoE layers
    active_routed_expert_params: int = 0        # the top-k of them a token runs
    expert_dtype_in_checkpoint: str | None = None   # dtype the published checkpoint stores routed experts in
    mxfp4_experts: bool = False                  # its 4-bit experts are MXFP4 (gpt-oss), not NVFP4 (ModelOpt)
    lookup_table_bytes: float = 0.0             # non-parameter tables stored with the weights (V4 hash routing)
    attention_output_params: int = 0            # of attention_params: the output projections (o_proj, wo)
    dense_ffn_params: int = 0                   # shared experts and dense MLPs, all layers
    attention_unquantised_params: int = 0       # of attention_params, kept 16-bit or wider (V4's gates and norms)
    checkpoint_format: CheckpointFormat | None = None   # what the checkpoint stores each part in, where it says
    notes: tuple[str, ...] = ()

    def weight_bytes(self, weight_dtype: str, expert_dtype: str | None = None) -> float:
        """Bytes of all weights with linear layers stored as ``weight_dtype``, each part in the dtype
        :meth:`part_dtypes` gives it.

        Embeddings, lm_head, norms and routers stay bf16 (see ``UNQUANTISED_BYTES``),
        so bf16 gives exactly 2 bytes per parameter. ``expert_dtype`` prices the routed
        experts apart (DeepSeek-V4 ships them in FP4, the rest in FP8).
        """
        return (self.attention_bytes(weight_dtype, expert_dtype) + self.dense_ffn_bytes(weight_dtype, expert_dtype)
                + self.routed_expert_params * self.expert_bytes_per_param(weight_dtype, expert_dtype)
                + (self.unquantized_params - self.attention_unquantised_params) * UNQUANTISED_BYTES
                + self.lookup_table_bytes)

    def active_weight_bytes(self, weight_dtype: str, expert_dtype: str | None = None) -> float:
        """Bytes one decode step of batch 1 reads: active layers plus lm_head.

        The input embedding table is excluded: a token reads one row of it.
        """
        return (self.attention_bytes(weight_dtype, expert_dtype) + self.dense_ffn_bytes(weight_dtype, expert_dtype)
                + self.active_routed_expert_params * self.expert_bytes_per_param(weight_dtype, expert_dtype)
                + self.active_read_unquantised_params * UNQUANTISED_BYTES)

    @property
    def active_read_unquantised_params(self) -> int:
        """The 16-bit parameters a decode step reads besides attention's own: lm_head, norms, routers."""
        return self.active_unquantized_params - self.attention_unquantised_params

    def _format_at(self, weight_dtype: str, expert_dtype: str | None) -> CheckpointFormat | None:
        """The checkpoint's own format where it is priced as stored: in its weight dtype, no expert dtype of
        another's."""
        known = self.checkpoint_format
        if known is None or _own_experts(weight_dtype, expert_dtype) or known.weight_dtype != weight_dtype.lower():
            return None
        return known

    def part_dtypes(self, weight_dtype: str, expert_dtype: str | None = None) -> tuple[str, str, str]:
        """(the attention projections' dtype, the output projection's, the dense FFN's) in a checkpoint of
        ``weight_dtype``: the checkpoint's own where apmw knows it (:attr:`checkpoint_format`) and it is priced
        in its own weight dtype; in a 4-bit MoE checkpoint without an expert dtype of its own, attention in 16
        bits (:data:`apmw.arch.dtypes.FOUR_BIT_MOE_ATTENTION_DTYPE`); else ``weight_dtype``. DeepSeek-V4's
        compressed attention, whose config names the dtypes of its parts, keeps ``weight_dtype``."""
        known = self._format_at(weight_dtype, expert_dtype)
        if known is not None:
            return known.attention_dtype, known.attention_output_dtype, known.dense_ffn_dtype
        if (not _own_experts(weight_dtype, expert_dtype) and self.routed_expert_params and self.compressed is None
              and weight_dtype.lower() in FOUR_BIT_DTYPES):
            return FOUR_BIT_MOE_ATTENTION_DTYPE, FOUR_BIT_MOE_ATTENTION_DTYPE, weight_dtype
        return weight_dtype, weight_dtype, weight_dtype

    def unquantised_gemm_dtype(self, weight_dtype: str, expert_dtype: str | None = None) -> str:
        """The dtype whose kernels time the GEMMs of the 16-bit lm_head and routers: bf16 beside 4-bit experts
        (gpt-oss's modules_to_not_convert lists them), else the weight dtype's, as the efficiencies were fitted."""
        four_bit_experts = (self.moe_layers and not _own_experts(weight_dtype, expert_dtype)
                            and weight_dtype.lower() in FOUR_BIT_DTYPES)
        return UNQUANTISED_GEMM_DTYPE if four_bit_experts else weight_dtype

    def attention_dtypes(self, weight_dtype: str, expert_dtype: str | None = None) -> tuple[str, str]:
        """(the attention projections' dtype, the output projection's): :meth:`part_dtypes`' first two."""
        return self.part_dtypes(weight_dtype, expert_dtype)[:2]

    def stored_bytes_per_param(self, dtype: str, weight_dtype: str, expert_dtype: str | None = None) -> float:
        """Bytes one weight stored as ``dtype`` takes in a checkpoint of ``weight_dtype``: the checkpoint's own
        count with its scales where its config gives one for that dtype, else apmw's table
        (:func:`weight_storage_bytes`)."""
        known = self._format_at(weight_dtype, expert_dtype)
        if known is not None and known.bits_per_weight is not None and dtype.lower() == known.weight_dtype:
            return known.bits_per_weight / 8.0
        return weight_storage_bytes(dtype)

    def expert_bytes_per_param(self, weight_dtype: str, expert_dtype: str | None = None) -> float:
        """Bytes one routed-expert weight takes (:meth:`stored_bytes_per_param` of its dtype)."""
        return self.stored_bytes_per_param(expert_dtype or weight_dtype, weight_dtype, expert_dtype)

    def attention_bytes(self, weight_dtype: str, expert_dtype: str | None = None) -> float:
        """Bytes of the attention projections of every layer in a checkpoint of ``weight_dtype``."""
        kept, output, _ = self.part_dtypes(weight_dtype, expert_dtype)
        quantised = self.attention_params - self.attention_unquantised_params
        return ((quantised - self.attention_output_params) * self.stored_bytes_per_param(kept, weight_dtype, expert_dtype)
                + self.attention_output_params * self.stored_bytes_per_param(output, weight_dtype, expert_dtype)
                + self.attention_unquantised_params * UNQUANTISED_BYTES)

    def dense_ffn_bytes(self, weight_dtype: str, expert_dtype: str | None = None) -> float:
        """Bytes of the shared experts and dense MLPs of every layer in a checkpoint of ``weight_dtype``."""
        ffn = self.part_dtypes(weight_dtype, expert_dtype)[2]
        return self.dense_ffn_params * self.stored_bytes_per_param(ffn, weight_dtype, expert_dtype)

    def kv_bytes_per_token(self, kv_dtype: str) -> float:
        """KV bytes per token of context beyond every window: full layers, or V4's compressed
        entries and index keys. What the pool is sized in tokens by."""
        if self.compressed is not None:
            return float(self.compressed.elements_per_token() * kv_storage_bytes(kv_dtype))
        return float(self.full_attention_layers * self._kv_bytes_per_layer_token(kv_dtype))

    def mtp_module_bytes(self, weight_dtype: str, expert_dtype: str | None = None) -> tuple[float, float, float, float]:
        """(attention, the rest, routed experts, projection): weight bytes of one multi-token-prediction module.

        A module is one decoder layer of the model's own kind (a MoE layer where the model has them: its
        attention, routed and shared experts and router), each part in the dtype the model's layers keep it in,
        and the ``2h x h`` projection that joins a token's embedding to the previous hidden state (DeepSeek-V3
        report, section 2.2; Qwen3-Next's and V4's the same size), which SGLang's and vLLM's MTP code build as a
        plain 16-bit ``nn.Linear``, neither quantised nor sharded. The embedding and output head are the target's
        own, shared (SGLang and vLLM hand them to the draft). Left out: the module's norms and V4's
        hyper-connection mixers, under 0.1 % of a layer, and the difference between a layer's attention and the
        mean layer's (V4's compressors).
        """
        attention = self.attention_bytes(weight_dtype, expert_dtype) / self.num_layers
        ffn_per_param = (self.dense_ffn_bytes(weight_dtype, expert_dtype) / self.dense_ffn_params
                         if self.dense_ffn_params else 0.0)
        if self.moe_layers:
            routed = self.routed_expert_params / self.moe_layers * self.expert_bytes_per_param(weight_dtype, expert_dtype)
            rest = self.shared_expert_params * ffn_per_param + self.num_experts * self.hidden_size * UNQUANTISED_BYTES
        else:
            routed, rest = 0.0, self.dense_ffn_params / self.num_layers * ffn_per_param
        return attention, rest, routed, 2 * self.hidden_size ** 2 * UNQUANTISED_BYTES

    def mtp_kv_bytes_per_token(self, kv_dtype: str) -> float:
        """KV bytes per token of context one multi-token-prediction module caches: one full-attention layer's
        (a DSA layer's with its index key). DeepSeek-V4's module is a layer at its config's last compress
        ratio, 0 in both V4 checkpoints: it keeps only its local window, per sequence, so nothing per token
        (that window, 64 KiB a sequence in fp8, is left out of memory)."""
        if self.compressed is not None:
            return float(self.compressed.elements_per_token_at(self.compressed.mtp_ratio or 0)
                         * kv_storage_bytes(kv_dtype))
        return self._kv_bytes_per_layer_token(kv_dtype)

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
            return _like_input(elements * kv_storage_bytes(kv_dtype) + c.compressor_state_bytes)
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
        kv = kv_storage_bytes(kv_dtype)
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
            window = c.window_elements(float(c.window_tokens))     # in floats: numpy's int64 wraps past 2**63
            return float(window * kv_storage_bytes(kv_dtype) + c.compressor_state_bytes)
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
        return self.kv_elements_per_token_per_layer * kv_storage_bytes(kv_dtype)


def _own_experts(weight_dtype: str, expert_dtype: str | None) -> bool:
    """Whether the routed experts are priced in a dtype other than the rest's (DeepSeek-V4's FP4 experts)."""
    return expert_dtype is not None and expert_dtype.lower() != weight_dtype.lower()


def _like_input(value):
    """Return a float for scalar input, the array otherwise (vectorised callers)."""
    return float(value) if np.ndim(value) == 0 else value


def summary(arch: Architecture) -> dict[str, Any]:
    """JSON-ready description: shape, counts, and bytes at common dtypes and the checkpoint's own."""
    if not isinstance(arch, Architecture):
        raise ApmwError(f"architecture_summary takes an Architecture, got {type(arch).__name__}; read one with "
                        "apmw.load_architecture(name or config.json path)")
    dtypes = ("bf16", "fp8", "fp4")
    form = arch.checkpoint_format
    weight_dtypes = dtypes + ((form.weight_dtype,) if form is not None and form.weight_dtype not in dtypes else ())
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
        "weight_bytes": {d: arch.weight_bytes(d) for d in weight_dtypes},
        "active_weight_bytes": {d: arch.active_weight_bytes(d) for d in weight_dtypes},
        "kv_bytes_per_token": {d: arch.kv_bytes_per_token(d) for d in dtypes},
        "sequence_state_bytes": {d: arch.sequence_state_bytes(d) for d in dtypes},
        "kv_read_bytes_per_decode_step_at_128k": {d: arch.kv_read_bytes_for_context(131_072, d) for d in dtypes},
        "expert_dtype_in_checkpoint": arch.expert_dtype_in_checkpoint,
        **_shipped_experts_summary(arch, weight_dtypes),
        **_mtp_summary(arch, weight_dtypes, dtypes),
        **_compressed_summary(arch),
        "notes": list(arch.notes),
    }


def _shipped_experts_summary(arch: Architecture, weight_dtypes: tuple[str, ...]) -> dict[str, Any]:
    """Every weight at each dtype but the routed experts at the dtype the checkpoint stores them in, what `plan`
    and `predict` price by default (DeepSeek-V4-Pro at fp8: 854.7 GB, where all of it in fp8 is 1,580 GB); empty
    where the checkpoint's expert dtype is not known."""
    experts = arch.expert_dtype_in_checkpoint
    if experts is None or not arch.routed_expert_params:
        return {}
    return {"weight_bytes_with_checkpoint_experts": {d: arch.weight_bytes(d, experts) for d in weight_dtypes}}


def _mtp_summary(arch: Architecture, weight_dtypes: tuple[str, ...], kv_dtypes: tuple[str, ...]) -> dict[str, Any]:
    """What drafting with the model's multi-token-prediction modules holds (``serving.speculative.draft: mtp``):
    every module's weights and KV per token; empty for a model without them."""
    if not arch.mtp_modules:
        return {}
    return {"mtp_modules": arch.mtp_modules,
            "mtp_weight_bytes": {d: arch.mtp_modules * sum(arch.mtp_module_bytes(d)) for d in weight_dtypes},
            "mtp_kv_bytes_per_token": {d: arch.mtp_modules * arch.mtp_kv_bytes_per_token(d) for d in kv_dtypes}}


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
