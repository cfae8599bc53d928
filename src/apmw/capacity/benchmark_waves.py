"""How a fixed-concurrency benchmark's requests fall into lock step or whole waves, and its first wave.

A benchmark client starts every request at once (:mod:`apmw.capacity.benchmark` predicts the steady
state that follows). With equal lengths the first wave splits into groups of as many whole prompts
as the budget takes, which start, finish and return one packed iteration apart, so they stay in
lock step; as the lengths spread the groups dissolve, and :func:`lockstep_share` says how much of
the steady state is still in step, fitted to apmw's iteration-level simulator
(``bench/predict_vs_sim.py``):

* in lock step (:func:`lockstep_groups`): each prompt waits half a decode iteration, the iteration
  already scheduled (mostly the group before's packed one) and its group's packed iteration; a
  request decodes through the packed iterations of every other group;
* engines that run prefill alone and first (SGLang's default; :mod:`apmw.perf.serving_policy`) keep
  whole waves (:func:`whole_waves`): with equal lengths nobody decodes until the whole wave is
  prefilled, so every cycle repeats the first wave;
* spread out or in lock step, the first wave arrives all at once and queues for the budget: its
  mean TTFT, about ``(ceil(R*isl/budget) + 1)/2`` full-budget iterations (the last holds only the
  remainder: :func:`wave_mean_ttft_s`), weighs ``1/requests_per_client`` of the mean (InferenceMAX
  sends ``10 x concurrency`` prompts: its benchmark scripts' ``--num-prompts $((CONC * 10))``).
"""

from __future__ import annotations

import math

import numpy as np

from apmw.capacity.arrival_wait import arrival_wait_s

# How fast lock-step groups dissolve as request lengths spread: the lock-step share is
# exp(-LOCKSTEP_DECAY * window / wave_iters), where window = length_spread x osl is the
# spread of finishing times and wave_iters the full-budget iterations a wave needs.
# FITTED to apmw's own iteration-level simulator (every client starting together, Llama-3.1-8B
# on H200, 1024/512 tokens, spreads 0-0.2, concurrency 8-128; `python bench/predict_vs_sim.py`),
# not to measurements: it makes the analytic prediction reproduce the simulated dynamics.
LOCKSTEP_DECAY = 1.5


# Prefill first (SGLang) keeps a whole wave together only while its requests finish in the
# same iteration: a prompt that comes back alone is prefilled at once, and the wave comes
# apart. The lock-step share is then 1 / (1 + (window / PREFILL_FIRST_LOCKSTEP_ITERS)^2)
# (window = length_spread x osl iterations). FITTED to apmw's simulator like LOCKSTEP_DECAY
# (Llama-3.1-8B bf16 on H200, 1024/512 tokens, spreads 0.01-0.2, concurrency 8-128): the
# simulated shares were 0.01-0.07 at spreads 0.01-0.05 and none to see at 0.2; this form gives
# 0.052 at 0.01, 0.002 at 0.05 and nothing at 0.2 (`python bench/predict_vs_sim.py --engine sglang`).
PREFILL_FIRST_LOCKSTEP_ITERS = 1.2


def lockstep_share(running: int, window_iters: float, wave_iters: float, decode_iters: float,
                   mixed: bool = True) -> float:
    """Share of the steady state in lock-step groups (1: equal lengths; 0: spread out)."""
    if running <= 1 or wave_iters <= 0:
        return 0.0      # one client
    if not mixed:
        if decode_iters <= 0:
            return 0.0  # no decode to wait for: each request comes back alone, right after its prefill
        return 1.0 / (1.0 + (window_iters / PREFILL_FIRST_LOCKSTEP_ITERS) ** 2)
    if wave_iters > decode_iters:
        return 0.0      # a prefill-bound wave (every iteration packed anyway)
    return math.exp(-LOCKSTEP_DECAY * window_iters / wave_iters)


def lockstep_groups(isl: int, osl: float, capacity: int, running: int, per_group: int, own_mixed: int,
                    t_decode: float, t_group: float, t_rest: float, ahead: float = 0.0,
                    recv_interval: int = 1) -> tuple[float, float, float]:
    """TPOT, TTFT and packed-iteration share of equal-length requests in lock step.

    The first wave arrives at once and is prefilled a budget at a time, so it splits into
    groups of ``per_group`` whole prompts (the last group holds the rest) that start one
    packed iteration apart (``t_group``, ``t_rest``: those iterations' times). With equal
    lengths they also finish and return one iteration apart, so the stagger holds: each
    group's prompts fill their own packed iteration after half a decode iteration of
    waiting, and a request decodes through the packed iterations of every other group.
    Where the engine schedules ``ahead`` (:func:`arrival_wait_s`), a returning group also waits
    for the iteration already scheduled: a decode iteration for the first group of a cycle, the
    packed iteration of the group before for every later one (nothing when all the requests form
    one group: they come back to an idle engine). A scheduler that polls for new requests every
    ``recv_interval`` iterations keeps a returning group waiting half of them instead of half of one.
    Prompts longer than the budget (``per_group == 0``) each span ``own_mixed`` packed
    iterations, shared with their neighbours' chunks.
    The iteration-level simulator (``apmw.sim``), started with every client at once, shows
    this steady state (``bench/predict_vs_sim.py``).
    """
    decode_iters = max(osl - 1, 1)
    if per_group:
        full, rest = divmod(running, per_group)
        # (requests, their group's packed iteration time, packed iterations of that kind per cycle)
        groups: list[tuple[int, float, float]] = [(full * per_group, t_group, float(full))]
        if rest:
            groups.append((rest, t_rest, 1.0))
        own_s = sum(n * t for n, t, _ in groups) / running
        own_extra = sum(n * (t - t_decode) for n, t, _ in groups) / running
        first = per_group                             # the first group's requests
    else:
        # prompts longer than the budget: every iteration is packed, each prompt sharing its
        # ``own_mixed`` iterations with its neighbours' chunks
        groups = [(running, t_group, running * isl / capacity)]
        own_s = own_mixed * t_group
        own_extra = isl / capacity * (t_group - t_decode)
        first = 1       # every prompt is a group of its own
    # the iteration already scheduled when a group comes back: none when it is the only group (the
    # engine is idle then); else a decode iteration for the first group of a cycle and the packed
    # iteration of the group before for every later one
    ahead_s = (first * t_decode + (running - first) * t_group) / running if first < running else 0.0
    ttft = arrival_wait_s(t_decode, running, recv_interval=recv_interval) + ahead * ahead_s + own_s
    packed_extra = sum(k * (t - t_decode) for _, t, k in groups)     # all groups' packed iterations
    tpot = t_decode + max(packed_extra - own_extra, 0.0) / decode_iters if osl > 1 else 0.0
    share = min(sum(k for *_, k in groups) / (decode_iters + own_mixed), 1.0)
    return tpot, ttft, share


def whole_waves(isl: int, osl: float, capacity: int, running: int, t_decode: float, wave_ttft_s: float,
                t_full_s: float) -> tuple[float, float, float]:
    """TPOT, TTFT and prefill-iteration share of equal-length requests when prefill runs alone
    and first (SGLang).

    Nobody decodes until the whole wave is prefilled, in full-budget iterations, so the
    requests decode, finish and return together: every cycle repeats the first wave
    (``wave_ttft_s``, its mean TTFT), and a request waits from its first token through the
    rest of the wave's prefill, about ``(iterations - 1)/2`` of ``t_full_s``, before it decodes.
    The wave comes back to an idle engine, so scheduling ahead adds no wait here.
    The simulator shows this steady state too (``bench/predict_vs_sim.py --engine sglang``).
    """
    decode_iters = max(osl - 1, 1)
    iters = math.ceil(running * isl / capacity)
    tpot = t_decode + (iters - 1) / 2 * t_full_s / decode_iters if osl > 1 else 0.0
    return tpot, wave_ttft_s, iters / (iters + decode_iters)


def wave_mean_ttft_s(running: int, isl: int, token_budget: int, t_full_s: float, t_last_s: float) -> float:
    """Mean TTFT of ``running`` prompts that arrive at once and are prefilled a budget at a time.

    Prompt ``j`` gets its first token at the end of the iteration its last token lands in;
    every iteration is full (``t_full_s``) but the last, which holds the remainder
    (``t_last_s``; the same when the wave fills it).
    """
    full = running * isl // token_budget
    if running * isl % token_budget == 0:
        t_last_s = t_full_s
    lands = (np.arange(1, running + 1, dtype=np.int64) * isl - 1) // token_budget
    ttft = np.where(lands < full, (lands + 1) * t_full_s, full * t_full_s + t_last_s)
    return float(ttft.mean())
