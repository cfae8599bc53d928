"""`apmw report`: one self-contained HTML file a capacity planner can send on."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from apmw.capacity import InfeasibleError, plan, sweep
from apmw.contrast import contrast_row
from apmw.examples import bundled_examples
from apmw.levers import evaluate_levers
from apmw.report import charts
from apmw.report.html import render
from apmw.spec import Spec, load_spec

# Points on the latency and KV curves.
CURVE_POINTS = 40

ASSUMPTIONS = [
    "Task-latency percentiles come from sampled sessions (the spec's seed) with exponential per-call queueing; "
    "engine-level jitter is not in the analytic curve.",
    "Step time is a roofline with named efficiencies (perf/efficiency.py); the 1 ms per-iteration overhead is an "
    "assumption until calibrated.",
    "GPU busy power defaults to TDP and idle to 15% of TDP (catalog/data/SOURCES.md); host power per GPU is from "
    "the DGX H100 datasheet.",
    "Under 'evict' the analytic model assumes the prefix cache lost every evicted context (worst case).",
    "Lever settings that are assumptions (speculative decoding acceptance, summary length) are named in each "
    "lever's description.",
]


def _curve_agents(n_star: int) -> list[int]:
    top = max(2 * n_star, 10)
    return sorted(set(np.unique(np.linspace(1, top, CURVE_POINTS).astype(int)).tolist()) | {n_star})


def build_report(spec: Spec, title: str, progress: Callable[[str], None] | None = None) -> str:
    step = progress or (lambda _: None)
    step("planning")
    base = plan(spec)
    d = base.to_dict()
    agents = _curve_agents(base.agents_per_replica)
    evals = sweep(base, agents)
    step("levers")
    levers = [r.to_dict() for r in evaluate_levers(spec, base, progress=lambda name: step(f"lever {name}"))]
    step("bundled workloads")
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
                                        base.agents_per_replica),
        "kv": charts.kv_curve(agents, [e.kv_bytes_resident_mean / base.replica.step.kv_bytes_per_token for e in evals],
                              [e.kv_bytes_resident_p95 / base.replica.step.kv_bytes_per_token for e in evals],
                              d["kv_tokens_capacity"], base.agents_per_replica),
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
    step("writing")
    return render(f"apmw report: {title}", d, figs, levers, rows,
                  spec.model_dump(mode="json", by_alias=True, exclude_none=True), ASSUMPTIONS)


def write_report(spec_path: Path, out_path: Path, progress: Callable[[str], None] | None = None) -> Path:
    spec = load_spec(spec_path)
    out_path.write_text(build_report(spec, spec_path.stem, progress), encoding="utf-8")
    return out_path
