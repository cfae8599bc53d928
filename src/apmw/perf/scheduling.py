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
