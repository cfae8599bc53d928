"""`apmw report`: one self-contained HTML file a capacity planner can send on."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from apmw.capacity import InfeasibleError, plan, sweep
from apmw.capacity.fleet_day import fleet_day
from apmw.contrast import contrast_row
from apmw.examples import bundled_examples
from apmw.levers import evaluate_levers
from apmw.report import charts
from apmw.report.html import render
from apmw.sim.checked import check_plan, why_not_checked
from apmw.spec import Spec, load_spec

# Points on the latency and KV curves.
CURVE_POINTS = 40
# Shares of a report's time each stage takes, for its progress bar (coding-agent, measured: the check of
# N* about 50 s of 60-75 s, the levers most of the rest).
STAGE_SHARES = {"check": 0.75, "levers": 0.15, "writing": 0.05}

ASSUMPTIONS = [
    "Task-latency percentiles come from sampled sessions (the spec's seed) with exponential per-call queueing; "
    "engine-level jitter, admission waits and preemptions are not in the analytic curve. N* is settled in the "
    "iteration-level simulator as apmw plan does (docs/simulate.md, 'The checked N*'); red points: the pooled "
    "p95 of each agent count it simulated, with its 95% interval. The curves, levers, contrast and the day of "
    "demand use the analytic model.",
    "Step time: calibrated on measured vLLM kernel tables where they cover the model and GPU, else a roofline "
    "with efficiencies measured from the same tables (docs/accuracy.md). The engine's fixed cost per iteration "
    "is a cost per layer on the calibrated path (vLLM's fitted, SGLang's and TensorRT-LLM's assumed) and 1 ms "
    "per iteration, an assumption, on the roofline.",
    "GPU power: idle 15% of TDP, busy TDP (catalog/data/SOURCES.md); memory-bound decode draws a third of the "
    "idle-to-busy range (perf/power.py). Host: 125 W per GPU modelled, 575 W nameplate (DGX H100 datasheet).",
    "Contexts freed at tool waits ('evict', 'ttl') survive in the LRU prefix cache by the characteristic-time "
    "approximation (capacity/prefix_cache.py).",
    "Lever settings that are assumptions (speculative decoding acceptance, summary length, prefill link) are "
    "named in each lever's description.",
]


def _simulated_points(checked: dict) -> list[tuple[int, float, float, float | None]]:
    """The agent counts `apmw plan` simulated to settle N*: (agents, pooled p95, its 95 % interval)."""
    return [(p["agents"], p["task_latency_s"]["p95"], *p["task_latency_p95_interval_s"])
            for p in checked["check"]["points"] if p["task_latency_s"]["p95"] is not None]


def _simulated_per_call(checked: dict, field: str) -> list[tuple[int, float]] | None:
    if "check" not in checked:
        return None
    return [(p["agents"], p[field]) for p in checked["check"]["points"] if p[field] is not None]


def _tpot_limit_s(spec: Spec) -> float | None:
    """The tighter of the TPOT SLO and the output-speed SLO, as seconds per output token."""
    limits = [spec.slo.tpot_p95_s, 1 / spec.slo.output_speed_tokens_per_s if spec.slo.output_speed_tokens_per_s else None]
    present = [x for x in limits if x is not None]
    return min(present) if present else None


def _curve_agents(n_star: int) -> list[int]:
    top = max(2 * n_star, 10)
    return sorted(set(np.unique(np.linspace(1, top, CURVE_POINTS).astype(int)).tolist()) | {n_star})


def build_report(spec: Spec, title: str, progress: Callable[[str, float], None] | None = None,
                 simulated: bool = True, command: str | None = None) -> str:
    """The report's HTML. ``progress(stage, done)`` hears each stage and the share of the work done (the
    simulator's check of N*, when it runs, is most of it: STAGE_SHARES)."""
    step = progress or (lambda _what, _done: None)
    step("planning", 0.0)
    base = plan(spec)
    d = base.to_dict()
    sim_points = None
    if simulated and not why_not_checked(base):    # the headline is the checked N*, as apmw plan prints it
        d = check_plan(base, progress=lambda what, done: step(f"checking N*: {what}", done * STAGE_SHARES["check"])
                       ).to_dict()
        sim_points = _simulated_points(d)
    if spec.fleet.tasks_per_hour is not None:
        step("a day of demand", STAGE_SHARES["check"])
        d["fleet_day"] = fleet_day(base).to_dict()
    agents = _curve_agents(base.agents_per_replica)
    evals = sweep(base, agents)
    step("levers", STAGE_SHARES["check"])
    levers = [r.to_dict() for r in evaluate_levers(spec, base, progress=lambda name: step(
        f"lever {name}", STAGE_SHARES["check"]))]
    step("bundled workloads", STAGE_SHARES["check"] + STAGE_SHARES["levers"])
    rows = [contrast_row(title, base).to_dict()]
    for name, path in bundled_examples().items():
        if name == title:
            continue
        try:
            rows.append(contrast_row(name, plan(load_spec(path))).to_dict())
        except InfeasibleError:
            continue
    econ = d["cost_breakdown_usd"]
    figs = {
        "latency": charts.latency_curve(agents, [e.task_latency_mean_s for e in evals],
                                        [e.task_latency_p95_s for e in evals], spec.slo.task_latency_p95_s,
                                        d["agents_per_replica"], sim_points),
        "ttft": charts.per_call_curve(agents, [e.ttft_p95_s for e in evals], spec.slo.ttft_p95_s,
                                      d["agents_per_replica"], "TTFT", _simulated_per_call(d, "ttft_p95_s")),
        # none where no call outputs a second token: such a workload has no time per output token to plot
        "tpot": None if base.tpot_p95_s is None else charts.per_call_curve(
            agents, [e.tpot_p95_s for e in evals], _tpot_limit_s(spec), d["agents_per_replica"],
            "time per output token", _simulated_per_call(d, "tpot_p95_s")),
        "kv": charts.kv_curve(agents, [e.kv_bytes_resident_mean / base.replica.step.kv_bytes_per_token for e in evals],
                              [e.kv_bytes_resident_p95 / base.replica.step.kv_bytes_per_token for e in evals],
                              d["kv_tokens_capacity"], d["agents_per_replica"]),
        "residence": charts.breakdown(d["residence_breakdown_s"], "s", "task residence at N*"),
        "tornado": charts.tornado(levers),
        "contrast": charts.agents_vs_tokens(rows, title),
        "cost": charts.breakdown({"electricity": econ["electricity"], "GPU time": econ["gpu_time"]}, "USD",
                                 "cost per session"),
        "energy": charts.breakdown({"IT": d["energy_per_session_j"] / 3.6e3,
                                    "facility overhead": (d["facility_energy_per_session_j"]
                                                          - d["energy_per_session_j"]) / 3.6e3},
                                   "Wh", "energy per session"),
    }
    if "fleet_day" in d:
        figs["fleet_day"] = charts.fleet_day_curves(d["fleet_day"]["hours"], d["fleet_day"]["power_cap_mw"])
    step("writing", 1.0 - STAGE_SHARES["writing"])
    return render(f"apmw report: {title}", d, figs, levers, rows,
                  spec.model_dump(mode="json", by_alias=True, exclude_none=True), ASSUMPTIONS, command)


def write_report(spec_path: Path, out_path: Path, progress: Callable[[str, float], None] | None = None,
                 simulated: bool = True) -> Path:
    spec = load_spec(spec_path)
    out_path.write_text(build_report(spec, spec_path.stem, progress, simulated,
                                     f"apmw report {spec_path} -o {out_path}"), encoding="utf-8")
    return out_path
