"""Sampled agent sessions: what each call prefills, decodes and keeps in KV.

The closed-loop solve needs means (per-call work, KV-byte-seconds per session)
and the task-latency tail needs their spread across sessions. Both come from
one seeded sample of ``SESSION_SAMPLES`` sessions drawn from the workload's
distributions (:mod:`apmw.capacity.session_draw`), then priced here. Each call
is a row of flat numpy arrays (no Python loop per call); per-session sums use
``np.add.reduceat``. Each quantity is drawn on its
own strata (median Latin hypercube, :func:`apmw.spec.distribution.stratified_uniforms`),
so every sample meets the top of a heavy-tailed prompt table in its share: drawn
independently, support-chat's analytic N* ran from 12 to 20 agents over ten
seeds, stratified from 15 to 18 (``bench/README.md``, plan_speed).

What a call costs depends on the tool-wait KV policy (MODEL.md section 5):

========  =====================================  ==================================
policy    prefill after a tool wait              KV held during the wait
========  =====================================  ==================================
retain    the new tokens only                    the whole context
evict     the whole context again (worst case:   nothing
          the LRU prefix cache lost it)
ttl       as retain if the wait <= ttl_s,        the context, for min(wait, ttl_s)
          else as evict
offload   the new tokens, after reloading the    nothing in HBM (host memory)
          context over the host link
========  =====================================  ==================================

With ``prefix_caching`` the system prompt is cached once for all sessions: it
is not prefilled by any session and its KV is counted once per replica, not
per session. Calls inside one step (no tool wait between them) reuse the
context just written. The simulator (``apmw simulate``) measures what an LRU
prefix cache actually keeps under ``evict``.

Under ``fleet.routing`` random or least_loaded over ``fleet.routing_replicas`` > 1 replicas, a call
finds the context its task left on the replica it lands on (:mod:`apmw.capacity.routing`), not
necessarily its latest: each call is priced from the earlier call whose context it finds, and a
context left pinned on a replica the task has moved away from is held until the task comes back
there or ends.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, fields, replace
from typing import Callable

import numpy as np

from apmw.capacity.routing import check_routable, routing_of, routing_sources
from apmw.capacity.session_draw import DrawnCalls, draw_calls
from apmw.perf import Replica
from apmw.spec import Spec, Workload
from apmw.spec.distribution import stratified_uniforms

# Sessions drawn per plan: at least SESSION_SAMPLES, and enough to hold about
# TARGET_CALLS calls (short sessions need more of them for stable per-call means),
# at most MAX_SESSION_SAMPLES. bench/plan_speed.py prints the spread of p95 and N*
# across seeds at these sizes (recorded in bench/README.md).
SESSION_SAMPLES = 1000
TARGET_CALLS = 60_000
MAX_SESSION_SAMPLES = 20_000
# Calls drawn (from the sampled sessions) for per-call TTFT tails.
TAIL_CALLS = 20000


@dataclass(frozen=True)
class SessionSample:
    """Per-session sums (arrays of length ``sessions``) and pooled per-call means."""

    sessions: int
    calls: np.ndarray            # model calls per session
    prefill_iters: np.ndarray    # iterations spent prefilling, per session
    decode_iters: np.ndarray     # decode iterations (output tokens after the first), per session
    tool_s: np.ndarray           # total tool wait per session
    kv_transfer_s: np.ndarray    # offload reload time per session
    input_tokens: np.ndarray     # prompt tokens the API sees (cached or not), per session
    output_tokens: np.ndarray
    prefill_tokens: np.ndarray   # prompt tokens actually computed
    # prompt tokens an API with a context cache computes (each call's new tokens, the system prompt and the
    # session's history cached), whatever this replica's routing, prefix caching or tool-wait policy
    api_prefill_tokens: np.ndarray
    # KV-byte-seconds per session = kv_q * Wq + kv_prefill * t_prefill_iter + kv_decode * t_decode_iter
    # + kv_tool (and the squared-byte analogues kv2_* for the variance)
    kv_q: np.ndarray
    kv_prefill: np.ndarray
    kv_decode: np.ndarray
    kv_tool: np.ndarray
    kv2_q: np.ndarray
    kv2_prefill: np.ndarray
    kv2_decode: np.ndarray
    kv2_tool: np.ndarray
    shared_prefix_kv_bytes: float     # the system prompt's KV, held once per replica with prefix caching
    # pooled per-call means that shape one engine iteration
    call_prefill_iters: float
    call_decode_iters: float
    call_prefill_tokens: float
    call_decode_kv_bytes: float       # KV a decoding sequence reads, decode-token weighted
    call_decode_attn_flops: float     # attention FLOPs per decode token, decode-token weighted
    call_decode_kv_bytes_sq: float    # ... and the second moments of both (their spread between sequences)
    call_decode_attn_flops_sq: float
    call_prefill_kv_bytes: float      # cached context a prefill reads, per prefill iteration
    call_prefill_attn_flops: float    # attention FLOPs of one call's prefill
    call_past_window_share: float     # calls whose prompt and output exceed the model's context window
    # speculative decoding: tokens each decoding sequence runs through the target per
    # iteration (k + 1) and the draft's extra time as a share of the iteration
    decode_tokens_per_iteration: float
    draft_cost_fraction: float
    accepted_tokens_per_iteration: float      # output tokens a decoding sequence gains per iteration
    # contexts freed to the LRU prefix cache at tool waits (evict; ttl past its limit):
    # seconds each waits there before its session returns, and its KV bytes
    freed_s: np.ndarray
    freed_kv_bytes: np.ndarray
    final_kv_bytes: np.ndarray    # each session's last context: freed at its end, never reused
    # unit random draws for the tails: sum of each session's per-call queue waits is
    # Wq * Gamma(calls, 1) (exponential waits); a call's wait is Wq * Exp(1). The exponentials are
    # stratified (_unit_exponentials), like every other quantity of the sample
    queue_gamma: np.ndarray
    call_prefill_iters_sample: np.ndarray   # prefill iterations of up to TAIL_CALLS calls
    call_prefill_tokens_sample: np.ndarray  # ... and their prefill tokens
    call_prefill_attn_flops_sample: np.ndarray  # ... their prefill's attention FLOPs
    call_prefill_kv_bytes_sample: np.ndarray    # ... and the cached context each prefill iteration reads
    call_decode_iters_sample: np.ndarray    # ... and their decode iterations
    call_queue_exp: np.ndarray
    # every call in session order, as the policy prices it: the KV it holds while it decodes, its
    # prefill and decode iterations and the tool wait after it (one agent's timeline, for the
    # autocorrelation of the KV demand: apmw.capacity.kv_overflow); and a unit uniform draw per
    # session for its share of KV-overflow episodes
    timeline_kv_bytes: np.ndarray
    timeline_prefill_iters: np.ndarray
    timeline_decode_iters: np.ndarray
    timeline_wait_s: np.ndarray
    exposure_uniform: np.ndarray
    # the tail calls' prefill on a replica, seconds: run alone, and what their attention to their own context
    # adds to it. The replica's step model prices them, so the closed-loop model that evaluates the sample does
    # (apmw.capacity.prefill_queue.priced_on); None until then
    call_prefill_alone_s_sample: np.ndarray | None = None
    call_prefill_attention_s_sample: np.ndarray | None = None

    @property
    def mean_calls(self) -> float:
        return float(self.calls.mean())

    @property
    def decode_kv_bytes_cv(self) -> float:
        """Coefficient of variation between decoding sequences of the KV bytes one decode step reads."""
        return _cv(self.call_decode_kv_bytes, self.call_decode_kv_bytes_sq)

    @property
    def decode_attn_flops_cv(self) -> float:
        """... and of its attention FLOPs (both grow with the context, which differs between sequences)."""
        return _cv(self.call_decode_attn_flops, self.call_decode_attn_flops_sq)


def _cv(mean: float, second_moment: float) -> float:
    return math.sqrt(max(second_moment / mean ** 2 - 1.0, 0.0)) if mean > 0 else 0.0


def _unit_exponentials(rng: np.random.Generator, size: int) -> np.ndarray:
    """``size`` Exp(1) draws, stratified: their quantile function at :func:`stratified_uniforms`."""
    return -np.log1p(-stratified_uniforms(rng, size))


def _sum_by_session(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    return np.add.reduceat(values, starts) if len(values) else np.zeros(len(starts))


def default_session_count(spec: Spec) -> int:
    calls = spec.workload.steps_per_task.mean * spec.workload.calls_per_step.mean
    return int(np.clip(np.ceil(TARGET_CALLS / max(calls, 1.0)), SESSION_SAMPLES, MAX_SESSION_SAMPLES))


def sample_sessions(spec: Spec, replica: Replica, sessions: int | None = None,
                    seed: int | None = None, variant: str = "as_policy") -> SessionSample:
    """Sample the spec's sessions as ``replica`` serves them (its architecture, its engine's token
    budget), priced as ``variant`` (see :func:`_sample`) says."""
    return _sample(spec, replica, sessions, seed, (variant,))[0]


def sample_session_pair(spec: Spec, replica: Replica, sessions: int | None = None,
                        seed: int | None = None) -> tuple[SessionSample, SessionSample]:
    """The same sessions priced with every freed context lost, and with every one found."""
    miss, hit = _sample(spec, replica, sessions, seed, (AS_POLICY, FREED_FOUND))
    return miss, hit


def sample_retained_pair(spec: Spec, replica: Replica, sessions: int | None = None,
                         seed: int | None = None) -> tuple[SessionSample, SessionSample]:
    """The same sessions priced with every context retained over its tool wait, and with every one
    lost (spilled while memory was short, so the next call prefills its whole prompt again)."""
    kept, lost = _sample(spec, replica, sessions, seed, (AS_POLICY, RETAINED_LOST))
    return kept, lost


# Which contexts a priced variant finds: those the policy keeps; those plus every context freed at a
# tool wait (found in the prefix cache); or none that waited for a tool (every retained one lost).
AS_POLICY, FREED_FOUND, RETAINED_LOST = "as_policy", "freed_found", "retained_lost"


# Samples recently priced, by everything pricing reads (:func:`_sample_key`): a design-space search or the
# levers re-plan one workload on other GPUs, engines and batch limits, and its sample does not change with
# them. Bounded by the bytes their arrays hold (the newest is always kept): the bundled examples' pairs of
# priced samples hold 6-11 MB each, so the 24 that deep-research's default space cycles through (GPUs x
# weight x KV dtype) stay (bench/README.md, search_speed: 65 MB more at the peak, the space 1.15-1.45x faster).
SAMPLE_CACHE_BYTES = 256 * 2**20
_SAMPLES: OrderedDict[tuple, tuple[SessionSample, ...]] = OrderedDict()
# Serving fields pricing does not read (the engine's batch limits, memory share and layout reach it only
# through the replica's resolved token budget and prompt slots, which the key holds).
_UNREAD_SERVING = {"engine", "engine_version", "mixed_prefill", "overlap_scheduling", "max_batch", "max_batched_tokens",
                   "kv_memory_fraction", "workspace_bytes_per_gpu", "attention_data_parallel", "parallelism"}


def _sample_key(spec: Spec, replica: Replica, sessions: int, seed: int, variants: tuple[str, ...]) -> tuple:
    """What :func:`_priced` reads of its arguments."""
    return (spec.workload.model_dump_json(), spec.model.model_dump_json(), spec.serving.model_dump_json(
            exclude=_UNREAD_SERVING), spec.fleet.routing, spec.fleet.routing_replicas, replica.arch,
            replica.chunk_tokens, replica.policy.slot_prompt_cache, sessions, seed, variants)


def _held_bytes(samples: tuple[SessionSample, ...]) -> int:
    """The bytes the samples' arrays hold (an array two of them share counted once)."""
    arrays = {id(v): v for s in samples for f in fields(s) if isinstance(v := getattr(s, f.name), np.ndarray)}
    return sum(a.nbytes for a in arrays.values())


def _read_only(s: SessionSample) -> SessionSample:
    """``s`` with its arrays made read-only, so that plans sharing it cannot change it for each other."""
    for f in fields(s):
        value = getattr(s, f.name)
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
    return s


def _sample(spec: Spec, replica: Replica, sessions: int | None, seed: int | None,
            variants: tuple[str, ...]) -> list[SessionSample]:
    """:func:`_priced`, or the samples it gave the last time it was asked the same (same values, shared)."""
    sessions = default_session_count(spec) if sessions is None else sessions
    seed = spec.seed if seed is None else seed
    key = _sample_key(spec, replica, sessions, seed, variants)
    if key in _SAMPLES:
        _SAMPLES.move_to_end(key)
    else:
        _SAMPLES[key] = tuple(_read_only(s) for s in _priced(spec, replica, sessions, seed, variants))
        while len(_SAMPLES) > 1 and sum(map(_held_bytes, _SAMPLES.values())) > SAMPLE_CACHE_BYTES:
            _SAMPLES.popitem(last=False)
    return list(_SAMPLES[key])


@dataclass(frozen=True)
class _Contexts:
    """What the serving policy (and the routing) does with each call's context, per call in session order."""

    kept: np.ndarray           # bool: the call finds its session's context (only its new tokens are prefilled)
    freed: np.ndarray          # bool: its context was freed at the tool wait before it (found only as cache)
    freed_s: np.ndarray        # for those: seconds it waited in the prefix cache
    hold_s: np.ndarray         # seconds the context stays pinned in KV over the tool wait after the call
    offload_s: np.ndarray      # seconds of reloading an offloaded context before the call
    routed: _Routed | None     # where a routing spreads a task's calls over replicas


def _contexts(spec: Spec, replica: Replica, calls: DrawnCalls, seed: int, shared: float,
              kv: Callable[[np.ndarray], np.ndarray]) -> _Contexts:
    """Which calls find their context under ``serving.tool_wait_kv_policy`` (and ``fleet.routing``), and how long
    each is held in KV over its tool wait: ``retain`` pins it, ``ttl`` pins it up to its limit, ``offload`` moves
    it to host memory and back, ``evict`` frees it to the LRU prefix cache. Without prefix caching every call is a
    fresh request."""
    sv, n = spec.serving, calls.calls
    policy, after_wait = sv.tool_wait_kv_policy, calls.after_wait
    ttl_s = sv.ttl_s if sv.ttl_s is not None else 0.0     # set whenever policy is 'ttl' (apmw.spec.Serving)
    if not sv.prefix_caching:
        kept = np.zeros(n, dtype=bool)
    elif policy in ("retain", "offload"):
        kept = ~calls.first_in_session
    elif policy == "ttl":
        kept = ~calls.first_in_session & (calls.wait_before <= ttl_s)
    else:                                          # evict
        kept = ~calls.first_in_session & ~after_wait
    freed = (~kept & after_wait) if sv.prefix_caching else np.zeros(n, dtype=bool)
    freed_s = (calls.wait_before - (ttl_s if policy == "ttl" else 0.0))[freed]
    if policy == "retain" and sv.prefix_caching:
        hold_s = calls.wait_after
    elif policy == "ttl" and sv.prefix_caching:
        hold_s = np.minimum(calls.wait_after, ttl_s)
    else:
        hold_s = np.zeros(n)
    offload_s = np.zeros(n)
    if policy == "offload" and sv.prefix_caching:
        offload_s = np.where(after_wait, kv(calls.history) / sv.offload_bandwidth_bytes_per_s, 0.0)
    routing = routing_of(spec)
    routed = None
    if routing.spreads and sv.prefix_caching:
        check_routable(spec, replica.policy.slot_prompt_cache)
        routed = _routed(calls.session_of_call, routing, seed, calls.prompt, calls.out, calls.wait_before,
                         calls.wait_after, calls.calls_per_session, policy, ttl_s, shared)
        kept, freed, freed_s = routed.kept, routed.freed, routed.freed_s
    return _Contexts(kept=kept, freed=freed, freed_s=freed_s, hold_s=hold_s, offload_s=offload_s, routed=routed)


@dataclass(frozen=True)
class _Rows:
    """The calls priced: the drawn ones, then one summary call per history reset (each session's, at its end)."""

    session: np.ndarray        # the session of each row
    calls_per_session: np.ndarray
    prompt: np.ndarray
    history: np.ndarray
    out: np.ndarray
    hold_s: np.ndarray
    offload_s: np.ndarray
    summaries: int             # the rows past the drawn calls


def _with_summary_calls(w: Workload, calls: DrawnCalls, contexts: _Contexts) -> _Rows:
    """The rows to price: with ``workload.summarize_at_tokens``, one summary call per reset, which reads the full
    context at the cap and one instruction token (the context retained, only that token is prefilled) and writes
    ``summary_tokens``."""
    rows = _Rows(session=calls.session_of_call, calls_per_session=calls.calls_per_session, prompt=calls.prompt,
                 history=calls.history, out=calls.out, hold_s=contexts.hold_s, offload_s=contexts.offload_s,
                 summaries=0)
    if w.summarize_at_tokens is None:
        return rows
    summaries = calls.resets[calls.last_call].astype(np.int64)
    extra = int(summaries.sum())
    at = float(w.summarize_at_tokens)
    return _Rows(session=np.concatenate((rows.session, np.repeat(np.arange(calls.sessions), summaries))),
                 calls_per_session=rows.calls_per_session + summaries,
                 prompt=np.concatenate((rows.prompt, np.full(extra, at + 1))),
                 history=np.concatenate((rows.history, np.full(extra, at))),
                 out=np.concatenate((rows.out, np.full(extra, float(w.summary_tokens)))),
                 hold_s=np.concatenate((rows.hold_s, np.zeros(extra))),
                 offload_s=np.concatenate((rows.offload_s, np.zeros(extra))), summaries=extra)


def _priced(spec: Spec, replica: Replica, sessions: int, seed: int,
            variants: tuple[str, ...]) -> list[SessionSample]:
    """Sample sessions once and price them as each of ``variants`` says.

    Under ``evict`` (and ``ttl`` past its limit) a context freed at a tool wait stays in
    the LRU prefix cache until evicted: ``AS_POLICY`` prices every such context as lost
    (recomputed), ``FREED_FOUND`` all of them as found. Under ``retain`` the engine spills
    pinned contexts when memory runs short: ``RETAINED_LOST`` prices every call after a tool
    wait as finding nothing but the shared prefix. The same seed draws the same sessions
    either way, so :mod:`apmw.capacity.closed_loop` can blend two variants by the share the
    cache's free memory (or the KV overflow) implies.
    """
    w, sv, arch = spec.workload, spec.serving, replica.arch
    kv_dtype = spec.model.kv_dtype
    rng = np.random.default_rng(seed)
    calls = draw_calls(w, rng, sessions)
    shared = float(w.system_prompt_tokens) if sv.prefix_caching else 0.0

    def kv(tokens: np.ndarray) -> np.ndarray:
        """KV bytes one session holds for a context, the shared prefix counted elsewhere."""
        return arch.kv_bytes_for_context(tokens, kv_dtype) - (arch.kv_bytes_for_context(shared, kv_dtype)
                                                              if shared else 0.0)

    contexts = _contexts(spec, replica, calls, seed, shared, kv)
    routed, kept_calls, freed = contexts.routed, contexts.kept, contexts.freed
    # a call after a summary re-prefills the summary text in its new position
    reprefill = calls.new + calls.new_resets * w.summary_tokens
    full_prompt = calls.prompt - shared
    last_call = calls.last_call
    rows = _with_summary_calls(w, calls, contexts)
    prompt, out, extra_rows = rows.prompt, rows.out, rows.summaries

    kv_history = kv(rows.history)                 # held while the call queues, where the context is found
    hold_s = rows.hold_s
    freed_kv = kv(calls.history[freed])
    final_kv = kv(calls.prompt[last_call] + calls.out[last_call])
    if routed is not None:
        hold_s = routed.hold_s
        freed_kv = kv(routed.found_tokens[freed])
        final_kv = kv((prompt + out)[routed.dead])
    kv_prompt = kv(prompt)
    kv_decode = kv(prompt + out / 2)
    kv_after = kv(prompt + out)

    spec_decode = replica.speculative
    tokens_per_iter = spec_decode.tokens_per_iteration if spec_decode else 1.0
    dec_iters = (out - 1) / tokens_per_iter
    n_rows = len(out)
    # the calls whose TTFT is read: every one where there are few enough, else a subset without repeats
    tail_calls = (np.arange(n_rows) if n_rows <= TAIL_CALLS
                  else np.sort(rng.choice(n_rows, size=TAIL_CALLS, replace=False)))

    def per(values: np.ndarray) -> np.ndarray:
        return np.bincount(rows.session, weights=values, minlength=sessions)

    decode_weight = dec_iters.sum() or 1.0
    decode_kv = arch.kv_read_bytes_for_context(prompt + out / 2, kv_dtype)
    decode_flops = arch.attention_flops_per_token(prompt + out / 2)

    def priced(kept_calls: np.ndarray) -> dict:
        """The fields that depend on which contexts are found: prefill work and KV held while queued."""
        if routed is not None:     # each call finds what its task left on the replica it lands on
            found = np.where(kept_calls, routed.found_tokens, shared)
            prefill = np.maximum(prompt - found, 1.0)
            kv_hist = kv(found)
        else:
            prefill = np.concatenate((np.maximum(np.where(kept_calls, reprefill, full_prompt), 1.0),
                                      np.ones(extra_rows)))     # at least the token that starts generation
            kv_hist = kv_history * np.concatenate((kept_calls, np.ones(extra_rows, dtype=bool)))
        prefill_iters = np.ceil(prefill / replica.chunk_tokens)
        attn_flops = prefill * arch.attention_flops_per_token(prompt - prefill / 2)
        kv_read = arch.kv_read_bytes_for_context(prompt - prefill, kv_dtype)
        return dict(
            prefill_iters=per(prefill_iters), prefill_tokens=per(prefill),
            kv_q=per(kv_hist), kv_prefill=per(kv_prompt * prefill_iters),
            kv2_q=per(kv_hist**2), kv2_prefill=per(kv_prompt**2 * prefill_iters),
            call_prefill_iters=float(prefill_iters.mean()), call_prefill_tokens=float(prefill.mean()),
            call_prefill_kv_bytes=float(kv_read.mean()), call_prefill_attn_flops=float(attn_flops.mean()),
            call_prefill_iters_sample=prefill_iters[tail_calls], call_prefill_tokens_sample=prefill[tail_calls],
            call_prefill_attn_flops_sample=attn_flops[tail_calls], call_prefill_kv_bytes_sample=kv_read[tail_calls],
        )

    n_calls = calls.calls
    own_prefill = (np.maximum(np.where(kept_calls, reprefill, full_prompt), 1.0) if routed is None
                   else np.maximum(prompt - np.where(kept_calls, routed.found_tokens, shared), 1.0))
    base = SessionSample(
        sessions=sessions,
        calls=rows.calls_per_session.astype(float),
        decode_iters=per(dec_iters),
        tool_s=_sum_by_session(calls.wait_after_step, np.concatenate(([0], np.cumsum(calls.steps)[:-1]))),
        kv_transfer_s=per(rows.offload_s),
        input_tokens=per(prompt),
        api_prefill_tokens=per(np.concatenate((np.maximum(reprefill, 1.0), np.ones(extra_rows)))),
        output_tokens=per(out),
        kv_decode=per(kv_decode * dec_iters),
        kv_tool=per(kv_after * hold_s),
        kv2_decode=per(kv_decode**2 * dec_iters),
        kv2_tool=per(kv_after**2 * hold_s),
        shared_prefix_kv_bytes=float(arch.kv_bytes_for_context(shared, kv_dtype)) if shared else 0.0,
        call_decode_iters=float(dec_iters.mean()),
        call_past_window_share=(float(np.mean(prompt + out > arch.max_context_tokens)) if arch.max_context_tokens
                                else 0.0),
        call_decode_kv_bytes=float((decode_kv * dec_iters).sum() / decode_weight),
        call_decode_attn_flops=float((decode_flops * dec_iters).sum() / decode_weight),
        call_decode_kv_bytes_sq=float((decode_kv ** 2 * dec_iters).sum() / decode_weight),
        call_decode_attn_flops_sq=float((decode_flops ** 2 * dec_iters).sum() / decode_weight),
        decode_tokens_per_iteration=float(spec_decode.verified_tokens) if spec_decode else 1.0,
        draft_cost_fraction=float(spec_decode.draft_cost_fraction) if spec_decode else 0.0,
        accepted_tokens_per_iteration=tokens_per_iter,
        freed_s=contexts.freed_s,
        freed_kv_bytes=freed_kv,
        final_kv_bytes=final_kv,
        queue_gamma=per(_unit_exponentials(rng, len(prompt))),      # a sum of one Exp(1) a call is Gamma(calls, 1)
        call_queue_exp=_unit_exponentials(rng, len(tail_calls)),
        call_decode_iters_sample=dec_iters[tail_calls],
        exposure_uniform=rng.random(sessions),
        timeline_kv_bytes=kv_decode[:n_calls], timeline_decode_iters=dec_iters[:n_calls],
        timeline_prefill_iters=np.ceil(own_prefill / replica.chunk_tokens), timeline_wait_s=calls.wait_after,
        **priced(kept_calls),
    )
    found = {AS_POLICY: kept_calls, FREED_FOUND: kept_calls | freed,
             RETAINED_LOST: kept_calls & (~calls.after_wait if routed is None else routed.no_wait)}
    return [base if v == AS_POLICY else replace(base, **priced(found[v])) for v in variants]



@dataclass(frozen=True)
class _Routed:
    """Each call's context as the routing leaves it (:mod:`apmw.capacity.routing`), per call in session order."""

    found_tokens: np.ndarray   # tokens of the context it finds on its replica (the shared prefix when none)
    kept: np.ndarray           # ... found pinned (the previous call's context where the policy pins it)
    freed: np.ndarray          # ... found only if it survived as cache (LRU, or a left-behind pin spilled oldest first)
    freed_s: np.ndarray        # for those: how long it waited
    no_wait: np.ndarray        # ... found across no tool wait
    hold_s: np.ndarray         # tool-wait seconds each call's context is held pinned after it (as under affinity)
    dead: np.ndarray           # contexts no later call of the task finds (a task's last among them)


def _routed(session_of_call: np.ndarray, routing, seed: int, prompt: np.ndarray, out: np.ndarray,
            wait_before: np.ndarray, wait_after: np.ndarray, calls_per_session: np.ndarray, policy: str,
            ttl_s: float, shared: float) -> _Routed:
    """Which earlier context each call finds under ``routing``, and what each context costs in memory
    (no summarisation: :func:`apmw.capacity.routing.check_routable` refuses it).

    Every context is held through the tool wait after its call as affinity holds it (the engine cannot
    tell that the next call goes elsewhere: the memory the plan must fit, wasted where it does). Past that
    wait, a context the task left behind on a replica it moved away from is cache, counted in no memory
    demand: under ``retain`` a pin nobody took over, which the engine spills oldest first, before any pin a
    call is about to take over (found unless memory runs short: the KV-overflow share); under ``evict``
    and ``ttl`` a context in the LRU prefix cache (a pin between two calls of a step is spilled to it
    first), found while younger than the cache's characteristic time (:mod:`apmw.capacity.prefix_cache`)."""
    n = len(prompt)
    idx = np.arange(n)
    src = routing_sources(session_of_call, routing, seed)
    has = src >= 0
    s = np.where(has, src, 0)
    cw = np.cumsum(wait_before)
    elapsed = np.where(has, cw - cw[s], 0.0)                 # tool waits since the context was left
    forever = (wait_after == 0) | (policy == "retain")       # pinned until taken over (or spilled)
    ttl_pin = (policy == "ttl") & ~forever[s]                # a ttl pin, kept until its limit
    previous = has & (src == idx - 1)
    if policy == "retain":
        # pins everywhere: one left behind is found unless memory ran short, the KV-overflow share that
        # apmw.capacity.closed_loop blends in (it spills the oldest pins first, so this is a little generous)
        kept = has
    else:
        kept = (previous & forever[s]) | (has & ttl_pin & (elapsed <= ttl_s))
    freed = has & ~kept
    last = np.cumsum(calls_per_session) - 1
    reuser = np.full(n, -1, dtype=np.int64)
    reuser[src[has]] = idx[has]
    is_last = np.zeros(n, dtype=bool)
    is_last[last] = True
    if policy == "retain":
        hold = wait_after
    elif policy == "ttl":
        hold = np.minimum(wait_after, ttl_s)
    else:
        hold = np.zeros(n)
    return _Routed(found_tokens=np.where(has, (prompt + out)[s], shared), kept=kept, freed=freed,
                   freed_s=(elapsed - np.where(ttl_pin, ttl_s, 0.0))[freed], no_wait=has & (elapsed == 0),
                   hold_s=hold, dead=(reuser < 0) | is_last)
