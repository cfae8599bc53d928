"""`apmw predict`: a serving benchmark point at a fixed concurrency or a request rate, or a sweep over either."""

from __future__ import annotations

import math
import re
from typing import Optional

import typer
from rich.table import Table

from apmw.cli.common import (app, emit_json, fail, note, note_checkpoint_dtype, note_context_window, note_draft_memory, note_gpu_basis,
                             note_scaleout, note_speculation_loss, out, print_table)
from apmw.errors import ApmwError


@app.command()
def predict(
    model: str = typer.Option(..., "--model", help="bundled model name, a derived checkpoint's hub id "
                              "(meta-llama/Llama-3.1-8B-Instruct), or a path to a HF config.json or checkpoint directory"),
    gpu: str = typer.Option(..., "--gpu", help="catalogue GPU or the name nvidia-smi prints (apmw model --gpus lists them)"),
    tp: int = typer.Option(1, "--tp", help="tensor-parallel GPUs per replica (per attention data-parallel rank "
                           "with --dp-attention; per pipeline stage with --pp)"),
    pp: int = typer.Option(1, "--pp", help="pipeline-parallel stages [--pipeline-parallel-size]"),
    dp_attention: int = typer.Option(1, "--dp-attention", help="attention data-parallel ranks, each with its own "
                                     "requests and KV [vLLM --data-parallel-size with expert parallel; SGLang --dp "
                                     "with --enable-dp-attention]; the replica has tp x pp x dp-attention GPUs"),
    moe_tp: Optional[int] = typer.Option(None, "--moe-tp", help="tensor-parallel size of each routed expert "
                                         "(default: tp x dp-attention / ep)"),
    ep: int = typer.Option(1, "--ep", help="expert-parallel size; moe-tp x ep = tp x dp-attention"),
    disagg: bool = typer.Option(False, "--disagg", help="disaggregated serving: prefill workers and decode workers, "
                                "each laid out by --prefill-*/--decode-* (default: the flags above); --concurrency "
                                "is the total over the decode workers"),
    prefill_workers: int = typer.Option(1, "--prefill-workers", help="with --disagg: prefill workers"),
    decode_workers: int = typer.Option(1, "--decode-workers", help="with --disagg: decode workers"),
    prefill_tp: Optional[int] = typer.Option(None, "--prefill-tp",
        help="with --disagg: each prefill worker's --tp (default: --tp's)"),
    prefill_pp: Optional[int] = typer.Option(None, "--prefill-pp",
        help="with --disagg: each prefill worker's --pp (default: --pp's)"),
    prefill_dp_attention: Optional[int] = typer.Option(None, "--prefill-dp-attention",
        help="with --disagg: each prefill worker's --dp-attention (default: --dp-attention's)"),
    prefill_moe_tp: Optional[int] = typer.Option(None, "--prefill-moe-tp",
        help="with --disagg: each prefill worker's --moe-tp (default: --moe-tp's)"),
    prefill_ep: Optional[int] = typer.Option(None, "--prefill-ep",
        help="with --disagg: each prefill worker's --ep (default: --ep's)"),
    decode_tp: Optional[int] = typer.Option(None, "--decode-tp",
        help="with --disagg: each decode worker's --tp (default: --tp's)"),
    decode_pp: Optional[int] = typer.Option(None, "--decode-pp",
        help="with --disagg: each decode worker's --pp (default: --pp's)"),
    decode_dp_attention: Optional[int] = typer.Option(None, "--decode-dp-attention",
        help="with --disagg: each decode worker's --dp-attention (default: --dp-attention's)"),
    decode_moe_tp: Optional[int] = typer.Option(None, "--decode-moe-tp",
        help="with --disagg: each decode worker's --moe-tp (default: --moe-tp's)"),
    decode_ep: Optional[int] = typer.Option(None, "--decode-ep",
        help="with --disagg: each decode worker's --ep (default: --ep's)"),
    kv_transfer_gb_per_s: Optional[float] = typer.Option(None, "--kv-transfer-gb-per-s", help="with --disagg: per "
                                                         "prefill GPU link for the KV hand-off, GB/s (default 50: one "
                                                         "400 Gb/s NIC per GPU)"),
    weight_dtype: Optional[str] = typer.Option(
        None, "--weight-dtype", help="bf16, fp8, fp4, int4, ... (bfloat16, nvfp4 also read). Default: what the "
        "checkpoint stores, as its name or config.json's quantization_config says (its routed experts apart where "
        "the config stores them apart), else bf16"),
    kv_dtype: Optional[str] = typer.Option(
        None, "--kv-dtype", help="bf16 or fp8 (fp8_e4m3 also read; fp4 on Blackwell). Default: what the engines pick "
        "for the checkpoint ('auto'): the KV format its quantization_config names, else bf16"),
    moe_dtype: Optional[str] = typer.Option(None, "--moe-dtype", help="the routed experts' dtype where it differs "
                                            "from --weight-dtype (nvfp4, mxfp4, fp8_block, int4_wo, ...)"),
    isl: int = typer.Option(..., "--isl", help="prompt tokens per request"),
    osl: int = typer.Option(..., "--osl", help="output tokens per request"),
    concurrency: Optional[str] = typer.Option(None, "--concurrency",
                                              help="clients, each with one request in flight; a comma list "
                                                   "(1,4,16,64) sweeps them"),
    request_rate: Optional[str] = typer.Option(
        None, "--request-rate",
        help="instead of --concurrency: Poisson arrivals, requests/s per replica (vLLM bench serve "
             "--request-rate, MLPerf Server); a comma list sweeps them"),
    engine: str = typer.Option("vllm", "--engine", help="vllm, sglang or trtllm (TensorRT-LLM also read)"),
    engine_version: Optional[str] = typer.Option(
        None, "--engine-version",
        help="price iterations with the engine's own measured tables of this release (bundled: vllm 0.24.0, "
             "sglang 0.5.14, trtllm 1.3.0rc20 on Blackwell); refused where they are not bundled or cannot price "
             "the replica. Default: the tables apmw holds for the GPU, or an estimate (named in source)"),
    mxfp4_moe_activations: Optional[str] = typer.Option(
        None, "--mxfp4-moe-activations",
        help="what MXFP4 routed experts (gpt-oss's) take as activations: bf16 (W4A16) or mxfp8 (W4A8, Blackwell; "
             "vLLM with VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1). Default: the engine's, mxfp8 for trtllm on "
             "Blackwell, else bf16"),
    scheduler_recv_interval: Optional[int] = typer.Option(
        None, "--scheduler-recv-interval",
        help="SGLang's --scheduler-recv-interval: decode iterations between the scheduler's polls for new "
             "requests, so a prompt arriving at a busy engine waits half that many on average (InferenceMAX's B200 "
             "DeepSeek-R1 scripts: 10, and 30 from concurrency 16). Default 1, every iteration"),
    speculative: Optional[str] = typer.Option(
        None, "--speculative",
        help="speculative decoding: mtp (the model's own multi-token-prediction head: --draft-tokens defaults to "
             "its modules, --acceptance-rate to 0.85, DeepSeek-V3 report section 5.4.3) or model (a separate draft: "
             "give --draft-tokens and --acceptance-rate). Default: none"),
    draft_tokens: Optional[int] = typer.Option(None, "--draft-tokens", help="with --speculative: tokens the draft "
                                               "proposes per iteration [SGLang --speculative-num-steps, TensorRT-LLM "
                                               "num_nextn_predict_layers]"),
    acceptance_rate: Optional[float] = typer.Option(None, "--acceptance-rate", help="with --speculative: the chance "
                                                    "each proposed token is accepted (a property of the workload's text)"),
    draft_cost_fraction: Optional[float] = typer.Option(
        None, "--draft-cost-fraction", help="with --speculative: the draft's time per iteration over the target's "
        "(default: mtp from the architecture; a separate model from --draft-model's size, else 0.1)"),
    draft_model: Optional[str] = typer.Option(
        None, "--draft-model", help="with --speculative model: the draft model (a config.json path or a bundled name), "
        "whose weights and KV then take memory and whose size prices its passes [vLLM speculative_config model]"),
    token_budget: Optional[int] = typer.Option(None, "--token-budget", help="tokens per iteration (default: the engine's for the GPU, 8192 on H100-class GPUs)"),
    max_batch: Optional[int] = typer.Option(None, "--max-batch", help="running-sequence limit (default: the engine's for the GPU, vLLM 1024 on H100-class GPUs)"),
    length_spread: Optional[float] = typer.Option(
        None, "--length-spread",
        help="width of the request-length distribution over its mean (0: all requests equal, as with "
             "vLLM bench serve's random dataset and --ignore-eos; they then move in lock-step groups, and "
             "under SGLang's prefill-first scheduling the whole first wave repeats every cycle; default 0.2)"),
    request_overhead_ms: Optional[float] = typer.Option(
        None, "--request-overhead-ms",
        help="client-seen TTFT outside the engine: HTTP, tokenising (default 25 ms; 0 for an in-process harness). "
             "Published harnesses range from about 1.5 ms (NIM, local client) to about 200 ms; "
             "to measure yours, run concurrency 1 "
             "with a short prompt and subtract this prediction's TTFT at --request-overhead-ms 0"),
    requests_per_client: Optional[int] = typer.Option(
        None, "--requests-per-client",
        help="the benchmark's prompts / concurrency; the first, simultaneous wave weighs 1/N of TTFT "
             "(default and InferenceMAX: 10)"),
    mixed_prefill: Optional[bool] = typer.Option(
        None, "--mixed-prefill/--prefill-first",
        help="whether prompt chunks ride in decode iterations (default: the engine's; vllm and trtllm mix, "
             "sglang runs prefill alone and first unless started with --enable-mixed-chunk)"),
    overlap_scheduling: Optional[bool] = typer.Option(
        None, "--overlap-scheduling/--no-overlap-scheduling",
        help="whether the engine forms the next iteration's batch while the current one runs, so a prompt "
             "arriving at a busy engine waits one more iteration (default: yes, as current vLLM (async "
             "scheduling), SGLang and TensorRT-LLM (overlap schedulers) do; no: vLLM before late 2025 or "
             "--no-async-scheduling, SGLang --disable-overlap-schedule, TensorRT-LLM's legacy engine backend)"),
    kv_memory_fraction: Optional[float] = typer.Option(
        None, "--kv-memory-fraction",
        help="the engine's memory setting, read as the engine reads it: vLLM --gpu-memory-utilization and SGLang "
             "--mem-fraction-static (share of all GPU memory for weights, activations and KV), TensorRT-LLM "
             "free_gpu_memory_fraction (share of the memory left after weights). Default 0.9, the default of all "
             "three for most of their history; vLLM since April 2026 (PR #38284): 0.92"),
    roofline: bool = typer.Option(False, "--roofline", help="use the plain spec-sheet roofline, even where tables cover the GPU or a measured relative scales to it"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object, or a list for a sweep (fields: see docs/accuracy.md)"),
) -> None:
    """Predict mean TTFT, TPOT and throughput of a serving benchmark: fixed concurrency (InferenceMAX
    style) or Poisson arrivals at a request rate."""
    from apmw.capacity.benchmark import DEFAULT_LENGTH_SPREAD, DEFAULT_REQUESTS_PER_CLIENT, predict as run
    from apmw.capacity.open_loop import predict_rate

    if request_overhead_ms is not None and not 0 <= request_overhead_ms < math.inf:
        fail(f"--request-overhead-ms must be a non-negative number of milliseconds (got {request_overhead_ms:g})")
    if (concurrency is None) == (request_rate is None):
        fail("give either --concurrency (clients, closed loop) or --request-rate (requests/s, Poisson), not "
             + ("both" if concurrency else "neither"))
    by_rate = request_rate is not None
    levels = (_levels(request_rate, "--request-rate", float, "1,2.5,5") if by_rate
              else _levels(concurrency, "--concurrency", int, "1,4,16,64"))
    sided = {f"--{side}-{name}": value for side, values in (
        ("prefill", (prefill_tp, prefill_pp, prefill_dp_attention, prefill_moe_tp, prefill_ep)),
        ("decode", (decode_tp, decode_pp, decode_dp_attention, decode_moe_tp, decode_ep)))
        for name, value in zip(("tp", "pp", "dp-attention", "moe-tp", "ep"), values)}
    sided.update({"--prefill-workers": prefill_workers if prefill_workers != 1 else None,
                  "--decode-workers": decode_workers if decode_workers != 1 else None,
                  "--kv-transfer-gb-per-s": kv_transfer_gb_per_s})
    given = [flag for flag, value in sided.items() if value is not None]
    if given and not disagg:
        fail(f"{', '.join(given)} describe{'s' if len(given) == 1 else ''} disaggregated workers: add --disagg, or "
             "leave them out and lay the replica out with --tp, --pp, --dp-attention, --moe-tp and --ep")
    layout = _layout(pp, dp_attention, moe_tp, ep)
    drafting = _speculative(speculative, draft_tokens, acceptance_rate, draft_cost_fraction, draft_model)
    note_draft_memory(speculative, draft_model)
    if weight_dtype is None:
        weight_dtype, moe_dtype = _checkpoint_weight_dtypes(model, moe_dtype)
    if kv_dtype is None:
        kv_dtype = _checkpoint_kv_dtype(model)
    if disagg:
        _refuse_unmodelled_with_disagg(by_rate, scheduler_recv_interval, {
            "--mixed-prefill/--prefill-first": mixed_prefill,
            "--overlap-scheduling/--no-overlap-scheduling": overlap_scheduling,
            "--length-spread": length_spread, "--requests-per-client": requests_per_client})
        sides = {side: _workers(count, tp if t is None else t, _layout(
            pp if p_ is None else p_, dp_attention if d is None else d, moe_tp if m is None else m, ep if e is None else e))
            for side, count, t, p_, d, m, e in (
                ("prefill", prefill_workers, prefill_tp, prefill_pp, prefill_dp_attention, prefill_moe_tp, prefill_ep),
                ("decode", decode_workers, decode_tp, decode_pp, decode_dp_attention, decode_moe_tp, decode_ep))}
        from apmw.spec import Disaggregation    # its default link, one 400 Gb/s NIC per GPU

        link_bytes_per_s = (Disaggregation.model_fields["kv_transfer_bandwidth_bytes_per_s"].default
                            if kv_transfer_gb_per_s is None else kv_transfer_gb_per_s * 1e9)
        _predict_disagg(model, gpu, weight_dtype, kv_dtype, isl, osl, levels, sides, engine, not roofline,
                        link_bytes_per_s, request_overhead_ms, token_budget, max_batch, kv_memory_fraction,
                        as_json, moe_dtype, engine_version, mxfp4_moe_activations, drafting)
        return
    common = dict(layout=layout, moe_dtype=moe_dtype, engine=engine, engine_version=engine_version,
                  mxfp4_moe_activations=mxfp4_moe_activations, scheduler_recv_interval=scheduler_recv_interval,
                  speculative=drafting, token_budget=token_budget, max_batch=max_batch, calibrated=not roofline,
                  mixed_prefill=mixed_prefill, overlap_scheduling=overlap_scheduling,
                  kv_memory_fraction=kv_memory_fraction,
                  request_overhead_s=None if request_overhead_ms is None else request_overhead_ms / 1e3)
    note_checkpoint_dtype(model, weight_dtype, moe_dtype)
    note_context_window(model)
    note_gpu_basis(gpu)
    try:
        if by_rate:
            ps = [_within_capacity(lambda r=r: predict_rate(model, gpu, tp, weight_dtype, kv_dtype, isl, osl, r,
                                                            **common), sweep=len(levels) > 1) for r in levels]
            if all(isinstance(p, str) for p in ps):
                fail(as_flags(ps[0]))
        else:
            per_client = DEFAULT_REQUESTS_PER_CLIENT if requests_per_client is None else requests_per_client
            ps = [run(model, gpu, tp, weight_dtype, kv_dtype, isl, osl, c,
                      length_spread=DEFAULT_LENGTH_SPREAD if length_spread is None else length_spread,
                      requests_per_client=per_client, **common) for c in levels]
    except ApmwError as exc:
        fail(as_flags(str(exc)))
    _note_scaleout(gpu, tp, layout)
    note_speculation_loss(next((p.speculative for p in ps if not isinstance(p, str)), None))
    key = "request_rate_per_s" if by_rate else "concurrency"
    if len(levels) > 1:
        _sweep(ps, levels, key, as_json, f"{model} on {_replica_text(tp, layout, gpu)}, {isl:,}/{osl:,} tokens ({engine})")
        if not as_json:
            _print_model_source(model)
        return
    p = ps[0]
    if as_json:
        emit_json({key: levels[0], **p.to_dict()} if by_rate else p.to_dict())
        return
    load = f"{levels[0]:g} requests/s (Poisson)" if by_rate else f"concurrency {levels[0]:,}"
    print_table(_prediction_table(p, f"{model} on {_replica_text(tp, layout, gpu)}, {isl:,}/{osl:,} tokens, {load} ({engine})",
                                  engine, max_batch is not None, _lowered_to(engine, token_budget, layout)))
    out.print(f"[dim]{p.source_detail}[/]")
    _print_model_source(model)


def _refuse_unmodelled_with_disagg(by_rate: bool, scheduler_recv_interval: int | None, unread: dict) -> None:
    """Refuse the options a disaggregated prediction does not read (``unread``: flag -> value given or None)."""
    if scheduler_recv_interval not in (None, 1):
        fail("--scheduler-recv-interval is not modelled with --disagg (the decode workers take requests from "
             "the prefill workers' transfers, not the tokenizer's poll); leave it out")
    if by_rate:
        fail("--disagg predicts a fixed --concurrency; --request-rate is not modelled for it")
    given = [flag for flag, value in unread.items() if value is not None]
    if given:
        fail(f"{', '.join(given)}: not modelled with --disagg (the prefill workers run prompts alone and the "
             "decode workers decode alone; requests are of the given lengths, in their steady state); leave "
             f"{'it' if len(given) == 1 else 'them'} out")


def _prediction_table(p, title: str, engine: str, given_max_batch: bool, budget_limit: int | None = None) -> Table:
    """One prediction as the terminal shows it: TTFT and its parts, TPOT, throughput, what the engine does, power."""
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("TTFT, mean", f"{p.ttft_s * 1e3:,.1f} ms")
    parts = {"engine": "steady_state", "first wave": "first_wave", "overhead": "request_overhead",
             "slot queue": "slot_queue", "KV hand-off": "kv_handoff"}
    table.add_row("  made of", ", ".join(f"{name} {p.ttft_parts_s[key] * 1e3:,.1f}" for name, key in parts.items()
                                         if p.ttft_parts_s[key] >= 5e-5 or key == "steady_state") + " ms")
    table.add_row("TPOT, mean", f"{p.tpot_s * 1e3:.2f} ms")
    table.add_row("output tokens/s per GPU", f"{p.output_tokens_per_s_per_gpu:,.0f}")
    table.add_row("running / queued requests", f"{_count(p.running_requests)} / {_count(p.queued_requests)}")
    if p.queued_requests and p.running_limited_by != "concurrency":
        table.add_row("running capped by", _cap(p, engine, given_max_batch, budget_limit))
    table.add_row("prompts arrive", p.prompts_arrive)
    table.add_row("prefill", "mixed with decode" if p.prefill_mixed_with_decode else "alone and first")
    table.add_row("next batch formed", "while the current iteration runs" if p.iterations_scheduled_ahead
                  else "after the current iteration")
    if p.speculative:
        sd = p.speculative
        table.add_row("speculative decoding", f"{sd['draft_tokens']} draft tokens at {sd['acceptance_rate']:.0%} "
                      f"acceptance: {sd['tokens_per_iteration']:.2f} tokens per iteration, draft "
                      f"{sd['draft_cost_fraction']:.1%} of an iteration")
    table.add_row("replica power (GPUs + host share)", f"{p.replica_power_w:,.0f} W")
    table.add_row("output tokens per joule", f"{p.output_tokens_per_j:.2f}")
    table.add_row("source", p.source)
    return table


def _layout(pp: int, dp_attention: int, moe_tp: int | None, ep: int) -> dict | None:
    """The layout flags beyond --tp that differ from plain tensor parallelism."""
    layout = {"pp": pp, "dp_attention": dp_attention, "moe_tp": moe_tp, "ep": ep}
    # left out: what was not given; an explicit --moe-tp (even 1) is checked against the others
    return {k: v for k, v in layout.items() if v is not None and (k == "moe_tp" or v != 1)} or None


def _speculative(draft: str | None, draft_tokens: int | None, acceptance_rate: float | None,
                 draft_cost_fraction: float | None, draft_model: str | None = None) -> dict | None:
    """--speculative and its figures as :class:`apmw.spec.Speculative`'s fields (None without it)."""
    figures = {"draft_tokens": draft_tokens, "acceptance_rate": acceptance_rate,
               "draft_cost_fraction": draft_cost_fraction, "draft_model": draft_model}
    if draft is None:
        given = [FLAGS[k] for k, v in figures.items() if v is not None]
        if given:
            fail(f"{', '.join(given)} describe speculative decoding; add --speculative mtp or --speculative model")
        return None
    if draft not in ("mtp", "model"):
        fail(f"--speculative: '{draft}' is not a draft apmw knows; use mtp (the model's own multi-token-prediction "
             "head) or model (a separate draft model, with --draft-tokens and --acceptance-rate)")
    return {"draft": draft, **{k: v for k, v in figures.items() if v is not None}}


def _workers(count: int, tp: int, layout: dict | None):
    from apmw.capacity.disaggregated_benchmark import Workers
    return Workers(count=count, tp=tp, layout=layout)


def _checkpoint_weight_dtypes(model: str, moe_dtype: str | None) -> tuple[str, str | None]:
    """The weight dtype (and the experts' where the config stores them apart) of ``model`` as stored, priced when
    --weight-dtype is left out: what an engine serves from the checkpoint; a note says so where it is not bf16."""
    from apmw.arch import load_architecture
    from apmw.catalog.models import checkpoint_weight_dtype, config_weight_dtype

    named = checkpoint_weight_dtype(model)
    stored = named or config_weight_dtype(model)
    if stored is None:
        return "bf16", moe_dtype
    given = moe_dtype
    if moe_dtype is None and named is None:
        try:
            experts = load_architecture(model).expert_dtype_in_checkpoint
        except ApmwError:
            experts = None      # the verb reports a config it cannot read itself
        moe_dtype = experts if experts and experts != stored else None
    apart = f" and its routed experts in {moe_dtype}" if moe_dtype and given is None else ""
    chosen = f"; routed experts at {given}, as --moe-dtype gives" if given else ""
    note(f"weights {stored}{apart}, as {model} stores them{chosen}; --weight-dtype prices another")
    return stored, moe_dtype


def _checkpoint_kv_dtype(model: str) -> str:
    """The KV dtype the engines pick for ``model`` when none is given; a note says so where it is not the
    plain 16-bit cache of a checkpoint read as itself (a format its config names, or a derivative's base)."""
    from apmw.catalog.models import AUTO_KV_DTYPE, checkpoint_kv_dtype

    try:
        dtype, why, derived = checkpoint_kv_dtype(model)
    except ApmwError as exc:
        fail(str(exc))
    if dtype != AUTO_KV_DTYPE or derived:
        note(f"KV cache {dtype}, what vLLM, SGLang and TensorRT-LLM pick for {model}: {why}; --kv-dtype prices another")
    return dtype


def _predict_disagg(model, gpu, weight_dtype, kv_dtype, isl, osl, levels, sides, engine, calibrated, link_bw,
                    request_overhead_ms, token_budget, max_batch, kv_memory_fraction, as_json, moe_dtype,
                    engine_version, mxfp4_moe_activations, speculative) -> None:
    """`apmw predict --disagg`: one prediction per concurrency level on prefill and decode workers."""
    from apmw.capacity.disaggregated_benchmark import accuracy_caveat, predict_disaggregated

    note(accuracy_caveat())
    pre, dec = sides["prefill"], sides["decode"]
    try:
        ps = [predict_disaggregated(model, gpu, weight_dtype, kv_dtype, isl, osl, c, pre, dec, engine=engine,
                                    calibrated=calibrated, kv_transfer_bandwidth_bytes_per_s=link_bw,
                                    request_overhead_s=None if request_overhead_ms is None else request_overhead_ms / 1e3,
                                    token_budget=token_budget, max_batch=max_batch,
                                    kv_memory_fraction=kv_memory_fraction, moe_dtype=moe_dtype,
                                    engine_version=engine_version,
                                    mxfp4_moe_activations=mxfp4_moe_activations,
                                    speculative=speculative) for c in levels]
    except ApmwError as exc:
        message = as_flags(str(exc))
        side = message.split(" workers: ", 1)[0]
        if side in ("prefill", "decode"):     # each layout flag by its --prefill-/--decode- form
            message = re.sub(r"--(tp|pp|dp-attention|moe-tp|ep)\b", rf"--{side}-\1", message)
        fail(message)
    for workers in (pre, dec):
        _note_scaleout(gpu, workers.tp, workers.layout)
    if as_json:
        rows = [{"concurrency": c, **p.to_dict()} for c, p in zip(levels, ps)]
        emit_json(rows if len(rows) > 1 else rows[0])
        return
    title = (f"{model}: {pre.count} prefill x {_replica_text(pre.tp, pre.layout, gpu)} + {dec.count} decode x "
             f"{_replica_text(dec.tp, dec.layout, gpu)}, {isl:,}/{osl:,} tokens ({engine})")
    _sweep(ps, levels, "concurrency", False, title)


def _note_scaleout(gpu: str, tp: int, layout: dict | None) -> None:
    """:func:`apmw.cli.common.note_scaleout` for a replica (or a worker) laid out by the flags."""
    from apmw.perf.replica import resolve_gpu

    lay = layout or {}
    note_scaleout(resolve_gpu(gpu), tp, tp * lay.get("dp_attention", 1) if lay.get("ep", 1) > 1 else 1)


def _replica_text(tp: int, layout: dict | None, gpu: str) -> str:
    """'8 x H200', or with a layout '16 x H200 (tp 1, dp_attention 16, ep 16)'."""
    if not layout:
        return f"{tp} x {gpu}"
    gpus = tp * layout.get("pp", 1) * layout.get("dp_attention", 1)
    return f"{gpus} x {gpu} (tp {tp}, " + ", ".join(f"{k} {v}" for k, v in layout.items()) + ")"


def _lowered_to(engine: str, token_budget: int | None, layout: dict | None) -> int | None:
    """The batch limit ``--token-budget`` sets where the engine lowers its default batch limit to its token budget
    (vLLM: every running sequence takes a token of an iteration's budget), over the replica's schedulers."""
    from apmw.perf.serving_policy import BATCH_WITHIN_BUDGET_ENGINES, canonical_engine, schedulers_per_limit

    if token_budget is None or canonical_engine(engine) not in BATCH_WITHIN_BUDGET_ENGINES:
        return None
    return token_budget * schedulers_per_limit(canonical_engine(engine), (layout or {}).get("dp_attention", 1))


def _count(x: float) -> str:
    """A count, a level or a mean as the tables print it: "19,744", "0.5", "12.3"."""
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:,.4g}"


def _cap(p, engine: str, given_max_batch: bool, budget_limit: int | None = None) -> str:
    """Why the rest queue: the batch limit (the one given, the engine's default, or the token budget the engine
    lowers its default to), or KV memory as the engine counts it."""
    if p.running_limited_by != "kv_memory":
        if given_max_batch:
            return "--max-batch"
        if p.running_requests == budget_limit:
            return (f"--token-budget: {engine} runs no more requests than its tokens per iteration, "
                    f"{p.running_requests:,} here (raise --token-budget to run more)")
        return f"the engine's batch limit, {p.running_requests:,} here (--max-batch sets it)"
    from apmw.perf.serving_policy import FULL_RESERVATION_ENGINES, canonical_engine

    held = f"{p.kv_tokens_per_running_request:,.0f} KV tokens each"
    if canonical_engine(engine) in FULL_RESERVATION_ENGINES:
        return f"KV memory ({held}, reserved to the last token)"
    return f"KV memory ({held} on average; preemptions not priced)"


# The library's parameter names and the flags that set them.
FLAGS = {"tp": "--tp", "pp": "--pp", "dp_attention": "--dp-attention", "moe_tp": "--moe-tp", "ep": "--ep", "isl": "--isl", "osl": "--osl", "concurrency": "--concurrency", "token_budget": "--token-budget", "max_batched_tokens": "--token-budget",
         "max_batch": "--max-batch", "kv_memory_fraction": "--kv-memory-fraction", "weight_dtype": "--weight-dtype",
         "kv_dtype": "--kv-dtype", "length_spread": "--length-spread", "requests_per_client": "--requests-per-client",
         "request_rate_per_s": "--request-rate", "engine_version": "--engine-version",
         "mxfp4_moe_activations": "--mxfp4-moe-activations", "scheduler_recv_interval": "--scheduler-recv-interval",
         "draft_tokens": "--draft-tokens", "acceptance_rate": "--acceptance-rate",
         "draft_cost_fraction": "--draft-cost-fraction", "draft_model": "--draft-model"}


# The spec's words for a setting where this verb has a flag for it.
SPEC_PHRASES = {"serving.speculative: draft: mtp": "--speculative mtp", "give draft: model": "give --speculative model",
                "or draft: mtp": "or --speculative mtp", "; draft: mtp drafts": "; --speculative mtp drafts",
                "use draft: model": "use --speculative model", "serving.speculative.draft_model": "--draft-model"}


def as_flags(message: str) -> str:
    """A library error in this verb's terms: each parameter named by the flag that sets it."""
    for phrase, flag in SPEC_PHRASES.items():
        message = message.replace(phrase, flag)
    return re.sub(r"(?<![\w-])(" + "|".join(FLAGS) + r")(?![\w-])", lambda m: FLAGS[m.group(1)], message)


def _print_model_source(model: str) -> None:
    """Which config.json the architecture came from (a derived checkpoint reads its base model's)."""
    from apmw.catalog.models import load_config

    out.print(f"[dim]model: {load_config(model)[1]}[/]")


def _levels(text: str, option: str, kind, example: str) -> list:
    """A comma list of levels for ``option`` (whole numbers for --concurrency, numbers for --request-rate)."""
    items = [x.strip() for x in text.split(",")]
    if not any(items):
        fail(f"{option}: give at least one level")
    if not all(items):
        # an empty entry is a typo: dropping it would answer for other levels than the user asked
        fail(f"{option}: '{text}' has an empty entry between commas; give each level once (e.g. {example})")
    try:
        levels = [kind(x) for x in items]
    except ValueError:
        noun = "whole number" if kind is int else "number"
        fail(f"{option}: '{text}' is not a {noun} or a comma list of them (e.g. {example})")
    if not all(math.isfinite(x) for x in levels):
        fail(f"{option}: '{text}' holds a level that is not a finite number (inf or nan); give finite levels "
             f"(e.g. {example})")
    twice = sorted({x for x in levels if levels.count(x) > 1})
    if twice:
        fail(f"{option}: '{text}' gives {', '.join(f'{x:g}' for x in twice)} more than once; give each level once "
             f"(e.g. {example})")
    return levels


def _within_capacity(predict, sweep: bool):
    """``predict()``, or in a sweep of rates the reason a rate past the replica's capacity has no steady state
    (the other rates are still answered; a single rate past it is an error)."""
    from apmw.capacity.benchmark import PredictError
    try:
        return predict()
    except PredictError as exc:
        if not sweep or "exceeds the replica's capacity" not in str(exc):
            raise
        return str(exc)


def _sweep(ps, levels: list, key: str, as_json: bool, title: str) -> None:
    """One row per level; --json prints a list of prediction objects, each with its level under ``key`` (a rate
    past the replica's capacity: its level and ``error``, why it has no steady state)."""
    if as_json:
        emit_json([{key: c, "error": p} if isinstance(p, str) else {key: c, **p.to_dict()} for c, p in zip(levels, ps)])
        return
    table = Table(title=title)
    for name in ("requests/s" if key == "request_rate_per_s" else "concurrency", "TTFT ms", "TPOT ms",
                 "out tok/s/GPU", "running", "prompts", "tok/J"):
        table.add_column(name, justify="right")
    for c, p in zip(levels, ps):
        if isinstance(p, str):
            table.add_row(_count(c), "past capacity", "-", "-", "-", "-", "-")
            continue
        table.add_row(_count(c), f"{p.ttft_s * 1e3:,.1f}", f"{p.tpot_s * 1e3:.2f}", f"{p.output_tokens_per_s_per_gpu:,.0f}",
                      _count(p.running_requests), p.prompts_arrive, f"{p.output_tokens_per_j:.2f}")
    print_table(table)
    answered = [p for p in ps if not isinstance(p, str)]
    for p in ps:
        if isinstance(p, str):
            out.print(f"[dim]past capacity: {as_flags(p)}[/]")
            break
    out.print(f"[dim]{answered[0].source_detail}[/]")
