"""Checkpoint formats: the dtype each part of a quantised checkpoint is stored in.

A quantised checkpoint seldom stores every linear layer in its headline dtype. apmw prices four parts
apart: the attention projections, their output projection (o_proj, DeepSeek's wo), the dense FFN (shared
experts and dense MLPs) and the routed experts. Embeddings, lm_head, norms and routers are 16-bit in every
checkpoint (:data:`apmw.arch.dtypes.UNQUANTISED_BYTES`).

A :class:`CheckpointFormat` says what one checkpoint does, read from its config.json where the config says
it (compressed-tensors' ``config_groups`` and ``ignore``, :func:`compressed_tensors_format`) or from the
checkpoint's model card for a published name (:data:`apmw.catalog.models.PUBLISHED_FORMATS`). Without one,
:meth:`apmw.arch.architecture.Architecture.part_dtypes` applies apmw's rule for the dtype priced.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from apmw.errors import ConfigError


@dataclass(frozen=True)
class CheckpointFormat:
    """The dtypes of one checkpoint's parts, as stored at ``weight_dtype`` (priced at another dtype, the
    checkpoint is not the one described and apmw's own rule applies)."""

    weight_dtype: str              # its quantised layers' dtype (apmw's name)
    attention_dtype: str           # the attention projections
    attention_output_dtype: str    # the output projection
    dense_ffn_dtype: str           # shared experts and dense MLPs
    source: str                    # where this was read, for the notes
    expert_bits_per_weight: float | None = None   # routed experts with their scales; None: apmw's table


# compressed-tensors' weight schemes apmw names: (num_bits, type) -> dtype.
_SCHEME_DTYPES = {(4, "int"): "int4", (4, "float"): "fp4", (8, "float"): "fp8", (8, "int"): "int8"}
# One module name of each part in the HF layout of every family compressed-tensors checkpoints ship (DeepSeek,
# Kimi, Qwen, Llama); a part is left in 16 bits when the config's ignore list names all of its modules.
_PART_MODULES = {
    "attention": ("model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.q_a_proj",
                  "model.layers.1.self_attn.kv_b_proj", "model.layers.1.self_attn.k_proj"),
    "attention_output": ("model.layers.1.self_attn.o_proj",),
    "shared_experts": ("model.layers.1.mlp.shared_experts.gate_proj", "model.layers.1.mlp.shared_experts.down_proj"),
    "dense_mlp": ("model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj", "model.layers.0.mlp.down_proj"),
    "routed_experts": ("model.layers.1.mlp.experts.0.gate_proj", "model.layers.1.mlp.experts.0.down_proj"),
}
_PART_WORDS = {"attention": "attention projections", "attention_output": "output projections",
               "shared_experts": "shared experts", "dense_mlp": "dense MLPs", "routed_experts": "routed experts"}
UNQUANTISED_DTYPE = "bf16"


def compressed_tensors_format(q: dict, where: str) -> CheckpointFormat | None:
    """The format a compressed-tensors ``quantization_config`` (``q``) describes, or None when ``q`` is not one.

    One weight scheme (``config_groups``) applied to every Linear layer, less the modules its ``ignore`` list
    names (exact names, or ``re:`` patterns matched from the start, as compressed-tensors matches them). The
    routed experts' bits per weight count their scales: one per ``group_size`` weights, 8 bits for a 4-bit
    float scheme (NVFP4's FP8 and MXFP4's E8M0 scales), else 16 bits (the checkpoint's bf16), plus a zero
    point of the same width when the scheme is asymmetric. A scheme or layout apmw cannot price is refused."""
    if not isinstance(q, dict) or str(q.get("quant_method", "")).lower() != "compressed-tensors":
        return None
    config_groups = q.get("config_groups") or {}
    if not isinstance(config_groups, dict):
        raise ConfigError(f"{where}: quantization_config.config_groups {config_groups!r} is not a mapping of schemes")
    groups = [g for g in config_groups.values() if isinstance(g, dict) and g.get("weights")]
    if len(groups) != 1:
        raise ConfigError(f"{where}: quantization_config has {len(groups)} weight schemes (config_groups); apmw prices "
                          "a compressed-tensors checkpoint with exactly one. Give --weight-dtype and use a config "
                          "without quantization_config to price it as one dtype")
    weights = groups[0]["weights"]
    if not isinstance(weights, dict):
        raise ConfigError(f"{where}: quantization_config.config_groups weights {weights!r} is not a mapping")
    key = (weights.get("num_bits"), str(weights.get("type", "")).lower())
    dtype = _SCHEME_DTYPES.get(key)
    if dtype is None:
        raise ConfigError(f"{where}: quantization_config weight scheme {key[0]}-bit {key[1] or '?'} is not one apmw "
                          f"prices ({', '.join(f'{b}-bit {t}' for b, t in _SCHEME_DTYPES)}); to price the checkpoint "
                          "as one dtype, remove quantization_config from a copy of its config and give --weight-dtype")
    ignore = q.get("ignore") or []
    if not isinstance(ignore, list):
        raise ConfigError(f"{where}: quantization_config.ignore {ignore!r} is not a list of module names or patterns")
    kept = _kept_parts(ignore, where)
    if "routed_experts" in kept:
        raise ConfigError(f"{where}: quantization_config.ignore leaves the routed experts unquantised; apmw prices "
                          "such a checkpoint as bf16 (give --weight-dtype bf16)")
    if ("shared_experts" in kept) != ("dense_mlp" in kept):
        raise ConfigError(f"{where}: quantization_config.ignore keeps only one of the shared experts and the dense "
                          "MLPs unquantised; apmw prices both in one dtype")
    return CheckpointFormat(
        weight_dtype=dtype,
        attention_dtype=UNQUANTISED_DTYPE if "attention" in kept else dtype,
        attention_output_dtype=UNQUANTISED_DTYPE if "attention_output" in kept else dtype,
        dense_ffn_dtype=UNQUANTISED_DTYPE if "dense_mlp" in kept else dtype,
        expert_bits_per_weight=_bits_per_weight(weights, key, where),
        source=(f"its quantization_config (compressed-tensors): {key[0]}-bit {key[1]} weights"
                f"{_grouping(weights)}; in 16 bits: "
                + (", ".join(_PART_WORDS[p] for p in _PART_MODULES if p in kept) or "no linear layer")))


def _kept_parts(ignore: list, where: str) -> set[str]:
    """The parts every one of whose sample modules an ``ignore`` entry names."""
    patterns = []
    for entry in ignore:
        text = str(entry)
        try:
            patterns.append(re.compile(text[3:]) if text.startswith("re:") else re.compile(re.escape(text) + r"\Z"))
        except re.error as exc:
            raise ConfigError(f"{where}: quantization_config.ignore entry {text!r} is not a valid pattern ({exc})") from None
    return {part for part, modules in _PART_MODULES.items()
            if all(any(p.match(m) for p in patterns) for m in modules)}


def _bits_per_weight(weights: dict, key: tuple, where: str) -> float:
    bits = float(key[0])
    group = weights.get("group_size")
    if str(weights.get("strategy", "group")).lower() not in ("group", "tensor_group") or group is None:
        return bits            # per channel, per tensor or per 128x128 block: the scales add under 0.1 %
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ConfigError(f"{where}: quantization_config weight scheme group_size {group!r} is not a positive "
                          "whole number of weights")
    scale_bits = 8.0 if key == (4, "float") else 16.0
    zero_bits = 0.0 if weights.get("symmetric", True) else scale_bits
    return bits + (scale_bits + zero_bits) / float(group)


def _grouping(weights: dict) -> str:
    group = weights.get("group_size")
    return f" in groups of {group}" + ("" if weights.get("symmetric", True) else ", asymmetric") if group else ""
