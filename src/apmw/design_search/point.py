"""One point of a space planned: the row it leaves in the results, feasible or pruned with a reason.

A row is a flat dict of plain values (the results file's columns, ``store.COLUMNS``), so it travels
between processes and Ray workers as is and reads back from Parquet unchanged.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import PurePath

from apmw.capacity import InfeasibleError, plan
from apmw.design_search.space import with_settings
from apmw.errors import ApmwError
from apmw.perf.parallelism import Layout, prefill_layout
from apmw.perf.serving_policy import KV_CACHE_DTYPES, resolve_policy, schedulers_per_limit
from apmw.spec import SpecError, spec_from_dict

# The figures of a feasible point; a pruned point has none of them.
FIGURES = ("agents_per_replica", "binding_constraint", "agents_per_mw", "agents_per_mw_provisioned",
           "cost_per_session_usd", "agents_per_gpu", "task_latency_p95_s", "output_speed_tokens_per_s")
# Figures a feasible point may lack: no call of the workload outputs a second token, so it has no output speed.
OPTIONAL_FIGURES = ("output_speed_tokens_per_s",)


def evaluate_batch(base: dict, batch: list[tuple[int, dict]]) -> list[dict]:
    """The rows of the points ``batch`` (``(index, settings)`` each) of the spec document ``base``:
    what a process-pool or Ray task runs."""
    return [evaluate_point(base, index, settings) for index, settings in batch]


def evaluate_point(base: dict, index: int, settings: dict) -> dict:
    """Plan the spec ``base`` with ``settings`` applied; the row, or a pruned row saying why not."""
    row: dict = {"point": index, "settings": json.dumps(settings)}
    pruned = {**row, "status": "pruned", **dict.fromkeys(FIGURES), "launch": None}
    try:
        # no guess from the point planned before: the analytic TTFT p95 is not always monotone in the agents
        # (support-chat, 8 x H100, vLLM, batch cap 192: 5.013 s at 209, 4.999 s at 210), so a search started
        # elsewhere can stop at another crossing, and a row would depend on which process planned it
        result = plan(spec_from_dict(with_settings(base, settings), path="search point"))
    except InfeasibleError as exc:
        return {**pruned, "reason": exc.cause, "message": str(exc)}
    except (SpecError, ApmwError) as exc:
        return {**pruned, "reason": prune_reason(str(exc)), "message": str(exc)}
    # the plan's own figures (those its --json gives the same names), read without its other tails
    at, e = result.at, result.economics
    gpus = result.replica.gpus + result.prefill_gpus
    return {**row, "status": "feasible", "reason": None, "message": None,
            "agents_per_replica": int(at.agents), "binding_constraint": result.search.binding_constraint,
            "agents_per_mw": float(e.agents_per_mw), "agents_per_mw_provisioned": float(e.agents_per_mw_provisioned),
            "cost_per_session_usd": float(e.cost_per_session_usd),
            "agents_per_gpu": at.agents / gpus, "task_latency_p95_s": float(at.task_latency_p95_s),
            # none where no call outputs a second token: such a workload has no time per output token
            "output_speed_tokens_per_s": None if result.tpot_p95_s is None else 1.0 / result.tpot_p95_s,
            "launch": launch_flags(result)}


def launch_flags(result) -> str:
    """The command line(s) that deploy the replica ``result`` plans: the engine's own server (vLLM,
    SGLang or TensorRT-LLM serve) with its layout's flags, or for a disaggregated replica a Dynamo-style
    layout: a frontend, the prefill workers (``--prefill-workers``, each on its own GPUs) and the decode
    worker, as AIConfigurator 0.12.0 writes them (its generator templates, backend_templates/*/run.sh.j2)."""
    spec, policy = _with_priced_drafts(result), result.replica.policy
    model, layout = served_model(spec.model.config), result.replica.step.parallel
    disaggregation = spec.serving.disaggregation
    if policy.engine == "llamacpp":
        return _noted(_llama_server(spec, policy), _offload_note(spec, policy.engine))
    if disaggregation is None:
        prefix = {"sglang": f"python -m sglang.launch_server --model-path {model}",
                  "trtllm": f"trtllm-serve {model}"}.get(policy.engine, f"vllm serve {model}")
        line = _with_weights(f"{prefix} {_engine_args(spec, policy, layout)}", spec, policy.engine)
        return _noted(line, _offload_note(spec, policy.engine))
    prefill = prefill_layout(spec.serving)
    workers = disaggregation.prefill_workers
    gpu = result.replica.gpu
    prefill_policy = resolve_policy(spec.serving, gpu.name, gpu.hbm_bytes, attention_dp_ranks=prefill.dp)
    return "\n".join(["python3 -m dynamo.frontend --http-port 8000",
                      _with_weights(_dynamo_worker(spec, prefill_policy, prefill, "prefill")
                                    + (f"  # x {workers} workers, each on its own GPUs" if workers > 1 else ""),
                                    spec, policy.engine),
                      _with_weights(_dynamo_worker(spec, policy, layout, "decode")
                                    + (f"  # x {disaggregation.decode_workers} workers"
                                       if disaggregation.decode_workers > 1 else ""), spec, policy.engine)])


def _with_priced_drafts(result):
    """The plan's spec with the draft length it priced where the spec leaves it to the model (one token per MTP
    module), so that the launch line says it rather than leave it to the engine's own default."""
    spec, drafting = result.spec, result.replica.speculative
    given = spec.serving.speculative
    if given is None or given.draft_tokens is not None or drafting is None:
        return spec
    priced = given.model_copy(update={"draft_tokens": drafting.draft_tokens})
    return spec.model_copy(update={"serving": spec.serving.model_copy(update={"speculative": priced})})


def _with_weights(line: str, spec, engine: str) -> str:
    """``line`` serving the weights the point was priced at: a 16-bit checkpoint priced at fp8 is quantised as it
    loads (vLLM's and SGLang's --quantization fp8); any other checkpoint stored in another dtype than the one
    priced (its routed experts apart where its config stores them apart, as DeepSeek-V4's) is said so in a
    comment, since the command as written would serve the stored one."""
    from apmw.arch import load_architecture
    from apmw.catalog.models import checkpoint_weight_dtype, config_weight_dtype
    from apmw.spec.spellings import dtype_key

    model, priced = spec.model.config, dtype_key(spec.model.weight_dtype)
    named = checkpoint_weight_dtype(model)
    stored = named or config_weight_dtype(model)
    said = []
    if stored is None and priced == "fp8" and engine in ("vllm", "sglang"):
        served = served_model(model)
        line = line.replace(f" {served} ", f" {served} --quantization fp8 ", 1)
    elif stored is not None and stored != priced:
        said.append(f"priced at {priced} weights, but {model} stores {stored}")
    elif stored is None and priced not in ("bf16", "fp16"):
        said.append(f"priced at {priced} weights, but {model} is a 16-bit checkpoint")
    try:        # where the config stores the experts apart (a name states one dtype for every part)
        experts = None if named else load_architecture(model).expert_dtype_in_checkpoint
    except ApmwError:
        experts = None
    priced_experts = dtype_key(spec.model.moe_dtype or spec.model.weight_dtype)
    if experts and stored and experts != stored and experts != priced_experts:
        said.append(f"its routed experts priced at {priced_experts}, but stored in {experts}")
    return _noted(line, "; ".join(said) + ": serve a checkpoint that matches" if said else None)


def _noted(line: str, note: str | None) -> str:
    """``line`` with ``note`` in its comment (opened where it has none)."""
    if not note:
        return line
    return line + ("; " if "  # " in line else "  # ") + note


# What each engine needs to hold a tool wait's KV in host memory, as apmw prices ``offload``: none of them does it
# from the flags above alone.
HOST_OFFLOAD = {"vllm": "a KV offload connector (--kv-transfer-config, e.g. LMCache)",
                "sglang": "its hierarchical cache (--enable-hierarchical-cache)",
                "trtllm": "host KV cache (kv_cache_config: host_cache_size)"}


def _offload_note(spec, engine: str) -> str | None:
    """Where the point prices ``offload``, what the engine needs for it."""
    if spec.serving.tool_wait_kv_policy != "offload":
        return None
    return (f"priced with each tool wait's KV offloaded to host memory: {engine} needs "
            f"{HOST_OFFLOAD.get(engine, 'a host KV cache')} for it")


def _llama_server(spec, policy) -> str:
    """llama.cpp's server: every layer on the GPUs (split by layer over several), a slot per concurrent call
    (``--parallel``), the token budget as its logical batch, the KV cache type where it is not 16-bit (a quantised
    V cache needs flash attention)."""
    kv = _kv_cache_dtype(spec, "llamacpp")
    return (f"llama-server -m <GGUF of {spec.model.config}> -ngl 999 --parallel {policy.max_batch} "
            f"--batch-size {policy.token_budget}"
            + (f" --cache-type-k {kv} --cache-type-v {kv}" + (" --flash-attn on" if kv.startswith("q") else "")
               if kv else ""))


def served_model(config: str) -> str:
    """What a launch line points the engine at for ``model.config``, shell-quoted: a hub id or a checkpoint folder
    as given; for a path to a ``config.json``, its folder (the engines load a checkpoint folder, which holds the
    config beside the weights, not the file); for another JSON file, a placeholder naming it (its folder need not
    be the checkpoint)."""
    path = PurePath(config)
    if path.name == "config.json":
        return shlex.quote(str(path.parent))
    if path.suffix.lower() == ".json":
        return f"<checkpoint folder of {config}>"
    return shlex.quote(config)


# vLLM's KV hand-off between Dynamo workers (NIXL), as AIConfigurator's templates set it.
NIXL_KV_TRANSFER = """'{"kv_connector":"NixlConnector","kv_role":"kv_both"}'"""


def _dynamo_worker(spec, policy, layout: Layout, role: str) -> str:
    model = served_model(spec.model.config)
    if policy.engine == "trtllm":       # Dynamo's TensorRT-LLM worker reads its engine settings from a YAML file
        return (f"python3 -m dynamo.trtllm --model-path {model} --extra-engine-args {role}.yaml "
                f"--disaggregation-mode {role}  # {role}.yaml: {{{_trtllm_yaml(spec, policy, layout, spec.serving.speculative)}}}")
    if policy.engine == "sglang":
        return (f"python3 -m dynamo.sglang --model-path {model} {_engine_args(spec, policy, layout)} "
                f"--disaggregation-mode {role}")
    return (f"python3 -m dynamo.vllm --model {model} {_engine_args(spec, policy, layout)} --disaggregation-mode {role} "
            f"--kv-transfer-config {NIXL_KV_TRANSFER}")


def _per_rank(total: int, layout: Layout, engine: str) -> int:
    """An engine setting as the flag takes it: per attention-DP rank where each rank has its own scheduler
    (vLLM, TensorRT-LLM), the server's total for SGLang (apmw.perf.serving_policy.schedulers_per_limit)."""
    return total // schedulers_per_limit(engine, layout.dp)


def _kv_cache_dtype(spec, engine: str) -> str | None:
    """The engine's name for the spec's KV dtype where it needs a flag (apmw.perf.serving_policy.KV_CACHE_DTYPES)."""
    return KV_CACHE_DTYPES.get(engine, {}).get(spec.model.kv_dtype)


def _trtllm_kv_cache(spec) -> list[str]:
    """TensorRT-LLM's kv_cache_config entries for the spec: its KV dtype where not 16-bit, block reuse (its prefix
    cache, on by default) off where the spec has no prefix caching."""
    kv = _kv_cache_dtype(spec, "trtllm")
    return [f"dtype: {kv}"] * bool(kv) + ["enable_block_reuse: false"] * (not spec.serving.prefix_caching)


def _trtllm_expert_slots(spec, layout: Layout) -> str:
    """TensorRT-LLM's expert slots where the layout adds redundant experts: its MoE load balancer places the
    routed experts and their extra copies in ``num_slots`` slots over the EP ranks."""
    from apmw.arch import load_architecture

    experts = load_architecture(spec.model.config).num_experts
    return f"moe_config: {{load_balancer: {{num_slots: {experts + layout.redundant_experts}}}}}"


def _trtllm_yaml(spec, policy, layout: Layout, speculative=None) -> str:
    """TensorRT-LLM's engine settings (LLM API options): its tp_size spans the attention DP ranks."""
    cache = [f"free_gpu_memory_fraction: {policy.kv_memory_fraction:g}", *_trtllm_kv_cache(spec)]
    parts = [f"tensor_parallel_size: {layout.tp * layout.dp}", f"max_batch_size: {_per_rank(policy.max_batch, layout, 'trtllm')}",
             f"max_num_tokens: {_per_rank(policy.token_budget, layout, 'trtllm')}",
             f"kv_cache_config: {{{', '.join(cache)}}}"]
    parts += [f"pipeline_parallel_size: {layout.pp}"] * (layout.pp > 1)
    parts += [f"moe_expert_parallel_size: {layout.ep}"] * (layout.ep > 1)
    parts += ["enable_attention_dp: true"] * (layout.dp > 1)
    parts += [_trtllm_expert_slots(spec, layout)] * bool(layout.redundant_experts)
    parts += [_speculative_args(speculative, "trtllm")] * (speculative is not None)
    return ", ".join(parts)


# Where a spec drafts with a separate model it does not name, the launch line holds this for the user to fill.
UNNAMED_DRAFT = "<your draft model>"


def _speculative_args(speculative, engine: str) -> str:
    """The engine's speculative-decoding flags for ``serving.speculative`` (empty without it): the model's own
    MTP head (vLLM ``method: mtp``; SGLang's EAGLE path, one draft token per step; TensorRT-LLM's MTP decoding)
    or a separate draft model (vLLM ``model``; SGLang ``STANDALONE``; TensorRT-LLM ``DraftTarget``)."""
    if speculative is None:
        return ""
    k, mtp = speculative.draft_tokens, speculative.draft == "mtp"
    draft = speculative.draft_model or UNNAMED_DRAFT
    if engine == "sglang":
        steps = f"--speculative-num-steps {k} " if k else ""
        tokens = f" --speculative-num-draft-tokens {k + 1}" if k else ""
        algorithm = "EAGLE" if mtp else f"STANDALONE --speculative-draft-model-path {draft}"
        return f" --speculative-algorithm {algorithm} {steps}--speculative-eagle-topk 1{tokens}"
    if engine == "trtllm":     # an LLM API option: _layout_args opens the comment that carries them
        config = ("{decoding_type: MTP" + (f", num_nextn_predict_layers: {k}" if k else "") + "}" if mtp
                  else f"{{decoding_type: DraftTarget, max_draft_len: {k}, speculative_model_dir: {draft}}}")
        return f"speculative_config: {config}"
    config = {"method": "mtp"} if mtp else {"model": draft}
    if k:
        config["num_speculative_tokens"] = k
    return f" --speculative-config '{json.dumps(config, separators=(',', ':'))}'"


def _engine_args(spec, policy, layout: Layout) -> str:
    """The engine's own flags for a replica laid out as ``layout``: parallel sizes, batch cap and token
    budget (per rank where the engine reads them so), memory share, KV dtype, prefix caching, speculative
    decoding."""
    speculative = _speculative_args(spec.serving.speculative, policy.engine)
    if policy.engine != "trtllm":
        return _layout_args(spec, policy, layout) + speculative
    cache = _trtllm_kv_cache(spec)
    options = (["enable_attention_dp: true"] * (layout.dp > 1) + [f"kv_cache_config: {{{', '.join(cache)}}}"] * bool(cache)
               + [_trtllm_expert_slots(spec, layout)] * bool(layout.redundant_experts) + [speculative] * bool(speculative))
    return _layout_args(spec, policy, layout) + (f"  # extra_llm_api_options: {{{', '.join(options)}}}" if options else "")


def _layout_args(spec, policy, layout: Layout) -> str:
    """:func:`_engine_args` but speculative decoding."""
    kv = _kv_cache_dtype(spec, policy.engine)
    caching = spec.serving.prefix_caching
    if policy.engine == "sglang":       # --tp-size counts every attention GPU; --dp splits them into DP ranks
        return (f"--tp {layout.tp * layout.dp}" + (f" --dp {layout.dp} --enable-dp-attention" if layout.dp > 1 else "")
                + (f" --ep-size {layout.ep}" if layout.ep > 1 else "") + (f" --pp-size {layout.pp}" if layout.pp > 1 else "")
                + (f" --ep-num-redundant-experts {layout.redundant_experts}" if layout.redundant_experts else "")
                + (" --enable-two-batch-overlap" if layout.two_batch_overlap else "")
                + f" --max-running-requests {policy.max_batch} --chunked-prefill-size {policy.token_budget} "
                f"--mem-fraction-static {policy.kv_memory_fraction:g}" + (f" --kv-cache-dtype {kv}" if kv else "")
                + ("" if caching else " --disable-radix-cache") + _sglang_scheduling(spec.serving))
    if policy.engine == "trtllm":
        args = (f"--tp_size {layout.tp * layout.dp} --max_batch_size {_per_rank(policy.max_batch, layout, 'trtllm')} "
                f"--max_num_tokens {_per_rank(policy.token_budget, layout, 'trtllm')} "
                f"--kv_cache_free_gpu_memory_fraction {policy.kv_memory_fraction:g}")
        args += f" --pp_size {layout.pp}" if layout.pp > 1 else ""
        return args + (f" --ep_size {layout.ep}" if layout.ep > 1 else "")
    # vLLM: expert parallelism spans tp x dp (moe_tp 1) when enabled; other splits it cannot express
    vllm = (f"--tensor-parallel-size {layout.tp}" + (f" --pipeline-parallel-size {layout.pp}" if layout.pp > 1 else "")
            + (f" --data-parallel-size {layout.dp}" if layout.dp > 1 else "")
            + (" --enable-expert-parallel" if layout.ep > 1 else "")
            + (" --enable-eplb --eplb-config '{\"num_redundant_experts\":%d}'" % layout.redundant_experts
               if layout.redundant_experts else "")
            + (" --enable-dbo" if layout.two_batch_overlap else ""))
    return (vllm + f" --max-num-seqs {_per_rank(policy.max_batch, layout, 'vllm')} --max-num-batched-tokens "
            f"{_per_rank(policy.token_budget, layout, 'vllm')} --gpu-memory-utilization {policy.kv_memory_fraction:g}"
            + (f" --kv-cache-dtype {kv}" if kv else "")
            + (" --enable-prefix-caching" if caching else " --no-enable-prefix-caching")
            + ("  # vLLM's expert parallelism spans tp x dp: moe_tp must be 1" if layout.ep > 1 and layout.moe_tp > 1 else ""))


def _sglang_scheduling(serving) -> str:
    """SGLang's flags for the scheduling settings a spec gives (left out, SGLang's defaults, as apmw prices them)."""
    return ((" --enable-mixed-chunk" if serving.mixed_prefill else "")
            + (" --disable-overlap-schedule" if serving.overlap_scheduling is False else "")
            + (f" --scheduler-recv-interval {serving.scheduler_recv_interval}"
               if serving.scheduler_recv_interval is not None else ""))


def prune_reason(message: str) -> str:
    """The class of a pruned point's message, to count points by (the message itself is kept for --explain)."""
    if "does not fit" in message:
        return "does not fit: the weights and workspace leave no KV memory"
    if "invalid spec" in message:
        detail = message.split("\n")[-1].strip()
        return f"not a valid spec ({detail.split(':')[0]})"
    return _NUMBER.sub("N", message.split(";")[0].split(":")[0])[:120]     # "max_batch N": one count for all values


# A number standing alone in a reason ("below max_batch 256"), not part of a name (H100, Qwen3-32B).
_NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?![\w.])")
