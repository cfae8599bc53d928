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
engine station's rates come from :mod:`apmw.capacity.engine_curve`.

Past the batch limit the weights are a Poisson law's: with ``k = N - j`` agents at
their tools and ``mu`` flat, ``p`` goes as ``(Z mu)^k / k!``, which falls by ``e^-60``
within about 11 standard deviations of its mode. Above ``SPARSE_AGENTS`` the loop
evaluates only the states up to the batch limit and those of that tail within
``e^-60`` of the largest weight (:func:`states`), which leaves out under 1e-20 of the
total: a loop of a million agents costs what one of tens of thousands does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import gammaln

from apmw.capacity.engine_curve import EngineCurve

# Above this many agents only the states with weight are evaluated (module docstring); at or below it every one,
# which keeps the sums' order, and so every answer, what it was for the loops plans mostly solve.
SPARSE_AGENTS = 65_536
# How far below the largest log weight a state is left out: e^-60 is 9e-27, so even a million such states together
# weigh under 1e-20 of the total, far below the 1e-16 a float resolves.
NEGLIGIBLE_LOG_WEIGHT = 60.0


@dataclass(frozen=True)
class LoopState:
    """Mean values of the closed loop at ``agents`` agents."""

    agents: int
    call_throughput_per_s: float     # X, calls completed per second
    engine_residence_per_call_s: float
    iteration_s: float               # throughput-weighted mean iteration time
    prefill_iteration_s: float       # ... of a call's own prefill iterations
    full_chunk_iteration_s: float    # ... of one with its own full chunk on its attention-DP rank (EngineCurve)
    decode_iteration_s: float        # ... of its decode iterations: time per output token
    queue_per_call_s: float          # waiting for a batch slot
    running_batch_mean: float        # b, sequences in an iteration
    decode_batch_mean: float         # time-averaged sequences decoding
    engine_utilisation: float        # P(engine has work)
    compute_share: float             # compute-bound share of busy time (power model)
    think_per_call_s: float          # Z
    batch_distribution: np.ndarray   # P(b = 0..min(agents, rows of the curve))
    batch_full_share: float          # P(b = max_batch): calls wait for a slot
    iteration_p95_s: float           # 95th percentile of the time per output token, token-weighted
    stall_variance_s2: float         # variance of a decode iteration's time with the prompts it meets
    decode_alone_iteration_s: float  # ... of a decode iteration without the other calls' prompt chunks (EngineCurve)


def solve_at(curve: EngineCurve, think_per_call_s: float, agents: int) -> LoopState:
    """The loop at ``agents``. With ``j`` calls at the engine ``min(j, max_batch)`` run, so a curve whose rows stop
    short of its batch limit (:attr:`EngineCurve.batch_limit`) serves any ``agents`` up to its rows."""
    n = agents
    max_batch = len(curve.batch)
    if n > max_batch and max_batch < curve.batch_limit:
        raise ValueError(f"the engine curve has {max_batch} rows of its {curve.batch_limit}; {n} agents need {n}")
    # log prod_{i<=j} 1/mu(i); beyond max_batch mu is flat at mu(max_batch)
    log_mu = np.log(curve.completion_rate)
    cum = np.concatenate(([0.0], np.cumsum(log_mu)))
    j = states(cum, think_per_call_s, n)
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
    # P(b = 0..min(n, rows)): the rows past n agents never run, so nothing here reads them (a curve built further
    # for another agent count gives the same state, to the bit)
    batch_dist = np.bincount(b_of_j, weights=p)
    token_weight = batch_dist[1:] * curve.batch[:len(batch_dist) - 1]   # tokens come out in proportion to the batch
    cdf = np.cumsum(token_weight) / token_weight.sum()
    iteration_p95 = float(curve.decode_iteration_s[min(int(np.searchsorted(cdf, 0.95)), len(cdf) - 1)])
    return LoopState(
        agents=n,
        call_throughput_per_s=x,
        engine_residence_per_call_s=residence,
        iteration_s=t_bar,
        prefill_iteration_s=float((flow * curve.prefill_iteration_s[idx]).sum()),
        full_chunk_iteration_s=float((flow * curve.full_chunk_iteration_s[idx]).sum()),
        decode_iteration_s=float((flow * curve.decode_iteration_s[idx]).sum()),
        queue_per_call_s=max(residence - service, 0.0),
        running_batch_mean=float((p * b_of_j).sum()),
        decode_batch_mean=float((p[1:] * curve.decoding[idx[1:]]).sum()),
        engine_utilisation=float(1.0 - p[0]),
        compute_share=float((p[1:] * curve.iteration_s[idx[1:]] * curve.compute_share[idx[1:]]).sum()
                            / max((p[1:] * curve.iteration_s[idx[1:]]).sum(), 1e-300)),
        think_per_call_s=think_per_call_s,
        batch_distribution=batch_dist,
        batch_full_share=float(batch_dist[-1]) if n >= max_batch == curve.batch_limit else 0.0,
        iteration_p95_s=iteration_p95,
        stall_variance_s2=float((flow * curve.stall_variance_s2[idx]).sum()),
        decode_alone_iteration_s=float((flow * (curve.decode_iteration_s if curve.decode_alone_iteration_s is None
                                                else curve.decode_alone_iteration_s)[idx]).sum()),
    )


def states(cum_log_mu: np.ndarray, think_per_call_s: float, agents: int) -> np.ndarray:
    """The numbers of calls at the engine, ``j``, whose weight :func:`solve_at` sums: all of ``0..agents``, or above
    ``SPARSE_AGENTS`` (with think time and states past the batch limit) those up to the limit and the stretch of
    the tail within ``NEGLIGIBLE_LOG_WEIGHT`` of the largest weight. ``cum_log_mu`` is ``0`` and the cumulative sum of the
    log completion rates, one per batch size up to the limit."""
    n, max_batch = agents, len(cum_log_mu) - 1
    if n <= SPARSE_AGENTS or think_per_call_s <= 0 or n <= max_batch + 1:
        return np.arange(n + 1)
    log_z, log_mu_flat = np.log(think_per_call_s), cum_log_mu[-1] - cum_log_mu[-2]
    head = np.arange(max_batch + 1)
    head_max = float(((n - head) * log_z - gammaln(n - head + 1) - cum_log_mu).max())

    def tail(k: int) -> float:          # the log weight of j = n - k > max_batch: k agents at their tools
        return float(k * log_z - gammaln(k + 1) - cum_log_mu[-1] - (n - k - max_batch) * log_mu_flat)

    last = n - max_batch - 1            # the most agents at their tools with the engine past its limit
    mode = int(min(max(np.floor(think_per_call_s * np.exp(log_mu_flat)), 0), last))   # the Poisson mode, Z mu
    floor = max(head_max, tail(mode)) - NEGLIGIBLE_LOG_WEIGHT
    if tail(mode) < floor:
        return head
    lo, hi = _crossing(tail, floor, 0, mode), _crossing(tail, floor, last, mode)
    return np.concatenate((head, np.arange(n - hi, n - lo + 1)))


def _crossing(f, floor: float, end: int, mode: int) -> int:
    """The k nearest ``end`` with ``f(k) >= floor``, given ``f(mode) >= floor`` and ``f`` rising from ``end`` to
    ``mode`` (a log Poisson weight: concave)."""
    if f(end) >= floor:
        return end
    out, inside = end, mode             # f(out) < floor <= f(inside)
    while abs(inside - out) > 1:
        mid = (out + inside) // 2
        out, inside = (out, mid) if f(mid) >= floor else (mid, inside)
    return inside
