"""Softmax attention of the full and sliding layers: GQA/MHA, MLA and the DeepSeek sparse-attention
(DSA) indexer; per layer its parameters, KV elements per token and FLOPs per attended token."""

from __future__ import annotations

from dataclasses import dataclass

from apmw.arch.config import Cfg
from apmw.errors import ConfigError


@dataclass(frozen=True)
class MlaShape:
    """The projection widths of multi-head latent attention (DeepSeek-V2/V3), per head where per head:
    what the measured MLA kernels and GEMMs are read at (:mod:`apmw.perf.calibrated`)."""
    q_lora_rank: int            # 0: queries projected from the hidden state directly (DeepSeek-V2-Lite)
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


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
    mla: MlaShape | None = None
    output_params: int = 0      # of params: the output projection (o_proj)


# Fields only multi-head latent attention has: a config with them and no kv_lora_rank is not GQA.
MLA_FIELDS = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


def attention(c: Cfg, hidden: int, heads: int) -> _Attn:
    if c.get("kv_lora_rank") or any(c.get(k) is not None for k in MLA_FIELDS):
        return _mla_attention(c, hidden, heads)
    return _gqa_attention(c, hidden, heads)


def _gqa_attention(c: Cfg, hidden: int, heads: int) -> _Attn:
    """GQA/MHA: q, k, v, o projections; Qwen3.5's output gate doubles q_proj."""
    kv_heads = c.positive(("num_key_value_heads",), heads)
    if kv_heads > heads or heads % kv_heads:
        raise ConfigError(f"{c.name}: num_key_value_heads {kv_heads} does not divide num_attention_heads {heads}; "
                          "grouped-query attention shares each KV head among a whole number of query heads. "
                          "Fix the value in the config.json.")
    if c.get("head_dim") is None and hidden < heads:
        raise ConfigError(f"{c.name}: the config gives no 'head_dim', and 'hidden_size' {hidden} over "
                          f"'num_attention_heads' {heads} (the head size it implies) is 0. Add 'head_dim', or fix "
                          "those two in the config.json.")
    head_dim = c.positive(("head_dim",), hidden // heads)
    q_out = heads * head_dim * (2 if c.flag("attn_output_gate") else 1)
    params = hidden * q_out + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
    output = heads * head_dim * hidden
    if c.flag("attention_bias"):
        params += q_out + 2 * kv_heads * head_dim + hidden
        output += hidden
    return _Attn(kind="mha" if kv_heads == heads else "gqa", params=params,
                 kv_elements=2 * kv_heads * head_dim,
                 flops_per_context_token=4 * heads * head_dim,
                 num_kv_heads=kv_heads, head_dim=head_dim, output_params=output)


def _mla_attention(c: Cfg, hidden: int, heads: int) -> _Attn:
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
    q_rank = c.first(("q_lora_rank",))      # 0 or null: queries straight from the hidden state
    qk_dim = nope + rope
    q = (hidden * q_rank + q_rank + q_rank * heads * qk_dim) if q_rank else hidden * heads * qk_dim
    kv = hidden * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + v_dim)
    attn = _Attn(kind="mla", params=q + kv + heads * v_dim * hidden,
                 kv_elements=kv_rank + rope,
                 flops_per_context_token=2 * heads * (qk_dim + v_dim),
                 num_kv_heads=1, head_dim=qk_dim,
                 mla=MlaShape(q_lora_rank=q_rank or 0, kv_lora_rank=kv_rank, qk_nope_head_dim=nope,
                              qk_rope_head_dim=rope, v_head_dim=v_dim),
                 output_params=heads * v_dim * hidden)
    # given at all, the indexer's top-k must be a positive count (an empty or zero one is refused, not read as none)
    return _with_indexer(c, attn, hidden, q_rank or hidden) if c.get("index_topk") is not None else attn


def _with_indexer(c: Cfg, attn: _Attn, hidden: int, q_in: int) -> _Attn:
    """DeepSeek sparse attention: a small indexer scores all tokens, top-k are attended."""
    why = "the sparse-attention indexer (index_topk is set)"
    n = c.req("index_n_heads", why)
    dim = c.req("index_head_dim", why)
    params = q_in * n * dim + hidden * dim + 2 * dim + hidden * n  # wq_b, wk, k_norm, weights
    return _Attn(kind=attn.kind, params=attn.params + params,
                 kv_elements=attn.kv_elements + dim,
                 flops_per_context_token=attn.flops_per_context_token,
                 num_kv_heads=attn.num_kv_heads, head_dim=attn.head_dim,
                 topk=c.req("index_topk", why), indexer_flops=2 * n * dim, index_elements=dim, mla=attn.mla,
                 output_params=attn.output_params)
