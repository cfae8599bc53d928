"""`apmw plan` and `apmw model`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from apmw.cli.common import (app, progress_bar, emit_json as _emit_json, fail as _fail, note, note_checkpoint_dtype, note_context_window, note_gpu_basis,
                              note_draft_memory, note_moe_exchange, note_speculation_loss,
                              note_tensor_parallel_scaleout, out, warn, print_table)
from apmw.errors import ApmwError
from apmw.capacity.search import MAX_AGENTS
from apmw.sim.checked import CALLS_PER_CHECKED_TASK, CHECK_TASKS_PER_POINT
from apmw.spec import SpecError


@app.command()
def plan(
    spec: Path = typer.Argument(..., help="YAML spec (see examples/)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object (fields in the README)"),
    agents: Optional[int] = typer.Option(None, "--agents", min=1, max=MAX_AGENTS,
                                         help="evaluate exactly N agents instead of N*"),
    workload_from: Optional[Path] = typer.Option(
        None, "--workload-from", help="replace the spec's workload by one fitted from this trace (see apmw fit)"),
    trace_format: Optional[str] = typer.Option(None, "--trace-format", help="trace format (default: detected)"),
    verify: bool = typer.Option(False, "--verify", help="also run the simulator at the answer and compare; exit "
                                "code 3 when the simulated run misses the SLO"),
    calibration: Optional[Path] = typer.Option(
        None, "--calibration", help="step-time calibration measured by apmw bench --calibrate FILE"),
    analytic: bool = typer.Option(False, "--analytic", help="answer from the analytic model alone (milliseconds; "
                                  "the default settles N* in the simulator)"),
    check_tasks: Optional[int] = typer.Option(None, "--check-tasks", min=1, max=10_000,
                                              help="tasks simulated per agent count when checking N* (default "
                                              f"{CHECK_TASKS_PER_POINT}; more: a tighter interval, a longer run)"),
) -> None:
    """Size one replica by the task-latency SLO: agents per replica, per MW, cost per session.

    N* comes from the analytic model and is then settled in the simulator (seeded replications
    around it; the answer carries its interval). --analytic skips the simulation; --agents N
    evaluates exactly N agents analytically."""
    from apmw.capacity import InfeasibleError, plan as solve
    from apmw.capacity.benchmark import speculative_figures
    from apmw.capacity.sensitivity import slo_sensitivity
    from apmw.render import check_table, plan_table, verify_table
    from apmw.sim import verify_plan
    from apmw.sim.checked import check_plan, interval_text, why_not_checked
    from apmw.spec import load_spec
    from apmw.traces import fit_trace, read_notes

    fit_notes: list[str] = []
    if trace_format is not None and workload_from is None:
        _fail(f"--trace-format {trace_format} applies to --workload-from TRACE (the trace a workload is fitted "
              "from): give the trace, or leave --trace-format out")
    if check_tasks is not None and (analytic or agents is not None):
        note(f"--check-tasks has no effect with {'--analytic' if analytic else '--agents'}: nothing is checked "
             "in the simulator")
    check_tasks = CHECK_TASKS_PER_POINT if check_tasks is None else check_tasks
    try:
        s = load_spec(spec)
        note_checkpoint_dtype(s.model.config, s.model.weight_dtype, s.model.moe_dtype)
        note_context_window(s.model.config)
        note_gpu_basis(s.hardware.gpu)
        if s.serving.speculative is not None:
            note_draft_memory(s.serving.speculative.draft, s.serving.speculative.draft_model)
        if s.serving.disaggregation is not None:
            from apmw.capacity.disaggregated_benchmark import accuracy_caveat

            note(f"prefill on workers of its own: its TTFT is priced as apmw predict --disagg prices it, and "
                 f"{accuracy_caveat()}")
        if workload_from is not None:
            fitted = fit_trace(workload_from, trace_format)
            fit_notes = read_notes(fitted.summary)
            for line in fit_notes:          # what the fit could not see, before any figure built on it
                note(f"{workload_from}: {line}")
            s = s.model_copy(update={"workload": fitted.workload})
        step = None
        if calibration is not None:
            from apmw.loadgen.calibrate import read_calibration, step_model_from_calibration

            step = step_model_from_calibration(read_calibration(calibration), s)
        result = solve(s, agents=agents, step=step)
        note_speculation_loss(speculative_figures(result.replica))
        note_moe_exchange(result.replica.step)
        note_tensor_parallel_scaleout(result.replica.step)
        if agents is None and result.search.binding_constraint == "agent_limit":
            note(f"N* is at the {MAX_AGENTS:,} agents per replica apmw searches up to: more would still meet the SLO "
                 "and fit the KV memory, so this workload keeps the engine nearly idle (check its tool waits and "
                 "token counts, or give a tighter SLO)")
        settled = None
        if agents is None and not analytic:
            why = why_not_checked(result)
            if why:
                note(f"N* is the analytic model's, not checked in the simulator: {why}")
            else:
                if result.agents_per_replica >= SLOW_CHECK_AGENTS:
                    note(f"settling N* ({result.agents_per_replica:,} agents, analytic) in the simulator: each run of "
                         "this many agents takes minutes, and settling takes several runs; --analytic answers at once, "
                         "--check-tasks N with a smaller N shortens the runs")
                with progress_bar(console=out, disable=as_json) as bar:
                    task = bar.add_task("checking N* in the simulator", total=1.0)
                    settled = check_plan(result, tasks_per_point=check_tasks,
                                         progress=lambda what, done: bar.update(task, description=what,
                                                                                completed=done))
                result = settled.plan
                if None in settled.interval:
                    span = interval_text(settled.interval, [p.agents for p in settled.points])
                    note(f"N*'s 95% interval, {span}, reaches past the agent counts simulated: about "
                         f"{check_tasks:,} tasks ({CALLS_PER_CHECKED_TASK * check_tasks:,}+ calls) a count cannot "
                         f"tell those counts from N*; a larger --check-tasks (now {check_tasks:,}) runs each count "
                         "longer and narrows it")
        checked = None
        if verify:
            with progress_bar(console=out, disable=as_json) as bar:
                task = bar.add_task("simulating", total=1.0)
                checked = verify_plan(result, progress=lambda now, end: bar.update(task, completed=now / end))
        sensitivity = slo_sensitivity(result if settled is None else settled.analytic)
    except InfeasibleError as exc:
        _fail(str(exc), exc.exit_code)
    except (ApmwError, SpecError) as exc:
        _fail(str(exc))
    d = result.to_dict() if settled is None else settled.to_dict()
    d["slo_sensitivity"] = [x.to_dict() for x in sensitivity]
    if workload_from is not None:
        d["workload_from"] = str(workload_from)
        d["workload_fit_notes"] = fit_notes
    if calibration is not None:
        d["calibration"] = str(calibration)
    if checked is not None:
        d["verify"] = checked
    if as_json:
        _emit_json(d)
        _exit_if_simulation_missed(checked)
        return
    title = str(spec) if workload_from is None else f"{spec}, workload fitted from {workload_from}"
    plan_table(out, d, title)
    if settled is not None:
        check_table(out, d)
    if checked is not None:
        verify_table(out, checked)
        for w in checked["warnings"]:
            warn(w)
    _exit_if_simulation_missed(checked)


# From this many agents per replica a simulated check takes minutes a run: plan says so before it starts (on a
# terminal its bar shows the time; into a pipe nothing else would).
SLOW_CHECK_AGENTS = 1_000

# `apmw plan --verify` exits with this code when the simulator misses the SLO at the plan's answer
# (1: bad input, 2: no N meets the SLO).
SIMULATED_SLO_MISSED_EXIT = 3


def _exit_if_simulation_missed(checked: dict | None) -> None:
    if checked is not None and checked["simulated_meets_slo"] is False:
        from apmw.render import missed_slos

        typer.echo(f"apmw plan --verify: the simulator misses the SLO at {checked['agents']} agents "
                   f"({missed_slos(checked['simulated_slo_verdict'])}; exit {SIMULATED_SLO_MISSED_EXIT})", err=True)
        raise typer.Exit(SIMULATED_SLO_MISSED_EXIT)


@app.command()
def model(
    config: Optional[str] = typer.Argument(None, help="path to a HF config.json, or a bundled model name"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    list_models: bool = typer.Option(False, "--list", help="list bundled model names"),
    gpus: bool = typer.Option(False, "--gpus", help="list the GPU catalogue"),
    systems: bool = typer.Option(False, "--systems", help="list the systems catalogue (nodes and racks: "
                                 "scale-up domain, links, all-in power; docs/systems.md)"),
) -> None:
    """Architecture figures from a config.json: parameters, weight bytes, KV bytes per token."""
    from apmw.arch import load_architecture, summary
    from apmw.catalog.gpus import get_gpu, gpu_names
    from apmw.catalog.models import model_names

    listings = [flag for flag, given in (("--list", list_models), ("--gpus", gpus), ("--systems", systems)) if given]
    if len(listings) > 1:
        _fail(f"{', '.join(listings)} given together: each lists one catalogue; give one of them per command")
    if listings and config is not None:
        _fail(f"{listings[0]} lists a catalogue and takes no model, but {config!r} was given: run "
              f"`apmw model {config}` for its figures, or `apmw model {listings[0]}` alone")
    if list_models:
        names = model_names()
        _emit_json({"models": names}) if as_json else out.print("\n".join(names))
        return
    if systems:
        _print_systems(as_json)
        return
    if gpus:
        from apmw.perf.scaled import step_time_basis

        rows = [get_gpu(n) for n in gpu_names()]
        if as_json:
            _emit_json({"gpus": [{**r.__dict__, "step_times": step_time_basis(r.name)} for r in rows]})
            return
        table = Table(title="GPU catalogue")
        for col in ("gpu", "HBM GB", "TB/s", "BF16 TFLOPS", "FP8 TFLOPS", "TDP W", "idle W", "busy W", "step times"):
            table.add_column(col, justify="left" if col in ("gpu", "step times") else "right")
        for r in rows:
            table.add_row(r.name, f"{r.hbm_bytes / 1e9:.0f}", f"{r.hbm_bandwidth_bytes_per_s / 1e12:.2f}",
                          f"{r.bf16_flops / 1e12:.0f}", f"{(r.fp8_flops or 0) / 1e12:.0f}", f"{r.tdp_w:.0f}",
                          f"{r.idle_power_w:.0f}", f"{r.busy_power_w:.0f}", step_time_basis(r.name))
        print_table(table)
        return
    if config is None:
        _fail("give a config.json path or a bundled model name (apmw model --list shows them)")
    try:
        info = summary(load_architecture(config))
    except ApmwError as exc:
        _fail(str(exc))
    if as_json:
        _emit_json(info)
        return
    table = Table(title=f"{info['name']}", show_header=False)
    for key, value in info.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}: {v:,.0f}" if isinstance(v, (int, float)) else f"{k}: {v}" for k, v in value.items())
        elif isinstance(value, float):
            value = f"{value:,.0f}"
        elif isinstance(value, int):
            value = f"{value:,}"
        table.add_row(key, str(value))
    print_table(table)


def _print_systems(as_json: bool) -> None:
    """`apmw model --systems`: the systems catalogue, one row per node or rack type."""
    from dataclasses import asdict

    from apmw.catalog.systems import assumed_figures, list_systems, provisioned_power_w_per_gpu

    rows = list_systems()
    if as_json:
        _emit_json({"systems": [{**asdict(s), "gpus_per_system": s.gpus_per_system,
                                 "provisioned_power_w_per_gpu": provisioned_power_w_per_gpu(s),
                                 "assumed_figures": assumed_figures(s)} for s in rows]})
        return
    table = Table(title="Systems catalogue (sources: apmw model --systems --json, docs/systems.md)")
    for col in ("system", "GPU", "GPUs", "scale-up domain", "scale-up GB/s", "scale-out GB/s", "power kW",
                "kW/GPU", "assumed"):
        table.add_column(col, justify="left" if col in ("system", "GPU", "assumed") else "right")
    for s in rows:
        table.add_row(s.name, s.gpu, f"{s.gpus_per_node} x {s.nodes_per_system}", str(s.scaleup_domain_gpus),
                      f"{s.scaleup_bw_bytes_per_s / 1e9:g}", f"{s.scaleout_bw_bytes_per_s_per_gpu / 1e9:g}",
                      f"{s.power_w / 1e3:g}", f"{provisioned_power_w_per_gpu(s) / 1e3:.2f}",
                      ", ".join(assumed_figures(s)) or "-")
    print_table(table)
