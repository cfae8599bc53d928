"""The N* searches: galloping from one agent, or outwards from a guess, find the same largest passing count."""

import pytest

from apmw.capacity.search import largest_near, largest_passing


@pytest.mark.parametrize("threshold", [0, 1, 2, 3, 7, 8, 9, 63, 64, 1000, 99_999])
@pytest.mark.parametrize("guess", [1, 2, 5, 64, 700, 5000])
def test_outwards_from_a_guess_finds_what_galloping_finds(threshold, guess):
    calls = []

    def ok(n: int) -> bool:
        calls.append(n)
        return n <= threshold

    assert largest_passing(ok, limit=100_000) == threshold
    assert largest_near(ok, guess, limit=100_000) == threshold


def test_the_limit_caps_both():
    assert largest_passing(lambda n: True, limit=50) == 50
    assert largest_near(lambda n: True, 7, limit=50) == 50


def test_a_guess_one_off_costs_a_few_evaluations():
    seen = []
    largest_near(lambda n: seen.append(n) or n <= 120, 121)
    assert len(seen) <= 4
