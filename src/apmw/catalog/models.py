"""Bundled model configs (HuggingFace ``config.json`` copies) and config-file loading.

Bundled files are named ``<org>--<name>.json``; the model name is ``<org>/<name>``.
A user can also pass a path to any ``config.json``. Names resolve case-insensitively
from the full name, the file stem, or the bare name (with or without the ``Meta-``
prefix and ``-Instruct`` suffix), so "Llama-3.1-70B" finds
"meta-llama/Meta-Llama-3.1-70B".

A derived checkpoint (an instruct or chat tune, a quantised re-upload such as
"nvidia/Llama-3.1-8B-Instruct-FP8", another organisation's copy) has its base model's
architecture, so the hub id a user serves also resolves: checkpoint tags are stripped
(:data:`CHECKPOINT_TAGS`), then the organisation. File-system paths never resolve this way
(a directory is read as a checkpoint: its ``config.json``). The weight dtype is not taken
from the name or the config (``--weight-dtype`` says it; :func:`checkpoint_weight_dtype` and
:func:`config_weight_dtype` let the CLI note a mismatch). The source line names the bundled config that was read.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

from apmw.catalog.checkpoint_formats import CheckpointFormat, compressed_tensors_format, quantization_config
from apmw.errors import ConfigError, UnknownNameError

_MODELS_DIR = Path(__file__).parent / "data" / "models"
_BUNDLE_SOURCE = ("bundled HF config.json copy from ai-dynamo/aiconfigurator@095f58a5 "
                  "(Apache-2.0)")
# bundled configs copied from elsewhere than aiconfigurator (catalog/data/SOURCES.md)
_OTHER_SOURCES = {
    "deepseek-ai/DeepSeek-V4-Pro": "bundled HF config.json as published on the model's Hugging Face page (MIT)",
    "deepseek-ai/DeepSeek-V4-Flash": "bundled HF config.json as published on the model's Hugging Face page (MIT)",
}


# Name tags of derived checkpoints that keep the base architecture, with the weight dtype the
# tag names (None: a tune, not a quantisation): instruct / chat / base tunes, and the tags of the
# usual re-uploads (NVIDIA ModelOpt "-FP8" / "-NVFP4", Red Hat / Neural Magic "-FP8-dynamic",
# "-quantized.w8a8" (INT8 W8A8) and "-quantized.w4a16", AWQ and GPTQ (4-bit weights)).
CHECKPOINT_TAGS = {"-instruct": None, "-chat": None, "-base": None, "-hf": None,
                   "-fp8-dynamic": "fp8", "-fp8-block": "fp8", "-fp8": "fp8", "-nvfp4": "fp4", "-fp4": "fp4",
                   "-mxfp4": "fp4", "-quantized.w8a8": "int8", "-quantized.w4a16": "int4", "-w8a8": "int8",
                   "-w4a16": "int4", "-awq": "int4", "-gptq": "int4", "-int4": "int4", "-int8": "int8"}

# Released models whose config.json has the architecture of a bundled one under another name.
# Llama 3.3 70B: vocab 128,256, hidden 8,192, MLP 28,672, 80 layers, 64 heads, 8 KV heads,
# 131,072 positions, as Llama 3.1 70B (oumi-ai/oumi configs/recipes/llama3_3/README.md and
# llama3_1/README.md, Apache-2.0; the NIM accuracy rows assume the same, bench/data/SOURCES.md).
# DeepSeek-R1-0528: DeepSeek-V3-Base's architecture, 671B total / 37B active, as R1 (NVIDIA NIM model
# card, docs.api.nvidia.com/nim/reference/deepseek-ai-deepseek-r1-0528).
SAME_ARCHITECTURE = {"llama-3.3-70b": "meta-llama/Meta-Llama-3.1-70B",
                     "deepseek-r1-0528": "deepseek-ai/DeepSeek-R1"}


@dataclass(frozen=True)
class PublishedFormat:
    """A published quantised checkpoint whose modules keep formats its name does not state."""
    base: str                      # the bundled config whose architecture it keeps
    format: CheckpointFormat
    mxfp4_experts: bool = False    # 4-bit experts in MXFP4 (else NVFP4)


# NVIDIA's "v2" NVFP4 DeepSeek-R1 checkpoints: "compared to nvidia/DeepSeek-R1-0528-FP4, this checkpoint
# additionally quantizes the wo module in attention layers" (model card); ModelOpt's DeepSeek PTQ
# (examples/deepseek/ptq.py) otherwise leaves "*attn*" unquantised, written as BF16 (quantize_to_nvfp4.py), and
# its --enable_wo_quant puts wo in NVFP4. The v1 checkpoints (-FP4, -NVFP4) need no entry: apmw's rule for a
# 4-bit MoE checkpoint keeps all attention in 16 bits (apmw.arch.dtypes.FOUR_BIT_MOE_ATTENTION_DTYPE).
_NVFP4_V2 = CheckpointFormat(
    weight_dtype="fp4", attention_dtype="bf16", attention_output_dtype="fp4", dense_ffn_dtype="fp4",
    source=("NVIDIA model card (huggingface.co/nvidia/DeepSeek-R1-0528-FP4-v2): NVFP4 experts, dense MLPs and wo; "
            "the other attention projections BF16 (TensorRT Model Optimizer examples/deepseek)"))
PUBLISHED_FORMATS = {
    "nvidia/deepseek-r1-0528-fp4-v2": PublishedFormat("deepseek-ai/DeepSeek-R1", _NVFP4_V2),
    "nvidia/deepseek-r1-fp4-v2": PublishedFormat("deepseek-ai/DeepSeek-R1", _NVFP4_V2),
}


def published_format(name: str) -> PublishedFormat | None:
    """The module formats of a published checkpoint apmw knows by name (:data:`PUBLISHED_FORMATS`), or None."""
    return None if on_disk(name) else PUBLISHED_FORMATS.get(name.strip().lower())


@lru_cache(maxsize=1)
def _bundled_files() -> dict[str, Path]:
    """Model name ('org/name') -> bundled JSON path."""
    return {p.stem.replace("--", "/", 1): p for p in sorted(_MODELS_DIR.glob("*.json"))}


def _short_forms(full: str) -> set[str]:
    """Lower-case keys a user may type for one model."""
    stem = full.replace("/", "--", 1)
    bare = full.split("/", 1)[-1]
    forms = {full, stem, bare}
    for form in list(forms):
        forms.add(form.removeprefix("Meta-"))
    for form in list(forms):
        forms.add(form.removesuffix("-Instruct"))
    return {f.lower() for f in forms}


@lru_cache(maxsize=1)
def _lookup() -> dict[str, str]:
    """Lower-case alias -> model name; aliases shared by two models are dropped."""
    owners: dict[str, set[str]] = {}
    for full in _bundled_files():
        for key in _short_forms(full):
            owners.setdefault(key, set()).add(full)
    table = {key: next(iter(names)) for key, names in owners.items() if len(names) == 1}
    table.update({full.lower(): full for full in _bundled_files()})
    return table


def model_names() -> list[str]:
    """Names of the bundled models, e.g. 'meta-llama/Meta-Llama-3.1-70B'."""
    return list(_bundled_files())


def resolve_model_name(name: str) -> str | None:
    """Bundled model name for ``name`` (any accepted form, or a derived checkpoint's), or None."""
    found = _resolve(name)
    return found[0] if found else None


def _resolve(name: str) -> tuple[str, str] | None:
    """(bundled name, why that config stands for ``name``: empty for the model itself), or None."""
    key = name.strip().lower()
    table = _lookup()
    if key in table:
        return table[key], ""
    if key in PUBLISHED_FORMATS:
        return PUBLISHED_FORMATS[key].base, "a derived checkpoint keeps its base model's architecture"
    stripped, _ = _strip_tags(key)
    # derived checkpoints are hub ids ("org/name" or "name"), never file-system paths
    if stripped.startswith((".", "/", "~")) or stripped.count("/") > 1:
        return None
    for form in (stripped, stripped.split("/", 1)[-1]):
        bare = form.split("/", 1)[-1].removeprefix("meta-")
        if form in table:
            return table[form], "a derived checkpoint keeps its base model's architecture"
        if bare in SAME_ARCHITECTURE:
            return SAME_ARCHITECTURE[bare], "its config.json has the same architecture"
    return None


# Tags naming a quantisation method whose bit width another tag may state ("-Int8-GPTQ" as "-GPTQ-Int8"): the
# dtype given is their libraries' default, taken only where no other tag names one.
METHOD_TAGS = ("-awq", "-gptq")


def _strip_tags(key: str) -> tuple[str, str | None]:
    """``key`` without its trailing checkpoint tags, and the weight dtype the tags name (or None): the outermost
    tag that states one, a method's default (:data:`METHOD_TAGS`) only where no tag does."""
    dtype = default = None
    while True:
        tag = next((t for t in CHECKPOINT_TAGS if key.endswith(t)), None)
        if tag is None:
            return key, dtype or default
        key = key[: -len(tag)]
        if tag in METHOD_TAGS:
            default = default or CHECKPOINT_TAGS[tag]
        else:
            dtype = dtype or CHECKPOINT_TAGS[tag]


def _on_disk(path: Path, kind: str) -> bool:
    """Whether ``path`` is a file or directory (``kind``); a name no file system could hold (too
    long, a NUL byte) is simply not one."""
    try:
        return path.is_file() if kind == "file" else path.is_dir() if kind == "dir" else path.exists()
    except (OSError, ValueError):
        return False


def local_path(name: str) -> Path:
    """``name`` as a path, ``~`` expanded where it names a home (``~nobody`` with no such user stays as written)."""
    try:
        return Path(name).expanduser()
    except RuntimeError:
        return Path(name)


def on_disk(name: str) -> bool:
    """Whether ``name`` is an existing file or directory."""
    return _on_disk(local_path(name), "any")


def checkpoint_weight_dtype(name: str) -> str | None:
    """The weight dtype a checkpoint's name states ("...-FP8" -> "fp8"), or None when it states none
    (a bundled name, a tune, a file). apmw takes the dtype from ``--weight-dtype``; callers compare."""
    if on_disk(name):
        return None
    known = published_format(name)
    return known.format.weight_dtype if known else _strip_tags(name.strip().lower())[1]


# quantization_config.quant_method (or ModelOpt's quant_algo) -> the weight dtype apmw prices it as.
# MXFP4 is gpt-oss's: only the experts are 4-bit, as apmw's "fp4" for a MoE checkpoint prices them.
_QUANT_WEIGHT_DTYPES = {"fp8": "fp8", "mxfp4": "fp4", "nvfp4": "fp4", "w4a8_awq": "int4"}
# GPTQ and AWQ store integer weights of quantization_config.bits (4 when unset, their libraries' default).
_INTEGER_METHODS = ("gptq", "awq")
_INTEGER_BITS = {4: "int4", 8: "int8"}
# Every quantization_config.quant_method apmw reads: the ones above, compressed-tensors' schemes
# (apmw.catalog.checkpoint_formats) and ModelOpt's quant_algo; a config naming another is refused.
QUANT_METHODS_READ = frozenset(_QUANT_WEIGHT_DTYPES) | frozenset(_INTEGER_METHODS) | {"compressed-tensors", "modelopt"}


def integer_weight_dtype(q: dict, where: str) -> str | None:
    """The weight dtype of a GPTQ or AWQ ``quantization_config`` (``q``) by its ``bits``, or None for another
    method; bits apmw does not price (2, 3) are refused."""
    if str(q.get("quant_method", "")).lower() not in _INTEGER_METHODS:
        return None
    bits = q.get("bits", q.get("w_bit", 4))
    if isinstance(bits, bool) or not isinstance(bits, int) or bits not in _INTEGER_BITS:
        raise ConfigError(f"{where}: quantization_config {q.get('quant_method')} bits {bits!r} is not one apmw prices "
                          f"(4 or 8); remove quantization_config from a copy of the config and give --weight-dtype")
    return _INTEGER_BITS[bits]


def config_weight_dtype(name_or_path: str) -> str | None:
    """The weight dtype a checkpoint's own config.json stores (its ``quantization_config``: DeepSeek-V3/R1's
    ``fp8``, gpt-oss's ``mxfp4``, Kimi-K2.5's compressed-tensors int4), or None where it states none apmw reads, or where the config is a base
    model's read for a derived checkpoint (whose own format apmw does not hold)."""
    found = None if on_disk(name_or_path) else _resolve(name_or_path)
    if found is not None and found[1]:
        return None
    try:
        cfg, _ = load_config(name_or_path)
    except (ConfigError, UnknownNameError):
        return None
    try:
        q = quantization_config(cfg, name_or_path)
        stated = compressed_tensors_format(q, name_or_path)
    except ConfigError:
        return None         # a config apmw cannot price: the architecture's reading says why
    if stated is not None:
        return stated.weight_dtype
    try:
        integer = integer_weight_dtype(q, name_or_path)
    except ConfigError:
        return None         # as above: the architecture's reading refuses it
    if integer is not None:
        return integer
    method = q.get("quant_algo") if q.get("quant_method") == "modelopt" else q.get("quant_method")
    return _QUANT_WEIGHT_DTYPES.get(str(method).lower()) if method else None


# The KV cache of a checkpoint whose config names no KV format: the model's 16-bit activations.
AUTO_KV_DTYPE = "bf16"


def checkpoint_kv_dtype(name_or_path: str) -> tuple[str, str, bool]:
    """The KV-cache dtype vLLM, SGLang and TensorRT-LLM pick for this checkpoint when none is given (their
    ``auto``), and why: the format its ``quantization_config`` names for the KV cache (compressed-tensors'
    ``kv_cache_scheme``, ModelOpt's ``kv_cache_quant_algo``), else the model's own 16-bit activations (an FP8
    or FP4 weight checkpoint keeps a bf16 KV cache unless it says otherwise). The flag: whether a published
    derivative was read off its base model's config (whose own quantization config apmw does not hold)."""
    cfg, _ = load_config(name_or_path)
    q = quantization_config(cfg, name_or_path)
    scheme, algo = q.get("kv_cache_scheme"), q.get("kv_cache_quant_algo")
    found = _resolve(name_or_path) if not on_disk(name_or_path) else None
    derived = (" (read off its base model's config: the published checkpoint's own quantization config is not "
               "bundled; give the KV dtype it serves if it names one)") if found and found[1] else ""
    if isinstance(scheme, dict):
        bits, kind = scheme.get("num_bits"), str(scheme.get("type", "")).lower()
        known = isinstance(bits, int) and not isinstance(bits, bool)
        dtype = {(8, "float"): "fp8", (8, "int"): "int8", (4, "float"): "fp4"}.get((bits, kind)) if known else None
        if dtype is None:
            raise ConfigError(f"{name_or_path}: quantization_config.kv_cache_scheme {scheme} is a KV format apmw does "
                              "not model; give the KV dtype explicitly")
        return dtype, f"its quantization_config.kv_cache_scheme ({bits}-bit {kind}){derived}", bool(derived)
    if scheme is not None and not isinstance(scheme, dict):
        raise ConfigError(f"{name_or_path}: quantization_config.kv_cache_scheme is {str(scheme)[:60]!r}; "
                          "compressed-tensors writes it as a mapping such as {num_bits: 8, type: float}: fix the "
                          "config.json, or give the KV dtype explicitly")
    if algo is not None and not isinstance(algo, str):
        raise ConfigError(f"{name_or_path}: quantization_config.kv_cache_quant_algo is {str(algo)[:60]!r}; ModelOpt "
                          "writes it as a name such as \"FP8\": fix the config.json, or give the KV dtype explicitly")
    if isinstance(algo, str) and algo:
        dtype = {"fp8": "fp8", "nvfp4": "fp4", "int8": "int8"}.get(algo.lower())
        if dtype is None:
            raise ConfigError(f"{name_or_path}: quantization_config.kv_cache_quant_algo {algo!r} is a KV format apmw "
                              "does not model; give the KV dtype explicitly")
        return dtype, f"its quantization_config.kv_cache_quant_algo ({algo}){derived}", bool(derived)
    return (AUTO_KV_DTYPE, f"'auto': its config names no KV-cache format, so the cache keeps the 16-bit activations"
            f"{derived}", bool(derived))


def load_config(name_or_path: str) -> tuple[dict, str]:
    """Return (config dict, source description) for a file path or a bundled name.

    A path to an existing file wins over a bundled name. Unknown names raise
    UnknownNameError listing the closest bundled names; an empty name is not read as the current folder.
    """
    if not name_or_path.strip():
        raise UnknownNameError("no model named (an empty name): give a bundled name (apmw model --list), a "
                               "config.json or a checkpoint directory")
    path = local_path(name_or_path)
    if _on_disk(path, "any") and not (_on_disk(path, "dir") or _on_disk(path, "file")):
        raise ConfigError(f"{path}: not a regular file (a device, a pipe or a socket); pass a HuggingFace "
                          "config.json file, the checkpoint directory that holds it, or a bundled name")
    if _on_disk(path, "dir"):       # a downloaded checkpoint: its config.json (HF layout)
        if not (path / "config.json").is_file():
            raise ConfigError(f"{path}: a directory without a config.json; pass the checkpoint directory "
                              "that holds config.json, the file itself, or a bundled name")
        path = path / "config.json"
    if _on_disk(path, "file"):
        return _with_side_quantization(_read_json(path), path), f"file {path.resolve()}"
    found = _resolve(name_or_path)
    if found is None:
        raise UnknownNameError(_unknown_message(name_or_path))
    full, why = found
    read_as = f" (read for '{name_or_path.strip()}': {why})" if why else ""
    return _read_json(_bundled_files()[full]), f"{_OTHER_SOURCES.get(full, _BUNDLE_SOURCE)}: {full}{read_as}"


# The quantisation files older AutoGPTQ and AutoAWQ checkpoints keep beside config.json instead of its
# quantization_config, and the method each names (vLLM's get_quant_config reads them the same way).
SIDE_QUANTIZATION_FILES = {"quantize_config.json": "gptq", "quant_config.json": "awq"}


def _with_side_quantization(cfg: dict, path: Path) -> dict:
    """``cfg`` (the config.json at ``path``) with the quantisation its folder's AutoGPTQ/AutoAWQ file states as its
    ``quantization_config`` where it has none of its own: read without it, a 4-bit checkpoint would be priced as bf16."""
    if cfg.get("quantization_config") is not None or path.name != "config.json":
        return cfg
    for name, method in SIDE_QUANTIZATION_FILES.items():
        side = path.parent / name
        if _on_disk(side, "file"):
            q = _read_json(side)
            return {**cfg, "quantization_config": {"quant_method": method, **q}}
    return cfg


# The largest config.json apmw reads: published ones are a few kB (a per-layer quantisation list, tens of kB).
MAX_CONFIG_BYTES = 4 * 2**20


def _read_json(path: Path) -> dict:
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: {size / 2**20:,.0f} MiB, past the {MAX_CONFIG_BYTES // 2**20} MiB a config.json "
                          "can be (published ones are a few kB): is it the weights or another file? Pass the "
                          "model's HuggingFace config.json")
    try:
        data = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=partial(_unique_keys, path))
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"{path}: invalid JSON at line {err.lineno}, column {err.colno}: {err.msg}. "
            "Fix the file so it is a valid HuggingFace config.json."
        ) from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text ({err.reason}); "
                          "pass a HuggingFace config.json file.") from None
    except RecursionError:
        raise ConfigError(f"{path}: JSON nested too deeply to read (lists or objects inside one another thousands "
                          "deep); pass a HuggingFace config.json file.") from None
    except (ValueError, OverflowError) as err:     # a number past Python's limits, such as a 5,000-digit integer
        raise ConfigError(f"{path}: a number in it is too long to read ({str(err).split(';')[0]}); no config.json "
                          "field needs one. Fix the file so it is a valid HuggingFace config.json.") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level is a JSON {type(data).__name__}, expected an "
                          "object; pass a HuggingFace config.json file.")
    return data


def _unique_keys(path: Path, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """One JSON object, refused where it has a key twice (a JSON reader would keep the last one silently)."""
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise ConfigError(f"{path}: key '{key}' appears twice in one JSON object; the file does not say which "
                              "value it means. Keep one and delete the other.")
        data[key] = value
    return data


def _unknown_message(name: str) -> str:
    keys = _lookup()
    close = difflib.get_close_matches(name.strip().lower(), keys, n=8, cutoff=0.4)
    closest = list(dict.fromkeys(keys[k] for k in close))[:3]
    hint = ", ".join(closest) if closest else "none"
    where = f"no file '{name}' exists and it " if name.endswith(".json") else "it "
    return (f"unknown model '{name}': {where}is not a bundled model; closest: {hint}; "
            f"known: {', '.join(model_names())}. Pass a bundled name or a path to a "
            "config.json.")
