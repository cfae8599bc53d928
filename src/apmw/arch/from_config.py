"""An Architecture from a config.json: by bundled model name, checkpoint directory or path, each
family's attention, linear-attention and FFN counts put together."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from apmw.arch.architecture import Architecture
from apmw.arch.attention import attention
from apmw.arch.compressed_attention import deepseek_v4, v4_notes
from apmw.arch.config import Cfg, ignored_notes, layer_kinds, text_config
from apmw.arch.ffn import ffn_counts
from apmw.arch.linear_attention import NO_LINEAR, gated_deltanet
from apmw.catalog.checkpoint_formats import compressed_tensors_format, quantization_config
from apmw.catalog.models import (QUANT_METHODS_READ, integer_weight_dtype, load_config, local_path, on_disk,
                                 published_format, resolve_model_name)
from apmw.config_fields import refusal
from apmw.errors import ApmwError, ConfigError


# A thousand times the largest published models' parameters (about 2e12): a config past it has a size mistyped
# (a head count or a width of 1e12), and every figure read from it would be as far off.
MAX_PARAMS = 2e15


def architecture_from_config(cfg: dict[str, Any], name: str, source: str = "") -> Architecture:
    """Build an Architecture from a HuggingFace config dict (see the :mod:`apmw.arch` docstring)."""
    arch = _architecture(cfg, name, source)
    if arch.params > MAX_PARAMS:
        sizes = ", ".join(f"{k} {v:,}" for k, v in (("hidden_size", arch.hidden_size), ("num_attention_heads",
                          arch.num_heads), ("head_dim", arch.head_dim), ("num_hidden_layers", arch.num_layers),
                          ("vocab_size", arch.vocab_size)))
        raise ConfigError(f"{name}: the config's sizes make {arch.params:.3g} parameters, over {MAX_PARAMS:.0e} (a "
                          f"thousand times the largest published models'): one is mistyped ({sizes}; or the MLP's "
                          "or experts' sizes). Fix it in the config.json.")
    return arch


def _architecture(cfg: dict[str, Any], name: str, source: str) -> Architecture:
    text, notes = text_config(cfg, name)
    quantisation = quantization_config(cfg, name)    # a malformed one is refused before any family reads it
    why = refusal(cfg, text)
    if why:
        raise ConfigError(f"{name}: {why}")
    c = Cfg(text, name)
    hidden = c.req("hidden_size", "every parameter count")
    heads = c.req("num_attention_heads", "attention")
    num_layers = c.req("num_hidden_layers", "every per-layer count")
    vocab = c.req("vocab_size", "the embedding and lm_head")
    if c.model_type == "deepseek_v4":
        return _stored_as(_v4_architecture(c, name, source, notes, hidden, heads, num_layers, vocab), quantisation)
    kinds, window = layer_kinds(c, num_layers)
    attn = attention(c, hidden, heads)
    linear = gated_deltanet(c, hidden) if "linear" in kinds else NO_LINEAR
    n_linear = kinds.count("linear")
    attn_params = (num_layers - n_linear) * attn.params + n_linear * linear.params
    ffn = ffn_counts(c, hidden, num_layers, vocab)
    return _stored_as(Architecture(
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
        attention_params=attn_params, attention_output_params=(num_layers - n_linear) * attn.output_params,
        mla=attn.mla, notes=tuple(notes + ignored_notes(c)), **ffn.fields,
    ), quantisation)


def _stored_as(arch: Architecture, quantisation: dict[str, Any]) -> Architecture:
    """``arch`` with the checkpoint format its config's ``quantization_config`` states, where it states one
    (:func:`apmw.catalog.checkpoint_formats.compressed_tensors_format`)."""
    present = {"attention": True, "attention_output": True, "routed_experts": bool(arch.routed_expert_params),
               "shared_experts": bool(arch.shared_expert_params), "dense_mlp": arch.moe_layers < arch.num_layers}
    parts = {part for part, there in present.items() if there}
    form = compressed_tensors_format(quantisation, arch.name, frozenset(parts))
    if form is None:
        method = quantisation.get("quant_method")
        if method is not None and str(method).lower() not in QUANT_METHODS_READ:
            raise ConfigError(f"{arch.name}: quantization_config.quant_method {method!r} is not one apmw reads "
                              f"({', '.join(sorted(QUANT_METHODS_READ))}), so how the checkpoint stores its weights is "
                              "not known; remove quantization_config from a copy of the config and give --weight-dtype")
        integer_weight_dtype(quantisation, arch.name)        # bits apmw does not price are refused
        return arch
    if arch.linear_attention_layers:
        raise ConfigError(f"{arch.name}: apmw does not read a compressed-tensors quantization_config of a model with "
                          "linear-attention layers (which of their projections it keeps in 16 bits is not read); "
                          "remove quantization_config from a copy of the config and give --weight-dtype")
    experts = form.weight_dtype if arch.routed_expert_params else arch.expert_dtype_in_checkpoint
    return replace(arch, checkpoint_format=form, expert_dtype_in_checkpoint=experts,
                   notes=arch.notes + (f"stored as {form.source}",))


def _v4_architecture(c: Cfg, name: str, source: str, notes: list[str], hidden: int, heads: int,
                     num_layers: int, vocab: int) -> Architecture:
    """DeepSeek-V4: compressed attention, mHC, hash-routed layers (:func:`deepseek_v4`)."""
    v4 = deepseek_v4(c, hidden, heads, num_layers)
    ffn = ffn_counts(c, hidden, num_layers, vocab, extra_unquantised=v4.attn_unquantised + v4.hc_params)
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
        attention_params=v4.attn_params, attention_unquantised_params=v4.attn_unquantised, compressed=comp,
        lookup_table_bytes=c.get("num_hash_layers", 0) * vocab * ffn.fields["experts_per_token"] * 4.0,
        notes=tuple(notes + ignored_notes(c) + v4_notes(c, v4, vocab, ffn.fields["experts_per_token"])),
        **ffn.fields,
    )


def load_architecture(name_or_path: str | os.PathLike) -> Architecture:
    """Architecture for a bundled model name, a checkpoint directory or a path to a HuggingFace config.json;
    a published checkpoint whose module formats apmw knows (:data:`apmw.catalog.models.PUBLISHED_FORMATS`)
    carries them."""
    if isinstance(name_or_path, os.PathLike):
        name_or_path = os.fspath(name_or_path)
    if not isinstance(name_or_path, str):
        raise ApmwError(f"load_architecture takes a bundled model's name (apmw model --list) or a config.json path, "
                        f"got {type(name_or_path).__name__} {name_or_path!r}")
    cfg, source = load_config(name_or_path)
    name = resolve_model_name(name_or_path) if not on_disk(name_or_path) else None
    try:
        arch = architecture_from_config(cfg, name or _name_from_path(name_or_path), source)
    except ConfigError as exc:
        if name is not None:        # a bundled config: its name says which
            raise
        raise type(exc)(f"{local_path(name_or_path)}: {exc}") from None     # the user's file: say where it is
    known = published_format(name_or_path)
    if known is None:
        return arch
    form = known.format
    return replace(arch, checkpoint_format=form, expert_dtype_in_checkpoint=form.weight_dtype,
                   mxfp4_experts=known.mxfp4_experts,
                   notes=arch.notes + (f"{name_or_path.strip()}: attention projections {form.attention_dtype}, output "
                                       f"projection {form.attention_output_dtype} ({form.source})",))


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
