"""The HuggingFace config reader: required fields named when missing, the text model of a
multimodal wrapper, each layer's kind (full, sliding, linear) and the notes on what is ignored."""

from __future__ import annotations

from typing import Any

from apmw.errors import ConfigError

_LAYER_KIND = {"full_attention": "full", "attention": "full",
               "sliding_attention": "sliding", "chunked_attention": "sliding",
               "linear_attention": "linear"}


class Cfg:
    """A text-model config dict that names the model and field when something is missing."""

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
            raise ConfigError(f"{self.name}: '{key}' is {value!r}; it must be positive.")
        return number

    def first(self, keys: tuple[str, ...], default: int = 0) -> int:
        """Value of the first key present (families spell the same field differently): a count, so
        never negative (0 where a family writes 0 for "none")."""
        key = next((k for k in keys if self.data.get(k) is not None), None)
        if key is None:
            return default
        number = self._int(key, self.data[key])
        if number < 0:
            raise ConfigError(f"{self.name}: '{key}' is {self.data[key]!r}; it cannot be negative. "
                              "Fix the value in the config.json.")
        return number

    def positive(self, keys: tuple[str, ...], default: int) -> int:
        """:meth:`first` of a size that must be positive where given (``default`` where none is)."""
        number = self.first(keys, default)
        if number <= 0:
            key = next((k for k in keys if self.data.get(k) is not None), keys[0])
            raise ConfigError(f"{self.name}: '{key}' is {self.data.get(key, number)!r}; it must be positive. "
                              "Fix the value in the config.json.")
        return number

    def _int(self, key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
            raise ConfigError(f"{self.name}: '{key}' is {value!r}; expected a whole number. "
                              "Fix the value in the config.json.")
        return int(value)


def text_config(cfg: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The language-model part of a config; multimodal wrappers nest it in text_config."""
    notes = []
    if "vision_config" in cfg:
        notes.append("vision tower ignored (text model only)")
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        return cfg, notes
    inherited = {k: cfg[k] for k in ("tie_word_embeddings", "torch_dtype", "dtype") if k in cfg}
    return {**inherited, **text}, notes


def layer_kinds(c: Cfg, num_layers: int) -> tuple[list[str], int | None]:
    """Per-layer 'full' | 'sliding' | 'linear', and the window of the sliding layers."""
    types = c.get("layer_types")
    if types is not None:
        return _kinds_from_layer_types(c, types, num_layers), c.get("sliding_window")
    if c.model_type.startswith("llama4") and c.get("attention_chunk_size"):
        return _llama4_kinds(c, num_layers), c.get("attention_chunk_size")
    window = c.get("sliding_window")
    if window and c.get("use_sliding_window", True):
        window = c.positive(("sliding_window",), 0)
        start = c.get("max_window_layers", 0) if "use_sliding_window" in c.data else 0
        return ["sliding" if i >= start else "full" for i in range(num_layers)], window
    return ["full"] * num_layers, None


def _kinds_from_layer_types(c: Cfg, types: list, num_layers: int) -> list[str]:
    if len(types) != num_layers:
        raise ConfigError(f"{c.name}: layer_types has {len(types)} entries but "
                          f"num_hidden_layers is {num_layers}; make them agree.")
    unknown = sorted({t for t in types if t not in _LAYER_KIND})
    if unknown:
        raise ConfigError(f"{c.name}: layer_types has unsupported {unknown}; supported: "
                          f"{sorted(_LAYER_KIND)}.")
    kinds = [_LAYER_KIND[t] for t in types]
    if "sliding" in kinds and not c.get("sliding_window"):
        raise ConfigError(f"{c.name}: layer_types has sliding layers but 'sliding_window' "
                          "is missing; add the window size in tokens.")
    if "sliding" in kinds:
        c.positive(("sliding_window",), 0)
    return kinds


def _llama4_kinds(c: Cfg, num_layers: int) -> list[str]:
    """Llama 4: every 4th layer is global NoPE attention, the rest chunked local.

    Chunked layers attend within their attention_chunk_size block, so their KV never
    exceeds one chunk: modelled as a window of that size (HF Llama4TextConfig
    ``no_rope_layers`` default, interval 4).
    """
    interval = c.get("no_rope_layer_interval", 4)
    rope = c.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(num_layers)]
    return ["sliding" if rope[i] else "full" for i in range(num_layers)]


def ignored_notes(c: Cfg) -> list[str]:
    notes = []
    mtp = c.first(("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules"))
    if mtp:
        notes.append(f"{mtp} multi-token-prediction module(s) not in params (serving.speculative draft: mtp uses them)")
    if c.model_type == "gpt_oss":
        notes.append("attention sinks ignored (one scalar per head)")
    if c.get("index_topk"):
        notes.append(("V4" if c.model_type == "deepseek_v4" else "DSA")
                     + " indexer keys counted in the KV cache at the KV dtype")
    return notes
