"""`apmw fit`: a workload section measured from a real trace."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table
from rich.text import Text

from apmw.cli.common import app, distinct_outputs, emit_json, err, fail, file_path, note, output_path, say, write_text
from apmw.errors import ApmwError

QUANTITIES = (
    ("calls_per_session", "calls per session", ",.1f"),
    ("steps_per_session", "steps per session", ",.1f"),
    ("calls_per_step", "calls per step", ",.2f"),
    ("input_tokens_per_call", "prompt tokens per call", ",.0f"),
    ("new_input_tokens_per_call", "new input tokens per call", ",.0f"),
    ("first_call_input_tokens", "first call's new input tokens", ",.0f"),
    ("output_tokens_per_call", "output tokens per call", ",.0f"),
    ("peak_context_tokens", "peak context per session", ",.0f"),
    ("tool_wait_s", "tool wait (s)", ",.3f"),
    ("llm_latency_s", "LLM call latency (s)", ",.2f"),
    ("session_duration_s", "session duration (s)", ",.0f"),
)



# Sessions a fitted export may write: a benchmark replays a few thousand; 100,000 coding-agent sessions are
# already gigabytes of JSONL, and a typo past it would fill the disk.
MAX_EXPORT_SESSIONS = 100_000

@app.command()
def fit(
    trace: Path = typer.Argument(..., help="trace file (format recognised from its name and first line)"),
    fmt: Optional[str] = typer.Option(None, "--format", "-f", help="otel, mini-swe-agent, mooncake, "
                                      "aiperf-mooncake, aiperf-multi-turn, agentperf, azure, csv, jsonl"),
    mapping: Optional[str] = typer.Option(None, "--map", help="for csv/jsonl: field=column,... e.g. "
                                          "input_tokens=prompt,output_tokens=completion,session=conv,start_ms=t"),
    output: Optional[Path] = typer.Option(None, "-o", "--output", parser=file_path, help="write the workload section to this YAML"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as one JSON object (docs/fit.md)"),
    strict: bool = typer.Option(False, "--strict", help="stop at the first malformed line"),
    form: str = typer.Option("auto", "--form", help="auto | lognormal | empirical"),
    name: Optional[str] = typer.Option(None, "--name", help="workload name (default: the file's stem)"),
    export: Optional[str] = typer.Option(None, "--export", help="also write a replayable trace: 'aiperf'"),
    export_path: Optional[Path] = typer.Option(None, "--export-path", parser=file_path, help="where (default: STEM.aiperf.jsonl in the current folder)"),
    export_from: str = typer.Option("measured", "--export-from", help="measured (the trace's calls) | fitted "
                                    "(sessions sampled from the fit)"),
    export_sessions: Optional[int] = typer.Option(None, "--export-sessions", min=1, max=MAX_EXPORT_SESSIONS,
                                                  help="sessions to sample with --export-from fitted "
                                                  "(default: as many as the trace has; at most 100,000)"),
    seed: int = typer.Option(0, "--seed", min=0, help="seed of --export-from fitted"),
    weekly: bool = typer.Option(False, "--weekly", help="fit fleet.tasks_per_hour per hour of the week (168 values "
                                "from Monday 00:00 UTC; the trace must cover a week) instead of the day"),
) -> None:
    """Measure sessions, calls and tokens in a trace and fit the spec's workload section."""
    from apmw.traces import export as exporter
    from apmw.traces import fit_trace

    if export not in (None, "aiperf"):
        fail(f"--export {export!r}: the only export format is 'aiperf' (AIPerf mooncake_trace JSONL)")
    if export_from not in ("measured", "fitted"):
        fail(f"--export-from {export_from!r}: use 'measured' or 'fitted'")
    if export is None:
        given = [flag for flag, on in (("--export-path", export_path is not None),
                                       ("--export-from", export_from != "measured"),
                                       ("--export-sessions", export_sessions is not None), ("--seed", seed != 0)) if on]
        if given:
            fail(f"{', '.join(given)}: appl{'y' if len(given) > 1 else 'ies'} only with --export aiperf (a replayable trace written beside the fit); "
                 "add it, or leave them out")
    if export_sessions is not None and export_from != "fitted":
        fail("--export-sessions applies to --export-from fitted (a measured export writes the trace's own sessions)")
    if output is not None:
        output_path(output, "-o", inputs=[trace])
    target = None
    if export:
        target = output_path(export_path or Path(trace.name.split(".")[0] + ".aiperf.jsonl"), "--export-path",
                             inputs=[trace])
        distinct_outputs({"-o": output, "--export-path": target})
    try:
        if mapping is not None and (fmt or "").lower() not in ("csv", "jsonl"):
            fail("--map applies to the generic formats: add --format csv or --format jsonl")
        result = fit_trace(trace, fmt, mapping=mapping, strict=strict, form=form, name=name, weekly=weekly)
    except ApmwError as exc:
        fail(str(exc))
    s = result.summary
    if output is not None:
        write_text(output, result.workload_yaml(), "-o")
    exported = None
    if target is not None:
        try:
            if export_from == "measured":
                n = exporter.write_measured(result.columns, s["system_prompt_tokens"], result.shape.tool_wait_s,
                                            target)
            else:
                n = exporter.write_fitted(result.workload, target, export_sessions or s["sessions"], seed)
        except OSError as exc:
            fail(f"--export-path {target}: cannot write it ({exc.strerror or exc})")
        step = s["calls_per_step"]["mean"] if isinstance(s.get("calls_per_step"), dict) else None
        exported = {"format": "aiperf-mooncake", "path": str(target), "lines": n, "from": export_from,
                    "notes": exporter.export_notes(s["system_prompt_tokens"], step)}
    if as_json:
        emit_json({**s, "workload": result.workload_section, "export": exported})
        return
    _print_summary(s)   # on stderr: stdout carries only the YAML, so `apmw fit T > workload.yaml` works
    if output is None:
        sys.stdout.write(result.workload_yaml())
    else:
        say(f"wrote {output}")
    if exported:
        say(f"wrote {exported['lines']:,} AIPerf mooncake_trace lines to {exported['path']}")
        for line in exported["notes"]:
            note(f"--export: {line}")


def _print_summary(s: dict) -> None:
    from apmw.traces import skipped_reasons

    table = Table(title=f"{s['path']} ({s['format']}): {s['sessions']:,} sessions, {s['calls']:,} calls")
    for col in ("quantity", "count", "mean", "p50", "p95", "p99"):
        table.add_column(col, justify="left" if col == "quantity" else "right")
    for key, label, spec in QUANTITIES:
        d = s[key]
        if not d["count"]:
            continue
        table.add_row(label, f"{d['count']:,}", *(format(d[q], spec) for q in ("mean", "p50", "p95", "p99")))
    err.print(table)
    share = s["cached_prompt_share"]
    say(f"system prompt (shared prefix): {s['system_prompt_tokens']:,} tokens;  "
        f"cached prompt share: {'n/a' if share is None else f'{share:.1%}'}"
        f"{'' if share is None else ' (' + s['cached_prompt_share_source'] + ')'};  "
        f"reusable prefix share: {s['reusable_prefix_share']:.1%}")
    if s["skipped_lines"]:
        say(Text.assemble((f"skipped {s['skipped_lines']:,} malformed line(s)", "yellow"),
                          " (--strict stops at the first):"))
        for line in skipped_reasons(s):
            say(f"  {line}")
    for line in s["notes"]:
        note(line)
