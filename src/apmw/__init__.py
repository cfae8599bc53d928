"""apmw -- agents per megawatt.

Size LLM agent-serving fleets by the task-latency SLO: how many concurrent
closed-loop agent sessions a replica sustains, how many per megawatt, and what
one session costs. The Python API mirrors the CLI::

    from apmw import check_plan, load_spec, plan
    analytic = plan(load_spec("examples/coding-agent.yaml"))   # apmw plan --analytic
    analytic.to_dict()["agents_per_mw"]
    checked = check_plan(analytic)                             # apmw plan: N* settled in the simulator
    checked.to_dict()["agents_per_mw"]                         # the figure apmw plan prints

Names are imported on first use, so that `apmw fit` or `apmw model` do not pay for
numpy/scipy-heavy modules they never touch.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "ApmwError": "apmw.errors",
    "InfeasibleError": "apmw.capacity",
    "Plan": "apmw.capacity",
    "plan": "apmw.capacity",
    "check_plan": "apmw.sim.checked",
    "Spec": "apmw.spec",
    "SpecError": "apmw.spec",
    "load_spec": "apmw.spec",
    "load_architecture": "apmw.arch",
    "predict": "apmw.capacity.benchmark",
    "predict_rate": "apmw.capacity.open_loop",
    "simulate": "apmw.sim",
    "fleet_day": "apmw.capacity.fleet_day",
}
__all__ = [*_LAZY, "architecture_summary"]


def __getattr__(name: str):
    if name == "architecture_summary":
        return importlib.import_module("apmw.arch").summary
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'apmw' has no attribute {name!r}")
