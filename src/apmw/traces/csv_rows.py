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
from typing import Iterator

from apmw.traces.records import LineErrors
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
    with stream:
        while True:
            try:
                for row in rows:
                    if counter.count != seen:
                        bad = sum(len(_SURROGATE.findall(c)) for c in row)
                        if bad:
                            seen += bad
                            errors.lines_read += 1
                            errors.skip(rows.line_num, "bytes that are not UTF-8")
                            continue
                    if not row or (len(row) == 1 and not row[0].strip()):
                        continue                # a blank line, as in JSONL: neither read nor skipped
                    yield rows.line_num, row
                return
            except csv.Error as exc:       # the reader goes on with the next line
                errors.lines_read += 1
                errors.skip(rows.line_num, f"unreadable CSV ({exc})")
