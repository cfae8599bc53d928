"""A search's results on disk: every evaluated point as a Parquet row, saved as it arrives, resumable.

While a search runs, rows land in ``OUT.parts/`` (a Parquet file per few dozen rows, each written
to a temporary name and renamed, so a killed run leaves only whole files). When it ends, ``OUT`` is
written: one row per point, in point order, and the parts are removed. ``--resume`` reads what
``OUT`` and ``OUT.parts/`` hold and plans only the points missing from them. Every file carries,
under the metadata key ``apmw.search``, the digest of the spec and space that produced it
(``space.search_key``), so rows of another search are never mixed in.

Columns (``docs/search.md``): ``point`` (the point's index in the space), ``settings`` (its axis
values as JSON), ``status`` (``feasible`` or ``pruned``), ``reason`` and ``message`` (why pruned),
the figures of ``point.FIGURES``, ``launch``; in ``OUT`` also one column per axis (named by its
dotted path, typed by its values: integer, float, boolean or string, else the value as JSON) and
``checked`` (the simulator's answer for checked points, as JSON).
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import time
from pathlib import Path

from apmw.design_search.space import points
from apmw.errors import ApmwError

META_KEY = b"apmw.search"
# A part is written once this many rows, or this many seconds of them, are waiting.
PART_ROWS = 64
PART_SECONDS = 2.0


def _pa():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ApmwError("--parquet needs pyarrow, which is not installed: pip install 'apmw[parquet]'") from None
    return pa, pq


def row_schema():
    """The columns every row has, parts and final file alike."""
    pa, _ = _pa()
    return pa.schema([
        ("point", pa.int64()), ("settings", pa.string()), ("status", pa.string()), ("reason", pa.string()),
        ("message", pa.string()), ("agents_per_replica", pa.int64()), ("binding_constraint", pa.string()),
        ("agents_per_mw", pa.float64()), ("agents_per_mw_provisioned", pa.float64()),
        ("cost_per_session_usd", pa.float64()), ("agents_per_gpu", pa.float64()),
        ("task_latency_p95_s", pa.float64()), ("output_speed_tokens_per_s", pa.float64()), ("launch", pa.string()),
    ])


class ResultStore:
    """The Parquet results of one search (spec and space ``key``) at ``path``."""

    def __init__(self, path: Path, key: str, axes: dict[str, list]):
        self.path, self.key, self.axes = path, key, axes
        self.parts = path.with_name(path.name + ".parts")
        self._waiting: list[dict] = []
        self._since = time.monotonic()
        _pa()
        if self.parts.exists() and not self.parts.is_dir():
            raise ApmwError(self._parts_refusal("it is a file"))

    def _parts_refusal(self, why: str) -> str:
        return (f"{self.parts}: cannot hold the search's parts there ({why}); a search with --parquet {self.path} "
                "saves its rows in that folder as they arrive: remove or move what is in the way, or give another "
                "--parquet path")

    def saved_rows(self) -> list[dict]:
        """The rows a stopped search of the same spec and space left here (``--resume``), each checked to be a row
        that search could have written (:func:`check_saved_row`)."""
        files = ([self.path] if self.path.is_file() else []) + sorted(self.parts.glob("part-*.parquet"))
        settings = {i: json.loads(json.dumps(s)) for i, s in points(self.axes)} if files else {}
        rows: dict[int, dict] = {}
        for f in files:
            for k, row in enumerate(self._read(f)):
                check_saved_row(f, k, row, settings)
                rows.setdefault(row["point"], row)
        return list(rows.values())

    def saved_checks(self) -> dict[int, dict]:
        """The simulator's answers ``OUT`` holds from an earlier run of the same search (its ``checked`` column), by
        point: a resumed search without ``--check`` keeps them rather than writing the column empty."""
        if not self.path.is_file():
            return {}
        _, pq = _pa()
        self._read(self.path)           # the same spec and space, or a clear refusal
        try:
            if "checked" not in pq.read_schema(self.path).names:
                return {}
            table = pq.read_table(self.path, columns=["point", "checked"]).to_pylist()
        except Exception:       # the rows were read above: a column that is not there to read holds no answers
            return {}
        return {r["point"]: check_saved_check(self.path, k, r["point"], r["checked"])
                for k, r in enumerate(table) if r["checked"]}

    def clear(self) -> int:
        """Forget saved parts (a fresh start); how many rows they held (a part that cannot be read holds none: it
        is removed all the same, since the search starts afresh)."""
        held = 0
        for f in sorted(self.parts.glob("part-*.parquet")) if self.parts.is_dir() else ():
            try:
                held += len(self._read(f))
            except ApmwError:
                pass
        shutil.rmtree(self.parts, ignore_errors=True)
        return held

    def add(self, rows: list[dict]) -> None:
        self._waiting.extend(rows)
        if len(self._waiting) >= PART_ROWS or time.monotonic() - self._since >= PART_SECONDS:
            self.flush()

    def flush(self) -> None:
        """Write the waiting rows as one part (whole or not at all)."""
        if not self._waiting:
            return
        pa, pq = _pa()
        try:
            self.parts.mkdir(exist_ok=True)
        except OSError as exc:
            raise ApmwError(self._parts_refusal(exc.strerror)) from None
        first = min(r["point"] for r in self._waiting)
        name = self.parts / f"part-{first:09d}-{time.time_ns()}.parquet"
        table = pa.Table.from_pylist(self._waiting, schema=row_schema()).replace_schema_metadata(self._meta())
        tmp = name.with_suffix(".tmp")
        self._write(table, tmp)
        os.replace(tmp, name)
        self._waiting, self._since = [], time.monotonic()

    def finish(self, rows: list[dict], checked: dict[int, dict] | None = None) -> None:
        """``OUT``: every row in point order, with a column per axis and the checked answers; parts removed."""
        pa, pq = _pa()
        table = final_table(rows, self.axes, checked or {}).replace_schema_metadata(self._meta())
        tmp = self.path.with_name(self.path.name + ".tmp")
        self._write(table, tmp)
        os.replace(tmp, self.path)
        self._waiting = []
        shutil.rmtree(self.parts, ignore_errors=True)

    def _meta(self) -> dict:
        return {META_KEY: json.dumps({"key": self.key, "axes": self.axes}, default=str).encode()}

    def _read(self, f: Path) -> list[dict]:
        _, pq = _pa()
        fix = "remove it to start afresh, or give another --parquet path"
        try:
            missing = [c for c in row_schema().names if c not in pq.read_schema(f).names]
            table = None if missing else pq.read_table(f, columns=row_schema().names)
        except Exception as exc:     # pyarrow raises ArrowInvalid, OSError or KeyError for a foreign file
            said = " ".join(str(exc).split())[:200]
            raise ApmwError(f"{f}: cannot read it as a search's results ({said}); {fix}") from None
        if table is None:
            raise ApmwError(f"{f}: not a search's results: it has no column {', '.join(missing[:4])}"
                            f"{' ...' if len(missing) > 4 else ''}; {fix}")
        try:
            meta = json.loads((table.schema.metadata or {}).get(META_KEY, b"{}"))
        except ValueError:
            meta = None
        if not isinstance(meta, dict) or meta.get("key") != self.key:
            raise ApmwError(f"{f} holds the results of another spec or space; --resume continues only the same "
                            "search: remove it, or give another --parquet path")
        return table.to_pylist()

    @staticmethod
    def _write(table, path: Path) -> None:
        _, pq = _pa()
        try:
            pq.write_table(table, path)
        except OSError as exc:
            raise ApmwError(f"{path}: cannot write it ({exc})") from None


def check_saved_row(f: Path, k: int, row: dict, settings: dict[int, dict]) -> None:
    """Row ``k`` of the results file ``f`` is one the search of that space writes: a point of it (``settings``, by
    index), with that point's settings, a status, and for a feasible point finite figures (the others' reason).
    A file changed since (or written by hand) is refused with the row, rather than read into the answer."""
    from apmw.design_search.point import FIGURES, OPTIONAL_FIGURES

    point = row.get("point")
    where = f"{f}: row {k + 1}" + (f" (point {point})" if isinstance(point, int) else "")
    fix = "; the file is not as the search wrote it: remove it to start afresh, or give another --parquet path"
    if not isinstance(point, int) or point not in settings:
        raise ApmwError(f"{where}: point {point!r} is not a point of this space (0 to {len(settings) - 1}){fix}")
    try:
        given = json.loads(row.get("settings") or "")
    except ValueError:
        raise ApmwError(f"{where}: its settings {str(row.get('settings'))[:80]!r} are not JSON{fix}") from None
    if given != settings[point]:
        raise ApmwError(f"{where}: its settings {json.dumps(given)[:120]} are not that point's "
                        f"({json.dumps(settings[point])[:120]}){fix}")
    status = row.get("status")
    if status == "pruned":
        if not row.get("reason"):
            raise ApmwError(f"{where}: a pruned point without a reason{fix}")
        return
    if status != "feasible":
        raise ApmwError(f"{where}: status {status!r} is neither 'feasible' nor 'pruned'{fix}")
    for name in FIGURES:
        v = row.get(name)
        if v is None and name in OPTIONAL_FIGURES:
            continue
        ok = (isinstance(v, str) and v) if name == "binding_constraint" else (
            _non_negative_number(v))
        if not ok:
            raise ApmwError(f"{where}: {name} is {v!r}, where a feasible point has a "
                            f"{'constraint' if name == 'binding_constraint' else 'finite number, 0 or more'}{fix}")


def _non_negative_number(v: object) -> bool:
    """A finite number, 0 or more, as a results file holds one (a bool is not one)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


# The simulator's answer at a point (apmw.design_search.check): its fields and whether each holds a number (None:
# a number or null, as an interval's ends are where too few tasks ran), or a list.
CHECK_FIELDS = {"agents_per_replica": int, "agents_per_replica_interval": list, "agents_simulated": list,
                "binding_constraint": str, "agents_per_mw": float, "cost_per_session_usd": float,
                "task_latency_p95_s": None, "task_latency_p95_interval_s": list, "completed_tasks": int}


def check_saved_check(f: Path, k: int, point: int, cell: str) -> dict:
    """The ``checked`` cell of row ``k`` of ``f`` (point ``point``), read: the simulator's answer there as
    :func:`apmw.design_search.check.check_front` writes it, or its reason for none; refused otherwise, since a
    resumed search writes it into the new file as it stands."""
    where = f"{f}: row {k + 1} (point {point}): its checked cell {cell[:80]!r}"
    fix = "; the file is not as the search wrote it: remove it to start afresh, or give another --parquet path"
    try:
        value = json.loads(cell)
    except (ValueError, RecursionError):
        raise ApmwError(f"{where} is not JSON{fix}") from None
    if isinstance(value, dict) and set(value) == {"not_checked"} and isinstance(value["not_checked"], str):
        return value
    if not isinstance(value, dict) or set(value) != set(CHECK_FIELDS):
        raise ApmwError(f"{where} is not the simulator's answer (the fields {', '.join(CHECK_FIELDS)}) nor a "
                        f"reason for none ({{\"not_checked\": ...}}){fix}")
    for name, kind in CHECK_FIELDS.items():
        v = value[name]
        number = _non_negative_number(v)
        ok = {int: number and isinstance(v, int), float: number, str: isinstance(v, str), list: isinstance(v, list),
              None: v is None or number}[kind]
        if not ok:
            raise ApmwError(f"{where}: {name} is {v!r}{fix}")
    return value


def final_table(rows: list[dict], axes: dict[str, list], checked: dict[int, dict]):
    pa, _ = _pa()
    rows = sorted(rows, key=lambda r: r["point"])
    table = pa.Table.from_pylist(rows, schema=row_schema())
    settings = [json.loads(r["settings"]) for r in rows]
    for path, values in axes.items():
        kind = _axis_type(values)
        column = [s.get(path) for s in settings]
        if kind is None:
            table = table.append_column(path, pa.array([json.dumps(v) for v in column], pa.string()))
        else:
            table = table.append_column(path, pa.array(column, kind()))
    return table.append_column("checked", pa.array(
        [json.dumps(checked[r["point"]]) if r["point"] in checked else None for r in rows], pa.string()))


INT64_MIN, INT64_MAX = -2**63, 2**63 - 1


def _axis_type(values: list):
    """The Arrow type an axis' values share (null, "leave the field out", aside), or None (then they
    are written as JSON text): an integer past int64's range is JSON text too, never rounded to a float."""
    pa, _ = _pa()
    values = [v for v in values if v is not None] or [None]
    if all(isinstance(v, bool) for v in values):
        return pa.bool_
    if any(isinstance(v, int) and not isinstance(v, bool) and not INT64_MIN <= v <= INT64_MAX for v in values):
        return None
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return pa.int64
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return pa.float64
    if all(isinstance(v, str) for v in values):
        return pa.string
    return None


def write_csv(rows: list[dict], axes: dict[str, list], path: Path) -> None:
    """The same columns as the Parquet ``OUT`` (no pyarrow needed), one row per point."""
    from apmw.design_search.point import FIGURES

    names = ["point", "settings", "status", "reason", "message", *FIGURES, "launch", *axes]
    try:
        with path.open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(names)
            for r in sorted(rows, key=lambda r: r["point"]):
                s = json.loads(r["settings"])
                w.writerow([_cell(r.get(n)) for n in names[:-len(axes)]] + [_cell(s.get(a)) for a in axes])
    except OSError as exc:
        raise ApmwError(f"--csv {path}: cannot write it ({exc.strerror or exc})") from None


def _cell(v: object) -> object:
    if v is None:
        return ""
    return json.dumps(v) if isinstance(v, (dict, list)) else v
