"""Write a workload as NVIDIA AIPerf ``mooncake_trace`` JSONL, so it can be replayed with that tool.

One line per call: ``session_id``, ``input_length``, ``output_length``,
``hash_ids`` and ``delay`` (ms to wait after the previous turn of the session,
i.e. the tool wait; absent on a session's first turn). AIPerf replays a session
in its default ``deltas_without_responses`` mode: each turn sends the history
(earlier turns and the live responses) plus the turn's own content. So a turn's
``input_length`` is its *new* tokens: the whole first prompt, then each call's
new input (at least 1 token: an empty turn is not a request). ``hash_ids`` name
the turn's 512-token blocks: the system prompt's blocks are shared by every
session's first turn, all other blocks are fresh, so AIPerf synthesises prompts
whose prefix reuse matches the workload (history by replay, system prompt by ids).

Two sources: the calls of a trace as measured (:func:`write_measured`), or
sessions sampled from a fitted Workload with a seed (:func:`write_fitted`).
A measured call whose prompt shrank (the agent trimmed its context) cannot be
replayed as a delta; it is written with 1 new token and the replay's context
grows where the original's shrank.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from apmw.spec import Workload
from apmw.spec.distribution import sample_whole
from apmw.traces.fit import Columns
from apmw.traces.prefix import MOONCAKE_BLOCK_TOKENS


class _Blocks:
    """Hands out block ids: the system prompt's blocks are shared, all others fresh."""

    def __init__(self, system_tokens: int, block_tokens: int):
        self.block = block_tokens
        self.system_blocks = list(range(int(system_tokens) // block_tokens))
        self.next_id = len(self.system_blocks)

    def fresh(self, n: int) -> list[int]:
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        return ids

    def first_turn(self, tokens: float) -> list[int]:
        total = math.ceil(tokens / self.block)
        shared = self.system_blocks[: int(tokens // self.block)]
        return shared + self.fresh(total - len(shared))

    def delta(self, tokens: float) -> list[int]:
        return self.fresh(math.ceil(tokens / self.block))


def export_notes(system_prompt_tokens: float, calls_per_step: float | None,
                 block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> list[str]:
    """What the export cannot carry, for the user: a system prompt shared in whole blocks only (``hash_ids`` name
    whole blocks, so its last part block is each session's own), and steps of several calls (a turn has one
    delay before it and no step)."""
    notes = []
    shared = int(system_prompt_tokens) // block_tokens * block_tokens
    if shared != int(system_prompt_tokens):
        notes.append(f"the system prompt's {int(system_prompt_tokens):,} tokens are shared in whole {block_tokens}-token "
                     f"blocks (hash_ids): the replay, and apmw fit on the export, share {shared:,}")
    if calls_per_step is not None and calls_per_step > 1:
        notes.append(f"steps of several calls ({calls_per_step:.2f} calls a step) are written as turns, each after the "
                     "wait before it: reading the export back gives one call a step, and a tool wait of 0 inside each step")
    return notes


def _line(session: str, new_tokens: float, output: float, ids: list[int], delay_s: float | None) -> str:
    rec = {"session_id": session, "input_length": int(round(new_tokens)), "output_length": max(int(round(output)), 1),
           "hash_ids": ids}
    if delay_s is not None:
        rec["delay"] = round(delay_s * 1e3, 3)
    return json.dumps(rec, separators=(",", ":"))


def write_measured(c: Columns, system_prompt_tokens: int, tool_wait_s: np.ndarray, path: str | Path,
                   block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> int:
    """The trace's own calls, in session order; returns the number of lines written."""
    blocks = _Blocks(system_prompt_tokens, block_tokens)
    names = session_names(c.session_keys)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(len(c)):
            name = names[c.session[i]]
            if i == 0 or c.session[i] != c.session[i - 1]:
                new = c.input_tokens[i]
                ids, delay = blocks.first_turn(new), None
            else:
                new = max(c.input_tokens[i] - c.input_tokens[i - 1] - c.output_tokens[i - 1], 1.0)
                w = tool_wait_s[i - 1]
                ids, delay = blocks.delta(new), float(w) if np.isfinite(w) else 0.0
            f.write(_line(name, new, c.output_tokens[i], ids, delay) + "\n")
    return len(c)


def session_names(keys: list) -> list[str]:
    """A ``session_id`` per session key, no two alike: a key of several parts (mini-swe-agent's run and instance)
    joined by '-', and a name two keys would share (('a-b', 'c') and ('a', 'b-c')) given its session's number
    after '~', so that a replay keeps the sessions apart."""
    names = ["-".join(map(str, key)) if isinstance(key, tuple) else str(key) for key in keys]
    taken: dict[str, int] = {}
    for name in names:
        taken[name] = taken.get(name, 0) + 1
    for i, name in enumerate(names):
        if taken[name] > 1:
            unique = f"{name}~{i}"
            while unique in taken:
                unique += "~"
            names[i] = unique
            taken[unique] = 1
    return names


def write_fitted(w: Workload, path: str | Path, sessions: int, seed: int,
                 block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> int:
    """``sessions`` sessions sampled from ``w`` with ``seed``; returns the number of lines written."""
    rng = np.random.default_rng(seed)
    blocks = _Blocks(w.system_prompt_tokens, block_tokens)
    first_dist = w.first_call_input_tokens or w.new_input_tokens_per_call
    lines = 0
    with open(path, "w", encoding="utf-8") as f:
        for s in range(sessions):
            steps = int(sample_whole(w.steps_per_task, rng, 1, 1)[0])
            delay = None
            for k in range(steps):
                calls = int(sample_whole(w.calls_per_step, rng, 1, 1)[0])
                for j in range(calls):
                    out = int(sample_whole(w.output_tokens_per_call, rng, 1, 1)[0])
                    if k == 0 and j == 0:
                        new = w.system_prompt_tokens + int(sample_whole(first_dist, rng, 1)[0])
                        ids = blocks.first_turn(new)
                    else:
                        new = int(sample_whole(w.new_input_tokens_per_call, rng, 1, 1)[0])
                        ids = blocks.delta(new)
                    f.write(_line(f"s{s}", new, out, ids, delay) + "\n")
                    lines += 1
                    delay = 0.0
                delay = max(float(w.tool_wait_s.sample(rng, 1)[0]), 0.0)
    return lines
