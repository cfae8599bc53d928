"""Iteration times for the simulator: the replica's step model, asked as seldom as possible.

A simulation prices hundreds of thousands of iterations, and one call of a step model costs
tens to hundreds of microseconds of Python however few iterations it prices
(:mod:`apmw.perf`), so the engine's time went mostly into asking. Three things cut the asking
without changing what is priced:

* **Decode-only iterations come from tables.** Once every context is past the model's
  non-linear part (a sliding window, a top-k), the KV bytes one decode step reads and its
  attention FLOPs are the batch size times the per-sequence figure at the batch's mean context
  (:func:`apmw.sim.fast_forward.fast_forward`). An all-decode iteration of ``b`` sequences
  whose contexts sum to ``S`` tokens is then a function of ``(b, S)`` alone, and a segment
  of them is that function at ``S, S + b, S + 2b, ...``. :class:`Pricer` evaluates the step
  model on a whole chunk of :data:`CHUNK` values of ``S`` at once, the second time a segment
  falls in it (the first time, the segment alone is priced), and keeps the chunk: an engine
  passes through the same ``(b, S)`` cells again and again, within one run and across the
  seeded runs and agent counts of a checked plan, so most decode segments cost a table lookup.
  Each entry is the step model's own value at that load.
* **The affine parts are worked out once.** Past the non-linear part the per-sequence KV read
  and attention FLOPs are affine in the context; their coefficients are read off the
  architecture once (and checked against it), so a mixed iteration's load is a few integer sums
  instead of two array evaluations.
* **A roofline is priced from its parts** (:class:`_RooflineParts`): its iteration time is a
  maximum of terms that each depend on the iteration's token count alone, or on it and the KV
  bytes or attention FLOPs linearly, so the token-count parts are tabulated once per replica from
  the step model's own methods. The result is checked against the step model when the pricer is
  built, and where it disagrees the step model is asked instead.

Every time priced here equals the step model's at the same load up to floating-point rounding
(``tests/sim/test_pricing.py``). The compute-bound share that prices power is reported only as
a time-weighted sum over the window, so :class:`apmw.sim.stats.Meter` collects the iterations
(a decode segment as its batch size, first contexts' sum and times) and prices their shares in
one call now and then.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict

import numpy as np

from apmw.perf import IterationLoad
from apmw.perf.parallelism import busiest_rank_share

# Sums of contexts S per table chunk (one step-model call prices CHUNK decode iterations).
CHUNK = 4096
# Chunks kept per replica (8 bytes per entry: at most 64 MiB), least recently used dropped first.
MAX_CHUNKS = 2048
# A decode segment whose contexts' sum runs over more than this many chunks is priced directly
# (a large batch strides through a chunk in few iterations; building its chunks would price far
# more iterations than the segment has).
MAX_SEGMENT_CHUNKS = 2
# Token counts up to which a roofline's parts are tabulated (_RooflineParts; beyond: the step model).
MAX_PARTS_TOKENS = 1 << 17
# Chunks remembered as visited once (a chunk is built on its second visit).
MAX_SEEN = 1 << 16
# Contexts at which the affine fit of the per-sequence figures is checked (offsets past linear_from).
_CHECK_OFFSETS = (0.0, 1.0, 777.0, 65_536.0, 1_000_003.0)


def _line(f, start: int) -> tuple[float, float] | None:
    """(slope, intercept) of ``f`` past ``start`` if it is affine there (to rounding), else None."""
    x = start + np.asarray(_CHECK_OFFSETS)
    y = np.asarray(f(x), dtype=float)
    slope = float(y[1] - y[0])
    intercept = float(y[0] - slope * x[0])
    fit = slope * x + intercept
    if not np.allclose(fit, y, rtol=1e-12, atol=0.0):
        return None
    return slope, intercept


class _RooflineParts:
    """A roofline step model's iteration time from its parts, tabulated by the iteration's tokens.

    :class:`apmw.perf.roofline.RooflineStepModel` prices an iteration as
    ``fixed + comm(tokens) + max(max(memory, compute as served) + launches, overlapped comm(tokens))``, where,
    without pipeline stages, the memory term is the weights' read at ``tokens`` plus the KV bytes read
    times a constant and the compute term the GEMMs' at ``tokens`` plus the attention FLOPs times a
    constant (:meth:`apmw.perf.step.RooflineFigures.roofline_terms`); under attention data parallelism
    both constants are taken at the busiest rank's share of the decoding sequences
    (:func:`apmw.perf.parallelism.busiest_rank_share`, a function of their count alone). Every part that
    depends on the tokens comes from the step model's own methods, evaluated once per token count; the
    two constants are its slopes. :meth:`build` checks the result against the step model on a spread of
    loads and declines (None) unless they agree to rounding, so a change to the roofline falls back to
    asking the step model, not to a wrong time.
    """

    __slots__ = ("base", "memory", "compute", "overlap", "launch", "kv_s_per_byte", "attn_s_per_flop", "max_tokens",
                 "layout", "_lists")

    @classmethod
    def build(cls, step, max_tokens: int, max_batch: int) -> "_RooflineParts | None":
        from apmw.perf.roofline import RooflineStepModel

        if type(step) is not RooflineStepModel or step.parallel.pp != 1 or not 0 < max_tokens <= MAX_PARTS_TOKENS:
            return None
        self = cls()
        self.layout = step.parallel
        tokens = np.arange(max_tokens + 1, dtype=float)
        zero = np.zeros_like(tokens)
        bare = IterationLoad(zero, tokens, zero, zero)
        fixed = step.efficiency.fixed_s
        self.base = np.asarray(fixed + step.comm_time_s(tokens), dtype=float) + zero
        self.memory = np.asarray(step.roofline_terms(bare)[0], dtype=float) + zero
        self.compute = np.asarray(step.served_compute_s(bare), dtype=float) + zero
        self.overlap = np.asarray(step.overlapped_comm_s(tokens), dtype=float) + zero
        self.launch = step.launch_s
        probe = 1e15
        one = IterationLoad(0.0, 1.0, probe, probe)
        mem1, comp1 = (float(x) for x in step.roofline_terms(one))
        self.kv_s_per_byte = (mem1 - float(self.memory[1])) / probe
        self.attn_s_per_flop = (float(step.served_compute_s(one)) - float(self.compute[1])) / probe
        self.max_tokens = max_tokens
        self._lists = (self.base.tolist(), self.memory.tolist(), self.compute.tolist(), self.overlap.tolist())
        # the check: loads across the range the engine produces, decode-only, prefill-only and mixed
        rng = np.random.default_rng(0)
        m = 256
        d = rng.integers(0, max_batch + 1, m).astype(float)
        p = np.where(rng.random(m) < 0.5, 0.0, rng.integers(0, max_tokens + 1, m).astype(float))
        p = np.minimum(p, np.maximum(max_tokens - d, 0.0))
        d = np.minimum(d, max_tokens)
        kv = rng.random(m) * 10.0 ** rng.uniform(3, 12, m)
        attn = rng.random(m) * 10.0 ** rng.uniform(6, 16, m)
        want = np.asarray(step.iteration_time_s(IterationLoad(d, p, kv, attn)), dtype=float)
        got = self.times((d + p).astype(np.int64), kv, attn, d)
        if not np.allclose(got, want, rtol=1e-12, atol=0.0):
            return None
        return self

    def time(self, tokens: int, kv_bytes: float, attn_flops: float, decode_seqs: int) -> float:
        base, memory, compute, overlap = self._lists
        share = busiest_rank_share(self.layout, decode_seqs)
        m = memory[tokens] + self.kv_s_per_byte * share * kv_bytes
        c = compute[tokens] + self.attn_s_per_flop * share * attn_flops
        kernels = (m if m >= c else c) + self.launch
        o = overlap[tokens]
        return base[tokens] + (kernels if kernels >= o else o)

    def times(self, tokens, kv_bytes: np.ndarray, attn_flops: np.ndarray, decode_seqs) -> np.ndarray:
        share = busiest_rank_share(self.layout, np.asarray(decode_seqs, dtype=float))
        kernels = np.maximum(self.memory[tokens] + self.kv_s_per_byte * share * kv_bytes,
                             self.compute[tokens] + self.attn_s_per_flop * share * attn_flops) + self.launch
        return self.base[tokens] + np.maximum(kernels, self.overlap[tokens])


class Pricer:
    """One replica's step model with its decode tables (module docstring)."""

    def __init__(self, step, max_tokens: int = 0, max_batch: int = 0):
        self.step = step
        arch = step.arch
        self.arch = arch
        self.kv_dtype = step.kv_dtype
        # contexts below this many tokens make KV bytes / attention FLOPs non-linear (sliding window, top-k)
        self.linear_from = max(arch.sliding_window or 0, arch.attention_topk or 0, arch.kv_reads_linear_from_tokens)
        kv_line = _line(lambda c: arch.kv_read_bytes_for_context(c, self.kv_dtype), self.linear_from)
        attn_line = _line(arch.attention_flops_per_token, self.linear_from)
        # (KV bytes read, attention FLOPs) per context token and per sequence past linear_from, or None
        self.lines = None if kv_line is None or attn_line is None else (kv_line, attn_line)
        self._chunks: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self._seen: dict[tuple[int, int], None] = {}     # chunks visited once, not built (oldest first)
        # a roofline's iteration time from its per-token-count parts (None: ask the step model)
        self.parts = _RooflineParts.build(step, max_tokens, max_batch)

    # ---- any iteration ------------------------------------------------------------------------------------
    def time_s(self, load: IterationLoad) -> float:
        parts = self.parts
        if parts is not None:
            tokens = load.decode_seqs + load.prefill_tokens
            if tokens <= parts.max_tokens:
                return parts.time(tokens, load.kv_read_bytes, load.attention_flops, load.decode_seqs)
        return float(self.step.iteration_time_s(load))

    def loads(self, kv: np.ndarray, n: np.ndarray, prefill: np.ndarray) -> tuple[float, float]:
        """(KV bytes read, attention FLOPs) of an iteration whose active sequences hold ``kv`` tokens and
        compute ``n`` each (integer arrays; prefills attend, on average, over half their chunk beyond ``kv``)."""
        if self.lines is not None and (not self.linear_from or int(kv.min()) >= self.linear_from):
            (a1, a0), (b1, b0) = self.lines
            chunk = n[prefill]
            # sum of n * (kv + n / 2 for prefills), in integers: sum n kv + (sum of squared chunks) / 2
            attended = float(int(np.dot(n, kv))) + 0.5 * float(int(np.dot(chunk, chunk)))
            return a1 * float(int(kv.sum())) + a0 * len(kv), b1 * attended + b0 * float(int(n.sum()))
        arch = self.arch
        ctx = kv + np.where(prefill, n / 2.0, 0.0)
        kv_bytes = float(np.sum(arch.kv_read_bytes_for_context(kv, self.kv_dtype)))   # read, not held
        attn = float(np.sum(n * arch.attention_flops_per_token(ctx)))
        return kv_bytes, attn

    def loads_by_rank(self, kv: list[np.ndarray], n: list[np.ndarray], prefill: list[np.ndarray]
                      ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`loads` of each attention-DP rank's sequences (each list holds one array per rank, none
        empty), priced in one pass over all of them: the architecture's functions once an iteration, not
        once a rank (a 72-rank replica's iteration otherwise spends most of its time in them)."""
        starts = np.cumsum([0] + [len(k) for k in kv[:-1]])
        kv_all, n_all, pre_all = np.concatenate(kv), np.concatenate(n), np.concatenate(prefill)
        if self.lines is not None and (not self.linear_from or int(kv_all.min()) >= self.linear_from):
            (a1, a0), (b1, b0) = self.lines
            # the same integer sums as loads(), per rank
            attended = (np.add.reduceat(n_all * kv_all, starts).astype(np.float64)
                        + 0.5 * np.add.reduceat(np.where(pre_all, n_all * n_all, 0), starts).astype(np.float64))
            counts = np.diff(np.append(starts, len(kv_all)))
            return (a1 * np.add.reduceat(kv_all, starts).astype(np.float64) + a0 * counts,
                    b1 * attended + b0 * np.add.reduceat(n_all, starts).astype(np.float64))
        arch = self.arch
        ctx = kv_all + np.where(pre_all, n_all / 2.0, 0.0)
        return (np.add.reduceat(arch.kv_read_bytes_for_context(kv_all, self.kv_dtype), starts),
                np.add.reduceat(n_all * arch.attention_flops_per_token(ctx), starts))

    # ---- all-decode iterations -------------------------------------------------------------------------
    def decode_load(self, b, total: np.ndarray) -> IterationLoad:
        """``b`` sequences (an int, or an array beside ``total``) decoding a token each, their contexts
        summing to ``total`` tokens (an array): the batch's figures are ``b`` times the per-sequence ones
        at the mean context."""
        ctx = total / b
        arch = self.arch
        return IterationLoad(b * 1.0, 0.0, b * arch.kv_read_bytes_for_context(ctx, self.kv_dtype),
                             b * arch.attention_flops_per_token(ctx))

    def _times(self, load: IterationLoad, shape: tuple[int, ...]) -> np.ndarray:
        parts = self.parts
        if parts is not None and np.ndim(load.decode_seqs) == 0 and load.prefill_tokens == 0 \
                and load.decode_seqs <= parts.max_tokens:
            decode = int(load.decode_seqs)
            return np.broadcast_to(parts.times(decode, load.kv_read_bytes, load.attention_flops, decode), shape)
        return np.broadcast_to(np.asarray(self.step.iteration_time_s(load), dtype=float), shape)

    def _chunk(self, b: int, c: int) -> np.ndarray:
        key = (b, c)
        hit = self._chunks.get(key)
        if hit is not None:
            self._chunks.move_to_end(key)
            return hit
        total = np.arange(c * CHUNK, (c + 1) * CHUNK, dtype=float)
        hit = np.ascontiguousarray(self._times(self.decode_load(b, total), total.shape))
        self._chunks[key] = hit
        if len(self._chunks) > MAX_CHUNKS:
            self._chunks.popitem(last=False)
        return hit

    def decode(self, b: int, total: int, k: int) -> np.ndarray:
        """Seconds of each of ``k`` all-decode iterations of ``b`` sequences whose contexts sum to ``total``
        tokens at the first (``total + b j`` at iteration ``j``). The contexts must all be past
        :attr:`linear_from`."""
        last = total + b * (k - 1)
        c0, c1 = total // CHUNK, last // CHUNK
        base = c0 * CHUNK
        cut = slice(total - base, last - base + 1, b)
        chunks = self._chunks
        if c0 == c1 and (b, c0) in chunks:
            chunks.move_to_end((b, c0))
            return chunks[b, c0][cut]
        # a chunk is built on its second visit: one visited once is cheaper priced directly
        seen = self._seen
        if c1 - c0 >= MAX_SEGMENT_CHUNKS or any((b, c) not in chunks and (b, c) not in seen
                                                for c in range(c0, c1 + 1)):
            for c in range(c0, c1 + 1):
                seen[b, c] = None
            if len(seen) > MAX_SEEN:
                for key in list(seen)[:len(seen) // 2]:
                    del seen[key]
            sums = total + b * np.arange(k, dtype=float)
            return self._times(self.decode_load(b, sums), sums.shape)
        if c0 == c1:
            return self._chunk(b, c0)[cut]
        return np.concatenate([self._chunk(b, c) for c in range(c0, c1 + 1)])[cut]

    def decode_shares(self, b: np.ndarray, total: np.ndarray) -> np.ndarray:
        """Compute-bound shares of all-decode iterations of ``b`` sequences whose contexts sum to ``total``
        tokens (arrays of one entry per iteration)."""
        load = self.decode_load(b, total)
        return np.broadcast_to(np.asarray(self.step.compute_share(load), dtype=float), total.shape)


# One pricer per step model object (a checked plan's runs share a replica, and with it the tables),
# by identity, dropped with the step model; at most this many are kept.
_PRICERS: dict[tuple[int, int, int], tuple[weakref.ref, Pricer]] = {}
_MAX_PRICERS = 2


def pricer_for(step, max_tokens: int = 0, max_batch: int = 0) -> Pricer:
    """The pricer of ``step``, shared by every engine of the same step model object (``max_tokens`` and
    ``max_batch``: the engine's token budget and batch cap, which bound the loads it prices)."""
    key = (id(step), max_tokens, max_batch)
    held = _PRICERS.get(key)
    if held is not None and held[0]() is step:
        return held[1]
    p = Pricer(step, max_tokens, max_batch)
    try:
        ref = weakref.ref(step, lambda _r, key=key, kept=_PRICERS: kept.pop(key, None))
    except TypeError:            # cannot be weakly referenced: not shared
        return p
    _PRICERS[key] = (ref, p)
    while len(_PRICERS) > _MAX_PRICERS:
        _PRICERS.pop(next(iter(_PRICERS)))
    return p
