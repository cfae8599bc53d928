"""Any per-call CSV or JSONL, given a column mapping on the command line.

``--map input_tokens=prompt_tokens,output_tokens=completion_tokens,session=conv``
maps apmw's fields to the file's columns (JSONL: dotted paths into nested
objects, e.g. ``usage.prompt_tokens``). Fields: ``session``, ``order``,
``input_tokens`` and ``output_tokens`` (required), ``cached_tokens``, and times
with their unit as suffix: ``start_s|start_ms|start_ns``, ``end_*``,
``tool_wait_s|tool_wait_ms`` (non-LLM time after the call), ``gap_before_s|gap_before_ms``.
Without ``session`` every row is its own session; without ``order`` rows keep
file order within a session.
"""

from __future__ import annotations

from pathlib import Path

from apmw.traces.jsonl import records
from apmw.spec.model import MAX_TOKENS_PER_CALL
from apmw.traces.records import (NAN, Call, CallStream, LineErrors, TraceError, cell, inconsistent, number, require_counts,
                                 session_key)
from apmw.traces.csv_rows import column_index, csv_rows

NAME_CSV = "csv"
NAME_JSONL = "jsonl"
DESCRIPTION = "generic CSV or JSONL with --map field=column,... (input_tokens and output_tokens required)"

UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
# What a mapped field holds: a number, a time as seconds (or ms, us, ns: the --map unit) since the Unix epoch.
NUMBERS = "token counts and times are plain numbers, a time in the unit its --map name gives: start_s, start_ms, ..."
TIMED = ("start", "end", "tool_wait", "gap_before")
PLAIN = ("session", "order", "input_tokens", "output_tokens", "cached_tokens")
COUNTS = ("input_tokens", "output_tokens", "cached_tokens")


def parse_mapping(text: str | dict | None) -> dict[str, tuple[str, float]]:
    """'field=column,...' -> {field: (column, scale to seconds or 1)}, with a message that lists the fields."""
    if not text:
        raise TraceError("the generic csv/jsonl formats need --map, e.g. "
                         "--map input_tokens=prompt_tokens,output_tokens=completion_tokens,session=conversation_id "
                         "(apmw fit takes it; apmw plan --workload-from and apmw simulate --trace do not: fit the "
                         "trace with apmw fit TRACE --format csv|jsonl --map ... -o workload.yaml, and put that "
                         "workload in the spec)")
    pairs = text.items() if isinstance(text, dict) else (p.split("=", 1) for p in text.split(",") if p.strip())
    mapping: dict[str, tuple[str, float]] = {}
    for pair in pairs:
        if len(pair) != 2 or not pair[0].strip() or not pair[1].strip():
            raise TraceError(f"--map entry {'='.join(pair)!r} is not field=column")
        field, column = pair[0].strip(), pair[1].strip()
        base, _, unit = field.rpartition("_")
        key = field if field in PLAIN else base if base in TIMED and unit in UNITS else None
        if key in mapping:
            raise TraceError(f"--map names {key} twice (as {mapping[key][0]!r} and {column!r}); give each field once")
        if field in PLAIN:
            mapping[field] = (column, 1.0)
        elif key is not None:
            mapping[base] = (column, UNITS[unit])
        else:
            raise TraceError(f"--map: unknown field {field!r}; use {', '.join(PLAIN)}, or a time field "
                             f"{'/'.join(TIMED)} with a unit suffix _s, _ms, _us or _ns (e.g. start_ms)")
    for need in ("input_tokens", "output_tokens"):
        if need not in mapping:
            raise TraceError(f"--map must name the {need} column (e.g. {need}=...)")
    counts: dict[str, str] = {}
    for field in COUNTS:
        column = mapping[field][0] if field in mapping else None
        if column in counts:        # one column read as two token counts: a typo in one of them (order and a start
            #                         time may share a column)
            raise TraceError(f"--map reads column {column!r} as both {counts[column]} and {field}; each token count "
                             "takes its own column")
        if column is not None:
            counts[column] = field
    return mapping


def _no_session(mapping: dict) -> str | None:
    """Why a call whose mapped session is missing or empty is skipped (None where --map names no session): its
    conversation is unknown, and read as one of its own it would split that conversation unseen."""
    if "session" not in mapping:
        return None
    return f"no session: the --map session column {mapping['session'][0]!r} is missing or empty"


def _build(get, mapping: dict, line: int) -> Call:
    def val(field: str) -> float:
        if field not in mapping:
            return NAN
        column, scale = mapping[field]
        value = get(column)
        try:
            return number(value) * scale
        except (ValueError, TypeError):
            raise ValueError(f"{column} ({field}) is not a number ({NUMBERS}): "
                             f"'{str(value)[:40].replace(chr(39), '')}'") from None

    inp, out = val("input_tokens"), val("output_tokens")
    bad = require_counts(inp, out)
    if bad:
        raise ValueError(bad)
    session = session_key(get(mapping["session"][0]), "session") if "session" in mapping else None
    if session in (None, "") and "session" in mapping:
        raise ValueError(_no_session(mapping))
    order = val("order")
    cached, start, end = val("cached_tokens"), val("start"), val("end")
    bad = inconsistent(inp, cached, start, end)
    if bad:
        raise ValueError(bad)
    return Call(session if session not in (None, "") else line, order if order == order else float(line),
                inp, out, cached, start, end, val("tool_wait"), val("gap_before"))


def read_csv(path: str | Path, errors: LineErrors, mapping: dict) -> CallStream:
    rows = csv_rows(path, errors)
    first = next(rows, None)
    if first is None:
        raise TraceError(f"{path}: the file is empty (no header, no rows): give a CSV with a header row naming the "
                         "columns --map reads")
    header = first[1]
    col = column_index(header, [c for c, _ in mapping.values()], path)
    missing = sorted({c for c, _ in mapping.values()} - col.keys())
    if missing:
        raise TraceError(f"{path}:1: --map names column(s) {', '.join(missing)} not in the header "
                         f"({', '.join(map(repr, header[:20]))}){_header_hint(header, missing)}")
    width = len(header)
    # column index per Call field (`width` = an always-empty cell appended to each row) and its scale
    idx = {f: col[c] for f, (c, _) in mapping.items()}
    scale = {f: k for f, (_, k) in mapping.items()}
    i_sess = idx.get("session", width)
    no_session = _no_session(mapping)
    numeric = [(idx.get(f, width), scale.get(f, 1.0)) for f in
               ("order", "input_tokens", "output_tokens", "cached_tokens", "start", "end", "tool_wait", "gap_before")]
    for line, row in rows:
        errors.lines_read += 1
        if len(row) != width:
            errors.skip(line, f"expected {width} columns, found {len(row)}")
            continue
        row.append("")
        try:
            order, inp, out, *rest = [cell(row[i]) * k for i, k in numeric]
        except ValueError:
            errors.skip(line, _unreadable_cell(row, numeric, header))
            continue
        if not (0 <= inp <= MAX_TOKENS_PER_CALL and 0 <= out <= MAX_TOKENS_PER_CALL) or inp % 1 or out % 1:
            errors.skip(line, require_counts(inp, out) or "bad token count")
            continue
        bad = inconsistent(inp, rest[0], rest[1], rest[2])          # cached tokens, start, end
        if bad:
            errors.skip(line, bad)
            continue
        if no_session and not row[i_sess]:
            errors.skip(line, no_session)
            continue
        yield (row[i_sess] or line, order if order == order else float(line), inp, out, *rest)


def _dig(obj: dict, dotted: str) -> object:
    for part in dotted.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def _header_hint(header: list[str], missing: list[str]) -> str:
    """What a header that lacks mapped columns may have instead: another separator, or spaces around names."""
    if len(header) == 1 and any(sep in header[0] for sep in (";", "\t", "|")):
        return ": the header is one column, so the file is not comma-separated (';', tab or '|'?); apmw reads CSV " \
               "with commas: convert it (e.g. tr ';' ',' < FILE > FILE.csv, where no cell holds one)"
    if {name.strip() for name in header} >= set(missing):
        return ": the header's names have spaces around them; remove them from the header"
    return ""


def _unreadable_cell(row: list[str], numeric: list[tuple[int, float]], header: list[str]) -> str:
    """Which mapped column of ``row`` is not a number, and its value last (quoted, so that such lines count as one
    reason)."""
    for i, _ in numeric:
        try:
            cell(row[i])
        except ValueError:
            return f"column {header[i]!r} is not a number ({NUMBERS}): '{row[i][:40]}'"
    return "a mapped column is not a number"


def read_jsonl(path: str | Path, errors: LineErrors, mapping: dict) -> CallStream:
    unseen = {c for c, _ in mapping.values()}        # mapped keys no record has had yet
    first_keys: list[str] | None = None
    for line, obj in records(path, errors):
        if first_keys is None:
            first_keys = list(obj)[:20]
        if unseen:
            unseen -= {c for c in unseen if _dig(obj, c) is not None}
        try:
            yield _build(lambda c: _dig(obj, c), mapping, line)
        except (ValueError, TypeError) as exc:
            errors.skip(line, str(exc))
    if unseen and first_keys is not None:
        # a mistyped key reads as absent on every record: a session key so mistyped made every call its own session
        raise TraceError(f"{path}: --map names key(s) {', '.join(sorted(unseen))} that no record has (the first "
                         f"record's keys: {', '.join(first_keys)}); fix the --map spelling")
