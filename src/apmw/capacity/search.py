"""Find N*, the most agents one replica sustains, and what stops it going higher.

    N* = max N such that p95 task time (and any per-call SLO) holds and the
    resident KV (95th percentile) fits in the replica's KV memory.

Both conditions only get harder as N grows (more agents: longer queues, bigger
batches, more KV), so a galloping search (1, 2, 4, ...) followed by bisection
finds N* in O(log N*) evaluations. The two are searched together, stopping at the
first agent count where either fails: past memory's limit the latency check is
never asked, so a loose SLO on an engine with a batch limit of thousands does not
price the loop at a million agents (its engine curve to every batch size) when
memory stops N* at a hundred.

The binding constraint is the one whose relaxation would raise N*:
``kv_memory`` if one more agent still meets the latency SLO (memory ran out
first); otherwise ``batch_limit`` if an unlimited ``max_batch`` would meet the
SLO at more agents; otherwise ``slo`` (the step time itself, at the batch the
SLO allows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from apmw.capacity.evaluate import Evaluation
from apmw.capacity.closed_loop import ClosedLoopModel
from apmw.capacity.sessions import SessionSample
from apmw.perf import Replica
from apmw.spec import Spec
from apmw.spec.serving import MAX_BATCH_LIMIT

# Searching beyond this many agents per replica means the workload barely uses the
# engine (e.g. hour-long tool waits); we report the bound instead of looping on.
MAX_AGENTS = 1_000_000
# Below this probability of a full batch at N* + 1, raising max_batch cannot help: skip that search.
BATCH_FULL_NEGLIGIBLE = 1e-3


def largest_passing(ok: Callable[[int], bool], limit: int = MAX_AGENTS) -> int:
    """Largest n in [0, limit] with ok(n), given ok is true then false as n grows (ok(0) is true)."""
    if not ok(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and ok(hi):
        lo, hi = hi, hi * 2
    return largest_below(ok, lo, min(hi, limit + 1))


def largest_near(ok: Callable[[int], bool], guess: int, limit: int = MAX_AGENTS) -> int:
    """:func:`largest_passing`, searched outwards from ``guess`` (a neighbouring problem's answer: a mix of
    sessions that changes little from one hour to the next moves N* by an agent or two)."""
    if ok(guess):
        lo, step = guess, 1
        while lo + step <= limit and ok(lo + step):
            lo, step = lo + step, step * 2
        return largest_below(ok, lo, min(lo + step, limit + 1))
    hi, step = guess, 1
    while hi - step > 0 and not ok(hi - step):
        hi, step = hi - step, step * 2
    return largest_below(ok, max(hi - step, 0), hi)


def largest_below(ok: Callable[[int], bool], lo: int, hi: int) -> int:
    """Largest n in [lo, hi) with ok(n), given ok(lo) (or lo = 0) and not ok(hi) (or hi past the limit)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class SearchResult:
    agents: int                   # N*
    binding_constraint: str       # "slo" | "kv_memory" | "batch_limit" | "agent_limit" (N* at MAX_AGENTS)
    at_optimum: Evaluation | None  # the evaluation at N* (None when N* = 0)
    first_failure: Evaluation     # the evaluation at N* + 1
    single_agent: Evaluation      # the evaluation at N = 1: the floor of the task latency


def binding_constraint(agents: int, next_meets_latency: bool) -> str:
    """What stops N at ``agents`` (the most that meet the SLO and fit): the search's own ceiling
    (:data:`MAX_AGENTS`), else ``kv_memory`` where one agent more still meets the latency SLO, else ``slo``
    (:func:`search` asks further whether the batch limit is what makes the SLO fail)."""
    if agents >= MAX_AGENTS:
        return "agent_limit"      # the search's own ceiling: more agents would still meet the SLO and fit
    return "kv_memory" if next_meets_latency else "slo"


def search(spec: Spec, replica: Replica, sample: SessionSample, model: ClosedLoopModel | None = None,
           guess: int | None = None) -> SearchResult:
    """N* and what binds it. ``guess`` (a neighbouring problem's N*) starts the search there instead of at one
    agent: a guess near N* asks a few agent counts where galloping up from one asks twice log2 N*. The answer is
    the same only where the checks are monotone in the agents, which the analytic TTFT p95 is not everywhere
    (:mod:`apmw.design_search.point`), so a caller whose answer must not depend on its history passes none."""
    model = model or ClosedLoopModel(spec, replica, sample)
    cache: dict[int, Evaluation] = {}

    def at(n: int) -> Evaluation:
        if n not in cache:
            cache[n] = model.evaluate(n)
        return cache[n]

    def feasible(n: int) -> bool:
        ev = at(n)
        return ev.meets_latency and ev.fits_memory

    n_star = (largest_passing(feasible) if guess is None
              else largest_near(feasible, min(max(guess, 1), MAX_AGENTS)))
    after = at(n_star + 1)
    binding = binding_constraint(n_star, after.meets_latency)
    # the batch limit can only bind if the engine sometimes holds max_batch calls where latency fails
    if binding == "slo" and after.loop.batch_full_share >= BATCH_FULL_NEGLIGIBLE:
        # latency only gets harder with more agents, so an unlimited batch meets it at more agents exactly
        # when it meets it at one more
        unlimited = model.with_max_batch(max(replica.policy.max_batch, min(n_star * 2 + 2, MAX_BATCH_LIMIT)))
        binding = "batch_limit" if unlimited.evaluate(n_star + 1).meets_latency else "slo"
    return SearchResult(agents=n_star, binding_constraint=binding, at_optimum=at(n_star) if n_star > 0 else None,
                        first_failure=after, single_agent=at(1))
