"""apmw.capacity.quantiles gives numpy.quantile's default (linear) answer to the last bit."""

import numpy as np
import pytest

from apmw.capacity.quantiles import quantile, quantiles


@pytest.mark.parametrize("n", [1, 2, 3, 20, 1001, 40_000])
def test_equals_numpy_to_the_bit(n):
    rng = np.random.default_rng(n)
    for values in (rng.gamma(0.5, size=n) * 1e3, np.round(rng.exponential(5.0, n)), np.full(n, 7.25)):
        for q in (0.0, 0.123, 0.5, 0.95, 0.99, 1.0):
            assert quantile(values, q) == float(np.quantile(values, q))
        assert quantiles(values, (0.5, 0.95, 0.99)) == tuple(float(v) for v in np.quantile(values, [0.5, 0.95, 0.99]))


def test_leaves_its_input_alone():
    values = np.array([3.0, 1.0, 2.0, 5.0, 4.0])
    quantile(values, 0.95)
    assert values.tolist() == [3.0, 1.0, 2.0, 5.0, 4.0]


@pytest.mark.parametrize("n", [1, 2, 3, 20, 1001, 40_000])
def test_counting_decides_as_the_quantile_does(n):
    """quantile_at_most(v, q, limit) == (quantile(v, q) <= limit) at every limit that could tip it: each order
    statistic near the quantile, the values one ulp either side, and the interpolated quantile itself and its
    neighbours; with ties and a constant sample."""
    from apmw.capacity.quantiles import Tail, quantile_at_most
    rng = np.random.default_rng(n)
    for values in (rng.gamma(0.5, size=n) * 1e3, np.round(rng.exponential(5.0, n)), np.full(n, 7.25)):
        ordered = np.sort(values)
        for q in (0.0, 0.123, 0.5, 0.95, 0.99, 1.0):
            exact = quantile(values, q)
            k = int(np.floor(q * (n - 1)))
            near = ordered[max(k - 2, 0):k + 3]
            limits = [exact, *near, 0.0, float(ordered[-1]) * 2]
            limits += [np.nextafter(x, d) for x in (exact, *near) for d in (-np.inf, np.inf)]
            for limit in limits:
                assert quantile_at_most(values, q, float(limit)) == (exact <= limit), (q, limit)
                assert (Tail(values, q) <= float(limit)) == (exact <= limit)
            assert float(Tail(values, q)) == exact


def test_counting_defers_to_the_quantile_where_the_sample_is_not_finite():
    """NaN or infinite values (or an infinite limit) are read as the quantile reads them, never by a count that
    would disagree with it."""
    from apmw.capacity.quantiles import quantile_at_most
    for values, q, limit in (([1.0, np.nan], 0.95, 5.0), ([1.0, np.inf], 0.95, np.inf), ([1.0, 2.0], 0.5, np.inf),
                             ([1.0, np.inf, 3.0], 0.5, 10.0)):
        v = np.array(values)
        assert quantile_at_most(v, q, limit) == (quantile(v, q) <= limit), (values, q, limit)
