"""Open-loop serving benchmark prediction: Poisson arrivals at a fixed rate (MLPerf Server,
vLLM ``bench serve --request-rate``).

The requests in the engine, ``N``, satisfy Little's law ``N = lambda * E2E(N)``; the
fixed-concurrency model (:mod:`apmw.capacity.benchmark`) at ``N``, with Poisson arrival timing,
gives ``E2E(N)``, and a bisection finds ``N``. Fluctuations of ``N`` itself are not modelled (a
fluid steady state).
"""

from __future__ import annotations

import math
from dataclasses import replace

from apmw.capacity.benchmark import (PredictError, Prediction, check_request_lengths, kv_fit_requests, predict_with,
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
    check_request_lengths(isl, osl, 1)
    if not request_rate_per_s > 0:
        raise PredictError(f"request_rate_per_s must be positive (got {request_rate_per_s:g} requests/s)")
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
    # Poisson (M/G/infinity), so the engine is idle with probability exp(-lambda x time)
    busy_share = 1.0 - math.exp(-request_rate_per_s * p.e2e_latency_s)
    p = replace(p, ttft_s=p.ttft_s + overhead_s, e2e_latency_s=p.e2e_latency_s + overhead_s,
                ttft_parts_s={**p.ttft_parts_s, "request_overhead": overhead_s})
    return with_power(replica, p, isl, osl, busy_share)


def predict_open_loop(replica: Replica, isl: int, osl: int, arrival_rate_per_s: float) -> Prediction:
    """Steady state under Poisson arrivals at ``arrival_rate_per_s`` per replica (MLPerf Server).

    The requests in the engine, ``N``, satisfy Little's law ``N = lambda * E2E(N)``; we
    find it by bisection on the fixed-concurrency model (no first-wave burst: arrivals
    are spread), with Poisson arrival timing for TTFT (inspection paradox, prompts sharing an
    iteration; :func:`_spread_out`). Fluctuations of ``N`` itself are not modelled (a fluid
    steady state). Raises :class:`PredictError` when the rate exceeds capacity.
    """
    if arrival_rate_per_s <= 0:
        raise PredictError(f"arrival rate must be positive (got {arrival_rate_per_s})")
    if kv_fit_requests(replica, isl, osl, full_length=True) < 1:
        raise PredictError(f"one request of {isl}+{osl} tokens does not fit in the KV memory")
    cap = min(replica.policy.max_batch, kv_fit_requests(replica, isl, osl))

    def excess(n: int) -> tuple[float, Prediction]:
        p = predict_with(replica, isl, osl, n, requests_per_client=10**9, length_spread=1.0, poisson_arrivals=True)
        return arrival_rate_per_s * p.e2e_latency_s - n, p

    lo, hi = 1, cap
    e_hi, p_hi = excess(hi)
    if e_hi > 0:
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
    # open loop: every offered request is served, so throughput is the offered load
    out_per_gpu = arrival_rate_per_s * osl / replica.gpus
    return replace(p, output_tokens_per_s_per_gpu=out_per_gpu,
                   total_tokens_per_s_per_gpu=out_per_gpu * (isl + osl) / osl)
