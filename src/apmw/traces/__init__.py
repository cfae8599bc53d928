"""Read agent traces and fit the spec's ``workload`` section from them (`apmw fit`).

Public API::

    result = fit_trace("calls.csv")               # format recognised from the file
    result.summary["calls_per_session"]["mean"]  # what the trace shows (see docs/fit.md)
    result.workload                              # a validated apmw.spec.Workload
    result.workload_yaml()                       # the ``workload:`` section as YAML
    workload_from_trace("trace.jsonl")           # just the Workload

Readers stream (one line at a time); memory grows with the number of calls
(nine numbers each), never with line length or file size. ``traces`` produces
and consumes ``spec`` types only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from apmw.spec import Workload
from apmw.traces import formats
from apmw.traces.fit import (FORMS, Columns, Shape, cache_shares, collect, sessions_without_tool_spans, shape, stats,
                              step_ends, tasks_per_hour, validate, workload_dict)
from apmw.traces.generic import parse_mapping
from apmw.traces.records import LineErrors, TraceError

__all__ = ["FitResult", "TraceError", "fit_trace", "read_notes", "skipped_reasons", "workload_from_trace", "FORMATS", "FORMS"]

FORMATS = formats.NAMES


@dataclass
class FitResult:
    """What a trace showed (``summary``, JSON-ready) and the workload fitted to it."""

    summary: dict
    workload: Workload
    workload_section: dict
    columns: Columns
    shape: Shape

    def workload_yaml(self) -> str:
        """The ``workload:`` section, ready to paste into (or merge with) a full spec."""
        s = self.summary
        head = (f"# fitted by `apmw fit` from {s['path']} ({s['format']}): {s['sessions']:,} sessions, "
                f"{s['calls']:,} calls, {s['skipped_lines']:,} lines skipped\n")
        notes = "".join(f"# note: {n}\n" for n in s["notes"])
        text = head + notes + yaml.safe_dump({"workload": self.workload_section}, sort_keys=False, width=120)
        if s.get("tasks_per_hour") is not None:
            text += ("# a day of demand for apmw fleet: tasks started per hour, hour 0 = 00:00 UTC\n"
                     + yaml.safe_dump({"fleet": {"tasks_per_hour": s["tasks_per_hour"]}}, default_flow_style=None,
                                      width=120))
        return text


def fit_trace(path: str | Path, format: str | None = None, *, mapping: str | dict | None = None,
              strict: bool = False, form: str = "auto", name: str | None = None, weekly: bool = False) -> FitResult:
    """Read ``path`` (format given or recognised), summarise it and fit a Workload.

    ``mapping``: the column mapping of the generic ``csv``/``jsonl`` formats
    (``"input_tokens=col,output_tokens=col,..."``). ``strict``: stop at the first
    malformed line instead of skipping it. ``form``: ``auto`` (lognormal
    {mean, p95} where it also matches the measured p99, else quantiles),
    ``lognormal`` or ``empirical``. ``weekly``: ``tasks_per_hour`` per hour of the week (168 values from
    Monday 00:00 UTC) instead of the day.
    """
    if form not in FORMS:
        raise TraceError(f"unknown form {form!r}; use one of {', '.join(FORMS)}")
    if name is not None and not (isinstance(name, str) and name.strip()):
        raise TraceError(f"the workload name {name!r} is empty; give a name, or leave it out for the file's stem")
    p = formats.check_trace_file(path)
    fmt = formats.canonical(format) if format else formats.detect(p)
    errors = LineErrors(str(path), strict=strict)
    opened = formats.open_reader(p, fmt, errors, mapping)
    cols = collect(opened.stream)
    alias = getattr(opened.state, "session_alias", None)
    if alias is not None:
        cols = cols.relabel(alias)
    if not len(cols):
        why = (f"; skipped {errors.skipped} line(s): "
               + "; ".join(f"{r} ({d['count']}, e.g. {', '.join(d['examples'])})" for r, d in errors.as_dict().items())
               if errors.skipped else "")
        raise TraceError(f"{path}: no model calls found as format '{fmt}' ({errors.lines_read} line(s) read){why}. "
                         f"Accepted formats: {formats.accepted()}")
    form_of = next(f for f in formats.FORMATS if f.name == fmt)
    mapped = parse_mapping(mapping) if fmt in ("csv", "jsonl") else {}
    if form_of.indexed or "order" in mapped:       # a generic trace's rows are indexed where --map names an order
        _refuse_repeated_calls(path, cols)
    has_sessions = form_of.has_sessions
    if fmt in ("csv", "jsonl") and "session" not in mapped:
        has_sessions = False
    if fmt == "mooncake" and not (opened.state.saw_session_ids or opened.state.inferred_sessions):
        has_sessions = False
    tools = [(alias(k), t) for k, t in getattr(opened.state, "tool_starts", None) or ()]
    sh = shape(cols, has_sessions, step_ends(cols, tools) if tools else None,
               getattr(opened.state, "shared_prefix_tokens", None))
    section = workload_dict(cols, sh, form, name or p.stem, f"apmw fit {p.name} ({fmt})")
    workload = validate(section, str(path))
    summary = _summary(p, fmt, cols, sh, errors, opened, has_sessions, weekly,
                       sessions_without_tool_spans(cols, tools) if tools else 0)
    return FitResult(summary, workload, section, cols, sh)


def _refuse_repeated_calls(path: str | Path, c: Columns) -> None:
    """A call listed twice (the same session and call index) would be counted twice: refused, since which copy
    is right cannot be told."""
    if c.first_repeat is not None:
        key, index = c.first_repeat
        raise TraceError(f"{path}: {c.repeats} call(s) repeat another call's index in their session (first: session "
                         f"{key!r}, call index {index:g}); a call listed twice would be counted twice: remove the "
                         "duplicate rows")


def skipped_reasons(summary: dict) -> list[str]:
    """Each reason lines were skipped for, with its count and example ``file:line``s."""
    return [f"{d['count']:,} x {reason} (e.g. {', '.join(d['examples'])})" for reason, d in summary["skipped"].items()]


def read_notes(summary: dict) -> list[str]:
    """What a verb that reads a trace without `apmw fit`'s report should still say: the malformed lines it
    skipped (:func:`skipped_reasons`), then the fit's notes."""
    head = ([f"skipped {summary['skipped_lines']:,} malformed line(s) of the trace: "
             + "; ".join(skipped_reasons(summary))] if summary["skipped_lines"] else [])
    return head + list(summary["notes"])


def workload_from_trace(path: str | Path, format: str | None = None, **kwargs) -> Workload:
    """Just the fitted Workload (for ``apmw plan --workload-from TRACE``)."""
    return fit_trace(path, format, **kwargs).workload


def _summary(p: Path, fmt: str, c: Columns, s: Shape, errors: LineErrors, opened: formats.Opened,
             has_sessions: bool, weekly: bool = False, untraced_sessions: int = 0) -> dict:
    cached, reusable = cache_shares(c, s)
    source = None
    if cached is not None:
        source = "hash_ids prefix (infinite cache)" if fmt == "mooncake" else "reported cache-read tokens"
    notes = _notes(fmt, c, s, opened, has_sessions, cached, untraced_sessions)
    if errors.skipped and has_sessions:
        notes.append(f"the {errors.skipped:,} skipped line(s) leave their sessions shorter: each is fitted from the "
                     "calls left, and one that lost its first call has its second read as a first prompt (the "
                     "system prompt and first-call sizes shift with it); fix the lines to keep them whole")
    rates, why_no_rates = tasks_per_hour(c, s, weekly)     # without sessions each call is its own task
    if weekly and rates is None:     # asked for by name: its absence is an error, not a note
        raise TraceError(f"{p}: --weekly: " + (why_no_rates or "the trace has no sessions, so no task starts")
                         + "; leave --weekly out for the day's profile, or give a longer trace")
    return {
        "path": str(p),
        "format": fmt,
        "lines_read": errors.lines_read,
        "skipped_lines": errors.skipped,
        "skipped": errors.as_dict(),
        "has_sessions": has_sessions,
        "sessions": int(len(s.calls_per_session)),
        "calls": int(len(c)),
        "calls_per_session": stats(s.calls_per_session),
        "steps_per_session": stats(s.calls_per_session if s.steps_per_session is None else s.steps_per_session),
        "calls_per_step": stats(np.ones(len(c)) if s.calls_per_step is None else s.calls_per_step),
        "input_tokens_per_call": stats(c.input_tokens),
        "output_tokens_per_call": stats(c.output_tokens),
        "new_input_tokens_per_call": stats(s.new_input),
        "first_call_input_tokens": stats(s.first_new_input),
        "system_prompt_tokens": int(s.system_prompt_tokens),
        "peak_context_tokens": stats(s.peak_context),
        "tool_wait_s": stats(s.tool_wait_s),
        "llm_latency_s": stats(s.llm_latency_s),
        "session_duration_s": stats(s.session_duration_s),
        "context_shrank_calls": s.shrank,
        "negative_tool_waits": s.negative_waits,
        "calls_missing_time": _missing_times(c),
        "cached_prompt_share": cached,
        "cached_prompt_share_source": source,
        "reusable_prefix_share": reusable,
        "tasks_per_hour": rates,
        "notes": notes + ([] if why_no_rates is None else [why_no_rates]),
    }


def _missing_times(c: Columns) -> dict[str, int]:
    """Calls with no start or end time where other calls of the trace have one (an empty cell), among the calls
    whose waits the times would give: a call that records its own wait (AIPerf's ``delay``, a tool time) needs
    neither."""
    missing = {}
    needs = ~(np.isfinite(c.gap_before_s) | np.isfinite(c.tool_wait_after_s))
    for name, t in (("start", c.start_s), ("end", c.end_s)):
        known = int(np.isfinite(t).sum())
        if 0 < known < len(t):
            lacking = int((~np.isfinite(t) & needs).sum())
            if lacking:
                missing[name] = lacking
    return missing


def _notes(fmt: str, c: Columns, s: Shape, opened: formats.Opened, has_sessions: bool, cached,
           untraced_sessions: int = 0) -> list[str]:
    notes = []
    for name, k in _missing_times(c).items():
        notes.append(f"{k} of {len(c)} call(s) have no {name} time (an empty or missing field): the tool waits "
                     f"and latencies next to them are left out of the fit, not guessed")
    state = opened.state
    if not has_sessions:
        notes.append("the trace has no sessions: every call is its own one-call task, so steps_per_task is 1 "
                     "and the fit describes call sizes, not agent sessions")
    if fmt == "mooncake" and state is not None and state.inferred_sessions:
        notes.append("sessions inferred from hash_ids (a request continues the latest one whose blocks it "
                     "extends); the gaps between calls are arrival-to-arrival and include each call's own latency")
        if state.out_of_order:
            notes.append(f"{state.out_of_order} line(s) are stamped earlier than a line before them: the trace is not "
                         "in time order, and its sessions are inferred in file order, so a request may start the "
                         "session it continues; sort the file by timestamp")
    if getattr(state, "undelayed_turns", 0):
        notes.append(f"{state.undelayed_turns} later turn(s) have no delay: read as 0 ms, as AIPerf sends them (a "
                     "run's --conversation-turn-delay-mean would have added its own)")
    if getattr(state, "estimated_lines", 0):
        notes.append(f"{state.estimated_lines} record(s) had text but no token counts: estimated at 4 characters "
                     "per token")
    if s.calls_per_step is not None:
        notes.append("steps split at tool spans: calls with no tool span between them form one step "
                     "(calls_per_step), and the gap inside a step is not tool wait"
                     + (f"; {untraced_sessions} of {len(s.calls_per_session)} session(s) have no tool span, so "
                        "each of their calls is a step of its own" if untraced_sessions else ""))
    if not np.isfinite(s.tool_wait_s).any():
        notes.append("no tool timing in the trace: tool_wait_s is 0")
    if s.shrank:
        notes.append(f"{s.shrank} call(s) had a shorter prompt than the history before them (context trimmed); "
                     "their new input is counted as 0")
    if s.negative_waits:
        notes.append(f"{s.negative_waits} negative tool time(s) in the trace (clock skew) counted as 0")
    if s.overlapping_calls:
        gaps = int((~s.first).sum())
        notes.append(f"{s.overlapping_calls} of {gaps} call(s) after a session's first start before the call before "
                     "them ended, so no tool wait is read there: parallel calls, or start and end times on two clocks "
                     "or in two units (with --map, check that each column's _s or _ms is its unit)")
    if cached is None:
        notes.append("the trace reports no cache counts: see reusable_prefix_share for what a prefix cache could serve")
    if has_sessions and len(s.calls_per_session) < 2:
        notes.append("one session only: system_prompt_tokens is 0 (a shared prefix needs two sessions to show)")
    return notes
