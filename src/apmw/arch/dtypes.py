"""Dtypes: apmw's dtype names and the bytes a weight or a KV-cache element takes stored in each.

The nominal bytes per element, the stored bytes with block scales (weights, KV cache), the
parameters kept in bf16 whatever the weight dtype, and HuggingFace's torch dtype spellings.
"""

from __future__ import annotations

from typing import Any

from apmw.errors import ConfigError, UnknownNameError
from apmw.spec.spellings import AUTO_DTYPE_HINT, dtype_key

# Nominal bytes per element.
DTYPE_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "fp4": 0.5, "int4": 0.5}

# Stored bytes per weight including block scales. 4-bit formats carry a scale per block:
# MXFP4 (OCP MX v1.0, gpt-oss's format) has one 8-bit E8M0 scale per 32 values ->
# 4.25 bits; int4 AWQ/GPTQ with group size 128 keeps a 16-bit scale and zero point per
# group -> 4.25 bits. FP8 block scales (one fp32 per 128x128 block, DeepSeek-V3) add
# 0.02 % and are ignored.
WEIGHT_STORAGE_BYTES = {**DTYPE_BYTES, "fp4": 4.25 / 8, "int4": 4.25 / 8}

# Stored bytes per KV element. FP4 KV cache is NVFP4 (one FP8 scale per 16 values ->
# 4.5 bits, NVIDIA TensorRT Model Optimizer); int4 KV is treated the same.
KV_STORAGE_BYTES = {**DTYPE_BYTES, "fp4": 4.5 / 8, "int4": 4.5 / 8}

# Parameters that stay in bf16 when the weights are quantised: embeddings, lm_head,
# norms and MoE routers. This is what the FP8 DeepSeek/MiniMax checkpoints and the MXFP4
# gpt-oss checkpoints do (their ``modules_to_not_convert`` / unquantised tensors).
UNQUANTISED_BYTES = 2.0
# ... and the kernels those 16-bit GEMMs run beside 4-bit experts (Architecture.unquantised_gemm_dtype).
UNQUANTISED_GEMM_DTYPE = "bf16"

# The attention projections of a checkpoint that quantises a MoE model's weights to 4 bits: kept in 16 bits.
# Every published 4-bit MoE recipe apmw knows does so: gpt-oss's MXFP4 checkpoint (its config.json's
# quantization_config.modules_to_not_convert lists model.layers.*.self_attn), NVIDIA ModelOpt's NVFP4
# DeepSeek-V3/R1 (its examples/deepseek/ptq.py disables the "*attn*" quantizers; quantize_to_nvfp4.py writes
# the unquantised layers dequantised to BF16), AMD's MXFP4 DeepSeek-R1 (routed and shared experts only).
# ASSUMPTION for a 4-bit MoE priced without a checkpoint that says otherwise (Architecture.part_dtypes; a
# checkpoint whose config says, such as Kimi-K2.5's compressed-tensors ignore list, is priced as it says:
# apmw.catalog.checkpoint_formats). The rule covers the attention projections only ("attention_params": for a
# hybrid such as Qwen3.5 its linear-attention projections too): shared experts and dense MLPs are priced in the
# 4-bit weight dtype, as ModelOpt's DeepSeek checkpoints store them. Bytes and GEMM rates follow these parts
# on the roofline and in the calibrated path (apmw.perf.calibrated._dense_gemm_dtype, _ffn_gemm_dtype), which
# times every attention projection, the output projection included, in the attention projections' dtype.
FOUR_BIT_MOE_ATTENTION_DTYPE = "bf16"
FOUR_BIT_DTYPES = ("fp4", "int4")

# torch's dtype names as configs write them (torch.float64's aliases included: a config may store its SSM state
# in any of these)
_HF_DTYPE_BYTES = {"float64": 8.0, "double": 8.0, "float32": 4.0, "float": 4.0, "fp32": 4.0, "float16": 2.0,
                   "half": 2.0, "fp16": 2.0, "bfloat16": 2.0, "bf16": 2.0, "float8_e4m3fn": 1.0,
                   "float8_e5m2": 1.0, "int8": 1.0, "uint8": 1.0}


def canonical_dtype(dtype: str, what: str) -> str:
    """apmw's name for ``dtype`` ("bfloat16" -> "bf16", apmw.spec.spellings.DTYPE_SPELLINGS); a clear
    error for unknown ones."""
    key = str(dtype_key(dtype))
    if key in DTYPE_BYTES:
        return key
    hint = f" ({AUTO_DTYPE_HINT})" if key == "auto" else ""
    raise UnknownNameError(f"unknown {what} dtype '{dtype}'; use one of: {', '.join(DTYPE_BYTES)}{hint}")


def _storage(table: dict[str, float], dtype: str, what: str) -> float:
    try:
        return table[dtype.lower()]
    except KeyError:
        raise UnknownNameError(f"unknown {what} dtype '{dtype}'; use one of: "
                               + ", ".join(table)) from None


def weight_storage_bytes(dtype: str) -> float:
    """Bytes one weight parameter takes stored as ``dtype`` (block scales included)."""
    return _storage(WEIGHT_STORAGE_BYTES, dtype, "weight")


def kv_storage_bytes(dtype: str) -> float:
    """Bytes one KV-cache element takes stored as ``dtype`` (block scales included)."""
    return _storage(KV_STORAGE_BYTES, dtype, "KV-cache")


def hf_dtype_bytes(name: Any, field: str, where: str) -> float:
    """Bytes per element of a HuggingFace torch dtype name ("torch.bfloat16", "float32") that ``field`` of the
    config ``where`` gives; a name not in the table is refused, never priced at a guess."""
    key = str(name).lower().removeprefix("torch.")
    if key not in _HF_DTYPE_BYTES:
        raise ConfigError(f"{where}: '{field}' is {name!r}, not a dtype apmw knows; use one of: "
                          f"{', '.join(_HF_DTYPE_BYTES)}. Fix the value in the config.json.")
    return _HF_DTYPE_BYTES[key]
