"""DeepSeek-V4's compressed attention: a local window on every layer, compressed history on most,
a lightning indexer on the ratio-4 layers; and its attention and mHC parameter counts."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from apmw.arch.config import Cfg
from apmw.errors import ConfigError


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
        return sum(n * self.elements_per_token_at(r) for r, n in self.layers_by_ratio)

    def elements_per_token_at(self, ratio: int) -> float:
        """What one layer of compress ratio ``ratio`` caches per token beyond its window (0 at ratio 0)."""
        return (self.entry_elements + self._index(ratio)) / ratio if ratio else 0.0

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


def _v4_attention_layer(c: Cfg, ratio: int, hidden: int, heads: int) -> tuple[int, int, float]:
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


def _v4_ratios(c: Cfg, num_layers: int, mtp: int) -> list[int]:
    ratios = c.get("compress_ratios")
    if not isinstance(ratios, list) or len(ratios) != num_layers + mtp:
        raise ConfigError(f"{c.name}: compress_ratios must list one ratio per layer and per MTP module "
                          f"({num_layers} + {mtp}); it has {len(ratios) if isinstance(ratios, list) else ratios!r}.")
    odd = list(dict.fromkeys(repr(r) for r in ratios
                             if isinstance(r, bool) or not isinstance(r, int) or r not in _V4_RATIOS))
    if odd:
        raise ConfigError(f"{c.name}: compress_ratios has [{', '.join(sorted(odd))}]; apmw models the published ratios "
                          f"{list(_V4_RATIOS)} (0 window only, 4 sparse with an indexer, 128 dense).")
    return [int(r) for r in ratios]


def deepseek_v4(c: Cfg, hidden: int, heads: int, num_layers: int) -> _V4:
    """Attention, compressed-KV shape and mHC of a DeepSeek-V4 config (docs/models.md)."""
    if c.flag("attention_bias"):
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


def v4_notes(c: Cfg, v4: _V4, vocab: int, top_k: int) -> list[str]:
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
    ] + ([] if c.get("expert_dtype") is not None else [
        "the config does not state expert_dtype: taken as fp4, as DeepSeek's published V4 checkpoints store their "
        "routed experts (pass --moe-dtype / model.moe_dtype for a checkpoint stored otherwise)"])
