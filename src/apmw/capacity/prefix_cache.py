"""Contexts freed at tool waits and the LRU prefix cache that may still hold them.

Under ``evict`` (and ``ttl`` once its limit passes) a session's context is freed when
it starts waiting for a tool, but vLLM keeps freed blocks in its prefix cache and
evicts least-recently-used blocks only when it needs room. A returning session
finds its context if it survived. We use the characteristic-time approximation of
an LRU cache (Che, Tung and Wang, IEEE JSAC 2002; Fricker, Robert and Roberts,
ITC 2012): a freed context is evicted ``T`` seconds after it was freed, where ``T``
is the time at which freed contexts fill the memory that the running and queued
calls leave free:

    sessions/s x E[ sum over a task's freed contexts of kv_bytes x min(wait, T)
                    + its last context's kv_bytes x T ] = free KV bytes

Every task's last context is freed for good and sits in the cache ``T`` seconds too.
A context whose wait is shorter than ``T`` is a hit; otherwise it is recomputed.

llama.cpp's server keeps one prompt per slot instead (:mod:`apmw.sim.slots`): a context stays
until another request takes its slot. A request takes another's slot when it does not find its
own context: every task's first call, and every returning call that missed. It takes the first
idle slot that holds a prompt, which is neither the least recently used nor one that tracks a
context's age, so :class:`SlotSurvival` treats it as a random idle slot: a context waiting ``w``
seconds survives with probability ``exp(-r w / k)`` for ``r`` such takes per second among ``k``
idle slots. The simulator prices the rule exactly.
The miss share ``m`` changes the prefill work, hence the step time, hence the free
memory: we iterate to the fixed point, blending two session samples drawn with the
same seed (all hits, all misses) and their engine curves linearly in ``m``
(:class:`apmw.capacity.closed_loop.ClosedLoopModel` does that).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from apmw.capacity.sessions import SessionSample
from apmw.spec import Spec



@dataclass(frozen=True)
class LruSurvival:
    """Freed contexts sorted by how long they wait, with the sums the fixed point needs."""

    wait_s: np.ndarray          # sorted
    kv_bytes: np.ndarray        # aligned with wait_s
    kv_wait_below: np.ndarray   # cumulative sum of kv x wait up to each index
    kv_above: np.ndarray        # sum of kv from each index on
    dead_kv: float              # contexts freed for good (a task's last), summed over the sampled tasks
    sessions: int

    @classmethod
    def from_sample(cls, s: SessionSample) -> "LruSurvival":
        order = np.argsort(s.freed_s, kind="stable")
        wait, kv = s.freed_s[order], s.freed_kv_bytes[order]
        return cls(wait_s=wait, kv_bytes=kv, kv_wait_below=np.concatenate(([0.0], np.cumsum(kv * wait))),
                   kv_above=np.concatenate((np.cumsum(kv[::-1])[::-1], [0.0])),
                   dead_kv=float(s.final_kv_bytes.sum()), sessions=s.sessions)

    def cached_byte_seconds(self, t: float) -> float:
        """Per task: sum over its freed contexts of kv_bytes x min(wait, t), plus its last context x t."""
        k = int(np.searchsorted(self.wait_s, t))
        above = t * (self.kv_above[k] + self.dead_kv) if (k < len(self.wait_s) or self.dead_kv) else 0.0
        return float(self.kv_wait_below[k] + above) / self.sessions

    def characteristic_time(self, free_bytes: float, sessions_per_s: float) -> float:
        """T at which freed contexts fill ``free_bytes`` (inf when they never do)."""
        if free_bytes <= 0:
            return 0.0
        if len(self.wait_s) == 0 or sessions_per_s * self.cached_byte_seconds(np.inf) <= free_bytes:
            return np.inf
        target = free_bytes / sessions_per_s * self.sessions
        # occupancy is piecewise linear in t: find the segment, then solve inside it
        at_waits = self.kv_wait_below[1:] + self.wait_s * (self.kv_above[1:] + self.dead_kv)
        k = int(np.searchsorted(at_waits, target))
        return float((target - self.kv_wait_below[k]) / (self.kv_above[k] + self.dead_kv))

    def miss_share(self, t: float) -> float:
        """Share of freed contexts whose wait outlasts ``t``."""
        if len(self.wait_s) == 0:
            return 0.0
        return 1.0 - np.searchsorted(self.wait_s, t, side="left") / len(self.wait_s)


@dataclass(frozen=True)
class SlotSurvival:
    """Freed contexts' waits, for one cached prompt per slot (module docstring)."""

    wait_s: np.ndarray
    returning_per_session: float     # freed contexts a task comes back to

    @classmethod
    def from_sample(cls, s: SessionSample) -> "SlotSurvival":
        return cls(wait_s=s.freed_s, returning_per_session=len(s.freed_s) / s.sessions)

    def miss_share(self, m: float, sessions_per_s: float, idle_slots: float) -> float:
        """Share of freed contexts whose slot is taken before they return, when a share ``m`` of them
        miss: each task's first call and each miss take a slot, ``sessions_per_s (1 + returning m)``
        per second, spread over ``idle_slots``."""
        if len(self.wait_s) == 0:
            return 0.0
        if idle_slots <= 0:
            return 1.0
        takes_per_s = sessions_per_s * (1.0 + self.returning_per_session * m)
        return float(1.0 - np.exp(-takes_per_s * self.wait_s / idle_slots).mean())


def frees_contexts(spec: Spec) -> bool:
    """Whether the spec's policy frees contexts at tool waits into the prefix cache."""
    return spec.serving.prefix_caching and spec.serving.tool_wait_kv_policy in ("evict", "ttl")
