"""One seeded draw of a workload's sessions, call by call, before any serving policy prices them.

A session is ``steps_per_task`` steps; a step is ``calls_per_step`` model calls and then one tool wait. Each call
sends the system prompt, the session's history (every earlier call's new input and output) and its own new input,
and writes its output. Where ``workload.summarize_at_tokens`` caps the history, an extra call summarises it and the
context restarts from the system prompt and the summary. :mod:`apmw.capacity.sessions` prices the draw: which
contexts a call finds, the prefill and decode work, the KV held.

Every quantity is drawn on its own strata (:func:`apmw.spec.distribution.stratified_uniforms`), in a fixed
order from one generator, so a seed gives the same sessions whatever prices them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from apmw.errors import ApmwError
from apmw.spec import Workload
from apmw.spec.distribution import stratified_uniforms, whole_at

# More calls than this in one sample do not fit in memory as the per-call arrays pricing builds.
MAX_DRAWN_CALLS = 50_000_000


@dataclass(frozen=True)
class DrawnCalls:
    """The sampled sessions: per-session and per-step arrays, then one entry per call in session order."""

    sessions: int
    steps: np.ndarray               # steps per session
    wait_after_step: np.ndarray     # seconds of tool wait after each step
    session_of_call: np.ndarray
    calls_per_session: np.ndarray
    first_in_session: np.ndarray    # bool: the session's first call
    after_wait: np.ndarray          # bool: a tool wait precedes the call (a step's first call, not the session's)
    wait_before: np.ndarray         # seconds of tool wait before the call (0 inside a step)
    wait_after: np.ndarray          # ... and after it (0 but for a step's last call)
    new: np.ndarray                 # new input tokens
    out: np.ndarray                 # output tokens
    prompt: np.ndarray              # tokens the call sends: system prompt, history, new input
    history: np.ndarray             # of them, the context written before this call
    resets: np.ndarray              # summaries the session has written before the call
    new_resets: np.ndarray          # ... of them, written just before it (0 at a session's first call)

    @property
    def calls(self) -> int:
        return len(self.prompt)

    @property
    def session_start(self) -> np.ndarray:
        """Each session's first call."""
        return np.concatenate(([0], np.cumsum(self.calls_per_session)[:-1]))

    @property
    def last_call(self) -> np.ndarray:
        """Each session's last call."""
        return np.cumsum(self.calls_per_session) - 1


def draw_calls(w: Workload, rng: np.random.Generator, sessions: int) -> DrawnCalls:
    """``sessions`` sessions of the workload ``w``, drawn from ``rng``."""
    def draw(d, size: int, minimum: int = 0) -> np.ndarray:
        return whole_at(d, stratified_uniforms(rng, size), minimum)

    steps = draw(w.steps_per_task, sessions, 1)
    total_steps = int(steps.sum())
    calls_in_step = draw(w.calls_per_step, total_steps, 1)
    wait_after_step = w.tool_wait_s.at(stratified_uniforms(rng, total_steps))
    n_calls = int(calls_in_step.sum())
    if n_calls > MAX_DRAWN_CALLS:
        raise ApmwError(f"the workload averages {n_calls / sessions:,.0f} calls per task; apmw samples "
                        f"{sessions} tasks and that is too many calls to hold -- check steps_per_task/calls_per_step")

    step_of_call = np.repeat(np.arange(total_steps), calls_in_step)
    session_of_call = np.repeat(np.arange(sessions), steps)[step_of_call]
    first_in_step = np.zeros(n_calls, dtype=bool)
    first_in_step[np.concatenate(([0], np.cumsum(calls_in_step)[:-1]))] = True
    last_in_step = np.zeros(n_calls, dtype=bool)
    last_in_step[np.cumsum(calls_in_step) - 1] = True
    calls_per_session = np.bincount(session_of_call, minlength=sessions)
    session_start = np.concatenate(([0], np.cumsum(calls_per_session)[:-1]))
    first_in_session = np.zeros(n_calls, dtype=bool)
    first_in_session[session_start] = True

    new = draw(w.new_input_tokens_per_call, n_calls).astype(float)
    if w.first_call_input_tokens is not None:
        new[session_start] = draw(w.first_call_input_tokens, sessions)
    out = draw(w.output_tokens_per_call, n_calls, 1).astype(float)

    # prompt_i = system + new_1..new_i + out_1..out_{i-1}, cumulated within each session
    grown = np.cumsum(new + out) - out
    grown -= np.repeat(grown[session_start] - new[session_start], calls_per_session)
    prompt = w.system_prompt_tokens + grown
    history = prompt - new

    wait_before = np.zeros(n_calls)
    after_wait = first_in_step & ~first_in_session
    wait_before[after_wait] = wait_after_step[step_of_call[after_wait] - 1]
    wait_after = np.where(last_in_step, wait_after_step[step_of_call], 0.0)

    resets = np.zeros(n_calls)
    if w.summarize_at_tokens is not None:
        past, resets = summarised(history - w.system_prompt_tokens, w.summarize_at_tokens - w.system_prompt_tokens,
                                  w.summary_tokens)
        history = w.system_prompt_tokens + past
        prompt = history + new
    new_resets = np.diff(resets, prepend=0.0)
    new_resets[session_start] = 0.0
    return DrawnCalls(sessions=sessions, steps=steps, wait_after_step=wait_after_step, session_of_call=session_of_call,
                      calls_per_session=calls_per_session, first_in_session=first_in_session, after_wait=after_wait,
                      wait_before=wait_before, wait_after=wait_after, new=new, out=out, prompt=prompt,
                      history=history, resets=resets, new_resets=new_resets)


def summarised(history: np.ndarray, room: int, summary: int) -> tuple[np.ndarray, np.ndarray]:
    """History after summarisation, and the number of summaries written before each call.

    Each time the history (beyond the system prompt) reaches ``room`` tokens it is
    replaced by a ``summary``-token summary, so it cycles through [summary, room)
    with period ``room - summary``. Resets are taken to happen exactly at the cap
    (the overshoot of the call that crossed it is ignored).
    """
    over = history >= room
    resets = np.where(over, np.floor((history - summary) / (room - summary)), 0.0)
    capped = np.where(over, summary + np.mod(history - summary, room - summary), history)
    return capped, resets
