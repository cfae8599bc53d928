"""The closed loop: N agents, each running tasks back to back against one endpoint.

An agent samples a task (``workload.sample_task``), sends its calls one after another (each
prompt = shared system prompt + the session's history + new tokens), sleeps the tool wait after
each step, and starts its next task as soon as one ends: a closed loop, so the offered load is
set by N and by how fast the server answers, as in the planner's model (MODEL.md section 4).

Agents start spread over the first ``stagger_s`` so they do not arrive in lock-step. A call
that faults ends its task as ``failed``; the agent waits ``fault_backoff_s`` and starts a new
task, so a dead server yields a steady count of faults rather than a busy loop. Tasks that
begin during warm-up are recorded with ``warmup: true`` and left out of the summary. At
``warmup_s + duration_s`` no new task starts; running ones get ``drain_s`` to finish (so that
long tasks are not cut from the tail), then are cancelled. :meth:`Run.stop` (Ctrl-C) cancels
at once; everything finished so far is already on disk.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from apmw.loadgen import metrics
from apmw.loadgen.client import Client, CallResult
from apmw.loadgen.results import ResultsWriter
from apmw.loadgen.text import TextMaker
from apmw.loadgen.workload import TaskShape, sample_task
from apmw.spec import Workload


@dataclass
class RunConfig:
    endpoint: str
    model: str
    agents: int
    duration_s: float
    warmup_s: float
    seed: int
    workload: dict | None          # the spec's workload section as written (None when replaying a trace)
    slo: dict
    api: str = "completions"
    timeout_s: float = 60.0
    drain_s: float = 30.0
    fault_backoff_s: float = 1.0
    stagger_s: float = 1.0
    run_id: str = ""
    trace: dict | None = None      # {"path", "format"} of a trace to replay instead of the workload
    levels: list[int] | None = None   # every level of the run (a sweep), so --resume can finish it
    history: str = "echo"          # "echo": the model's output goes back into the history, as an agent's does;
                                   # "synthetic": text of the same token count instead (exact prompt lengths)

    def record(self) -> dict:
        return dict(self.__dict__)


@dataclass
class LiveStats:
    """What the live display shows; updated by the agents, read by the display."""
    started: float = field(default_factory=time.monotonic)
    agents: int = 0
    in_call: int = 0
    in_tool: int = 0
    calls: int = 0
    tasks: int = 0
    errors: int = 0
    task_latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    phase: str = "warm-up"

    def p95(self, values: list[float]) -> float | None:
        return float(np.percentile(values, 95)) if values else None


class Run:
    """One segment: ``config.agents`` agents for warm-up plus duration, writing to ``writer``."""

    def __init__(self, config: RunConfig, client: Client, text: TextMaker, writer: ResultsWriter, segment: int,
                 replay: tuple[list[TaskShape], int] | None = None):
        self.cfg, self.client, self.text, self.writer, self.segment = config, client, text, writer, segment
        self.workload = Workload.model_validate(config.workload) if config.workload is not None else None
        self.replay = replay
        self.system_tokens = replay[1] if replay else self.workload.system_prompt_tokens
        self.stats = LiveStats(agents=config.agents)
        self.t0 = 0.0
        self._no_new_tasks = asyncio.Event()
        self._interrupted = False
        rng = np.random.default_rng([config.seed, 0])
        # the system prompt is the same text for every agent and task: servers can cache it once
        self.system_text = text.text(self.system_tokens, rng).lstrip()
        self._tasks: list[asyncio.Task] = []

    def now(self) -> float:
        return time.monotonic() - self.t0

    def stop(self) -> None:
        """Stop now (Ctrl-C): cancel every agent; finished calls and tasks are already on disk."""
        self._interrupted = True
        self._no_new_tasks.set()
        for t in self._tasks:
            t.cancel()

    async def run(self, on_tick: Callable[[LiveStats], None] | None = None) -> str:
        """Run the segment; returns the end reason (``duration`` or ``interrupted``)."""
        cfg = self.cfg
        self.writer.write({"type": "run", "segment": self.segment, "config": cfg.record(),
                           "started_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                           "token_count_method": self.text.method})
        self.t0 = time.monotonic()
        self.stats.started = self.t0
        self._tasks = [asyncio.create_task(self._agent(i)) for i in range(cfg.agents)]
        ticker = asyncio.create_task(self._tick(on_tick)) if on_tick else None
        poller = asyncio.create_task(self._poll_metrics())
        end_at = cfg.warmup_s + cfg.duration_s
        try:
            await asyncio.wait_for(self._no_new_tasks.wait(), timeout=end_at)
        except asyncio.TimeoutError:
            self._no_new_tasks.set()
        measure_end = min(self.now(), end_at)
        poller.cancel()
        if not self._interrupted:
            self.stats.phase = "draining"
            _, pending = await asyncio.wait(self._tasks, timeout=cfg.drain_s) if self._tasks else (None, [])
            for t in pending:
                t.cancel()
        ended = await asyncio.gather(*self._tasks, poller, return_exceptions=True)
        if ticker:
            ticker.cancel()
        died = next((e for e in ended if isinstance(e, Exception)), None)
        if died is not None:              # an agent stopped by an error of apmw's own: no summary is right
            raise died
        reason = "interrupted" if self._interrupted else "duration"
        self.writer.write({"type": "end", "segment": self.segment, "reason": reason, "elapsed_s": self.now(),
                           "measure_end_s": measure_end})
        return reason

    async def _poll_metrics(self) -> None:
        """Poll the server's /metrics through the window (stops at once if it has none)."""
        while True:
            values = await metrics.poll(self.client.http)
            if values is None:
                return
            if self.now() >= self.cfg.warmup_s:
                self.writer.write({"type": "server", "segment": self.segment, "t_s": self.now(), "metrics": values})
            await asyncio.sleep(metrics.POLL_S)

    async def _tick(self, on_tick: Callable[[LiveStats], None]) -> None:
        while True:
            self.stats.phase = ("warm-up" if self.now() < self.cfg.warmup_s else
                                "measuring" if not self._no_new_tasks.is_set() else "draining")
            on_tick(self.stats)
            await asyncio.sleep(0.5)

    async def _agent(self, index: int) -> None:
        rng = np.random.default_rng([self.cfg.seed, self.segment + 1, index])
        await asyncio.sleep(rng.uniform(0, self.cfg.stagger_s))
        n = 0
        while not self._no_new_tasks.is_set():
            task = self._next_task(index, n, rng)
            ok = await self._task(index, n, task, rng)
            n += 1
            if not ok and not self._no_new_tasks.is_set():
                await asyncio.sleep(self.cfg.fault_backoff_s)

    def _next_task(self, agent: int, number: int, rng: np.random.Generator) -> TaskShape:
        """A sampled task, or (replaying a trace) recorded session agent + number * N, wrapping around."""
        if self.replay is None:
            return sample_task(self.workload, rng)
        sessions = self.replay[0]
        return sessions[(agent + number * self.cfg.agents) % len(sessions)]

    def _prompt(self, history: list[tuple[str, str]], new_text: str) -> str | list[dict]:
        if self.client.api == "chat":
            msgs = [{"role": "system", "content": self.system_text}]
            for user, assistant in history:
                msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
            return msgs + [{"role": "user", "content": new_text}]
        return self.system_text + "".join(u + a for u, a in history) + new_text

    async def _task(self, agent: int, number: int, task: TaskShape, rng: np.random.Generator) -> bool:
        session = f"{self.cfg.run_id}-{self.segment}-{agent}-{number}"
        start = self.now()
        base = {"segment": self.segment, "agents": self.cfg.agents, "agent": agent, "task": number,
                "session_id": session, "warmup": start < self.cfg.warmup_s}
        if task.key is not None:
            base["trace_session"] = task.key
        history: list[tuple[str, str]] = []
        context_tokens = self.system_tokens
        calls = 0
        tool_s = 0.0
        # a task is completed only where its last step returns; anything else that ends it is a failure
        status, fault = "failed", "internal_error"
        try:
            for k, step in enumerate(task.steps):
                for i, shape in enumerate(step.calls):
                    if shape.reset:              # a trimmed context (trace replay): start afresh
                        history, context_tokens = [], self.system_tokens
                    new_text = self.text.text(shape.new_tokens, rng)
                    res = await self._call(self._prompt(history, new_text), shape.output_tokens, session)
                    calls += 1
                    self.writer.write({"type": "call", **base, "step": k, "call": i,
                                       "target_prompt_tokens": context_tokens + shape.new_tokens,
                                       "target_output_tokens": shape.output_tokens, **res.record()})
                    if not res.ok:
                        status, fault = "failed", res.fault
                        return False
                    out_tokens = res.output_tokens or shape.output_tokens
                    reply = res.text if self.cfg.history == "echo" else self.text.text(out_tokens, rng)
                    history.append((new_text, reply))
                    context_tokens += shape.new_tokens + out_tokens
                self.stats.in_tool += 1
                try:
                    await asyncio.sleep(step.tool_wait_s)
                finally:
                    self.stats.in_tool -= 1
                tool_s += step.tool_wait_s
            status, fault = "completed", None
            return True
        except asyncio.CancelledError:
            status = "cancelled"
            raise
        finally:
            end = self.now()
            self.writer.write({"type": "task", **base, "status": status, "fault": fault, "start_s": start,
                               "end_s": end, "latency_s": end - start, "calls": calls, "steps": len(task.steps),
                               "tool_s": tool_s})
            if status == "completed":
                self.stats.tasks += 1
                if not base["warmup"]:
                    self.stats.task_latencies.append(end - start)

    async def _call(self, prompt: str | list[dict], max_tokens: int, session: str) -> CallResult:
        self.stats.in_call += 1
        start = self.now()
        try:
            res = await self.client.call(prompt, max_tokens, session)
        finally:
            self.stats.in_call -= 1
        res.start_s = start
        self.stats.calls += 1
        if res.ok:
            if res.ttft_s is not None and start >= self.cfg.warmup_s:
                self.stats.ttfts.append(res.ttft_s)
        else:
            self.stats.errors += 1
        return res
