"""A call's own prefill and its wait behind other prompts' prefill, call by call.

**Its own prefill.** The engine curve prices the mean call at each load (its prefill iterations at the
mean chunk); what sets calls apart is priced by the step model call by call, once per sample
(``SessionSample.call_prefill_alone_s_sample``: each sampled call's chunks run alone, at its own
attention FLOPs and cached context). A chunk attends to the context before it, so a prompt's
attention grows with the square of its length: on support-chat's Llama-3.1-70B on 2 x H100 the
longest sampled prompts (past 300,000 tokens) take about 360 s, where a line through the mean chunk
gives 65 s, and the common ones take less than the line says (p95 3.2 s against 3.7 s; the simulator,
which prices every chunk, gives 2.9-3.3 s at one agent). Each call gets its share of the curve's total, so
the closed loop's mean is the curve's.

**Its wait.** A chunked-prefill engine gives waiting prompts its token budget first come, first
served, so a new prompt waits for the prefill work ahead of it: an M/G/1 queue whose service is the
work one call's prefill puts in it. Prompts share iterations, so that is not the call's time alone:
its attention to its own context, as the step model prices it (``SessionSample.call_prefill_attention_s_sample``),
and the rest of the curve's line by its tokens (:func:`queued_work_s`). The wait is the work found
queued, and its law is exact (Pollaczek-Khinchine):
none with probability ``1 - rho``, else the sum of ``K`` residual services, ``P(K >= k) = rho^k``,
a residual being a service drawn by its length (the one in progress when the prompt arrives) times a
uniform share of it still to run. Its mean is ``lambda E[S^2] / (2 (1 - rho))``. With heavy-tailed
prompts the sum is heavy-tailed too (one long prompt holds the budget for minutes, and every prompt
that arrives meanwhile waits behind it), which an exponential of the same mean does not carry: on
support-chat at 4 x H100 and 75-115 agents the exponential put the TTFT p95 at 3.8-5.0 s where the
simulator gives 5.3-9.7 s (docs/simulate.md, "Long prompts in the prefill queue").

**A closed population.** ``N`` agents each have at most one call in flight, so a prompt finds at most ``N - 1``
others ahead of it (``most_ahead``; on an attention-DP rank, the other agents whose calls go to that rank): ``K``
is the geometric law cut there, ``P(K >= k) = rho^k`` for ``k <= N - 1`` and 0 beyond, and the mean wait is the
Pollaczek-Khinchine mean times ``1 - rho^(N-1)``. Where prompts are long and nothing else keeps the engine busy
(8,000-token prompts, one output token, no tool wait: every call is a prefill), ``rho`` nears 1 and the
uncut law put a call behind dozens of prompts at two agents, 8 s where the simulator gives 0.4 s (fuzz round 7).
The cut changes nothing where ``rho^(N-1)`` is below a float's resolution; where ``N`` is small and the queue
busy it brings the plan toward the simulator (docs/simulate.md, "A closed population").
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from apmw.perf.step import IterationLoad, StepModel
from apmw.spec.distribution import stratified_uniforms

# Highest share of time the prefill queue may be busy; the closed loop already bounds the engine's
# throughput, this only keeps the queue finite.
MAX_PREFILL_QUEUE_UTILISATION = 0.95
# At most this many residuals a wait (P(K > 2048) is below 1e-45 at the utilisation cap).
MAX_QUEUED = 2048


def prefill_alone_s(step: StepModel, iters: np.ndarray, tokens: np.ndarray, attention_flops: np.ndarray,
                    kv_read_bytes: np.ndarray) -> np.ndarray:
    """Each call's prefill iterations run alone on the replica (no decodes beside them): each iteration at the
    call's mean chunk, its share of the call's attention FLOPs and the cached context it reads."""
    iters = np.maximum(iters, 1.0)
    load = IterationLoad(decode_seqs=np.zeros(len(iters)), prefill_tokens=tokens / iters,
                         kv_read_bytes=kv_read_bytes, attention_flops=attention_flops / iters)
    return iters * np.asarray(step.iteration_time_s(load), dtype=float)


# Samples priced on a replica lately: (sample, step model, the priced sample), the most recent last.
_PRICED: OrderedDict[tuple[int, int], tuple[object, object, object]] = OrderedDict()
PRICED_CACHE_ENTRIES = 16


def priced_on(step: StepModel, s):
    """``s`` (a SessionSample) with its tail calls' prefill priced by ``step`` (``call_prefill_alone_s_sample``
    and ``call_prefill_attention_s_sample``): the same object for the same sample and step model (closed-loop
    models compare samples by identity), a copy sharing every other array. A sample is drawn once for every
    replica that serves the workload; this is what differs."""
    key = (id(s), id(step))
    kept = _PRICED.get(key)
    if kept is not None and kept[0] is s and kept[1] is step:
        _PRICED.move_to_end(key)
        return kept[2]
    iters, tokens = s.call_prefill_iters_sample, s.call_prefill_tokens_sample
    alone = prefill_alone_s(step, iters, tokens, s.call_prefill_attn_flops_sample, s.call_prefill_kv_bytes_sample)
    flat = prefill_alone_s(step, iters, tokens, np.zeros(len(iters)), np.zeros(len(iters)))
    attention = np.maximum(alone - flat, 0.0)        # what its attention to its own context adds
    for a in (alone, attention):
        a.flags.writeable = False
    priced = replace(s, call_prefill_alone_s_sample=alone, call_prefill_attention_s_sample=attention)
    _PRICED[key] = (s, step, priced)
    while len(_PRICED) > PRICED_CACHE_ENTRIES:
        _PRICED.popitem(last=False)
    return priced


def shared_out(shape_s: np.ndarray, line_s: np.ndarray) -> np.ndarray:
    """``line_s``'s total, shared out over the calls as ``shape_s`` (the step model's call-by-call prices) has
    it; ``line_s`` itself where the shape prices nothing."""
    assert shape_s is not None, "a sample's calls are priced on a replica (priced_on) before it is evaluated"
    total = float(shape_s.sum())
    return shape_s * (float(line_s.sum()) / total) if total > 0 else line_s


def queued_work_s(attention_s: np.ndarray, tokens: np.ndarray, total_s: float) -> np.ndarray:
    """The work each call puts in the prefill queue, ``total_s`` in all: its attention to its own context as the
    step model prices it, and the rest of the total by its tokens. Prompts share iterations, so a call's share
    of an iteration's weights read and launches goes by its tokens (a 26-token follow-up holds 26/8,192 of
    one), not its time alone; its attention is its own, and grows with the square of its length."""
    assert attention_s is not None, "a sample's calls are priced on a replica (priced_on) before it is evaluated"
    attention_s = attention_s * min(1.0, total_s / max(float(attention_s.sum()), 1e-300))
    rest = max(total_s - float(attention_s.sum()), 0.0)
    return attention_s + tokens * (rest / max(float(tokens.sum()), 1e-300))


def own_prefill_s(s, base_s: float, per_prefill_token_s: float) -> np.ndarray:
    """Each sampled call's own prefill at this load: the curve's line (``base_s`` an iteration plus
    ``per_prefill_token_s`` a token) prices their total, the step model each one's share of it."""
    line = s.call_prefill_iters_sample * base_s + s.call_prefill_tokens_sample * per_prefill_token_s
    return shared_out(s.call_prefill_alone_s_sample, line)


@dataclass(frozen=True)
class PrefillQueue:
    """The wait behind other prompts' prefill at one load (module docstring): its mean, the share of time the
    queue is busy, and the calls' services its draws read. The draws cost more than the rest of an
    evaluation, and only a TTFT read needs them, so they are made when asked."""

    mean_s: float
    utilisation: float
    services_s: np.ndarray
    seed: int
    most_ahead: int = MAX_QUEUED      # the other calls that can be queued at all (module docstring)

    def waits_s(self) -> np.ndarray:
        """One draw of the wait per sampled call, from its exact law."""
        svc, rho = self.services_s, self.utilisation
        if rho <= 0:
            return np.zeros(len(svc))
        queued = np.minimum(np.floor(_log_uniforms(self.seed, len(svc)) / math.log(rho)),
                            min(MAX_QUEUED, self.most_ahead)).astype(np.int64)
        waiting = np.flatnonzero(queued)
        if not len(waiting):
            return np.zeros(len(svc))
        # call j's i-th residual: a service drawn by its length times the share of it left, from unit draws that
        # depend on (seed, j, i) alone, so a call's wait only grows as the queue does
        runs = queued[waiting]
        first = np.cumsum(runs) - runs                  # where each waiting call's run starts among the residuals
        counter = 2 * (np.arange(int(runs.sum())) + np.repeat(waiting * MAX_QUEUED - first, runs))
        cdf = np.cumsum(svc)
        by_length = unit_draws(self.seed, counter) * cdf[-1]
        order = np.argsort(by_length)           # searched in order: several times faster than scattered
        picked = np.empty(len(counter), dtype=np.int64)
        picked[order] = np.searchsorted(cdf, by_length[order], side="right")
        residuals = svc[np.minimum(picked, len(svc) - 1)] * unit_draws(self.seed, counter + 1)
        waits = np.zeros(len(svc))
        waits[waiting] = np.add.reduceat(residuals, first)
        return waits


def prefill_queue(s, calls_per_s: float, per_prefill_token_s: float, base_s: float, budget_tokens: int,
                  seed: int, most_ahead: int = MAX_QUEUED) -> PrefillQueue:
    """The wait behind other prompts' prefill when calls arrive at ``calls_per_s``, at most ``most_ahead`` of them
    (the other agents: module docstring). The calls' services total their prefill tokens at the marginal cost per
    token plus their share of each packed iteration's base time, shared out as the work the step model prices for
    each (:func:`queued_work_s`)."""
    tokens = s.call_prefill_tokens_sample
    line = tokens * (per_prefill_token_s + base_s / budget_tokens)
    svc = queued_work_s(s.call_prefill_attention_s_sample, tokens, float(line.sum()))
    rho = min(calls_per_s * float(svc.mean()), MAX_PREFILL_QUEUE_UTILISATION) if len(svc) else 0.0
    if rho <= 0 or most_ahead < 1:
        return PrefillQueue(0.0, 0.0, svc, seed, most_ahead)
    mean = calls_per_s * float((svc ** 2).mean()) / (2 * (1 - rho))
    # E[min(K, m)] = rho (1 - rho^m) / (1 - rho): the uncut mean times 1 - rho^m
    return PrefillQueue(mean * (1.0 - rho ** most_ahead), rho, svc, seed, most_ahead)


# The stream of the queue lengths' strata, apart from every other draw of a seed.
QUEUE_STRATA_STREAM = 0x51

@lru_cache(maxsize=16)
def _log_uniforms(seed: int, calls: int) -> np.ndarray:
    """Per call, the log of a uniform on (0, 1]: its queue length is ``floor(log U / log rho)`` (read-only, shared:
    the same at every agent count). The uniforms are stratified over the calls, one in each of ``calls`` equal
    strata (:func:`apmw.spec.distribution.stratified_uniforms`), so the share of calls that find a queue is the
    law's to within one call, whatever the seed."""
    log_u = np.log1p(-stratified_uniforms(np.random.default_rng([seed, QUEUE_STRATA_STREAM]), calls))
    log_u.flags.writeable = False
    return log_u


_GOLDEN, _MIX1, _MIX2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def unit_draws(seed: int, counter: np.ndarray) -> np.ndarray:
    """Uniforms on [0, 1), one per ``counter`` (non-negative integers), from ``seed``: SplitMix64's output
    function (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014; constants
    as in Vigna's splitmix64.c) at state ``mix(seed) + counter * golden``: the stream of a generator whose
    state starts at the mixed seed, read at any position. A draw depends on its counter alone, so any subset
    is drawn without drawing the rest (numpy's generators draw in sequence)."""
    start = _mix(np.array([seed], dtype=np.uint64) * _GOLDEN)
    return (_mix(start + np.asarray(counter, dtype=np.uint64) * _GOLDEN) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))
