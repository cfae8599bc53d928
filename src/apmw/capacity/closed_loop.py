"""The closed-loop model of one replica: evaluate ``N`` agents, with the LRU prefix cache where it matters.

:class:`ClosedLoopModel` is what ``apmw plan``, the N* search and the levers ask "what happens at
``N`` agents". It samples the spec's sessions once, builds the replica's engine curve
(:mod:`apmw.capacity.engine_curve`), solves the closed network at ``N``
(:mod:`apmw.capacity.closed_network`) and reads tails and memory off the sample
(:mod:`apmw.capacity.evaluate`). Where the policy frees contexts at tool waits, it solves for the
prefix-cache miss share (:mod:`apmw.capacity.prefix_cache`) by blending two samples drawn with the
same seed, one with every freed context found and one with none; with llama.cpp's one prompt per
slot, from how often its slot is taken (:class:`apmw.capacity.prefix_cache.SlotSurvival`).

Under ``retain`` the engine keeps each context pinned over its tool wait only while memory allows
(:mod:`apmw.sim.kv_ledger`): when the agents' KV demand exceeds the pool, pins are spilled and
running calls preempted, and the next call of each prefills its whole prompt again. The share of
calls that lose their context is the share of time the demand exceeds the pool, read from the
same Gaussian the memory check uses (:func:`overflow_share`); the model blends two samples drawn
with the same seed, every context kept and every context lost, by that share (a fixed point: the
recomputed prompts slow every iteration, and the timings weigh the demand).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import fields, replace

import numpy as np

from apmw.capacity.closed_network import solve_at
from apmw.capacity.disaggregation import prefill_stage
from apmw.capacity.engine_curve import EngineCurve, engine_curve
from apmw.capacity.evaluate import Evaluation, evaluate
from apmw.capacity.kv_overflow import MIN_SHARE, overflow_share, spread_over_tasks
from apmw.capacity.prefill_queue import priced_on
from apmw.capacity.slo import check_slo
from apmw.capacity.quantiles import Tail
from apmw.capacity.prefix_cache import LruSurvival, SlotSurvival, frees_contexts
from apmw.capacity.sessions import (FREED_FOUND, RETAINED_LOST, SessionSample, sample_retained_pair,
                                    sample_session_pair, sample_sessions)
from apmw.errors import ApmwError
from apmw.perf import Replica
from apmw.spec import Spec
from apmw.spec.distribution import Z95

# The fewest batch sizes of an engine curve a model builds (more as the agents asked about need them).
FIRST_CURVE_ROWS = 32
# Fixed-point iterations on the miss share, and the change at which they stop.
MAX_ITERATIONS = 12
TOLERANCE = 2e-3
# Evaluations recently made, shared by models that differ in their batch limit alone (ClosedLoopModel.evaluate):
# a design-space search plans one replica and sample at several limits, and a plan's binding-constraint
# counterfactual raises it. Each holds its task-latency sample and, where contexts can be lost, its blended
# sample (1-2 MB). The bundled examples' default spaces reuse one at most 31 evaluations after it was made
# (72 % of their evaluations are reused; bench/README.md, shared_evaluations).
SHARED_EVALUATIONS = 64
_EVALUATIONS: OrderedDict[tuple, tuple[tuple[weakref.ref, ...], Evaluation]] = OrderedDict()


class _Blend:
    """Two like dataclasses blended field by field, ``hit + m (miss - hit)``, for any share ``m``: the numeric
    fields where they differ (the only ones worth blending), each difference worked out once."""

    def __init__(self, hit, miss):
        self.hit = hit
        self.diffs: dict[str, np.ndarray | float] = {}
        for f in fields(hit):
            a, b = getattr(hit, f.name), getattr(miss, f.name)
            if isinstance(a, np.ndarray) and a.dtype.kind == "f" and a.shape == b.shape and not np.array_equal(a, b):
                self.diffs[f.name] = b - a
            elif isinstance(a, float) and isinstance(b, float) and a != b:
                self.diffs[f.name] = b - a

    def at(self, m: float):
        hit = self.hit
        return replace(hit, **{name: getattr(hit, name) + m * d for name, d in self.diffs.items()})


def spills_retained(spec: Spec, replica: Replica) -> bool:
    """Whether contexts are pinned over tool waits and spilled when memory runs short (``retain``, or ``ttl``
    for the waits within its limit, with prefix caching, aggregated, without llama.cpp's slots). The model prices
    the spill where no context is freed (``ttl`` longer than every wait is ``retain``); where ``ttl`` also frees
    some, :func:`unpriced_overflow` says what is left out."""
    sv = spec.serving
    return (sv.tool_wait_kv_policy in ("retain", "ttl") and sv.prefix_caching and sv.disaggregation is None
            and not replica.policy.slot_prompt_cache)


def unpriced_overflow(spec: Spec, ev: Evaluation) -> str | None:
    """A warning where retained contexts would spill from the pool at ``ev`` but the model does not price it:
    disaggregated serving holds them in the decode workers' pool, and their re-prefill on the prefill instance
    is not modelled (:func:`spills_retained` is aggregated only). None where nothing spills or it is priced."""
    sv = spec.serving
    disaggregated = sv.tool_wait_kv_policy == "retain" and sv.prefix_caching and sv.disaggregation is not None
    ttl_freeing = sv.tool_wait_kv_policy == "ttl" and ev.freed_context_hit_rate is not None
    if not (disaggregated or ttl_freeing):
        return None
    m = overflow_share(ev.kv_bytes_resident_mean, ev.kv_bytes_resident_p95, ev.kv_capacity_bytes)
    if m < MIN_SHARE:
        return None
    if ttl_freeing:
        return (f"the contexts ttl keeps over tool waits exceed the KV pool {m:.1%} of the time at {ev.agents} "
                "agents; apmw prices the contexts ttl frees to the prefix cache, but not the spill of those it "
                "keeps, so the task latency here is optimistic by their re-prefill")
    return (f"the agents' retained KV exceeds the decode pool {m:.1%} of the time at {ev.agents} agents; the calls "
            "whose contexts it spills prefill them again, which apmw prices for an aggregated replica but not "
            "with disaggregated prefill, so the task latency here is optimistic by that re-prefill")


def closed_loop_model(spec: Spec, replica: Replica) -> "ClosedLoopModel":
    """Sample the spec's sessions (both pricings where contexts are freed or spilled) and build the model."""
    if frees_contexts(spec):
        miss, hit = sample_session_pair(spec, replica)
        return ClosedLoopModel(spec, replica, miss, found_sample=hit)
    if spills_retained(spec, replica):
        kept, lost = sample_retained_pair(spec, replica)
        return ClosedLoopModel(spec, replica, kept, lost_sample=lost)
    return ClosedLoopModel(spec, replica, sample_sessions(spec, replica))


def _fixed_point(step, m0: float) -> float:
    """The share ``m`` in [0, 1] with ``m = step(m)``: secant steps from ``m0``, damped iteration where
    the secant stalls. ``m0`` depends on nothing but the point evaluated, so an N evaluated alone
    (``plan --agents N``) gets the answer the search got for it."""
    g0 = step(m0) - m0
    m1 = min(max(m0 + g0, 0.0), 1.0)
    for _ in range(MAX_ITERATIONS):
        g1 = step(m1) - m1
        if abs(g1) < TOLERANCE:
            break
        slope = (g1 - g0) / (m1 - m0) if m1 != m0 else -1.0
        m_next = m1 - g1 / slope if slope < 0 else m1 + 0.5 * g1
        m0, g0, m1 = m1, g1, min(max(m_next, 0.0), 1.0)
    return m1


class ClosedLoopModel:
    """Evaluates the closed loop at any N, with the share of contexts lost where the policy frees
    them (the LRU prefix cache) or spills them (KV overflow under ``retain``).

    ``sample`` is the spec's sessions as the policy prices them. Where a share ``m`` of contexts
    can be lost, the model blends ``found`` (every context found) and ``lost`` (every one lost):
    under ``evict`` the policy's own pricing is the lost one, under ``retain`` the found one.
    """

    def __init__(self, spec: Spec, replica: Replica, sample: SessionSample, max_batch: int | None = None,
                 found_sample: SessionSample | None = None, lost_sample: SessionSample | None = None):
        sample = priced_on(replica.step, sample)
        self.spec, self.replica, self.sample = spec, replica, sample
        self.max_batch = max_batch or replica.policy.max_batch
        self.prefill = prefill_stage(spec, replica, sample)
        self.mixed = replica.policy.mixed_prefill
        self.recv_interval, self.token_budget = replica.policy.recv_interval, replica.policy.token_budget
        self.slots = replica.policy.slot_prompt_cache
        self.cache = LruSurvival.from_sample(sample)
        self.slot_cache = SlotSurvival.from_sample(sample) if self.slots else None
        if self.prefill is not None and len(self.cache.wait_s):
            raise ApmwError("serving.disaggregation together with a policy that frees contexts at tool waits "
                            f"('{spec.serving.tool_wait_kv_policy}') is not modelled yet; use retain or offload")
        self.frees = bool(len(self.cache.wait_s))
        self.spills = not self.frees and spills_retained(spec, replica)
        self.found = self.lost = None
        if self.frees:
            self.found = priced_on(replica.step, found_sample or sample_sessions(spec, replica, sessions=sample.sessions,
                                                                               variant=FREED_FOUND))
            self.lost = sample
        elif self.spills:
            self.found = sample
            self.lost = priced_on(replica.step, lost_sample or sample_sessions(spec, replica, sessions=sample.sessions,
                                                                             variant=RETAINED_LOST))
        if self.found is not None and self.lost is not None:
            self._samples = _Blend(self.found, self.lost)
            names = ("calls", "tool_s", "kv_transfer_s", "prefill_iters", "decode_iters", "kv_q", "kv_prefill",
                     "kv_decode", "kv_tool")
            self._found_means = {n: float(getattr(self.found, n).mean()) for n in names}
            self._lost_means = {n: float(getattr(self.lost, n).mean()) for n in names}
        self._rows = 0
        self._curves_to(1)
        self._priced = tuple(o for o in (self.sample, self.found, self.lost, replica.step) if o is not None)
        self._alike = None if self.slots else _alike_but_batch_limit(spec, replica, self._priced)

    def _curves_to(self, agents: int) -> None:
        """The engine curves (of each sample the model prices) built to the rows the loop at ``agents`` reads: the
        first ``agents`` (:func:`apmw.capacity.closed_network.solve_at`), rounded up to a power of two (at least
        ``FIRST_CURVE_ROWS``), so that a search galloping up from one agent extends them a few times and builds at
        most twice the rows it reads. A batch limit far above the agents asked about (vLLM's 1,024, SGLang's sized
        from the KV pool: thousands per attention-DP rank) costs no rows unread; each row depends on its batch
        size alone, so the answer is the same however far the rows were built."""
        rows = min(self.max_batch, max(FIRST_CURVE_ROWS, 1 << (max(agents, 1) - 1).bit_length()))
        if rows <= self._rows:
            return
        self._rows = rows

        def curve_of(s: SessionSample, decode_only: bool = False) -> EngineCurve:
            c = engine_curve(self.replica.step, s, rows, decode_only=decode_only, mixed=self.mixed,
                             recv_interval=self.recv_interval, token_budget=self.token_budget)
            return c if rows == self.max_batch else replace(c, limit=self.max_batch)

        self.curve = curve_of(self.sample, decode_only=self.prefill is not None)
        if self.found is not None and self.lost is not None:     # the policy's own sample has its curve
            self.found_curve = self.curve if self.found is self.sample else curve_of(self.found)
            self.lost_curve = self.curve if self.lost is self.sample else curve_of(self.lost)
            self._curves = _Blend(self.found_curve, self.lost_curve)

    def with_max_batch(self, max_batch: int) -> "ClosedLoopModel":
        """The same model with another batch limit (the binding-constraint counterfactual)."""
        found = self.found if self.frees else None
        lost = self.lost if self.spills else None
        return ClosedLoopModel(self.spec, self.replica, self.sample, max_batch, found, lost)

    def _at(self, m: float, agents: int) -> tuple[SessionSample, Evaluation]:
        """The loop with a share ``m`` of contexts lost (the KV demand read off the kept contexts
        where they are spilled)."""
        assert self.found is not None and self.lost is not None
        s = self._samples.at(m)
        c: EngineCurve = self._curves.at(m)
        iters = s.call_prefill_iters + s.call_decode_iters
        c = replace(c, completion_rate=c.batch / (iters * c.iteration_s), iterations_per_call=iters)
        demand = self.found if self.spills else None
        return s, evaluate(self.spec, self.replica.policy, s, c, self.replica.kv_capacity_bytes, agents,
                           demand=demand)

    def _means(self, m: float, agents: int) -> tuple[float, float, float]:
        """(resident KV bytes, sessions per second, calls running) at a share ``m`` of freed contexts
        lost: means only, no tails (fast)."""
        h, x = self._found_means, self._lost_means
        mean = lambda name: h[name] + m * (x[name] - h[name])  # noqa: E731
        c: EngineCurve = self._curves.at(m)
        iters = c.iterations_per_call
        c = replace(c, completion_rate=c.batch / (iters * c.iteration_s))
        calls = mean("calls")
        loop = solve_at(c, (mean("tool_s") + mean("kv_transfer_s")) / calls, agents)
        wq, t_pf, t_dec = loop.queue_per_call_s, loop.prefill_iteration_s, loop.decode_iteration_s
        r = (wq * calls + mean("prefill_iters") * t_pf + mean("decode_iters") * t_dec + mean("tool_s")
             + mean("kv_transfer_s"))
        kv = agents * (mean("kv_q") * wq + mean("kv_prefill") * t_pf + mean("kv_decode") * t_dec
                       + mean("kv_tool")) / r
        assert self.found is not None
        return kv + self.found.shared_prefix_kv_bytes, agents / r, loop.running_batch_mean

    def _spread(self, m: float, ev: Evaluation, kept: Evaluation) -> Evaluation:
        """``ev`` (every task at the mean overflow share ``m``) with each task's own share of the
        overflow episodes in its tail (:mod:`apmw.capacity.kv_overflow`); ``kept`` is the loop
        with no overflow."""
        sd = (ev.kv_bytes_resident_p95 - ev.kv_bytes_resident_mean) / Z95
        if sd <= 0:
            return ev
        k = self.found
        assert k is not None
        hold_s = (ev.queue_s / k.mean_calls + k.timeline_prefill_iters * ev.loop.prefill_iteration_s
                  + k.timeline_decode_iters * ev.loop.decode_iteration_s + k.timeline_wait_s)
        z = (ev.kv_capacity_bytes - ev.kv_bytes_resident_mean) / sd
        samples = spread_over_tasks(m, z, kept.task_latency_samples_s, ev.task_latency_samples_s, k.timeline_kv_bytes, hold_s,
                                    k.exposure_uniform)
        verdict = check_slo(self.spec.slo, Tail(samples, 0.95), Tail(lambda: ev.ttft_samples_s, 0.95), ev.tpot_p95_s)
        return replace(ev, slo=verdict, meets_latency=verdict.meets, task_latency_samples_s=samples)

    def evaluate(self, agents: int) -> Evaluation:
        """The loop at ``agents``. Below the batch limit the limit is never reached, and every part of the loop
        reads the engine curve's rows up to ``agents`` alone (:func:`apmw.capacity.closed_network.solve_at`), so
        a model that differs from this one in its limit alone, above ``agents`` too, gives the same evaluation:
        the one it made is returned (llama.cpp's slots, whose idle ones hold freed prompts, excepted)."""
        if self._alike is None or agents >= self.max_batch:
            return self._evaluate(agents)
        key = (self._alike, agents)
        kept = _EVALUATIONS.get(key)
        if kept is not None and all(ref() is o for ref, o in zip(kept[0], self._priced)):
            _EVALUATIONS.move_to_end(key)
            return kept[1]
        ev = self._evaluate(agents)
        _EVALUATIONS[key] = (tuple(weakref.ref(o) for o in self._priced), ev)
        while len(_EVALUATIONS) > SHARED_EVALUATIONS:
            _EVALUATIONS.popitem(last=False)
        return ev

    def _evaluate(self, agents: int) -> Evaluation:
        self._curves_to(agents)
        cap = self.replica.kv_capacity_bytes
        if self.frees:
            def freed_lost(m: float) -> float:
                kv, sessions_per_s, running = self._means(m, agents)
                if self.slot_cache is not None:       # llama.cpp: freed contexts wait in idle slots
                    return self.slot_cache.miss_share(m, sessions_per_s, self.max_batch - running)
                return self.cache.miss_share(self.cache.characteristic_time(cap - kv, sessions_per_s))

            m = _fixed_point(freed_lost, 0.0)
            s, ev = self._at(m, agents)
            return replace(ev, freed_context_hit_rate=1.0 - m,
                           prefill_tokens_per_session=float(s.prefill_tokens.mean()))
        if self.spills:
            def spilled(m: float) -> float:
                ev = self._at(m, agents)[1]
                return overflow_share(ev.kv_bytes_resident_mean, ev.kv_bytes_resident_p95, cap)

            assert self.found is not None
            kept = self._at(0.0, agents)[1]
            m = overflow_share(kept.kv_bytes_resident_mean, kept.kv_bytes_resident_p95, cap)
            if m < MIN_SHARE:             # memory is ample: every context is kept
                return replace(kept, kv_overflow_share=m,
                               prefill_tokens_per_session=float(self.found.prefill_tokens.mean()))
            m = _fixed_point(spilled, m)
            s, ev = self._at(m, agents)
            return replace(self._spread(m, ev, kept), kv_overflow_share=m,
                           prefill_tokens_per_session=float(s.prefill_tokens.mean()))
        return evaluate(self.spec, self.replica.policy, self.sample, self.curve, cap, agents, self.prefill)


def _alike_but_batch_limit(spec: Spec, replica: Replica, priced: tuple) -> tuple:
    """What a closed-loop model's evaluations depend on but its batch limit: the samples and step model it prices
    (by identity: a process keeps them, apmw.capacity.sessions and apmw.perf.replica), the spec and the resolved
    serving policy with their limits left out, and the KV pool."""
    unlimited = spec.model_copy(update={"serving": spec.serving.model_copy(update={"max_batch": None})})
    return (tuple(id(o) for o in priced), unlimited.model_dump_json(), repr(replace(replica.policy, max_batch=0)),
            replica.kv_capacity_bytes)
