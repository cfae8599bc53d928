"""One engine iteration of a replica: step time, KV memory, power."""

from apmw.perf.efficiency import DEFAULT_EFFICIENCY, Efficiency, efficiency_for_gpu
from apmw.perf.memory import MemoryBudget, memory_budget
from apmw.perf.power import activity_power_w, gpu_power_w, node_power_w
from apmw.perf.calibrated import CalibratedStepModel
from apmw.perf.replica import Replica, build_step_model, replica_from_spec, resolve_gpu
from apmw.perf.step import IterationLoad, StepModel

__all__ = ["DEFAULT_EFFICIENCY", "Efficiency", "efficiency_for_gpu", "MemoryBudget", "memory_budget", "gpu_power_w", "activity_power_w", "node_power_w", "IterationLoad",
           "StepModel", "CalibratedStepModel", "Replica", "build_step_model", "replica_from_spec",
           "resolve_gpu"]
