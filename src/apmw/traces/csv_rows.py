"""The CSV loop every CSV trace reader shares: rows with their line numbers, bad lines skipped and counted.

A trace is untrusted input: one bad line must cost that line, not the fit. So a byte that is not
UTF-8, a field past the csv module's size limit, or a bare carriage return inside an unquoted
field (each a ``csv.Error`` or a decode error) skips its line through :class:`LineErrors` (with
``--strict``: stops there, naming it). A ``.gz`` that is not gzip, or one that ends early, stops the
read naming the file (:func:`apmw.traces.textio.open_binary`).

Decoding runs ahead of the parser in chunks, so an undecodable byte is first seen as a count (the
``_MARK`` error handler replaces it with a lone surrogate) and then found in the row that holds it:
only rows read while such a count is pending are searched, so clean files pay nothing for it.
"""

from __future__ import annotations

import codecs
import csv
import io
import re
from pathlib import Path
from typing import Iterable, Iterator

from apmw.traces.records import LineErrors, TraceError
from apmw.traces.textio import open_binary

_MARK = "apmw-mark-undecodable"
_SURROGATE = re.compile("[\udc80-\udcff]")


class _Undecodable:
    """Counts bytes the decoder could not read (a codecs error handler), replacing each with a lone
    surrogate that the row search finds."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, exc: UnicodeError) -> tuple[str, int]:
        if not isinstance(exc, UnicodeDecodeError):
            raise exc
        bad = exc.object[exc.start:exc.end]
        self.count += len(bad)
        return "".join(chr(0xDC00 + b) for b in bad), exc.end


_counter = _Undecodable()
codecs.register_error(_MARK, _counter)


def csv_rows(path: str | Path, errors: LineErrors) -> Iterator[tuple[int, list[str]]]:
    """(line number, cells) for each non-blank row of a CSV trace, the header first; bad rows are skipped."""
    stream = io.TextIOWrapper(open_binary(path), encoding="utf-8-sig", errors=_MARK, newline="")
    rows = csv.reader(stream)
    seen = _counter.count
    counter = _counter
    width = None                       # the header's cells
    ended = 0                          # the line the last row ended on: a row runs from the line after it
    with stream:
        while True:
            try:
                for row in rows:
                    first, ended = ended + 1, rows.line_num
                    if counter.count != seen:
                        bad = sum(len(_SURROGATE.findall(c)) for c in row)
                        if bad:
                            seen += bad
                            errors.lines_read += 1
                            errors.skip(rows.line_num, "bytes that are not UTF-8")
                            continue
                    if not row or (len(row) == 1 and not row[0].strip()):
                        continue                # a blank line, as in JSONL: neither read nor skipped
                    if width is None:
                        width = len(row)
                    elif ended > first and _holds_rows(row, width):
                        _skip_lines(errors, first, ended, UNCLOSED_QUOTE)
                        continue
                    yield rows.line_num, row
                return
            except csv.Error as exc:       # the reader goes on with the next line
                first, ended = ended + 1, rows.line_num
                if ended > first:          # a quoted cell ran on until the size limit: every line it took
                    _skip_lines(errors, first, ended, f"{UNCLOSED_QUOTE} ({exc})")
                else:
                    errors.lines_read += 1
                    errors.skip(ended, f"unreadable CSV ({exc})")


def column_index(header: list[str], read: Iterable[str], path: str | Path, line: int = 1) -> dict[str, int]:
    """Each header name's column; a name the reader reads (``read``) that heads two columns is refused, since
    which of them holds the figure cannot be told (the last one was read)."""
    twice = sorted({name for name in read if header.count(name) > 1})
    if twice:
        raise TraceError(f"{path}:{line}: column(s) {', '.join(map(repr, twice))} head more than one column of the "
                         "header, so which one to read cannot be told: rename the others")
    return {name: i for i, name in enumerate(header)}


# A quoted cell that holds whole CSV lines: a quote opened and never closed reads every line after it as one cell.
UNCLOSED_QUOTE = ("in a quoted cell that runs over several lines holding whole CSV rows: a quote opened and not "
                  "closed? (its first line is where the quote opens)")


def _holds_rows(row: list[str], width: int) -> bool:
    """Does a cell of ``row`` hold a line break followed by a line with a row's worth of commas? (Text with line
    breaks in a quoted cell is valid CSV; other rows swallowed into one cell are not.)"""
    return any("\n" in cell and any(line.count(",") >= width - 1 for line in cell.splitlines()[1:])
               for cell in row if len(cell) > width)


def _skip_lines(errors: LineErrors, first: int, last: int, reason: str) -> None:
    """Lines ``first``..``last``, read as one row, each skipped for ``reason``: every call they held is counted."""
    errors.lines_read += last - first + 1
    for line in range(first, last + 1):
        errors.skip(line, reason)
