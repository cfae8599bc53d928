"""KV overflow under ``retain``: how often the agents' contexts outgrow the pool, and which tasks pay.

Under ``retain`` each agent's context stays pinned through its tool wait while memory allows
(:mod:`apmw.sim.kv_ledger`). The agents' KV demand ``D`` (the contexts they would hold if every one
fitted) is a sum of independent agents, so the memory check reads it as normal, with the mean and
95th percentile of :mod:`apmw.capacity.evaluate`. While ``D`` exceeds the pool ``C`` the engine
spills pins and preempts calls, and each of those calls prefills its whole prompt again:

1. **How often.** The share of calls that lose their context is ``P(D > C)``
   (:func:`overflow_share`).
2. **Which tasks.** Overflow comes in episodes as long as the demand stays high, so one task may
   run through several and another through none. A task of duration ``T`` spends a share
   ``f = (1/T) * integral of 1[D(t) > C] dt`` of its time above the pool; ``E[f] = P(D > C)`` and

       Var(f | T) = (2 / T^2) * integral_0^T (T - u) Cov(1[D(t) > C], 1[D(t + u) > C]) du,

   where, for a normal ``D`` whose autocorrelation at lag ``u`` is ``rho(u)``, the covariance of
   the two indicators follows from Plackett's identity (the derivative of the bivariate normal
   orthant probability in ``rho`` is its density):

       Cov(u) = (1 / 2 pi) * integral_0^{asin rho(u)} exp(-z^2 / (1 + sin theta)) d theta,
       z = (C - E[D]) / sd(D).

   ``rho(u)`` is one agent's: the agents are independent and alike, so the sum has the
   autocorrelation of each. It is computed from the sampled sessions laid end to end as one
   agent's timeline (:func:`demand_autocorrelation`), each call holding its context for its time
   in the engine and its tool wait at the solved timings.
3. **What they pay.** Each task's share is drawn from the beta distribution with that mean and
   variance (a seeded uniform per session, so the answer is smooth in N), and its extra time over
   the no-overflow loop scales with it: ``R_s = R0_s + (f_s / m) * (Rm_s - R0_s)``, where ``R0``
   and ``Rm`` are its latency with no overflow and with every task at the mean share ``m``. The
   mean task time stays the blended loop's; the tail is the tasks that ran through the episodes.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.fft import irfft, next_fast_len, rfft
from scipy.special import betaincinv

from apmw.spec.distribution import Z95

# Grid of the agent timeline: this many points per mean task time (the autocorrelation's scale).
POINTS_PER_TASK = 32
# ... read over at most this many points (about 500 mean tasks: the autocorrelation at lags up to the
# longest task is averaged over some 10,000 points, and the FFT stays near a millisecond).
MAX_TIMELINE_POINTS = 1 << 14
# Quadrature points for Plackett's integral over theta.
THETA_POINTS = 48
# Below this overflow share the tail is left as the blended loop's (one call in a thousand losing
# its context moves no task's latency measurably).
MIN_SHARE = 1e-3


def overflow_share(kv_mean_bytes: float, kv_p95_bytes: float, kv_capacity_bytes: float) -> float:
    """Share of the time the agents' KV demand exceeds the pool: the normal tail above capacity of
    the demand whose mean and 95th percentile the memory check reads."""
    sd = (kv_p95_bytes - kv_mean_bytes) / Z95
    if sd <= 0:
        return float(kv_mean_bytes > kv_capacity_bytes)
    return 0.5 * math.erfc((kv_capacity_bytes - kv_mean_bytes) / (sd * math.sqrt(2.0)))


def demand_autocorrelation(call_kv_bytes: np.ndarray, call_hold_s: np.ndarray, max_lag_s: float,
                           dt_s: float) -> np.ndarray:
    """Autocorrelation of one agent's held KV at lags ``0, dt, 2 dt, ...`` up to ``max_lag_s``.

    The calls, in session order, are laid end to end as one agent's timeline: call ``i`` holds
    ``call_kv_bytes[i]`` for ``call_hold_s[i]`` seconds. The timeline is read on a grid of
    ``dt_s`` (its first ``MAX_TIMELINE_POINTS`` points) and its autocovariance taken by FFT
    (zero-padded, so it is not circular).
    """
    edges = np.cumsum(call_hold_s)
    grid = np.arange(0.0, min(float(edges[-1]), MAX_TIMELINE_POINTS * dt_s), dt_s)
    level = call_kv_bytes[np.minimum(np.searchsorted(edges, grid, side="right"), len(edges) - 1)]
    x = level - level.mean()
    n = len(x)
    lags = min(int(max_lag_s / dt_s) + 1, n)
    size = next_fast_len(2 * n, real=True)
    spectrum = rfft(x, size)
    acov = irfft(spectrum * np.conj(spectrum), size)[:lags] / np.arange(n, n - lags, -1)
    return acov / acov[0] if acov[0] > 0 else np.zeros(lags)


def indicator_covariance(rho: np.ndarray, z: float) -> np.ndarray:
    """Cov(1[X > z], 1[Y > z]) for standard normal X, Y with correlation ``rho`` (Plackett)."""
    top = np.arcsin(np.clip(rho, -1.0, 1.0))
    theta = np.linspace(0.0, 1.0, THETA_POINTS)[None, :] * top[:, None]
    y = np.exp(-z * z / (1.0 + np.sin(theta)))
    trapezoid = (y.sum(axis=1) - 0.5 * (y[:, 0] + y[:, -1])) * top / (THETA_POINTS - 1)
    return trapezoid / (2 * math.pi)


def exposure_variance(durations_s: np.ndarray, cov: np.ndarray, dt_s: float) -> np.ndarray:
    """Var(f | T) for tasks of ``durations_s``, from the indicator covariance at lags ``k dt``
    (zero past the last lag)."""
    u = np.arange(len(cov)) * dt_s
    a = np.concatenate(([0.0], np.cumsum(cov) * dt_s))            # integral of Cov up to each lag
    b = np.concatenate(([0.0], np.cumsum(cov * u) * dt_s))        # integral of u Cov
    k = np.minimum(np.ceil(durations_s / dt_s).astype(np.int64), len(cov))
    t = np.maximum(durations_s, dt_s)
    return np.maximum(2.0 * (t * a[k] - b[k]) / (t * t), 0.0)


def exposure_shares(m: float, variance: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Each task's share of time above the pool: beta with mean ``m`` and the given variance, read
    at the session's fixed uniform draw."""
    v = np.clip(variance, 1e-12, 0.999 * m * (1.0 - m))
    k = m * (1.0 - m) / v - 1.0
    return betaincinv(m * k, (1.0 - m) * k, uniforms)


def spread_over_tasks(m: float, z: float, no_overflow_s: np.ndarray, at_mean_share_s: np.ndarray,
                      call_kv_bytes: np.ndarray, call_hold_s: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Task latencies with each task's own overflow share (module docstring, step 3)."""
    if m < MIN_SHARE or m >= 1.0 - MIN_SHARE:
        return at_mean_share_s
    dt = float(at_mean_share_s.mean()) / POINTS_PER_TASK
    rho = demand_autocorrelation(call_kv_bytes, call_hold_s, float(at_mean_share_s.max()), dt)
    cov = indicator_covariance(rho, z)
    f = exposure_shares(m, exposure_variance(at_mean_share_s, cov, dt), uniforms)
    return no_overflow_s + (f / m) * (at_mean_share_s - no_overflow_s)
