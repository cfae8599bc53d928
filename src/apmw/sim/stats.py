"""What one simulated replica measures: counters over the run, time integrals over the window.

The time averages a run reports (engine utilisation, decode and running batch, resident KV
tokens, the compute-bound share that prices power) are integrals over the measurement
window ``[warmup_s, duration_s)`` that :mod:`apmw.sim.run` divides by its length. An
iteration counts in the window when it starts in it; idle time counts only its resident
KV (pinned contexts and the shared prefix stay in HBM). Token, preemption, spill and
prefix-cache counters cover the whole run. The time series samples the decode batch and
the resident KV tokens every ``sample_dt_s`` from the window's start.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from apmw.perf import IterationLoad
from apmw.sim.batch import Batch


@dataclass
class Stats:
    """Counters over the run and time integrals over the measurement window."""

    iterations: int = 0
    busy_s: float = 0.0
    compute_bound_s: float = 0.0     # busy time weighted by the roofline's compute-bound share (power)
    decode_batch_s: float = 0.0      # integral of decoding sequences over time
    running_batch_s: float = 0.0
    kv_tokens_s: float = 0.0         # integral of resident KV tokens over time
    prefill_tokens: int = 0          # over the whole run
    decode_tokens: int = 0
    generated_tokens: int = 0
    preemptions: int = 0
    lookup_tokens: int = 0           # prompt tokens looked up in the prefix cache at admission
    hit_tokens: int = 0              # ... of which found cached
    spills: int = 0                  # pinned contexts released to break a memory deadlock
    rejected_calls: int = 0          # calls whose context cannot fit in the whole KV pool
    max_blocks_used: int = 0
    samples: list = field(default_factory=list)   # (t_s, decode_batch, kv_tokens)


# Iterations, and decode segments, whose compute-bound shares are priced together (:meth:`Meter.flush`).
DEFERRED_SHARES = 4096


class Meter:
    """Adds an engine's iterations and idle spans to its :class:`Stats`, and samples its time series.

    The compute-bound share (power) counts only as its time-weighted sum over the window, so the
    iterations in the window are collected and their shares priced together (:meth:`flush`, which
    :meth:`Engine.run` calls at the end): one vectorised call instead of one per iteration.
    """

    __slots__ = ("stats", "compute_share", "decode_shares", "window", "sample_dt_s", "next_sample_s",
                 "boundaries", "_loads", "_segments")

    def __init__(self, compute_share, window: tuple[float, float], sample_dt_s: float, decode_shares=None):
        self.stats = Stats()
        self.compute_share = compute_share    # the step model's compute-bound share of an iteration's time
        # shares of all-decode iterations from (batch sizes, contexts' sums): apmw.sim.pricing.Pricer.decode_shares
        self.decode_shares = decode_shares
        self.window = window
        self.sample_dt_s = sample_dt_s
        self.next_sample_s = window[0]
        self.boundaries = sorted(b for b in window if np.isfinite(b))
        self._loads: list[tuple] = []         # iterations whose compute-bound share is not priced yet
        self._segments: list[tuple] = []      # decode segments (batch, first contexts' sum, times) ... likewise

    def in_window(self, now: float) -> bool:
        return self.window[0] <= now < self.window[1]

    def iteration(self, now: float, t: float, decode: int, running: int, kv_tokens_s: float, used_blocks: int,
                  load: IterationLoad | None = None) -> None:
        """One iteration of ``t`` seconds starting at ``now``, with ``decode`` of its ``running`` sequences
        decoding and ``used_blocks`` blocks in use."""
        st = self.stats
        st.iterations += 1
        if self.window[0] <= now < self.window[1]:
            st.busy_s += t
            if load is not None:        # the roofline's compute-bound share, priced only when it counts
                self._loads.append((load.decode_seqs, load.prefill_tokens, load.kv_read_bytes,
                                    load.attention_flops, t))
                if len(self._loads) >= DEFERRED_SHARES:
                    self.flush()
            st.decode_batch_s += decode * t
            st.running_batch_s += running * t
            st.kv_tokens_s += kv_tokens_s
        if used_blocks > st.max_blocks_used:
            st.max_blocks_used = used_blocks

    def flush(self) -> None:
        """Price the compute-bound shares of the iterations collected so far (one vectorised call each for
        single iterations and for decode segments)."""
        st = self.stats
        if self._loads:
            a = np.array(self._loads, dtype=float)
            self._loads = []
            share = np.broadcast_to(np.asarray(self.compute_share(IterationLoad(a[:, 0], a[:, 1], a[:, 2], a[:, 3])),
                                               dtype=float), (len(a),))
            st.compute_bound_s += float((share * a[:, 4]).sum())
        if self._segments:
            segs = self._segments
            self._segments = []
            b = np.array([x[0] for x in segs], dtype=float)
            first = np.array([x[1] for x in segs], dtype=float)
            k = np.array([len(x[2]) for x in segs])
            t = np.concatenate([x[2] for x in segs])
            starts = np.cumsum(k) - k
            j = np.arange(len(t)) - np.repeat(starts, k)
            bb = np.repeat(b, k)
            st.compute_bound_s += float((self.decode_shares(bb, np.repeat(first, k) + bb * j) * t).sum())

    def segment(self, now: float, t: np.ndarray, j: np.ndarray | None, load: IterationLoad | None, batch: int,
                kv_tokens: int, used_blocks: int, total: int | None = None, grown: np.ndarray | None = None,
                kept: int | None = None) -> None:
        """All-decode iterations ``j`` (default ``0 .. len(t) - 1``) of ``t`` seconds each from ``now`` (the
        fast path): ``batch`` sequences each decode a token an iteration on top of ``kv_tokens`` resident
        ones. Their compute-bound shares are priced from ``load``, or later (:meth:`flush`) from the
        contexts' sum ``total`` at the first iteration (they are all past the model's windows). Under
        speculative decoding ``grown`` is the tokens resident beyond ``kv_tokens`` at each iteration's start
        and ``kept`` the tokens the segment generated (default: one per sequence an iteration)."""
        st = self.stats
        k = len(t)
        if self.window[0] <= now < self.window[1]:
            if j is None:
                j = np.arange(k, dtype=float)
            total_t = float(t.sum())
            st.busy_s += total_t
            if total is not None and self.decode_shares is not None:
                self._segments.append((batch, total, t))
                if len(self._segments) >= DEFERRED_SHARES:
                    self.flush()
            else:
                share = np.broadcast_to(np.asarray(self.compute_share(load), dtype=float), j.shape)
                st.compute_bound_s += float((share[:k] * t).sum())
            st.decode_batch_s += batch * total_t
            st.running_batch_s += batch * total_t
            st.kv_tokens_s += kv_tokens * total_t + (float((t * grown).sum()) if grown is not None
                                                     else batch * float((t * j[:k]).sum()))
        st.iterations += k
        if used_blocks > st.max_blocks_used:
            st.max_blocks_used = used_blocks
        st.decode_tokens += batch * k if kept is None else kept
        st.generated_tokens += batch * k if kept is None else kept

    def idle(self, start_s: float, end_s: float, kv_tokens: int) -> None:
        """No iteration runs from ``start_s`` to ``end_s``; the resident KV still counts."""
        lo, hi = max(start_s, self.window[0]), min(end_s, self.window[1])
        if hi > lo:
            self.stats.kv_tokens_s += (hi - lo) * kv_tokens

    def sample(self, now: float, running: list[Batch], kv_tokens: int) -> None:
        """Record the time series point that is due by ``now`` (if any, and inside the window): the sequences
        decoding in the ``running`` batches (one per scheduler) and ``kv_tokens``."""
        if now >= self.next_sample_s and now < self.window[1]:
            decode = sum(int(len(r) - r.pre.sum()) for r in running)
            self.stats.samples.append((now, decode, kv_tokens))
            self.next_sample_s = now + self.sample_dt_s

    def next_due_s(self, now: float) -> float:
        """The next time after ``now`` at which the fast path must stop for the window or a sample."""
        t = float("inf")
        for b in self.boundaries:
            if b > now:
                t = b
                break
        if now < self.next_sample_s:
            t = min(t, self.next_sample_s)
        return t
