"""Build a replica's step model and memory budget from a validated spec."""

from __future__ import annotations

from dataclasses import dataclass, replace

from apmw.arch import Architecture, load_architecture
from apmw.catalog.gpus import GpuSpec, get_gpu
from apmw.errors import ApmwError
from apmw.perf.efficiency import Efficiency, efficiency_for_gpu
from apmw.perf.memory import MemoryBudget, memory_budget
from apmw.perf.calibrated import DEFAULT_ENGINE, CalibratedStepModel, calibration_gap
from apmw.perf.scaled import scaled_step_model
from apmw.perf.step import StepModel
from apmw.spec import GpuOverride, Spec

_GPU_FIELDS = ("hbm_bytes", "hbm_bandwidth_bytes_per_s", "bf16_flops", "fp8_flops", "fp4_flops", "tdp_w",
               "idle_power_w", "busy_power_w", "scaleup_bw_bytes_per_s")


def resolve_gpu(gpu: str | GpuOverride) -> GpuSpec:
    """A catalogue GPU, optionally with fields overridden, or a fully custom GPU."""
    if isinstance(gpu, str):
        return get_gpu(gpu)
    overrides = {f: getattr(gpu, f) for f in _GPU_FIELDS if getattr(gpu, f) is not None}
    if gpu.name is not None:
        return replace(get_gpu(gpu.name), **overrides, source=f"{get_gpu(gpu.name).source}; overridden: "
                       f"{', '.join(sorted(overrides)) or 'nothing'}")
    required = ("hbm_bytes", "hbm_bandwidth_bytes_per_s", "bf16_flops", "tdp_w", "idle_power_w", "busy_power_w",
                "scaleup_bw_bytes_per_s")
    missing = [f for f in required if f not in overrides]
    if missing:
        raise ApmwError(f"hardware.gpu: a custom GPU (no 'name') needs {', '.join(missing)}; "
                        "or give 'name' of a catalogue GPU to start from (apmw model --gpus lists them)")
    return GpuSpec(
        name="custom", vendor="custom",
        hbm_bytes=overrides["hbm_bytes"], hbm_bandwidth_bytes_per_s=overrides["hbm_bandwidth_bytes_per_s"],
        bf16_flops=overrides["bf16_flops"], fp8_flops=overrides.get("fp8_flops"),
        fp4_flops=overrides.get("fp4_flops"), int8_ops=None, tdp_w=overrides["tdp_w"],
        idle_power_w=overrides["idle_power_w"], busy_power_w=overrides["busy_power_w"],
        scaleup_bw_bytes_per_s=overrides["scaleup_bw_bytes_per_s"],
        source="custom GPU from the spec", power_source="custom GPU from the spec",
    )


@dataclass(frozen=True)
class Replica:
    """A model copy on ``g`` GPUs: its step model, memory and power figures."""

    step: StepModel
    memory: MemoryBudget
    gpu_idle_power_w: float
    gpu_busy_power_w: float

    @property
    def kv_capacity_bytes(self) -> float:
        """Unique KV bytes the replica can hold: the pool divided by TP replication."""
        return self.memory.kv_capacity_bytes / self.step.kv_replication

    @property
    def arch(self) -> Architecture:
        return self.step.arch

    @property
    def gpu(self) -> GpuSpec:
        return self.step.gpu

    @property
    def gpus(self) -> int:
        return self.step.gpus


def build_step_model(arch: Architecture, gpu: GpuSpec, gpus: int, weight_dtype: str, kv_dtype: str,
                     efficiency: Efficiency | None = None, engine: str = DEFAULT_ENGINE,
                     calibrated: bool = True, attention_data_parallel: bool = False) -> StepModel:
    """The calibrated step model where measured tables cover the replica, else the roofline.

    Read ``.source`` on the result (``calibrated`` or ``roofline``) to know which.
    ``efficiency`` defaults to the GPU's own measured roofline efficiencies
    (:func:`apmw.perf.efficiency.efficiency_for_gpu`).
    """
    if efficiency is None:
        efficiency = efficiency_for_gpu(gpu.name)
    if calibrated and calibration_gap(arch, gpu, gpus, weight_dtype, kv_dtype) is None:
        return CalibratedStepModel(arch=arch, gpu=gpu, gpus=gpus, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                                   efficiency=efficiency, attention_data_parallel=attention_data_parallel,
                                   engine=engine)
    if calibrated:
        scaled = scaled_step_model(arch, gpu, gpus, weight_dtype, kv_dtype, efficiency, engine,
                                   attention_data_parallel)
        if scaled is not None:
            return scaled
    return StepModel(arch=arch, gpu=gpu, gpus=gpus, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                     efficiency=efficiency, attention_data_parallel=attention_data_parallel)


def replica_from_spec(spec: Spec, efficiency: Efficiency | None = None, calibrated: bool = True) -> Replica:
    """A replica for the spec; its step model is ``calibrated`` where measured tables cover it.

    Pass ``calibrated=False`` to force the roofline (e.g. to compare the two paths).
    """
    arch = load_architecture(spec.model.config)
    gpu = resolve_gpu(spec.hardware.gpu)
    g = spec.hardware.gpus_per_replica
    if arch.num_heads % g and not spec.serving.attention_data_parallel:
        raise ApmwError(
            f"hardware.gpus_per_replica: {g} GPUs do not divide {arch.name}'s {arch.num_heads} attention heads; "
            f"tensor parallelism shards heads evenly, so use a count that divides {arch.num_heads} "
            f"(or serving.attention_data_parallel: true)")
    step = build_step_model(arch, gpu, g, spec.model.weight_dtype, spec.model.kv_dtype, efficiency,
                            engine=spec.serving.engine, calibrated=calibrated,
                            attention_data_parallel=spec.serving.attention_data_parallel)
    mem = memory_budget(gpu.hbm_bytes, g, spec.serving.kv_memory_fraction, step.weight_bytes,
                        spec.serving.workspace_bytes_per_gpu, fraction_of_free=spec.serving.engine == "trtllm")
    if not mem.fits:
        need = step.weight_bytes + g * spec.serving.workspace_bytes_per_gpu
        per_gpu = gpu.hbm_bytes * spec.serving.kv_memory_fraction - spec.serving.workspace_bytes_per_gpu
        min_gpus = int(-(-step.weight_bytes // per_gpu)) + 1 if per_gpu > 0 else None
        raise ApmwError(
            f"{arch.name} does not fit: weights {step.weight_bytes / 1e9:.1f} GB + workspace leave no KV memory "
            f"on {g} x {gpu.name} ({mem.usable_bytes / 1e9:.1f} GB usable, {need / 1e9:.1f} GB needed). "
            f"Use more GPUs per replica (at least {min_gpus}), a smaller weight_dtype, or a larger GPU."
        )
    idle = spec.power.gpu_idle_power_w if spec.power.gpu_idle_power_w is not None else gpu.idle_power_w
    busy = spec.power.gpu_busy_power_w if spec.power.gpu_busy_power_w is not None else gpu.busy_power_w
    return Replica(step=step, memory=mem, gpu_idle_power_w=idle, gpu_busy_power_w=busy)
