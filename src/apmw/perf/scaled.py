"""Step time on a GPU without measured tables, carried over from one that has them (``roofline``).

The plain roofline (:class:`apmw.perf.roofline.RooflineStepModel`) prices a whole iteration as one
``max(bytes / bandwidth, FLOPs / peak)`` with a handful of global efficiencies. On the
GPUs that do have tables it misses what the calibrated model composes operator by
operator: the per-layer engine overhead, small kernels, CUDA-graph padding, the fp8-KV
attention kernel of each engine. Where it can be checked it is far off. Forced onto H100/H200
(`python bench/accuracy.py --plain-roofline`, docs/accuracy.md), it gives median |TPOT error|
20.8 % and |TTFT error| 43.4 % on the published dense runs, against the calibrated model's
5.1 % and 28.2 %. On InferenceMAX's gpt-oss runs its median signed TPOT error is -18 % (H100)
and -27 % (H200), against +4 % and +5 %.

So a spec-sheet GPU that has a measured relative (``SCALED_FROM``) borrows that relative's
calibrated iteration and scales it, part by part, by the ratio of the two GPUs' rooflines
for the same load:

    t = overhead                                     unscaled: host and launch work
      + all_reduce_ref * comm_roofline / comm_roofline_ref
      + kernels_ref * (mem + compute) / (mem_ref + compute_ref)

where ``mem`` and ``compute`` are :meth:`apmw.perf.step.RooflineFigures.roofline_terms` on each GPU with its own
spec sheet and dtypes, for the rows the GEMMs compute (decode batches padded to a CUDA-graph
size). The measured time splits between the two regimes as the reference's roofline terms
do, and each share scales by its own ratio: a decode iteration (bandwidth-bound) by the
bandwidth ratio, a long prefill by the peak-FLOPs ratio, a mixed one in between. In effect
every iteration keeps the share of the spec sheet it reaches on the measured GPU at that
shape (an efficiency per shape, from the tables), rather than one efficiency for all.
Weights or KV in a format the relative's tables lack (4-bit, int8) are read from its fp8
tables, and the ratio carries the byte and peak-rate difference. The result is tagged
``roofline``: nothing was measured on this GPU.

Checked on held-out runs on B200 and B300 (NVIDIA's silicon runs of MiniMax-M2.5 on vLLM
0.19, InferenceMAX's gpt-oss-120b on vLLM and TensorRT-LLM): docs/accuracy.md, from before those
GPUs had tables of their own; they now scale from H200 only for shapes their own tables lack
(``SCALED_FROM_WHERE_UNCOVERED``), and tests/perf/test_scaled.py checks H200's iteration scaled
to B200 against B200's own measured one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from apmw.arch import Architecture
from apmw.catalog.gpus import GpuSpec, get_gpu
from apmw.errors import UnknownNameError
from apmw.perf.calibrated import CalibratedStepModel, calibration_gap, graph_padded
from apmw.perf.efficiency import Efficiency, efficiency_for_gpu
from apmw.perf.parallelism import Layout
from apmw.perf.step import IterationLoad, RooflineFigures
from apmw.perf.tables import load_tables

# Spec-sheet GPU -> the measured GPU whose calibrated iteration it is scaled from. Only GPUs
# without tables of their own are here (B200, B300, GB200 and GB300 have their own).
# H100-PCIe: the same GH100 die and Hopper kernels as the SXM part, at lower clocks and
# bandwidth. H800: the H100-SXM silicon (same die, clocks, HBM3 at 3.35 TB/s, tensor rates) with
# NVLink cut to 400 GB/s; its kernels take H100's measured times (ratio 1) and its all-reduces
# scale by the scale-up bandwidth ratio (200 / 450 GB/s per direction).
# Not scaled: H20 (a Hopper part whose dense bf16 peak is 15 % of H100's at more bandwidth, so its
# roofline ridge is 37 FLOP/byte against H100's 295: decode batches of a few dozen turn compute-
# bound on H20 where they stream weights on every measured GPU, so no measured iteration splits
# into the shares this scaling assumes; nothing on H20 was measured to check it), A100 (Ampere
# has no fp8 and its own Vidur-measured efficiencies, apmw.perf.efficiency), L40S (GDDR6), AMD
# parts (other kernels and software stack).
SCALED_FROM = {
    "H100-PCIe-80GB": "H100-SXM5-80GB",
    "H800-SXM5-80GB": "H100-SXM5-80GB",
}

# A GPU with its own tables whose tables lack a replica's shape (an MoE shape or TP size measured
# on H200 but not on this GPU: GB200's all-reduce rows stop at TP 4) is scaled from this relative,
# as every Blackwell part was before it had tables: the measured GPU with the same memory
# technology (HBM3e), checked on held-out B200/B300 runs (docs/accuracy.md).
SCALED_FROM_WHERE_UNCOVERED = {
    "B200-SXM-180GB": "H200-SXM-141GB",
    "B300-SXM-288GB": "H200-SXM-141GB",
    "GB200 (per GPU)": "H200-SXM-141GB",
    "GB300 (per GPU)": "H200-SXM-141GB",
}

# Weight and KV formats the tables do not hold, and the measured format read in their place
# (the roofline ratio then carries the byte and peak-rate difference).
_STAND_IN_DTYPE = {"fp4": "fp8", "int4": "fp8", "int8": "fp8"}


def reference_gpu(gpu: GpuSpec) -> GpuSpec | None:
    """The measured GPU a step model on ``gpu`` is scaled from, or None (plain roofline).

    A catalogue GPU with overridden fields scales from its own stock part; a spec-sheet
    GPU from its relative in ``SCALED_FROM``; a custom GPU from nothing.
    """
    try:
        stock = get_gpu(gpu.name)
    except UnknownNameError:
        return None
    if load_tables(stock.name) is not None:
        return stock
    name = SCALED_FROM.get(stock.name)
    return get_gpu(name) if name else None


def step_time_basis(gpu_name: str) -> str:
    """How apmw prices a catalogue GPU's iterations: "calibrated" (its own measured tables),
    "scaled from <GPU>" (a measured relative's, :class:`ScaledStepModel`) or "plain roofline".

    It is the GPU's best case: a model shape the tables do not cover (MLA attention, an unmeasured
    MoE shape) is scaled from ``SCALED_FROM_WHERE_UNCOVERED`` where that relative covers it, else
    priced by the plain roofline, even on a calibrated GPU.
    """
    ref = reference_gpu(get_gpu(gpu_name))
    if ref is None:
        return "plain roofline"
    return "calibrated" if ref.name == gpu_name else f"scaled from {ref.name}"


@dataclass(frozen=True)
class ScaledStepModel(RooflineFigures):
    """The scaled estimator: ``reference``'s measured iteration, scaled to this GPU (module docstring)."""

    reference: CalibratedStepModel | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.reference, CalibratedStepModel):
            raise TypeError("ScaledStepModel needs the measured GPU's CalibratedStepModel as `reference` "
                            "(apmw.perf.scaled.scaled_step_model builds one)")

    @property
    def source(self) -> str:
        return "scaled"

    @property
    def source_detail(self) -> str:
        ref = self.reference
        return (f"scaled: {ref.gpu.name}'s calibrated iteration ({ref.weight_dtype} weights, {ref.kv_dtype} KV, "
                f"{ref.engine}; {ref.curves.source}) scaled to {self.gpu.name} {self.weight_dtype}/{self.kv_dtype} "
                f"by the two spec sheets' roofline ratio per iteration; engine overhead "
                f"{ref.iteration_parts_s(_EMPTY)[0] * 1e3:.2f} ms unscaled"
                + (f"; {self.moe_exchange_source}" if self.moe_exchange_source else ""))

    def reference_load(self, load: IterationLoad) -> IterationLoad:
        """``load`` as the reference sees it: the same tokens, their KV in the reference's format."""
        return replace(load, kv_read_bytes=np.asarray(load.kv_read_bytes, dtype=float)
                       * self.reference.kv_bytes_per_token / self.kv_bytes_per_token)

    def iteration_time_s(self, load: IterationLoad) -> np.ndarray:
        return sum(self.iteration_parts_s(load))

    def iteration_parts_s(self, load: IterationLoad) -> tuple[float, np.ndarray, np.ndarray]:
        """(engine overhead, TP all-reduces, every other kernel): the reference's parts, scaled."""
        ref = self.reference
        ref_load = self.reference_load(load)
        overhead, comm, kernels = ref.iteration_parts_s(ref_load)
        # the rooflines of the rows the GEMMs compute: decode batches padded to a CUDA-graph size
        decode, prefill = np.broadcast_arrays(np.asarray(load.decode_seqs, dtype=float),
                                              np.asarray(load.prefill_tokens, dtype=float))
        padded = np.where(prefill > 0, decode, graph_padded(decode, prefill))
        # (hardware rooflines: the served MoE ceiling is in the reference's measured time already)
        mem, compute = self.roofline_terms(replace(load, decode_seqs=padded))
        ref_mem, ref_compute = ref.roofline_terms(replace(ref_load, decode_seqs=padded))
        # the measured time splits between the two regimes as the reference's roofline terms do, and
        # each share scales by its own ratio: (mem_ref share) * mem / mem_ref + (compute share) *
        # compute / compute_ref, which is (mem + compute) / (mem_ref + compute_ref). The max of the
        # terms instead (the measured time's excess over the roofline carried over) makes the time
        # fall by up to 21 % where the reference is past its roofline knee and this GPU is not
        # (Llama-3.1-70B fp8 prefill on B200 from H200), and a smooth max (p-norm, p = 1.5-8) by
        # 3-13 %; the sum keeps the dips to about 1 % over tests/perf/test_scaled.py's grids, and
        # fits the held-out Blackwell runs better (docs/accuracy.md).
        kernels_ratio = (mem + compute) / np.maximum(ref_mem + ref_compute, 1e-30)
        tokens = decode + prefill
        ref_comm = ref.comm_time_s(tokens)
        comm_ratio = np.divide(self.comm_time_s(tokens), ref_comm, out=np.zeros_like(ref_comm),
                               where=ref_comm > 0)
        return overhead, comm * comm_ratio, kernels * kernels_ratio


_EMPTY = IterationLoad(decode_seqs=1.0, prefill_tokens=0.0, kv_read_bytes=0.0, attention_flops=0.0)


def scaled_step_model(arch: Architecture, gpu: GpuSpec, gpus: int, weight_dtype: str, kv_dtype: str,
                      efficiency: Efficiency, engine: str,
                      layout: Layout | None = None, mxfp4_activations: str = "bf16") -> ScaledStepModel | None:
    """The step model of ``gpu`` scaled from a measured GPU, or None where none covers it (the
    tables hold tensor-parallel replicas only, and no W4A8 MoE kernel scales from a W4A16 one:
    ``mxfp4_activations="mxfp8"`` is never scaled).

    The measured GPU is its own stock part where it has tables (a format they lack, read from
    the fp8 tables), else its relative in ``SCALED_FROM``; then, for a shape its own tables lack,
    ``SCALED_FROM_WHERE_UNCOVERED``.
    """
    if (layout is not None and not layout.is_tensor_parallel) or mxfp4_activations == "mxfp8":
        return None
    refs = [reference_gpu(gpu)]
    try:
        fallback = SCALED_FROM_WHERE_UNCOVERED.get(get_gpu(gpu.name).name)
    except UnknownNameError:
        fallback = None
    if fallback:
        refs.append(get_gpu(fallback))
    weight_options = dict.fromkeys((weight_dtype, _STAND_IN_DTYPE.get(weight_dtype.lower(), weight_dtype)))
    kv_options = dict.fromkeys((kv_dtype, _STAND_IN_DTYPE.get(kv_dtype.lower(), kv_dtype)))
    for ref_gpu in refs:
        if ref_gpu is None:
            continue
        for ref_weight in weight_options:
            for ref_kv in kv_options:
                if calibration_gap(arch, ref_gpu, gpus, ref_weight, ref_kv, engine=engine) is None:
                    ref = CalibratedStepModel(arch=arch, gpu=ref_gpu, gpus=gpus, weight_dtype=ref_weight,
                                              kv_dtype=ref_kv, efficiency=efficiency_for_gpu(ref_gpu.name),
                                              layout=layout, engine=engine)
                    return ScaledStepModel(arch=arch, gpu=gpu, gpus=gpus, weight_dtype=weight_dtype,
                                           kv_dtype=kv_dtype, efficiency=efficiency, layout=layout, reference=ref,
                                           engine=engine)
    return None
