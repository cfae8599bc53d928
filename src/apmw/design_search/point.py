"""One point of a space planned: the row it leaves in the results, feasible or pruned with a reason.

A row is a flat dict of plain values (the results file's columns, ``store.COLUMNS``), so it travels
between processes and Ray workers as is and reads back from Parquet unchanged.
"""

from __future__ import annotations

import json

from apmw.capacity import InfeasibleError, plan
from apmw.design_search.space import with_settings
from apmw.errors import ApmwError
from apmw.spec import SpecError, spec_from_dict

# The figures of a feasible point; a pruned point has none of them.
FIGURES = ("agents_per_replica", "binding_constraint", "agents_per_mw", "agents_per_mw_provisioned",
           "cost_per_session_usd", "agents_per_gpu", "task_latency_p95_s", "output_speed_tokens_per_s")


def evaluate_batch(base: dict, batch: list[tuple[int, dict]]) -> list[dict]:
    """The rows of the points ``batch`` (``(index, settings)`` each) of the spec document ``base``:
    what a process-pool or Ray task runs."""
    return [evaluate_point(base, index, settings) for index, settings in batch]


def evaluate_point(base: dict, index: int, settings: dict) -> dict:
    """Plan the spec ``base`` with ``settings`` applied; the row, or a pruned row saying why not."""
    row: dict = {"point": index, "settings": json.dumps(settings)}
    pruned = {**row, "status": "pruned", **dict.fromkeys(FIGURES), "launch": None}
    try:
        result = plan(spec_from_dict(with_settings(base, settings), path="search point"))
    except InfeasibleError as exc:
        return {**pruned, "reason": "no number of agents meets the SLO", "message": str(exc)}
    except (SpecError, ApmwError) as exc:
        return {**pruned, "reason": prune_reason(str(exc)), "message": str(exc)}
    d = result.to_dict()
    gpus = result.replica.gpus + result.prefill_gpus
    return {**row, "status": "feasible", "reason": None, "message": None,
            "agents_per_replica": int(d["agents_per_replica"]), "binding_constraint": d["binding_constraint"],
            "agents_per_mw": float(d["agents_per_mw"]), "agents_per_mw_provisioned": float(d["agents_per_mw_provisioned"]),
            "cost_per_session_usd": float(d["cost_per_session_usd"]),
            "agents_per_gpu": d["agents_per_replica"] / gpus, "task_latency_p95_s": float(d["task_latency_s"]["p95"]),
            "output_speed_tokens_per_s": 1.0 / d["tpot_p95_s"],
            "launch": launch_flags(result)}


def launch_flags(result) -> str:
    """The command line(s) that deploy the replica ``result`` plans: the engine's own server (vLLM,
    SGLang or TensorRT-LLM serve), or for a disaggregated replica a Dynamo-style layout: a frontend,
    a prefill worker on the prefill instance's GPUs and a decode worker on the replica's, as
    AIConfigurator 0.12.0 writes them (its generator templates, backend_templates/*/run.sh.j2)."""
    spec, policy = result.spec, result.replica.policy
    model, tp = spec.model.config, spec.hardware.gpus_per_replica
    disaggregation = spec.serving.disaggregation
    if disaggregation is None:
        prefix = {"sglang": f"python -m sglang.launch_server --model-path {model}",
                  "trtllm": f"trtllm-serve {model}"}.get(policy.engine, f"vllm serve {model}")
        return f"{prefix} {_engine_args(spec, policy, tp)}"
    return "\n".join(["python3 -m dynamo.frontend --http-port 8000",
                      _dynamo_worker(spec, policy, disaggregation.prefill_gpus, "prefill"),
                      _dynamo_worker(spec, policy, tp, "decode")])


# vLLM's KV hand-off between Dynamo workers (NIXL), as AIConfigurator's templates set it.
NIXL_KV_TRANSFER = """'{"kv_connector":"NixlConnector","kv_role":"kv_both"}'"""


def _dynamo_worker(spec, policy, tp: int, role: str) -> str:
    model = spec.model.config
    if policy.engine == "trtllm":       # Dynamo's TensorRT-LLM worker reads its engine settings from a YAML file
        return (f"python3 -m dynamo.trtllm --model-path {model} --extra-engine-args {role}.yaml "
                f"--disaggregation-mode {role}  # {role}.yaml: {{tensor_parallel_size: {tp}, max_batch_size: "
                f"{policy.max_batch}, max_num_tokens: {policy.token_budget}, kv_cache_config: "
                f"{{free_gpu_memory_fraction: {policy.kv_memory_fraction:g}}}}}")
    if policy.engine == "sglang":
        return (f"python3 -m dynamo.sglang --model-path {model} {_engine_args(spec, policy, tp)} "
                f"--disaggregation-mode {role}")
    return (f"python3 -m dynamo.vllm --model {model} {_engine_args(spec, policy, tp)} --disaggregation-mode {role} "
            f"--kv-transfer-config {NIXL_KV_TRANSFER}")


def _engine_args(spec, policy, tp: int) -> str:
    """The engine's own flags for ``tp`` GPUs: batch cap, token budget, memory share, KV dtype, prefix caching."""
    kv_fp8 = spec.model.kv_dtype == "fp8"
    caching = spec.serving.prefix_caching
    if policy.engine == "sglang":
        return (f"--tp {tp} --max-running-requests {policy.max_batch} --chunked-prefill-size {policy.token_budget} "
                f"--mem-fraction-static {policy.kv_memory_fraction:g}" + (" --kv-cache-dtype fp8_e4m3" if kv_fp8 else "")
                + ("" if caching else " --disable-radix-cache"))
    if policy.engine == "trtllm":
        return (f"--tp_size {tp} --max_batch_size {policy.max_batch} --max_num_tokens {policy.token_budget} "
                f"--kv_cache_free_gpu_memory_fraction {policy.kv_memory_fraction:g}")
    return (f"--tensor-parallel-size {tp} --max-num-seqs {policy.max_batch} --max-num-batched-tokens "
            f"{policy.token_budget} --gpu-memory-utilization {policy.kv_memory_fraction:g}"
            + (" --kv-cache-dtype fp8" if kv_fp8 else "")
            + (" --enable-prefix-caching" if caching else " --no-enable-prefix-caching"))


def prune_reason(message: str) -> str:
    """The class of a pruned point's message, to count points by (the message itself is kept for --explain)."""
    if "does not fit" in message:
        return "does not fit: the weights and workspace leave no KV memory"
    if "invalid spec" in message:
        detail = message.split("\n")[-1].strip()
        return f"not a valid spec ({detail.split(':')[0]})"
    return message.split(";")[0].split(":")[0][:120]
