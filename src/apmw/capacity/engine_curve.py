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
                 mixed: bool = True) -> EngineCurve:
    """:func:`build_engine_curve`, or the first ``max_batch`` rows of one built before for the same step model
    and sample at a larger batch limit (the same values: its rows are read-only)."""
    key = (id(step), id(s), decode_only, mixed)
    entry = _CURVES.get(key)
    built = entry[2] if entry is not None and entry[0]() is step and entry[1]() is s else None
    if built is not None and len(built.batch) >= max_batch:
        _CURVES.move_to_end(key)
        return built.up_to(max_batch)
    if built is None:
        curve = build_engine_curve(step, s, max_batch, decode_only, mixed)
    else:
        curve = built.then(build_engine_curve(step, s, max_batch, decode_only, mixed, first=len(built.batch) + 1))
    for rows in curve._rows().values():
        rows.flags.writeable = False
    _CURVES[key] = (weakref.ref(step), weakref.ref(s), curve)
    _CURVES.move_to_end(key)
    while len(_CURVES) > CURVE_CACHE_ENTRIES:
        _CURVES.popitem(last=False)
    return curve


def build_engine_curve(step: StepModel, s: SessionSample, max_batch: int, decode_only: bool = False,
                       mixed: bool = True, first: int = 1) -> EngineCurve:
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
    of engine with the same mixture: see :func:`_prefill_first_curve`.
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

    def mean_time(decode: np.ndarray, prefills: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Binomially weighted iteration time of ``decode`` decoders and ``prefills`` chunks,
        and the iterations' time-weighted compute-bound share (drives power)."""
        load = IterationLoad(
            decode_seqs=decode * verify,
            prefill_tokens=prefills * chunk,
            kv_read_bytes=decode * s.call_decode_kv_bytes + prefills * s.call_prefill_kv_bytes,
            attention_flops=decode * verify * s.call_decode_attn_flops + prefills * chunk_attn,
        )
        t = step.iteration_time_s(load) * (1.0 + s.draft_cost_fraction) * np.ones_like(weight)
        share = (step.compute_share(load) * t * weight).sum(axis=1) / (t * weight).sum(axis=1)
        return (t * weight).sum(axis=1), share

    if not mixed and not decode_only:
        return _prefill_first_curve(s, b[:, 0], iters, others, weight, mean_time)
    t_prefill, share_prefill = mean_time(b - others - 1, others + 1)
    t_decode, share_decode = mean_time(b - others, others)
    t = q * t_prefill + (1 - q) * t_decode
    share = (q * t_prefill * share_prefill + (1 - q) * t_decode * share_decode) / t
    b = b[:, 0]
    # time-weighted decoding sequences: prefill iterations are longer and carry one decoder fewer
    decoding = (q * t_prefill * (b - 1) * (1 - q) + (1 - q) * t_decode * (1 + (b - 1) * (1 - q))) / t
    return EngineCurve(batch=b, iteration_s=t, prefill_iteration_s=t_prefill, decode_iteration_s=t_decode,
                       completion_rate=b / (iters * t), decode_share=s.call_decode_iters / iters,
                       iterations_per_call=iters, compute_share=share, decoding=decoding)


def _prefill_first_curve(s: SessionSample, b: np.ndarray, iters: float, others: np.ndarray, weight: np.ndarray,
                         mean_time) -> EngineCurve:
    """The engine curve when prefill iterations run alone and first (SGLang).

    Of ``b`` running calls, ``K ~ Binom(b-1, q)`` others are prefilling, as in the mixed
    curve. A prefill iteration carries the call's chunk and those of the others
    (``m = 1 + E[K]`` chunks, no decoder); a decode iteration carries the ``d = b - E[K]``
    decoders and no chunk. Calls complete at ``mu = 1 / (PF t_p / m + D t_d / d)``: each
    pays its share of the prefill iterations and of the decode iterations that advance it.
    A call's residence at batch ``b`` is ``b / mu``; what its own prefill iterations do not
    take of it is its time per output token, stalls behind the others' prefills included.
    ``mean_time(decode, prefills)`` is :func:`engine_curve`'s weighted iteration time.
    """
    zero = np.zeros_like(others)
    t_pre, share_pre = mean_time(zero, others + 1)
    t_dec, share_dec = mean_time(b[:, None] - others, zero)
    expected_others = (others * weight).sum(axis=1)
    m, d = 1.0 + expected_others, b - expected_others
    pre_s = s.call_prefill_iters * t_pre / m          # engine time per completed call, prefilling
    dec_s = s.call_decode_iters * t_dec / d           # ... and decoding
    per_call_s = pre_s + dec_s
    residence = b * per_call_s
    per_token = (residence - s.call_prefill_iters * t_pre) / max(s.call_decode_iters, 1e-9)
    return EngineCurve(batch=b, iteration_s=residence / iters, prefill_iteration_s=t_pre,
                       decode_iteration_s=per_token, completion_rate=1.0 / per_call_s,
                       decode_share=s.call_decode_iters / iters, iterations_per_call=iters,
                       compute_share=(pre_s * share_pre + dec_s * share_dec) / per_call_s,
                       decoding=dec_s / per_call_s * d)
