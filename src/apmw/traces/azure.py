"""Azure LLM inference trace 2023 (Splitwise): ``TIMESTAMP,ContextTokens,GeneratedTokens``.

Prompt and output lengths only. The trace has **no session ids**, so every
request is a one-call session: the fit gives per-call sizes, not session shape
(the summary says so). Source: Azure/AzurePublicDataset, CC-BY-4.0.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from apmw.traces.csv_rows import column_index, csv_rows
from apmw.traces.records import (LATEST_UNIX_S, WALL_CLOCK_FROM_S, Call, CallStream, LineErrors, TraceError, cell,
                                 require_counts)

NAME = "azure"
DESCRIPTION = "Azure LLM inference trace 2023 CSV (TIMESTAMP, ContextTokens, GeneratedTokens; no sessions)"
REQUIRED = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
HAS_SESSIONS = False


def matches_header(columns: list[str]) -> bool:
    return set(REQUIRED) <= set(columns)


# A date and time as the trace writes it ('2023-11-16 18:17:03.9799600'), or in ISO 8601 with a T and a zone
# ('2023-11-16T18:17:03.9799600Z', '+01:00'), as a re-export writes it. Seven fractional digits: datetime reads six.
_STAMP = re.compile(r"(?P<base>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(?P<frac>\.\d+)?(?P<zone>Z|[+-]\d\d:?\d\d)?")


def _seconds(stamp: str) -> float:
    """A TIMESTAMP cell -> POSIX seconds. Without a zone it is UTC (the traces' clock), whatever this machine's
    time zone: tasks_per_hour counts hours of the UTC day."""
    m = _STAMP.fullmatch(stamp.strip())
    if m is None:
        raise ValueError(f"TIMESTAMP {stamp[:40]!r} is not a date and time such as 2023-11-16 18:17:03.9799600 (UTC; "
                         "ISO 8601 with a T and a Z or an offset is read too)")
    zone = m["zone"] or "Z"
    when = datetime.fromisoformat(m["base"] + ("+00:00" if zone == "Z" else zone))
    seconds = when.timestamp() + (float(m["frac"]) if m["frac"] else 0.0)
    # a placeholder date ('9999-12-31', '0001-01-01') would stretch or void the day of demand fitted from the rest
    if not WALL_CLOCK_FROM_S <= seconds <= LATEST_UNIX_S:
        raise ValueError(f"TIMESTAMP {stamp.strip()[:40]!r} is before 2001-09-09 or past 2262: a placeholder date, "
                         "not when a request was made")
    return seconds


def read(path: str | Path, errors: LineErrors) -> CallStream:
    rows = csv_rows(path, errors)
    first = next(rows, None)
    if first is None:
        return
    header = first[1]
    col = column_index(header, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"), path, first[0])
    missing = [c for c in ("TIMESTAMP", "ContextTokens", "GeneratedTokens") if c not in col]
    if missing:
        raise TraceError(f"{path}:{first[0]}: the header lacks {', '.join(missing)}, the columns of an Azure "
                         f"LLM inference trace (found: {', '.join(header[:10]) or 'nothing'})")
    i_t, i_in, i_out = col["TIMESTAMP"], col["ContextTokens"], col["GeneratedTokens"]
    for line, row in rows:
        errors.lines_read += 1
        if len(row) != len(header):
            errors.skip(line, f"expected {len(header)} columns, found {len(row)}")
            continue
        try:
            inp, out, t = cell(row[i_in]), cell(row[i_out]), _seconds(row[i_t])
        except ValueError as exc:
            errors.skip(line, f"bad value: {exc}")
            continue
        bad = require_counts(inp, out)
        if bad:
            errors.skip(line, bad)
            continue
        yield Call(None, t, inp, out, start_s=t)
