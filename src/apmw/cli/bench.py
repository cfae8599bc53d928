"""`apmw bench`: closed-loop agent load test against an OpenAI-compatible endpoint."""

from __future__ import annotations

import asyncio
import math
import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich import box
from rich.table import Table

from apmw.cli.common import (app, emit_json, err, fail, file_path, files_read_by, out, output_path, parse_sweep,
                             print_table, warn)
from apmw.errors import ApmwError
from apmw.loadgen.results import knee_text
from apmw.spec import SpecError


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def _level_table(summary: dict, title: str) -> Table:
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("N", "tasks", "failed", "p50 s", "p95 s", "p99 s", "TTFT95 ms", "TPOT95 ms", "tasks/s", "batch",
                "errors", "SLO"):
        t.add_column(col, justify="right")

    def ms(x):
        return None if x is None else x * 1e3

    for lv in summary["levels"]:
        lat = lv["task_latency_s"]
        verdict = {True: "[green]met[/]", False: "[red]missed[/]", None: "-"}[lv["meets_slo"]]
        t.add_row(str(lv["agents"]), str(lv["completed_tasks"]), str(lv["failed_tasks"]), _fmt(lat["p50"]),
                  _fmt(lat["p95"]), _fmt(lat["p99"]), _fmt(ms(lv["ttft_p95_s"])), _fmt(ms(lv["tpot_p95_s"])),
                  _fmt(lv["sessions_per_s"]), _fmt(lv["decode_batch_mean"]), str(lv["errors"]), verdict)
    return t


def _compare_tables(cmp: dict) -> list[Table]:
    tables = []
    for lv in cmp["levels"]:
        t = Table(title=f"predicted (apmw plan) vs measured at {lv['agents']} agents", title_justify="left")
        for col in ("", "predicted", "measured", "measured/predicted"):
            t.add_column(col, justify="left" if not col else "right")
        for r in lv["rows"]:
            t.add_row(r["field"], _fmt(r["predicted"]), _fmt(r["measured"]), _fmt(r["measured_over_predicted"]))
        tables.append(t)
    return tables


@app.command()
def bench(
    ctx: typer.Context,
    spec: Optional[Path] = typer.Argument(None, help="YAML spec whose workload (and SLO) the agents run"),
    endpoint: str = typer.Option("http://127.0.0.1:8000", "--endpoint", help="server base URL (with or without /v1)"),
    model: Optional[str] = typer.Option(None, "--model", help="model name the server serves (required)"),
    agents: int = typer.Option(4, "--agents", min=1, help="concurrent closed-loop agents"),
    agents_sweep: Optional[str] = typer.Option(None, "--agents-sweep", help="a:b[:step] ramp; reports measured N*"),
    duration_s: float = typer.Option(60.0, "--duration-s", min=0.1, help="measured seconds per level"),
    warmup_s: float = typer.Option(10.0, "--warmup-s", min=0.0, help="seconds before measuring (tasks begun then "
                                   "are left out)"),
    seed: Optional[int] = typer.Option(None, "--seed", min=0, max=2**63 - 1,
                                       help="seed of task shapes, prompt text and start offsets (default: the "
                                            "spec's seed, as simulate and fleet take it; 0 without a spec)"),
    results: Path = typer.Option(Path("bench-results.jsonl"), "--out", parser=file_path, help="JSONL results file (appended, flushed)"),
    resume: bool = typer.Option(False, "--resume", help="continue the run recorded in --out (its settings are used)"),
    trace: Optional[Path] = typer.Option(None, "--trace", help="replay this recorded trace (any format apmw fit "
                                         "reads) instead of sampling the spec's workload"),
    trace_format: Optional[str] = typer.Option(None, "--trace-format", help="the trace's format (default: "
                                               "recognised from the file, as apmw fit does)"),
    history: str = typer.Option("echo", "--history", help="echo (send the model's output back, as agents do) or "
                                "synthetic (same-length text; exact prompt lengths whatever the model writes)"),
    api: str = typer.Option("completions", "--api", help="completions (exact prompt lengths) or chat"),
    api_key_env: str = typer.Option("OPENAI_API_KEY", "--api-key-env", help="environment variable holding the API "
                                    "key (the key itself is never written anywhere)"),
    timeout_s: float = typer.Option(60.0, "--timeout-s", min=0.1, help="per-call timeout (a 'timeout' fault)"),
    drain_s: float = typer.Option(30.0, "--drain-s", min=0.0, help="time running tasks get to finish at the end"),
    slo_p95_s: Optional[float] = typer.Option(None, "--slo-p95-s", help="task-latency p95 SLO (default: the spec's)"),
    compare_plan: Optional[Path] = typer.Option(None, "--compare-plan", help="spec to predict with (apmw plan) and "
                                                "print next to the measurement"),
    calibration: Optional[Path] = typer.Option(None, "--calibration", help="calibration file (apmw bench "
                                               "--calibrate) whose fitted efficiencies --compare-plan uses"),
    calibrate: Optional[Path] = typer.Option(None, "--calibrate", parser=file_path, help="measure TTFT vs prompt length and TPOT vs "
                                             "concurrency instead, and write this calibration file"),
    loop_results: Optional[list[Path]] = typer.Option(None, "--loop-results", help="with --calibrate: also read "
                                                      "the server's steps under load off this results file's token "
                                                      "times (an apmw bench run against the same server); repeat "
                                                      "for several runs"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object (fields in docs/bench.md)"),
    live: bool = typer.Option(True, "--live/--no-live", help="rich live display (only on a terminal)"),
) -> None:
    """Run N closed-loop agents shaped like the spec's workload against a real server and measure them."""
    from apmw.loadgen import RunConfig, config_from_file, slo_dict, workload_dict
    from apmw.spec import load_spec

    api_key = os.environ.get(api_key_env) or None
    _check_times(duration_s=duration_s, warmup_s=warmup_s, timeout_s=timeout_s, drain_s=drain_s)
    if loop_results and calibrate is None:
        fail("--loop-results is read only with --calibrate (the server's steps under load, beside its calibration); "
             "add --calibrate FILE, or leave --loop-results out")
    if agents_sweep is not None and _given(ctx, "agents"):
        fail("--agents and --agents-sweep both say how many agents to run: give one of them")
    try:
        if calibrate is not None:
            output_path(calibrate, "--calibrate", inputs=[spec, *files_read_by(spec), *(loop_results or [])])
            _calibrate(endpoint, model, calibrate, api, api_key, timeout_s, 0 if seed is None else seed, as_json,
                       loop_results)
            return
        output_path(results, "--out", inputs=[spec, *files_read_by(spec)])
        if slo_p95_s is not None and not (math.isfinite(slo_p95_s) and slo_p95_s > 0):
            fail(f"--slo-p95-s {slo_p95_s}: give the task-latency p95 SLO as a positive number of seconds, e.g. 1800")
        # what the run is compared with is checked before the run, not after its minutes of load
        compare_spec = load_spec(compare_plan) if compare_plan is not None else None
        compare_step = _calibrated_step(compare_spec, calibration) if compare_spec is not None else None
        if resume:
            base = config_from_file(results)
            levels = (base.levels or [base.agents]) if agents_sweep is None else parse_sweep(agents_sweep)
        else:
            source = spec or compare_plan
            if source is None and trace is None:
                fail("give a spec (its workload drives the agents) or --trace: apmw bench SPEC --endpoint URL "
                     "--model NAME")
            if model is None:
                fail("--model is required: the name the server serves (GET /v1/models lists it)")
            if api not in ("completions", "chat"):
                fail(f"--api {api!r}: choose completions or chat")
            if history not in ("echo", "synthetic"):
                fail(f"--history {history!r}: choose echo or synthetic")
            s = load_spec(source) if source is not None else None
            levels = parse_sweep(agents_sweep) if agents_sweep else [agents]
            slo = slo_dict(s, slo_p95_s) if s else {"task_latency_p95_s": slo_p95_s}
            base = RunConfig(endpoint=endpoint, model=model, agents=levels[0], duration_s=duration_s,
                             warmup_s=warmup_s, seed=seed if seed is not None else s.seed if s is not None else 0,
                             workload=None if trace or s is None else workload_dict(s),
                             slo=slo, api=api, timeout_s=timeout_s, drain_s=drain_s, history=history,
                             trace=None if trace is None else {"path": str(trace), "format": trace_format})
        outcome = asyncio.run(_run(base, levels, results, api_key, resume, live and not as_json))
        comparison = None
        if compare_spec is not None:
            from apmw.loadgen.compare import compare
            comparison = compare(compare_spec, outcome.summary, compare_step)
    except (ApmwError, SpecError) as exc:
        fail(str(exc))
    doc = {**outcome.summary, "end_reason": outcome.reason, "results_file": str(outcome.path),
           "compare_plan": comparison}
    if as_json:
        emit_json(doc)
        _say_faults(outcome.summary, outcome.path)
        return
    print_table(_level_table(outcome.summary, f"apmw bench: {outcome.path} ({outcome.reason})"))
    _say_faults(outcome.summary, outcome.path)
    summary = outcome.summary
    if summary["agents_per_replica"] is not None and len(summary["levels"]) > 1:
        out.print(f"measured N* (largest N meeting the SLO): {knee_text(summary)}")
        if summary["agents_per_replica_range"][1] is None:
            warn(f"every level met the SLO, so the knee lies beyond {summary['agents_per_replica']} agents; "
                 "extend --agents-sweep to measure it")
    if comparison:
        for t in _compare_tables(comparison):
            print_table(t)
        star = comparison["agents_star"]
        if len(outcome.summary["levels"]) > 1:
            out.print(f"N*: predicted {star['predicted']}, measured {knee_text(summary)}")
        else:
            out.print(f"N*: predicted {star['predicted']} (one level measured; --agents-sweep measures N*)")


def _say_faults(summary: dict, path: Path) -> None:
    """Each level's failed calls on stderr, with the first one's reason; an error (exit 1) where no call of any
    level succeeded: the figures measure nothing but the faults."""
    for lv in summary["levels"]:
        if lv["errors"]:
            kinds = ", ".join(f"{k} {n:,}" for k, n in lv["faults"].items() if n)
            first = lv["first_fault"]
            warn(f"{lv['errors']:,} calls failed at {lv['agents']} agents, the warm-up's included ({kinds}; "
                 f"{lv['calls']:,} succeeded after the warm-up); the first: {first['fault']}: "
                 f"{first['detail'] or 'no detail'}")
    if summary["levels"] and all(lv["calls"] == 0 and lv["errors"] for lv in summary["levels"]):
        fail(f"no call succeeded after the warm-up: the server answered with faults (above; each call's in {path}). "
             "Check --endpoint, --model (GET /v1/models lists the served names) and the server's log")


async def _run(base, levels, results, api_key, resume, live):
    from rich.live import Live

    from apmw.loadgen import run_bench
    from apmw.loadgen.live import live_table

    if not (live and sys.stdout.isatty()):
        return await run_bench(base, levels, results, api_key=api_key, resume=resume)
    with Live(console=err, refresh_per_second=2, transient=False) as view:
        return await run_bench(base, levels, results, api_key=api_key, resume=resume,
                               on_tick=lambda s: view.update(live_table(s)))


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether option ``name`` was written on the command line (not left at its default). Matched by the source's
    name: typer runs on click or on a copy of it of its own."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


# The longest a bench setting may run: a week, as apmw simulate's runs.
MAX_BENCH_S = 7 * 86400.0


def _check_times(**seconds: float) -> None:
    """Each duration a finite number of seconds of at most a week (the flags' own minimums are the parser's): an
    infinite one would run the load, or wait on a call, for ever."""
    for name, value in seconds.items():
        if not (math.isfinite(value) and value <= MAX_BENCH_S):
            fail(f"--{name.replace('_', '-')} {value:g}: give a finite number of seconds, at most {MAX_BENCH_S:,.0f} "
                 "(a week)")


def _calibrated_step(spec, calibration: Path | None):
    """The step model --compare-plan predicts with: the calibration file's, or None for apmw's own."""
    from apmw.loadgen.calibrate import read_calibration, step_model_from_calibration

    return None if calibration is None else step_model_from_calibration(read_calibration(calibration), spec)


def _calibrate(endpoint, model, path, api, api_key, timeout_s, seed, as_json, loop_results=None):
    from apmw.loadgen import read_records
    from apmw.loadgen.calibrate import measure_calibration

    if model is None:
        fail("--model is required: the name the server serves (GET /v1/models lists it)")
    loop_runs = [read_records(p) for p in loop_results or []]
    cal = asyncio.run(measure_calibration(endpoint, model, path, api_key=api_key, timeout_s=timeout_s, seed=seed,
                                          loop_runs=loop_runs))
    if as_json:
        emit_json(cal)
        return
    t = Table(title=f"calibration written to {path}", title_justify="left")
    for col in ("prompt tokens", "TTFT p50 ms"):
        t.add_column(col, justify="right")
    for r in cal["ttft_vs_prompt_tokens"]:
        t.add_row(str(r["prompt_tokens"]), _fmt(r["ttft_s_p50"] * 1e3))
    print_table(t)
    t = Table(title="decode", title_justify="left")
    for col in ("concurrency", "TPOT p50 ms", "output tok/s"):
        t.add_column(col, justify="right")
    for r in cal["tpot_vs_concurrency"]:
        t.add_row(str(r["concurrency"]), _fmt(r["tpot_s_p50"] * 1e3), _fmt(r["output_tokens_per_s"]))
    print_table(t)
    t = Table(title="decode after a longer prompt (one request)", title_justify="left")
    for col in ("prompt tokens", "TPOT p50 ms"):
        t.add_column(col, justify="right")
    for r in cal.get("tpot_vs_context", []):
        t.add_row(str(r["prompt_tokens"]), _fmt(r["tpot_s_p50"] * 1e3))
    print_table(t)
    if cal.get("steps_under_load"):
        t = Table(title=f"steps under load (read off {', '.join(map(str, loop_results or []))})", title_justify="left")
        for col in ("decoding", "context per sequence", "prompt tokens prefilled", "steps", "step p50 ms"):
            t.add_column(col, justify="right")
        for r in cal["steps_under_load"]:
            t.add_row(str(r["decode_seqs"]), _fmt(r["context_tokens"]), _fmt(r["prefill_tokens"]), str(r["samples"]),
                      _fmt(r["step_s_p50"] * 1e3))
        print_table(t)
