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
The miss share ``m`` changes the prefill work, hence the step time, hence the free
memory: we iterate to the fixed point, blending two session samples drawn with the
same seed (all hits, all misses) and their engine curves linearly in ``m``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from apmw.capacity.closed_loop import EngineCurve, engine_curve, solve_at
from apmw.capacity.disaggregation import prefill_stage
from apmw.capacity.evaluate import Evaluation, evaluate
from apmw.errors import ApmwError
from apmw.capacity.sessions import SessionSample, sample_session_pair, sample_sessions
from apmw.perf import Replica
from apmw.perf.scheduling import mixes_prefill_with_decode
from apmw.spec import Spec

# Fixed-point iterations on the miss share, and the change at which they stop.
MAX_ITERATIONS = 12
TOLERANCE = 2e-3


def _differing(hit, miss) -> tuple[str, ...]:
    """Names of the numeric fields where two like dataclasses differ (the only ones worth blending)."""
    names = []
    for f in fields(hit):
        a, b = getattr(hit, f.name), getattr(miss, f.name)
        if isinstance(a, np.ndarray) and a.dtype.kind == "f" and a.shape == b.shape and not np.array_equal(a, b):
            names.append(f.name)
        elif isinstance(a, float) and isinstance(b, float) and a != b:
            names.append(f.name)
    return tuple(names)


def _blend(hit, miss, m: float, names: tuple[str, ...] | None = None):
    """Field by field hit + m (miss - hit) for the numeric fields of two like dataclasses."""
    changes = {}
    for name in names if names is not None else [f.name for f in fields(hit)]:
        a, b = getattr(hit, name), getattr(miss, name)
        if isinstance(a, np.ndarray) and a.dtype.kind == "f" and a.shape == b.shape:
            changes[name] = a + m * (b - a)
        elif isinstance(a, float) and isinstance(b, float):
            changes[name] = a + m * (b - a)
    return replace(hit, **changes)


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


def frees_contexts(spec: Spec) -> bool:
    """Whether the spec's policy frees contexts at tool waits into the prefix cache."""
    return spec.serving.prefix_caching and spec.serving.tool_wait_kv_policy in ("evict", "ttl")


def closed_loop_model(spec: Spec, replica: Replica) -> "ClosedLoopModel":
    """Sample the spec's sessions (both pricings where contexts are freed) and build the model."""
    if frees_contexts(spec):
        miss, hit = sample_session_pair(spec, replica.arch)
        return ClosedLoopModel(spec, replica, miss, hit_sample=hit)
    return ClosedLoopModel(spec, replica, sample_sessions(spec, replica.arch))


class ClosedLoopModel:
    """Evaluates the closed loop at any N, with the LRU prefix cache where the policy frees contexts."""

    def __init__(self, spec: Spec, replica: Replica, sample: SessionSample, max_batch: int | None = None,
                 hit_sample: SessionSample | None = None):
        self.spec, self.replica, self.miss_sample = spec, replica, sample
        self.max_batch = max_batch or spec.serving.max_batch
        self.prefill = prefill_stage(spec, replica, sample)
        self.mixed = mixes_prefill_with_decode(spec.serving.engine, spec.serving.mixed_prefill)
        self.miss_curve = engine_curve(replica.step, sample, self.max_batch, decode_only=self.prefill is not None,
                                       mixed=self.mixed)
        self.cache = LruSurvival.from_sample(sample)
        if self.prefill is not None and len(self.cache.wait_s):
            raise ApmwError("serving.disaggregation together with a policy that frees contexts at tool waits "
                            f"('{spec.serving.tool_wait_kv_policy}') is not modelled yet; use retain or offload")
        self.hit_sample = self.hit_curve = None
        self._last_m = 0.0
        if len(self.cache.wait_s):
            self.hit_sample = hit_sample or sample_sessions(spec, replica.arch, sessions=sample.sessions,
                                                            freed_contexts_hit=True)
            self.hit_curve = engine_curve(replica.step, self.hit_sample, self.max_batch, mixed=self.mixed)
            names = ("calls", "tool_s", "kv_transfer_s", "prefill_iters", "decode_iters", "kv_q", "kv_prefill",
                     "kv_decode", "kv_tool")
            self._hit_means = {n: float(getattr(self.hit_sample, n).mean()) for n in names}
            self._sample_fields = _differing(self.hit_sample, sample)
            self._curve_fields = _differing(self.hit_curve, self.miss_curve)
            self._miss_means = {n: float(getattr(sample, n).mean()) for n in names}

    def with_max_batch(self, max_batch: int) -> "ClosedLoopModel":
        """The same model with another batch limit (the binding-constraint counterfactual)."""
        return ClosedLoopModel(self.spec, self.replica, self.miss_sample, max_batch, self.hit_sample)

    def _at(self, m: float, agents: int) -> tuple[SessionSample, Evaluation]:
        s = _blend(self.hit_sample, self.miss_sample, m, self._sample_fields)
        c: EngineCurve = _blend(self.hit_curve, self.miss_curve, m, self._curve_fields)
        iters = s.call_prefill_iters + s.call_decode_iters
        c = replace(c, completion_rate=c.batch / (iters * c.iteration_s), iterations_per_call=iters)
        return s, evaluate(self.spec, s, c, self.replica.kv_capacity_bytes, agents)

    def _means(self, m: float, agents: int) -> tuple[float, float]:
        """(resident KV bytes, sessions per second) at miss share ``m``: means only, no tails (fast)."""
        h, x = self._hit_means, self._miss_means
        mean = lambda name: h[name] + m * (x[name] - h[name])  # noqa: E731
        c: EngineCurve = _blend(self.hit_curve, self.miss_curve, m, self._curve_fields)
        iters = c.iterations_per_call
        c = replace(c, completion_rate=c.batch / (iters * c.iteration_s))
        calls = mean("calls")
        loop = solve_at(c, (mean("tool_s") + mean("kv_transfer_s")) / calls, agents)
        wq, t_pf, t_dec = loop.queue_per_call_s, loop.prefill_iteration_s, loop.decode_iteration_s
        r = (wq * calls + mean("prefill_iters") * t_pf + mean("decode_iters") * t_dec + mean("tool_s")
             + mean("kv_transfer_s"))
        kv = agents * (mean("kv_q") * wq + mean("kv_prefill") * t_pf + mean("kv_decode") * t_dec
                       + mean("kv_tool")) / r + self.hit_sample.shared_prefix_kv_bytes
        return kv, agents / r

    def evaluate(self, agents: int) -> Evaluation:
        cap = self.replica.kv_capacity_bytes
        if self.hit_sample is None:
            return evaluate(self.spec, self.miss_sample, self.miss_curve, cap, agents, self.prefill)
        def step(m: float) -> float:
            kv, sessions_per_s = self._means(m, agents)
            return self.cache.miss_share(self.cache.characteristic_time(cap - kv, sessions_per_s))

        # fixed point of m = step(m): secant steps from the last answer (nearby N have nearby m),
        # kept inside [0, 1]; damped iteration where the secant stalls
        m0 = self._last_m
        g0 = step(m0) - m0
        m1 = min(max(m0 + g0, 0.0), 1.0)
        for _ in range(MAX_ITERATIONS):
            g1 = step(m1) - m1
            if abs(g1) < TOLERANCE:
                break
            slope = (g1 - g0) / (m1 - m0) if m1 != m0 else -1.0
            m_next = m1 - g1 / slope if slope < 0 else m1 + 0.5 * g1
            m0, g0, m1 = m1, g1, min(max(m_next, 0.0), 1.0)
        m = m1
        self._last_m = m
        s, ev = self._at(m, agents)
        return replace(ev, freed_context_hit_rate=1.0 - m, prefill_tokens_per_session=float(s.prefill_tokens.mean()))
