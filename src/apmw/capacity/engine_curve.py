"""The engine curve: iteration time and call completion rate at every batch size (MODEL.md section 3).

The load-dependent station of the closed loop (:mod:`apmw.capacity.closed_network`): with ``b``
calls running, the iteration carries the pooled per-call mix. Of the ``b`` running calls, a share
``PF / (PF + D)`` are in their prefill iterations and the rest decode, where ``PF`` and ``D`` are
the mean prefill and decode iterations per call; every iteration time comes from the replica's
step model.
"""


from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
from scipy.stats import binom

from apmw.capacity.sessions import SessionSample
from apmw.perf import IterationLoad, StepModel
from apmw.perf.parallelism import at_busiest_rank, busiest_rank_share


@dataclass(frozen=True)
class EngineCurve:
    """Iteration time and call completion rate for every batch size 1..max_batch."""

    batch: np.ndarray            # b = 1..max_batch
    iteration_s: np.ndarray      # t_iter(b), mean over all iterations
    prefill_iteration_s: np.ndarray  # mean iteration time a call sees while prefilling
    decode_iteration_s: np.ndarray   # ... while decoding (its time per output token)
    completion_rate: np.ndarray  # mu(b), calls per second
    decode_share: float          # share of running calls that are decoding
    iterations_per_call: float
    compute_share: np.ndarray    # time-weighted compute-bound share of iterations at each b
    decoding: np.ndarray         # time-weighted number of decoding sequences at each b
    stall_variance_s2: np.ndarray  # variance of a decode iteration's time with the prompts it carries or the
    #                                prefill iterations after it (prefill first): the per-call TPOT spread

    def up_to(self, max_batch: int) -> "EngineCurve":
        """The curve for batch sizes 1..``max_batch`` (at most this one's): each batch size's row depends on
        nothing but that size, so it is this curve's first rows."""
        cut: dict[str, Any] = {name: rows[:max_batch] for name, rows in self._rows().items()}
        return replace(self, **cut)

    def then(self, more: "EngineCurve") -> "EngineCurve":
        """This curve followed by ``more``, the rows of the next batch sizes."""
        theirs = more._rows()
        joined: dict[str, Any] = {name: np.concatenate((rows, theirs[name])) for name, rows in self._rows().items()}
        return replace(self, **joined)

    def _rows(self) -> dict[str, np.ndarray]:
        """The fields with a row per batch size."""
        return {f.name: v for f in fields(self) if isinstance(v := getattr(self, f.name), np.ndarray)}


# Iterations carry at most this many prefilling calls in the mixture below; the
# binomial mass beyond it is folded into the last term.
MAX_PREFILLS_PER_ITERATION = 32


# Curves recently built, by step model and sample: a search re-plans one step model and sample at other batch
# limits, whose curves are the first rows of the largest. An entry refers to its step model and sample weakly
# (they are the caches' of apmw.perf.replica and apmw.capacity.sessions to keep), and is read only while both
# live, so that a new object that takes a dead one's id never finds its curve. A curve is a few kB a batch size.
CURVE_CACHE_ENTRIES = 64
_CURVES: OrderedDict[tuple, tuple[weakref.ref, weakref.ref, EngineCurve]] = OrderedDict()


def engine_curve(step: StepModel, s: SessionSample, max_batch: int, decode_only: bool = False,
                 mixed: bool = True, *, recv_interval: int = 1, token_budget: int | None = None) -> EngineCurve:
    """:func:`build_engine_curve`, or the first ``max_batch`` rows of one built before for the same step model
    and sample at a larger batch limit (the same values: its rows are read-only)."""
    key = (id(step), id(s), decode_only, mixed, recv_interval, token_budget)
    entry = _CURVES.get(key)
    built = entry[2] if entry is not None and entry[0]() is step and entry[1]() is s else None
    if built is not None and len(built.batch) >= max_batch:
        _CURVES.move_to_end(key)
        return built.up_to(max_batch)
    if built is None:
        curve = build_engine_curve(step, s, max_batch, decode_only, mixed, recv_interval=recv_interval,
                                   token_budget=token_budget)
    else:
        curve = built.then(build_engine_curve(step, s, max_batch, decode_only, mixed, first=len(built.batch) + 1,
                                              recv_interval=recv_interval, token_budget=token_budget))
    for rows in curve._rows().values():
        rows.flags.writeable = False
    _CURVES[key] = (weakref.ref(step), weakref.ref(s), curve)
    _CURVES.move_to_end(key)
    while len(_CURVES) > CURVE_CACHE_ENTRIES:
        _CURVES.popitem(last=False)
    return curve


def build_engine_curve(step: StepModel, s: SessionSample, max_batch: int, decode_only: bool = False,
                       mixed: bool = True, first: int = 1, *, recv_interval: int = 1,
                       token_budget: int | None = None) -> EngineCurve:
    """Iteration times at each batch size ``b`` from ``first`` to ``max_batch``.

    Of ``b`` running calls, each is in a prefill iteration with probability
    ``q = PF / (PF + D)``. Prefill chunks are big (hundreds to thousands of
    tokens) and rare, so iteration times are averaged over the binomial number
    of prefilling calls rather than computed at the average load: step time is
    not linear in tokens (MoE experts touched saturate; the roofline takes a max).
    A call sees two kinds of iteration: its own prefill iterations (itself plus
    ``Binom(b-1, q)`` other prefills) and its decode iterations (``Binom(b-1, q)``
    other prefills); their mix over a call's life averages to the engine's mean.

    ``mixed=False`` (prefill first, SGLang: :mod:`apmw.perf.serving_policy`) prices the other kind
    of engine, whose prefill iterations follow the arrivals: see :func:`_prefill_first_curve`. Its
    scheduler polls every ``recv_interval`` decode iterations and a prefill iteration takes at most
    ``token_budget`` tokens (None: no limit but the chunk count the mixture holds).
    """
    # decode_only: prefill runs on another instance (disaggregation), iterations only decode
    iters = max(s.call_decode_iters, 1e-9) if decode_only else s.call_prefill_iters + s.call_decode_iters
    q = 0.0 if decode_only else s.call_prefill_iters / iters
    chunk = s.call_prefill_tokens / s.call_prefill_iters       # tokens per prefill iteration of a call
    chunk_attn = s.call_prefill_attn_flops / s.call_prefill_iters
    b = np.arange(first, max_batch + 1, dtype=float)[:, None]
    others = np.arange(0, MAX_PREFILLS_PER_ITERATION + 1, dtype=float)[None, :]
    weight = binom.pmf(others, b - 1, q)
    weight[:, -1] += binom.sf(MAX_PREFILLS_PER_ITERATION, b[:, 0] - 1, q)
    others = np.minimum(others, b - 1)

    verify = s.decode_tokens_per_iteration         # k + 1 under speculative decoding, else 1

    def mean_time(decode: np.ndarray, prefills: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Binomially weighted iteration time of ``decode`` decoders and ``prefills`` chunks,
        the iterations' time-weighted compute-bound share (drives power), and the time's variance."""
        load = IterationLoad(
            decode_seqs=decode * verify,
            prefill_tokens=prefills * chunk,
            kv_read_bytes=decode * s.call_decode_kv_bytes + prefills * s.call_prefill_kv_bytes,
            attention_flops=decode * verify * s.call_decode_attn_flops + prefills * chunk_attn,
        )
        if step.parallel.dp > 1:
            load = prompts_on_their_ranks(step, load, prefills, s.call_prefill_kv_bytes, chunk_attn)
        t = step.iteration_time_s(load) * (1.0 + s.draft_cost_fraction) * np.ones_like(weight)
        share = (step.compute_share(load) * t * weight).sum(axis=1) / (t * weight).sum(axis=1)
        mean = (t * weight).sum(axis=1)
        return mean, share, np.maximum((t * t * weight).sum(axis=1) - mean * mean, 0.0)

    if not mixed and not decode_only:
        alone = _prefill_alone(step, s, chunk, chunk_attn)
        max_chunks = min(float(alone.chunks[-1]), max(token_budget / chunk, 1.0)) if token_budget else float(alone.chunks[-1])
        return _prefill_first_curve(s, b[:, 0], iters, others, weight, mean_time, alone, recv_interval, max_chunks)
    t_prefill, share_prefill, _ = mean_time(b - others - 1, others + 1)
    t_decode, share_decode, decode_variance = mean_time(b - others, others)
    t = q * t_prefill + (1 - q) * t_decode
    share = (q * t_prefill * share_prefill + (1 - q) * t_decode * share_decode) / t
    b = b[:, 0]
    # time-weighted decoding sequences: prefill iterations are longer and carry one decoder fewer
    decoding = (q * t_prefill * (b - 1) * (1 - q) + (1 - q) * t_decode * (1 + (b - 1) * (1 - q))) / t
    return EngineCurve(batch=b, iteration_s=t, prefill_iteration_s=t_prefill, decode_iteration_s=t_decode,
                       completion_rate=b / (iters * t), decode_share=s.call_decode_iters / iters,
                       iterations_per_call=iters, compute_share=share, decoding=decoding,
                       stall_variance_s2=decode_variance)


def prompts_on_their_ranks(step: StepModel, load: IterationLoad, prefills: np.ndarray, chunk_kv_bytes: float,
                           chunk_attn_flops: float) -> IterationLoad:
    """``load`` with its prompts' attention on their own ranks, under attention data parallelism.

    Each rank computes attention for its own sequences only, and every rank waits for the slowest in the
    MoE layers. The step model prices the busiest rank as an even split of the decoding sequences would
    make it (:func:`apmw.perf.parallelism.busiest_rank_share`), right for the decoders, but a
    prompt chunk is one sequence: its attention, tens of times a decoder's, lands on one rank, so the
    rank that carries it reads its share of the decoders' KV plus the chunk's whole KV and attention. With
    ``k`` chunks the busiest rank carries ``ceil(k / ranks)`` of them (spread over the ranks; the
    simulator places them where their agents are and prices each rank's own load,
    ``apmw.sim.engine.Engine._busiest_rank_loads``, and agrees, docs/simulate.md). The load returned is
    scaled so that the step model's own share gives that busiest rank.
    """
    lay = step.parallel
    decode_share = busiest_rank_share(lay, np.asarray(load.decode_seqs, dtype=np.float64))
    chunks = np.ceil(prefills / lay.dp)

    def busiest(total, per_chunk: float) -> np.ndarray:
        decoders = np.asarray(total, dtype=np.float64) - prefills * per_chunk
        return at_busiest_rank(lay, load.decode_seqs, decoders * decode_share / lay.dp + chunks * per_chunk)

    return IterationLoad(load.decode_seqs, load.prefill_tokens, busiest(load.kv_read_bytes, chunk_kv_bytes),
                         busiest(load.attention_flops, chunk_attn_flops))


# Prompts drawn to price a prefill iteration of ``k`` chunks, for each ``k`` (prefill-first engines).
PREFILL_DRAWS = 256


@dataclass(frozen=True)
class PrefillAlone:
    """A prefill-first engine's prefill iteration (chunks and nothing else) at ``chunks`` = 1..33 chunks:
    its mean time, compute-bound share and time at mean chunks (:func:`_prefill_alone`). Between whole
    counts, the line between them."""

    chunks: np.ndarray
    mean_time_s: np.ndarray
    compute_share_at: np.ndarray
    at_mean_chunk_s: np.ndarray

    def mean_s(self, chunks: np.ndarray) -> np.ndarray:
        return np.interp(chunks, self.chunks, self.mean_time_s)

    def share(self, chunks: np.ndarray) -> np.ndarray:
        return np.interp(chunks, self.chunks, self.compute_share_at)

    def own_s(self, chunks: np.ndarray) -> np.ndarray:
        return np.interp(chunks, self.chunks, self.at_mean_chunk_s)


def _prefill_alone(step: StepModel, s: SessionSample, chunk: float, chunk_attn: float) -> PrefillAlone:
    """An iteration of ``k`` = 1..33 chunks and nothing else (a prefill-first engine's prefill iteration):
    its mean time and compute-bound share, and its time at ``k`` mean chunks.

    The mean is over the calls' own chunk sizes, not at the mean size: where a small prompt touches few of
    an MoE's experts (a 50-token chunk reads a fraction of the experts a 500-token one does) the time is
    concave in the tokens, and a batch of typical prompts costs less than one of the mean prompt (where
    the weights' read floors it, convex, and more). Each draw sums ``k`` sampled calls' chunks (tokens
    per prefill iteration), consecutive in the sample (its calls are drawn at random), scaled so that
    their mean is the mean ``chunk``; attention follows the tokens. The time at mean chunks is what a
    call's own prefill is priced around (:func:`apmw.capacity.evaluate.evaluate` splits it into a base and
    a cost per token, and a line through the mean chunk fits long prompts' TTFT better).
    """
    k = np.arange(1, MAX_PREFILLS_PER_ITERATION + 2, dtype=float)
    per_call = s.call_prefill_tokens_sample / np.maximum(s.call_prefill_iters_sample, 1)
    if not len(per_call) or per_call.mean() <= 0:
        per_call = np.array([chunk])
    per_call = per_call * (chunk / per_call.mean())
    draws = np.resize(per_call, (int(k[-1]), PREFILL_DRAWS))               # row i: the i-th chunk of each draw
    tokens = np.column_stack((np.cumsum(draws, axis=0), k * chunk))        # row k-1: k chunks; last: k means
    alone = IterationLoad(decode_seqs=np.zeros_like(tokens), prefill_tokens=tokens,
                          kv_read_bytes=k[:, None] * s.call_prefill_kv_bytes * np.ones_like(tokens),
                          attention_flops=tokens * (chunk_attn / chunk))
    t = step.iteration_time_s(alone) * (1.0 + s.draft_cost_fraction) * np.ones_like(tokens)
    drawn = t[:, :-1]
    share = (step.compute_share(alone) * np.ones_like(tokens))[:, :-1]
    return PrefillAlone(k, drawn.mean(axis=1), (share * drawn).sum(axis=1) / drawn.sum(axis=1), t[:, -1])


def _prefill_first_curve(s: SessionSample, b: np.ndarray, iters: float, others: np.ndarray, weight: np.ndarray,
                         mean_time, alone: PrefillAlone, recv_interval: int, max_chunks: float) -> EngineCurve:
    """The engine curve when prefill iterations run alone and first (SGLang).

    Of ``b`` running calls, ``K ~ Binom(b-1, q)`` are prefilling, as in the mixed curve, and the
    ``d = b - E[K]`` others decode: a decode iteration carries them and no chunk. A prefill
    iteration carries no decoder and runs whenever a chunk waits at the scheduler's poll, so how
    many there are follows the arrivals (:func:`prefill_runs`), not the batch: a call's time per
    output token is its decode iterations plus the prefill iterations that stall them.
    ``mean_time(decode, prefills)`` is :func:`engine_curve`'s weighted iteration time and ``alone`` the
    prefill iteration's (a call's own prefill is reported at mean chunks: :func:`_prefill_alone`).
    """
    zero = np.zeros_like(others)
    t_dec, share_dec, decode_variance = mean_time(b[:, None] - others, zero)
    d = b - (others * weight).sum(axis=1)
    # chunks that arrive per decode iteration: d / D calls complete in one, and each brings PF chunks
    arriving = s.call_prefill_iters * d / max(s.call_decode_iters, 1e-9)
    per_decode, chunks, runs_variance = prefill_runs(arriving, t_dec, alone.mean_s, recv_interval, max_chunks)
    t_pre, share_pre, t_own = alone.mean_s(chunks), alone.share(chunks), alone.own_s(chunks)
    cycle_s = t_dec + per_decode * t_pre
    per_call_s = max(s.call_decode_iters, 1e-9) * cycle_s / d     # engine time per completed call
    residence = b * per_call_s
    per_token = (residence - s.call_prefill_iters * t_pre) / max(s.call_decode_iters, 1e-9)
    return EngineCurve(batch=b, iteration_s=residence / iters, prefill_iteration_s=t_own,
                       decode_iteration_s=per_token, completion_rate=1.0 / per_call_s,
                       decode_share=s.call_decode_iters / iters, iterations_per_call=iters,
                       compute_share=(t_dec * share_dec + per_decode * t_pre * share_pre) / cycle_s,
                       decoding=d * t_dec / cycle_s, stall_variance_s2=runs_variance * t_pre ** 2 + decode_variance)


# Bisection steps for the prefill iterations per decode iteration: bracketed within the token budget's chunk
# count (at most 33), so 45 halvings leave them exact to about 1e-12.
RUN_BISECTIONS = 45


def prefill_runs(arriving: np.ndarray, t_decode: np.ndarray, prefill_s, recv_interval: int = 1,
                 max_chunks: float = np.inf) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Prefill iterations per decode iteration, chunks per prefill iteration, and the variance per decode
    iteration of how many prefill iterations follow it, of a prefill-first engine.

    The scheduler polls for waiting chunks after every prefill iteration and after every
    ``recv_interval`` decode iterations, and runs a prefill iteration whenever one waits, with every
    chunk that waits (at most ``max_chunks``, the token budget's worth). Chunks arrive at random
    (Poisson) at ``arriving`` per decode iteration: in a cycle of length ``T`` (one decode iteration
    and its share of prefill iterations) at rate ``r = arriving / T``. A block of ``recv_interval``
    decode iterations is followed by a prefill iteration with probability ``1 - exp(-r R t_decode)``,
    and each prefill iteration by another with probability ``p = 1 - exp(-r t_prefill)``: so
    ``runs = (1 - exp(-r R t_decode)) / (R (1 - p))`` per decode iteration, carrying ``arriving``
    chunks between them, ``arriving / runs`` each, and ``T = t_decode + runs x t_prefill``. The
    more runs, the fewer chunks each and the longer the cycle, so the fewer follow: the one
    consistent count is bisected. ``prefill_s(chunks)`` is a prefill iteration's time. How many
    follow one block varies (none, or one plus a geometric number), and its variance per decode
    iteration sets how unevenly the stalls fall on calls (:func:`apmw.capacity.evaluate.per_call_tpot_p95_s`).
    The simulator runs the same scheduler (:mod:`apmw.sim.engine`).
    """
    r_iters = float(recv_interval)
    arriving = np.asarray(arriving, dtype=float)

    def odds(runs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """At ``runs`` prefill iterations per decode iteration: the chance that a block of decode iterations
        is followed by one, and the mean length of a series of them, ``1 / (1 - p)``."""
        t_pre = prefill_s(arriving / runs)
        rate = arriving / (t_decode + runs * t_pre)
        return -np.expm1(-rate * r_iters * t_decode), np.exp(np.minimum(rate * t_pre, 700.0))

    def runs_after(runs: np.ndarray) -> np.ndarray:
        """The prefill iterations per decode iteration that ``runs`` of them would bring about."""
        first, series = odds(runs)
        return first * series / r_iters

    # more runs carry fewer chunks each and lengthen the cycle, so fewer follow: one root, bisected
    lo, hi = arriving / max_chunks, arriving.copy()
    for _ in range(RUN_BISECTIONS):
        mid = 0.5 * (lo + hi)
        fewer = runs_after(mid) < mid
        hi, lo = np.where(fewer, mid, hi), np.where(fewer, lo, mid)
    runs = 0.5 * (lo + hi)
    # a block's count is 0, or 1 plus a geometric number: mean first x series, second moment
    # first x (2 series - 1) x series
    first, series = odds(runs)
    variance = (first * (2.0 * series - 1.0) * series - (first * series) ** 2) / r_iters
    return runs, np.clip(arriving / runs, 1.0, max_chunks), np.maximum(variance, 0.0)
