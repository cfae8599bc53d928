"""Routing across replicas: where each agent's calls land, and what they find there.

A fleet of ``R`` identical replicas sits behind a router. What a call finds in KV depends on which
replica it lands on (MODEL.md sections 5 and 12):

* **affinity** (sticky sessions; Dynamo's KV-aware router, SGLang router's cache-aware policy): every
  call of a task goes to the replica that holds its context. It is the default, and its answers do not
  depend on ``R``: every replica serves whole tasks.
* **random**: each call goes to a replica drawn uniformly, independently of the last.
* **least_loaded**: each call goes to the replica with the fewest calls running and queued. For identical
  replicas under balanced load, which one that is does not depend on where the agent's context lives,
  so the analytic model takes it as random (ASSUMPTION). The simulator (:mod:`apmw.sim.fleet`) routes by
  the real queue lengths: a replica that has just finished the agent's call is a little more likely to
  be the least loaded, so it measures slightly more hits than random.

Under random or least-loaded routing a call that is not its task's first lands on the replica holding
its latest context with probability ``1/R``. Otherwise it lands on a replica that holds an older
context of its task, from its latest earlier visit there, or none. What that context is depends on
the policy, exactly as :mod:`apmw.sim.agents` and :mod:`apmw.sim.kv_ledger` behave:

* pinned (``retain``; any policy between two calls of one step; ``ttl`` until its limit): the pin stays
  on the old replica, holding memory, until the agent comes back there and takes it over (a hit on the
  older context: only the tokens added since are prefilled) or the task ends. A pin that is never taken
  over is wasted memory for the rest of the task (ASSUMPTION: freed when the task ends; the simulator
  frees it when the agent's next task first lands there, or spills it when memory is short, oldest first).
* freed (``evict``; ``ttl`` past its limit): it waits in that replica's LRU prefix cache
  (:mod:`apmw.capacity.prefix_cache`) for as long as the agent stays away, and a context the task never
  comes back for sits there the characteristic time, like a task's last context.

The system prompt is cached once per replica under any routing.

:func:`routing_sources` draws the routing with its own seeded stream (so the spec's sessions do not
change) and gives each call the earlier call whose context it finds; :mod:`apmw.capacity.sessions`
prices each call from that. ASSUMPTION: the time a stale context waits counts the tool waits between its
call and the call that finds it, not the calls in between (those run on other replicas and are short
against the waits); for a pin, the calls in between do count, as the KV it holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from apmw.errors import ApmwError
from apmw.spec import Spec

POLICIES = ("affinity", "least_loaded", "random")
# The routing draws' own stream, so that drawing them leaves the spec's sampled sessions unchanged.
ROUTING_STREAM = 0x5E551_0


@dataclass(frozen=True)
class Routing:
    """A routing policy over ``replicas`` replicas."""

    policy: str = "affinity"
    replicas: int = 1

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ApmwError(f"fleet.routing must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.replicas < 1:
            raise ApmwError(f"routing needs at least one replica, got {self.replicas}")

    @property
    def spreads(self) -> bool:
        """Whether calls of a task may land on another replica than the one holding their context."""
        return self.policy != "affinity" and self.replicas > 1

    @property
    def same_replica_share(self) -> float:
        """Chance that a returning call lands on the replica holding its latest context (1 under affinity)."""
        return 1.0 / self.replicas if self.spreads else 1.0

    def to_dict(self) -> dict:
        return {"policy": self.policy, "replicas": self.replicas, "same_replica_share": self.same_replica_share}


def routing_of(spec: Spec) -> Routing:
    """The spec's routing (``fleet.routing``) over ``fleet.routing_replicas`` replicas (1 when unset)."""
    return Routing(spec.fleet.routing, spec.fleet.routing_replicas or 1)


def with_routing(spec: Spec, policy: str, replicas: int) -> Spec:
    """``spec`` with its fleet routed by ``policy`` over ``replicas`` replicas."""
    Routing(policy, replicas)
    return spec.model_copy(update={"fleet": spec.fleet.model_copy(update={"routing": policy,
                                                                          "routing_replicas": replicas})})


def check_routable(spec: Spec, slot_prompt_cache: bool) -> None:
    """Refuse what spreading a task's calls over replicas is not modelled for (a clear error, not a wrong answer)."""
    sv, w = spec.serving, spec.workload
    missing = []
    if sv.tool_wait_kv_policy == "offload":
        missing.append("tool_wait_kv_policy offload (where its host copy lives)")
    if w.summarize_at_tokens is not None:
        missing.append("history summarisation (workload.summarize_at_tokens)")
    if sv.disaggregation is not None:
        missing.append("disaggregated prefill (serving.disaggregation)")
    if slot_prompt_cache:
        missing.append("llama.cpp's prompt slots")
    if missing:
        raise ApmwError(f"fleet.routing {spec.fleet.routing} over {spec.fleet.routing_replicas:,} replicas is not "
                        f"modelled with {'; '.join(missing)} yet; use fleet.routing: affinity")


def routing_sources(session_of_call: np.ndarray, routing: Routing, seed: int) -> np.ndarray:
    """For each call, the index of the latest earlier call of its session that ran on the replica it lands
    on (-1: none; a session's first call always -1). Under affinity that is the previous call."""
    n = len(session_of_call)
    idx = np.arange(n)
    if not routing.spreads:
        src = idx - 1
        src[np.r_[True, session_of_call[1:] != session_of_call[:-1]] if n else np.zeros(0, bool)] = -1
        return src
    rng = np.random.default_rng([seed, ROUTING_STREAM])
    replica = rng.integers(0, routing.replicas, n)
    order = np.lexsort((idx, replica, session_of_call))
    src = np.full(n, -1, dtype=np.int64)
    if n > 1:
        a, b = order[:-1], order[1:]
        same = (session_of_call[a] == session_of_call[b]) & (replica[a] == replica[b])
        src[b[same]] = a[same]
    return src
