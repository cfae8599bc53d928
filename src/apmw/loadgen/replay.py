"""Replay a recorded trace (any format ``apmw fit`` reads) instead of sampling the spec.

Each recorded session becomes one task, its calls in recorded order with their recorded prompt
and output sizes and the recorded wait after each call. The definitions are ``apmw fit``'s
(traces/fit.py): the shared system prompt is the smallest first-call prompt of the trace, a
call's new input is its prompt minus the previous prompt and output; where a prompt is shorter
than that (the agent trimmed or summarised its context) the replay starts a fresh context of the
recorded length. Agent ``i`` replays sessions ``i, i+N, i+2N, ...`` and wraps around at the end.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from apmw.loadgen.workload import CallShape, StepShape, TaskShape


def _wait(cols, i: int, last: bool) -> float:
    """Tool wait after call ``i``: recorded tool time, else the next call's delay, else the gap."""
    if math.isfinite(cols.tool_wait_after_s[i]):
        return max(float(cols.tool_wait_after_s[i]), 0.0)
    if last:
        return 0.0
    if math.isfinite(cols.gap_before_s[i + 1]):
        return max(float(cols.gap_before_s[i + 1]), 0.0)
    gap = cols.start_s[i + 1] - cols.end_s[i]
    return max(float(gap), 0.0) if math.isfinite(gap) else 0.0


def load_trace(path: str | Path, fmt: str | None = None) -> tuple[list[TaskShape], int, dict]:
    """Tasks to replay, the shared system prompt's tokens, and what was read (for the results file)."""
    from apmw.traces import fit_trace, read_notes

    result = fit_trace(path, fmt)
    cols = result.columns
    system = int(result.workload.system_prompt_tokens)
    tasks: list[TaskShape] = []
    bounds = np.flatnonzero(np.diff(cols.session)) + 1
    for idx in np.split(np.arange(len(cols)), bounds):
        steps, context = [], None
        for j, i in enumerate(idx):
            prompt = cols.input_tokens[i]
            if not math.isfinite(prompt):
                continue
            out = cols.output_tokens[i]
            out = max(int(round(out)), 1) if math.isfinite(out) else 1
            prompt = int(round(prompt))
            if context is None:
                shape = CallShape(new_tokens=max(prompt - system, 0), output_tokens=out)
            elif prompt >= context:
                shape = CallShape(new_tokens=prompt - context, output_tokens=out)
            else:
                shape = CallShape(new_tokens=prompt, output_tokens=out, reset=True)
            context = prompt + out
            steps.append(StepShape(calls=(shape,), tool_wait_s=_wait(cols, i, j == len(idx) - 1)))
        if steps:
            key = cols.session_keys[int(cols.session[idx[0]])] if cols.session_keys else int(cols.session[idx[0]])
            tasks.append(TaskShape(steps=tuple(steps), key=str(key)))
    info = {"path": str(Path(path).resolve()), "format": result.summary["format"], "sessions": len(tasks),
            "calls": int(sum(t.calls for t in tasks)), "system_prompt_tokens": system,
            "notes": read_notes(result.summary)}
    return tasks, system, info
