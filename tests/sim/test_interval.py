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


def test_runs_that_disagree_widen_the_checked_p95_interval():
    """The checked N*'s p95 interval (sim/checked.py) is the hull of the pooled tasks' interval and
    the replication interval: three runs of 100 tasks whose p95s sit at about 1.0, 1.3 and 1.6 (one
    run's engine state shifts all its tasks) give a wider interval than their 300 tasks alone."""
    from types import SimpleNamespace

    import scipy.stats

    from apmw.sim.checked import SimulatedPoint

    rng = np.random.default_rng(7)
    runs = tuple(SimpleNamespace(samples={"task_latency_s": rng.exponential(1.0, 100) * scale / 3.0})
                 for scale in (1.0, 1.3, 1.6))
    point = SimulatedPoint(agents=10, runs=runs)
    pooled = quantile_interval(np.concatenate([r.samples["task_latency_s"] for r in runs]))
    lo, hi = point.p95_interval("task_latency_s")
    per_run = [np.quantile(r.samples["task_latency_s"], 0.95) for r in runs]
    half = scipy.stats.t.ppf(0.975, 2) * np.std(per_run, ddof=1) / math.sqrt(3)
    assert (hi - lo) > 1.5 * (pooled[1] - pooled[0])
    assert hi == max(pooled[1], point.p95("task_latency_s") + half)
    # the hull never narrows the pooled interval; one run alone gives the pooled interval
    same = tuple(SimpleNamespace(samples={"task_latency_s": rng.exponential(1.0, 2000)}) for _ in range(3))
    lo, hi = SimulatedPoint(agents=10, runs=same).p95_interval("task_latency_s")
    pooled = quantile_interval(np.concatenate([r.samples["task_latency_s"] for r in same]))
    assert lo <= pooled[0] and hi >= pooled[1]
    assert SimulatedPoint(agents=10, runs=same[:1]).p95_interval("task_latency_s") == quantile_interval(
        same[0].samples["task_latency_s"])


def test_runs_far_apart_never_give_a_negative_latency():
    """Three runs whose p95s are 1, 5 and 30 s: the pooled p95 less Student's t (4.3 at two degrees of
    freedom) times their standard error lies below zero, and a latency cannot; the interval starts at 0."""
    from types import SimpleNamespace

    from apmw.sim.checked import SimulatedPoint

    rng = np.random.default_rng(3)
    runs = tuple(SimpleNamespace(samples={"task_latency_s": rng.exponential(1.0, 100) * scale})
                 for scale in (0.33, 1.7, 10.0))
    point = SimulatedPoint(agents=10, runs=runs)
    per_run = [np.quantile(r.samples["task_latency_s"], 0.95) for r in runs]
    half = 4.30 * np.std(per_run, ddof=1) / math.sqrt(3)
    assert point.p95("task_latency_s") - half < 0
    lo, hi = point.p95_interval("task_latency_s")
    assert lo == 0.0 and hi > point.p95("task_latency_s")
