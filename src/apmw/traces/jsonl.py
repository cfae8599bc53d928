"""The JSONL loop every line-per-record reader shares: parse, check, convert, count skips."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

from apmw.traces.records import LineErrors
from apmw.traces.textio import JSONDecodeError, loads, not_json, open_binary, REPEATED_KEY, repeated_key


def records(path: str | Path, errors: LineErrors) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line that is a JSON object; the rest are skipped."""
    with open_binary(path) as f:
        for line, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            errors.lines_read += 1
            try:
                obj = loads(raw)
            except JSONDecodeError as exc:
                errors.skip(line, not_json(raw, exc))
                continue
            if not isinstance(obj, dict):
                errors.skip(line, "not a JSON object")
                continue
            twice = repeated_key(raw, obj)
            if twice is not None:
                errors.skip(line, REPEATED_KEY.format(twice))
                continue
            yield line, obj


def convert_each(path: str | Path, errors: LineErrors, convert: Callable[[int, dict], Iterator]) -> Iterator:
    """Run ``convert`` on each object; a ValueError/TypeError/KeyError becomes a counted skip."""
    for line, obj in records(path, errors):
        try:
            calls = list(convert(line, obj))
        except KeyError as exc:
            errors.skip(line, f"missing field {exc}")
            continue
        except (ValueError, TypeError) as exc:
            errors.skip(line, f"bad value: {exc}")
            continue
        yield from calls
