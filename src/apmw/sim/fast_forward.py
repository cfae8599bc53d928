"""The engine's fast path: many all-decode iterations priced and applied in one step.

Between scheduling events the batch is fixed: every running
sequence decodes one token per iteration, so its context, and hence the KV bytes
and attention FLOPs of iteration ``j``, grow linearly in ``j``. When every running
sequence is decoding and nobody can be admitted, :func:`fast_forward`
finds how many iterations ``k`` pass before the next event (a sequence finishes,
the KV pool would run out, an arrival that could be admitted, a TTL expiry, a
measurement boundary), prices the iterations up to it and applies them at once. Past
the model's windows such an iteration's time depends only on the batch size and the sum
of its contexts, so the times come from the tables of :class:`apmw.sim.pricing.Pricer`
(priced a piece at a time, 32 iterations and then four times as many as so far, until the
pieces reach the next event). The result equals the plain loop (``fast=False``) up to floating-point
rounding; ``tests/sim/test_fast_path.py`` checks it.

The fast path runs a replica with one scheduler; ranks take the plain loop.

Under speculative decoding (:func:`_speculative_segment`) a sequence keeps a known number of tokens an
iteration (:mod:`apmw.sim.drafts`), so where it stands after ``j`` iterations is known in advance too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from apmw.perf import IterationLoad
from apmw.perf.serving_policy import SGLANG_MIN_NEW_TOKEN_RATIO
from apmw.sim.drafts import cut, next_cut, tokens_per_iteration
from apmw.sim.kv_ledger import BLOCK_TOKENS

if TYPE_CHECKING:
    from apmw.sim.engine import Engine

# Longest fast-forward in one numpy call (bounds the arrays' size; a segment simply resumes).
MAX_SEGMENT_ITERATIONS = 1 << 16
# Sequence-iterations a speculative-decoding segment works out at once (bounds its positions' matrix).
MAX_SPECULATIVE_CELLS = 1 << 20
# Iterations of a decode segment priced first; each next piece is four times what is priced so far,
# until the segment's end (an arrival, a finish, a stop) is inside what was priced.
FIRST_PIECE = 32


def fast_forward(engine: Engine) -> bool:
    """Advance many all-decode iterations in one step; False when the plain step must run (always under
    attention data parallelism, whose ranks' iterations the plain step prices together)."""
    if len(engine.ranks) > 1:
        return False
    sched = engine.ranks[0]
    r = sched.running
    b = len(r.seqs)
    v = engine.verify
    if b == 0 or b * v > sched.max_tokens or np.count_nonzero(r.pre):
        return False
    if sched.adaptive_share and sched.waiting and sched.reserved_share > SGLANG_MIN_NEW_TOKEN_RATIO:
        return False    # the share falls every iteration, so the queue head may fit at any one
    budget = sched.max_tokens if engine.prefill_first else sched.max_tokens - b * v
    if sched.waiting and b < sched.max_batch and budget > 0 and (
            sched.admission(sched.waiting[0], budget) or sched.ledger.spillable(sched.waiting)):
        return False
    if v > 1:
        return _speculative_segment(engine)
    kv = r.kv
    k = min(int((r.out - r.gen).min()), MAX_SEGMENT_ITERATIONS)
    ledger = sched.ledger
    pool = ledger.pool
    if pool.capacity - pool.used < b * (k // BLOCK_TOKENS + 1):    # else every block k tokens need is free
        k = ledger.decode_room(kv, k)
        if k == 0:
            return False
    pricer = engine.pricer
    if engine.linear_from and int(kv.min()) < engine.linear_from:
        # sliding window / top-k: evaluate exactly, up to the linear part
        k = min(k, engine.linear_from - int(kv.min()))
        j = np.arange(k, dtype=float)
        ctx = kv.astype(float)[None, :] + j[:, None]
        arch = engine.arch
        load = IterationLoad(float(b), 0.0, arch.kv_read_bytes_for_context(ctx, engine.kv_dtype).sum(axis=1),
                             arch.attention_flops_per_token(ctx).sum(axis=1))
        t = pricer._times(load, j.shape)
        ends = np.cumsum(np.concatenate(([engine.now], t)))[1:]
        k = min(k, _segment_length(engine, ends))
        total = None
    else:
        # linear in the context from here: the batch's sum is b times the figure at its mean context,
        # a function of the contexts' sum (apmw.sim.pricing's tables); priced piece by piece up to the
        # segment's end
        total, j, load = int(kv.sum()), None, None
        stops = _stop_times(engine)
        m = min(FIRST_PIECE, k)
        t = pricer.decode(b, total, m)
        ends = np.cumsum(np.concatenate(((engine.now,), t)))[1:]
        while m < k and _segment_length(engine, ends, stops) > m:
            more = min(4 * m, k - m)
            tp = pricer.decode(b, total + b * m, more)
            t = np.concatenate((t, tp))
            ends = np.concatenate((ends, np.cumsum(np.concatenate(((ends[-1],), tp)))[1:]))
            m += more
        k = min(m, _segment_length(engine, ends, stops))
    t = t[:k]
    engine.meter.sample(engine.now, [r], ledger.kv_tokens)
    kv = kv + k
    own = ledger.blocks_for(kv)
    pool.take(int(own.sum()) - int(r.own.sum()))
    engine.meter.segment(engine.now, t, j, load, b, ledger.kv_tokens, pool.used, total)
    sched.decay_share(k)
    engine._decodes_since_poll += k
    engine.now = float(ends[k - 1])
    engine._last_start_s = engine.now - float(t[k - 1])
    ledger.computed(b * k)
    r.kv = kv
    r.total = r.total + k
    r.gen = r.gen + k
    r.own = own
    done = r.gen == r.out
    if np.count_nonzero(done):
        engine._finish(sched, done)
    return True


def _speculative_segment(engine: Engine) -> bool:
    """The fast path under speculative decoding: many all-decode iterations, each sequence keeping
    :func:`~apmw.sim.drafts.kept_tokens` an iteration, priced in one call; False when the plain step must run. Where a
    sequence stands after ``j`` iterations is known in advance: from its next cut ``m`` (:func:`next_cut`)
    at ``g`` generated, ``cut(m + j - 1)`` (what :func:`~apmw.sim.drafts.kept_tokens` gives step by step). The segment
    ends at the first finish, before the first iteration whose drafts' blocks the pool cannot supply,
    or at the plain loop's next event (:func:`_segment_length`). Contexts must be past the model's
    non-linear part (a sliding window, a top-k), where an iteration's load is affine in their sum."""
    sched = engine.ranks[0]
    r, ledger, pricer = sched.running, sched.ledger, engine.pricer
    pool = ledger.pool
    b, v = len(r.seqs), engine.verify
    if pricer.lines is None or (engine.linear_from and int(r.kv.min()) < engine.linear_from):
        return False
    y = tokens_per_iteration(engine.acceptance, np.full(b, v))
    first = next_cut(r.gen, y)                         # each sequence's next cut
    # iterations until the first sequence finishes (its cut reaches its output), capped so that the
    # positions' matrix stays small
    k = int(min((np.ceil(r.out / y) - first).min() + 2, MAX_SPECULATIVE_CELLS // b, MAX_SEGMENT_ITERATIONS))
    if k < 1:
        return False
    pos = cut(first[None, :] + np.arange(k, dtype=float)[:, None], y[None, :])
    np.minimum(pos, r.out[None, :], out=pos)           # generated after iteration j (row j)
    finished = (pos >= r.out[None, :]).any(axis=1)
    if finished.any():
        k = int(np.argmax(finished)) + 1
    gen = np.vstack((r.gen[None, :], pos[:k - 1]))      # generated at the start of iteration j
    kv = r.kv[None, :] + (gen - r.gen[None, :])
    # blocks held with the drafts' lookahead during iteration j, against what the pool can supply
    peak = ledger.blocks_for(kv + v).sum(axis=1)
    room = pool.capacity - pool.used + int(r.own.sum())
    short = peak > room
    if short.any():
        k = int(np.argmax(short))
        if k == 0:
            return False
    total = kv[:k].sum(axis=1).astype(float)
    (a1, a0), (b1, b0) = pricer.lines
    load = IterationLoad(float(b * v), 0.0, a1 * total + a0 * b, v * (b1 * total + b0 * b))
    t = pricer._times(load, total.shape) * engine.draft_factor
    ends = np.cumsum(np.concatenate(((engine.now,), t)))[1:]
    k = min(k, _segment_length(engine, ends))
    t, load = t[:k], IterationLoad(load.decode_seqs, 0.0, load.kv_read_bytes[:k], load.attention_flops[:k])
    engine.meter.sample(engine.now, [r], ledger.kv_tokens)
    grown = (total[:k] - total[0])
    kept = pos[k - 1] - r.gen
    used_peak = pool.used - int(r.own.sum()) + int(peak[:k].max())
    engine.meter.segment(engine.now, t, None, load, b, ledger.kv_tokens, used_peak, grown=grown,
                       kept=int(kept.sum()))
    sched.decay_share(k)
    engine._decodes_since_poll += k
    engine.now = float(ends[k - 1])
    engine._last_start_s = engine.now - float(t[k - 1])
    ledger.computed(int(kept.sum()))
    r.kv = r.kv + kept
    r.gen = r.gen + kept
    r.total = r.total + kept
    # the drafts' blocks at the segment's peak are taken (evicting cached prefixes as the plain loop's
    # iterations do, in the same LRU order) and all but what the kept tokens hold given back
    peak_blocks = int(peak[:k].max())
    own = ledger.blocks_for(r.kv)
    pool.take(peak_blocks - int(r.own.sum()))
    ledger.give_back(peak_blocks - int(own.sum()))
    r.own = own
    done = r.gen == r.out
    if np.count_nonzero(done):
        engine._finish(sched, done)
    return True


def _segment_length(engine: Engine, ends: np.ndarray, stops: tuple[float, float] | None = None) -> int:
    """How many of the iterations ending at ``ends`` the plain loop runs before its next event
    (``stops``: :func:`_stop_times`, if already known). More than ``len(ends)`` when none of them
    reaches it."""
    stop, joins = _stop_times(engine) if stops is None else stops
    k = int(ends.searchsorted(stop)) + 1
    if np.isfinite(joins):
        # the arrival is queued after the first iteration ending at or after it; scheduling ahead,
        # after the first one *starting* at or after it (Engine._arrival_cutoff_s), one iteration later
        if not engine.ahead:
            k = min(k, int(ends.searchsorted(joins)) + 1)
        else:
            k = min(k, 1 if joins <= engine.now else int(ends.searchsorted(joins)) + 2)
    if engine.recv_interval > 1:
        # a scheduler that polls for new calls less often than every iteration polls at the end of
        # the segment at the latest: what arrives before a poll is taken in there
        k = min(k, engine.recv_interval - engine._decodes_since_poll)
    return k


def _stop_times(engine: Engine) -> tuple[float, float]:
    """When the plain loop would next do something other than decode: (the first iteration
    ending at or after this time is the last of the segment, an arrival that may join: the
    segment ends with the iteration whose batch takes it)."""
    sched = engine.ranks[0]
    t = min(engine.driver.stop_time_s, sched.ledger.next_expiry_s(), engine.meter.next_due_s(engine.now))
    joins = np.inf
    if engine.arrivals and not sched.waiting and len(sched.running.seqs) < sched.max_batch:
        joins = engine.arrivals[0][0]
    return t, joins
