"""Fixed-concurrency serving benchmark prediction (InferenceMAX, vLLM benchmark_serving).

``C`` clients each send a request of ``isl`` prompt tokens, wait for all ``osl``
output tokens, then send the next (MLPerf Offline / Server and vLLM's
``--max-concurrency`` runs have this shape). The engine runs continuous batching with
chunked prefill (a token budget per iteration, decode tokens counted first, as vLLM V1,
SGLang and TensorRT-LLM do), a batch limit and a KV-memory limit. We predict the steady
state with one step-time model (the same one ``apmw plan`` uses), as a fluid balance
over one request cycle:

* running requests ``R = min(C, max_batch, KV fits)``, where a running request holds
  ``isl + osl/2`` of KV on average in engines that admit by need (vLLM, SGLang) and
  ``isl + osl`` in TensorRT-LLM, which reserves to the end (:mod:`apmw.perf.serving_policy`;
  the recompute of requests preempted at that limit is not priced); the other ``C - R`` queue, and
  each queued request waits ``(C/R - 1)`` request lifetimes (closed loop, FIFO);
* a benchmark client starts every request at once, and whether the requests stay in
  step depends on how much their lengths vary (``length_spread``, the width of the length
  distribution as a share of the mean). With equal lengths (``0``: vLLM ``bench serve``'s
  random dataset and AIPerf/genai-perf by default, ``--ignore-eos``) they stay in lock
  step (:mod:`apmw.capacity.benchmark_waves`). With varied lengths (InferenceMAX: uniform
  in ``[0.8 L, L]``, its ``random_range_ratio: 0.8``) finishing times spread over
  ``length_spread x osl`` iterations and prompts arrive spread out (:func:`_spread_out`).
  In between, the two are blended by :func:`~apmw.capacity.benchmark_waves.lockstep_share`,
  fitted to apmw's iteration-level simulator (``bench/predict_vs_sim.py``);
* spread out: a new prompt is prefilled in ``n = ceil(isl / (budget - decoders))`` mixed
  iterations with the other requests decoding; over one cycle the engine runs
  ``R*isl / chunk`` mixed iterations and the rest are pure decode, so the time per output
  token is the cycle-weighted mean of the two; TTFT = half an iteration of arrival wait
  + one more where the engine schedules ahead (all three do by default: vLLM's async
  scheduling, SGLang's and TensorRT-LLM's overlap schedulers, :mod:`apmw.perf.serving_policy`)
  + the ``n`` mixed iterations (+ queue wait when prefill-bound);
* in lock step, and for the first wave (which arrives all at once and weighs
  ``1/requests_per_client`` of the mean TTFT): :mod:`apmw.capacity.benchmark_waves`;
* engines that run prefill alone and first (SGLang's default; :mod:`apmw.perf.serving_policy`)
  give a prompt the whole budget and stall every decoder for its prefill iterations
  (:func:`_prefill_first`); with equal lengths every cycle repeats the first wave
  (:mod:`apmw.capacity.benchmark_waves`).
  On NVIDIA's published NIM runs (equal lengths; ``bench/accuracy.py``) the spread-out
  model fits TTFT better than lock step, so the default spread is 0.2, not 0
  (``DEFAULT_LENGTH_SPREAD``).

Under speculative decoding (``speculative``, :mod:`apmw.perf.speculative`) a request's decode runs
``(osl - 1) / y`` iterations, ``y`` the tokens one iteration yields per sequence; each of them verifies
``k + 1`` tokens per decoder and carries the draft's share (:func:`decode_load`, :func:`draft_factor`), and
the dynamics above count a request's length in those iterations.

Every iteration time comes from :class:`apmw.perf.StepModel` (``calibrated`` from
measured kernel tables where they cover the replica, ``roofline`` otherwise), with KV
read at the mean context of a decoding request (``isl + osl/2``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from numbers import Real

import numpy as np
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from apmw.capacity.arrival_wait import arrival_wait_s, poisson_wait_s
from apmw.capacity.benchmark_waves import lockstep_groups, lockstep_share, wave_mean_ttft_s, whole_waves
from apmw.capacity.search import MAX_AGENTS
from apmw.arch import load_architecture
from apmw.errors import ApmwError
from apmw.perf import GpuGroup, IterationLoad, Replica, benchmark_replica
from apmw.perf.parallelism import EXPERT_SETTINGS, refuse_expert_settings
from apmw.perf.serving_policy import ENGINES, canonical_engine
from apmw.spec import Parallelism, Serving
from apmw.spec.section import named_field

# How much request lengths vary, as the width of their distribution over the mean
# (see the module docstring). 0.2 by default: InferenceMAX draws lengths uniformly
# from [0.8 L, L] (width 0.2 L around 0.9 L), and NVIDIA's published NIM runs, whose
# lengths are all equal, also behave as spread out rather than in lock-step groups
# (on its 79 rows spread 0 gives median |TTFT error| 58 %, 0.2 gives 32 %;
# `python bench/accuracy.py`).
DEFAULT_LENGTH_SPREAD = 0.2

# A benchmark's prompts per client (its prompt count over its concurrency): the first,
# simultaneous wave weighs 1/N of the mean TTFT. InferenceMAX sends 10 x concurrency
# (`--num-prompts $((CONC * 10))`); NVIDIA's NIM guide 3 x (docs/accuracy.md).
DEFAULT_REQUESTS_PER_CLIENT = 10


class PredictError(ApmwError):
    """A benchmark setting that cannot be predicted (does not fit, bad numbers)."""


@dataclass(frozen=True)
class Prediction:
    """One predicted benchmark point; times in seconds, rates per second."""

    ttft_s: float
    tpot_s: float
    e2e_latency_s: float
    output_tokens_per_s_per_gpu: float
    total_tokens_per_s_per_gpu: float
    running_requests: int
    queued_requests: int
    # what caps the running requests: "concurrency" (nobody queues), "max_batch" or "kv_memory"
    running_limited_by: str
    kv_tokens_per_running_request: float   # what the engine counts per running request (apmw.perf.serving_policy)
    decode_iteration_s: float
    mixed_iteration_s: float
    mixed_iteration_share: float      # share of iterations that carry prompt tokens
    lockstep_share: float             # 1: requests move in lock-step groups (equal lengths); 0: spread out
    prompts_arrive: str               # "in lock-step groups" (lockstep_share >= 0.5) or "spread out"
    # True: prompt chunks ride beside the decodes (vLLM, TensorRT-LLM); False: prefill iterations
    # run alone and first (SGLang's default; apmw.perf.serving_policy)
    prefill_mixed_with_decode: bool
    # the engine's setting: 1 when it forms the next iteration's batch while the current one runs
    # (vLLM async scheduling, SGLang's and TensorRT-LLM's overlap schedulers), so a prompt arriving
    # at a busy engine waits one more iteration; 0 when it joins the next (apmw.perf.serving_policy).
    # The wait charged is less where nothing is in flight (concurrency 1, a lock-step group coming
    # back to an idle engine) or where prompts queue for the budget anyway (prefill-bound).
    iterations_scheduled_ahead: int
    # what the mean TTFT is made of (they sum to ttft_s): "steady_state", a prompt's wait for the
    # iterations in flight and scheduled ahead, its turn at the budget and its own prefill, once the
    # first wave is over; "first_wave", that wave's excess over the steady state weighted by
    # 1 / requests_per_client; "request_overhead", outside the engine; "slot_queue", the wait for a
    # running slot when the batch or KV limit caps the running requests; "kv_handoff", the prompt's KV
    # crossing from a prefill worker to a decode worker (disaggregated; 0 otherwise)
    ttft_parts_s: dict
    source: str
    source_detail: str
    # the engine settings the prediction assumed, every default resolved (apmw.perf.ServingPolicy)
    serving_policy: dict
    # speculative decoding as priced (draft_tokens, acceptance_rate, draft_cost_fraction and the
    # tokens_per_iteration they give; apmw.perf.speculative), None without it
    speculative: dict | None
    # Phase-aware wall power of the replica's GPUs plus their host share (apmw.perf.power),
    # and output tokens per joule of it; filled by predict(), None from predict_with().
    replica_power_w: float | None = None
    output_tokens_per_j: float | None = None
    # the operating point that power was priced at: share of time busy, compute-bound share of that
    engine_busy_share: float | None = None
    compute_bound_share: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def predict(model: str, gpu: str, tp: int, weight_dtype: str, kv_dtype: str, isl: int, osl: int,
            concurrency: int, engine: str = "vllm", token_budget: int | None = None,
            max_batch: int | None = None, calibrated: bool = True,
            length_spread: float = DEFAULT_LENGTH_SPREAD, request_overhead_s: float | None = None,
            requests_per_client: int = DEFAULT_REQUESTS_PER_CLIENT, mixed_prefill: bool | None = None,
            overlap_scheduling: bool | None = None, kv_memory_fraction: float | None = None,
            layout: dict | None = None, moe_dtype: str | None = None,
            engine_version: str | None = None, mxfp4_moe_activations: str | None = None,
            scheduler_recv_interval: int | None = None, speculative: dict | None = None) -> Prediction:
    """Predict a fixed-concurrency benchmark point (see the module docstring).

    The engine settings (``engine``, ``token_budget``, ``max_batch``, ``mixed_prefill``,
    ``overlap_scheduling``, ``kv_memory_fraction``, ``request_overhead_s``) default to the engine's
    own for the GPU (:mod:`apmw.perf.serving_policy`). ``requests_per_client`` is the benchmark's
    prompt count over its concurrency (InferenceMAX: 10); the first wave, which arrives all at
    once, weighs ``1 / requests_per_client`` of TTFT. ``layout`` lays the replica out beyond tensor
    parallelism (``{"pp": 2}``, ``{"dp_attention": 8, "ep": 8}``: :class:`apmw.spec.Parallelism`'s fields
    but ``tp``); ``concurrency`` is then the total over all its DP ranks. ``engine_version`` pins the
    engine's own measured tables of that release (:func:`apmw.perf.tables.check_engine_version`).
    ``mxfp4_moe_activations``, ``scheduler_recv_interval`` and ``speculative`` (``{"draft": "mtp"}``,
    ``{"draft": "model", "draft_tokens": 4, "acceptance_rate": 0.7}``: :class:`apmw.spec.Speculative`'s
    fields) are :class:`apmw.spec.Serving`'s fields of those names.
    """
    if requests_per_client < 1:
        raise PredictError(f"requests_per_client must be at least 1 (got {requests_per_client})")
    check_benchmark_counts(isl, osl, concurrency, tp)
    replica = replica_for_benchmark(model, gpu, tp, weight_dtype, kv_dtype, isl, osl, engine, calibrated,
                                    token_budget=token_budget, max_batch=max_batch, mixed_prefill=mixed_prefill,
                                    overlap_scheduling=overlap_scheduling, kv_memory_fraction=kv_memory_fraction,
                                    request_overhead_s=request_overhead_s, layout=layout, moe_dtype=moe_dtype,
                                    engine_version=engine_version, mxfp4_moe_activations=mxfp4_moe_activations,
                                    scheduler_recv_interval=scheduler_recv_interval, speculative=speculative)
    p = predict_with(replica, isl, osl, concurrency, requests_per_client=requests_per_client,
                     request_overhead_s=replica.policy.request_overhead_s, length_spread=length_spread)
    return with_power(replica, p, isl, osl)


# Serving fields a benchmark sets under another name.
_PARAMETERS = {"max_batched_tokens": "token_budget"}


def replica_for_benchmark(model: str, gpu: str, tp: int, weight_dtype: str, kv_dtype: str, isl: int, osl: int,
                          engine: str = "vllm", calibrated: bool = True, *, token_budget: int | None = None,
                          max_batch: int | None = None, mixed_prefill: bool | None = None,
                          overlap_scheduling: bool | None = None, kv_memory_fraction: float | None = None,
                          request_overhead_s: float | None = None, layout: dict | None = None,
                          moe_dtype: str | None = None, engine_version: str | None = None,
                          mxfp4_moe_activations: str | None = None,
                          scheduler_recv_interval: int | None = None, speculative: dict | None = None) -> Replica:
    """The replica a serving benchmark runs on; engine settings left ``None`` are the engine's defaults.
    ``layout``: the parallel sizes beyond ``tp`` (:class:`apmw.spec.Parallelism`'s fields)."""
    engine = canonical_engine(engine)
    if engine not in ENGINES:
        raise PredictError(f"unknown engine '{engine}'; use one of: {', '.join(ENGINES)}")
    for name, v in (("token_budget", token_budget), ("max_batch", max_batch)):
        if v is not None and v < 1:
            raise PredictError(f"{name} must be at least 1 (got {v})")
    if kv_memory_fraction is not None and not 0 < kv_memory_fraction <= 1:
        raise PredictError(f"kv_memory_fraction must be in (0, 1] (got {kv_memory_fraction:g}); it is the "
                           f"engine's memory share, e.g. vLLM --gpu-memory-utilization 0.9")
    if request_overhead_s is not None:
        check_overhead_s(request_overhead_s)
    if layout is not None and not isinstance(layout, Mapping):
        raise PredictError(f"layout must be a mapping of parallel sizes such as {{'dp_attention': 8, 'ep': 8}} "
                           f"(got {type(layout).__name__} {layout!r})")
    if layout and "tp" in layout and layout["tp"] != tp:
        raise PredictError(f"layout gives tp {layout['tp']!r} and the tp argument {tp!r}: give tensor parallelism "
                           "once, as tp")
    settings: dict[str, object] = {"engine": engine, "max_batched_tokens": token_budget, "max_batch": max_batch,
                "mixed_prefill": mixed_prefill, "overlap_scheduling": overlap_scheduling,
                "engine_version": engine_version, "mxfp4_moe_activations": mxfp4_moe_activations,
                "scheduler_recv_interval": scheduler_recv_interval, "speculative": speculative}
    if kv_memory_fraction is not None:
        settings["kv_memory_fraction"] = kv_memory_fraction
    if layout and any(k in layout for k in EXPERT_SETTINGS):
        # before the sizes are checked: `--moe-tp 1` on a dense model was refused for its MoE arithmetic, `--ep 2`
        # for the model having no experts
        arch = load_architecture(model)
        if not arch.moe_layers:
            refuse_expert_settings(arch, "layout")
    try:
        if layout:
            par = Parallelism.model_validate({**layout, "tp": tp})
            settings["parallelism"] = par.resolved(None)
        serving = Serving.model_validate(settings)
    except ValidationError as exc:   # what the spec's own bounds refuse, named as this function's parameters
        raise PredictError("; ".join(_setting_error(e) for e in exc.errors())) from None
    except ValueError as exc:       # a layout that does not multiply out
        raise PredictError(str(exc)) from None
    replica = benchmark_replica(model, gpu, tp, weight_dtype, kv_dtype, serving, calibrated, request_overhead_s,
                                moe_dtype=moe_dtype)
    _check_window(replica, isl, osl)
    return replica


def _setting_error(e: ErrorDetails) -> str:
    """One of pydantic's errors on the benchmark's settings, named as this module's parameters: a bound
    with the value given, a rule across fields (a model validator's) in its own words."""
    rule = e["msg"].startswith("Value error, ")
    message = e["msg"].removeprefix("Value error, ")
    loc = tuple(e["loc"]) + named_field(e)
    if not loc:
        return message
    name = _PARAMETERS.get(str(loc[-1]), loc[-1])
    return f"{name}: {message}" if rule else f"{name}: {message} (got {e['input']!r})"


def with_power(replica: Replica, p: Prediction, isl: int, osl: int, busy_share: float = 1.0) -> Prediction:
    """Fill the phase-aware replica power (GPUs plus host share) and output tokens per joule.

    ``busy_share`` is the share of time the engine has work (1 in a closed loop); the GPUs
    draw their idle power the rest of the time.
    """
    compute = compute_bound_share(replica, p, isl, osl)
    power_w = replica.power.it_power_w(GpuGroup(replica.gpus, busy_share, compute))
    throughput = p.output_tokens_per_s_per_gpu * replica.gpus
    return replace(p, replica_power_w=power_w, output_tokens_per_j=throughput / power_w, engine_busy_share=busy_share,
                   compute_bound_share=compute)


def check_overhead_s(request_overhead_s: float) -> None:
    """A request's overhead outside the engine: finite seconds, at least 0 (an infinite one leaves no first token
    to time)."""
    if isinstance(request_overhead_s, bool) or not (isinstance(request_overhead_s, Real)
                                                    and 0 <= request_overhead_s < math.inf):
        raise PredictError(f"request_overhead_s must be a finite non-negative number of seconds "
                           f"(got {request_overhead_s!r})")


def check_benchmark_counts(isl: int, osl: int, concurrency: int, tp: int = 1) -> None:
    """A benchmark's request lengths, clients and tensor-parallel size: each a whole number of at least 1, or a
    clear error (the Python API takes them as given: a "1" or 1.5 would fail deeper down, unexplained), and no
    more clients than apmw models."""
    for name, v in (("isl", isl), ("osl", osl), ("concurrency", concurrency), ("tp", tp)):
        whole = isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(v) and v == int(v)
        if not whole or v < 1:
            raise PredictError(f"{name} must be a whole number of at least 1 (got {v!r})")
    if concurrency > MAX_AGENTS:
        raise PredictError(f"concurrency {concurrency:,} is past the {MAX_AGENTS:,} clients apmw models on one replica "
                           "(as for agents: apmw.capacity.search.MAX_AGENTS); give fewer")


def _check_window(replica: Replica, isl: int, osl: int) -> None:
    """What the engines themselves refuse: requests longer than the model's window."""
    arch = replica.arch
    if arch.max_context_tokens and isl + osl > arch.max_context_tokens:
        raise PredictError(f"isl + osl = {isl + osl:,} tokens exceeds {arch.name}'s context window of "
                           f"{arch.max_context_tokens:,} tokens (max_position_embeddings in its config.json); "
                           f"shorten isl/osl, or pass a config.json whose window is extended")


def kv_fit_requests(replica: Replica, isl: int, osl: int, full_length: bool = False) -> int:
    """How many requests run at once before the replica's KV pool is full.

    A running request counts as the engine counts it when admitting the next
    (:func:`apmw.perf.serving_policy.kv_tokens_per_running_request`): vLLM and SGLang admit by
    need, so requests whose progress is spread out hold ``isl + osl/2`` on average;
    TensorRT-LLM reserves ``isl + osl``. ``full_length``: requests at ``isl + osl`` whatever
    the engine (does one request fit at all?).
    """
    step = replica.step
    tokens = isl + osl if full_length else replica.policy.kv_tokens_per_running_request(isl, osl)
    per_request = step.kv_bytes_per_token * tokens * step.kv_replication
    return max(int(replica.memory.kv_capacity_bytes // per_request), 0)


def predict_with(replica: Replica, isl: int, osl: int, concurrency: int,
                 requests_per_client: int = DEFAULT_REQUESTS_PER_CLIENT, request_overhead_s: float = 0.0,
                 length_spread: float = DEFAULT_LENGTH_SPREAD, poisson_arrivals: bool = False) -> Prediction:
    """The steady state of a fixed-concurrency run on one replica (module docstring).

    The engine's rules (token budget, batch limit, mixed or prefill-first iterations, scheduling
    ahead, KV admission) are the replica's serving policy. ``length_spread`` is the width of the
    request-length distribution as a share of the mean (0: every request has the same lengths,
    and the requests move in lock-step groups). ``poisson_arrivals`` prices prompts that arrive
    as a Poisson stream (the open loop of :func:`apmw.capacity.open_loop.predict_open_loop`)
    rather than as completions free slots (see :func:`_spread_out`). ``request_overhead_s`` is
    client-observed time outside the engine (0: the engine's own TTFT).
    """
    if not 0.0 <= length_spread <= 2.0:
        raise PredictError(f"length_spread must be between 0 and 2 (got {length_spread}); 0 means "
                           f"every request has the same lengths")
    check_overhead_s(request_overhead_s)
    step, policy = replica.step, replica.policy
    if kv_fit_requests(replica, isl, osl, full_length=True) < 1:
        raise PredictError(f"one request of {isl}+{osl} tokens does not fit in the KV memory of "
                           f"{step.gpus} x {step.gpu.name}; use a larger tp or an fp8 kv_dtype")
    kv_fit = kv_fit_requests(replica, isl, osl)
    token_budget, max_batch = policy.token_budget, policy.max_batch
    # the dynamics below count a request's length in iterations: its first token, then one iteration per
    # ``accepted`` output tokens (one without speculative decoding); their ``osl`` is this length
    accepted = replica.speculative.tokens_per_iteration if replica.speculative else 1.0
    osl_iters = 1 + (osl - 1) / accepted
    running = min(concurrency, max_batch, kv_fit)
    limited_by = "concurrency" if running == concurrency else "max_batch" if running == max_batch else "kv_memory"
    decoders = running - 1
    mixed, ahead, recv = policy.mixed_prefill, policy.iterations_ahead, policy.recv_interval
    # prompt tokens one iteration can take: what the decoders (and their drafts) leave of the budget, or
    # all of it when prefill iterations run alone
    capacity = max(token_budget - decoders * verified_tokens(replica), 1) if mixed else token_budget
    own_mixed = math.ceil(isl / capacity)
    decode_iters = osl_iters - 1
    wave_iters = running * isl / token_budget            # full-budget iterations a whole wave needs
    lockstep = lockstep_share(running, length_spread * osl_iters, wave_iters, decode_iters, mixed)
    # Spread out and not prefill-bound: each prompt rides (in chunks) with the decoders.
    # Prefill-bound (more prompt tokens per cycle than the cycle's iterations can carry one
    # prompt at a time): every iteration is packed to the budget and prompts queue for it.
    # Prefill first never is: its prefill iterations add to the cycle instead of filling it.
    chunk = min(isl, capacity)
    if mixed and running * isl / chunk > own_mixed + decode_iters:
        chunk = capacity
    # lock-step groups: as many whole prompts as the budget takes (the last group holds the rest)
    per_group = min(capacity // isl, running)
    group = per_group * isl if per_group else capacity
    rest = (running % per_group) * isl if per_group else 0
    burst_chunk = min(token_budget, running * isl)
    wave_rest = running * isl % token_budget             # the first wave's last, partial iteration
    # the iterations that carry prompts: beside every other running request, or alone
    t_decode, t_mixed, t_burst, t_group, t_rest, t_two_chunks, t_wave_rest = _iteration_times(
        replica, running, decoders if mixed else 0, chunk, burst_chunk, group, rest, isl, osl, wave_rest)
    burst_ttft = wave_mean_ttft_s(running, isl, token_budget, t_burst, t_wave_rest)
    room = max(capacity / chunk - 1, 0.0) if poisson_arrivals else None
    if mixed:
        tpot, steady_ttft, share_mixed = _spread_out(isl, osl_iters, running, chunk, own_mixed, t_decode, t_mixed,
                                                     room=room, ahead=ahead, recv_interval=recv)
    else:
        tpot, steady_ttft, share_mixed = _prefill_first(isl, osl_iters, running, chunk, t_decode, t_mixed,
                                                        t_two_chunks, room, ahead=ahead, recv_interval=recv)
    if lockstep > 0:
        lock = (lockstep_groups(isl, osl_iters, capacity, running, per_group, own_mixed, t_decode, t_group, t_rest,
                                ahead=ahead, recv_interval=recv)
                if mixed else whole_waves(isl, osl_iters, capacity, running, t_decode, burst_ttft, t_burst))
        tpot, steady_ttft, share_mixed = (x + (y - x) * lockstep for x, y in
                                          zip((tpot, steady_ttft, share_mixed), lock))
    tpot /= accepted                                      # per iteration -> per output token
    # the first wave arrives all at once and queues for the token budget; it weighs
    # 1 / requests_per_client of the mean
    first_wave_s = max(burst_ttft - steady_ttft, 0.0) / max(requests_per_client, 1)
    ttft_running = steady_ttft + first_wave_s + request_overhead_s
    e2e_running = ttft_running + (osl - 1) * tpot
    queue_s = (concurrency / running - 1) * e2e_running
    throughput = running * osl / e2e_running
    return Prediction(
        ttft_s=ttft_running + queue_s, tpot_s=tpot, e2e_latency_s=e2e_running + queue_s,
        output_tokens_per_s_per_gpu=throughput / step.gpus,
        total_tokens_per_s_per_gpu=throughput * (isl + osl) / osl / step.gpus,
        running_requests=running, queued_requests=concurrency - running, running_limited_by=limited_by,
        kv_tokens_per_running_request=policy.kv_tokens_per_running_request(isl, osl),
        decode_iteration_s=t_decode, mixed_iteration_s=t_group if lockstep >= 0.5 else t_mixed,
        mixed_iteration_share=share_mixed, lockstep_share=lockstep,
        prompts_arrive="in lock-step groups" if lockstep >= 0.5 else "spread out",
        prefill_mixed_with_decode=mixed, iterations_scheduled_ahead=ahead,
        ttft_parts_s={"steady_state": steady_ttft, "first_wave": first_wave_s, "request_overhead": request_overhead_s,
                      "slot_queue": queue_s, "kv_handoff": 0.0},
        source=step.source, source_detail=step.source_detail, serving_policy=policy.to_dict(),
        speculative=speculative_figures(replica),
    )


def _spread_out(isl: int, osl: float, running: int, chunk: float, own_mixed: int, t_decode: float,
                t_mixed: float, room: float | None = None, ahead: float = 0.0,
                recv_interval: int = 1) -> tuple[float, float, float]:
    """TPOT, TTFT and mixed-iteration share when prompts arrive spread over the cycle.

    Over one request cycle the engine runs ``running * isl / chunk`` mixed iterations and
    the rest pure decode. A request's own ``own_mixed`` prefill iterations come before its first
    token, so its time per output token is the mean over its decode iterations, which carry the
    other prompts' mixed iterations (all of them where prompts queue for the budget); the cycle-weighted
    mean of the two sets the waits. A request waits half an iteration and the ``ahead`` already scheduled
    (:func:`arrival_wait_s`; none when it runs alone), then for its prompt's
    turn at the budget (the cycle's iterations not spent decoding it; non-zero only when
    prefill-bound), then its own ``own_mixed`` prefill iterations, the last of which carries
    only the remainder.

    ``room`` (other prompts' chunks the budget leaves room for) switches to Poisson arrivals:
    a prompt then lands in an iteration picked by length (the residual wait is ``E[T^2] / 2E[T]``,
    the inspection paradox), waits the ``ahead`` iterations already scheduled, and shares its
    first iteration with the prompts that arrived during the same one (``rate x E[T^2] / E[T]``
    of them, at most ``room``). Fitted to nothing: the simulator's open loop agrees
    (``bench/predict_vs_sim.py --open-loop``). Prompts that follow completions (a closed loop)
    keep the plain half-iteration residual.
    """
    decode_iters = max(osl - 1, 0)
    mixed_per_cycle = running * isl / chunk
    cycle_iters = max(own_mixed + decode_iters, mixed_per_cycle)
    share = min(mixed_per_cycle / cycle_iters, 1.0)
    t_bar = share * t_mixed + (1 - share) * t_decode
    decoding_mixed = min(max(mixed_per_cycle - own_mixed, 0.0), decode_iters)      # the others' chunks
    tpot = (decoding_mixed * t_mixed + (decode_iters - decoding_mixed) * t_decode) / decode_iters if decode_iters else 0.0
    prompt_queue_iters = max(cycle_iters - decode_iters - own_mixed, 0.0)
    # prefill-bound: prompts queue for the budget, and the queue, not the phase, sets the wait; the
    # iteration scheduled ahead is part of that queue once it is an iteration deep (continuous)
    ahead = max(ahead - prompt_queue_iters, 0.0)
    wait, others = arrival_wait_s(t_bar, running, ahead, recv_interval), 0.0
    if room is not None and running > 1:
        wait, residual = poisson_wait_s(share, t_mixed, t_decode, ahead, recv_interval)
        if prompt_queue_iters == 0:
            rate_per_s = running / (cycle_iters * t_bar)
            others = min(rate_per_s * 2 * residual * (1 - 1 / running), running - 1, room)
    ttft = (wait + prompt_queue_iters * t_bar + _own_prefill_s(isl, chunk, own_mixed, t_decode, t_mixed)
            + others * (t_mixed - t_decode))
    if not decode_iters and running > 1 and room is None:
        # nothing to decode (one output token): requests come back as soon as they are
        # prefilled and queue behind every other client's prompt, so TTFT is the whole cycle
        ttft = max(ttft, cycle_iters * t_bar)
    return tpot, ttft, share


def _prefill_first(isl: int, osl: float, running: int, chunk: float, t_decode: float, t_prefill: float,
                   t_two_chunks: float, room: float | None = None,
                   ahead: float = 0.0, recv_interval: int = 1) -> tuple[float, float, float]:
    """TPOT, TTFT and prefill-iteration share when prefill runs alone and first (SGLang).

    Over one request cycle the engine runs ``osl - 1`` decode iterations and, for every
    running request's prompt, ``isl / chunk`` prefill iterations with no decoder in them.
    A new prompt waits only for the iteration in progress (half of one on average) and the
    ``ahead`` already scheduled (none when it runs alone), then for its own prefill
    iterations: decode never goes first. A decoding request stalls through the prefill
    iterations of the other ``running - 1`` prompts of its cycle, so they add
    ``(running - 1) * isl / chunk * t_prefill`` to its decode time.

    ``room`` switches to Poisson arrivals as in :func:`_spread_out`: the wait is
    ``E[T^2] / 2E[T]`` plus the ``ahead`` iterations, and the prompts that arrived during the same iteration share its
    prefill batch, each adding one more prompt's cost (``t_two_chunks - t_prefill``) and sharing
    the stall it puts on the decoders.
    """
    decode_iters = max(osl - 1, 0)
    prefill_per_cycle = running * isl / chunk
    share = prefill_per_cycle / max(prefill_per_cycle + decode_iters, 1e-12)
    t_bar = share * t_prefill + (1 - share) * t_decode
    wait, others = arrival_wait_s(t_bar, running, ahead, recv_interval), 0.0
    if room is not None and running > 1:
        wait, residual = poisson_wait_s(share, t_prefill, t_decode, ahead, recv_interval)
        rate_per_s = running / ((prefill_per_cycle + decode_iters) * t_bar)
        # 2 x residual is the mean length of the iteration a Poisson arrival lands in (length-biased)
        others = min(rate_per_s * 2 * residual * (1 - 1 / running), running - 1, room)
    extra_s = max(t_two_chunks - t_prefill, 0.0)    # one more prompt in a prefill batch
    ttft = wait + isl / chunk * t_prefill + others * extra_s
    # prompts that share a batch share its stall
    stall_s = (running - 1) * isl / chunk * (t_prefill + others * extra_s) / (1 + others)
    if not decode_iters:
        # nothing to decode (one output token): a request comes back as soon as it is prefilled,
        # so its prompt queues behind every other client's instead of stalling their decodes
        return 0.0, isl / chunk * t_prefill + others * extra_s + stall_s, share
    return t_decode + stall_s / decode_iters, ttft, share


def _own_prefill_s(isl: int, chunk: float, iterations: int, t_decode: float, t_chunk: float) -> float:
    """A prompt's own prefill: its ``iterations`` each cost a decode iteration, plus the prompt
    tokens' share of a ``chunk``-token iteration (the last chunk is only the remainder)."""
    return iterations * t_decode + isl / chunk * (t_chunk - t_decode)


def _iteration_times(replica: Replica, running: int, decoders: int, chunk: float, burst_chunk: float,
                     group: float, rest: float, isl: int, osl: int, wave_rest: float) -> tuple[float, ...]:
    """Decode-only, steady mixed (one prompt chunk), first-wave (full budget), lock-step
    group (whole prompts filling the budget), two-chunk and first-wave last (``wave_rest``
    tokens) iteration times.

    ``decoders`` ride in the iterations that carry prompts (0 when prefill runs alone).
    Decoding requests read KV at their mean context ``isl + osl/2``; a prompt chunk
    attends its own prefix (mean ``isl/2``). Under speculative decoding each decoder runs its
    ``k + 1`` verified tokens through the target and the draft adds its share to every
    iteration (:func:`decode_load`).
    """
    step = replica.step
    # a first wave: while it is prefilled, the prompts before one decode: (running - 1)/2 on average
    dec = np.array([running, decoders, decoders / 2, decoders, decoders, decoders, decoders / 2], dtype=float)
    pre = np.array([0.0, chunk, burst_chunk, group, rest, 2 * chunk, wave_rest])
    load = decode_load(replica, dec, isl + osl / 2, prefill_tokens=pre, prefill_context=isl / 2)
    return tuple(float(x) for x in step.iteration_time_s(load) * draft_factor(replica))


def decode_load(replica: Replica, decoders: np.ndarray | float, context: float, prefill_tokens: np.ndarray | float = 0.0,
                prefill_context: float = 0.0) -> IterationLoad:
    """One iteration of ``decoders`` decoding sequences at ``context`` tokens and ``prefill_tokens`` prompt
    tokens attending a mean prefix of ``prefill_context``. Each decoder reads its KV once (top-k attention
    caps the read) and, under speculative decoding, runs its ``k + 1`` verified tokens through the target
    (:class:`apmw.perf.speculative.SpeculativeDecoding`), as the closed loop's engine curve does."""
    a, kv_dtype = replica.arch, replica.step.kv_dtype
    verify = verified_tokens(replica)
    return IterationLoad(decode_seqs=decoders * verify, prefill_tokens=prefill_tokens,
                         kv_read_bytes=decoders * float(a.kv_read_bytes_for_context(context, kv_dtype)),
                         attention_flops=decoders * verify * float(a.attention_flops_per_token(context))
                         + prefill_tokens * float(a.attention_flops_per_token(prefill_context)))


def verified_tokens(replica: Replica) -> int:
    """Tokens a decoding sequence runs through the target per iteration, each taking a place in the token
    budget: its pending token and the drafts (1 without speculative decoding)."""
    return replica.speculative.verified_tokens if replica.speculative else 1


def speculative_figures(replica: Replica) -> dict | None:
    """The replica's speculative decoding as a prediction reports it (None without it)."""
    sd = replica.speculative
    return None if sd is None else {"draft_tokens": sd.draft_tokens, "acceptance_rate": sd.acceptance_rate,
                                    "draft_cost_fraction": sd.draft_cost_fraction,
                                    "tokens_per_iteration": sd.tokens_per_iteration}


def draft_factor(replica: Replica) -> float:
    """What the draft multiplies every iteration's time by (1 without speculative decoding)."""
    return replica.speculative.time_factor if replica.speculative else 1.0


def replica_power_w(replica: Replica, p: Prediction, isl: int, osl: int, busy_share: float = 1.0) -> float:
    """Wall power of the replica's GPUs and their host share in the predicted steady state
    (:class:`apmw.perf.PowerModel`, the one power formula). The engine is busy ``busy_share`` of
    the time (1 in a closed loop), and :func:`compute_bound_share` of its busy time is compute-bound."""
    return replica.power.it_power_w(GpuGroup(replica.gpus, busy_share, compute_bound_share(replica, p, isl, osl)))


def compute_bound_share(replica: Replica, p: Prediction, isl: int, osl: int) -> float:
    """The compute-bound share of the engine's busy time: the roofline terms of its decode and
    mixed iterations, weighted by their time. A mixed iteration carries one prompt chunk of at
    most what the token budget leaves beside the decoders (a small budget keeps prefill
    memory-bound)."""
    r = p.running_requests
    beside = r - 1 if p.prefill_mixed_with_decode else 0      # decoders in an iteration that carries a prompt
    chunk = min(isl, max(replica.policy.token_budget - beside * verified_tokens(replica), 1))
    dec = np.array([r, beside], dtype=float)
    pre = np.array([0.0, chunk])
    share = replica.step.compute_share(decode_load(replica, dec, isl + osl / 2, prefill_tokens=pre,
                                                   prefill_context=isl / 2))
    w = np.array([(1 - p.mixed_iteration_share) * p.decode_iteration_s, p.mixed_iteration_share * p.mixed_iteration_s])
    return float((share * w).sum() / w.sum())


