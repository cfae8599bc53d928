"""Quantiles of a sample, exactly as ``numpy.quantile`` (its default ``linear`` method) gives them, faster.

The planner reads every tail (task latency p50/p95/p99, TTFT p95) off tens of thousands of sampled
sessions or calls, at every agent count a search visits. ``numpy.quantile`` partitions the sample
around the two order statistics each quantile interpolates between in one multi-pivot call, which
costs about five times one single-pivot partition (numpy 2.x; ``bench/search_speed.py``). Here each
quantile partitions once, at its upper order statistic; the lower one is the largest value left
below it. The interpolation is numpy's own (``numpy.lib._function_base_impl._lerp``), so the
results are identical to the last bit (``tests/capacity/test_quantiles.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import Callable

import numpy as np


def quantile(values: np.ndarray, q: float) -> float:
    """The ``q`` quantile of ``values`` (non-empty, no NaN), as ``float(numpy.quantile(values, q))``."""
    n = len(values)
    lo, t = _order_statistic(n, q)
    if t == 0.0 or lo + 1 >= n:
        return float(np.partition(values, lo)[lo])
    parted = np.partition(values, lo + 1)
    below, above = float(parted[:lo + 1].max()), float(parted[lo + 1])
    return _lerp(below, above, t)


def quantile_at_most(values: np.ndarray, q: float, limit: float) -> bool:
    """Whether ``quantile(values, q) <= limit``, decided by counting the values at most ``limit`` (one pass, no
    partition); the two order statistics the quantile interpolates between are read only where the count
    falls between them. The same answer as computing the quantile, to the last bit: numpy's interpolation never
    leaves the interval between its two order statistics (``tests/capacity/test_quantiles.py``)."""
    n = len(values)
    if n == 0 or not (np.isfinite(limit) and np.isfinite(values).all()):
        return quantile(values, q) <= limit     # an empty sample, NaN or infinities: as the quantile reads them
    lo, t = _order_statistic(n, q)
    at_most = int(np.count_nonzero(values <= limit))
    if t == 0.0 or lo + 1 >= n:
        return at_most >= lo + 1                # the quantile is the order statistic lo itself
    if at_most != lo + 1:
        return at_most > lo + 1                 # both order statistics on the same side of the limit
    below = float(values[values <= limit].max())  # order statistic lo; lo + 1 is the smallest value above
    above = float(values[values > limit].min())
    return _lerp(below, above, t) <= limit


@dataclass(frozen=True, eq=False)
class Tail:
    """The ``q`` quantile of ``values`` as an SLO check reads it: ``tail <= limit`` is
    :func:`quantile_at_most` (a count), ``float(tail)`` the quantile itself. A search asks only the first at
    most agent counts it visits. ``values`` may be a function that draws them: a check of SLOs that do not
    read this tail never calls it."""

    values: np.ndarray | Callable[[], np.ndarray]
    q: float

    def _drawn(self) -> np.ndarray:
        return self.values() if callable(self.values) else self.values

    def __le__(self, limit: float) -> bool:
        return quantile_at_most(self._drawn(), self.q, limit)

    def __float__(self) -> float:
        return quantile(self._drawn(), self.q)


def quantiles(values: np.ndarray, qs: tuple[float, ...]) -> tuple[float, ...]:
    """Each of ``qs`` as :func:`quantile` gives it."""
    return tuple(quantile(values, q) for q in qs)


def _order_statistic(n: int, q: float) -> tuple[int, float]:
    """numpy's ``linear`` method: the ``q`` quantile of ``n`` values lies ``t`` of the way from order statistic
    ``lo`` to ``lo + 1``."""
    index = q * (n - 1)
    lo = int(np.floor(index))
    return lo, index - lo


def _lerp(a: float, b: float, t: float) -> float:
    """numpy's interpolation between neighbouring order statistics: from below for ``t < 0.5``, from
    above otherwise (so that the result is monotone in ``t`` and exact at both ends)."""
    diff = b - a
    return b - diff * (1.0 - t) if t >= 0.5 else a + diff * t
