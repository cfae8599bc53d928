"""The results file (JSON lines, one record per line, flushed as written) and its summary.

Record types, in the order a run writes them:

* ``run``  -- one per segment (a run, each ``--agents-sweep`` level, each ``--resume``): the
  configuration (``config``: endpoint, model, api, agents, durations, seed, workload, slo),
  ``segment`` number and wall-clock ``started_at``. Never holds the API key.
* ``call`` -- one per finished call, ok or faulted: ``ttft_s``, ``tpot_s``, ``latency_s``,
  ``prompt_tokens``/``output_tokens`` (from the server's usage), the targets
  (``target_prompt_tokens``, ``target_output_tokens``), ``fault`` kind, ``start_s`` (seconds
  from the segment's start), ``warmup`` (its task began during warm-up), ``token_times_s`` (when
  each streamed chunk arrived, seconds after the call's start; files written before it have none).
* ``task`` -- one per finished task: ``status`` (``completed``, ``failed``: a call faulted,
  ``cancelled``: the run stopped first), ``latency_s``, ``start_s``, ``end_s``, ``warmup``.
* ``server`` -- the server's Prometheus ``/metrics`` polled (``t_s``, ``metrics``), where it has them.
* ``end``  -- the segment ended: ``reason`` (``duration`` or ``interrupted``) and ``elapsed_s``.

Read back, each record is checked (:mod:`apmw.loadgen.records`): a damaged or hand-edited one is refused at its
line and field.

A killed run loses nothing already written; :func:`summarise` works on a file without ``end``
records (the window then ends at the last event).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np

from apmw.capacity.slo import check_slo
from apmw.loadgen.client import FAULT_KINDS, BenchError
from apmw.loadgen.metrics import summarise_polls
from apmw.loadgen.records import check_record, recorded_slo
from apmw.sim.result import quantile_interval


class ResultsWriter:
    """Appends one JSON object per line and flushes it to the OS at once."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f: IO[str] = path.open("a", encoding="utf-8")

    def write(self, record: dict) -> None:
        self._f.write(json.dumps(record, allow_nan=False) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def read_records(path: Path) -> list[dict]:
    """Every record of a results file; a torn last line (the run was killed mid-write) is skipped."""
    if not path.is_file():
        raise BenchError(f"{path}: results file not found")
    records: list[dict] = []
    segments: set[int] = set()
    raw = path.read_bytes()
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise BenchError(f"{path}:{line}: byte 0x{raw[exc.start]:02x} is not UTF-8 -- is this an apmw bench "
                         "results file?") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):     # not JSON, a number past Python's 4,300 digits, nested too deep
            if n == len(lines):
                break
            raise BenchError(f"{path}:{n}: not a JSON object apmw bench writes -- is this an apmw bench results "
                             "file?") from None
        if not isinstance(rec, dict) or "type" not in rec:
            raise BenchError(f"{path}:{n}: a record without 'type' -- is this an apmw bench results file?")
        if not records and rec["type"] != "run":
            break
        records.append(check_record(rec, path, n, segments))
    if not records:
        raise BenchError(f"{path}: does not start with a 'run' record -- not an apmw bench results file")
    return records


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p95": None, "p99": None}
    a = np.asarray(values, dtype=float)
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
            "p99": float(np.percentile(a, 99))}


@dataclass
class _Window:
    """One segment's measurement window [warmup_s, end_s] in its own clock."""
    warmup_s: float
    end_s: float

    @property
    def length_s(self) -> float:
        return max(self.end_s - self.warmup_s, 0.0)


@dataclass
class Level:
    """All records of the segments run at one number of agents."""
    agents: int
    slo: dict
    windows: dict[int, _Window] = field(default_factory=dict)
    calls: list[dict] = field(default_factory=list)
    tasks: list[dict] = field(default_factory=list)
    server: list[dict] = field(default_factory=list)    # /metrics polls


def levels_of(records: list[dict]) -> dict[int, Level]:
    """Records grouped by number of agents, with each segment's measurement window."""
    levels: dict[int, Level] = {}
    seg_agents: dict[int, int] = {}
    last_event: dict[int, float] = {}
    ends: dict[int, float] = {}
    for rec in records:
        seg = rec.get("segment", 0)
        if rec["type"] == "run":
            cfg = rec["config"]
            seg_agents[seg] = cfg["agents"]
            lvl = levels.setdefault(cfg["agents"], Level(agents=cfg["agents"], slo=cfg.get("slo", {})))
            lvl.windows[seg] = _Window(warmup_s=cfg["warmup_s"], end_s=cfg["warmup_s"] + cfg["duration_s"])
        elif rec["type"] == "server":
            levels[seg_agents[seg]].server.append(rec)
        elif rec["type"] in ("call", "task"):
            lvl = levels[seg_agents[seg]]
            (lvl.calls if rec["type"] == "call" else lvl.tasks).append(rec)
            last_event[seg] = max(last_event.get(seg, 0.0), rec.get("end_s", rec.get("start_s", 0.0) +
                                                                     rec.get("latency_s", 0.0)))
        elif rec["type"] == "end":
            ends[seg] = rec["measure_end_s"]
    for lvl in levels.values():
        for seg, win in lvl.windows.items():
            # the window closes at the planned duration, or earlier if the segment stopped early
            win.end_s = min(win.end_s, ends.get(seg, last_event.get(seg, win.warmup_s)))
    return levels


def summarise_level(lvl: Level) -> dict:
    """The summary of one level; field names follow ``apmw plan --json`` where they mean the same."""
    measured_s = sum(w.length_s for w in lvl.windows.values())
    tasks = [t for t in lvl.tasks if not t["warmup"]]
    done = [t for t in tasks if t["status"] == "completed"]
    calls = [c for c in lvl.calls if not c["warmup"]]
    ok = [c for c in calls if c["ok"]]

    def in_window(rec: dict, key: str) -> bool:
        w = lvl.windows[rec["segment"]]
        return w.warmup_s <= rec[key] <= w.end_s

    # Rates count what happened inside the window, whichever task it belongs to: tasks begun in the
    # warm-up are left out of the latencies, but their calls and completions in the window are load the
    # server carried. Left out of the rates, they bias them low by about one task latency over the window
    # (9-13 % on 35 s levels of 2.4-3.9 s tasks; nearly all of it for tasks of minutes).
    finished_in_window = [t for t in lvl.tasks if t["status"] == "completed" and in_window(t, "end_s")]
    calls_in_window = [c for c in lvl.calls if c["ok"] and in_window(c, "start_s")]
    faults = Counter(c["fault"] for c in lvl.calls if not c["ok"])
    ttft = _stats([c["ttft_s"] for c in ok])
    tpot = _stats([c["tpot_s"] for c in ok if c["tpot_s"] is not None])
    latency = _stats([t["latency_s"] for t in done])

    def rate(n):
        return n / measured_s if measured_s > 0 else None

    slo = lvl.slo or {}
    verdict = _verdict(slo, latency, ttft, tpot)
    return {
        "agents": lvl.agents,
        "window_s": measured_s,
        "completed_tasks": len(done),
        "failed_tasks": sum(t["status"] == "failed" for t in tasks),
        "cancelled_tasks": sum(t["status"] == "cancelled" for t in tasks),
        "meets_slo": None if verdict is None else verdict.meets,
        "slo_failed": None if verdict is None else list(verdict.failed),
        "slo": slo,
        "slo_task_latency_p95_s": slo.get("task_latency_p95_s"),
        "task_latency_s": latency,
        "task_latency_p95_interval_s": _interval([t["latency_s"] for t in done]),
        "ttft_s": ttft,
        "ttft_p95_s": ttft["p95"],
        "tpot_s": tpot,
        "tpot_p95_s": tpot["p95"],
        "time_per_output_token_s": tpot["mean"],
        "calls": len(ok),
        "calls_per_session": (sum(t["calls"] for t in done) / len(done)) if done else None,
        "calls_per_s": rate(len(calls_in_window)),
        "sessions_per_s": rate(len(finished_in_window)),
        "tokens_per_s": {"input": rate(sum(c["prompt_tokens"] or 0 for c in calls_in_window)),
                         "output": rate(sum(c["output_tokens"] or 0 for c in calls_in_window)),
                         "cached": rate(sum(c["cached_tokens"] or 0 for c in calls_in_window))},
        "prefix_hit_rate": _share(sum(c["cached_tokens"] or 0 for c in ok), sum(c["prompt_tokens"] or 0 for c in ok)),
        "prompt_tokens_mean": _mean([c["prompt_tokens"] for c in ok if c["prompt_tokens"] is not None]),
        "target_prompt_tokens_mean": _mean([c["target_prompt_tokens"] for c in ok]),
        "output_tokens_mean": _mean([c["output_tokens"] for c in ok if c["output_tokens"] is not None]),
        "target_output_tokens_mean": _mean([c["target_output_tokens"] for c in ok]),
        "in_flight": _concurrency(lvl, _request_span),
        "decode_batch_mean": _concurrency(lvl, _decode_span)["mean"],
        "decode_batch_max": _concurrency(lvl, _decode_span)["max"],
        "server_metrics": summarise_polls([[p for p in lvl.server if p["segment"] == seg
                                             and w.warmup_s <= p["t_s"] <= w.end_s]
                                            for seg, w in lvl.windows.items()]),
        "errors": sum(faults.values()),
        "faults": {k: faults.get(k, 0) for k in FAULT_KINDS},
        "first_fault": _first_fault(lvl.calls),
    }


def _first_fault(calls: list[dict]) -> dict | None:
    """The first failed call's kind and what the server or the client said (None where none failed): the reason
    a run of faults had, said where the counts are, not only in the results file."""
    c = next((c for c in calls if not c["ok"]), None)
    return None if c is None else {"fault": c["fault"], "detail": c.get("detail") or ""}


def _interval(values: list[float]) -> list[float] | None:
    """The p95's distribution-free 95 % interval, as ``apmw simulate`` gives it (None: too few tasks)."""
    ci = quantile_interval(values)
    return None if ci is None else list(ci)


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def _mean(v: list[float]) -> float | None:
    return float(np.mean(v)) if v else None


def _verdict(slo: dict, latency: dict, ttft: dict, tpot: dict):
    """The measured p95s against the spec's SLO, by the check ``apmw plan`` and ``apmw simulate`` use
    (:func:`apmw.capacity.slo.check_slo`; a p95 nobody measured fails). None without a task SLO."""
    if not slo.get("task_latency_p95_s"):
        return None
    return check_slo(recorded_slo(slo), latency["p95"], ttft["p95"], tpot["p95"])


def _concurrency(lvl: Level, spans_of) -> dict:
    """Time-average and maximum number of open spans (one per call) over the measurement windows."""
    covered, peak = 0.0, 0
    for seg, w in lvl.windows.items():
        spans = [s for c in lvl.calls if c["segment"] == seg for s in [spans_of(c)] if s is not None]
        if not spans or w.length_s <= 0:
            continue
        covered += sum(max(0.0, min(b, w.end_s) - max(a, w.warmup_s)) for a, b in spans)
        level = 0
        for _, d in sorted([(a, 1) for a, b in spans] + [(b, -1) for a, b in spans]):
            level += d
            peak = max(peak, level)
    total = sum(w.length_s for w in lvl.windows.values())
    return {"mean": covered / total if total > 0 else None, "max": peak}


def _request_span(c: dict):
    return c["start_s"], c["start_s"] + c["latency_s"]


def _decode_span(c: dict):
    """From the first streamed token to the last: the call is in the server's running batch."""
    if not c["ok"] or c["ttft_s"] is None:
        return None
    return c["start_s"] + c["ttft_s"], c["start_s"] + c["latency_s"]


def summarise(records: list[dict]) -> dict:
    """Summary of a whole results file: one entry per level, and the measured N* for a sweep.

    ``agents_per_replica`` is the largest level that met the SLO below the first that missed it;
    ``agents_per_replica_range`` is where the knee lies, ``[that level, the first missed one - 1]``.
    Its upper end is null when no level missed: the sweep stopped short of the knee, and N* is at
    least its top level, not equal to it.
    """
    levels = [summarise_level(lvl) for lvl in sorted(levels_of(records).values(), key=lambda lv: lv.agents)]
    if not any(lv["meets_slo"] is not None for lv in levels):
        return {"levels": levels, "agents_per_replica": None, "agents_per_replica_range": None}
    first_fail = next((lv["agents"] for lv in levels if lv["meets_slo"] is False), None)
    n_star = max((lv["agents"] for lv in levels if lv["meets_slo"] and (first_fail is None or lv["agents"] < first_fail)),
                 default=0)
    return {"levels": levels, "agents_per_replica": n_star,
            "agents_per_replica_range": [n_star, None if first_fail is None else first_fail - 1]}


def knee_text(summary: dict) -> str:
    """The measured N* as a reader should take it: ``11``, ``9-11`` or ``>= 11`` (no level missed)."""
    lo, hi = summary["agents_per_replica_range"]
    if hi is None:
        return f">= {lo}"
    return str(lo) if hi == lo else f"{lo}-{hi}"
