"""The closed loop at a fixed number of agents ``N`` (MODEL.md section 4).

Each agent alternates between the engine and its tools. We model the replica as
a closed queueing network of two stations:

* a delay station (tools): each call is followed, on average, by ``Z`` seconds
  of tool wait (and KV reload, under ``offload``);
* a load-dependent station (the engine): with ``j`` calls present, ``b(j) =
  min(j, max_batch)`` of them run in every iteration and the engine completes
  calls at rate ``mu(j) = b / (iterations_per_call * t_iter(b))``.

For such a network the stationary distribution of ``j`` has product form
(BCMP; Lazowska et al., "Quantitative System Performance", ch. 8):

    p(j | N)  proportional to  Z^(N-j) / (N-j)!  *  prod_{i<=j} 1 / mu(i)

which we evaluate in log space for all ``j`` at once -- O(N) per ``N``, no
recursion -- and read off throughput ``X = sum p(j) mu(j)``, calls at the engine
``L = sum j p(j)``, and the engine residence per call ``L / X`` (Little). The
iteration at batch ``b`` carries the pooled per-call mix: of the ``b`` running
calls, a share ``PF / (PF + D)`` are in their prefill iterations and the rest
decode, where ``PF`` and ``D`` are the mean prefill and decode iterations per call.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import gammaln
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


# Iterations carry at most this many prefilling calls in the mixture below; the
# binomial mass beyond it is folded into the last term.
MAX_PREFILLS_PER_ITERATION = 32


def engine_curve(step: StepModel, s: SessionSample, max_batch: int, decode_only: bool = False,
                 mixed: bool = True) -> EngineCurve:
    """Iteration times at each batch size ``b``.

    Of ``b`` running calls, each is in a prefill iteration with probability
    ``q = PF / (PF + D)``. Prefill chunks are big (hundreds to thousands of
    tokens) and rare, so iteration times are averaged over the binomial number
    of prefilling calls rather than computed at the average load: step time is
    not linear in tokens (MoE experts touched saturate; the roofline takes a max).
    A call sees two kinds of iteration: its own prefill iterations (itself plus
    ``Binom(b-1, q)`` other prefills) and its decode iterations (``Binom(b-1, q)``
    other prefills); their mix over a call's life averages to the engine's mean.

    ``mixed=False`` (prefill first, SGLang: :mod:`apmw.perf.scheduling`) prices the other kind
    of engine with the same mixture: see :func:`_prefill_first_curve`.
    """
    # decode_only: prefill runs on another instance (disaggregation), iterations only decode
    iters = max(s.call_decode_iters, 1e-9) if decode_only else s.call_prefill_iters + s.call_decode_iters
    q = 0.0 if decode_only else s.call_prefill_iters / iters
    chunk = s.call_prefill_tokens / s.call_prefill_iters       # tokens per prefill iteration of a call
    chunk_attn = s.call_prefill_attn_flops / s.call_prefill_iters
    b = np.arange(1, max_batch + 1, dtype=float)[:, None]
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


@dataclass(frozen=True)
class LoopState:
    """Mean values of the closed loop at ``agents`` agents."""

    agents: int
    call_throughput_per_s: float     # X, calls completed per second
    engine_residence_per_call_s: float
    iteration_s: float               # throughput-weighted mean iteration time
    prefill_iteration_s: float       # ... of a call's own prefill iterations
    decode_iteration_s: float        # ... of its decode iterations: time per output token
    queue_per_call_s: float          # waiting for a batch slot
    running_batch_mean: float        # b, sequences in an iteration
    decode_batch_mean: float         # time-averaged sequences decoding
    engine_utilisation: float        # P(engine has work)
    compute_share: float             # compute-bound share of busy time (power model)
    think_per_call_s: float          # Z
    batch_distribution: np.ndarray   # P(b = 0..max_batch)
    iteration_p95_s: float           # 95th percentile of the time per output token, token-weighted


def solve_at(curve: EngineCurve, think_per_call_s: float, agents: int) -> LoopState:
    n = agents
    max_batch = len(curve.batch)
    j = np.arange(n + 1)
    # log prod_{i<=j} 1/mu(i); beyond max_batch mu is flat at mu(max_batch)
    log_mu = np.log(curve.completion_rate)
    cum = np.concatenate(([0.0], np.cumsum(log_mu)))
    log_prod = np.where(j <= max_batch, cum[np.minimum(j, max_batch)],
                        cum[max_batch] + (j - max_batch) * log_mu[-1])
    if think_per_call_s > 0:
        log_w = (n - j) * np.log(think_per_call_s) - gammaln(n - j + 1) - log_prod
    else:                                           # no think time: every agent is at the engine
        log_w = np.where(j == n, 0.0, -np.inf)
    p = np.exp(log_w - log_w.max())
    p /= p.sum()
    b_of_j = np.minimum(j, max_batch)
    mu_of_j = np.where(j > 0, curve.completion_rate[np.maximum(b_of_j, 1) - 1], 0.0)
    t_of_j = curve.iteration_s[np.maximum(b_of_j, 1) - 1]
    x = float((p * mu_of_j).sum())
    engine_calls = float((p * j).sum())
    residence = engine_calls / x
    idx = np.maximum(b_of_j, 1) - 1
    flow = p * mu_of_j / x                          # share of completed calls seen in each state
    t_bar = float((flow * t_of_j).sum())
    service = curve.iterations_per_call * t_bar
    batch_dist = np.bincount(b_of_j, weights=p, minlength=max_batch + 1)
    token_weight = batch_dist[1:] * curve.batch      # tokens come out in proportion to the batch
    cdf = np.cumsum(token_weight) / token_weight.sum()
    iteration_p95 = float(curve.decode_iteration_s[min(int(np.searchsorted(cdf, 0.95)), max_batch - 1)])
    return LoopState(
        agents=n,
        call_throughput_per_s=x,
        engine_residence_per_call_s=residence,
        iteration_s=t_bar,
        prefill_iteration_s=float((flow * curve.prefill_iteration_s[idx]).sum()),
        decode_iteration_s=float((flow * curve.decode_iteration_s[idx]).sum()),
        queue_per_call_s=max(residence - service, 0.0),
        running_batch_mean=float((p * b_of_j).sum()),
        decode_batch_mean=float((p[1:] * curve.decoding[idx[1:]]).sum()),
        engine_utilisation=float(1.0 - p[0]),
        compute_share=float((p[1:] * curve.iteration_s[idx[1:]] * curve.compute_share[idx[1:]]).sum()
                            / max((p[1:] * curve.iteration_s[idx[1:]]).sum(), 1e-300)),
        think_per_call_s=think_per_call_s,
        batch_distribution=batch_dist,
        iteration_p95_s=iteration_p95,
    )
