"""The HuggingFace config reader: required fields named when missing, the text model of a
multimodal wrapper, each layer's kind (full, sliding, linear) and the notes on what is ignored."""

from __future__ import annotations

import reprlib
from typing import Any, NoReturn

from apmw.errors import ConfigError

_LAYER_KIND = {"full_attention": "full", "attention": "full",
               "sliding_attention": "sliding", "chunked_attention": "sliding",
               "linear_attention": "linear"}

# The largest whole number a float holds exactly: no model's size comes near it, and past it the float
# arithmetic of bytes and FLOPs loses the value (or overflows).
LARGEST_SIZE = 2 ** 53
# Far more layers than any model has (the deepest published have under 200): apmw builds per-layer lists, so
# a count past it would exhaust memory rather than be read.
MAX_LAYERS = 100_000


def shown(value: Any) -> str:
    """``value`` as a message shows it: its repr, cut short when long (a hostile config's list or string)."""
    try:
        return reprlib.repr(value)
    except (ValueError, RecursionError):     # an int past Python's digit limit; a list nested past the stack
        return f"a {type(value).__name__} too large to show"


class Cfg:
    """A text-model config dict that names the model and field when something is missing or malformed.

    Each field is checked where it is read, by the helper for its kind: :meth:`req` (a required positive
    size), :meth:`first` (a count, never negative), :meth:`positive`, :meth:`optional_positive`,
    :meth:`flag` (true or false), :meth:`int_list`, :meth:`layer_indices` and :meth:`str_list`.
    :meth:`get` returns the raw value, for fields only tested for presence or compared with a constant.
    """

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
            raise ConfigError(f"{self.name}: '{key}' is {shown(value)}; it must be positive. "
                              "Fix the value in the config.json.")
        return number

    def first(self, keys: tuple[str, ...], default: int = 0) -> int:
        """Value of the first key present (families spell the same field differently): a count, so
        never negative (0 where a family writes 0 for "none")."""
        key = next((k for k in keys if self.data.get(k) is not None), None)
        if key is None:
            return default
        number = self._int(key, self.data[key])
        if number < 0:
            raise ConfigError(f"{self.name}: '{key}' is {shown(self.data[key])}; it cannot be negative. "
                              "Fix the value in the config.json.")
        return number

    def alias(self, keys: tuple[str, ...], default: int = 0) -> int:
        """:meth:`first` of one field that families name differently (``num_experts_per_tok`` and
        ``experts_per_token``), refused where two of its names are given with different values: which one an
        engine reads is not known. (:meth:`first` is also a precedence: ``intermediate_size_mlp`` before
        ``intermediate_size``, which Llama-4 gives both of with different meanings.)"""
        number = self.first(keys, default)
        given = [k for k in keys if self.data.get(k) is not None]
        other = next((k for k in given[1:] if self._int(k, self.data[k]) != number), None)
        if other is not None:
            raise ConfigError(f"{self.name}: '{given[0]}' is {shown(self.data[given[0]])} but '{other}', another name "
                              f"for the same field, is {shown(self.data[other])}; keep one of them (or make them "
                              "agree) in the config.json")
        return number

    def positive(self, keys: tuple[str, ...], default: int) -> int:
        """:meth:`first` of a size that must be positive where given (``default`` where none is)."""
        number = self.first(keys, default)
        if number <= 0:
            key = next((k for k in keys if self.data.get(k) is not None), keys[0])
            raise ConfigError(f"{self.name}: '{key}' is {shown(self.data.get(key, number))}; it must be positive. "
                              "Fix the value in the config.json.")
        return number

    def optional_positive(self, key: str) -> int | None:
        """A size that may be left out (None then), else positive."""
        return None if self.data.get(key) is None else self.positive((key,), 0)

    def flag(self, key: str, default: bool = False) -> bool:
        """A true/false field (``default`` where absent): a string such as "false" is refused, not read as true."""
        value = self.get(key, default)
        if not isinstance(value, bool):
            self.refuse(key, value, "true or false")
        return value

    def int_list(self, key: str) -> list[int]:
        """A list of counts (empty where absent), each a whole number, never negative."""
        values = self.get(key, [])
        if not isinstance(values, list):
            self.refuse(key, values, "a list of whole numbers")
        numbers = [self._int(key, v) for v in values]
        if any(n < 0 for n in numbers):
            self.refuse(key, values, "a list of whole numbers, none negative")
        return numbers

    def layer_indices(self, key: str, num_layers: int) -> list[int]:
        """:meth:`int_list` of layer numbers, each one of the model's (0 to num_hidden_layers - 1)."""
        indices = self.int_list(key)
        if any(i >= num_layers for i in indices):
            self.refuse(key, indices, f"layer numbers 0 to {num_layers - 1} (num_hidden_layers is {num_layers})")
        return indices

    def str_list(self, key: str) -> list[str] | None:
        """A list of strings, or None where absent (a lone string is refused, not read as its characters)."""
        values = self.get(key)
        if values is not None and not (isinstance(values, list) and all(isinstance(v, str) for v in values)):
            self.refuse(key, values, "a list of strings")
        return values

    def refuse(self, key: str, value: Any, expected: str) -> NoReturn:
        """Raise the error naming the model, the field, the value seen and what it must be."""
        raise ConfigError(f"{self.name}: '{key}' is {shown(value)}; expected {expected}. "
                          "Fix the value in the config.json.")

    def _int(self, key: str, value: Any) -> int:
        whole = ((isinstance(value, int) and not isinstance(value, bool))
                 or (isinstance(value, float) and value.is_integer()))     # NaN and Infinity are not
        if not whole:
            self.refuse(key, value, "a whole number")
        if abs(value) > LARGEST_SIZE:
            self.refuse(key, value, f"a whole number of at most {LARGEST_SIZE:,} (2**53), far above any model's")
        return int(value)


def text_config(cfg: dict[str, Any], name: str) -> tuple[dict[str, Any], list[str]]:
    """The language-model part of a config; multimodal wrappers nest it in text_config (an object: any
    other value is refused, not read as a text-only config)."""
    notes = []
    if "vision_config" in cfg:
        notes.append("vision tower ignored (text model only)")
    text = cfg.get("text_config")
    if text is None:
        return cfg, notes
    if not isinstance(text, dict):
        raise ConfigError(f"{name}: 'text_config' is {shown(text)}; expected an object (the language model's "
                          "config, as multimodal checkpoints nest it). Fix the value in the config.json.")
    # a text part that names no family is the wrapper's (as apmw.config_fields.refusal reads it)
    inherited = {k: cfg[k] for k in ("model_type", "tie_word_embeddings", "torch_dtype", "dtype") if k in cfg}
    return {**inherited, **text}, notes


def layer_kinds(c: Cfg, num_layers: int) -> tuple[list[str], int | None]:
    """Per-layer 'full' | 'sliding' | 'linear', and the window of the sliding layers."""
    check_layer_count(c, num_layers)
    types = c.str_list("layer_types")
    if types is not None:
        kinds = _kinds_from_layer_types(c, types, num_layers)
        return kinds, _window(c) if "sliding" in kinds else None
    chunk = c.optional_positive("attention_chunk_size") if c.model_type.startswith("llama4") else None
    if chunk:
        return _llama4_kinds(c, num_layers), chunk
    # the switch is read (and so checked) whatever the window says; a disabled window's size and start layer
    # are placeholders in Qwen's configs, and not read
    use = c.flag("use_sliding_window", True)
    if c.get("sliding_window") not in (None, 0) and use:      # null or 0: no window, as HF configs write it
        window = c.positive(("sliding_window",), 0)
        start = c.first(("max_window_layers",)) if "use_sliding_window" in c.data else 0
        return ["sliding" if i >= start else "full" for i in range(num_layers)], window
    return ["full"] * num_layers, None


def check_layer_count(c: Cfg, num_layers: int) -> None:
    """Refuse a layer count past :data:`MAX_LAYERS`, before anything builds a list of that many layers."""
    if num_layers > MAX_LAYERS:
        c.refuse("num_hidden_layers", num_layers, f"at most {MAX_LAYERS:,} layers, far more than any model has")


def _window(c: Cfg) -> int:
    """The sliding layers' window, which layer_types' sliding layers need."""
    if not c.get("sliding_window"):
        given = "is 0" if c.data.get("sliding_window") == 0 else "is missing"
        raise ConfigError(f"{c.name}: layer_types has sliding layers but 'sliding_window' {given}; give the "
                          "window size in tokens.")
    return c.positive(("sliding_window",), 0)


def _kinds_from_layer_types(c: Cfg, types: list[str], num_layers: int) -> list[str]:
    if len(types) != num_layers:
        raise ConfigError(f"{c.name}: layer_types has {len(types)} entries but "
                          f"num_hidden_layers is {num_layers}; make them agree.")
    unknown = sorted({t for t in types if t not in _LAYER_KIND})
    if unknown:
        raise ConfigError(f"{c.name}: layer_types has unsupported {shown(unknown)}; supported: "
                          f"{sorted(_LAYER_KIND)}.")
    return [_LAYER_KIND[t] for t in types]


def _llama4_kinds(c: Cfg, num_layers: int) -> list[str]:
    """Llama 4: every 4th layer is global NoPE attention, the rest chunked local.

    Chunked layers attend within their attention_chunk_size block, so their KV never
    exceeds one chunk: modelled as a window of that size (HF Llama4TextConfig
    ``no_rope_layers`` default, interval 4). ``no_rope_layers`` has a 1 for each RoPE
    (chunked) layer and a 0 for each NoPE (global) one, at least one per layer.
    """
    rope = c.int_list("no_rope_layers")
    if not rope:
        interval = c.positive(("no_rope_layer_interval",), 4)
        rope = [int((i + 1) % interval != 0) for i in range(num_layers)]
    if len(rope) < num_layers or any(r > 1 for r in rope):
        c.refuse("no_rope_layers", rope, f"a 0 or 1 for each of the {num_layers} layers (1: RoPE, chunked)")
    return ["sliding" if rope[i] else "full" for i in range(num_layers)]


def ignored_notes(c: Cfg) -> list[str]:
    notes = []
    mtp = c.alias(("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules"))
    if mtp:
        notes.append(f"{mtp} multi-token-prediction module(s) not in params (serving.speculative draft: mtp uses them)")
    if c.model_type == "gpt_oss":
        notes.append("attention sinks ignored (one scalar per head)")
    if c.get("index_topk") is not None:
        notes.append(("V4" if c.model_type == "deepseek_v4" else "DSA")
                     + " indexer keys counted in the KV cache at the KV dtype")
    if c.get("max_position_embeddings") is None:
        notes.append(UNKNOWN_WINDOW)
    return notes


# Said where a config gives no context window: apmw checks prompts against max_position_embeddings.
UNKNOWN_WINDOW = ("no max_position_embeddings: the context window is unknown, so prompts longer than the model "
                  "serves are neither refused nor warned about")
