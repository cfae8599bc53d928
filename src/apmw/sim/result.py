"""What a simulation reports, and its stable JSON (``apmw simulate --json``; docs/simulate.md lists the fields)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

import numpy as np
from scipy.stats import binom


def percentiles(values: list[float] | np.ndarray) -> dict[str, float | None]:
    """mean/p50/p95/p99 of a sample (None when it is empty)."""
    if len(values) == 0:
        return {"mean": None, "p50": None, "p95": None, "p99": None}
    v = np.asarray(values, dtype=float)
    p50, p95, p99 = np.quantile(v, [0.5, 0.95, 0.99])
    return {"mean": float(v.mean()), "p50": float(p50), "p95": float(p95), "p99": float(p99)}


# Confidence of the interval reported around a simulated quantile.
INTERVAL_CONFIDENCE = 0.95


def quantile_interval(values: list[float] | np.ndarray, q: float = 0.95,
                      confidence: float = INTERVAL_CONFIDENCE) -> tuple[float, float] | None:
    """A distribution-free confidence interval for the ``q`` quantile of ``values``: the order
    statistics ``x_(l)`` and ``x_(u)`` between which the quantile lies with probability
    ``confidence``, from the number of samples below it being Binomial(n, q) (Hahn and Meeker,
    "Statistical Intervals", 1991, 5.2). It takes the tasks as independent draws; in a closed loop
    neighbouring tasks share the engine's state, so read it as a lower bound on the uncertainty.
    None where the sample is too small to bracket the quantile."""
    n = len(values)
    if n == 0:
        return None
    alpha = 1.0 - confidence
    lo = int(binom.ppf(alpha / 2, n, q))            # P(count below <= lo) >= alpha / 2
    hi = int(binom.ppf(1 - alpha / 2, n, q)) + 1
    if lo < 1 or hi > n:
        return None
    v = np.sort(np.asarray(values, dtype=float))
    return float(v[lo - 1]), float(v[hi - 1])


@cache
def min_tasks_for_p95_interval() -> int:
    """The fewest samples whose p95 :func:`quantile_interval` brackets at INTERVAL_CONFIDENCE (72 at 95 %); worked out
    when a warning first asks, not at import (some 70 binomial quantiles)."""
    return next(n for n in range(1, 10_000) if quantile_interval(np.arange(n)) is not None)

# Near the KV limit the simulated task p95 settled only over about this many tasks. The engine thrashes
# every few hours of simulated time, so a shorter run's p95 swings with whether it caught an episode:
# on coding-agent at 27 agents and the KV-bound deep-research spec at 22, runs of 900-1,000 tasks read
# it 14-26 % below 10,000-task runs, and one of 168 tasks (coding-agent, seed 0: 2,429 s) 41 % above
# the pooled 10,000-task figure of 1,719 s (docs/simulate.md, "The KV-bound regime", long runs).
SETTLED_TASKS_AT_KV_LIMIT = 10_000


@dataclass(frozen=True)
class SimResult:
    """One simulated run of one replica."""

    mode: str                       # "closed_loop" or "open_loop"
    agents: int
    seed: int
    policy: str
    duration_s: float               # the requested run (closed loop: the measurement window ends here)
    warmup_s: float
    simulated_s: float              # simulated time actually covered (including the drain)
    window_s: float                 # length of the measurement window of the time averages
    task_latency: dict
    task_tool_s_mean: float | None  # mean tool wait of the recorded tasks (sampled, not simulated)
    task_output_tokens_mean: float | None
    ttft: dict
    tpot: dict
    completed_tasks: int
    tasks_running: int              # tracked tasks still open when the drain limit was reached
    tasks_started: int
    tasks_ended: int
    tasks_rejected: int
    decode_batch_mean: float
    running_batch_mean: float
    kv_tokens_resident_mean: float
    kv_tokens_capacity: float
    kv_blocks_capacity: int
    kv_blocks_used_max: int
    engine_utilisation: float
    preemptions: int
    prefix_hit_rate: float | None
    prefill_tokens: int
    decode_tokens: int
    generated_tokens: int
    output_tokens_completed: int
    output_tokens_in_flight: int
    spills: int
    rejected_calls: int
    iterations: int
    replica_power_w: float
    energy_j: float                 # IT energy of the replica over the window
    energy_per_task_j: float | None
    sessions_per_s: float | None
    slo_p95_s: float | None
    meets_slo: bool | None
    compute_bound_share: float = 0.0   # compute-bound share of the busy time (drives power)
    slo_failed: tuple = ()           # the SLOs missed (apmw.capacity.slo names), empty when met
    slo_verdict: dict = field(default_factory=dict)   # per SLO set: {limit_s, value_s, met} (capacity.slo.slo_table)
    task_latency_p95_interval_s: tuple[float, float] | None = None   # INTERVAL_CONFIDENCE interval of the p95
    serving_policy: dict = field(default_factory=dict)   # the engine settings simulated (apmw.perf.ServingPolicy)
    timeseries: dict = field(default_factory=dict)
    wall_s: float = 0.0
    # the recorded tasks' latencies and their calls' TTFTs and TPOTs (seconds), for pooling replications
    samples: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    @property
    def warnings(self) -> list[str]:
        """What the reader should know before trusting the figures: a run that recorded no task measured no task
        latency (its SLO verdict is a miss for want of a figure); one that recorded too few tasks to bound their p95
        (:func:`quantile_interval` is None) reads it off its slowest one or two; a run that preempted (the KV pool
        ran short) and recorded fewer than SETTLED_TASKS_AT_KV_LIMIT tasks has a p95 that may be far off."""
        if self.completed_tasks == 0 and self.mode == "closed_loop":
            return [f"no task was recorded at {self.agents:,} agent(s) in the {self.window_s:,.6g} s measurement window "
                    f"(after {self.warmup_s:,.6g} s "
                    "of warm-up): the task latency is not measured, and the SLO verdict says missed for want of it; "
                    "run longer (--duration-s of several task times)"]
        said = []
        if self.task_latency_p95_interval_s is None and self.mode == "closed_loop":
            said.append(f"only {self.completed_tasks:,} task(s) were recorded at {self.agents:,} agent(s): too few to "
                        f"bracket their p95 at 95 % confidence (that takes {min_tasks_for_p95_interval()}), so its SLO "
                        "verdict rests on the slowest one or two; run longer (--duration-s of more task times)")
        if self.preemptions > 0 and self.completed_tasks < SETTLED_TASKS_AT_KV_LIMIT:
            said.append(f"the KV pool ran short at {self.agents:,} agents ({self.preemptions:,} preemptions): there the "
                        "engine thrashes every few hours of simulated time, and runs of fewer than "
                        f"{SETTLED_TASKS_AT_KV_LIMIT:,} tasks have read the task p95 from a quarter below to half above "
                        f"what long runs settle on; this run recorded {self.completed_tasks:,} (run longer, or several "
                        "seeds; docs/simulate.md, \"The KV-bound regime\")")
        return said

    def to_dict(self, timeseries: bool = False) -> dict:
        d = {
            "mode": self.mode, "agents": self.agents, "seed": self.seed, "tool_wait_kv_policy": self.policy,
            "duration_s": self.duration_s, "warmup_s": self.warmup_s, "simulated_s": self.simulated_s,
            "window_s": self.window_s,
            "task_latency_s": self.task_latency,
            "task_latency_p95_interval_s": (None if self.task_latency_p95_interval_s is None
                                            else list(self.task_latency_p95_interval_s)),
            "task_tool_s_mean": self.task_tool_s_mean, "task_output_tokens_mean": self.task_output_tokens_mean,
            "ttft_s": self.ttft, "tpot_s": self.tpot,
            "completed_tasks": self.completed_tasks, "tasks_running": self.tasks_running,
            "tasks_rejected": self.tasks_rejected,
            "decode_batch_mean": self.decode_batch_mean, "running_batch_mean": self.running_batch_mean,
            "kv_tokens_resident_mean": self.kv_tokens_resident_mean, "kv_tokens_capacity": self.kv_tokens_capacity,
            "kv_blocks_capacity": self.kv_blocks_capacity, "kv_blocks_used_max": self.kv_blocks_used_max,
            "engine_utilisation": self.engine_utilisation, "compute_bound_share": self.compute_bound_share,
            "preemptions": self.preemptions, "prefix_hit_rate": self.prefix_hit_rate,
            "prefill_tokens": self.prefill_tokens, "decode_tokens": self.decode_tokens,
            "generated_tokens": self.generated_tokens, "output_tokens_completed": self.output_tokens_completed,
            "output_tokens_in_flight": self.output_tokens_in_flight,
            "retain_spills": self.spills, "rejected_calls": self.rejected_calls,
            "iterations": self.iterations,
            "replica_power_w": self.replica_power_w, "energy_j": self.energy_j,
            "energy_per_task_j": self.energy_per_task_j, "sessions_per_s": self.sessions_per_s,
            "slo_task_latency_p95_s": self.slo_p95_s, "meets_slo": self.meets_slo,
            "slo_failed": list(self.slo_failed), "slo_verdict": self.slo_verdict,
            "serving_policy": self.serving_policy,
            "wall_s": self.wall_s,
            "warnings": self.warnings,
        }
        if timeseries:
            d["timeseries"] = self.timeseries
        return d
