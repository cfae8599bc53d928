"""The N* search asks the closed loop only what it needs: latency and memory are searched together, so no agent
count past the first that fails either is asked (where memory binds, latency is not searched on to its own limit);
started near N* (a neighbouring point's, in a design-space search) it asks fewer agent counts and finds the same
answer."""

from __future__ import annotations

import yaml

from apmw import load_spec
from apmw.spec.load import spec_from_dict
from apmw.capacity.closed_loop import closed_loop_model
from apmw.capacity.search import largest_passing, search
from apmw.examples import bundled_examples
from apmw.perf import replica_from_spec


def _recorded_search(spec, guess=None):
    replica = replica_from_spec(spec)
    model = closed_loop_model(spec, replica)
    seen: dict = {}
    evaluate = model.evaluate

    def recording(n: int):
        seen[n] = evaluate(n)
        return seen[n]

    model.evaluate = recording
    return search(spec, replica, model.sample, model, guess), seen


def _one_search_visits(seen: dict) -> set[int]:
    """The agent counts one gallop-and-bisect over "meets the SLO and fits" asks (KeyError: one not evaluated)."""
    visits: set[int] = set()
    largest_passing(lambda n: visits.add(n) or (seen[n].meets_latency and seen[n].fits_memory))
    return visits


def test_where_latency_binds_the_search_asks_one_gallop_and_bisection():
    result, seen = _recorded_search(load_spec(bundled_examples()["support-chat"]))
    assert result.binding_constraint != "kv_memory"
    assert set(seen) == _one_search_visits(seen)
    assert not seen[result.agents + 1].meets_latency


def test_where_memory_binds_latency_is_not_searched_past_it():
    spec = load_spec(bundled_examples()["coding-agent"])
    result, seen = _recorded_search(spec)
    n = result.agents
    assert result.binding_constraint == "kv_memory"
    assert seen[n].fits_memory and not seen[n + 1].fits_memory and seen[n + 1].meets_latency
    assert set(seen) == _one_search_visits(seen)
    assert max(seen) < 2 * (n + 1)                 # the gallop stopped at memory's first failure


def test_a_loose_slo_with_a_huge_batch_limit_stops_where_memory_does():
    """A task SLO no agent count breaks and a batch limit of 65,536: memory stops N* near a hundred, and the
    search asks nothing near the million agents where the latency check alone would have led it (which built
    every sample's engine curve to all 65,536 batch sizes: 16 s for plan, minutes for levers)."""
    doc = yaml.safe_load(bundled_examples()["coding-agent"].read_text())
    doc["serving"].update(max_batch=65536, max_batched_tokens=65536)
    doc["slo"] = {"task_latency_p95_s": 1e9}
    spec = spec_from_dict(doc)
    result, seen = _recorded_search(spec)
    assert result.binding_constraint == "kv_memory"
    assert max(seen) < 2 * (result.agents + 1)


def _answer(result):
    return (result.agents, result.binding_constraint, result.first_failure.agents,
            result.at_optimum.task_latency_p95_s)


def test_a_search_started_anywhere_finds_the_same_n_star():
    for name in ("support-chat", "coding-agent"):
        spec = load_spec(bundled_examples()[name])
        cold, cold_seen = _recorded_search(spec)
        n = cold.agents
        for guess in (1, n // 3, n - 1, n, n + 1, 2 * n + 5, 10**7):
            warm, seen = _recorded_search(spec, guess)
            assert _answer(warm) == _answer(cold), (name, guess)
        warm, seen = _recorded_search(spec, n)
        assert len(seen) < len(cold_seen), (name, sorted(seen), sorted(cold_seen))
