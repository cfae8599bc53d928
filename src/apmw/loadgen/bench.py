"""Drive a bench: build the text maker, run each level (one N, or a sweep), resume a file.

:func:`run_bench` is what ``apmw bench`` calls. A sweep runs its levels in ascending order and
stops after the first level that misses the SLO (latency only grows with N, so later levels
would only add load); the measured N* is the largest level that met the SLO below that one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from apmw.loadgen.client import BenchError, Client
from apmw.loadgen.results import ResultsWriter, levels_of, read_records, summarise
from apmw.loadgen.runner import LiveStats, Run, RunConfig
from apmw.loadgen.text import CANDIDATE_WORDS, MIN_WORDS, TextMaker, single_token_words
from apmw.spec import Spec


def workload_dict(spec: Spec) -> dict:
    """The workload section as a spec file would write it (re-validates to the same Workload)."""
    def plain(v):
        if isinstance(v, dict):
            if set(v) == {"value"}:
                return v["value"]
            return {k: plain(x) for k, x in v.items() if x is not None}
        return v
    return plain(spec.workload.model_dump(by_alias=True, exclude_none=True))


def slo_dict(spec: Spec, task_latency_p95_s: float | None = None) -> dict:
    slo = spec.slo.model_dump()
    if task_latency_p95_s is not None:
        slo["task_latency_p95_s"] = task_latency_p95_s
    return slo


async def make_text(client: Client) -> TextMaker:
    counts = await client.token_counts(list(CANDIDATE_WORDS))
    if counts is None:
        return TextMaker(list(CANDIDATE_WORDS), "assumed-one-token-per-word")
    words = single_token_words(counts)
    if len(words) < MIN_WORDS:
        raise BenchError(f"only {len(words)} of apmw's {len(CANDIDATE_WORDS)} candidate words are one token in this "
                         f"model's tokenizer (need {MIN_WORDS}); prompt lengths cannot be controlled")
    return TextMaker(words, "tokenizer-endpoint")


@dataclass
class BenchOutcome:
    summary: dict
    reason: str          # "duration" (all levels ran), "slo-missed" (a sweep stopped early) or "interrupted"
    path: Path


def _done_by_level(records: list[dict]) -> dict[int, float]:
    """Seconds already measured at each level (for --resume)."""
    return {lvl.agents: sum(w.length_s for w in lvl.windows.values()) for lvl in levels_of(records).values()}


def _missed(records: list[dict], agents: int) -> bool:
    return any(lv["agents"] == agents and lv["meets_slo"] is False for lv in summarise(records)["levels"])


def _pending(levels: list[int], done: dict[int, float], duration_s: float, records: list[dict]) -> bool:
    """Whether a resumed run still has a level to measure (a sweep ends at its first missed level)."""
    for n in levels:
        if duration_s - done.get(n, 0.0) > 0.5:
            return True
        if len(levels) > 1 and _missed(records, n):
            return False
    return False


async def run_bench(base: RunConfig, levels: list[int], out: Path, api_key: str | None = None,
                    resume: bool = False, on_tick: Callable[[LiveStats], None] | None = None) -> BenchOutcome:
    """Run ``levels`` (numbers of agents) against ``base.endpoint``, appending to ``out``.

    With ``resume``, ``out`` must exist: each level runs only the duration it still lacks, in a
    new segment (with its own warm-up); the summary pools all segments of a level.
    """
    segment, done = 0, {}
    if resume:
        records = read_records(out)
        segment = max(r.get("segment", 0) for r in records) + 1
        done = _done_by_level(records)
    elif out.exists() and out.stat().st_size > 0:
        raise BenchError(f"{out} already holds results: pass --resume to continue that run, or choose another --out")
    if resume and not _pending(levels, done, base.duration_s, records):
        missed = len(levels) > 1 and any(_missed(records, n) for n in levels)
        return BenchOutcome(summary=summarise(records), reason="slo-missed" if missed else "duration", path=out)
    base.run_id = base.run_id or uuid.uuid4().hex[:8]
    client = Client(base.endpoint, base.model, api=base.api, api_key=api_key, timeout_s=base.timeout_s,
                    max_connections=max(levels) + 4)
    writer: ResultsWriter | None = None
    reason = "duration"
    loop = asyncio.get_running_loop()
    current: list[Run] = []

    def interrupt() -> None:
        nonlocal reason
        reason = "interrupted"
        for r in current:
            r.stop()

    try:
        loop.add_signal_handler(signal.SIGINT, interrupt)
    except (NotImplementedError, RuntimeError):     # not the main thread (tests) or no signals here
        pass
    try:
        replay = None
        if base.trace is not None:
            from apmw.loadgen.replay import load_trace

            tasks, system, info = load_trace(base.trace["path"], base.trace.get("format"))
            base.trace = {**base.trace, **info}
            replay = (tasks, system)
        text = await make_text(client)
        writer = ResultsWriter(out)           # opened only once the server has answered
        base.levels = list(levels)
        for n in levels:
            remaining = base.duration_s - done.get(n, 0.0)
            if remaining > 0.5:
                cfg = RunConfig(**{**base.record(), "agents": n, "duration_s": remaining})
                run = Run(cfg, client, text, writer, segment, replay)
                current[:] = [run]
                if await run.run(on_tick) == "interrupted":
                    reason = "interrupted"
                    break
                segment += 1
            if len(levels) > 1 and _missed(read_records(out), n):
                reason = "slo-missed"
                break
    finally:
        try:
            loop.remove_signal_handler(signal.SIGINT)
        except (NotImplementedError, RuntimeError):
            pass
        if writer is not None:
            writer.close()
        await client.close()
    return BenchOutcome(summary=summarise(read_records(out)), reason=reason, path=out)


def config_from_file(out: Path) -> RunConfig:
    """The configuration of the run that wrote ``out`` (for --resume): first segment's, all levels."""
    first = read_records(out)[0].get("config")
    known = {f.name for f in dataclasses.fields(RunConfig)}
    required = {f.name for f in dataclasses.fields(RunConfig) if f.default is dataclasses.MISSING}
    if not isinstance(first, dict) or not required <= first.keys():
        raise BenchError(f"{out}:1: the 'run' record has no usable 'config' -- cannot resume this file")
    cfg = {k: v for k, v in first.items() if k in known}
    return RunConfig(**{**cfg, "agents": (cfg.get("levels") or [cfg["agents"]])[0]})


__all__ = ["BenchOutcome", "config_from_file", "run_bench", "slo_dict",
           "workload_dict"]
