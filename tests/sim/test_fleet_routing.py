"""Several simulated replicas behind a router (apmw.sim.fleet): prefix hits by routing policy, and the
analytic routing model against it."""

from __future__ import annotations

import pytest

from apmw.capacity.closed_loop import closed_loop_model
from apmw.capacity.routing import with_routing
from apmw.errors import ApmwError
from apmw.perf import replica_from_spec
from apmw.sim.fleet import simulate_fleet
from apmw.sim.run import simulate
from tests.sim.helpers import spec

SHORT = dict(agents_per_replica=4, duration_s=200.0)


def _drop(d: dict, *names: str) -> dict:
    return {k: v for k, v in d.items() if k not in names}


def test_affinity_never_lowers_simulated_prefix_hits():
    s = spec(tool_wait_kv_policy="retain")
    affinity = simulate_fleet(s, 2, policy="affinity", **SHORT)
    for policy in ("random", "least_loaded"):
        other = simulate_fleet(s, 2, policy=policy, **SHORT)
        assert other.prefix_hit_rate < affinity.prefix_hit_rate
        assert other.prefill_tokens_per_call > affinity.prefill_tokens_per_call


def test_one_replica_is_the_same_run_under_every_policy():
    s = spec(tool_wait_kv_policy="evict")
    runs = [simulate_fleet(s, 1, policy=p, **SHORT).to_dict() for p in ("affinity", "random", "least_loaded")]
    assert _drop(runs[0], "policy", "wall_s") == _drop(runs[1], "policy", "wall_s") == _drop(runs[2], "policy", "wall_s")
    # ... and the one-replica simulator's run (the same tasks from the same seed)
    single = simulate(s, 4, 200.0)
    assert runs[0]["task_latency"] == pytest.approx(single.task_latency)


def test_a_seed_reproduces_the_run():
    s = spec(tool_wait_kv_policy="retain")
    a = simulate_fleet(s, 2, policy="random", seed=5, **SHORT).to_dict()
    b = simulate_fleet(s, 2, policy="random", seed=5, **SHORT).to_dict()
    assert _drop(a, "wall_s") == _drop(b, "wall_s")
    c = simulate_fleet(s, 2, policy="random", seed=6, **SHORT).to_dict()
    assert c["prefix_hit_rate"] != a["prefix_hit_rate"]


def test_bad_input_is_refused():
    s = spec()
    with pytest.raises(ApmwError, match="routing policy"):
        simulate_fleet(s, 2, 4, policy="sticky")
    with pytest.raises(ApmwError, match="replicas"):
        simulate_fleet(s, 0, 4)


# The band the analytic routing model keeps against the simulated fleet (docs/fleet.md, Routing): prefix
# hit rate within 0.03, prompt tokens prefilled per call within 12 %, mean task time within 10 %, and
# the task p95 no more than 25 % above the simulated one (never below it by more than 5 %).
HIT_BAND, PREFILL_BAND, MEAN_BAND, P95_ABOVE, P95_BELOW = 0.03, 0.12, 0.10, 0.25, 0.05


@pytest.mark.slow
@pytest.mark.parametrize("kv_policy", ["retain", "evict"])
@pytest.mark.parametrize("policy,replicas", [("affinity", 2), ("random", 2), ("least_loaded", 2), ("random", 3)])
def test_analytic_routing_within_its_band_of_the_simulated_fleet(kv_policy, policy, replicas):
    s = spec(tool_wait_kv_policy=kv_policy)
    agents = 8
    routed = with_routing(s, "random" if policy == "least_loaded" else policy, replicas)
    model = closed_loop_model(routed, replica_from_spec(routed))
    ev = model.evaluate(agents)
    prefill = ev.prefill_tokens_per_session
    prefill = float(model.sample.prefill_tokens.mean()) if prefill is None else prefill
    hit = 1.0 - prefill / float(model.sample.input_tokens.mean())
    sim = simulate_fleet(s, replicas, agents, policy, duration_s=600.0)
    assert hit == pytest.approx(sim.prefix_hit_rate, abs=HIT_BAND)
    assert prefill / model.sample.mean_calls == pytest.approx(sim.prefill_tokens_per_call, rel=PREFILL_BAND)
    assert ev.task_latency_mean_s == pytest.approx(sim.task_latency["mean"], rel=MEAN_BAND)
    assert sim.task_latency["p95"] * (1 - P95_BELOW) <= ev.task_latency_p95_s <= sim.task_latency["p95"] * (1 + P95_ABOVE)
