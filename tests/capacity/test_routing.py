"""Routing across replicas (fleet.routing): what each call finds, and N* per replica, analytically."""

from __future__ import annotations

import numpy as np
import pytest

from apmw.capacity import plan
from apmw.capacity.closed_loop import closed_loop_model
from apmw.capacity.routing import Routing, routing_sources, with_routing
from apmw.capacity.sessions import sample_sessions
from apmw.errors import ApmwError
from apmw.perf import replica_from_spec
from apmw.spec import load_spec, spec_from_dict
from tests.conftest import EXAMPLES
from tests.sim.helpers import BASE


def _spec(policy: str, **serving):
    d = {**BASE, "serving": {**BASE["serving"], "tool_wait_kv_policy": policy, **serving}}
    if policy == "ttl":
        d["serving"]["ttl_s"] = 3.0
    return spec_from_dict(d)


def _hit(spec, agents: int) -> float:
    """Share of prompt tokens found cached at ``agents`` agents per replica."""
    model = closed_loop_model(spec, replica_from_spec(spec))
    ev = model.evaluate(agents)
    prefill = ev.prefill_tokens_per_session
    prefill = float(model.sample.prefill_tokens.mean()) if prefill is None else prefill
    return 1.0 - prefill / float(model.sample.input_tokens.mean())


def test_sources_under_affinity_are_the_previous_call():
    session = np.array([0, 0, 0, 1, 1, 2])
    src = routing_sources(session, Routing("affinity", 8), seed=0)
    assert src.tolist() == [-1, 0, 1, -1, 3, -1]


def test_random_sources_are_earlier_calls_of_the_same_session():
    session = np.repeat(np.arange(200), 15)
    src = routing_sources(session, Routing("random", 4), seed=3)
    has = src >= 0
    idx = np.arange(len(session))
    assert (src[has] < idx[has]).all() and (session[src[has]] == session[has]).all()
    firsts = np.r_[True, session[1:] != session[:-1]]
    assert (src[firsts] == -1).all()
    # a returning call finds its latest context about 1/R of the time
    previous = (src == idx - 1)[~firsts].mean()
    assert previous == pytest.approx(0.25, abs=0.02)
    assert routing_sources(session, Routing("random", 4), seed=3).tolist() == src.tolist()


@pytest.mark.parametrize("example", ["coding-agent", "support-chat"])
@pytest.mark.parametrize("policy", ["random", "least_loaded"])
def test_one_replica_equals_affinity_exactly(example, policy):
    spec = load_spec(EXAMPLES / f"{example}.yaml")
    a = plan(with_routing(spec, "affinity", 1)).to_dict()
    b = plan(with_routing(spec, policy, 1)).to_dict()
    a.pop("routing", None)
    b.pop("routing", None)
    assert a == b


@pytest.mark.parametrize("kv_policy", ["retain", "evict", "ttl"])
def test_affinity_never_lowers_prefix_hits(kv_policy):
    base = _spec(kv_policy)
    for agents in (2, 12):
        affinity = _hit(with_routing(base, "affinity", 4), agents)
        for policy in ("random", "least_loaded"):
            for replicas in (2, 4, 8):
                assert _hit(with_routing(base, policy, replicas), agents) <= affinity + 1e-12


@pytest.mark.parametrize("kv_policy", ["retain", "evict"])
def test_more_replicas_never_raise_hits_under_random_routing(kv_policy):
    base = _spec(kv_policy)
    hits = [_hit(with_routing(base, "random", r), 8) for r in (1, 2, 3, 4, 8, 16, 64)]
    assert all(b <= a + 1e-12 for a, b in zip(hits, hits[1:])), hits
    assert hits[-1] < hits[0] - 0.2        # and they fall materially: most calls land elsewhere


def test_affinity_answers_do_not_depend_on_the_replica_count():
    spec = load_spec(EXAMPLES / "coding-agent.yaml")
    a = plan(with_routing(spec, "affinity", 1)).to_dict()
    b = plan(with_routing(spec, "affinity", 40)).to_dict()
    a.pop("routing", None)
    b.pop("routing", None)
    assert a == b


def test_n_star_per_replica_falls_with_replicas_under_random_routing():
    spec = load_spec(EXAMPLES / "coding-agent.yaml")
    n = [plan(with_routing(spec, "random", r)).agents_per_replica for r in (1, 4, 16)]
    assert n[0] >= n[1] >= n[2] and n[2] < n[0]


def test_routing_is_deterministic_for_a_seed():
    spec = with_routing(_spec("evict"), "random", 4)
    r = replica_from_spec(spec)
    a, b = sample_sessions(spec, r), sample_sessions(spec, r)
    assert np.array_equal(a.prefill_tokens, b.prefill_tokens) and np.array_equal(a.freed_s, b.freed_s)
    c = sample_sessions(spec, r, seed=spec.seed + 1)
    assert not np.array_equal(a.prefill_tokens, c.prefill_tokens)


def test_routing_leaves_the_sampled_sessions_unchanged():
    spec = _spec("retain")
    r = replica_from_spec(spec)
    a = sample_sessions(with_routing(spec, "affinity", 1), r)
    b = sample_sessions(with_routing(spec, "random", 4), r)
    assert np.array_equal(a.input_tokens, b.input_tokens) and np.array_equal(a.tool_s, b.tool_s)
    assert (b.prefill_tokens >= a.prefill_tokens).all() and b.prefill_tokens.sum() > a.prefill_tokens.sum()


def test_unmodelled_combinations_are_refused():
    spec = with_routing(_spec("offload", offload_bandwidth_bytes_per_s=50e9), "random", 2)
    with pytest.raises(ApmwError, match="offload"):
        plan(spec)
    with pytest.raises(ApmwError, match="routing"):
        Routing("round_robin", 2)


def test_plan_json_carries_the_routing():
    spec = load_spec(EXAMPLES / "coding-agent.yaml")
    assert plan(spec).to_dict()["routing"] == {"policy": "affinity", "replicas": 1, "same_replica_share": 1.0}
    assert plan(with_routing(spec, "random", 4)).to_dict()["routing"]["same_replica_share"] == 0.25


def test_fleet_day_shows_the_policy_and_compares_routing_at_the_peak():
    from apmw.capacity.fleet_day import fleet_day

    spec = load_spec(EXAMPLES / "coding-agent.yaml")
    day = fleet_day(plan(spec)).to_dict()
    assert day["routing"]["policy"] == "affinity" and day["routing"]["replicas"] == day["peak_replicas"]
    assert {h["routing"] for h in day["hours"]} == {"affinity"}
    rows = {r["policy"]: r for r in day["routing_comparison"]}
    assert set(rows) == {"affinity", "least_loaded", "random"}
    assert rows["affinity"]["agents_per_replica"] == day["agents_per_replica_max"]
    for p in ("random", "least_loaded"):
        assert rows[p]["prefix_hit_rate"] < rows["affinity"]["prefix_hit_rate"]
        assert rows[p]["agents_per_replica"] <= rows["affinity"]["agents_per_replica"]
    # routing the day at random needs at least as many replicas, sized at its own peak
    rnd = fleet_day(plan(with_routing(spec, "random", 1)), compare_routing=False).to_dict()
    assert rnd["peak_replicas"] >= day["peak_replicas"]
    assert rnd["routing"] == {"policy": "random", "replicas": rnd["routing"]["replicas"],
                              "same_replica_share": 1 / rnd["routing"]["replicas"]}
    assert rnd["agents_per_replica_max"] < day["agents_per_replica_max"]


@pytest.mark.parametrize("policy", ["random", "least_loaded"])
def test_one_replica_simulation_refuses_a_spreading_router(policy):
    """One replica's simulation serves every call of its tasks (affinity): it would find every context the
    analytic plan prices as landing elsewhere, and a checked N* came out 3x the analytic one (18 against 6 at
    100,000 replicas). It refuses instead, and plan keeps its analytic N* with the reason."""
    from apmw.sim import simulate
    from apmw.sim.checked import check_plan, why_not_checked

    spec = with_routing(_spec("retain"), policy, 4)
    with pytest.raises(ApmwError, match=f"fleet.routing {policy} over 4 replicas"):
        simulate(spec, 4, duration_s=60.0)
    analytic = plan(spec)
    assert "fleet.routing" in (why_not_checked(analytic) or "")
    with pytest.raises(ApmwError, match="--analytic"):
        check_plan(analytic)
    one = with_routing(_spec("retain"), policy, 1)   # one replica: nowhere else to land, simulated as before
    assert why_not_checked(plan(one)) is None
    assert simulate(one, 2, duration_s=60.0).completed_tasks >= 0
