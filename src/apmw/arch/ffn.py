"""The feed-forward part: dense MLPs, routed MoE experts and their routers, shared experts, and
the embedding, head and norm counts every family shares. Every MLP and expert is gated
(SwiGLU: gate, up, down)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from apmw.arch.config import Cfg, check_layer_count
from apmw.errors import ConfigError

# Model families whose routed experts' width is moe_intermediate_size, beside a dense intermediate_size.
MOE_WIDTH_FAMILIES = ("qwen2_moe", "qwen3_moe", "qwen3_next", "qwen3_5_moe", "deepseek", "kimi", "glm")
# each family's spelling of the routed experts per MoE layer, and of the experts a token routes to
_EXPERT_COUNTS = ("n_routed_experts", "num_local_experts", "num_experts")
_TOP_K = ("num_experts_per_tok", "experts_per_token")


@dataclass(frozen=True)
class _Ffn:
    total: int
    active: int
    router: int   # unquantised part (router / shared-expert gate)


def _ffn_layers(c: Cfg, hidden: int, num_layers: int) -> tuple[list[_Ffn], int, int]:
    """Per-layer MLP/MoE parameters, the number of routed experts and top-k."""
    check_layer_count(c, num_layers)
    top_k = c.alias(_TOP_K)
    n_experts = _routed_experts(c, top_k)
    dense_inter = c.first(("intermediate_size_mlp", "intermediate_size"))
    bias = c.flag("mlp_bias") or c.model_type == "gpt_oss"
    if not n_experts:
        return [_dense_ffn(hidden, c.req("intermediate_size", "the MLP"), bias)] * num_layers, 0, 0
    if not top_k:       # the name the config uses, where it gives one (a 0 there is refused by that name)
        c.req(next((k for k in _TOP_K if c.get(k) is not None), _TOP_K[0]), "MoE routing (experts per token)")
    if top_k > n_experts:
        raise ConfigError(f"{c.name}: num_experts_per_tok {top_k} is more than the {n_experts} routed experts; "
                          "a token routes to that many distinct experts. Fix the value in the config.json.")
    moe = _moe_layer(c, hidden, n_experts, top_k, bias)
    flags = _moe_layer_flags(c, num_layers)
    if not any(flags):
        raise ConfigError(f"{c.name}: the config declares {n_experts} routed experts, but no layer of its {num_layers} "
                          f"routes to them ({_placement(c)}); a model whose every layer is dense has no experts. Fix "
                          "the layer placement in the config.json, or remove the expert fields for a dense model.")
    if not all(flags) and not dense_inter:
        # the dense layers' MLP (DeepSeek's first_k_dense_replace) would be priced at width 0
        c.req("intermediate_size_mlp" if "intermediate_size_mlp" in c.data else "intermediate_size",
              f"the MLP of its {flags.count(False)} dense layer(s) ({_placement(c)})")
    dense = _dense_ffn(hidden, dense_inter, bias)
    layers = [moe if is_moe else dense for is_moe in flags]
    return layers, n_experts, top_k


def _placement(c: Cfg) -> str:
    """The config's fields that place MoE layers, as written."""
    keys = ("first_k_dense_replace", "moe_layer_freq", "moe_layers", "interleave_moe_layer_step", "decoder_sparse_step",
            "mlp_only_layers")
    return ", ".join(f"{k} {c.data[k]!r}" for k in keys if k in c.data) or "no placement field"


def _routed_experts(c: Cfg, top_k: int) -> int:
    """The routed experts per MoE layer (0: a dense model); 0 beside a top-k is a MoE config without experts."""
    n_experts = c.alias(_EXPERT_COUNTS)
    if n_experts == 0 and top_k:
        key = next((k for k in _EXPERT_COUNTS if c.data.get(k) is not None), _EXPERT_COUNTS[0])
        routing = next(k for k in _TOP_K if c.data.get(k) is not None)
        raise ConfigError(f"{c.name}: '{key}' is {c.data.get(key, 0)!r} but '{routing}' is {top_k}: a MoE config "
                          f"needs at least one routed expert. Set '{key}' to the model's expert count, or for a "
                          f"dense model remove '{routing}' from the config.json.")
    return n_experts


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
                   or c.flag("use_routing_bias"))
    router = hidden * n_experts + (n_experts if router_bias else 0) + gate
    return _Ffn(total=n_experts * expert + shared + router,
                active=top_k * expert + shared + router, router=router)


def _shared_expert(c: Cfg, hidden: int, expert_inter: int) -> tuple[int, int]:
    """(shared-expert parameters, its gate parameters) for the families that have one."""
    if n_shared := c.first(("n_shared_experts",)):                  # DeepSeek / Kimi / GLM
        return 3 * hidden * expert_inter * n_shared, 0
    if gated := c.first(("shared_expert_intermediate_size",)):      # Qwen MoE: shared expert + sigmoid gate
        return 3 * hidden * gated, hidden
    if width := c.first(("shared_intermediate_size",)):             # MiniMax
        return 3 * hidden * width, 0
    if c.model_type.startswith("llama4"):              # one shared expert, expert-sized
        return 3 * hidden * c.req("intermediate_size", "the Llama 4 shared expert"), 0
    return 0, 0


def _moe_layer_flags(c: Cfg, num_layers: int) -> list[bool]:
    """Whether each layer is MoE, following each family's HF modelling code."""
    if "first_k_dense_replace" in c.data or "moe_layer_freq" in c.data:   # DeepSeek-style
        first_moe, freq = c.first(("first_k_dense_replace",)), c.positive(("moe_layer_freq",), 1)
        return [i >= first_moe and i % freq == 0 for i in range(num_layers)]
    if c.model_type.startswith("llama4"):
        moe = set(c.layer_indices("moe_layers", num_layers))
        if not moe:
            step = c.positive(("interleave_moe_layer_step",), 1)
            moe = set(range(step - 1, num_layers, step))
        return [i in moe for i in range(num_layers)]
    if "decoder_sparse_step" in c.data or "mlp_only_layers" in c.data:    # Qwen MoE
        step = c.positive(("decoder_sparse_step",), 1)
        dense = set(c.layer_indices("mlp_only_layers", num_layers))
        return [i not in dense and (i + 1) % step == 0 for i in range(num_layers)]
    return [True] * num_layers


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
        hashed = _hash_layers(c, num_layers)
        ffn = [_add(f, unbiased) if i < hashed else f for i, f in enumerate(ffn)]
    moe = [f for f in ffn if f.router > 0]
    expert_inter = _expert_width(c) if moe else 0
    dense_inter = c.first(("intermediate_size_mlp", "intermediate_size")) or 0 if len(moe) < num_layers else 0
    shared_expert, _ = _shared_expert(c, hidden, expert_inter) if moe else (0, 0)
    bias = c.flag("mlp_bias") or c.model_type == "gpt_oss"
    expert = _mlp_params(hidden, expert_inter, bias) if moe else 0
    tied = c.flag("tie_word_embeddings")
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
            mxfp4_experts=bool(moe) and str(_quant_method(c) or "").lower() == "mxfp4",
            max_context_tokens=c.optional_positive("max_position_embeddings"),
            mtp_modules=c.alias(("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules"))))


def _hash_layers(c: Cfg, num_layers: int) -> int:
    """DeepSeek-V4's hash-routed layers (the first ones): a count no larger than the model's layers."""
    hashed = c.first(("num_hash_layers",))
    if hashed > num_layers:
        c.refuse("num_hash_layers", hashed, f"at most num_hidden_layers ({num_layers})")
    return hashed


def _quant_method(c: Cfg) -> Any:
    """The text model's ``quantization_config.quant_method``, or None where it has none."""
    quantisation = c.get("quantization_config", {})
    if not isinstance(quantisation, dict):
        c.refuse("quantization_config", quantisation, "an object (the checkpoint's quantisation settings)")
    return quantisation.get("quant_method")


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
    if spelled is not None and str(spelled).lower() not in _CHECKPOINT_DTYPES:
        c.refuse("expert_dtype", spelled, f"one of {', '.join(sorted(_CHECKPOINT_DTYPES))} (the routed experts' stored dtype)")
    if spelled is None and c.get("compress_ratios") is not None:
        spelled = V4_EXPERT_DTYPE
    if spelled is None:
        spelled = _quant_method(c)
    if spelled is None:
        spelled = c.get("torch_dtype", c.get("dtype"))
    return _CHECKPOINT_DTYPES.get(str(spelled).lower()) if spelled is not None else None
