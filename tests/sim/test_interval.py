"""The interval a simulation puts around its task p95 (apmw.sim.result.quantile_interval)."""

from __future__ import annotations

import math

import numpy as np

from apmw.sim.result import quantile_interval


def test_the_p95_interval_covers_the_true_p95_as_often_as_it_claims():
    rng = np.random.default_rng(7)
    true_p95 = -math.log(0.05)                      # of an exponential with mean 1
    trials, covered, widths = 2000, 0, []
    for _ in range(trials):
        lo, hi = quantile_interval(rng.exponential(1.0, 300))
        covered += lo <= true_p95 <= hi
        widths.append(hi - lo)
    assert 0.93 <= covered / trials <= 0.98
    # more tasks, a tighter interval
    lo, hi = quantile_interval(rng.exponential(1.0, 30000))
    assert hi - lo < 0.1 * np.mean(widths)


def test_too_few_tasks_give_no_interval():
    assert quantile_interval([]) is None
    assert quantile_interval([1.0, 2.0, 3.0]) is None     # 3 tasks cannot bracket a p95
    assert quantile_interval(list(range(200))) is not None
