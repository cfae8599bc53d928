"""The per-call CSV extracted from mini-swe-agent trajectories (``calls.csv``).

Columns (documented in ../shared/data/README.md): ``run``, ``instance_id``,
``call_index``, ``t_request_s``, ``t_response_s``, ``prompt_tokens``,
``completion_tokens``, ``cached_prompt_tokens``, ``tool_phase_s`` and others.
A session is one (``run``, ``instance_id``) pair. ``tool_phase_s`` is the time
the agent's shell commands took after the call: the tool wait.
"""

from __future__ import annotations

from pathlib import Path

from apmw.spec.model import MAX_TOKENS_PER_CALL
from apmw.traces.records import NAN, TraceError, CallStream, LineErrors, cell, inconsistent, require_counts
from apmw.traces.csv_rows import column_index, csv_rows

NAME = "mini-swe-agent"
DESCRIPTION = "mini-swe-agent calls.csv (run, instance_id, call_index, prompt_tokens, completion_tokens, ...)"
REQUIRED = ("run", "instance_id", "call_index", "prompt_tokens", "completion_tokens")
OPTIONAL = ("cached_prompt_tokens", "t_request_s", "t_response_s", "tool_phase_s")


def matches_header(columns: list[str]) -> bool:
    return set(REQUIRED) <= set(columns)


def read(path: str | Path, errors: LineErrors) -> CallStream:
    rows = csv_rows(path, errors)
    first = next(rows, None)
    if first is None:
        return
    header = first[1]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise TraceError(f"{path}:1: missing column(s) {', '.join(missing)} in the header of a {NAME} CSV")
    col = column_index(header, (*REQUIRED, *OPTIONAL), path)
    i_run, i_inst, i_idx = col["run"], col["instance_id"], col["call_index"]
    i_in, i_out = col["prompt_tokens"], col["completion_tokens"]
    width = len(header)
    optional = [col.get(c) for c in OPTIONAL]
    i_cached, i_req, i_resp, i_tool = (i if i is not None else width for i in optional)
    empty = ""
    for line, row in rows:
        errors.lines_read += 1
        if len(row) != width:
            errors.skip(line, f"expected {width} columns, found {len(row)}")
            continue
        row.append(empty)  # index `width` reads as a missing optional column
        try:
            inp, out = cell(row[i_in]), cell(row[i_out])
            if not (0 <= inp <= MAX_TOKENS_PER_CALL and 0 <= out <= MAX_TOKENS_PER_CALL) or inp % 1 or out % 1:  # and an empty (nan) cell
                errors.skip(line, require_counts(inp, out) or "bad token count")
                continue
            cached, start, end = cell(row[i_cached]), cell(row[i_req]), cell(row[i_resp])
            bad = inconsistent(inp, cached, start, end)
            if bad:
                errors.skip(line, bad)
                continue
            if not row[i_run].strip() or not row[i_inst].strip():     # a call with no session would be a task of its own
                errors.skip(line, f"no session: an empty {'run' if not row[i_run].strip() else 'instance_id'} "
                                  "(a call's session is its run and instance_id)")
                continue
            index = cell(row[i_idx])
            if index != index:
                errors.skip(line, "no call_index (the call's place in its session)")
                continue
            if index < 0 or index % 1:
                errors.skip(line, f"call_index is not a whole number from 0 up (the call's place in its session): "
                                  f"'{row[i_idx]}'")
                continue
            # a Call as a plain tuple (same field order): the hot path of the reader
            yield ((row[i_run], row[i_inst]), index, inp, out, cached, start, end, cell(row[i_tool]), NAN)
        except ValueError as exc:
            errors.skip(line, f"not a number: {exc}")
            continue
