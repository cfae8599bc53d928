"""`apmw plan --verify`: re-run the analytic answer through the simulator and put the two side by side."""

from __future__ import annotations

from typing import Callable

from apmw.capacity import Plan
from apmw.sim.run import simulate

# Simulate at least an hour, and at least ten mean task times, so that a few hundred tasks finish.
MIN_VERIFY_S = 3600.0
TASKS_PER_VERIFY = 10


def verify_plan(result: Plan, duration_s: float | None = None,
                progress: Callable[[float, float], None] | None = None) -> dict:
    """Simulated vs analytic figures at the plan's agent count (same spec, seed and replica)."""
    p = result.to_dict()
    n = p["agents_per_replica"]
    duration = duration_s or max(MIN_VERIFY_S, TASKS_PER_VERIFY * p["task_latency_s"]["mean"])
    sim = simulate(result.spec, n, duration_s=duration, seed=result.spec.seed, replica=result.replica,
                   progress=progress).to_dict()

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    return {
        "agents": n,
        "simulated_s": sim["simulated_s"],
        "completed_tasks": sim["completed_tasks"],
        "task_latency_s": {"analytic": p["task_latency_s"], "simulated": sim["task_latency_s"]},
        "simulated_task_latency_p95_interval_s": sim["task_latency_p95_interval_s"],
        "simulated_over_analytic": {k: ratio(sim["task_latency_s"][k], p["task_latency_s"][k])
                                    for k in ("mean", "p50", "p95", "p99")},
        "decode_batch_mean": {"analytic": p["decode_batch_mean"], "simulated": sim["decode_batch_mean"]},
        "kv_tokens_resident_mean": {"analytic": p["kv_tokens_resident_mean"],
                                    "simulated": sim["kv_tokens_resident_mean"]},
        "preemptions": sim["preemptions"],
        "prefix_hit_rate": sim["prefix_hit_rate"],
        "simulated_meets_slo": sim["meets_slo"],
        # each SLO the spec sets, at the simulated figures: {limit_s, value_s, met} (apmw.capacity.slo.slo_table)
        "simulated_slo_verdict": sim["slo_verdict"],
        "warnings": sim["warnings"],
    }
