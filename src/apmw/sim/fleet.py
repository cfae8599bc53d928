"""Several replicas behind a router: closed-loop agents whose calls a routing policy spreads.

Each replica is an :class:`apmw.sim.engine.Engine` of its own (its own clock, KV ledger and
prefix cache). The agents are :class:`apmw.sim.agents.ClosedLoopAgents`, drawing the same tasks
from the same seeded generator; a call reaches the router when it is issued (after its tool wait)
and the router sends it to a replica by ``fleet.routing`` (:mod:`apmw.capacity.routing`):

* ``affinity``: a task's first call goes to the least-loaded replica, every later call of the task
  to the same one (sticky sessions);
* ``least_loaded``: each call to the replica with the fewest calls running, queued and arriving,
  ties broken at random;
* ``random``: each call to a replica drawn uniformly.

A call that lands where its task left no context finds only the shared prefix there; one that lands
where an older context of its task is pinned takes that over; a context left pinned on a replica the
task moved away from stays until taken over, spilled (oldest first) or, at the agent's next task's first
call there, freed (:mod:`apmw.sim.kv_ledger`).

The replicas run in time order: the replica whose next event comes first runs its next iteration, or
a segment of decode iterations cut at the router's next call or ``lookahead_s`` past another
replica's next event, so a call finished on one replica reaches another at most one iteration plus
``lookahead_s`` late (default ``LOOKAHEAD_S``: without it the replicas leapfrog an iteration at a time,
about 15 times slower for two replicas than one; with it a late call waits at most one iteration plus
those few milliseconds more for its first token). Routing draws come from their own stream
(``[seed, 1]``), the tasks from ``seed`` (the one-replica simulator's stream), so a run is reproducible.

The run measures, over its window, per replica and together: the share of prompt tokens each
admission found cached (the shared prefix, a pin it took over, or its context's cached blocks),
the prompt tokens it prefilled, the task latency, and the resident KV tokens.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass

import numpy as np

from apmw.capacity.routing import POLICIES
from apmw.errors import ApmwError
from apmw.perf import Replica, replica_from_spec
from apmw.perf.parallelism import layout_of
from apmw.sim.agents import ClosedLoopAgents
from apmw.sim.batch import Seq
from apmw.sim.engine import Engine
from apmw.sim.fast_forward import fast_forward
from apmw.sim.result import percentiles
from apmw.sim.run import DEFAULT_WARMUP_SHARE, MAX_AGENTS, unsupported
from apmw.spec import Spec

MAX_REPLICAS = 64
# How far a replica may run past another's next event (module docstring).
LOOKAHEAD_S = 0.05


class _RoutedEngine(Engine):
    """An engine that also counts every admission's prompt tokens and cached tokens in its window,
    a pinned context taken over included (the engine's own counters skip those)."""

    lookup_tokens = 0
    hit_tokens = 0
    admissions = 0

    def _admitted(self, seq: Seq, plan) -> None:
        if self.meter.in_window(self.now):
            kv, reuse = plan[0], plan[1]
            self.lookup_tokens += seq.total
            self.hit_tokens += kv if seq.retained else self.ledger.hit_tokens(kv, reuse)
            self.admissions += 1


class _Port:
    """One replica's view of the fleet driver: the engine calls it as its driver."""

    def __init__(self, fleet: "_FleetAgents", i: int):
        self.fleet, self.i = fleet, i

    @property
    def stop_time_s(self) -> float:
        """Where this replica's fast-forward must stop: the global stop, or the next event elsewhere."""
        return min(self.fleet.stop_time_s, self.fleet.horizon_s(self.i))

    def on_arrival(self, seq: Seq) -> None:
        self.fleet.at(self.i).on_arrival(seq)

    def on_done(self, seq: Seq, now: float) -> None:
        self.fleet.at(self.i).on_done(seq, now)

    def on_rejected(self, seq: Seq, now: float) -> None:
        self.fleet.at(self.i).on_rejected(seq, now)

    def finished(self, now: float) -> bool:
        return self.fleet.finished(now)


def _unsupported_in_fleet(spec: Spec) -> str | None:
    """What the multi-replica simulation does not model beyond :func:`apmw.sim.run.unsupported`: its replicas
    step with one scheduler each."""
    if layout_of(spec.serving, spec.hardware.gpus_per_replica).dp > 1:
        return ("attention data-parallel ranks in a multi-replica simulation (serving.parallelism.dp_attention; "
                "apmw simulate and apmw plan run them on one replica)")
    return None


def _next_event_s(e: Engine) -> float:
    if len(e.running) or e.waiting:
        return e.now
    return min(e.arrivals[0][0] if e.arrivals else math.inf, e.ledger.next_expiry_s())


class _FleetAgents(ClosedLoopAgents):
    """The closed-loop agents, their calls sent to a replica by the routing policy when they are issued."""

    def __init__(self, spec: Spec, agents: int, rng: np.random.Generator, route_rng: np.random.Generator,
                 policy: str, warmup_s: float, duration_s: float, drain_limit_s: float):
        super().__init__(spec, agents, rng, warmup_s, duration_s, drain_limit_s)
        self.policy = policy
        self.route_rng = route_rng
        self.engines: list[Engine] = []
        self.home = [-1] * agents                   # affinity: the replica holding each agent's task
        self.pending: list = []                     # heap of (time, n, seq) at the router
        self._m = 0
        self.calls_to: list[int] = []
        self.lookahead_s = 0.0

    def at(self, i: int) -> "_FleetAgents":
        self.engine = self.engines[i]
        return self

    def attach_all(self, engines: list[Engine]) -> None:
        self.engines = engines
        self.calls_to = [0] * len(engines)
        self.attach(engines[0])

    def horizon_s(self, i: int) -> float:
        """The next event at the router, or at another replica plus the look-ahead."""
        t = math.inf
        for j, e in enumerate(self.engines):
            if j != i:
                t = min(t, _next_event_s(e))
        return min(t + self.lookahead_s, self.pending[0][0] if self.pending else math.inf)

    def _issue(self, a: int, t: float, host_tokens: int) -> None:
        new, out, _ = self.calls[a]
        i = self.call_idx[a]
        prompt = max(self.context[a] + new[i], self.w.system_prompt_tokens + 1)
        self._m += 1
        heapq.heappush(self.pending, (t, self._m, Seq(a, self.task_ctx[a], prompt, out[i], t, host_tokens)))

    def _load(self, e: Engine) -> int:
        return len(e.running) + len(e.waiting) + len(e.arrivals)

    def _least_loaded(self) -> int:
        loads = np.array([self._load(e) for e in self.engines])
        best = np.flatnonzero(loads == loads.min())
        return int(best[self.route_rng.integers(len(best))]) if len(best) > 1 else int(best[0])

    def route(self) -> None:
        """Send the call at the head of the router's queue to its replica."""
        t, _, seq = heapq.heappop(self.pending)
        a = seq.agent
        if self.policy == "random":
            i = int(self.route_rng.integers(len(self.engines)))
        elif self.policy == "least_loaded" or self.call_idx[a] == 0 or self.home[a] < 0:
            i = self._least_loaded()
        else:
            i = self.home[a]
        if self.call_idx[a] == 0:
            self.home[a] = i
        self.calls_to[i] += 1
        self.engines[i].submit(seq, t)


@dataclass(frozen=True)
class FleetSimResult:
    """One multi-replica run: the routing, and what it measured over the window."""

    policy: str
    replicas: int
    agents: int
    seed: int
    duration_s: float
    warmup_s: float
    completed_tasks: int
    task_latency: dict
    prefix_hit_rate: float | None       # prompt tokens found cached / prompt tokens, over every admission
    prefill_tokens_per_call: float | None   # prompt tokens computed per admission
    prefill_tokens_per_s: float         # ... per second of the window, the whole fleet
    kv_tokens_resident_mean: float      # per replica, time average over the window
    preemptions: int
    spills: int
    calls_per_replica: list[int]
    wall_s: float

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def simulate_fleet(spec: Spec, replicas: int, agents_per_replica: int, policy: str | None = None,
                   duration_s: float = 1800.0, seed: int | None = None, *, warmup_s: float | None = None,
                   replica: Replica | None = None, fast: bool = True, check: bool = False,
                   lookahead_s: float = LOOKAHEAD_S) -> FleetSimResult:
    """``replicas * agents_per_replica`` closed-loop agents on ``replicas`` replicas of ``spec`` behind a
    router using ``policy`` (default ``fleet.routing``), for ``duration_s`` simulated seconds."""
    policy = spec.fleet.routing if policy is None else policy
    if policy not in POLICIES:
        raise ApmwError(f"routing policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if not 1 <= replicas <= MAX_REPLICAS:
        raise ApmwError(f"replicas must be between 1 and {MAX_REPLICAS}, got {replicas}")
    agents = replicas * agents_per_replica
    if not 1 <= agents <= MAX_AGENTS:
        raise ApmwError(f"agents must be between 1 and {MAX_AGENTS:,} in all, got {agents:,}")
    gap = unsupported(spec) or _unsupported_in_fleet(spec)
    if gap:
        raise ApmwError(f"the simulator does not model {gap} yet")
    if not duration_s > 0:
        raise ApmwError(f"duration_s must be > 0, got {duration_s:g}")
    seed = spec.seed if seed is None else seed
    warmup_s = DEFAULT_WARMUP_SHARE * duration_s if warmup_s is None else warmup_s
    if not 0 <= warmup_s < duration_s:
        raise ApmwError(f"warmup_s ({warmup_s:g}) must lie in [0, duration_s={duration_s:g})")
    replica = replica_from_spec(spec) if replica is None else replica
    fleet = _FleetAgents(spec, agents, np.random.default_rng(seed), np.random.default_rng([seed, 1]), policy,
                         warmup_s, duration_s, duration_s)
    engines: list[Engine] = [
        _RoutedEngine(replica, spec.serving, spec.workload.system_prompt_tokens, _Port(fleet, i), fast=fast,
                      window=(warmup_s, duration_s), check=check) for i in range(replicas)]
    fleet.lookahead_s = lookahead_s
    fleet.attach_all(engines)
    t0 = time.perf_counter()
    _run(fleet, engines, check)
    wall = time.perf_counter() - t0
    window = duration_s - warmup_s
    lookup = sum(e.lookup_tokens for e in engines)
    hit = sum(e.hit_tokens for e in engines)
    admitted = sum(e.admissions for e in engines)
    return FleetSimResult(
        policy=policy, replicas=replicas, agents=agents, seed=seed, duration_s=duration_s, warmup_s=warmup_s,
        completed_tasks=len(fleet.task_latency_s), task_latency=percentiles(fleet.task_latency_s),
        prefix_hit_rate=hit / lookup if lookup else None,
        prefill_tokens_per_call=(lookup - hit) / admitted if admitted else None,
        prefill_tokens_per_s=(lookup - hit) / window,
        kv_tokens_resident_mean=sum(e.stats.kv_tokens_s for e in engines) / window / replicas,
        preemptions=sum(e.stats.preemptions for e in engines), spills=sum(e.stats.spills for e in engines),
        calls_per_replica=list(fleet.calls_to), wall_s=wall)


def _run(fleet: _FleetAgents, engines: list[Engine], check: bool) -> None:
    """Run the replicas in time order (module docstring) until the agents say stop."""
    while True:
        keys = [_next_event_s(e) for e in engines]
        i = int(np.argmin(keys))
        t_router = fleet.pending[0][0] if fleet.pending else math.inf
        t = min(keys[i], t_router)
        if fleet.finished(t) or not math.isfinite(t):
            break
        if t_router <= keys[i]:
            fleet.route()
            continue
        e = engines[i]
        if e.now < t:
            e._idle_until(t)
        e._process_events()
        if check:
            e.check_invariants()
        if len(e.running):
            if not (e.fast and fast_forward(e)):
                e.step_once()
        elif e.waiting and not e.step_once():
            e._break_deadlock()
