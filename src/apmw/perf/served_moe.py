"""The served MoE ceiling: how fast an engine runs routed-expert GEMMs at prefill sizes, per GPU.

Routed-expert GEMMs as an engine serves them at prefill sizes run no faster than:

* **Hopper** (H100, H200): 150 TFLOP/s per GPU, FITTED on InferenceMAX's H100 gpt-oss vLLM TTFTs
  (``Efficiency.served_moe_flops_per_s``, ``apmw.perf.calibrated.SERVED_MOE_TFLOPS_PER_GPU``;
  ``python bench/accuracy.py --fit``). The measured kernel for that shape runs 411 TFLOP/s at a
  prefill chunk (:data:`REFERENCE_KEY` on :data:`REFERENCE_GPU`): served MoE prefill on Hopper is
  2.7x slower than the kernel measured alone, which is why the ceiling exists.
* **Blackwell** (B200, B300, GB200, GB300): a share of the replica's own measured kernel, its
  engine's table (else vLLM's) on its GPU for its expert shape, expert dtype, expert tensor-parallel
  size and, for MXFP4 experts, activations (:func:`apmw.perf.tables.moe_key`), read at
  :data:`PREFILL_CHUNK_TOKENS` tokens. The share (:data:`BLACKWELL_SHARE`) is FITTED on
  InferenceMAX's B200 gpt-oss vLLM TTFTs, priced with the kernel their script runs (MXFP4 x MXFP8):
  0.365, the best of a grid from 0.25 to 1.5 (median |TTFT error| 5.3 %; 1 gives 19.9 %). It is
  the share the Hopper fit gives of its own kernel (150 of the 411 TFLOP/s that gpt-oss's MXFP4
  kernel, :data:`REFERENCE_KEY` on :data:`REFERENCE_GPU`, runs at a prefill chunk): two
  independent fits agree. Held out: TensorRT-LLM's gpt-oss on B200, NVIDIA's B200/B300 silicon
  rows and the GB200 disaggregated rows (docs/accuracy.md, "What changed in session 23"). An NVFP4
  DeepSeek-R1 kernel on GB200 (TensorRT-LLM, expert TP 1) runs 2,068 TFLOP/s at 8,192 tokens, so
  its served ceiling is 755, where the Hopper figure scaled by the bf16 peak gave 379.

Where no table holds the replica's kernel (a GPU without tables, a shape aiconfigurator did not
measure), the fitted Hopper figure is scaled by the GPU's dense bf16 peak over Hopper's
(ASSUMPTION: served MoE kernels keep pace with it), and ``source`` says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from apmw.arch import Architecture
from apmw.catalog.gpus import GpuSpec, get_gpu
from apmw.errors import UnknownNameError
from apmw.perf.efficiency import HOPPER_BF16_FLOPS
from apmw.perf.tables import BASE_ENGINE, KernelTables, load_tables, moe_key

# vLLM's and SGLang's prefill chunk on large GPUs (max_num_batched_tokens, chunked_prefill_size:
# apmw.perf.serving_policy) and TensorRT-LLM's max_num_tokens: the tokens of a prefill-sized MoE call.
PREFILL_CHUNK_TOKENS = 8192.0
# The kernel the ceiling was fitted on: gpt-oss-120b's routed experts in MXFP4 on one H100, as
# measured in vLLM 0.24.0 (aiconfigurator h100_sxm/moe/vllm/0.24.0/moe_perf.parquet, shipped in
# catalog/data/calibration/h100_sxm.npz).
REFERENCE_GPU = "H100-SXM5-80GB"
REFERENCE_KEY = "moe_mxfp4_2880_2880_4_128_tp1"
# The GPUs of the Hopper generation among those with tables (apmw.perf.tables.CALIBRATED_GPUS); the rest
# are Blackwell.
HOPPER_GPUS = ("H100-SXM5-80GB", "H200-SXM-141GB")
# Served MoE over its measured kernel on Blackwell: FITTED on InferenceMAX's B200 gpt-oss vLLM TTFTs
# (module docstring; ``python bench/accuracy.py --fit``); Hopper's fit is the same share of its kernel.
BLACKWELL_SHARE = 0.365


@dataclass(frozen=True)
class ServedMoeCeiling:
    flops_per_s: float      # per GPU
    source: str


def kernel_flops_per_s(tables: KernelTables, key: str) -> float:
    """A measured MoE table's FLOP rate at :data:`PREFILL_CHUNK_TOKENS` tokens, per GPU: the routed
    tokens' three expert GEMMs (``6 x hidden x expert width x top-k / TP`` FLOPs a token) over the
    interpolated time. The key names the shape: ``moe_<dtype>_<hidden>_<width>_<topk>_<experts>_tp<TP>``."""
    _, _, hidden, width, topk, _, tp = key.split("_")
    flops = PREFILL_CHUNK_TOKENS * 6 * int(hidden) * int(width) * int(topk) / int(tp[2:])
    seconds = float(np.interp(PREFILL_CHUNK_TOKENS, tables["moe_tokens"], tables[key]))
    return flops / seconds


def served_moe_ceiling(fitted_flops_per_s: float, arch: Architecture, gpu: GpuSpec, expert_dtype: str,
                       moe_tp: int, engine: str = BASE_ENGINE, mxfp4_activations: str = "bf16") -> ServedMoeCeiling:
    """The ceiling on ``gpu`` for this replica's routed experts (module docstring)."""
    for tables in _tables_of(gpu, engine):
        key = moe_key(arch, tables, moe_tp, expert_dtype, mxfp4_activations)
        if key is not None:
            return ceiling_from_kernel(fitted_flops_per_s, tables, key)
    return ServedMoeCeiling(fitted_flops_per_s * gpu.bf16_flops / HOPPER_BF16_FLOPS,
                            f"served MoE ceiling {fitted_flops_per_s / 1e12:.0f} TFLOP/s fitted on H100, scaled by "
                            f"{gpu.name}'s bf16 peak (ASSUMPTION: no measured MoE kernel for this shape)")


def ceiling_from_kernel(fitted_flops_per_s: float, tables: KernelTables, key: str) -> ServedMoeCeiling:
    """The ceiling of a replica whose routed experts run the measured kernel ``key`` in ``tables``
    (module docstring); ``fitted_flops_per_s`` is the Hopper fit."""
    if tables.gpu in HOPPER_GPUS:
        return ServedMoeCeiling(fitted_flops_per_s, f"served MoE ceiling {fitted_flops_per_s / 1e12:.0f} TFLOP/s "
                                                    f"(fitted on H100 gpt-oss)")
    rate = kernel_flops_per_s(tables, key)
    ceiling = BLACKWELL_SHARE * rate
    return ServedMoeCeiling(ceiling, f"served MoE ceiling {ceiling / 1e12:.0f} TFLOP/s: {BLACKWELL_SHARE:.2f} of "
                                     f"{tables.engine}'s measured {key} on {tables.gpu} ({rate / 1e12:.0f} TFLOP/s at "
                                     f"{PREFILL_CHUNK_TOKENS:.0f} tokens)")


def _tables_of(gpu: GpuSpec, engine: str) -> list[KernelTables]:
    """The engine's own tables on this GPU, then vLLM's (none for a GPU without tables, or a catalogue
    part with overridden fields: the tables were measured on the stock part)."""
    try:
        if get_gpu(gpu.name) != gpu:
            return []
    except UnknownNameError:
        return []
    found = [t for t in (load_tables(gpu.name, engine), load_tables(gpu.name, BASE_ENGINE)) if t is not None]
    return list({id(t): t for t in found}.values())
