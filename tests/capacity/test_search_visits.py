"""The N* search asks the closed loop only what it needs: where memory fits at the latency limit, the memory
search visits no agent count the latency search did not; started near N* (a neighbouring point's, in a
design-space search) it asks fewer agent counts and finds the same answer."""

from __future__ import annotations

from apmw import load_spec
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


def test_memory_that_fits_at_the_latency_limit_costs_no_evaluation():
    result, seen = _recorded_search(load_spec(bundled_examples()["support-chat"]))
    assert result.binding_constraint != "kv_memory"
    assert result.agents_memory_only == result.agents_latency_only == result.agents
    latency_visits: set[int] = set()
    largest_passing(lambda n: latency_visits.add(n) or seen[n].meets_latency)   # KeyError: not evaluated
    assert set(seen) == latency_visits


def test_memory_that_binds_is_still_searched():
    spec = load_spec(bundled_examples()["coding-agent"])
    result, seen = _recorded_search(spec)
    assert result.binding_constraint == "kv_memory"
    n = result.agents_memory_only
    assert n < result.agents_latency_only
    assert seen[n].fits_memory and not seen[n + 1].fits_memory


def _answer(result):
    return (result.agents, result.binding_constraint, result.agents_latency_only, result.agents_memory_only,
            result.first_failure.agents, result.at_optimum.task_latency_p95_s)


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
