"""A serving benchmark on disaggregated prefill and decode workers (``apmw predict --disagg``).

``W_p`` prefill workers and ``W_d`` decode workers, each with its own layout; ``concurrency`` clients
each keep one request in flight (InferenceMAX, Dynamo's benchmarks). A request is prefilled on the
first free prefill worker; its KV then crosses to a decode worker, which streams every token, the first
once the KV has landed (SGLang's router and Dynamo send a request to both workers and read the decode
worker's stream), and decodes the rest in decode-only iterations (no prompt ever stalls them):

    prefill service  S  = ceil(isl / budget) x t_one + isl x per_token     (one prompt alone on a worker)
    batches          a worker packs k = budget // isl prompts (1 when a prompt exceeds the budget) into one
                     iteration of time S_k: W_p x k servers of service S_k
    prefill wait     Wq = Erlang C over them at arrivals lambda, plus what sharing a batch adds to a prompt's
                     own S as the batches fill (apmw.capacity.disaggregation.batched_prefill_wait_s)
    hand-off         = isl x KV bytes per token / (link x prefill GPUs)
    TTFT             = Wq + S + hand-off + request overhead
    TPOT             = a decode worker's decode-only iteration at its running batch b, contexts isl + osl/2
                       (under speculative decoding: over the tokens one iteration yields per sequence)
    E2E              = TTFT + (osl - 1) x TPOT
    closed loop      concurrency = lambda x E2E;  b = lambda / W_d x (hand-off + (osl - 1) x TPOT), capped at
                     the decode worker's batch limit and KV memory

``lambda`` is found by bisection. When the decode workers' limits cap ``b``, or the prefill workers
saturate, the requests past what they serve wait before their prefill: the wait is added to TTFT, as the
aggregated model adds its slot queue. Not modelled: the first wave's burst (every client's first prompt
arriving at once), a fixed cost of the hand-off beyond its bytes (the transfer's set-up, the decode
worker's admission), and the decode worker's own scheduling overheads beyond its iteration time. With free prefill (``S = 0`` and an
instant hand-off) TPOT is the aggregated model's decode-only iteration at the same batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from apmw.capacity.benchmark import (PredictError, Prediction, check_benchmark_counts,
                                     decode_load, draft_factor, kv_fit_requests, replica_for_benchmark,
                                     speculative_figures)
from apmw.capacity.disaggregation import batched_prefill_wait_s
from apmw.errors import ApmwError
from apmw.perf import GpuGroup, IterationLoad, Replica
from apmw.spec.serving import MAX_DISAGG_WORKERS, MAX_LINK_BYTES_PER_S, MIN_LINK_BYTES_PER_S

# Bisection steps on the request rate: 2^-60 of the bracket, far below any printed digit.
_BISECTION_STEPS = 60

# What this model is worth on published disaggregated runs no figure of apmw was fitted on: InferenceMAX's GB200
# NVL72 runs with Dynamo (SGLang, TensorRT-LLM) and MI355X runs on SGLang, each setting's repeated runs merged
# (``python bench/accuracy.py``, its disaggregated table; docs/accuracy.md): the points predicted, the median
# |error| of mean TTFT and TPOT (predicted / measured - 1), and the points whose TTFT comes out below the
# measured one. tests/capacity/test_disaggregated_accuracy.py recomputes them from ../shared/data.
HELD_OUT_POINTS = 125
HELD_OUT_TTFT_ERROR = 0.921
HELD_OUT_TPOT_ERROR = 0.302
HELD_OUT_TTFT_BELOW = 76


def accuracy_caveat() -> str:
    """What a user should know before reading a disaggregated prediction's TTFT (the held-out figures above)."""
    return (f"disaggregated serving is apmw's least checked prediction: on {HELD_OUT_POINTS} published disaggregated "
            "runs it was not fitted on (InferenceMAX: GB200 NVL72 with Dynamo on SGLang and TensorRT-LLM, MI355X on "
            f"SGLang; bench/accuracy.py, docs/accuracy.md) its mean TTFT is off by a median {HELD_OUT_TTFT_ERROR:.0%} "
            f"(below the measured on {HELD_OUT_TTFT_BELOW} of them, whose first token comes a hand-off apmw does not "
            f"model after the prefill; above on {HELD_OUT_POINTS - HELD_OUT_TTFT_BELOW}, near the prefill workers' "
            f"capacity, which apmw puts lower than the runs show) and its TPOT by a median {HELD_OUT_TPOT_ERROR:.0%}; "
            "treat the TTFT as unverified")


@dataclass(frozen=True)
class Workers:
    """One side of a disaggregated deployment: how many workers, and each one's layout beyond ``tp``."""

    count: int
    tp: int
    layout: dict | None = None      # apmw.spec.Parallelism's fields but tp (pp, dp_attention, moe_tp, ep)


def predict_disaggregated(model: str, gpu: str, weight_dtype: str, kv_dtype: str, isl: int, osl: int,
                          concurrency: int, prefill: Workers, decode: Workers, engine: str = "vllm",
                          calibrated: bool = True, kv_transfer_bandwidth_bytes_per_s: float = 50e9,
                          request_overhead_s: float | None = None, token_budget: int | None = None,
                          max_batch: int | None = None, kv_memory_fraction: float | None = None,
                          moe_dtype: str | None = None, engine_version: str | None = None,
                          mxfp4_moe_activations: str | None = None, speculative: dict | None = None) -> Prediction:
    """Predict a fixed-concurrency benchmark on ``prefill.count`` prefill and ``decode.count`` decode workers
    (module docstring); ``concurrency`` is the total over all decode workers. ``speculative``
    (:class:`apmw.spec.Speculative`'s fields) drafts on both sides: the decode workers verify ``k + 1``
    tokens per sequence, and the draft's share of an iteration is added on the prefill workers too, as
    the aggregated benchmark adds it to every iteration."""
    check_benchmark_counts(isl, osl, concurrency)
    for side, w in (("prefill", prefill), ("decode", decode)):
        if w.count < 1:
            raise PredictError(f"a disaggregated replica needs at least one {side} worker (--{side}-workers): "
                               f"got {w.count}")
        if w.count > MAX_DISAGG_WORKERS:
            raise PredictError(f"--{side}-workers {w.count:,}: a disaggregated replica has at most {MAX_DISAGG_WORKERS:,} "
                               f"{side} workers (--{side}-workers), as serving.disaggregation allows")
    if not MIN_LINK_BYTES_PER_S <= kv_transfer_bandwidth_bytes_per_s <= MAX_LINK_BYTES_PER_S:
        raise PredictError(f"kv_transfer_bandwidth_bytes_per_s must be {MIN_LINK_BYTES_PER_S:g} to "
                           f"{MAX_LINK_BYTES_PER_S:g} bytes/s (--kv-transfer-gb-per-s {MIN_LINK_BYTES_PER_S / 1e9:g} to "
                           f"{MAX_LINK_BYTES_PER_S / 1e9:g}), got {kv_transfer_bandwidth_bytes_per_s:g} bytes/s "
                           f"({kv_transfer_bandwidth_bytes_per_s / 1e9:g} GB/s)")
    common = dict(engine=engine, calibrated=calibrated, token_budget=token_budget, max_batch=max_batch,
                  kv_memory_fraction=kv_memory_fraction, request_overhead_s=request_overhead_s, moe_dtype=moe_dtype,
                  engine_version=engine_version, mxfp4_moe_activations=mxfp4_moe_activations,
                  speculative=speculative)
    pre = _worker_replica("prefill", prefill, model, gpu, weight_dtype, kv_dtype, isl, osl, common)
    dec = _worker_replica("decode", decode, model, gpu, weight_dtype, kv_dtype, isl, osl, common)
    overhead_s = dec.policy.request_overhead_s
    service_s, prefill_compute = _prefill_service_s(pre, isl)
    per_batch = max(min(pre.policy.token_budget // isl, pre.policy.max_batch), 1)
    batch_s = _prefill_batch_s(pre, isl, per_batch) if per_batch > 1 else service_s
    handoff_s = isl * dec.step.kv_bytes_per_token / (kv_transfer_bandwidth_bytes_per_s * pre.gpus)
    cap = min(dec.policy.max_batch, kv_fit_requests(dec, isl, osl))
    if cap < 1:
        raise PredictError(f"one request of {isl}+{osl} tokens does not fit in the KV memory of a decode worker "
                           f"({dec.gpus} x {dec.gpu.name}); give the decode workers more GPUs or an fp8 kv_dtype")
    point = _solve(concurrency, prefill.count, decode.count, service_s, handoff_s, overhead_s, osl,
                   _decode_curve(dec, isl, osl, cap), cap, per_batch, batch_s)
    gpus = prefill.count * pre.gpus + decode.count * dec.gpus
    running = min(round(point.batch * decode.count), concurrency)
    power_w = dec.power.it_power_w(GpuGroup(decode.count * dec.gpus, 1.0, point.decode_compute_share(dec, isl, osl)),
                                   GpuGroup(prefill.count * pre.gpus, point.prefill_utilisation, prefill_compute))
    throughput = point.rate_per_s * osl
    return Prediction(
        ttft_s=point.ttft_s, tpot_s=point.tpot_s, e2e_latency_s=point.e2e_s,
        output_tokens_per_s_per_gpu=throughput / gpus, total_tokens_per_s_per_gpu=throughput * (isl + osl) / osl / gpus,
        running_requests=running, queued_requests=max(concurrency - running, 0),
        running_limited_by="concurrency" if point.batch < cap else
        ("max_batch" if cap == dec.policy.max_batch else "kv_memory"),
        kv_tokens_per_running_request=dec.policy.kv_tokens_per_running_request(isl, osl),
        decode_iteration_s=point.tpot_s * (dec.speculative.tokens_per_iteration if dec.speculative else 1.0),
        mixed_iteration_s=service_s, mixed_iteration_share=0.0, lockstep_share=0.0,
        prompts_arrive="spread out", prefill_mixed_with_decode=False, iterations_scheduled_ahead=0,
        ttft_parts_s={"steady_state": service_s, "first_wave": 0.0, "request_overhead": overhead_s,
                      "slot_queue": point.wait_s, "kv_handoff": handoff_s},
        source=dec.step.source,
        source_detail=(f"disaggregated: {prefill.count} prefill worker(s) of {pre.step.parallel.describe()} "
                       f"({pre.step.source}), {decode.count} decode worker(s) of {dec.step.parallel.describe()} "
                       f"({dec.step.source_detail})"),
        serving_policy=dec.policy.to_dict(), speculative=speculative_figures(dec), replica_power_w=power_w,
        output_tokens_per_j=throughput / power_w, engine_busy_share=1.0,
        compute_bound_share=point.decode_compute_share(dec, isl, osl))


def _worker_replica(side: str, w: Workers, model: str, gpu: str, weight_dtype: str, kv_dtype: str, isl: int,
                    osl: int, common: dict) -> Replica:
    """One worker's replica; an error names the side ('prefill workers: tp 3 does not divide ...')."""
    try:
        return replica_for_benchmark(model, gpu, w.tp, weight_dtype, kv_dtype, isl, osl, layout=w.layout, **common)
    except ApmwError as exc:
        raise PredictError(f"{side} workers: {exc}") from None


def _prefill_service_s(pre: Replica, isl: int) -> tuple[float, float]:
    """(seconds one prompt occupies a prefill worker, the compute-bound share of that time)."""
    budget = pre.policy.token_budget
    chunk = min(isl, budget)
    a = pre.arch

    def load(tokens: float) -> IterationLoad:
        return IterationLoad(decode_seqs=0.0, prefill_tokens=tokens, kv_read_bytes=0.0,
                             attention_flops=tokens * float(a.attention_flops_per_token(isl / 2)))
    t_chunk = float(pre.step.iteration_time_s(load(chunk))) * draft_factor(pre)
    t_one = float(pre.step.iteration_time_s(load(1.0))) * draft_factor(pre)
    per_token = max(t_chunk - t_one, 0.0) / max(chunk - 1.0, 1.0)
    return math.ceil(isl / budget) * t_one + isl * per_token, float(pre.step.compute_share(load(chunk)))


def _prefill_batch_s(pre: Replica, isl: int, prompts: int) -> float:
    """Seconds one prefill iteration takes carrying ``prompts`` whole prompts of ``isl`` tokens."""
    a = pre.arch
    return float(pre.step.iteration_time_s(IterationLoad(
        decode_seqs=0.0, prefill_tokens=prompts * isl, kv_read_bytes=0.0,
        attention_flops=prompts * isl * float(a.attention_flops_per_token(isl / 2))))) * draft_factor(pre)


def _decode_curve(dec: Replica, isl: int, osl: int, cap: int):
    """A decode worker's time per output token at any batch up to ``cap``: its decode-only iteration
    priced once at every whole batch (one vectorised call) over the tokens one iteration yields per
    sequence (one without speculative decoding), linear between them, for the closed loop's fixed points."""
    batch = np.arange(1.0, cap + 1.0)
    accepted = dec.speculative.tokens_per_iteration if dec.speculative else 1.0
    times = np.asarray(dec.step.iteration_time_s(decode_load(dec, batch, isl + osl / 2)), dtype=float)
    per_token = times * draft_factor(dec) / accepted
    return lambda b: float(np.interp(b, batch, per_token))


@dataclass(frozen=True)
class _Point:
    rate_per_s: float
    batch: float              # running requests per decode worker
    tpot_s: float
    ttft_s: float
    e2e_s: float
    wait_s: float             # before the prefill: the prefill queue, and any wait for a decode slot
    prefill_utilisation: float

    def decode_compute_share(self, dec: Replica, isl: int, osl: int) -> float:
        return float(dec.step.compute_share(decode_load(dec, max(self.batch, 1.0), isl + osl / 2)))


def _solve(concurrency: int, prefill_workers: int, decode_workers: int, service_s: float, handoff_s: float,
           overhead_s: float, osl: int, tpot_at, cap: int, per_batch: int = 1, batch_s: float = 0.0) -> _Point:
    """The closed loop's operating point (module docstring): bisection on the request rate."""

    def decoding(rate: float) -> tuple[float, float]:
        """(batch per decode worker, TPOT) where the decode workers carry ``rate`` requests/s (fixed point)."""
        b = 1.0
        for _ in range(50):
            tpot = tpot_at(b)
            target = min(max(rate / decode_workers * (handoff_s + (osl - 1) * tpot), 1.0), cap)
            if abs(target - b) < 1e-6 * b:
                break
            b = 0.5 * (b + target)
        return b, tpot_at(b)

    def served(rate: float) -> tuple[float, float, float, float, float]:
        """(clients the loop holds at ``rate``, batch, TPOT, prefill wait, prefill workers' busy share)."""
        b, tpot = decoding(rate)
        wait, busy = batched_prefill_wait_s(prefill_workers, per_batch, service_s, batch_s or service_s, rate)
        return rate * (wait + service_s + overhead_s + handoff_s + (osl - 1) * tpot), b, tpot, wait, busy

    # the most requests/s each side can carry: the prefill workers busy all the time, or every decode
    # worker at its cap
    full_tpot = tpot_at(float(cap))
    rate_max = min(prefill_workers * per_batch / (batch_s or service_s),
                   decode_workers * cap / (handoff_s + (osl - 1) * full_tpot))
    lo, hi = 0.0, rate_max * (1 - 1e-9)
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        if served(mid)[0] < concurrency:
            lo = mid
        else:
            hi = mid
    rate = lo
    held, b, tpot, wait, busy = served(rate)
    # clients past what the workers serve wait before their prefill (Little: their share of the cycle)
    wait += max(concurrency - held, 0.0) / max(rate, 1e-30)
    ttft = wait + service_s + handoff_s + overhead_s
    e2e = ttft + (osl - 1) * tpot
    return _Point(rate_per_s=concurrency / e2e, batch=b, tpot_s=tpot, ttft_s=ttft, e2e_s=e2e, wait_s=wait,
                  prefill_utilisation=busy)
