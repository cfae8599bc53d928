"""apmw -- agents per megawatt.

Size LLM agent-serving fleets by the task-latency SLO: how many concurrent
closed-loop agent sessions a replica sustains, how many per megawatt, and what
one session costs. The Python API mirrors the CLI::

    from apmw import load_spec, plan
    result = plan(load_spec("examples/coding-agent.yaml"))
    result.to_dict()["agents_per_mw"]
"""

from apmw.arch import load_architecture, summary as architecture_summary
from apmw.capacity import InfeasibleError, Plan, plan
from apmw.errors import ApmwError
from apmw.spec import Spec, SpecError, load_spec

__version__ = "0.1.0"
__all__ = ["ApmwError", "InfeasibleError", "Plan", "Spec", "SpecError", "architecture_summary",
           "load_architecture", "load_spec", "plan"]
