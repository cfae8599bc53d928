"""Small, fast specs for the simulator tests."""

from __future__ import annotations

import copy
import math

from apmw.spec import Spec, spec_from_dict

BASE = {
    "workload": {
        "steps_per_task": {"mean": 6, "p95": 12},
        "system_prompt_tokens": 600,
        "new_input_tokens_per_call": {"mean": 300, "p95": 900},
        "output_tokens_per_call": {"mean": 120, "p95": 400},
        "tool_wait_s": {"p50": 2.0, "p95": 8.0},
    },
    "model": {"config": "meta-llama/Meta-Llama-3.1-8B", "weight_dtype": "bf16", "kv_dtype": "bf16"},
    "hardware": {"gpu": "H100", "gpus_per_replica": 1},
    "serving": {"max_batch": 64, "max_batched_tokens": 2048},
    "slo": {"task_latency_p95_s": 300},
    "cost": {"electricity_usd_per_kwh": 0.1, "gpu_hour_usd": 2.0},
}
# Llama-3.1-8B bf16 weights (16.06 GB) + 3.5 GiB workspace on an 80 GB H100: this fraction leaves
# about KV_TOKENS tokens of KV (128 KiB per token), small enough to make a handful of agents memory-bound.
KV_BYTES_PER_TOKEN = 131072


def kv_fraction_for(tokens: int, engine: str = "vllm") -> float:
    """serving.kv_memory_fraction that leaves about ``tokens`` tokens of KV for the BASE model and GPU
    (for TensorRT-LLM the fraction is a share of the memory free after weights and workspace)."""
    from apmw.perf import replica_from_spec

    r = replica_from_spec(spec_from_dict(BASE))
    if engine == "trtllm":
        free = r.gpu.hbm_bytes - r.step.weight_bytes - r.memory.workspace_bytes
        return math.ceil(tokens * KV_BYTES_PER_TOKEN / free * 1e5) / 1e5
    need = r.step.weight_bytes + r.memory.workspace_bytes + tokens * KV_BYTES_PER_TOKEN
    return math.ceil(need / r.gpu.hbm_bytes * 1e5) / 1e5


def spec(**serving) -> Spec:
    d = copy.deepcopy(BASE)
    d["serving"].update(serving)
    return spec_from_dict(d)


def spec_with(workload: dict | None = None, model: str | None = None, **serving) -> Spec:
    d = copy.deepcopy(BASE)
    d["serving"].update(serving)
    if workload:
        d["workload"].update(workload)
    if model:
        d["model"]["config"] = model
    return spec_from_dict(d)
