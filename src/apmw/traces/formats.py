"""The formats `apmw fit` reads, and how a file's format is recognised.

Recognition looks at the extension and the first non-blank line (a CSV header
or a JSON object's keys), never at the whole file. ``--format`` overrides it.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from apmw.traces import agentperf, aiperf, azure, generic, mini_swe, mooncake, otel
from apmw.traces.records import CallStream, LineErrors, TraceError
from apmw.traces.textio import JSONDecodeError, base_name, loads, not_json, open_binary

# First-line bytes read for recognition; longer lines (OTLP batches) are parsed from a prefix only as JSON-ish keys.
SNIFF_BYTES = 1 << 22


@dataclass(frozen=True)
class Format:
    name: str
    description: str
    has_sessions: bool = True
    indexed: bool = False       # its calls carry an index within their session (no two alike), not a time


FORMATS = [
    Format(otel.NAME, otel.DESCRIPTION),
    Format(mini_swe.NAME, mini_swe.DESCRIPTION, indexed=True),
    Format(mooncake.NAME, mooncake.DESCRIPTION),
    Format(aiperf.NAME, aiperf.DESCRIPTION),
    Format(agentperf.NAME, agentperf.DESCRIPTION, indexed=True),
    Format(azure.NAME, azure.DESCRIPTION, has_sessions=False),
    Format(generic.NAME_CSV, generic.DESCRIPTION),
    Format(generic.NAME_JSONL, generic.DESCRIPTION),
]
ALIASES = {alias: m.NAME for m in (otel, mooncake) for alias in m.ALIASES}
NAMES = [f.name for f in FORMATS]


def accepted() -> str:
    """The list of formats, for error messages."""
    return "; ".join(f"{f.name}: {f.description}" for f in FORMATS)


def canonical(name: str) -> str:
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in NAMES:
        raise TraceError(f"unknown trace format {name!r}; accepted: {', '.join(NAMES + sorted(ALIASES))}")
    return key


def _first_line(path: Path) -> bytes:
    with open_binary(path) as f:
        for raw in f:
            if raw.strip():
                return raw[:SNIFF_BYTES]
    return b""


def _head(path: Path, size: int = 1 << 16) -> bytes:
    with open_binary(path) as f:
        return f.read(size)


# How to read a trace in no known format: only apmw fit maps its columns; the other verbs read what fit fitted.
MAPPED = ("map its columns with apmw fit TRACE --format csv (or jsonl) --map input_tokens=...,output_tokens=... "
          "(apmw simulate --trace and apmw plan --workload-from read the known formats only; plan the fitted "
          "workload with apmw fit ... -o SPEC)")


def check_trace_file(path: str | Path) -> Path:
    """``path`` as a Path if it is a file to read a trace from, else a TraceError that says what it is instead."""
    p = Path(path)
    if p.is_file():
        return p
    if p.is_dir():
        raise TraceError(f"{path}: is a directory; give one trace file (a JSONL, CSV or OTel file)")
    if p.exists():
        raise TraceError(f"{path}: not a regular file (a device, pipe or socket); give one trace file")
    if p.is_symlink():
        raise TraceError(f"{path}: a symbolic link to nothing readable (its target is missing, or the links loop: "
                         f"{os.readlink(p)!r}); give the trace file itself")
    raise TraceError(f"{path}: no such file")


def detect(path: str | Path) -> str:
    """The format of ``path`` from its name and first line, or a TraceError that lists the accepted ones."""
    p = check_trace_file(path)
    first = _first_line(p)
    if not first:
        raise TraceError(f"{path}: the file is empty; accepted formats: {accepted()}")
    name = base_name(p)
    if not name.endswith(".csv"):
        try:
            obj = loads(first)
        except JSONDecodeError as exc:
            obj = None
            if first.lstrip().startswith(b"{") and b'"resourceSpans"' in _head(p):
                return otel.NAME  # one pretty-printed OTLP document
            if first.lstrip().startswith(b"{") and len(first) >= SNIFF_BYTES:
                raise TraceError(f"{path}:1: the first line is longer than the {SNIFF_BYTES >> 20} MiB apmw reads to "
                                 f"recognise a format: give it with --format (one of: {', '.join(NAMES)})") from None
            if first.lstrip().startswith(b"{") and first.rstrip(b" \t\r\n\0").endswith(b"}"):
                # a whole object on the line that does not parse: its JSON is what is wrong, not a CSV header
                raise TraceError(f"{path}:1: the first line is one JSON object that does not parse: "
                                 f"{not_json(first, exc)}; fix it, or give the format with --format (one of: "
                                 f"{', '.join(NAMES)}) to skip such lines and count them") from None
        if isinstance(obj, dict):
            for module in (otel, agentperf, aiperf, mooncake):
                if module.matches_record(obj):
                    return module.NAME
            keys = f"with keys {', '.join(list(obj)[:12])}" if obj else "with no keys ({})"
            raise TraceError(f"{path}:1: a JSON object {keys} is not a format apmw recognises; {MAPPED} or use one "
                             f"of: {accepted()}")
    if _head(p, 4) == b"PAR1":
        raise TraceError(f"{path}: a Parquet file; apmw reads traces as JSONL or CSV: write it out with "
                         f"pandas.read_parquet(...).to_csv(...) or .to_json(..., orient='records', lines=True); "
                         f"accepted formats: {accepted()}")
    try:
        header = next(csv.reader(io.StringIO(first.decode("utf-8-sig", errors="replace"))), [])
    except csv.Error as exc:      # e.g. lines that end in a bare carriage return (old Mac text)
        raise TraceError(f"{path}:1: not readable as CSV ({exc}); save it with \\n line endings") from None
    for module in (mini_swe, azure):
        if module.matches_header(header):
            return module.NAME
    raise TraceError(f"{path}: format not recognised (first line: {first[:120].decode(errors='replace')!r}); "
                     f"{MAPPED}; "
                     f"accepted formats: {accepted()}")


@dataclass
class Opened:
    """A reader ready to stream, plus what it learns while reading (for the summary's notes)."""

    format: str
    stream: CallStream
    state: object = None


def open_reader(path: str | Path, fmt: str, errors: LineErrors, mapping: str | dict | None = None) -> Opened:
    if fmt == otel.NAME:
        r = otel.Reader()
        return Opened(fmt, r.read(path, errors), r)
    if fmt == mooncake.NAME:
        r = mooncake.Reader()
        return Opened(fmt, r.read(path, errors), r)
    if fmt == aiperf.NAME:
        r = aiperf.Reader()
        return Opened(fmt, r.read(path, errors), r)
    simple: dict[str, Callable] = {mini_swe.NAME: mini_swe.read, azure.NAME: azure.read, agentperf.NAME: agentperf.read}
    if fmt in simple:
        return Opened(fmt, simple[fmt](path, errors))
    m = generic.parse_mapping(mapping)
    read = generic.read_csv if fmt == generic.NAME_CSV else generic.read_jsonl
    return Opened(fmt, read(path, errors, m))
