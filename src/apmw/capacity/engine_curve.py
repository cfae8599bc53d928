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
from apmw.perf.parallelism import at_busiest_rank, busiest_rank_share, busiest_rank_spread


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
    full_chunk_iteration_s: np.ndarray  # under attention DP, the iteration a call's own full chunk (a rank's token
    #                                budget) runs in, on a rank of its own beside the others' drawn chunks; without
    #                                it, prefill_iteration_s (a call's own chunk is priced on the line through the mean)
    limit: int | None = None     # the batch limit where the rows stop short of it (None: at the last row)
    # the decode iteration without the other calls' prompt chunks (its decoders alone): what a call's own prefill
    # iterations are priced on, the others' prompts being the prefill queue's (evaluate.py); None where the curve
    # does not price it apart (then the decode iteration)
    decode_alone_iteration_s: np.ndarray | None = None

    @property
    def batch_limit(self) -> int:
        """The engine's batch limit: the last row's batch size unless the rows stop short of it (built only as far
        as the loop reads them, :func:`engine_curve_rows`)."""
        return len(self.batch) if self.limit is None else self.limit

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
# Batch sizes built at once: bounds the memory a curve's build takes (a batch limit of 65,536 took 2 GB at once).
CURVE_BLOCK_ROWS = 2048
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
    curve = built
    while curve is None or len(curve.batch) < max_batch:      # in blocks: a row's arrays are 34 x 7 wide
        first = 1 if curve is None else len(curve.batch) + 1
        block = build_engine_curve(step, s, min(max_batch, first + CURVE_BLOCK_ROWS - 1), decode_only, mixed,
                                   first=first, recv_interval=recv_interval, token_budget=token_budget)
        curve = block if curve is None else curve.then(block)
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
    of prefilling calls, and over their sizes drawn (:func:`chunks_on_ranks`),
    rather than computed at the average load: step time is not linear in tokens
    (MoE experts touched saturate; the roofline takes a max).
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
    ranked = chunks_on_ranks(step, s) if (mixed and not decode_only) or step.parallel.dp > 1 else None

    def mean_time(decode: np.ndarray, drawn: np.ndarray, own: float = 0.0,
                  own_rank: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Binomially weighted iteration time of ``decode`` decoders, ``drawn`` chunks (:func:`chunks_on_ranks`)
        and ``own`` chunks of the mean size (on a rank of their own with ``own_rank``), the iterations'
        time-weighted compute-bound share (drives power), and the time's variance."""
        prefills = drawn + own
        load = IterationLoad(
            decode_seqs=decode * verify,
            prefill_tokens=prefills * chunk,
            kv_read_bytes=decode * s.call_decode_kv_bytes + prefills * s.call_prefill_kv_bytes,
            attention_flops=decode * verify * s.call_decode_attn_flops + prefills * chunk_attn,
        )
        w = weight
        if ranked is not None:     # over the drawn chunks (and their placements on attention-DP ranks)
            load = prompts_on_their_ranks(step, load, drawn, own, ranked, s, own_rank)
            w = weight[:, :, None] * ranked.weight
        t, compute_share = step.time_and_compute_share(load)
        t = t * (1.0 + s.draft_cost_fraction) * np.ones_like(w)
        rows = tuple(range(1, w.ndim))
        share = (compute_share * t * w).sum(axis=rows) / (t * w).sum(axis=rows)
        mean = (t * w).sum(axis=rows)
        return mean, share, np.maximum((t * t * w).sum(axis=rows) - mean * mean, 0.0)

    if not mixed and not decode_only:
        alone = _prefill_alone(step, s, chunk, chunk_attn)
        max_chunks = min(float(alone.chunks[-1]), max(token_budget / chunk, 1.0)) if token_budget else float(alone.chunks[-1])
        return _prefill_first_curve(s, b[:, 0], iters, others, weight, mean_time, alone, recv_interval, max_chunks)
    # A call's own chunk: without attention DP at the mean size, so that its TTFT's line through it (evaluate.py)
    # prices a long prompt's tokens at their full cost (drawn, small chunks ride free beside the decoders and
    # the line lies too low for long prompts: support-chat's TTFT p95 4.65 s against 4.95, and 4.7-5.3 s in
    # the simulator, at 20 agents). Under attention DP it is one more chunk on a rank drawn with the others:
    # the ranks' prompts run side by side, as the prefill queue serves them.
    # Under DP a long prompt's iterations carry a full chunk (its rank's budget) on its rank: where that rank's
    # attention outweighs the others' it paces the iteration, which the line through the mean chunk misses.
    if step.parallel.dp > 1:
        t_prefill, share_prefill, _ = mean_time(b - others - 1, others + 1)
        full = (token_budget // step.parallel.dp if token_budget else chunk) / chunk
        t_full = mean_time(b - others - 1, others, own=full, own_rank=True)[0] if full > 1 else t_prefill
    else:
        t_prefill, share_prefill, _ = mean_time(b - others - 1, others, own=1.0)
        t_full = t_prefill
    t_decode, share_decode, decode_variance = mean_time(b - others, others)
    # the same decoders without the other prompts' chunks: a call's own prefill rides on this (evaluate.py). It
    # depends on the number of decoders alone, so each count is priced once and read at every (b, others)
    t_alone = None
    if step.parallel.dp == 1:
        decoders = (b - others).astype(np.int64)
        d = np.arange(int(decoders.max()) + 1, dtype=float)
        load = IterationLoad(decode_seqs=d * verify, prefill_tokens=np.zeros_like(d),
                             kv_read_bytes=d * s.call_decode_kv_bytes,
                             attention_flops=d * verify * s.call_decode_attn_flops)
        by_decoders = step.time_and_compute_share(load)[0] * (1.0 + s.draft_cost_fraction)
        t_alone = (weight * by_decoders[decoders]).sum(axis=1)
    t = q * t_prefill + (1 - q) * t_decode
    share = (q * t_prefill * share_prefill + (1 - q) * t_decode * share_decode) / t
    b = b[:, 0]
    # time-weighted decoding sequences: prefill iterations are longer and carry one decoder fewer
    decoding = (q * t_prefill * (b - 1) * (1 - q) + (1 - q) * t_decode * (1 + (b - 1) * (1 - q))) / t
    return EngineCurve(batch=b, iteration_s=t, prefill_iteration_s=t_prefill, decode_iteration_s=t_decode,
                       completion_rate=b / (iters * t), decode_share=s.call_decode_iters / iters,
                       iterations_per_call=iters, compute_share=share, decoding=decoding,
                       stall_variance_s2=decode_variance, full_chunk_iteration_s=t_full,
                       decode_alone_iteration_s=t_alone)


def prompts_on_their_ranks(step: StepModel, load: IterationLoad, drawn: np.ndarray, own: float,
                           ranked: "ChunksOnRanks", s: SessionSample, own_rank: bool = False) -> IterationLoad:
    """``load`` with its ``drawn`` chunks as drawn (their tokens, and on their ranks) and ``own`` chunks of the
    mean size (a call's own, in its prefill iterations) along a new last axis of :class:`ChunksOnRanks`'s
    strata, each decoder and prompt on an attention data-parallel rank of its own (one rank without DP).
    The own chunks are on the busiest rank, or with ``own_rank`` on a rank of their own (with its decoders),
    which is the busiest where they outweigh the drawn chunks there.

    Each rank computes attention for its own sequences only, and every rank waits for the slowest in the
    MoE layers. The step model prices the busiest rank as an even split of the decoding sequences would
    make it (:func:`apmw.perf.parallelism.busiest_rank_share`); the load returned is scaled so that its
    share gives the real busiest rank (:func:`apmw.perf.parallelism.at_busiest_rank`):

    * its decoders' KV and attention lie above an even split by the spread of their contexts
      (:func:`apmw.perf.parallelism.busiest_rank_spread`);
    * a prompt chunk is one sequence: its attention, hundreds of times a decoder's, lands on one rank, and
      chunks differ by orders of magnitude (a short follow-up or a long prompt). The busiest rank carries
      its decoders plus the chunks that landed on it, drawn (:func:`chunks_on_ranks`).

    The simulator places the sequences and prices each rank's own load
    (``apmw.sim.engine.Engine._busiest_rank_loads``); docs/simulate.md compares the two.
    """
    lay = step.parallel
    seqs = np.asarray(load.decode_seqs, dtype=np.float64)
    count = np.asarray(drawn).astype(int)
    prefills = drawn + own
    even = busiest_rank_share(lay, seqs) / lay.dp

    def busiest(total, per_chunk: float, cv: float, chunks: np.ndarray) -> np.ndarray:
        decoders = np.asarray(total, dtype=np.float64) - prefills * per_chunk
        ranks_decoders = (decoders * even * busiest_rank_spread(lay, seqs, cv))[..., None]
        if own_rank:
            rank = ranks_decoders + np.maximum(chunks[count], own * per_chunk)
        else:
            rank = ranks_decoders + chunks[count] + own * per_chunk
        return at_busiest_rank(lay, seqs[..., None], rank)

    tokens = ranked.tokens[count] + own * s.call_prefill_tokens / s.call_prefill_iters
    return IterationLoad(seqs[..., None], tokens,
                         busiest(load.kv_read_bytes, s.call_prefill_kv_bytes, s.decode_kv_bytes_cv,
                                 ranked.kv_read_bytes),
                         busiest(load.attention_flops, s.call_prefill_attn_flops / s.call_prefill_iters,
                                 s.decode_attn_flops_cv, ranked.attention_flops))


# Draws of 1..33 prompt chunks (and their ranks), from this seed (the same at every call: a curve is
# deterministic), and the strata they are priced at (bounds as cumulative probabilities of the work the chunks
# put on the busiest GPU): finer in the tail, where one long prompt sets the iteration's pace.
RANK_DRAWS = 4096
RANK_SEED = 20261204
RANK_STRATA = (0.0, 0.25, 0.5, 0.75, 0.9, 0.97, 0.995, 1.0)


@dataclass(frozen=True)
class ChunksOnRanks:
    """The prompt chunks of an iteration that carries ``k`` = 0..33 of them (rows), at each stratum (columns)
    of the draws (:func:`chunks_on_ranks`): all their tokens, the attention FLOPs and the cached KV they read
    on the busiest attention-DP rank (all of them without attention DP), and each stratum's probability."""

    attention_flops: np.ndarray
    kv_read_bytes: np.ndarray
    weight: np.ndarray
    tokens: np.ndarray


# Draws recently made, by the sample's arrays they read (_drawn_from), its per-call means, the ranks and the
# model's active parameters (what they depend on); read only while those arrays live (as _CURVES). An entry is a
# few kB.
_DRAWN: OrderedDict[tuple, tuple[tuple[weakref.ref, ...], ChunksOnRanks]] = OrderedDict()


def chunks_on_ranks(step: StepModel, s: SessionSample) -> ChunksOnRanks:
    """Draws of ``k`` prompt chunks, each on an attention-DP rank drawn at random (an agent's calls go to its
    own rank, and any agents' prompts may meet in one iteration), and what they put on the busiest rank.

    A chunk is one prefill iteration of a sampled call (calls drawn by their prefill iterations): its share
    of the call's tokens, of its attention FLOPs (its new tokens x the context they attend) and the context
    it reads. All three vary by orders of magnitude between calls (a short follow-up or a long prompt), and
    an iteration's time is a max of its compute and its memory reads, so chunks of the mean size price it
    too low (docs/simulate.md). For each ``k``, the draws are ordered by the FLOPs they put on the busiest
    GPU (the tokens' weights over every GPU, the busiest rank's attention over its own) and averaged within
    RANK_STRATA. The tokens and attention are scaled so that a chunk's mean is the sample's per-iteration
    mean (as :func:`_prefill_alone`'s)."""
    ranks = step.parallel.dp
    arrays = _drawn_from(s)
    key = (*map(id, arrays), s.call_prefill_tokens, s.call_prefill_iters, s.call_prefill_attn_flops,
           s.call_prefill_kv_bytes, ranks, step.arch.active_params)
    entry = _DRAWN.get(key)
    if entry is not None and all(ref() is a for ref, a in zip(entry[0], arrays)):
        _DRAWN.move_to_end(key)
        return entry[1]
    drawn = _draw_chunks(s, ranks, 2.0 * step.arch.active_params)
    _DRAWN[key] = (tuple(weakref.ref(a) for a in arrays), drawn)
    while len(_DRAWN) > CURVE_CACHE_ENTRIES:
        _DRAWN.popitem(last=False)
    return drawn


def _drawn_from(s: SessionSample) -> tuple[np.ndarray, ...]:
    """The sample's arrays the draws read: the copies of a sample priced on each replica share them
    (:func:`apmw.capacity.prefill_queue.priced_on`), so every replica of a search that serves one sample shares
    its draws."""
    return (s.call_prefill_iters_sample, s.call_prefill_tokens_sample, s.call_prefill_attn_flops_sample,
            s.call_prefill_kv_bytes_sample)


def _draw_chunks(s: SessionSample, ranks: int, flops_per_token: float) -> ChunksOnRanks:
    """:func:`chunks_on_ranks`'s draws on ``ranks`` ranks of a model of ``flops_per_token``."""
    k = MAX_PREFILLS_PER_ITERATION + 1
    chunk = s.call_prefill_tokens / s.call_prefill_iters
    chunk_attn = s.call_prefill_attn_flops / s.call_prefill_iters
    iters = np.maximum(s.call_prefill_iters_sample, 1.0)
    tok, attn = s.call_prefill_tokens_sample / iters, s.call_prefill_attn_flops_sample / iters
    kv = s.call_prefill_kv_bytes_sample
    rng = np.random.default_rng(RANK_SEED)
    if len(iters) and tok.sum() > 0:
        pick = weighted_choice(rng, iters / iters.sum(), (k, RANK_DRAWS))
        tok, kv = tok[pick] * (chunk * iters.sum() / s.call_prefill_tokens_sample.sum()), kv[pick]
        attn = attn[pick] * (chunk_attn * iters.sum() / max(s.call_prefill_attn_flops_sample.sum(), 1e-300))
    else:
        tok = np.full((k, RANK_DRAWS), chunk)
        attn, kv = np.full((k, RANK_DRAWS), chunk_attn), np.full((k, RANK_DRAWS), s.call_prefill_kv_bytes)
    tokens = np.vstack((np.zeros((1, RANK_DRAWS)), np.cumsum(tok, axis=0)))     # row i: the first i chunks
    busiest = np.zeros((2, k + 1, RANK_DRAWS))
    if ranks == 1:
        busiest[0, 1:], busiest[1, 1:] = np.cumsum(attn, axis=0), np.cumsum(kv, axis=0)
    else:
        rank = rng.integers(0, ranks, size=(k, RANK_DRAWS))
        draw = np.arange(RANK_DRAWS)
        on_rank = np.zeros((2, RANK_DRAWS, ranks))
        for i in range(k):
            on_rank[0, draw, rank[i]] += attn[i]
            on_rank[1, draw, rank[i]] += kv[i]
            busiest[:, i + 1] = np.maximum(busiest[:, i], on_rank[:, draw, rank[i]])
    # the busiest GPU's FLOPs, times the replica's GPUs (the same order)
    order = np.argsort(tokens * flops_per_token + busiest[0] * ranks, axis=1, kind="stable")
    edges = np.round(np.asarray(RANK_STRATA) * RANK_DRAWS).astype(int)
    size = np.diff(edges)

    def strata(values: np.ndarray) -> np.ndarray:
        return np.add.reduceat(np.take_along_axis(values, order, axis=1), edges[:-1], axis=1) / size

    return ChunksOnRanks(strata(busiest[0]), strata(busiest[1]), size / RANK_DRAWS, strata(tokens))


def weighted_choice(rng: np.random.Generator, p: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``rng.choice(len(p), size=shape, p=p)``, the same indices from the same stream (numpy's own steps: the
    normalised cumulative weights searched at ``rng.random(shape)``), with the uniforms searched in sorted
    order: a search's memory reads then run forwards, about three times faster on 135,000 draws of 20,000
    calls (``tests/capacity/test_engine_curve_draws.py`` compares the two)."""
    cdf = p.cumsum()
    cdf /= cdf[-1]
    u = rng.random(shape).ravel()
    order = np.argsort(u)
    picked = np.empty(len(u), dtype=np.int64)
    picked[order] = cdf.searchsorted(u[order], side="right")
    return picked.reshape(shape)


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
                       decoding=d * t_dec / cycle_s, stall_variance_s2=runs_variance * t_pre ** 2 + decode_variance,
                       full_chunk_iteration_s=t_own)


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
