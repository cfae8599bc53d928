"""Prediction next to measurement: ``apmw plan`` at each measured N, and N* both ways.

The planner is run with ``agents=N`` for every level the bench measured, so each row compares
the same closed loop. Only fields that mean the same on both sides are paired (names as in
``apmw plan --json``). A step model measured from a calibration file
(:mod:`apmw.loadgen.calibrate`) can replace the built-in one.
"""

from __future__ import annotations

from apmw.capacity import InfeasibleError, plan
from apmw.perf import StepModel, replica_from_spec
from apmw.spec import Spec

# (label, path into the plan dict, path into the bench level dict)
PAIRED = (
    ("task latency mean s", ("task_latency_s", "mean"), ("task_latency_s", "mean")),
    ("task latency p50 s", ("task_latency_s", "p50"), ("task_latency_s", "p50")),
    ("task latency p95 s", ("task_latency_s", "p95"), ("task_latency_s", "p95")),
    ("task latency p99 s", ("task_latency_s", "p99"), ("task_latency_s", "p99")),
    ("TTFT p95 s", ("ttft_p95_s",), ("ttft_p95_s",)),
    ("TPOT p95 s", ("tpot_p95_s",), ("tpot_p95_s",)),
    ("time per output token s", ("time_per_output_token_s",), ("time_per_output_token_s",)),
    ("decode batch mean", ("decode_batch_mean",), ("decode_batch_mean",)),
    ("calls per session", ("calls_per_session",), ("calls_per_session",)),
    ("sessions per s", ("sessions_per_s",), ("sessions_per_s",)),
    ("output tokens per s", ("tokens_per_s", "output"), ("tokens_per_s", "output")),
    ("input tokens per s", ("tokens_per_s", "input"), ("tokens_per_s", "input")),
)


def _get(d: dict, path: tuple[str, ...]):
    for k in path:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def compare(spec: Spec, summary: dict, step: StepModel | None = None) -> dict:
    """``{"levels": [{agents, rows: [{field, predicted, measured, ratio}]}], "agents_star": {...}}``."""
    levels = []
    for lv in summary["levels"]:
        predicted = plan(spec, agents=lv["agents"], step=step).to_dict()
        rows = []
        for label, ppath, mpath in PAIRED:
            p, m = _get(predicted, ppath), _get(lv, mpath)
            rows.append({"field": label, "predicted": p, "measured": m,
                         "measured_over_predicted": (m / p) if (p and m is not None) else None})
        levels.append({"agents": lv["agents"], "rows": rows})
    try:
        predicted_star = plan(spec, step=step).agents_per_replica
    except InfeasibleError:
        predicted_star = 0
    # the step model the prediction used: the server's measured one, or the built-in one
    source = (step if step is not None else replica_from_spec(spec).step).source_detail
    return {"levels": levels, "agents_star": {"predicted": predicted_star,
                                              "measured": summary.get("agents_per_replica"),
                                              "measured_range": summary.get("agents_per_replica_range")},
            "step_time_source": source}
