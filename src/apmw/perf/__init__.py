"""One resolved replica: step time, KV memory, serving policy and power."""

from apmw.perf.efficiency import DEFAULT_EFFICIENCY, Efficiency, efficiency_for_gpu
from apmw.perf.memory import MemoryBudget, memory_budget
from apmw.perf.power import GpuGroup, PowerModel, activity_power_w
from apmw.perf.calibrated import CalibratedStepModel
from apmw.perf.replica import (DoesNotFitError, Replica, benchmark_replica, build_step_model, replica_from_spec,
                               replica_with_step, resolve_gpu)
from apmw.perf.serving_policy import ServingPolicy, resolve_policy
from apmw.perf.roofline import RooflineStepModel
from apmw.perf.step import IterationLoad, RooflineFigures, StepModel

__all__ = ["DEFAULT_EFFICIENCY", "Efficiency", "efficiency_for_gpu", "MemoryBudget", "memory_budget",
           "GpuGroup", "PowerModel", "activity_power_w", "IterationLoad", "StepModel", "RooflineFigures", "RooflineStepModel", "CalibratedStepModel",
           "DoesNotFitError", "Replica", "benchmark_replica", "build_step_model", "replica_from_spec",
           "replica_with_step", "resolve_gpu", "ServingPolicy", "resolve_policy"]
