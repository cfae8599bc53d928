"""The closed-loop model of one replica: evaluate ``N`` agents, with the LRU prefix cache where it matters.

:class:`ClosedLoopModel` is what ``apmw plan``, the N* search and the levers ask "what happens at
``N`` agents". It samples the spec's sessions once, builds the replica's engine curve
(:mod:`apmw.capacity.engine_curve`), solves the closed network at ``N``
(:mod:`apmw.capacity.closed_network`) and reads tails and memory off the sample
(:mod:`apmw.capacity.evaluate`). Where the policy frees contexts at tool waits, it solves for the
prefix-cache miss share (:mod:`apmw.capacity.prefix_cache`) by blending two samples drawn with the
same seed, one with every freed context found and one with none; with llama.cpp's one prompt per
slot, from how often its slot is taken (:class:`apmw.capacity.prefix_cache.SlotSurvival`).
"""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np

from apmw.capacity.closed_network import solve_at
from apmw.capacity.disaggregation import prefill_stage
from apmw.capacity.engine_curve import EngineCurve, engine_curve
from apmw.capacity.evaluate import Evaluation, evaluate
from apmw.capacity.prefix_cache import LruSurvival, SlotSurvival, frees_contexts
from apmw.capacity.sessions import SessionSample, sample_session_pair, sample_sessions
from apmw.errors import ApmwError
from apmw.perf import Replica
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


def closed_loop_model(spec: Spec, replica: Replica) -> "ClosedLoopModel":
    """Sample the spec's sessions (both pricings where contexts are freed) and build the model."""
    if frees_contexts(spec):
        miss, hit = sample_session_pair(spec, replica)
        return ClosedLoopModel(spec, replica, miss, hit_sample=hit)
    return ClosedLoopModel(spec, replica, sample_sessions(spec, replica))


class ClosedLoopModel:
    """Evaluates the closed loop at any N, with the LRU prefix cache where the policy frees contexts."""

    def __init__(self, spec: Spec, replica: Replica, sample: SessionSample, max_batch: int | None = None,
                 hit_sample: SessionSample | None = None):
        self.spec, self.replica, self.miss_sample = spec, replica, sample
        self.max_batch = max_batch or replica.policy.max_batch
        self.prefill = prefill_stage(spec, replica, sample)
        self.mixed = replica.policy.mixed_prefill
        self.miss_curve = engine_curve(replica.step, sample, self.max_batch, decode_only=self.prefill is not None,
                                       mixed=self.mixed)
        self.slots = replica.policy.slot_prompt_cache
        self.cache = LruSurvival.from_sample(sample)
        self.slot_cache = SlotSurvival.from_sample(sample) if self.slots else None
        if self.prefill is not None and len(self.cache.wait_s):
            raise ApmwError("serving.disaggregation together with a policy that frees contexts at tool waits "
                            f"('{spec.serving.tool_wait_kv_policy}') is not modelled yet; use retain or offload")
        self.hit_sample = self.hit_curve = None
        self._last_m = 0.0
        if len(self.cache.wait_s):
            self.hit_sample = hit_sample or sample_sessions(spec, replica, sessions=sample.sessions,
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
        return s, evaluate(self.spec, self.replica.policy, s, c, self.replica.kv_capacity_bytes, agents)

    def _means(self, m: float, agents: int) -> tuple[float, float, float]:
        """(resident KV bytes, sessions per second, calls running) at miss share ``m``: means only, no
        tails (fast)."""
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
                       + mean("kv_tool")) / r
        assert self.hit_sample is not None     # only called where freed contexts are blended
        return kv + self.hit_sample.shared_prefix_kv_bytes, agents / r, loop.running_batch_mean

    def evaluate(self, agents: int) -> Evaluation:
        cap = self.replica.kv_capacity_bytes
        if self.hit_sample is None:
            return evaluate(self.spec, self.replica.policy, self.miss_sample, self.miss_curve, cap, agents,
                            self.prefill)
        def step(m: float) -> float:
            kv, sessions_per_s, running = self._means(m, agents)
            if self.slot_cache is not None:           # llama.cpp: freed contexts wait in idle slots
                return self.slot_cache.miss_share(m, sessions_per_s, self.max_batch - running)
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
