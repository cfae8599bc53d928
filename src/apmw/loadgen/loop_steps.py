"""A server's iterations as closed-loop calls saw them: step times under load, read off token arrival times.

Each streamed token of a call arrives at the end of an engine iteration that carried the call, so the gap
between a call's consecutive tokens is one iteration of a continuous-batching engine (every decoding call
is in every iteration). Whether that iteration also carried another call's prompt shows too: a prompt's
prefill ends with that call's first token, in the same iteration as the decodes beside it (llama.cpp
prefills a prompt whole, so the decodes wait for it). From the ``call`` records of an ``apmw bench``
results file (their ``token_times_s``), :func:`steps_under_load` reads every gap as

* a **decode step** where no other call's first token arrived in it: the number of calls decoding then
  and their mean context (prompt plus the tokens received so far), or
* a **prefill step** where exactly one did: that call's uncached prompt tokens beside the decodes;

and groups them into rows, each the median time of its group, for the calibration file's
``steps_under_load`` table (:mod:`apmw.loadgen.calibrate`). The idle rows of a calibration are 20 s of
a server doing nothing else; these are the server at the batch sizes and contexts the workload gives it.
On the 2-core test machine the idle rows of one llama.cpp server moved up to 2x between calibrations
while its step times under the loop held (bench/README.md, "Where the time per token goes").
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

CONTEXT_BIN_TOKENS = 256       # decode rows: mean context per sequence, in bins this wide
PREFILL_BIN_TOKENS = 64        # prefill rows: uncached prompt tokens, in bins this wide
MIN_DECODE_SAMPLES = 20
MIN_PREFILL_SAMPLES = 10


def _calls(runs: tuple[list[dict], ...]) -> dict[tuple[int, int], list[dict]]:
    """Ok calls with token times and a prompt size, by run and segment (each segment has its own clock)."""
    by_segment: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for run, records in enumerate(runs):
        for r in records:
            if (r.get("type") == "call" and r.get("ok") and r.get("token_times_s") and r.get("prompt_tokens")):
                by_segment[run, r.get("segment", 0)].append(r)
    return by_segment


def _gaps(calls: list[dict]) -> list[dict]:
    """Every gap between consecutive tokens of ``calls`` (one segment), with what the server held then."""
    first = np.array([c["start_s"] + c["token_times_s"][0] for c in calls])
    order = np.argsort(first)
    firsts = first[order]
    uncached = np.array([c["prompt_tokens"] - (c.get("cached_tokens") or 0) for c in calls], dtype=float)[order]
    cached = np.array([c.get("cached_tokens") or 0 for c in calls], dtype=float)[order]
    decoding = [c for c in calls if len(c["token_times_s"]) >= 2]
    if not decoding:
        return []
    start = np.array([c["start_s"] + c["token_times_s"][0] for c in decoding])
    end = np.array([c["start_s"] + c["token_times_s"][-1] for c in decoding])
    prompt = np.array([float(c["prompt_tokens"]) for c in decoding])
    tokens = np.array([float(len(c["token_times_s"])) for c in decoding])
    all_tokens = np.sort(np.concatenate([c["start_s"] + np.asarray(c["token_times_s"]) for c in decoding]))
    by_start, by_end = np.argsort(start), np.argsort(end)
    start_sorted, end_sorted = start[by_start], end[by_end]
    prompt_by_start, prompt_by_end = np.cumsum(prompt[by_start]), np.cumsum(prompt[by_end])
    tokens_by_end = np.cumsum(tokens[by_end])
    rows = []
    for c in decoding:
        t = c["start_s"] + np.asarray(c["token_times_s"])
        a, b = t[:-1], t[1:]
        # the first tokens sent with the iteration that ended the gap are those nearer its end than any
        # other token of this call: the server sends one iteration's tokens together, a step apart from the next
        mid = (a + b) / 2
        after = np.append((b[:-1] + t[2:]) / 2, b[-1] + (b[-1] - a[-1]) / 2)
        lo = np.searchsorted(firsts, mid, side="right")
        hi = np.searchsorted(firsts, after, side="right")
        started = np.searchsorted(start_sorted, mid, side="right")
        ended = np.searchsorted(end_sorted, mid, side="left")
        seqs = started - ended
        context = (_at(prompt_by_start, started) - _at(prompt_by_end, ended)
                   + np.searchsorted(all_tokens, mid, side="right") - _at(tokens_by_end, ended))
        for k in range(len(a)):         # the call's own first token, t[0], lies before every window
            if hi[k] - lo[k] > 1:
                continue                # two prompts in one iteration: not one kind of step
            carried = lo[k] if hi[k] > lo[k] else None      # the prompt prefilled in this iteration
            rows.append({"step_s": float(b[k] - a[k]), "decode_seqs": int(seqs[k]),
                         "context_tokens": float(context[k] / max(seqs[k], 1)),
                         "prefill_tokens": 0.0 if carried is None else float(uncached[carried]),
                         "prefill_context_tokens": 0.0 if carried is None else float(cached[carried])})
    return rows


def _at(cumulative: np.ndarray, count: np.ndarray) -> np.ndarray:
    """The sum of the first ``count`` entries, from their cumulative sum."""
    return np.where(count > 0, cumulative[np.maximum(count, 1) - 1], 0.0)


def steps_under_load(*runs: list[dict]) -> list[dict]:
    """The rows of the ``steps_under_load`` table: median step time per group of gaps (module docstring),
    the gaps of every run given (each a results file's records) grouped together."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for calls in _calls(runs).values():
        for g in _gaps(calls):
            if g["prefill_tokens"] > 0:
                key = ("prefill", g["decode_seqs"], int(g["prefill_tokens"] // PREFILL_BIN_TOKENS))
            else:
                key = ("decode", g["decode_seqs"], int(g["context_tokens"] // CONTEXT_BIN_TOKENS))
            groups[key].append(g)
    rows = []
    for key, gs in sorted(groups.items()):
        if len(gs) < (MIN_PREFILL_SAMPLES if key[0] == "prefill" else MIN_DECODE_SAMPLES):
            continue
        rows.append({"decode_seqs": key[1], "samples": len(gs),
                     "context_tokens": float(np.mean([g["context_tokens"] for g in gs])),
                     "prefill_tokens": float(np.mean([g["prefill_tokens"] for g in gs])),
                     "prefill_context_tokens": float(np.mean([g["prefill_context_tokens"] for g in gs])),
                     "step_s_p50": float(np.median([g["step_s"] for g in gs]))})
    return rows
