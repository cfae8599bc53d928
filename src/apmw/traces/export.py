"""Write a workload as NVIDIA AIPerf ``mooncake_trace`` JSONL, so it can be replayed with that tool.

One line per call: ``session_id``, ``input_length`` (the whole prompt),
``output_length``, ``hash_ids`` and ``delay`` (ms to wait after the previous
turn of the session, i.e. the tool wait; absent on a session's first turn).
``hash_ids`` give every 512-token block an id: the system prompt's blocks are
shared by all sessions and a session's history blocks are reused by its later
calls, so AIPerf synthesises prompts whose prefix reuse matches the workload.

Two sources: the calls of a trace as measured (:func:`write_measured`), or
sessions sampled from a fitted Workload with a seed (:func:`write_fitted`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from apmw.spec import Workload
from apmw.traces.fit import Columns
from apmw.traces.prefix import MOONCAKE_BLOCK_TOKENS


class _Blocks:
    """Hands out block ids: shared system-prompt blocks, then per-session chains."""

    def __init__(self, system_tokens: int, block_tokens: int):
        self.block = block_tokens
        self.system_blocks = list(range(system_tokens // block_tokens))
        self.next_id = len(self.system_blocks)

    def new_session(self) -> list[int]:
        return list(self.system_blocks)

    def ids(self, chain: list[int], stable_tokens: float, prompt_tokens: float) -> list[int]:
        """Ids for a prompt whose first ``stable_tokens`` repeat the session's history; extends ``chain``."""
        keep = min(int(stable_tokens // self.block), len(chain))
        del chain[keep:]
        total = math.ceil(prompt_tokens / self.block)
        out = list(chain)
        while len(out) < total:
            out.append(self.next_id)
            self.next_id += 1
        chain[:] = out[: int(prompt_tokens // self.block)]  # only full blocks carry over
        return out


def _line(session: str, prompt: float, output: float, ids: list[int], delay_s: float | None) -> str:
    rec = {"session_id": session, "input_length": int(round(prompt)), "output_length": max(int(round(output)), 1),
           "hash_ids": ids}
    if delay_s is not None:
        rec["delay"] = round(delay_s * 1e3, 3)
    return json.dumps(rec, separators=(",", ":"))


def write_measured(c: Columns, system_prompt_tokens: int, tool_wait_s: np.ndarray, path: str | Path,
                   block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> int:
    """The trace's own calls, in session order; returns the number of lines written."""
    blocks = _Blocks(system_prompt_tokens, block_tokens)
    n = len(c)
    with open(path, "w", encoding="utf-8") as f:
        chain: list[int] = []
        for i in range(n):
            first = i == 0 or c.session[i] != c.session[i - 1]
            if first:
                chain = blocks.new_session()
                stable = float(system_prompt_tokens)
                delay = None
            else:
                stable = min(c.input_tokens[i - 1] + c.output_tokens[i - 1], c.input_tokens[i])
                w = tool_wait_s[i - 1]
                delay = float(w) if np.isfinite(w) else 0.0
            ids = blocks.ids(chain, stable, c.input_tokens[i])
            key = c.session_keys[c.session[i]]
            name = "-".join(map(str, key)) if isinstance(key, tuple) else str(key)
            f.write(_line(name, c.input_tokens[i], c.output_tokens[i], ids, delay) + "\n")
    return n


def write_fitted(w: Workload, path: str | Path, sessions: int, seed: int,
                 block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> int:
    """``sessions`` sessions sampled from ``w`` with ``seed`` (same draws as the spec's semantics)."""
    rng = np.random.default_rng(seed)
    blocks = _Blocks(w.system_prompt_tokens, block_tokens)
    lines = 0
    with open(path, "w", encoding="utf-8") as f:
        for s in range(sessions):
            steps = max(int(round(w.steps_per_task.sample(rng, 1)[0])), 1)
            chain = blocks.new_session()
            context = float(w.system_prompt_tokens)
            delay = None
            first_dist = w.first_call_input_tokens or w.new_input_tokens_per_call
            for k in range(steps):
                calls = max(int(round(w.calls_per_step.sample(rng, 1)[0])), 1)
                for j in range(calls):
                    dist = first_dist if (k == 0 and j == 0) else w.new_input_tokens_per_call
                    new = max(round(float(dist.sample(rng, 1)[0])), 0)
                    out = max(round(float(w.output_tokens_per_call.sample(rng, 1)[0])), 1)
                    stable = context
                    prompt = context + new
                    ids = blocks.ids(chain, stable, prompt)
                    f.write(_line(f"s{s}", prompt, out, ids, delay) + "\n")
                    lines += 1
                    context = prompt + out
                    delay = 0.0
                delay = max(float(w.tool_wait_s.sample(rng, 1)[0]), 0.0)
    return lines
