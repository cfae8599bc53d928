"""Agent tasks drawn from the spec's workload, shaped as ``capacity/sessions.py`` shapes them.

A task runs ``steps_per_task`` steps; each step makes ``calls_per_step`` model calls back to
back, then waits ``tool_wait_s`` (after every step, the last included, as the planner counts
it). Call ``i``'s prompt is the shared system prompt, then every earlier call's new input and
output, then its own new input. Counts are rounded as the planner rounds them: steps, calls
and output tokens at least 1, new input tokens at least 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from apmw.spec import Workload
from apmw.spec.distribution import Constant, Empirical, Lognormal, sample_whole


@dataclass(frozen=True)
class CallShape:
    new_tokens: int        # tokens this call adds to the history (task text, tool output, user turn)
    output_tokens: int     # max_tokens sent (with ignore_eos the server generates exactly this many)
    reset: bool = False    # trace replay: the context was trimmed; the prompt is new_tokens of fresh text


@dataclass(frozen=True)
class StepShape:
    calls: tuple[CallShape, ...]
    tool_wait_s: float     # sleep after the step's calls


@dataclass(frozen=True)
class TaskShape:
    steps: tuple[StepShape, ...]
    key: str | None = None     # the recorded session's key, when replaying a trace

    @property
    def calls(self) -> int:
        return sum(len(s.calls) for s in self.steps)


def _count(d: Constant | Lognormal | Empirical, rng: np.random.Generator, minimum: int) -> int:
    return int(sample_whole(d, rng, 1, minimum)[0])


def sample_task(workload: Workload, rng: np.random.Generator) -> TaskShape:
    """One task drawn with ``rng`` (each agent owns a generator seeded from the run's seed)."""
    n_steps = _count(workload.steps_per_task, rng, 1)
    steps = []
    for k in range(n_steps):
        n_calls = _count(workload.calls_per_step, rng, 1)
        calls = []
        for i in range(n_calls):
            first = k == 0 and i == 0
            dist = workload.first_call_input_tokens if first and workload.first_call_input_tokens else \
                workload.new_input_tokens_per_call
            calls.append(CallShape(new_tokens=_count(dist, rng, 1 if first else 0),  # the task's message
                                   output_tokens=_count(workload.output_tokens_per_call, rng, 1)))
        steps.append(StepShape(calls=tuple(calls), tool_wait_s=float(workload.tool_wait_s.sample(rng, 1)[0])))
    return TaskShape(steps=tuple(steps))
