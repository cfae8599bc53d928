"""What feeds the engine: closed-loop agents (the product's question) or open-loop requests (the benchmark).

Closed loop (MODEL.md section 4): each of ``N`` agents runs task after task. A task
is drawn from the spec's workload with the run's seeded ``numpy.random.Generator``
exactly as :mod:`apmw.capacity.sessions` draws it (same distributions, same
rounding): ``steps`` steps of ``calls`` calls, new input and output tokens per
call, a tool wait after each step (also after the last, so a task's time is the
same quantity ``apmw plan`` reports). Call ``i``'s prompt is the context so far
plus its new tokens. The tool-wait KV policy decides what a finished call's
context does while the agent waits (the table in ``capacity/sessions.py``):

* ``retain`` pins it (blocks held, whole history reused);
* ``ttl`` pins it, and frees it to the prefix cache ``ttl_s`` after the wait began;
* ``evict`` frees it to the LRU prefix cache at once: the next call hits what survived
  (``apmw plan`` assumes it never survives);
* ``offload`` frees it to the prefix cache and keeps a host copy; the next call is
  ready only after the history's KV bytes crossed the host link
  (``offload_bandwidth_bytes_per_s``, no contention), then reuses all of it.

Calls inside one step follow each other with no wait: the context is pinned. Without
``prefix_caching`` nothing is reused: every call prefills its whole prompt.

History summarisation (``workload.summarize_at_tokens``), as :mod:`apmw.capacity.sessions` prices it:
before a call whose history (the context past the system prompt) has reached
``summarize_at_tokens - system_prompt_tokens``, the agent makes one extra call with no wait: the
whole context plus one instruction token as its prompt, ``summary_tokens`` out. The context then
restarts as system prompt + summary under a new prefix-cache key (the old context is freed and never
reused), so the call that follows re-prefills the summary with its new tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from apmw.errors import ApmwError
from apmw.sim.batch import Seq
from apmw.sim.engine import Engine
from apmw.spec import Spec
from apmw.spec.distribution import sample_whole


@dataclass(frozen=True)
class TaskShape:
    """One task to replay (e.g. from a trace): per call, new input tokens, output tokens, and the tool
    wait after it (0 between calls of one step). The first call's new tokens follow the system prompt."""

    new_input_tokens: Sequence[int]
    output_tokens: Sequence[int]
    wait_after_s: Sequence[float]

    def check(self, index: int) -> "TaskShape":
        n = len(self.new_input_tokens)
        if n == 0 or len(self.output_tokens) != n or len(self.wait_after_s) != n:
            raise ApmwError(f"replayed task {index}: new_input_tokens, output_tokens and wait_after_s must have "
                            f"the same length >= 1 (got {n}, {len(self.output_tokens)}, {len(self.wait_after_s)})")
        values = (*self.output_tokens, *self.new_input_tokens, *self.wait_after_s)
        if (not all(math.isfinite(v) for v in values) or min(self.output_tokens) < 1 or min(self.new_input_tokens) < 0
                or min(self.wait_after_s) < 0):
            raise ApmwError(f"replayed task {index}: output tokens must be >= 1, new tokens and waits >= 0, every one "
                            "a finite number")
        return self


class ClosedLoopAgents:
    """N agents, each a task at a time; records task, TTFT and TPOT figures in the window."""

    def __init__(self, spec: Spec, agents: int, rng: np.random.Generator, warmup_s: float, duration_s: float,
                 drain_limit_s: float, tasks: Sequence[TaskShape] | None = None,
                 start_spread_s: float | None = None):
        self.w, self.sv = spec.workload, spec.serving
        # agents start uniformly over this many seconds (default: the warm-up); 0 starts them together
        self.start_spread_s = warmup_s if start_spread_s is None else start_spread_s
        self.n = agents
        self.rng = rng
        self.warmup_s, self.duration_s = warmup_s, duration_s
        self.drain_limit_s = drain_limit_s
        self.stop_time_s = duration_s
        self.replay = None if tasks is None else [t.check(i) for i, t in enumerate(tasks)]
        if self.replay is not None and not self.replay:
            raise ApmwError("the replayed task list is empty")
        self._replayed = 0
        self.engine: Engine | None = None
        self.calls: list[tuple[list[int], list[int], list[float]]] = [([], [], [])] * agents
        self.call_idx = [0] * agents
        self.context = [0] * agents
        self.task_start = [0.0] * agents
        self.task_ctx = [0] * agents
        self.tracked = [False] * agents
        self.summarising = [False] * agents
        self._ctx = 0
        self.task_latency_s: list[float] = []
        self.task_tool_s: list[float] = []       # each recorded task's own tool waits (exogenous; a control variate)
        self.task_output_tokens: list[int] = []  # ... and output tokens
        self.ttft_s: list[float] = []
        self.tpot_s: list[float] = []
        self.tasks_started = 0
        self.tasks_ended = 0
        self.tasks_rejected = 0
        self.open_tracked = 0
        self.calls_done = 0
        self.output_tokens_done = 0

    def attach(self, engine: Engine) -> None:
        self.engine = engine
        self.shared_kv_bytes = float(engine.arch.kv_bytes_for_context(self.w.system_prompt_tokens, engine.kv_dtype))
        # agents start spread over the warm-up so that they are not in phase
        starts = (self.rng.uniform(0.0, self.start_spread_s, self.n) if self.start_spread_s > 0
                  else np.zeros(self.n))
        for a, t in enumerate(starts.tolist()):
            self._start_task(a, t)

    def _sample_task(self) -> tuple[list[int], list[int], list[float]]:
        if self.replay is not None:            # tasks in the given order, cycling
            t = self.replay[self._replayed % len(self.replay)]
            self._replayed += 1
            return [int(x) for x in t.new_input_tokens], [int(x) for x in t.output_tokens], \
                [float(x) for x in t.wait_after_s]
        w, rng = self.w, self.rng
        steps = int(sample_whole(w.steps_per_task, rng, 1, 1)[0])
        per_step = sample_whole(w.calls_per_step, rng, steps, 1).tolist()
        waits = w.tool_wait_s.sample(rng, steps)
        n = int(sum(per_step))
        new = sample_whole(w.new_input_tokens_per_call, rng, n).tolist()
        if w.first_call_input_tokens is not None:
            new[0] = int(sample_whole(w.first_call_input_tokens, rng, 1)[0])
        out = sample_whole(w.output_tokens_per_call, rng, n, 1).tolist()
        wait_after = np.zeros(n)
        wait_after[np.cumsum(per_step) - 1] = waits
        return new, out, wait_after.tolist()

    def _start_task(self, a: int, t: float) -> None:
        self.calls[a] = self._sample_task()
        self.call_idx[a] = 0
        self.context[a] = self.w.system_prompt_tokens
        self.task_start[a] = t
        self.summarising[a] = False
        self._new_context(a)
        self.tasks_started += 1
        tracked = self.warmup_s <= t < self.duration_s
        self.tracked[a] = tracked
        self.open_tracked += tracked
        self._issue(a, t, 0)

    def _new_context(self, a: int) -> None:
        """Give agent ``a`` a fresh prefix-cache key: nothing cached under the old one is reused."""
        self._ctx += 1
        self.task_ctx[a] = self._ctx

    def _issue(self, a: int, t: float, host_tokens: int) -> None:
        if self.w.summarize_at_tokens is not None and self.context[a] >= self.w.summarize_at_tokens:
            # the summary call: the whole context and one instruction token in, the summary out
            self.summarising[a] = True
            self.engine.submit(Seq(a, self.task_ctx[a], self.context[a] + 1, self.w.summary_tokens, t, host_tokens), t)
            return
        new, out, _ = self.calls[a]
        i = self.call_idx[a]
        # a call carries at least one token past the shared system prompt (its own message), so
        # that a prefix hit never covers the whole prompt: an engine computes at least one token
        prompt = max(self.context[a] + new[i], self.w.system_prompt_tokens + 1)
        self.engine.submit(Seq(a, self.task_ctx[a], prompt, out[i], t, host_tokens), t)

    # ---- engine callbacks ------------------------------------------------------------------------------
    def on_arrival(self, seq: Seq) -> None:
        self.engine.ledger_for(seq).unpin_into(seq.agent, seq)

    def on_done(self, seq: Seq, now: float) -> None:
        a = seq.agent
        eng = self.engine
        ledger = eng.ledger_for(seq)
        self.calls_done += 1
        self.output_tokens_done += seq.out
        if self.warmup_s <= seq.ready_s < self.duration_s:
            self.ttft_s.append(seq.first_s - seq.ready_s)
            if seq.out > 1:
                self.tpot_s.append((now - seq.first_s) / (seq.out - 1))
        if self.summarising[a]:
            # the history becomes the summary: the old context is freed, the next call follows at once
            self.summarising[a] = False
            ledger.release(seq)
            self.context[a] = self.w.system_prompt_tokens + self.w.summary_tokens
            self._new_context(a)
            self._issue(a, now, 0)
            return
        new, _, wait_after = self.calls[a]
        i = self.call_idx[a]
        wait = wait_after[i]
        self.context[a] = seq.total
        self.call_idx[a] = i + 1
        policy = self.sv.tool_wait_kv_policy
        if i + 1 == len(new):
            # The task's last call. The engine cannot tell that no call follows the last tool wait, so
            # retain/ttl keep the context pinned through it (as apmw plan counts), and it is freed when
            # the task ends; evict/offload free it now.
            if self.sv.prefix_caching and wait > 0 and policy in ("retain", "ttl"):
                hold = wait if policy == "retain" else min(wait, self.sv.ttl_s)
                ledger.pin(a, seq, now + hold)
            else:
                ledger.release(seq)
            self._end_task(a, now + wait)
            return
        host = 0
        # llama.cpp keeps nothing pinned: a finished call's tokens stay in its slot (apmw.sim.slots)
        if self.sv.prefix_caching and (wait == 0 or policy == "retain") and ledger.slots is None:
            ledger.pin(a, seq, None)
        elif self.sv.prefix_caching and policy == "ttl":
            ledger.pin(a, seq, now + self.sv.ttl_s)
        else:
            if self.sv.prefix_caching and policy == "offload":
                host = seq.kv_len
                own_bytes = float(eng.arch.kv_bytes_for_context(seq.kv_len, eng.kv_dtype)) - self.shared_kv_bytes
                wait += own_bytes / self.sv.offload_bandwidth_bytes_per_s
            ledger.release(seq)
        self._issue(a, now + wait, host)

    def on_rejected(self, seq: Seq, now: float) -> None:
        self.tasks_rejected += 1
        self._end_task(seq.agent, now, record=False)

    def _end_task(self, a: int, end_s: float, record: bool = True) -> None:
        self.tasks_ended += 1
        if self.tracked[a]:
            self.open_tracked -= 1
            if record:
                self.task_latency_s.append(end_s - self.task_start[a])
                self.task_tool_s.append(float(sum(self.calls[a][2])))
                self.task_output_tokens.append(sum(self.calls[a][1]))
        self._start_task(a, end_s)

    def finished(self, now: float) -> bool:
        """Stop after the window once every task that started in it has ended (or the drain limit)."""
        if now < self.duration_s:
            return False
        self.stop_time_s = self.duration_s + self.drain_limit_s
        return self.open_tracked == 0 or now >= self.stop_time_s


class OpenLoopRequests:
    """Independent single-call requests arriving as a Poisson process (the benchmark setting)."""

    def __init__(self, prompt_tokens: np.ndarray, output_tokens: np.ndarray, rate_per_s: float,
                 rng: np.random.Generator):
        self.prompt = np.maximum(np.asarray(prompt_tokens, dtype=np.int64), 1).tolist()
        self.out = np.maximum(np.asarray(output_tokens, dtype=np.int64), 1).tolist()
        self.arrival_s = np.cumsum(rng.exponential(1.0 / rate_per_s, len(self.prompt))).tolist()
        self.stop_time_s = float("inf")
        self.latency_s: list[float] = []
        self.ttft_s: list[float] = []
        self.tpot_s: list[float] = []
        self.pending = len(self.prompt)
        self.engine: Engine | None = None
        self.output_tokens_done = 0

    def attach(self, engine: Engine) -> None:
        self.engine = engine
        for i, (p, o, t) in enumerate(zip(self.prompt, self.out, self.arrival_s)):
            engine.submit(Seq(-1, -(i + 1), p, o, t), t)

    def on_arrival(self, seq: Seq) -> None:
        pass

    def on_done(self, seq: Seq, now: float) -> None:
        self.engine.ledger_for(seq).release(seq)
        self.pending -= 1
        self.output_tokens_done += seq.out
        self.latency_s.append(now - seq.ready_s)
        self.ttft_s.append(seq.first_s - seq.ready_s)
        if seq.out > 1:
            self.tpot_s.append((now - seq.first_s) / (seq.out - 1))

    def on_rejected(self, seq: Seq, now: float) -> None:
        self.pending -= 1

    def finished(self, now: float) -> bool:
        return self.pending == 0
