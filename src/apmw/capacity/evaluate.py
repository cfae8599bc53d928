"""Everything the planner reports about a replica at a given number of agents.

The mean task time comes from the closed-loop solve. The SLO is a tail, so the
task-time distribution comes from the sampled sessions: session ``s`` takes

    R_s = Wq * G_s + (prefill_iters_s + decode_iters_s) * t_iter + tool_s + kv_transfer_s

where ``Wq`` and ``t_iter`` are the solved mean queue wait per call and time per
iteration at this ``N``, and ``G_s ~ Gamma(calls_s, 1)`` is the sum of the
session's per-call queue waits taken as exponential. The spread therefore comes
from the workload itself (steps per task, tokens per call, tool waits) plus
queueing; iteration-to-iteration jitter of the engine is what ``apmw simulate``
adds. The mean of ``R_s`` over sessions equals the closed-loop mean by construction.

TTFT is a call's wait for a batch slot, for the iteration in flight and the one already
scheduled (where the engine schedules ahead), its wait behind other prompts' prefill (an M/G/1
queue with the exact law of its wait: :mod:`apmw.capacity.prefill_queue`) and its own prefill; the
mean of these waits also joins the per-call queue time of the task. A call finds the loop at one
agent fewer (the arrival theorem). The per-call TTFT draws are made when a check or a report reads them.

Resident KV follows from Little's law: each agent holds on average
``KV-byte-seconds per session / R`` bytes, so the replica holds ``N`` times that
plus the shared prefix once. The memory check uses a 95th percentile: agents are
independent, so the total's variance is ``N`` times one agent's time-averaged
variance.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import Callable

import numpy as np
from scipy.special import ndtr

from apmw.capacity.closed_network import LoopState, solve_at
from apmw.capacity.engine_curve import EngineCurve
from apmw.capacity.prefill_queue import own_prefill_s, prefill_queue
from apmw.capacity.disaggregation import PrefillStage
from apmw.capacity.quantiles import Tail, quantile
from apmw.capacity.sessions import SessionSample
from apmw.capacity.slo import SloVerdict, check_slo
from apmw.perf.parallelism import layout_of
from apmw.perf.serving_policy import ServingPolicy, busy_arrival_wait_s
from apmw.spec import Spec
from apmw.spec.distribution import Z95


# Fixed-point iterations for the prefill queue, and the wait reported when it saturates.
PREFILL_FIXED_POINT_ITERATIONS = 30
SATURATED_WAIT_S = 1e6


@dataclass(frozen=True)
class Evaluation:
    agents: int
    loop: LoopState
    task_latency_mean_s: float
    queue_s: float
    prefill_s: float
    decode_s: float
    tool_s: float
    kv_transfer_s: float        # KV over a link: offloaded KV reloaded after tool waits, the prefill workers' hand-off
    tpot_p95_s: float
    kv_bytes_resident_mean: float
    kv_bytes_resident_p95: float
    kv_capacity_bytes: float
    session_throughput_per_s: float
    meets_latency: bool
    fits_memory: bool
    slo: SloVerdict
    # set by capacity.closed_loop where contexts are freed at tool waits
    freed_context_hit_rate: float | None = None
    # set by capacity.closed_loop under retain: share of calls whose retained context was spilled
    # because the agents' KV demand exceeded the pool (they prefill their whole prompt again)
    kv_overflow_share: float | None = None
    prefill_tokens_per_session: float | None = None
    # set with disaggregated prefill: busy share of the prefill instance
    prefill_utilisation: float | None = None
    # each sampled session's task latency (the tail above is read off it)
    task_latency_samples_s: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False, compare=False)
    # draws each sampled call's time to first token (the tail calls), when first read (ttft_samples_s)
    ttft_draw: Callable[[], np.ndarray] | None = field(default=None, repr=False, compare=False)

    # The tails are read off the samples when asked (the SLO verdict above counts instead: a search asks
    # only whether they hold at most agent counts it visits).
    @cached_property
    def task_latency_p50_s(self) -> float:
        return quantile(self.task_latency_samples_s, 0.5)

    @cached_property
    def task_latency_p95_s(self) -> float:
        return quantile(self.task_latency_samples_s, 0.95)

    @cached_property
    def task_latency_p99_s(self) -> float:
        return quantile(self.task_latency_samples_s, 0.99)

    @cached_property
    def ttft_samples_s(self) -> np.ndarray:
        """Each sampled call's time to first token (the TTFT p95 below is read off it)."""
        return self.ttft_draw() if self.ttft_draw is not None else np.zeros(0)

    @cached_property
    def ttft_p95_s(self) -> float:
        return quantile(self.ttft_samples_s, 0.95)

    @property
    def feasible(self) -> bool:
        return self.meets_latency and self.fits_memory


def prefill_keeps_up(prefill_utilisation: float | None) -> bool:
    """A disaggregated prefill instance busy all the time has an unbounded queue: no latency SLO holds
    there, whatever the sampled p95s say (None: prefill runs on the replica)."""
    return prefill_utilisation is None or prefill_utilisation < 1.0


def _prefill_wait(curve: EngineCurve, think: float, agents: int, stage: PrefillStage,
                  transfer_s: float) -> tuple[LoopState, float, float]:
    """Decode loop, prefill-queue wait and prefill utilisation at the fixed point (disaggregation)."""
    wait, rho = 0.0, 0.0
    per_call = stage.call_service_s + transfer_s
    for _ in range(PREFILL_FIXED_POINT_ITERATIONS):
        loop = solve_at(curve, think + per_call + wait, agents)
        target, rho = stage.wait_s(loop.call_throughput_per_s)
        target = min(target, SATURATED_WAIT_S)
        if abs(target - wait) <= 1e-6 + 1e-3 * wait:
            break
        wait = 0.5 * (wait + target)
    return loop, wait, min(rho, 1.0)


def per_call_tpot_p95_s(loop: LoopState, decode_iters: np.ndarray) -> float:
    """The 95th percentile over calls of the time per decode iteration.

    Two spreads, taken as independent and added as such (root sum of squares of each one's p95 less the
    mean): the batch size the loop runs at (``loop.iteration_p95_s``, token-weighted), and which of one
    call's ``n`` decode iterations carry other calls' prompts: where prompts ride beside the decodes, how
    many chunks each iteration holds; where prefill iterations run alone (SGLang), how many of them
    follow each decode iteration (``loop.stall_variance_s2``, the variance per decode iteration). Summed
    over a call's decode iterations, its share of the time per iteration has a spread of
    ``sqrt(variance / n)``: short calls meet a few such iterations, or none, and are the slow and the fast ones.
    ``decode_iters``: the sampled calls' decode iterations (calls with none have no time per token).
    """
    batch = max(loop.iteration_p95_s - loop.decode_iteration_s, 0.0)
    if loop.stall_variance_s2 <= 0:
        return loop.iteration_p95_s
    stalls = np.sqrt(loop.stall_variance_s2) * stall_spread_p95(decode_iters)
    return loop.decode_iteration_s + float(np.hypot(batch, stalls))


# Bisection steps for the spread's 95th percentile (a quantile of a standard normal scaled by 1/sqrt(n)).
SPREAD_BISECTIONS = 50
_SPREADS: dict[int, tuple[weakref.ref, float]] = {}


def stall_spread_p95(decode_iters: np.ndarray) -> float:
    """The 95th percentile of ``Z / sqrt(n)`` over the calls (``Z`` standard normal, ``n`` a call's decode
    iterations, calls with at least one): the p95 of the stall spread per unit standard deviation. The
    same sample gives the same value at every agent count, so it is kept for the sample's array."""
    key = id(decode_iters)
    kept = _SPREADS.get(key)
    if kept is not None and kept[0]() is decode_iters:
        return kept[1]
    n, count = np.unique(decode_iters[decode_iters >= 1], return_counts=True)
    if not len(n):
        return 0.0
    root, share = np.sqrt(n), count / count.sum()
    lo, hi = 0.0, 10.0
    for _ in range(SPREAD_BISECTIONS):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if float((share * ndtr(mid * root)).sum()) < 0.95 else (lo, mid)
    if len(_SPREADS) > 64:
        _SPREADS.clear()
    _SPREADS[key] = (weakref.ref(decode_iters), hi)
    return hi


def own_prefill_on_rank_s(s: SessionSample, loop: LoopState, chunk_tokens: int) -> np.ndarray:
    """Each sampled call's own prefill iterations under attention data parallelism: every one but the last
    carries a full chunk (``chunk_tokens``, its rank's budget) at ``loop.full_chunk_iteration_s``, the last the
    rest. A chunk of ``c`` tokens is priced on the line through no chunk (a decode iteration) and the mean
    chunk up to the mean, and on the line from there to the full chunk beyond: the iteration waits for the
    busiest rank, so a chunk that outweighs the other ranks' costs more per token than one that does not
    (docs/simulate.md, "A call's own chunk under attention DP")."""
    t_dec, t_mean, t_full = loop.decode_iteration_s, loop.prefill_iteration_s, loop.full_chunk_iteration_s
    mean = s.call_prefill_tokens / s.call_prefill_iters
    tokens, iters = s.call_prefill_tokens_sample, s.call_prefill_iters_sample
    full = np.maximum(iters - 1.0, 0.0)
    rest = tokens - full * chunk_tokens
    base = min(t_dec, t_mean)
    below = base + rest * ((t_mean - base) / mean)
    above = t_mean + (rest - mean) * (max(t_full - t_mean, 0.0) / max(chunk_tokens - mean, 1e-9))
    last = np.where(iters > 0, np.where(rest <= mean, below, above), 0.0)
    return full * t_full + last


def evaluate(spec: Spec, policy: ServingPolicy, s: SessionSample, curve: EngineCurve, kv_capacity_bytes: float,
             agents: int, prefill: PrefillStage | None = None, demand: SessionSample | None = None) -> Evaluation:
    """The closed loop at ``agents``; with ``prefill`` the prefill runs on its own instance
    (``curve`` must then be decode-only). The memory check reads the KV of ``demand`` (default
    ``s``) at these timings: the contexts the agents would hold if every one fitted."""
    think = float((s.tool_s.sum() + s.kv_transfer_s.sum()) / s.calls.sum())
    ranks = layout_of(spec.serving, spec.hardware.gpus_per_replica).dp     # attention data-parallel ranks
    # prompts ride beside decodes on their own ranks (the engine curve prices their full chunks there)
    on_ranks = prefill is None and ranks > 1 and policy.mixed_prefill
    rank_budget = policy.token_budget // ranks          # a rank's chunk (apmw.perf.Replica.chunk_tokens)
    prefill_wait, prefill_util = 0.0, None
    if prefill is None:
        loop = solve_at(curve, think, agents)
    else:
        loop, prefill_wait, prefill_util = _prefill_wait(curve, think, agents, prefill,
                                                         s.call_prefill_tokens * prefill.transfer_per_token_s)
    wq, t_pf, t_dec = loop.queue_per_call_s, loop.prefill_iteration_s, loop.decode_iteration_s
    if prefill is None:
        # A prefill iteration costs a decode iteration plus its chunk's tokens: split the mean
        # prefill iteration so that each call pays for its own prompt (long prompts, long TTFT).
        # (Where prefill runs alone, SGLang, the same split matches the simulated TTFT p95 on the
        # examples better than a tangent at the mean chunk: 60 vs 40 ms for 59 ms simulated on
        # coding-agent at 20 agents, 4.90 vs 4.71 s for 4.8-5.2 s on support-chat.)
        # The base is the iteration without the other calls' prompt chunks: the work of the prompts that share the
        # engine with it is the prefill queue's wait below, and counted in the base as well it was counted twice
        # (every call a long prompt with no decode: two agents' calls waited 8 s where the simulator gives 0.4 s).
        chunk = s.call_prefill_tokens / s.call_prefill_iters
        per_prefill_token = max(t_pf - t_dec, 0.0) / chunk
        own_base = t_pf - per_prefill_token * chunk
        t_base = min(own_base, loop.decode_alone_iteration_s)
        if t_base < own_base:   # the KV a call holds while it prefills follows the same base
            t_pf = t_base + per_prefill_token * chunk
        # ... and waits for a batch slot, then behind the prompts that arrived before it: on its own attention-DP
        # rank, whose busy queue moves a rank's budget per full-chunk iteration, with that rank's share of calls
        # A call finds the engine as the other agents leave it (the arrival theorem: the loop at one agent
        # fewer); a lone agent's call finds it idle.
        seen = solve_at(curve, think, agents - 1) if agents > 1 else None
        seen_calls_per_s = seen.call_throughput_per_s if seen else 0.0
        # at most the other agents' prompts are ahead of it (on a rank, those whose calls go to that rank)
        if on_ranks:
            queued = prefill_queue(s, seen_calls_per_s / ranks, 0.0, loop.full_chunk_iteration_s, rank_budget,
                                   spec.seed, most_ahead=math.ceil(agents / ranks) - 1)
        else:
            queued = prefill_queue(s, seen_calls_per_s, per_prefill_token, t_base, policy.token_budget, spec.seed,
                                   most_ahead=agents - 1)
        prefill_wait = queued.mean_s
        # a call that finds the engine busy waits for the iteration in flight (half of one on
        # average; half of the span between the scheduler's polls where it polls less often) and,
        # where the engine schedules ahead, for the one already scheduled
        # (apmw.perf.serving_policy; the simulator does the same). With disaggregated prefill (below)
        # the prefill instance's own queue model stands in for it.
        arrival_wait = (seen.engine_utilisation if seen else 0.0) * busy_arrival_wait_s(
            loop.iteration_s, policy.iterations_ahead, policy.recv_interval)
        prefill_wait += arrival_wait
        wait_before = wq

        def ttft_wait() -> np.ndarray:
            return wait_before * s.call_queue_exp + queued.waits_s() + arrival_wait
    else:
        per_prefill_token = prefill.per_token_s + prefill.transfer_per_token_s
        t_base = prefill.per_iteration_s
        t_pf = (t_base * s.call_prefill_iters + per_prefill_token * s.call_prefill_tokens) / s.call_prefill_iters
        wait_s = wq + prefill_wait

        def ttft_wait() -> np.ndarray:
            return wait_s * s.call_queue_exp
    wq = wq + prefill_wait
    session_prefill = s.prefill_iters * t_base + s.prefill_tokens * per_prefill_token
    samples = wq * s.queue_gamma + session_prefill + s.decode_iters * t_dec + s.tool_s + s.kv_transfer_s
    queue = wq * s.mean_calls
    prefill_s = float(session_prefill.mean())
    decode = float(s.decode_iters.mean()) * t_dec
    tool, transfer = float(s.tool_s.mean()), float(s.kv_transfer_s.mean())
    mean_r = queue + prefill_s + decode + tool + transfer
    # the prefill workers' KV hand-off is a transfer over a link, not prefill: the breakdown says so
    handoff = 0.0 if prefill is None else prefill.transfer_per_token_s * float(s.prefill_tokens.mean())
    prefill_s, transfer = prefill_s - handoff, transfer + handoff

    d = demand or s
    per_agent_kv = float((d.kv_q.mean() * wq + d.kv_prefill.mean() * t_pf + d.kv_decode.mean() * t_dec
                          + d.kv_tool.mean()) / mean_r)
    per_agent_kv2 = float((d.kv2_q.mean() * wq + d.kv2_prefill.mean() * t_pf + d.kv2_decode.mean() * t_dec
                           + d.kv2_tool.mean()) / mean_r)
    variance = max(per_agent_kv2 - per_agent_kv**2, 0.0)
    # Attention data-parallel ranks each hold their own requests' KV in a pool of their own (and their
    # own copy of the shared prefix): each rank's demand, over agents / ranks agents, must fit its share
    # of the pool, so the spread counts sqrt(ranks) times more against the whole than one pool's would.
    kv_mean = agents * per_agent_kv + ranks * d.shared_prefix_kv_bytes
    kv_p95 = kv_mean + Z95 * np.sqrt(agents * variance * ranks)

    @cache
    def ttft() -> np.ndarray:
        """Each sampled call's TTFT: drawn when a check or a report first reads it."""
        if on_ranks:
            return ttft_wait() + own_prefill_on_rank_s(s, loop, rank_budget)
        if prefill is None:
            return ttft_wait() + own_prefill_s(s, t_base, per_prefill_token)
        return ttft_wait() + s.call_prefill_iters_sample * t_base + s.call_prefill_tokens_sample * per_prefill_token
    tpot_p95 = per_call_tpot_p95_s(loop, s.call_decode_iters_sample) / s.accepted_tokens_per_iteration
    verdict = check_slo(spec.slo, Tail(samples, 0.95), Tail(ttft, 0.95), tpot_p95)
    return Evaluation(
        agents=agents, loop=loop,
        task_latency_mean_s=mean_r,
        queue_s=queue, prefill_s=prefill_s, decode_s=decode, tool_s=tool, kv_transfer_s=transfer,
        tpot_p95_s=tpot_p95,
        kv_bytes_resident_mean=kv_mean, kv_bytes_resident_p95=float(kv_p95), kv_capacity_bytes=kv_capacity_bytes,
        session_throughput_per_s=agents / mean_r,
        meets_latency=verdict.meets and prefill_keeps_up(prefill_util),
        fits_memory=bool(kv_p95 <= kv_capacity_bytes), slo=verdict,
        prefill_utilisation=prefill_util, task_latency_samples_s=samples, ttft_draw=ttft,
    )
