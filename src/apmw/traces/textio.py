"""Line-by-line file access shared by the readers: open (plain or gzip), JSON per line.

orjson parses JSON about 3x faster than the standard library, which is most of a
JSONL reader's time; it is used when installed and ``json`` otherwise.
"""

from __future__ import annotations

import gzip
import io
import json as stdjson
import zlib
from pathlib import Path
from typing import IO, Callable

from apmw.traces.records import TraceError

try:  # optional speed-up, same results
    import orjson

    loads: Callable[[bytes | str], object] = orjson.loads
    JSONDecodeError: type[Exception] = orjson.JSONDecodeError
except ImportError:  # pragma: no cover - exercised only without orjson
    import json

    loads = json.loads
    JSONDecodeError = json.JSONDecodeError


def not_json(raw: bytes, exc: Exception) -> str:
    """Why the line ``raw`` is no JSON, as a skip reason says it: bytes that are not UTF-8 named as such (the parser
    calls them surrogates), else the parser's words."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return "not valid JSON (bytes that are not UTF-8)"
    return f"not valid JSON ({exc})"


REPEATED_KEY = "the key '{}' is given twice in one object: keep one (which value is meant is not apmw's to guess)"


def repeated_key(raw: bytes, obj: dict) -> str | None:
    """A key that an object on the line ``raw`` (``obj`` as read, or any object nested in it) gives twice, or None.
    A JSON reader keeps the last value of a repeated key and drops the others silently, so such a line is skipped
    with this reason instead of read as one of its values (a multi-turn line's token counts sit inside its
    ``turns``). Cheap: a line with no more colons than its objects have keys passes at once (no colon in its
    strings); else each key is looked for twice in the line's bytes (as written, without escapes), and only a line
    where one appears twice is parsed again, keeping each object's pairs, to confirm it."""
    colons = raw.count(b":")
    if colons == len(obj) or colons == _key_count(obj):
        return None         # every key is followed by a colon: as many colons as keys leave room for no other key
    if all(raw.count(f'"{key}"'.encode()) <= 1 for key in set(_keys(obj))):
        return None
    twice: list[str] = []

    def pairs(items: list) -> dict:
        names = [name for name, _ in items]
        twice.extend(name for i, name in enumerate(names) if name in names[:i])
        return dict(items)

    stdjson.loads(raw, object_pairs_hook=pairs)
    return twice[0] if twice else None


def _key_count(value: object) -> int:
    """The keys of ``value``'s objects, at most: a list is looked into only where its first item is a container
    (a list of numbers, such as Mooncake's hash_ids, costs nothing); one whose later items hold objects is
    undercounted, which only sends its line the slow way."""
    if isinstance(value, dict):
        return len(value) + sum(_key_count(v) for v in value.values() if isinstance(v, (dict, list)))
    if isinstance(value, list) and value and isinstance(value[0], (dict, list)):
        return sum(_key_count(v) for v in value)
    return 0


def _keys(value: object) -> list[str]:
    """Every key of every object in a value read from JSON."""
    if isinstance(value, dict):
        return [*value, *(k for v in value.values() for k in _keys(v))]
    if isinstance(value, list):
        return [k for v in value for k in _keys(v)]
    return []

GZIP_MAGIC = b"\x1f\x8b"
UTF8_BOM = b"\xef\xbb\xbf"
_GZIP_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error)


class _GzipTrace(gzip.GzipFile):
    """A ``.gz`` trace whose read errors (a truncated or corrupt stream) name the file."""

    def _failed(self, exc: Exception) -> TraceError:
        return TraceError(f"{self.name}: the gzip stream cannot be read to its end ({exc}); is the file "
                          "truncated or corrupt? Re-download or re-compress it")

    def read(self, size=-1):
        try:
            return super().read(size)
        except _GZIP_ERRORS as exc:
            raise self._failed(exc) from None

    def read1(self, size=-1):
        try:
            return super().read1(size)
        except _GZIP_ERRORS as exc:
            raise self._failed(exc) from None

    def readline(self, size=-1):
        try:
            return super().readline(size)
        except _GZIP_ERRORS as exc:
            raise self._failed(exc) from None

    def peek(self, n):
        try:
            return super().peek(n)
        except _GZIP_ERRORS as exc:
            raise self._failed(exc) from None


def open_binary(path: str | Path) -> IO[bytes]:
    """Open a trace for reading bytes; ``.gz`` files are decompressed on the fly (and one that is not
    gzip, or ends early, is a :class:`TraceError` naming it). A UTF-8 byte-order mark is skipped; UTF-16 and
    UTF-32 text is refused."""
    p = Path(path)
    if p.suffix == ".gz":
        with open(p, "rb") as f:
            magic = f.read(2)
        if magic != GZIP_MAGIC:
            raise TraceError(f"{p}: not a gzip file despite its .gz name (it starts {magic!r}); rename it or "
                             "compress it with gzip")
        stream: IO[bytes] = _GzipTrace(p, "rb")
    else:
        stream = open(p, "rb", buffering=1 << 20)
    head = stream.peek(4)[:4]
    if head[:2] == GZIP_MAGIC:
        stream.close()
        raise TraceError(f"{p}: " + ("decompressed, it is gzip again (compressed twice?): gunzip it once"
                                     if p.suffix == ".gz" else
                                     f"the file is gzip-compressed, but its name does not end in .gz: rename it "
                                     f"to {p.name}.gz, or gunzip it"))
    _refuse_wide_text(head, p, stream)
    if head.startswith(UTF8_BOM):       # Windows tools start UTF-8 text with one; JSON does not allow it
        stream.read(len(UTF8_BOM))
    return stream


def _refuse_wide_text(head: bytes, path: Path, stream: IO[bytes]) -> None:
    """A UTF-16 or UTF-32 file (Windows tools write them: PowerShell's ``>``, Excel's "Unicode text") reads as
    bytes with a NUL beside every letter, which no reader recognises line by line: refused, saying how to
    convert it."""
    marked = head[:2] in (b"\xff\xfe", b"\xfe\xff") or head[:4] == b"\x00\x00\xfe\xff"
    if marked or b"\x00" in head[:2]:
        stream.close()
        kind = ("UTF-16 or UTF-32 text" if marked else
                "NUL bytes (UTF-16 or UTF-32 text without a byte-order mark, or binary data)")
        read = f"gunzip -c '{path}' | iconv" if path.suffix == ".gz" else f"iconv '{path}'"
        raise TraceError(f"{path}: the file is {kind} (it starts {head!r}), not UTF-8: save it as UTF-8, e.g. "
                         f"{read} -f UTF-16 -t UTF-8 > trace-utf8{Path(base_name(path)).suffix}")


def open_text(path: str | Path) -> IO[str]:
    """Open a trace as text (CSV), tolerating a UTF-8 byte-order mark."""
    return io.TextIOWrapper(open_binary(path), encoding="utf-8-sig", newline="")


def base_name(path: str | Path) -> str:
    """The file name without .gz, to recognise formats by extension."""
    name = Path(path).name.lower()
    return name[:-3] if name.endswith(".gz") else name
