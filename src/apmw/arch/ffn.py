"""The feed-forward part: dense MLPs, routed MoE experts and their routers, shared experts, and
the embedding, head and norm counts every family shares. Every MLP and expert is gated
(SwiGLU: gate, up, down)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from apmw.arch.config import Cfg
from apmw.errors import ConfigError

# Model families whose routed experts' width is moe_intermediate_size, beside a dense intermediate_size.
MOE_WIDTH_FAMILIES = ("qwen2_moe", "qwen3_moe", "qwen3_next", "qwen3_5_moe", "deepseek", "kimi", "glm")


@dataclass(frozen=True)
class _Ffn:
    total: int
    active: int
    router: int   # unquantised part (router / shared-expert gate)


def _ffn_layers(c: Cfg, hidden: int, num_layers: int) -> tuple[list[_Ffn], int, int]:
    """Per-layer MLP/MoE parameters, the number of routed experts and top-k."""
    n_experts = c.first(("n_routed_experts", "num_local_experts", "num_experts"))
    dense_inter = c.first(("intermediate_size_mlp", "intermediate_size"))
    bias = bool(c.get("mlp_bias") or c.model_type == "gpt_oss")
    if not n_experts:
        return [_dense_ffn(hidden, c.req("intermediate_size", "the MLP"), bias)] * num_layers, 0, 0
    top_k = c.first(("num_experts_per_tok", "experts_per_token"))
    if not top_k:
        c.req("num_experts_per_tok", "MoE routing (experts per token)")
    if top_k > n_experts:
        raise ConfigError(f"{c.name}: num_experts_per_tok {top_k} is more than the {n_experts} routed experts; "
                          "a token routes to that many distinct experts. Fix the value in the config.json.")
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


def _expert_width(c: Cfg) -> int:
    """One routed expert's intermediate size: ``moe_intermediate_size`` in the families whose dense MLP is
    ``intermediate_size`` (a config of theirs without it would price every expert as the dense MLP), else
    ``intermediate_size`` (Mixtral, gpt-oss, Llama 4, MiniMax)."""
    if c.get("moe_intermediate_size") is not None:
        return c.positive(("moe_intermediate_size",), 0)
    if c.model_type.startswith(MOE_WIDTH_FAMILIES):
        raise ConfigError(f"{c.name}: config has no 'moe_intermediate_size', which {c.model_type} reads each routed "
                          "expert's width from. Add it to the config.json (copy it from the model's HuggingFace config).")
    return c.req("intermediate_size", "MoE experts")


def _moe_layer(c: Cfg, hidden: int, n_experts: int, top_k: int, bias: bool) -> _Ffn:
    inter = _expert_width(c)
    expert = _mlp_params(hidden, inter, bias)
    shared, gate = _shared_expert(c, hidden, inter)
    router_bias = (c.model_type == "gpt_oss" or c.get("topk_method") == "noaux_tc"
                   or bool(c.get("use_routing_bias")))
    router = hidden * n_experts + (n_experts if router_bias else 0) + gate
    return _Ffn(total=n_experts * expert + shared + router,
                active=top_k * expert + shared + router, router=router)


def _shared_expert(c: Cfg, hidden: int, expert_inter: int) -> tuple[int, int]:
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


def _is_moe_layer(c: Cfg, i: int, num_layers: int) -> bool:
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


@dataclass(frozen=True)
class _FfnCounts:
    shared: int             # embeddings, lm_head, norms (not attention)
    total: int              # MLP / MoE parameters, all layers
    active: int             # of them, run per token
    fields: dict[str, Any]  # the Architecture fields they fill


def ffn_counts(c: Cfg, hidden: int, num_layers: int, vocab: int, extra_unquantised: int = 0) -> _FfnCounts:
    """MLP/MoE, embedding, head and norm counts shared by every family; ``extra_unquantised``
    adds a family's other bf16/fp32 parameters (all active) to the unquantised ones."""
    ffn, n_experts, top_k = _ffn_layers(c, hidden, num_layers)
    if c.model_type == "deepseek_v4":        # hash-routed layers have no routing bias
        unbiased = _Ffn(total=-n_experts, active=-n_experts, router=-n_experts)
        ffn = [_add(f, unbiased) if i < c.get("num_hash_layers", 0) else f for i, f in enumerate(ffn)]
    moe = [f for f in ffn if f.router > 0]
    expert_inter = _expert_width(c) if moe else 0
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
            dense_ffn_params=sum(f.total - f.router for f in ffn) - len(moe) * n_experts * expert,
            active_routed_expert_params=len(moe) * top_k * expert,
            expert_dtype_in_checkpoint=_checkpoint_expert_dtype(c) if moe else None,
            mxfp4_experts=bool(moe) and str((c.get("quantization_config") or {}).get("quant_method", "")).lower() == "mxfp4",
            max_context_tokens=c.get("max_position_embeddings"),
            mtp_modules=c.first(("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules"))))


def _add(a: _Ffn, b: _Ffn) -> _Ffn:
    return _Ffn(total=a.total + b.total, active=a.active + b.active, router=a.router + b.router)


_CHECKPOINT_DTYPES = {"fp4": "fp4", "mxfp4": "fp4", "nvfp4": "fp4", "fp8": "fp8", "bfloat16": "bf16",
                      "bf16": "bf16", "float16": "fp16", "fp16": "fp16"}


# DeepSeek-V4's published checkpoints (Pro and Flash) store their routed experts in FP4 and the rest in FP8
# (../shared/data/README.md, the V4 configs; DeepSeek's V4 release). V4-Flash's config.json says so in
# ``expert_dtype``; V4-Pro's, as published, does not.
V4_EXPERT_DTYPE = "fp4"


def _checkpoint_expert_dtype(c: Cfg) -> str | None:
    """The dtype the published checkpoint stores routed experts in: ``expert_dtype`` (V4; a V4 config without it
    is taken as V4's published checkpoints store them, :data:`V4_EXPERT_DTYPE`), else the checkpoint's
    quantisation method, else its torch_dtype; None when none of them says."""
    spelled = c.get("expert_dtype")
    if spelled is None and c.get("compress_ratios") is not None:
        spelled = V4_EXPERT_DTYPE
    if spelled is None:
        spelled = (c.get("quantization_config") or {}).get("quant_method")
    if spelled is None:
        spelled = c.get("torch_dtype", c.get("dtype"))
    return _CHECKPOINT_DTYPES.get(str(spelled).lower()) if spelled is not None else None
