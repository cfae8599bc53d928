"""Speculative decoding in the simulator (apmw.sim.engine): a decoding sequence computes its pending
token and ``k`` drafts, keeps ``(1 - a^(k+1)) / (1 - a)`` tokens an iteration on average, frees the
KV of the rejected ones, and the draft adds its share to every iteration, as the analytic model
prices ``serving.speculative``."""

from __future__ import annotations

import numpy as np
import pytest

from apmw.capacity.plan import plan
from apmw.sim import simulate
from apmw.sim.drafts import kept_tokens
from apmw.spec import spec_from_dict
from tests.conftest import small_spec_dict


def _spec(speculative: dict | None = None):
    d = small_spec_dict()
    if speculative:
        d["serving"]["speculative"] = speculative
    return spec_from_dict(d)


@pytest.mark.parametrize("computed, acceptance", [(4, 0.7), (2, 0.85), (3, 0.0), (5, 0.95), (1, 0.5)])
def test_a_call_keeps_the_expected_tokens_per_iteration(computed, acceptance):
    expected = (1 - acceptance ** computed) / (1 - acceptance)
    position, kept = 0, []
    while position < 10_000:
        k = int(kept_tokens(np.array([position]), np.array([computed]), acceptance)[0])
        kept.append(k)
        position += k
    assert min(kept) >= 1 and max(kept) <= computed
    assert position / len(kept) == pytest.approx(expected, rel=1e-3)


@pytest.mark.parametrize("computed, acceptance", [(2, 0.8), (4, 0.7), (2, 0.5), (3, 0.0), (6, 0.9)])
def test_the_fast_path_knows_where_the_plain_step_goes(computed, acceptance):
    """apmw.sim.fast_forward._speculative_segment puts a call at cut(m + j - 1) after j iterations; the plain step gets
    there by kept_tokens one iteration at a time, from any start. (y = 1.8 makes j y whole every fifth
    iteration, where two roundings of y used to part them.)"""
    from apmw.sim.drafts import cut, next_cut, tokens_per_iteration

    starts = np.arange(0, 40)
    y = tokens_per_iteration(acceptance, np.full(len(starts), computed))
    ahead = cut(next_cut(starts, y)[None, :] + np.arange(200, dtype=float)[:, None], y[None, :])
    position = starts.copy()
    for row in ahead:
        position = position + kept_tokens(position, np.full(len(starts), computed), acceptance)
        assert (position == row).all()


def test_speculative_runs_keep_the_books_and_lose_no_token():
    # check=True asserts after every step that blocks and tokens add up (rejected drafts' blocks freed)
    r = simulate(_spec({"draft_tokens": 3, "acceptance_rate": 0.7}), 24, duration_s=600, seed=2, check=True)
    assert r.completed_tasks > 0 and r.preemptions >= 0
    assert r.generated_tokens >= r.output_tokens_completed > 0
    # the same agents finish more tasks in the same time
    assert r.completed_tasks > 1.1 * simulate(_spec(), 24, duration_s=600, seed=2).completed_tasks


def test_the_same_seed_gives_the_same_run():
    spec = _spec({"draft_tokens": 2, "acceptance_rate": 0.6, "draft_cost_fraction": 0.05})
    a, b = (simulate(spec, 16, duration_s=300, seed=5).to_dict() for _ in range(2))
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b


def test_the_simulated_speed_up_is_the_analytic_one():
    """Time per output token with and without speculative decoding, at the same agents: the simulator's
    ratio within 10 % of the closed loop's (both price the same verifying iteration and draft)."""
    agents = 32
    sd = {"draft_tokens": 3, "acceptance_rate": 0.75, "draft_cost_fraction": 0.1}
    sim = [simulate(s, agents, duration_s=1800, seed=1).tpot["mean"] for s in (_spec(), _spec(sd))]
    ana = [plan(s, agents=agents).at.decode_s for s in (_spec(), _spec(sd))]     # per task, at equal tokens
    assert sim[1] < sim[0] and ana[1] < ana[0]
    assert sim[1] / sim[0] == pytest.approx(ana[1] / ana[0], rel=0.10)


def test_no_acceptance_only_costs():
    # every draft rejected: one token per iteration, each iteration verifying two per sequence
    base = simulate(_spec(), 16, duration_s=600, seed=3).tpot["mean"]
    none = simulate(_spec({"draft_tokens": 1, "acceptance_rate": 0.0, "draft_cost_fraction": 0.0}), 16,
                    duration_s=600, seed=3).tpot["mean"]
    assert none > base
