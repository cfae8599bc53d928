"""How an engine fills an iteration when prompts and decodes both wait: mixed or prefill first.

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

# Engines whose default scheduler runs prefill batches apart from, and before, decode batches.
PREFILL_FIRST_ENGINES = frozenset({"sglang"})


def mixes_prefill_with_decode(engine: str, mixed: bool | None = None) -> bool:
    """Whether ``engine`` puts prompt chunks in the same iteration as decodes.

    ``mixed`` overrides the engine's default (SGLang ``--enable-mixed-chunk``: True).
    """
    if mixed is not None:
        return mixed
    return engine not in PREFILL_FIRST_ENGINES


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


# Engines whose default scheduler forms the next iteration's batch while the current one runs.
OVERLAP_SCHEDULING_ENGINES = frozenset({"vllm", "sglang", "trtllm"})


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
