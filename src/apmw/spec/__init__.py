"""Validated input: what the user asks apmw to plan. Imports no other apmw module."""

from apmw.spec.distribution import Constant, Distribution, Empirical, Lognormal, parse_distribution
from apmw.spec.load import SpecError, load_spec, spec_from_dict
from apmw.spec.economics import Cost, Fleet, Power
from apmw.spec.model import GpuOverride, Hardware, Model, Slo, Spec, Workload
from apmw.spec.serving import Disaggregation, Parallelism, Serving, Speculative

__all__ = [
    "Constant", "Distribution", "Empirical", "Lognormal", "parse_distribution",
    "SpecError", "load_spec", "spec_from_dict",
    "Cost", "Disaggregation", "Fleet", "GpuOverride", "Hardware", "Model", "Parallelism", "Power", "Serving", "Slo", "Spec", "Speculative", "Workload",
]
