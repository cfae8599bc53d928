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
    bits_per_weight: float | None = None   # a weight stored in weight_dtype, scales included; None: apmw's table


# compressed-tensors' weight schemes apmw names: (num_bits, type) -> dtype.
_SCHEME_DTYPES = {(4, "int"): "int4", (4, "float"): "fp4", (8, "float"): "fp8", (8, "int"): "int8"}
# Each part's modules by role, each role by the names the HF layouts of the MoE and dense families apmw reads
# give it (DeepSeek/Kimi MLA, Llama/Qwen GQA, Qwen's and Llama 4's shared expert, Llama 4's feed_forward,
# Mixtral's w1/w2/w3). A part is left in 16 bits when the ignore list names one of each of its roles' names.
_PART_ROLES: dict[str, tuple[tuple[str, ...], ...]] = {
    "attention": (("self_attn.q_proj", "self_attn.q_a_proj"), ("self_attn.k_proj", "self_attn.kv_a_proj_with_mqa"),
                  ("self_attn.v_proj", "self_attn.kv_b_proj")),
    "attention_output": (("self_attn.o_proj",),),
    "shared_experts": (("mlp.shared_experts.gate_proj", "mlp.shared_expert.gate_proj",
                        "feed_forward.shared_expert.gate_proj"),
                       ("mlp.shared_experts.down_proj", "mlp.shared_expert.down_proj",
                        "feed_forward.shared_expert.down_proj")),
    "dense_mlp": (("mlp.gate_proj", "feed_forward.gate_proj"), ("mlp.down_proj", "feed_forward.down_proj")),
    "routed_experts": (("mlp.experts.0.gate_proj", "feed_forward.experts.0.gate_proj",
                        "block_sparse_moe.experts.0.w1"),
                       ("mlp.experts.0.down_proj", "feed_forward.experts.0.down_proj",
                        "block_sparse_moe.experts.0.w2")),
}
# Where a family's decoder layers sit: text models, and the language model of a multimodal checkpoint.
_LAYER_PREFIXES = ("model.layers.1.", "language_model.model.layers.1.", "model.language_model.layers.1.")
_PART_WORDS = {"attention": "attention projections", "attention_output": "output projections",
               "shared_experts": "shared experts", "dense_mlp": "dense MLPs", "routed_experts": "routed experts"}
ALL_PARTS = frozenset(_PART_ROLES)
UNQUANTISED_DTYPE = "bf16"
_REMEDY = "to price the checkpoint as one dtype, remove quantization_config from a copy of its config and give --weight-dtype"


def quantization_config(cfg: dict, where: str) -> dict:
    """A config's ``quantization_config`` (its own, else its text_config's; a multimodal checkpoint keeps it
    there); {} without one. One that is not a mapping is refused."""
    text = cfg.get("text_config")
    q = cfg.get("quantization_config") or (text.get("quantization_config") if isinstance(text, dict) else None) or {}
    if not isinstance(q, dict):
        raise ConfigError(f"{where}: quantization_config {str(q)[:60]!r} is not a mapping (HF writes one with a "
                          "quant_method); fix the config, or remove quantization_config and give --weight-dtype")
    return q


def compressed_tensors_format(q: dict, where: str, parts: frozenset[str] = ALL_PARTS) -> CheckpointFormat | None:
    """The format a compressed-tensors ``quantization_config`` (``q``) describes, or None when ``q`` is not one.

    One weight scheme (``config_groups``, targets ``Linear``) applied to every linear layer but the modules its
    ``ignore`` list names (exact names, or ``re:`` patterns matched from the start, as compressed-tensors matches
    them). A weight's bits count its scales: one per ``group_size`` weights, 8 bits for a 4-bit float scheme
    (NVFP4's FP8 and MXFP4's E8M0 scales), else 16 bits (the checkpoint's bf16), plus a zero point of the same
    width when the scheme is asymmetric. ``parts``: those the model has (a dense model has no experts); a
    scheme or layout apmw cannot price is refused with the reason."""
    if not isinstance(q, dict) or str(q.get("quant_method", "")).lower() != "compressed-tensors":
        return None
    weights = _one_scheme(q, where)
    bits = weights.get("num_bits")
    if isinstance(bits, bool) or not isinstance(bits, int):
        raise ConfigError(f"{where}: quantization_config weight scheme num_bits {bits!r} is not a whole number; {_REMEDY}")
    key = (bits, str(weights.get("type", "")).lower())
    dtype = _SCHEME_DTYPES.get(key)
    if dtype is None:
        raise ConfigError(f"{where}: quantization_config weight scheme {key[0]}-bit {key[1] or '?'} is not one apmw "
                          f"prices ({', '.join(f'{b}-bit {t}' for b, t in _SCHEME_DTYPES)}); {_REMEDY}")
    ignore = q.get("ignore") or []
    if not isinstance(ignore, list):
        raise ConfigError(f"{where}: quantization_config.ignore {ignore!r} is not a list of module names or patterns")
    kept = _kept_parts(ignore, where) & parts
    if "routed_experts" in kept:
        raise ConfigError(f"{where}: quantization_config.ignore leaves the routed experts unquantised; apmw prices "
                          "such a checkpoint as bf16 (give --weight-dtype bf16)")
    ffn = {"shared_experts", "dense_mlp"} & parts
    if ffn & kept and ffn - kept:
        raise ConfigError(f"{where}: quantization_config.ignore keeps only one of the shared experts and the dense "
                          f"MLPs unquantised; apmw prices both in one dtype; {_REMEDY}")
    return CheckpointFormat(
        weight_dtype=dtype,
        attention_dtype=UNQUANTISED_DTYPE if "attention" in kept else dtype,
        attention_output_dtype=UNQUANTISED_DTYPE if "attention_output" in kept else dtype,
        dense_ffn_dtype=UNQUANTISED_DTYPE if ffn and ffn <= kept else dtype,
        bits_per_weight=_bits_per_weight(weights, key, where),
        source=(f"its quantization_config (compressed-tensors): {key[0]}-bit {key[1]} weights"
                f"{_grouping(weights)}; in 16 bits: "
                + (", ".join(_PART_WORDS[p] for p in _PART_ROLES if p in kept) or "no linear layer")))


def _one_scheme(q: dict, where: str) -> dict:
    """The weights of the one scheme ``q``'s config_groups apply to every linear layer."""
    config_groups = q.get("config_groups") or {}
    if not isinstance(config_groups, dict):
        raise ConfigError(f"{where}: quantization_config.config_groups {config_groups!r} is not a mapping of schemes")
    groups = [g for g in config_groups.values() if isinstance(g, dict) and g.get("weights")]
    if len(groups) != 1:
        raise ConfigError(f"{where}: quantization_config has {len(groups)} weight schemes (config_groups); apmw prices "
                          f"a compressed-tensors checkpoint with exactly one; {_REMEDY}")
    targets = groups[0].get("targets", ["Linear"])
    if targets != ["Linear"]:
        raise ConfigError(f"{where}: quantization_config's weight scheme targets {targets!r}; apmw reads a scheme that "
                          f"targets every Linear layer (['Linear']) less an ignore list; {_REMEDY}")
    weights = groups[0]["weights"]
    if not isinstance(weights, dict):
        raise ConfigError(f"{where}: quantization_config.config_groups weights {weights!r} is not a mapping")
    return weights


def _kept_parts(ignore: list, where: str) -> set[str]:
    """The parts one of whose names for each role an ``ignore`` entry names."""
    patterns = []
    for entry in ignore:
        text = str(entry)
        try:
            patterns.append(re.compile(text[3:]) if text.startswith("re:") else re.compile(re.escape(text) + r"\Z"))
        except re.error as exc:
            raise ConfigError(f"{where}: quantization_config.ignore entry {text!r} is not a valid pattern ({exc})") from None
        if text.startswith("re:") and _may_backtrack(text[3:]):
            raise ConfigError(f"{where}: quantization_config.ignore entry {text!r} repeats a part that itself repeats, "
                              "is optional or has alternatives (such as '(a+)+', '(?:.?){40}' or '(a|b)*'), or repeats more than "
                              f"{MAX_OPEN_REPEATS} times without bound: matching it can take exponential time, so "
                              "apmw does not run it. Write it without the repeated group (e.g. '.*mlp\\.gate$')")

    def named(module: str) -> bool:
        return any(p.match(prefix + module) for prefix in _LAYER_PREFIXES for p in patterns)

    return {part for part, roles in _PART_ROLES.items() if all(any(named(m) for m in names) for names in roles)}


# Unbounded repeats (``*``, ``+``, ``{n,}``) an ignore pattern may hold: a module name is some 60 characters,
# and each such repeat can multiply the steps of a failed match by that many.
MAX_OPEN_REPEATS = 4


def _may_backtrack(pattern: str) -> bool:
    """Whether a valid regular expression has a shape whose match can take exponential (or high polynomial)
    time in Python's backtracking engine: a repeated part that itself repeats, is optional or has alternatives
    (``(a+)+``, ``(?:.?){40}``, ``(a|aa)*``), or more than ``MAX_OPEN_REPEATS`` unbounded repeats. A module name is matched against every
    ignore entry, and a checkpoint's config.json is the user's (or a stranger's) to write."""
    from re import _constants as c, _parser   # the parser ``re`` itself compiles with (stable since 3.11)

    repeats = (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT)
    open_repeats = 0

    def parts(value) -> list:
        if isinstance(value, _parser.SubPattern):
            return [value]
        if isinstance(value, (tuple, list)):
            return [p for v in value for p in parts(v)]
        return []

    def risky(sub, inside_repeat: bool) -> bool:
        nonlocal open_repeats
        for op, value in sub:
            if op in repeats:
                low, high, body = value
                # inside a repeat, a part that may match a varying number of times (``a+``, ``.?``): each
                # repetition may split the text another way, as ``(?:.?){40}`` does 2^40 ways
                if inside_repeat and low != high:
                    return True
                open_repeats += high == c.MAXREPEAT
                if risky(body, inside_repeat or high > 1):
                    return True
                continue
            if op is c.BRANCH and inside_repeat:
                return True
            if any(risky(p, inside_repeat) for p in parts(value)):
                return True
        return False

    return risky(_parser.parse(pattern), False) or open_repeats > MAX_OPEN_REPEATS


def _bits_per_weight(weights: dict, key: tuple, where: str) -> float:
    bits = float(key[0])
    group, strategy = weights.get("group_size"), weights.get("strategy")
    if strategy is None and group is not None:
        strategy = "group"           # compressed-tensors infers a group strategy from a group size
    if str(strategy).lower() not in ("group", "tensor_group") or group is None:
        return bits            # per channel, per tensor or per 128x128 block: the scales add under 0.1 %
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ConfigError(f"{where}: quantization_config weight scheme group_size {group!r} is not a positive "
                          "whole number of weights")
    symmetric = weights.get("symmetric")
    if symmetric is not None and not isinstance(symmetric, bool):
        raise ConfigError(f"{where}: quantization_config weight scheme symmetric {symmetric!r} is not true or false")
    scale_bits = 8.0 if key == (4, "float") else 16.0
    zero_bits = 0.0 if symmetric in (None, True) else scale_bits      # compressed-tensors' default: symmetric
    return bits + (scale_bits + zero_bits) / float(group)


def _grouping(weights: dict) -> str:
    group = weights.get("group_size")
    return f" in groups of {group}" + ("" if weights.get("symmetric") in (None, True) else ", asymmetric") if group else ""
