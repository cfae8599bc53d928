"""How dtypes and engines may be written in a spec, and apmw's one spelling of each."""

from __future__ import annotations

from typing import Literal

Dtype = Literal["bf16", "fp16", "fp8", "int8", "fp4", "int4"]

# Other spellings of apmw's dtypes: HF ``torch_dtype``, vLLM ``--dtype`` and
# ``--kv-cache-dtype`` (fp8_e4m3, fp8_e5m2), and the 4-bit block formats (NVFP4, MXFP4).
DTYPE_SPELLINGS = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8",
                   "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "e4m3": "fp8", "e5m2": "fp8", "nvfp4": "fp4",
                   "mxfp4": "fp4", "fp8_block": "fp8", "fp8block": "fp8", "int4_wo": "int4"}
# vLLM's `--kv-cache-dtype auto` follows the model's activation dtype, which is bf16 for most fp8
# checkpoints too: it cannot be read from a weight dtype, so apmw asks for the dtype itself.
AUTO_DTYPE_HINT = ("'auto' depends on the checkpoint: vLLM's follows the model's activation dtype, bf16 even for "
                   "most fp8 checkpoints; say which")
# Other ways engines are written ("vLLM", "TensorRT-LLM", "trtllm-serve"), once case and
# punctuation are dropped.
ENGINE_SPELLINGS = {"tensorrtllm": "trtllm", "trtllmserve": "trtllm", "llamaserver": "llamacpp",
                    "llamacppserver": "llamacpp"}


def dtype_key(dtype: object) -> object:
    """apmw's spelling of a dtype ("bfloat16" -> "bf16"); anything else is returned as given."""
    if not isinstance(dtype, str):
        return dtype
    key = dtype.strip().lower()
    return DTYPE_SPELLINGS.get(key, key)


def dtype_field(dtype: object) -> object:
    """A spec dtype in apmw's spelling; 'auto' is refused with the reason."""
    key = dtype_key(dtype)
    if key == "auto":
        raise ValueError(AUTO_DTYPE_HINT)
    return key


def engine_key(engine: object) -> object:
    """apmw's spelling of an engine ("TensorRT-LLM" -> "trtllm"); anything else is returned as given."""
    if not isinstance(engine, str):
        return engine
    key = "".join(ch for ch in engine.lower() if ch.isalnum())
    return ENGINE_SPELLINGS.get(key, key)
