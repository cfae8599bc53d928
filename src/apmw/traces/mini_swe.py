"""The per-call CSV extracted from mini-swe-agent trajectories (``calls.csv``).

Columns (documented in ../shared/data/README.md): ``run``, ``instance_id``,
``call_index``, ``t_request_s``, ``t_response_s``, ``prompt_tokens``,
``completion_tokens``, ``cached_prompt_tokens``, ``tool_phase_s`` and others.
A session is one (``run``, ``instance_id``) pair. ``tool_phase_s`` is the time
the agent's shell commands took after the call: the tool wait.
"""

from __future__ import annotations

import csv
from pathlib import Path

from apmw.traces.records import NAN, Call, TraceError, CallStream, LineErrors, number, require_counts
from apmw.traces.textio import open_text

NAME = "mini-swe-agent"
DESCRIPTION = "mini-swe-agent calls.csv (run, instance_id, call_index, prompt_tokens, completion_tokens, ...)"
REQUIRED = ("run", "instance_id", "call_index", "prompt_tokens", "completion_tokens")


def matches_header(columns: list[str]) -> bool:
    return set(REQUIRED) <= set(columns)


def read(path: str | Path, errors: LineErrors) -> CallStream:
    with open_text(path) as f:
        rows = csv.reader(f)
        header = next(rows, None)
        if header is None:
            return
        missing = [c for c in REQUIRED if c not in header]
        if missing:
            raise TraceError(f"{path}:1: missing column(s) {', '.join(missing)} in the header of a {NAME} CSV")
        col = {name: i for i, name in enumerate(header)}
        i_run, i_inst, i_idx = col["run"], col["instance_id"], col["call_index"]
        i_in, i_out = col["prompt_tokens"], col["completion_tokens"]
        i_cached, i_tool = col.get("cached_prompt_tokens"), col.get("tool_phase_s")
        i_req, i_resp = col.get("t_request_s"), col.get("t_response_s")
        width = len(header)
        for line, row in enumerate(rows, start=2):
            errors.lines_read += 1
            if len(row) != width:
                if not row:
                    continue
                errors.skip(line, f"expected {width} columns, found {len(row)}")
                continue
            try:
                inp, out = number(row[i_in]), number(row[i_out])
                call = Call(
                    (row[i_run], row[i_inst]), number(row[i_idx]), inp, out,
                    number(row[i_cached]) if i_cached is not None else NAN,
                    number(row[i_req]) if i_req is not None else NAN,
                    number(row[i_resp]) if i_resp is not None else NAN,
                    number(row[i_tool]) if i_tool is not None else NAN,
                )
            except ValueError as exc:
                errors.skip(line, f"not a number: {exc}")
                continue
            bad = require_counts(inp, out)
            if bad:
                errors.skip(line, bad)
                continue
            yield call
