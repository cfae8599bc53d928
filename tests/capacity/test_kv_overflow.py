"""KV overflow under retain (capacity/kv_overflow.py): each step against a case worked by hand."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import multivariate_normal, norm

from apmw.capacity.kv_overflow import (demand_autocorrelation, exposure_shares, exposure_variance,
                                       indicator_covariance, spread_over_tasks)


@pytest.mark.parametrize("rho", [0.0, 0.3, 0.8, 0.95])
@pytest.mark.parametrize("z", [0.5, 1.3, 2.5])
def test_plackett_gives_the_bivariate_normal_orthant_covariance(rho, z):
    both_above = multivariate_normal([0.0, 0.0], [[1.0, rho], [rho, 1.0]]).cdf([-z, -z])
    exact = both_above - norm.sf(z) ** 2
    assert indicator_covariance(np.array([rho]), z)[0] == pytest.approx(exact, abs=1e-5)
    # at lag 0 the indicator's own variance, m (1 - m)
    m = norm.sf(z)
    assert indicator_covariance(np.array([1.0]), z)[0] == pytest.approx(m * (1 - m), rel=1e-3)


def test_levels_held_for_a_fixed_time_decorrelate_linearly_over_it():
    """Independent levels each held 100 s: the autocorrelation is the triangle 1 - u / 100."""
    rng = np.random.default_rng(3)
    levels = rng.normal(size=20_000)
    rho = demand_autocorrelation(levels, np.full(len(levels), 100.0), max_lag_s=150.0, dt_s=10.0)
    assert rho[0] == pytest.approx(1.0)
    for lag_s in (20, 50, 80):
        assert rho[lag_s // 10] == pytest.approx(1 - lag_s / 100, abs=0.03)
    assert abs(rho[12]) < 0.03         # past the hold time, nothing is shared


def test_a_task_inside_one_episode_has_all_or_none_of_it():
    m, dt = 0.05, 1.0
    perfectly = np.full(500, m * (1 - m))      # the indicator never changes over 500 s
    assert exposure_variance(np.array([100.0, 400.0]), perfectly, dt) == pytest.approx([m * (1 - m)] * 2, rel=2e-2)
    # with no correlation past one grid step, a long task averages many independent looks
    white = np.zeros(500)
    white[0] = m * (1 - m)
    v = exposure_variance(np.array([100.0, 400.0]), white, dt)
    assert v[0] == pytest.approx(2 * m * (1 - m) / 100, rel=0.05) and v[1] == pytest.approx(v[0] / 4, rel=0.05)


def test_exposure_shares_have_the_asked_mean_and_variance():
    u = (np.arange(20_000) + 0.5) / 20_000
    f = exposure_shares(0.04, np.full(len(u), 0.002), u)
    assert f.mean() == pytest.approx(0.04, rel=1e-3) and f.var() == pytest.approx(0.002, rel=1e-2)
    assert (f >= 0).all() and (f <= 1).all()


def test_spreading_keeps_the_mean_and_fattens_the_tail_where_episodes_are_long():
    rng = np.random.default_rng(0)
    none = rng.gamma(4.0, 150.0, 4000)             # task latencies with no overflow
    at_mean = none * 1.2                           # every task at the mean share
    u = rng.random(4000)
    calls = np.repeat(rng.normal(1.0, 0.2, 800), 5)
    slow = spread_over_tasks(0.05, 1.6, none, at_mean, calls, np.full(len(calls), 400.0), u)
    fast = spread_over_tasks(0.05, 1.6, none, at_mean, calls, np.full(len(calls), 1.0), u)
    assert slow.mean() == pytest.approx(at_mean.mean(), rel=0.03)
    assert fast.mean() == pytest.approx(at_mean.mean(), rel=0.03)
    p95 = lambda x: np.quantile(x, 0.95)  # noqa: E731
    assert p95(slow) > p95(fast) * 1.1           # long episodes: some tasks pay for all of one
    assert p95(fast) == pytest.approx(p95(at_mean), rel=0.05)   # short ones: every task pays the mean
    # no overflow to spread: the blended loop's latencies unchanged
    assert spread_over_tasks(0.0, 3.0, none, at_mean, calls, np.full(len(calls), 1.0), u) is at_mean


@pytest.mark.parametrize("example", ["coding-agent", "support-chat"])
def test_an_n_evaluated_alone_gets_what_a_search_got_for_it(example):
    """The share of lost contexts is a fixed point; where it starts may not depend on the N evaluated
    before, or ``plan --agents N`` would disagree with the search's figure at N (coding-agent spills
    retained contexts, support-chat frees them at tool waits)."""
    from apmw import load_spec
    from apmw.capacity.closed_loop import closed_loop_model
    from apmw.examples import bundled_examples
    from apmw.perf import replica_from_spec

    spec = load_spec(bundled_examples()[example])
    model = closed_loop_model(spec, replica_from_spec(spec))
    alone = model.evaluate(27)
    for n in (40, 3, 31, 12):
        model.evaluate(n)
    after = model.evaluate(27)
    assert after.task_latency_p95_s == alone.task_latency_p95_s
    assert after.prefill_tokens_per_session == alone.prefill_tokens_per_session
