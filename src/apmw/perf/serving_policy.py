"""The serving policy: every engine default and rule apmw prices, once, each with its citation.

Every model of a replica (``apmw plan``'s closed loop, ``apmw predict``'s benchmark, the
simulator) reads the engine from one :class:`ServingPolicy`, resolved here from the spec's
``serving`` section or a benchmark's arguments (:func:`resolve_policy`); none re-derives a rule.

**Limits an engine sets by default** (:func:`default_max_batch`, :func:`default_token_budget`):

* vLLM V1's API server (``EngineArgs._set_default_args``, vllm/engine/arg_utils.py, and its
  test ``test_defaults_with_usage_context``): on GPUs with at least 70 GiB that are not A100s,
  ``max_num_seqs = 1024`` and ``max_num_batched_tokens = 8192``; otherwise 256 and 2048.
* SGLang sizes ``max_running_requests`` from its KV pool, per scheduler (one per attention-DP
  worker): ``clamp(tokens / context_len x 512, 2048, 4096)``, at most ``tokens // 2``, where ``tokens``
  is the worker's KV pool in tokens and ``context_len`` the model's (``max_position_embeddings``)
  (``ModelRunner.resolve_max_num_reqs``, srt/model_executor/model_runner.py: "max concurrent requests
  (per dp worker)"; older releases ``init_memory_pool``). The pool is known only once the replica's
  memory is (:func:`pool_sized_max_batch`); before that, 2048. A value the spec sets is the server's
  total, split over the DP workers (:func:`schedulers_per_limit`). ``chunked_prefill_size`` follows the
  GPU's memory: 2048 tokens below 35 GiB, 4096 below 60 GiB, 8192 below 160 GiB (H100, H200), 16384 from
  there (B200, B300, GB200, GB300, MI300X and later) (``ServerArgs._handle_gpu_memory_settings``,
  sglang/srt/server_args.py); under attention DP each worker takes its share.
* TensorRT-LLM: ``max_batch_size = 2048`` and ``max_num_tokens = 8192`` (trtllm-serve defaults).
* The memory share (vLLM ``gpu_memory_utilization``, SGLang ``mem_fraction_static``,
  TensorRT-LLM ``free_gpu_memory_fraction``) is 0.9 by default (``apmw.spec.Serving``); each engine
  reads it its own way (:func:`memory_fraction_of_free`, :mod:`apmw.perf.memory`).

How an engine fills an iteration when prompts and decodes both wait: mixed or prefill first.

* **Mixed** (vLLM V1, TensorRT-LLM): one iteration carries every running decode and, in
  what is left of the token budget, prompt chunks. vLLM V1 ``Scheduler.schedule`` schedules
  running requests first, then waiting ones, from one ``token_budget``
  (vllm/v1/core/sched/scheduler.py); TensorRT-LLM's in-flight batching puts context and
  generation requests in one batch up to ``max_num_tokens`` (TensorRT-LLM docs, "In-flight
  Batching"). Decoders gain a token in every iteration, including those carrying prompts.
* **Prefill first** (SGLang's default): ``Scheduler.get_next_batch_to_run`` builds a prefill
  batch from the waiting queue (up to ``chunked_prefill_size`` tokens) and runs it *instead*
  of the decode batch whenever it can; decode runs only when nothing waits
  (sglang/srt/managers/scheduler.py, "Run prefill first if possible"). Mixing is opt-in
  (``--enable-mixed-chunk``, ``ServerArgs.enable_mixed_chunk = False``). So a prompt never
  waits behind decodes, and every prefill iteration stalls every decoder for its whole length.

And how an engine admits a request when KV memory is short:

* **By need** (vLLM, SGLang): a request is admitted when the blocks for its prompt are free;
  when decoding later runs out of blocks, vLLM preempts the newest request (recompute) and
  SGLang retracts some (``retract_decode``). Running requests hold their context so far:
  ``isl + osl/2`` on average when their progress is spread out. SGLang also keeps back a
  share of each running request's remaining output (``new_token_ratio``, below), which at the
  KV limit hovers about the share its retractions reset it to.
* **Reserved to the end** (TensorRT-LLM's default ``CapacitySchedulerPolicy.GUARANTEED_NO_EVICT``):
  a request is admitted only if the pool can hold its prompt and all its output tokens, so a
  running request holds ``isl + osl``. NVIDIA's NIM Llama-3.3-70B runs saturate where this
  puts them (docs/accuracy.md).

And what an engine keeps of a finished call's KV for the next call with the same prefix:

* **One LRU prefix cache over the whole pool** (vLLM's automatic prefix caching, SGLang's radix
  cache): freed blocks stay cached until the pool needs them (:mod:`apmw.sim.kvcache`).
* **One cached prompt per slot** (llama.cpp's server, ``SLOT_PROMPT_CACHE_ENGINES``): each of its
  ``--parallel`` slots keeps the last prompt it ran; a request takes the idle slot whose prompt
  shares the longest prefix with its own, as a share of its prompt, if above
  ``--slot-prompt-similarity`` (0.1), else the least recently used idle slot
  (``server_context::get_available_slot``, tools/server/server-context.cpp). A returning agent
  hits only if no other request took its slot meanwhile (:mod:`apmw.sim.slots`). Its host-memory
  prompt cache (``--cache-ram``) is not modelled: the server builds measured here log no prompt
  cache with per-slot (non-unified) KV, and calls whose slot was taken recompute their context.

And when a prompt that arrives mid-iteration can first run:

* **Scheduled one iteration ahead** (the default of all three in current versions): the
  scheduler forms the next iteration's batch while the current one runs on the GPU, to hide its
  CPU time. vLLM's async scheduling ("the scheduler operate[s] one step ahead of the current
  execution", vLLM PR #19970, June 2025, opt-in at first; on by default since late 2025, PR
  #27614, unless a feature rules it out: ``SchedulerConfig.async_scheduling = None`` and
  ``VllmConfig`` "Enable async scheduling unless there is an incompatible option"), SGLang's
  overlap scheduler (``ServerArgs.disable_overlap_schedule = False``) and TensorRT-LLM's
  (``disable_overlap_scheduler = False`` in its PyTorch backend's ``LlmArgs``). So a prompt
  that arrives while iteration ``k`` runs misses ``k + 1`` too, whose batch is already fixed,
  and first runs in ``k + 2``: it waits the rest of ``k`` and all of ``k + 1``. Without the
  overlap (vLLM ``--no-async-scheduling``, SGLang ``--disable-overlap-schedule``) it runs in
  ``k + 1``, as do vLLM before late 2025 without ``--async-scheduling`` and TensorRT-LLM's legacy
  TensorRT-engine backend. An idle engine schedules an arriving prompt at once either way.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from apmw.catalog.gpus import GpuSpec
from apmw.errors import ApmwError
from apmw.spec import Serving
from apmw.spec.spellings import engine_key

# Engines whose default scheduler runs prefill batches apart from, and before, decode batches.
PREFILL_FIRST_ENGINES = frozenset({"sglang"})


def mixes_prefill_with_decode(engine: str, mixed: bool | None = None, attention_dp_ranks: int = 1) -> bool:
    """Whether ``engine`` puts prompt chunks in the same iteration as decodes, across the replica.

    ``mixed`` overrides the engine's default (SGLang ``--enable-mixed-chunk``: True). Under attention
    data parallelism (``attention_dp_ranks`` > 1) each rank's scheduler picks its own forward mode every
    step and the ranks meet only in the MoE layers (SGLang's ``MLPSyncBatchInfo.local_forward_mode``,
    ``srt/managers/scheduler_dp_attn_mixin.py``): one rank's prompt runs beside the other ranks' decodes,
    so the replica's iterations mix them. ASSUMPTION: the prompting rank's own decoders, which wait out
    its prefill step (about one rank in ``attention_dp_ranks`` of them), are left out.
    """
    if mixed is not None:
        return mixed
    return engine not in PREFILL_FIRST_ENGINES or attention_dp_ranks > 1


# Engines that reserve a request's KV to its last output token before admitting it.
FULL_RESERVATION_ENGINES = frozenset({"trtllm"})
# SGLang's new_token_ratio, the share of a running request's remaining output tokens it keeps
# back when admitting (sglang/srt/environ.py, managers/scheduler.py): it starts at
# SGLANG_INIT_NEW_TOKEN_RATIO (0.7), falls by (0.7 - floor) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
# (600) every decode step to the floor 0.7 x SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR (0.14), and after a
# retraction is reset to (tokens decoded + SGLANG_RETRACT_DECODE_STEPS (20) per request) / (their
# max new tokens) over the requests still running (ScheduleBatch.retract_decode).
SGLANG_INIT_NEW_TOKEN_RATIO = 0.7
SGLANG_MIN_NEW_TOKEN_RATIO = 0.7 * 0.14
SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS = 600
SGLANG_RETRACT_DECODE_STEPS = 20


def reserved_output_share(engine: str, osl: float | None = None) -> float:
    """Share of a running request's remaining output tokens the engine keeps KV back for when
    admitting another, at the KV limit: all of it (TensorRT-LLM), none (vLLM). SGLang's share
    adapts (new_token_ratio above); at the limit it keeps retracting, and each retraction resets
    the share to the survivors' decoded share plus 20 steps: with progress spread out,
    ``0.5 + 20 / osl``. Without ``osl``, SGLang's starting share (the simulator adapts it from
    there itself)."""
    if engine in FULL_RESERVATION_ENGINES:
        return 1.0
    if engine == "sglang":
        return min(1.0, 0.5 + SGLANG_RETRACT_DECODE_STEPS / osl) if osl else SGLANG_INIT_NEW_TOKEN_RATIO
    return 0.0


# Engines whose default scheduler forms the next iteration's batch while the current one runs
# (llama.cpp's server loop decodes, then schedules: no overlap).
OVERLAP_SCHEDULING_ENGINES = frozenset({"vllm", "sglang", "trtllm"})
# Engines that keep one cached prompt per slot instead of an LRU prefix cache (module docstring).
# The KV-cache dtypes each engine stores, by the name its launch flag takes (vLLM and SGLang --kv-cache-dtype,
# TensorRT-LLM kv_cache_config.dtype, llama.cpp --cache-type-k/--cache-type-v); None: a 16-bit cache, the
# engine's own for a 16-bit checkpoint, which takes no flag. A dtype missing from an engine's row is one it
# cannot store KV in: apmw refuses it (apmw.perf.replica.kv_dtype_refusal). vLLM: fp8 (docs.vllm.ai, "Quantized
# KV Cache"), nvfp4 (from v0.21; not verified here); SGLang: fp8_e4m3, fp4_e2m1 (its server arguments);
# TensorRT-LLM: fp8, int8 (its INT8 KV cache), nvfp4; llama.cpp: f16, bf16, q8_0, q4_0 (no 8- or 4-bit float).
KV_CACHE_DTYPES: dict[str, dict[str, str | None]] = {
    "vllm": {"bf16": None, "fp16": None, "fp8": "fp8", "fp4": "nvfp4"},
    "sglang": {"bf16": None, "fp16": None, "fp8": "fp8_e4m3", "fp4": "fp4_e2m1"},
    "trtllm": {"bf16": None, "fp16": None, "fp8": "fp8", "int8": "int8", "fp4": "nvfp4"},
    "llamacpp": {"bf16": "bf16", "fp16": None, "int8": "q8_0", "int4": "q4_0"},
}
SLOT_PROMPT_CACHE_ENGINES = frozenset({"llamacpp"})
# Engines without measured kernel tables: their iterations are priced by the roofline.
ROOFLINE_ONLY_ENGINES = frozenset({"llamacpp"})


def iterations_scheduled_ahead(engine: str, overlap: bool | None = None) -> int:
    """Iterations whose batches are already fixed when a prompt arrives at a busy engine, beyond
    the one running: 1 with overlap (async) scheduling, 0 without. ``overlap`` overrides the
    engine's default (vLLM ``--no-async-scheduling``, SGLang ``--disable-overlap-schedule``:
    False)."""
    if overlap is None:
        overlap = engine in OVERLAP_SCHEDULING_ENGINES
    return 1 if overlap else 0


def kv_tokens_per_running_request(isl: float, osl: float, engine: str) -> float:
    """KV tokens the engine counts against its pool per running request at the KV limit, on
    average over the requests' spread-out progress (context ``isl + osl/2`` plus the reserved
    share of the ``osl/2`` still to come): what caps the running requests there."""
    return isl + osl / 2 * (1 + reserved_output_share(engine, osl))


# Fixed cost per layer of one iteration, by engine: the small kernels of every layer (norms,
# residual adds, activation and its quantisation, RoPE, attention metadata) whose launch and
# tail latency the GEMM and attention tables leave out, and the engine's own per-iteration
# work (sampling, scheduling) spread over them. Per layer, because the kernel count is:
# aiconfigurator's mem_empirical_constant_latency of 3 us per access x ~4 small kernels a
# layer is ~12 us (apmw.perf.efficiency.Efficiency.fixed_s); one figure per iteration would
# charge an 80-layer 70B what a 36-layer gpt-oss pays. vLLM: FITTED at 17 us on the InferenceMAX
# h100 gpt-oss-120b rows (36 layers, so 0.61 ms; training split, `python bench/accuracy.py --fit`,
# score = median |TPOT| + median |throughput| error); held out: the h200 rows and the dense
# published runs (docs/accuracy.md). SGLang and TensorRT-LLM: ASSUMPTION, 28 us (1 ms per
# iteration spread over the 36 layers the vLLM figure was fitted on); the MLPerf TensorRT-LLM
# rows do not identify it (the fit runs to the grid edge and the held-out TPOT error has the
# opposite sign). Both run more separate kernels per layer than vLLM's
# torch.compile fusions leave (SGLang compiles nothing by default), so a larger floor is
# plausible, not measured. On NVIDIA's NIM runs (TensorRT-LLM, held out) the per-layer form
# fits the 32-layer 8B and the 80-layer 70B together at concurrency 1, which one figure per
# iteration could not (tests/perf/test_accuracy_regression.py).
ENGINE_OVERHEAD_S_PER_LAYER = {"vllm": 17e-6, "sglang": 28e-6, "trtllm": 28e-6}
DEFAULT_ENGINE = "vllm"
# TensorRT-LLM's fixed cost per layer where its own measured kernels price the iteration (its Blackwell
# tables, apmw.perf.tables): FITTED on InferenceMAX's B200 gpt-oss TensorRT-LLM TP-only rows (44 points, the
# training split for this figure; `python bench/accuracy.py --fit`, the score above): 0, where the grid
# (0-28 us) stops, score 8.5 % against 63.5 % at the assumed 28 us. So TensorRT-LLM's own measured kernel
# times hold its per-iteration costs (it runs under CUDA graphs with its overlap scheduler), and a negative
# figure is not physical; TPOT is then 3.6 % slow (median signed). Held out: the GB200 disaggregated gpt-oss
# rows, TPOT 26.6 -> 7.7 % (docs/accuracy.md). The assumed 28 us stays where vLLM's kernels stand in for
# TensorRT-LLM's (Hopper), where NVIDIA's NIM rows agree with it: there it also carries TensorRT-LLM's slower
# Hopper kernels (catalog/data/calibration/SOURCES.md), which its own tables would measure.
OWN_KERNELS_OVERHEAD_S_PER_LAYER = {"trtllm": 0.0}


# What an engine feeds MXFP4 routed experts (gpt-oss's) by default on a GPU with MX tensor cores (Blackwell):
# - TensorRT-LLM: MXFP8 activations (W4A8). Its TRTLLM MoE backend, the one its gpt-oss deployment guide sets,
#   runs QuantAlgo.W4A8_MXFP4_MXFP8 (TensorRT-LLM's own MoE benchmark profile for gpt_oss_120b); its measured
#   W4A16 kernel takes 32 ms an iteration at 64 tokens on B200 where served runs take 9.5 ms for the whole
#   iteration (scripts/build_calibration.py, MOE_DTYPES_SKIPPED).
# - vLLM: bf16 (W4A16, FlashInfer's MXFP4 x BF16 kernel) unless started with
#   VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1 (InferenceMAX's B200 gpt-oss scripts set it).
# - SGLang: bf16 (its flashinfer_mxfp4 runner with bf16 activations).
# GPUs without MX tensor cores (Hopper and older) run W4A16 whatever the engine.
MXFP4_MOE_ACTIVATIONS_ON_MX_GPUS = {"trtllm": "mxfp8"}
MXFP4_MOE_ACTIVATIONS = ("bf16", "mxfp8")


class ServingSettingError(ApmwError):
    """A serving setting this replica cannot take; the message starts with the setting's name (a spec
    prefixes ``serving.``, the CLI names its flag)."""


def mxfp4_moe_activations(setting: str | None, engine: str, gpu: GpuSpec, expert_dtype: str | None) -> str:
    """The activations MXFP4 routed experts take (``setting``, else the engine's default on ``gpu``): "bf16"
    (W4A16) or "mxfp8" (W4A8); refused where the experts are not 4-bit or the GPU has no FP4/MX tensor cores."""
    mx_gpu = gpu.fp4_flops is not None and gpu.vendor.upper() == "NVIDIA"      # FlashInfer's kernels: NVIDIA's
    if setting is None:
        return MXFP4_MOE_ACTIVATIONS_ON_MX_GPUS.get(engine, "bf16") if mx_gpu else "bf16"
    if setting not in MXFP4_MOE_ACTIVATIONS:
        raise ServingSettingError(f"mxfp4_moe_activations '{setting}' is not known; use one of: {', '.join(MXFP4_MOE_ACTIVATIONS)}")
    if setting == "mxfp8" and (expert_dtype or "").lower() not in ("fp4", "mxfp4"):
        held = f"its routed experts are {expert_dtype}" if expert_dtype else "this model has no routed experts"
        raise ServingSettingError(f"mxfp4_moe_activations 'mxfp8' applies to MXFP4 routed experts (gpt-oss's); {held}: "
                                  "leave it out")
    if setting == "mxfp8" and not mx_gpu:
        raise ServingSettingError(f"mxfp4_moe_activations 'mxfp8' needs NVIDIA's FP4/MX tensor cores (Blackwell: "
                                  f"FlashInfer's W4A8 kernel); {gpu.name} is priced with MXFP4 experts at bf16 "
                                  "activations: leave it out")
    return setting


def canonical_engine(engine: str) -> str:
    """apmw's name for an engine ("TensorRT-LLM" -> "trtllm", apmw.spec.spellings.ENGINE_SPELLINGS);
    unknown names pass through unchanged (the caller's check reports them)."""
    key = engine_key(engine)
    return key if key in ENGINE_OVERHEAD_S_PER_LAYER else engine


def engine_overhead_s_per_layer(engine: str, own_kernels: bool = False) -> float:
    """The engine's fixed cost per layer of an iteration: ENGINE_OVERHEAD_S_PER_LAYER, or
    OWN_KERNELS_OVERHEAD_S_PER_LAYER where the engine's own measured kernels price the rest."""
    if own_kernels and engine in OWN_KERNELS_OVERHEAD_S_PER_LAYER:
        return OWN_KERNELS_OVERHEAD_S_PER_LAYER[engine]
    return ENGINE_OVERHEAD_S_PER_LAYER[engine]


def engine_overhead_s(engine: str, layers: int, own_kernels: bool = False) -> float:
    """Fixed cost of one iteration of a ``layers``-layer model on ``engine`` (:func:`engine_overhead_s_per_layer`)."""
    return engine_overhead_s_per_layer(engine, own_kernels) * layers


# vLLM's default CUDA-graph capture sizes: 1, 2, 4 and multiples of 8 up to 512.
_GRAPH_MAX = 512


def graph_padded(decode: np.ndarray, prefill: np.ndarray) -> np.ndarray:
    """Rows the GEMMs compute: decode-only batches round up to a CUDA-graph size."""
    pure = (prefill <= 0) & (decode <= _GRAPH_MAX)
    padded = np.where(decode <= 2, np.ceil(decode), np.where(decode <= 4, 4.0, np.ceil(decode / 8) * 8))
    return np.where(pure, padded, decode + prefill)


# GPUs of at least this much memory get vLLM's larger defaults, unless they are A100s
# (vllm/engine/arg_utils.py: "device_memory >= 70 * GiB_bytes and 'a100' not in device_name").
VLLM_LARGE_GPU_BYTES = 70 * 2**30
VLLM_MAX_NUM_SEQS = {True: 1024, False: 256}
VLLM_MAX_NUM_BATCHED_TOKENS = {True: 8192, False: 2048}
# SGLang's running requests per scheduler when none are set: this many per context length of KV pool, within
# these bounds (ModelRunner.resolve_max_num_reqs; module docstring).
SGLANG_RUNNING_PER_CONTEXT = 512
SGLANG_RUNNING_BOUNDS = (2048, 4096)
# SGLang and TensorRT-LLM (module docstring); SGLang's is its lower bound until the KV pool is known.
MAX_BATCH = {"sglang": SGLANG_RUNNING_BOUNDS[0], "trtllm": 2048}
# llama.cpp: its logical batch, --batch-size (common_params.n_batch = 2048); its slots have no
# default apmw takes (the spec must say --parallel, apmw.spec.Serving).
TOKEN_BUDGET = {"trtllm": 8192, "llamacpp": 2048}

# Client-observed time to first token outside the engine's iterations: HTTP, chat
# template and tokenisation, admission, streaming the first chunk back. A DEFAULT chosen
# from the published range, not a fit: NVIDIA NIM with a local AIPerf client about 1.4 ms
# (its concurrency-1 rows less the predicted prefill), InferenceMAX's harness 12.5 ms
# (fitted with the served MoE ceiling, bench/accuracy.py HARNESS_OVERHEAD_S), NVIDIA's silicon
# runs of MiniMax-M2.5 on vLLM 0.16 (H200, TP 4; bench/data) a median 30 ms over apmw's
# engine-only TTFT (15 runs), GPUStack's Qwen3-8B on H100 about 50 ms (vLLM 0.11), 20 ms
# (SGLang 0.5.3) and 40 ms (trtllm-serve 1.2) beyond the prefill (docs/accuracy.md). An
# in-process harness (MLPerf LoadGen, trtllm-bench) has none.
# llama.cpp's server on loopback: MEASURED, the median client TTFT less the server's own
# timings.prompt_ms, 5.9 ms over 157 calls of the tiny test model (bench/README.md "loadgen").
REQUEST_OVERHEAD_S = {"vllm": 0.025, "sglang": 0.025, "trtllm": 0.025, "llamacpp": 0.006}

# Engines whose measured kernel tables price iterations (apmw predict takes these).
ENGINES = tuple(ENGINE_OVERHEAD_S_PER_LAYER)


def _vllm_large_gpu(gpu_name: str, hbm_bytes_per_gpu: float) -> bool:
    return hbm_bytes_per_gpu >= VLLM_LARGE_GPU_BYTES and "a100" not in gpu_name.lower()


def default_max_batch(engine: str, gpu_name: str, hbm_bytes_per_gpu: float) -> int:
    """The engine's default limit on running sequences per iteration (module docstring); SGLang's until its KV
    pool is known (:func:`pool_sized_max_batch`)."""
    if engine == "vllm":
        return VLLM_MAX_NUM_SEQS[_vllm_large_gpu(gpu_name, hbm_bytes_per_gpu)]
    return MAX_BATCH[engine]


def sglang_running_requests(kv_tokens: float, context_tokens: int | None) -> int:
    """SGLang's own ``max_running_requests`` for one scheduler whose KV pool holds ``kv_tokens`` tokens, for a
    model of ``context_tokens`` context (module docstring). A model whose config gives no context length takes
    the lower bound; a pool of unbounded tokens (no KV per token) the upper."""
    low, high = SGLANG_RUNNING_BOUNDS
    if not np.isfinite(kv_tokens):
        return high
    estimated = low if not context_tokens else min(max(int(kv_tokens / context_tokens * SGLANG_RUNNING_PER_CONTEXT),
                                                      low), high)
    return max(min(estimated, int(kv_tokens) // 2), 1)


def pool_sized_max_batch(policy: "ServingPolicy", serving: Serving, kv_tokens: float, context_tokens: int | None,
                         attention_dp_ranks: int = 1) -> "ServingPolicy":
    """``policy`` with the batch limit an engine sizes from its KV pool where ``serving`` sets none: SGLang's,
    per attention-DP worker (each holds ``kv_tokens / attention_dp_ranks`` of the replica's ``kv_tokens``), so
    the replica's is that many times it. Every other engine's default is fixed, and ``policy`` is returned as
    it is."""
    if policy.engine != "sglang" or serving.max_batch is not None:
        return policy
    per_worker = sglang_running_requests(kv_tokens / attention_dp_ranks, context_tokens)
    return replace(policy, max_batch=per_worker * attention_dp_ranks)


# SGLang's chunked_prefill_size by the GPU's memory (MiB, as torch reports it): below each bound, that many tokens;
# 16,384 from 160 GiB (B200, MI300 and larger) (ServerArgs._handle_gpu_memory_settings, srt/server_args.py).
SGLANG_CHUNKED_PREFILL_BY_MEMORY = ((35 * 1024, 2048), (60 * 1024, 4096), (160 * 1024, 8192))
SGLANG_LARGE_GPU_CHUNKED_PREFILL = 16384


def default_token_budget(engine: str, gpu_name: str, hbm_bytes_per_gpu: float) -> int:
    """The engine's default token budget per iteration (chunked prefill; module docstring)."""
    if engine == "vllm":
        return VLLM_MAX_NUM_BATCHED_TOKENS[_vllm_large_gpu(gpu_name, hbm_bytes_per_gpu)]
    if engine == "sglang":
        mib = hbm_bytes_per_gpu / 2**20
        return next((tokens for bound, tokens in SGLANG_CHUNKED_PREFILL_BY_MEMORY if mib < bound),
                    SGLANG_LARGE_GPU_CHUNKED_PREFILL)
    return TOKEN_BUDGET[engine]


def draft_outside_share(engine: str) -> bool:
    """Whether the engine sizes its KV pool for the target alone and takes a draft's weights and cache from the
    memory outside its share (SGLang: the target profiles ``max_total_num_tokens`` from its own layers after its
    own weights load; the draft runner then loads and allocates its ``draft_runner_cache_size`` tokens from what is
    left), rather than sizing one pool over every attention layer, the draft's included (vLLM's KV cache spec,
    TensorRT-LLM's MTP layers): :mod:`apmw.perf.memory`."""
    return engine == "sglang"


def memory_fraction_of_free(engine: str) -> bool:
    """Whether the engine's memory share is of the memory left after weights and activations
    (TensorRT-LLM ``KvCacheConfig.free_gpu_memory_fraction``, TensorRT-LLM docs "How to Change KV
    Cache Behavior") rather than of the whole HBM (vLLM, SGLang): :mod:`apmw.perf.memory`."""
    return engine in FULL_RESERVATION_ENGINES


def busy_arrival_wait_s(iteration_s, iterations_ahead: float, recv_interval: int = 1):
    """How long a call that arrives at a busy engine waits before its first iteration starts.

    The scheduler takes new calls every ``recv_interval`` iterations (``apmw.spec.Serving``'s
    ``scheduler_recv_interval``, SGLang's; 1 for every engine's default): a call lands anywhere in
    such a span, so it waits half of it on average (half the iteration in flight when the scheduler
    polls every iteration), and then the ``iterations_ahead`` whose batches the engine had already
    formed (:func:`iterations_scheduled_ahead`). An idle engine starts it at once: callers weigh this
    by the chance the engine is busy. Vectorised.
    """
    return (0.5 * recv_interval + iterations_ahead) * iteration_s


@dataclass(frozen=True)
class ServingPolicy:
    """What one engine does on one replica, every default resolved (:func:`resolve_policy`)."""

    engine: str
    max_batch: int                    # running sequences per iteration [vLLM max_num_seqs]
    token_budget: int                 # tokens per iteration [vLLM max_num_batched_tokens]
    kv_memory_fraction: float         # the engine's memory share, read as memory_fraction_of_free says
    memory_fraction_of_free: bool
    draft_outside_share: bool         # a draft's weights and KV come from outside the memory share (SGLang)
    workspace_bytes_per_gpu: float    # activations, CUDA graphs, communication buffers
    mixed_prefill: bool               # prompt chunks ride beside decodes (False: prefill first)
    iterations_ahead: int             # batches already formed when a prompt arrives at a busy engine
    recv_interval: int                # decode iterations between polls for new requests [SGLang --scheduler-recv-interval]
    reserved_output_share: float      # share of running requests' remaining output kept at admission
    slot_prompt_cache: bool           # one cached prompt per slot (llama.cpp) instead of an LRU prefix cache
    request_overhead_s: float         # client-observed time outside the engine, per request
    overhead_s_per_layer: float       # the engine's fixed cost per layer of an iteration

    def kv_tokens_per_running_request(self, isl: float, osl: float) -> float:
        return kv_tokens_per_running_request(isl, osl, self.engine)

    def to_dict(self) -> dict:
        return asdict(self)


def schedulers_per_limit(engine: str, attention_dp_ranks: int) -> int:
    """How many schedulers each get the batch limit and token budget as set, under attention data
    parallelism over ``attention_dp_ranks`` ranks (1 without it); the replica's totals are that many
    times the settings.

    - vLLM runs one engine core per DP rank, each with its own scheduler, ``max_num_seqs`` and
      ``max_num_batched_tokens`` (docs/serving/data_parallel_deployment.md: "each DP rank is
      deployed as a separate core engine process").
    - SGLang reads both as the server's totals and divides them among its DP workers
      (server_args.py: ``chunked_prefill_size // dp_size`` when DP attention is on; the scheduler's
      ``max_running_requests // dp_size``).
    - TensorRT-LLM's PyTorch backend runs a scheduler on every rank with ``max_batch_size`` as its
      capacity and ``max_num_tokens`` as its budget; under attention DP a global step assigns new
      requests to ranks, each within its own ``max_num_active_requests``
      (tensorrt_llm/_torch/pyexecutor/scheduler.py, ``SimpleUnifiedScheduler``: "Attention DP mode:
      Global coordination across all TP ranks"), so both apply per rank.
    """
    if attention_dp_ranks <= 1 or engine == "sglang":
        return 1
    if engine in ("vllm", "trtllm"):
        return attention_dp_ranks
    raise ApmwError(f"attention data parallelism with engine {engine} is not modelled; use vllm, sglang or trtllm")


def resolve_policy(serving: Serving, gpu_name: str, hbm_bytes_per_gpu: float,
                   request_overhead_s: float | None = None, attention_dp_ranks: int = 1,
                   own_kernels: bool = False) -> ServingPolicy:
    """The policy of ``serving`` (a spec's section, or one a benchmark built) on a GPU: every
    field the spec leaves unset becomes the engine's default for that GPU, and the batch limit and
    token budget are the replica's totals over its schedulers (:func:`schedulers_per_limit`).
    ``own_kernels``: the engine's own measured kernels price its iterations (the per-layer overhead then
    is :func:`engine_overhead_s_per_layer`'s for them)."""
    e = serving.engine
    ranks = schedulers_per_limit(e, attention_dp_ranks)
    budget = (serving.max_batched_tokens if serving.max_batched_tokens is not None
              else default_token_budget(e, gpu_name, hbm_bytes_per_gpu))
    default = default_max_batch(e, gpu_name, hbm_bytes_per_gpu) if serving.max_batch is None else None
    max_batch = _batch_within_budget(e, serving.max_batch, default, budget)
    return ServingPolicy(
        engine=e,
        max_batch=ranks * max_batch,
        token_budget=ranks * budget,
        kv_memory_fraction=serving.kv_memory_fraction, memory_fraction_of_free=memory_fraction_of_free(e),
        draft_outside_share=draft_outside_share(e),
        workspace_bytes_per_gpu=serving.workspace_bytes_per_gpu,
        mixed_prefill=mixes_prefill_with_decode(e, serving.mixed_prefill, attention_dp_ranks),
        iterations_ahead=iterations_scheduled_ahead(e, serving.overlap_scheduling),
        recv_interval=serving.scheduler_recv_interval or 1,
        reserved_output_share=reserved_output_share(e),
        slot_prompt_cache=e in SLOT_PROMPT_CACHE_ENGINES,
        request_overhead_s=REQUEST_OVERHEAD_S[e] if request_overhead_s is None else request_overhead_s,
        # llama.cpp has no kernel tables, so no per-layer floor beside them (the roofline's fixed_s)
        overhead_s_per_layer=engine_overhead_s_per_layer(e, own_kernels) if e in ENGINE_OVERHEAD_S_PER_LAYER else 0.0,
    )


# Engines whose batch limit never exceeds their token budget, since every running sequence takes at least one token
# of an iteration's budget: vLLM lowers its default max_num_seqs to max_num_batched_tokens
# (EngineArgs._set_default_args: max_num_seqs = min(max_num_seqs, max_num_batched_tokens) when not given) and
# refuses to start where both are given the other way round (SchedulerConfig._verify_args: "max_num_batched_tokens
# ... must be greater than or equal to max_num_seqs").
BATCH_WITHIN_BUDGET_ENGINES = ("vllm",)


def _batch_within_budget(engine: str, given: int | None, default: int | None, budget: int) -> int:
    """The batch limit ``engine`` runs with: as ``given`` (refused below the token budget where the engine refuses
    it), else its ``default``, lowered to the budget where the engine lowers it."""
    if given is None:
        assert default is not None
        return min(default, budget) if engine in BATCH_WITHIN_BUDGET_ENGINES else default
    if engine not in BATCH_WITHIN_BUDGET_ENGINES:
        return given
    if budget < given:
        raise ServingSettingError(
            f"max_batched_tokens {budget:,} is below max_batch {given:,}: {engine} refuses to start so (every running "
            "sequence takes a token of the iteration's budget; vLLM's max_num_batched_tokens must be at least its "
            f"max_num_seqs): raise max_batched_tokens to at least {given:,}, or lower max_batch")
    return given
