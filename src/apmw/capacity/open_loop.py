"""Open-loop serving benchmark prediction: Poisson arrivals at a fixed rate (MLPerf Server,
vLLM ``bench serve --request-rate``).

The requests in the engine, ``N``, satisfy Little's law ``N = lambda * E2E(N)``; the
fixed-concurrency model (:mod:`apmw.capacity.benchmark`) at ``N``, with Poisson arrival timing,
gives ``E2E(N)``, and a bisection finds ``N``. That is the mean; Poisson arrivals make the count
fluctuate around it, and where the engine's running limit (its batch cap or KV pool, ``c``
requests) is near, an arrival often finds every slot taken and waits for one (:func:`slot_wait_s`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import replace
from numbers import Real

import numpy as np

from apmw.capacity.benchmark import (PredictError, Prediction, check_benchmark_counts, kv_fit_requests, predict_with,
                                     replica_for_benchmark, with_power)
from apmw.perf import Replica


def predict_rate(model: str, gpu: str, tp: int, weight_dtype: str, kv_dtype: str, isl: int, osl: int,
                 request_rate_per_s: float, engine: str = "vllm", token_budget: int | None = None,
                 max_batch: int | None = None, calibrated: bool = True,
                 request_overhead_s: float | None = None, mixed_prefill: bool | None = None,
                 overlap_scheduling: bool | None = None, kv_memory_fraction: float | None = None,
                 layout: dict | None = None, moe_dtype: str | None = None,
                 engine_version: str | None = None, mxfp4_moe_activations: str | None = None,
                 scheduler_recv_interval: int | None = None, speculative: dict | None = None) -> Prediction:
    """Predict an open-loop benchmark point: Poisson arrivals at ``request_rate_per_s`` per replica
    (vLLM ``bench serve --request-rate``, MLPerf Server); see :func:`predict_open_loop`. Engine
    settings left ``None`` are the engine's defaults (:mod:`apmw.perf.serving_policy`).

    The request overhead adds to TTFT and end-to-end latency only: it is spent outside the engine.
    """
    check_benchmark_counts(isl, osl, 1, tp)
    if isinstance(request_rate_per_s, bool) or not (isinstance(request_rate_per_s, Real)
                                                    and 0 < request_rate_per_s < math.inf):
        raise PredictError(f"request_rate_per_s must be a finite positive number (got {request_rate_per_s!r} "
                           "requests/s)")
    replica = replica_for_benchmark(model, gpu, tp, weight_dtype, kv_dtype, isl, osl, engine, calibrated,
                                    token_budget=token_budget, max_batch=max_batch, mixed_prefill=mixed_prefill,
                                    overlap_scheduling=overlap_scheduling, kv_memory_fraction=kv_memory_fraction,
                                    request_overhead_s=request_overhead_s, layout=layout,
                                    moe_dtype=moe_dtype, engine_version=engine_version,
                                    mxfp4_moe_activations=mxfp4_moe_activations,
                                    scheduler_recv_interval=scheduler_recv_interval, speculative=speculative)
    overhead_s = replica.policy.request_overhead_s
    p = predict_open_loop(replica, isl, osl, request_rate_per_s)
    # requests in the engine are Poisson with mean lambda x (engine time) when arrivals are
    # Poisson (M/G/infinity), so the engine is idle with probability exp(-lambda x time); the wait for a
    # slot is not engine time
    busy_share = 1.0 - math.exp(-request_rate_per_s * (p.e2e_latency_s - p.ttft_parts_s["slot_queue"]))
    p = replace(p, ttft_s=p.ttft_s + overhead_s, e2e_latency_s=p.e2e_latency_s + overhead_s,
                ttft_parts_s={**p.ttft_parts_s, "request_overhead": overhead_s})
    return with_power(replica, p, isl, osl, busy_share)


def predict_open_loop(replica: Replica, isl: int, osl: int, arrival_rate_per_s: float) -> Prediction:
    """Steady state under Poisson arrivals at ``arrival_rate_per_s`` per replica (MLPerf Server).

    The requests in the engine, ``N``, satisfy Little's law ``N = lambda * E2E(N)``; we
    find it by bisection on the fixed-concurrency model (no first-wave burst: arrivals
    are spread), with Poisson arrival timing for TTFT (inspection paradox, prompts sharing an
    iteration; :func:`_spread_out`); an arrival that finds every running slot taken then waits for one
    (:func:`slot_wait_s`). Raises :class:`PredictError` when the rate exceeds capacity.
    """
    if arrival_rate_per_s <= 0:
        raise PredictError(f"arrival rate must be positive (got {arrival_rate_per_s})")
    if kv_fit_requests(replica, isl, osl, full_length=True) < 1:
        raise PredictError(f"one request of {isl}+{osl} tokens does not fit in the KV memory")
    cap = min(replica.policy.max_batch, kv_fit_requests(replica, isl, osl))

    @functools.cache
    def excess(n: int) -> tuple[float, Prediction]:
        p = predict_with(replica, isl, osl, n, requests_per_client=10**9, length_spread=1.0, poisson_arrivals=True)
        return arrival_rate_per_s * p.e2e_latency_s - n, p

    lo, hi = 1, cap
    e_hi, p_hi = excess(hi)
    if e_hi >= 0:           # at capacity exactly the slots never drain: the wait has no bound either
        raise PredictError(f"{arrival_rate_per_s:,.4g} requests/s exceeds the replica's capacity of "
                           f"{hi / p_hi.e2e_latency_s:,.4g} requests/s ({hi} running requests, the batch or KV "
                           f"limit): the queue would grow without bound; lower the rate or give the replica "
                           f"more GPUs")
    e_lo, p_lo = excess(lo)
    if e_lo <= 0:
        p = p_lo
    else:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            e_mid, p_mid = excess(mid)
            if e_mid > 0:
                lo, e_lo, p_lo = mid, e_mid, p_mid
            else:
                hi, e_hi, p_hi = mid, e_mid, p_mid
        p = p_hi
    # ... and an arrival that finds every running slot taken waits for one
    wait_s = slot_wait_s(cap, arrival_rate_per_s, lambda n: excess(n)[1].e2e_latency_s)
    # open loop: every offered request is served, so throughput is the offered load
    out_per_gpu = arrival_rate_per_s * osl / replica.gpus
    return replace(p, ttft_s=p.ttft_s + wait_s, e2e_latency_s=p.e2e_latency_s + wait_s,
                   queued_requests=round(arrival_rate_per_s * wait_s),
                   ttft_parts_s={**p.ttft_parts_s, "slot_queue": p.ttft_parts_s.get("slot_queue", 0.0) + wait_s},
                   output_tokens_per_s_per_gpu=out_per_gpu, total_tokens_per_s_per_gpu=out_per_gpu * (isl + osl) / osl)


# Allen-Cunneen's M/G/c correction of a wait priced with exponential service, (c_a^2 + c_s^2) / 2: Poisson
# arrivals (c_a^2 = 1) and one request length throughout, whose slot holds it for about the same time (c_s^2 = 0).
EQUAL_LENGTHS_WAIT_FACTOR = 0.5
# Running counts the end-to-end time is priced at for the chain below (geometric from 1 to the limit; linear
# between): the time grows smoothly with the batch, and a count costs one fixed-concurrency prediction.
SLOT_CHAIN_POINTS = 24


def slot_wait_s(slots: int, arrival_rate_per_s: float, e2e_s_at: Callable[[int], float]) -> float:
    """The mean wait for one of ``slots`` running slots under Poisson arrivals, where ``e2e_s_at(k)`` is a
    request's end-to-end time with ``k`` running.

    The requests in the replica, ``n``, are a birth-death chain: arrivals at ``lambda``, departures at
    ``min(n, c) / e2e(min(n, c))``, so the engine slows as its batch grows and quickens as it drains (an M/M/c
    queue would hold the service time fixed: with a batch well under the limit it put arrivals in a queue that
    never forms, and near the limit it missed how a fuller batch slows the turnover). Its stationary
    distribution gives the mean queue past ``c`` (a geometric tail at the full batch's turnover), and Little's
    law the wait; times :data:`EQUAL_LENGTHS_WAIT_FACTOR`. Against apmw's simulator (Llama-3.1-8B on H200,
    1,024/256 tokens and 64 slots, 300/300 and 32; tests/sim/test_cross_check.py) the TTFT it adds is within a
    factor of two from 85 to 97 % of the slots' capacity, where the engine alone was 3-15x low."""
    lam = arrival_rate_per_s
    counts = np.unique(np.round(np.geomspace(1, slots, SLOT_CHAIN_POINTS)).astype(int))
    e2e = np.interp(np.arange(1, slots + 1), counts, [e2e_s_at(int(k)) for k in counts])
    full = lam * e2e[-1] / slots                        # the queue's ratio past c: arrivals over full turnover
    if full >= 1:
        return float("inf")
    log_p = np.concatenate([[0.0], np.cumsum(np.log(lam * e2e / np.arange(1, slots + 1)))])   # pi(0..c), unscaled
    p = np.exp(log_p - log_p.max())
    total = p.sum() + p[-1] * full / (1 - full)
    queued = p[-1] * full / (1 - full) ** 2 / total     # mean requests past c: sum over k >= 1 of k pi(c) full^k
    return EQUAL_LENGTHS_WAIT_FACTOR * queued / lam
