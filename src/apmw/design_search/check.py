"""The best front points settled in the simulator, as ``apmw plan`` does: ranked by the analytic
model, decided by the checked N*."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from apmw.capacity import plan
from apmw.design_search.answer import SearchAnswer
from apmw.design_search.space import settings_text, with_settings
from apmw.errors import ApmwError
from apmw.sim.checked import CHECK_TASKS_PER_POINT, check_plan, why_not_checked
from apmw.spec import Spec, spec_from_dict


def check_front(spec: Spec, answer: SearchAnswer, top: int, tasks_per_point: int = CHECK_TASKS_PER_POINT,
                progress: Callable[[str], None] | None = None) -> SearchAnswer:
    """The ``top`` front points (best agents per MW first) with N* settled in the simulator
    (:func:`apmw.sim.checked.check_plan`); each gets ``checked``: the simulated N*, its interval,
    agents per MW and task p95 there, or the reason it could not be checked."""
    base = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    chosen = {id(p) for p in answer.front()[:top]}
    points = []
    for p in answer.points:
        if id(p) in chosen:
            if progress is not None:
                progress(f"checking {settings_text(p.settings)}")
            p = replace(p, checked=_checked(spec_from_dict(with_settings(base, p.settings), path="search point"),
                                            tasks_per_point))
        points.append(p)
    return SearchAnswer(points=points, pruned=answer.pruned, rows=answer.rows, resumed=answer.resumed,
                        as_specified=answer.as_specified)


def _checked(point_spec: Spec, tasks_per_point: int) -> dict:
    try:
        analytic = plan(point_spec)
        why = why_not_checked(analytic)
        if why:
            return {"not_checked": why}
        d = check_plan(analytic, tasks_per_point=tasks_per_point).to_dict()
    except ApmwError as exc:
        return {"not_checked": str(exc)}
    return {"agents_per_replica": d["agents_per_replica"], "agents_per_replica_interval": d["agents_per_replica_interval"],
            "agents_simulated": [p["agents"] for p in d["check"]["points"]],
            "binding_constraint": d["binding_constraint"], "agents_per_mw": d["agents_per_mw"],
            "cost_per_session_usd": d["cost_per_session_usd"], "task_latency_p95_s": d["task_latency_s"]["p95"],
            "task_latency_p95_interval_s": d["task_latency_p95_interval_s"], "completed_tasks": d["completed_tasks"]}
