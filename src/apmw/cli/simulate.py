"""`apmw simulate`: the iteration-level simulator of one replica driven by closed-loop agents."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import typer
from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from apmw.cli.common import (app, progress_bar, emit_json, err, fail, note, note_checkpoint_dtype, note_context_window, note_gpu_basis, out, parse_sweep,
                             print_table, warn)
from apmw.errors import ApmwError
from apmw.spec import SpecError


# `--agents-sweep auto`: this many points from AUTO_LOW to AUTO_HIGH times the plan's N*.
AUTO_POINTS, AUTO_LOW, AUTO_HIGH = 7, 0.5, 1.5


def auto_sweep(spec) -> list[int]:
    """Agent counts around the analytic N* (apmw plan), where the simulated knee should be."""
    from apmw.capacity import InfeasibleError, plan

    try:
        n_star = plan(spec).agents_per_replica
    except InfeasibleError:
        n_star = 1
    lo, hi = max(1, int(AUTO_LOW * n_star)), max(2, int(round(AUTO_HIGH * n_star)))
    return sorted(set(int(round(x)) for x in np.linspace(lo, hi, AUTO_POINTS)))


def _fmt(v) -> str:
    return "-" if v is None else f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"


def _interval(ci: list | None, tasks: int) -> str:
    if ci is None:
        return f"too few tasks ({tasks}) to bracket the p95"
    return f"{_fmt(ci[0])} - {_fmt(ci[1])} s from {tasks:,} tasks"


def _verdict(d: dict) -> str:
    """Each SLO the spec sets, its simulated figure and whether it holds (the plan table's wording)."""
    if d["meets_slo"] is None:
        return "no SLO (open loop)"
    from apmw.render import slo_line

    return slo_line(d["slo_verdict"])


def _kv_verdict(d: dict) -> str:
    """Whether the KV pool held every running call: a pool that ran short preempted (recompute)."""
    peak = f"peak {d['kv_blocks_used_max']:,} of {d['kv_blocks_capacity']:,} blocks"
    if d["preemptions"] == 0:
        return f"[green]fits[/] ({peak}, no preemption)"
    return f"[bold red]RAN SHORT[/]: {d['preemptions']:,} preemptions ({peak})"


def _table(d: dict, title: str) -> Table:
    t = Table(title=title, show_header=False)
    lat = d["task_latency_s"]
    rows = [
        ("agents", f"{d['agents']}"), ("simulated s (window)", f"{d['simulated_s']:,.0f} ({d['window_s']:,.0f})"),
        ("completed tasks", f"{d['completed_tasks']} ({d['tasks_running']} still running)"),
        ("task latency s mean / p50 / p95 / p99", " / ".join(_fmt(lat[k]) for k in ("mean", "p50", "p95", "p99"))),
        ("task p95, 95% interval", _interval(d["task_latency_p95_interval_s"], d["completed_tasks"])),
        ("TTFT s p50 / p95 / p99", " / ".join(_fmt(d["ttft_s"][k]) for k in ("p50", "p95", "p99"))),
        ("TPOT s p50 / p95 / p99", " / ".join(_fmt(d["tpot_s"][k]) for k in ("p50", "p95", "p99"))),
        ("decode batch mean", _fmt(d["decode_batch_mean"])),
        ("KV tokens resident mean / capacity", f"{d['kv_tokens_resident_mean']:,.0f} / {d['kv_tokens_capacity']:,.0f}"),
        ("preemptions", f"{d['preemptions']}"), ("prefix hit rate", _fmt(d["prefix_hit_rate"])),
        ("engine utilisation", _fmt(d["engine_utilisation"])),
        ("replica power W / energy per task J", f"{d['replica_power_w']:,.0f} / {_fmt(d['energy_per_task_j'])}"),
        ("SLO", _verdict(d)),
        ("KV pool", _kv_verdict(d)),
    ]
    for k, v in rows:
        t.add_row(k, v)
    return t


def _replayed(spec, trace: Path, fmt: str | None):
    """The spec with the trace's shared system prompt, the trace's sessions as simulator tasks, and what reading
    it skipped or could not see (said on stderr here, and kept for the JSON's ``trace_notes``).

    A recorded call whose prompt shrank (the agent trimmed its context) is replayed as
    growing context instead: the simulator's tasks only grow (stated in docs/simulate.md).
    """
    from apmw.loadgen.replay import load_trace
    from apmw.perf import replica_from_spec
    from apmw.sim import TaskShape
    from apmw.capacity.plan import MAX_PAST_WINDOW_SHARE
    from apmw.sim.run import past_window_share

    recorded, system, info = load_trace(trace, fmt)
    for line in info["notes"]:          # what was skipped or could not be read, before any figure built on it
        note(f"{trace}: {line}")
    tasks = []
    for t in recorded:
        new, outs, waits = [], [], []
        for step in t.steps:
            for k, call in enumerate(step.calls):
                new.append(call.new_tokens)
                outs.append(call.output_tokens)
                waits.append(step.tool_wait_s if k == len(step.calls) - 1 else 0.0)
        tasks.append(TaskShape(new_input_tokens=new, output_tokens=outs, wait_after_s=waits))
    workload = spec.workload.model_copy(update={"system_prompt_tokens": system})
    notes = list(info["notes"])
    window = replica_from_spec(spec).arch.max_context_tokens
    share, past = past_window_share(tasks, system, window) if window else (0.0, 0)
    if past and share <= MAX_PAST_WINDOW_SHARE:         # more are refused by the simulator, which says so
        notes.append(f"{past:,} replayed call(s) ({share:.2%}) hold more tokens (prompt and output) than the model's "
                     f"context window of {window:,}: an engine would refuse them; the simulator serves them")
        note(f"{trace}: {notes[-1]}")
    return spec.model_copy(update={"workload": workload}), tasks, notes


@app.command()
def simulate(
    spec: Path = typer.Argument(..., help="YAML spec (see examples/)"),
    agents: Optional[int] = typer.Option(None, "--agents", min=1, help="closed-loop agents on the replica"),
    duration_s: float = typer.Option(3600.0, "--duration-s", help="simulated seconds (measurement window ends here)"),
    seed: Optional[int] = typer.Option(None, "--seed", min=0, max=2**63 - 1,
                                       help="random seed (default: the spec's seed)"),
    warmup_s: Optional[float] = typer.Option(None, "--warmup-s", help="discarded start (default 20% of the run)"),
    agents_sweep: Optional[str] = typer.Option(None, "--agents-sweep",
                                               help="a:b[:step] (step 1 left out), or auto (0.5x..1.5x the plan's "
                                                    "N*): simulate each N"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object (fields in docs/simulate.md)"),
    timeseries: bool = typer.Option(False, "--timeseries", help="include decode batch and KV over time in --json"),
    reference: bool = typer.Option(False, "--reference", help="plain iteration-by-iteration loop (slow; checks)"),
    start_together: bool = typer.Option(False, "--start-together",
                                        help="start every agent at time 0, as a benchmark client does "
                                             "(default: spread over the warm-up)"),
    trace: Optional[Path] = typer.Option(None, "--trace", help="replay the sessions of this trace (any format "
                                         "apmw fit reads) instead of sampling the spec's workload"),
    trace_format: Optional[str] = typer.Option(None, "--trace-format", help="trace format (default: detected)"),
) -> None:
    """Simulate one replica iteration by iteration under closed-loop agents: latency tails, KV, preemption."""
    from apmw.sim import simulate as run, sweep
    from apmw.sim.run import MAX_AGENTS, MAX_SWEEP_POINTS
    from apmw.spec import load_spec

    if (agents is None) == (agents_sweep is None):
        fail("give exactly one of --agents N or --agents-sweep a:b[:step]")
    if trace_format is not None and trace is None:
        fail(f"--trace-format {trace_format} applies to --trace TRACE (the trace replayed): give the trace, or leave "
             "the format out")
    if timeseries and not as_json:
        fail("--timeseries adds the decode batch and KV over time to --json: add --json, or leave --timeseries out")
    if timeseries and agents_sweep is not None:
        fail("--timeseries applies to one run (--agents N), not to --agents-sweep: leave it out")
    try:
        s = load_spec(spec)
        note_checkpoint_dtype(s.model.config, s.model.weight_dtype, s.model.moe_dtype)
        note_context_window(s.model.config)
        note_gpu_basis(s.hardware.gpu)
        kw = dict(warmup_s=warmup_s, fast=not reference, start_together=start_together)
        trace_notes = None
        if trace is not None:
            s, kw["tasks"], trace_notes = _replayed(s, trace, trace_format)
        with progress_bar(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                          TimeElapsedColumn(), console=err) as bar:
            task = bar.add_task("simulating", total=duration_s)

            def tick(now: float, end: float, n: int | None = None) -> None:
                bar.update(task, completed=min(now, end), description=f"simulating N={n or agents}")

            if agents_sweep is None:
                result = run(s, agents, duration_s, seed, progress=tick, **kw)
            else:
                counts = (auto_sweep(s) if agents_sweep.strip().lower() == "auto"
                          else parse_sweep(agents_sweep, MAX_AGENTS, MAX_SWEEP_POINTS, also="auto"))
                result = sweep(s, counts, duration_s, seed,
                               progress=lambda n, now, end: tick(now, end, n), **kw)
    except (ApmwError, SpecError) as exc:
        fail(str(exc))
    if agents_sweep is None:
        d = result.to_dict(timeseries=timeseries)
        if trace_notes is not None:
            d["trace_notes"] = trace_notes
        emit_json(d) if as_json else print_table(_table(d, f"apmw simulate {spec}"))
        for w in d["warnings"]:
            warn(w)
        return
    d = result.to_dict()
    if trace_notes is not None:
        d["trace_notes"] = trace_notes
    if as_json:
        emit_json(d)
        return
    t = Table(title=f"latency vs concurrency: {spec} (SLO p95 {d['slo_task_latency_p95_s']:g} s)")
    for col in ("agents", "mean s", "p95 s", "p99 s", "decode batch", "KV tokens", "preemptions", "meets SLO"):
        t.add_column(col, justify="right")
    for p in d["curve"]:
        lat = p["task_latency_s"]
        mark = " <- knee" if p["agents"] == d["knee_agents"] else ""
        # which SLO a row misses: a row within the task p95 may miss the TTFT or per-token SLO the title leaves out
        verdict = "yes" if p["meets_slo"] else f"no: {', '.join(p['slo_failed'])}" if p["slo_failed"] else "no"
        t.add_row(f"{p['agents']}{mark}", _fmt(lat["mean"]), _fmt(lat["p95"]), _fmt(lat["p99"]),
                  _fmt(p["decode_batch_mean"]), f"{p['kv_tokens_resident_mean']:,.0f}", f"{p['preemptions']}",
                  verdict)
    print_table(t)
    from apmw.sim.run import KNEE_INFLATION

    knee = d["knee_agents"]
    out.print(f"simulated N* (largest N meeting the SLO): {d['agents_per_replica']}; knee: "
              + (f"{knee}" if knee is not None else f"none (no N's mean task latency is {KNEE_INFLATION:.0%} above the first N's)"))
    for w in (w for p in d["curve"] for w in p["warnings"]):
        warn(w)
