"""Line-by-line file access shared by the readers: open (plain or gzip), JSON per line.

orjson parses JSON about 3x faster than the standard library, which is most of a
JSONL reader's time; it is used when installed and ``json`` otherwise.
"""

from __future__ import annotations

import gzip
import io
from pathlib import Path
from typing import IO, Callable

try:  # optional speed-up, same results
    import orjson

    loads: Callable[[bytes | str], object] = orjson.loads
    JSONDecodeError: type[Exception] = orjson.JSONDecodeError
except ImportError:  # pragma: no cover - exercised only without orjson
    import json

    loads = json.loads
    JSONDecodeError = json.JSONDecodeError


def open_binary(path: str | Path) -> IO[bytes]:
    """Open a trace for reading bytes; ``.gz`` files are decompressed on the fly."""
    p = Path(path)
    if p.suffix == ".gz":
        return gzip.open(p, "rb")
    return open(p, "rb", buffering=1 << 20)


def open_text(path: str | Path) -> IO[str]:
    """Open a trace as text (CSV), tolerating a UTF-8 byte-order mark."""
    return io.TextIOWrapper(open_binary(path), encoding="utf-8-sig", newline="")


def base_name(path: str | Path) -> str:
    """The file name without .gz, to recognise formats by extension."""
    name = Path(path).name.lower()
    return name[:-3] if name.endswith(".gz") else name
