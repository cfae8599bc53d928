"""What the Python API's verbs check of the arguments the CLI checks as it parses them: a spec where a path was
given (the CLI takes a path, ``plan`` and ``simulate`` a loaded :class:`apmw.spec.Spec`), a plan where a spec was
given (``check_plan``, ``fleet_day``), an agent count and a seed."""

from __future__ import annotations

from numbers import Integral
from pathlib import Path
from typing import TYPE_CHECKING

from apmw.errors import ApmwError
from apmw.spec import Spec

if TYPE_CHECKING:
    from apmw.capacity.plan import Plan


def require_spec(spec: object, verb: str) -> Spec:
    """``spec`` where it is a :class:`Spec`; else an error saying how to make one."""
    if isinstance(spec, Spec):
        return spec
    hint = (f"load the file first: {verb}(apmw.load_spec({str(spec)!r}), ...)" if isinstance(spec, (str, Path))
            else "load a spec file with apmw.load_spec(path), or build one with apmw.spec.spec_from_dict(document)")
    raise ApmwError(f"{verb} takes a Spec, got {type(spec).__name__}; {hint}")


def check_seed(seed: object) -> int:
    """``seed`` where it is a whole number a spec's ``seed`` may be (0 to 2**63 - 1, as ``--seed``); else an error."""
    if isinstance(seed, bool) or not isinstance(seed, Integral) or not 0 <= int(seed) < 2**63:
        raise ApmwError(f"seed {seed!r}: give a whole number from 0 to {2**63 - 1} (the same seed gives the same run)")
    return int(seed)


def require_plan(result: object, verb: str) -> Plan:
    """``result`` where it is a :class:`apmw.capacity.plan.Plan`; else an error saying how to make one."""
    from apmw.capacity.plan import Plan

    if isinstance(result, Plan):
        return result
    hint = (f"plan it first: {verb}(apmw.plan(spec))" if isinstance(result, Spec)
            else "plan a spec with apmw.plan(apmw.load_spec(path))")
    raise ApmwError(f"{verb} takes a Plan, got {type(result).__name__}; {hint}")


def check_agents(agents: object, most: int, name: str = "agents") -> int:
    """``agents`` where it is a whole number from 1 to ``most`` (``apmw plan --agents``' range); else an error
    naming the argument ``name``."""
    if isinstance(agents, bool) or not isinstance(agents, Integral) or not 1 <= int(agents) <= most:
        flag = " (apmw plan --agents)" if name == "agents" else ""
        raise ApmwError(f"{name} {agents!r}: give a whole number from 1 to {most:,}{flag}")
    return int(agents)
