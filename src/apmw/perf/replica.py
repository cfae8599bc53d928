"""One resolved replica: the object every model of a deployment takes.

A :class:`Replica` is a model copy on ``g`` GPUs with everything resolved: its architecture and
GPU, its step model (calibrated, scaled or roofline, see ``step.source``), its memory budget, its
serving policy (every engine default, :mod:`apmw.perf.serving_policy`) and its power model
(:mod:`apmw.perf.power`). ``apmw plan``'s closed loop, ``apmw predict``'s benchmark and the
simulator all read it; none re-derives a rule. Two constructors: :func:`replica_from_spec` for a
validated spec and :func:`benchmark_replica` for a serving benchmark's handful of arguments.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from apmw.arch import Architecture, canonical_dtype, load_architecture
from apmw.catalog.gpus import GpuSpec, get_gpu
from apmw.errors import ApmwError, ConfigError, FieldRefusal, UnknownNameError
from apmw.perf.efficiency import Efficiency, efficiency_for_gpu
from apmw.perf.memory import MemoryBudget, memory_budget
from apmw.perf.calibrated import CalibratedStepModel, calibration_gap, covering_tables
from apmw.perf.parallelism import Layout, check_layout, layout_of
from apmw.perf.power import PowerModel
from apmw.perf.tables import EngineVersionError, check_engine_version
from apmw.perf.scaled import scaled_step_model
from apmw.perf.speculative import SpeculativeDecoding, draft_memory, speculative_decoding
from apmw.perf.serving_policy import (DEFAULT_ENGINE, KV_CACHE_DTYPES, ROOFLINE_ONLY_ENGINES, ServingPolicy,
                                     ServingSettingError, pool_sized_max_batch, resolve_policy,
                                     mxfp4_moe_activations as resolve_mxfp4_activations)
from apmw.perf.roofline import RooflineStepModel
from apmw.perf.step import StepModel
from apmw.spec import GpuOverride, Power, Serving, Spec
from apmw.spec.model import MAX_GPUS_PER_REPLICA

_GPU_FIELDS = ("hbm_bytes", "hbm_bandwidth_bytes_per_s", "bf16_flops", "fp8_flops", "fp4_flops", "tdp_w",
               "idle_power_w", "busy_power_w", "scaleup_bw_bytes_per_s")


def _overridden(base: GpuSpec, overrides: dict) -> GpuSpec:
    """A catalogue GPU with fields overridden. A power cap (``tdp_w``) without a busy figure scales the
    catalogue's busy draw with it, since a GPU capped at 400 W cannot draw its 700 W part's busy
    power; the power source says so."""
    power_note, given = base.power_source, set(overrides)
    if "tdp_w" in overrides and "busy_power_w" not in overrides:
        overrides = {**overrides, "busy_power_w": base.busy_power_w * overrides["tdp_w"] / base.tdp_w}
        power_note = (f"{base.power_source}; busy power scaled to the overridden tdp_w "
                      f"({base.busy_power_w:.0f} W x {overrides['tdp_w']:.0f} / {base.tdp_w:.0f} W)")
    return _checked_power(replace(base, **overrides, power_source=power_note, overridden=tuple(sorted(given)),
                                  source=f"{base.source}; overridden: {', '.join(sorted(overrides)) or 'nothing'}"),
                          given=given)


def _checked_power(gpu: GpuSpec, given=None) -> GpuSpec:
    """Refuse power figures no GPU has: a busy draw above the TDP, an idle draw at or above the busy one. ``given``:
    the fields the user set (None: all of them); a figure they did not set is said to be the catalogue's."""
    def named(field: str) -> str:
        if given is None or field in given:
            return field
        if field == "busy_power_w" and "tdp_w" in given:
            return f"busy_power_w ({gpu.name}'s catalogue figure scaled to your tdp_w)"
        return f"{field} ({gpu.name}'s catalogue figure)"

    if gpu.busy_power_w > gpu.tdp_w:
        raise ConfigError(f"{named('busy_power_w')} {gpu.busy_power_w:.0f} W exceeds {named('tdp_w')} "
                          f"{gpu.tdp_w:.0f} W; a GPU draws at most its TDP: lower busy_power_w or raise tdp_w")
    if gpu.idle_power_w >= gpu.busy_power_w:
        raise ConfigError(f"{named('idle_power_w')} {gpu.idle_power_w:.0f} W is not below {named('busy_power_w')} "
                          f"{gpu.busy_power_w:.0f} W; give an idle draw below the busy one (idle_power_w)")
    return gpu


def resolve_gpu(gpu: str | GpuOverride) -> GpuSpec:
    """A catalogue GPU, optionally with fields overridden, or a fully custom GPU."""
    if isinstance(gpu, str):
        return get_gpu(gpu)
    if not isinstance(gpu, GpuOverride):
        raise ApmwError(f"gpu {gpu!r}: give a GPU's name (apmw model --gpus lists them) or a hardware.gpu mapping")
    overrides = {f: getattr(gpu, f) for f in _GPU_FIELDS if getattr(gpu, f) is not None}
    if gpu.name is not None:
        return _overridden(get_gpu(gpu.name), overrides)
    required = ("hbm_bytes", "hbm_bandwidth_bytes_per_s", "bf16_flops", "tdp_w", "idle_power_w", "busy_power_w",
                "scaleup_bw_bytes_per_s")
    missing = [f for f in required if f not in overrides]
    if missing:
        raise ConfigError(f"a custom GPU (no 'name') needs {', '.join(missing)}; "
                        "or give 'name' of a catalogue GPU to start from (apmw model --gpus lists them)")
    return _checked_power(GpuSpec(
        name="custom", vendor="custom",
        hbm_bytes=overrides["hbm_bytes"], hbm_bandwidth_bytes_per_s=overrides["hbm_bandwidth_bytes_per_s"],
        bf16_flops=overrides["bf16_flops"], fp8_flops=overrides.get("fp8_flops"),
        fp4_flops=overrides.get("fp4_flops"), int8_ops=None, tdp_w=overrides["tdp_w"],
        idle_power_w=overrides["idle_power_w"], busy_power_w=overrides["busy_power_w"],
        scaleup_bw_bytes_per_s=overrides["scaleup_bw_bytes_per_s"],
        source="custom GPU from the spec", power_source="custom GPU from the spec",
    ))


@dataclass(frozen=True)
class Replica:
    """A model copy on ``g`` GPUs: its step model, memory, serving policy and power model, and the
    figures of its speculative decoding (None without it: one token per sequence per iteration)."""

    step: StepModel
    memory: MemoryBudget
    policy: ServingPolicy
    power: PowerModel
    speculative: SpeculativeDecoding | None = None

    @property
    def kv_capacity_bytes(self) -> float:
        """Unique KV bytes the replica can hold: the pool divided by TP replication."""
        return self.memory.kv_capacity_bytes / self.step.kv_replication

    @property
    def chunk_tokens(self) -> int:
        """The most prompt tokens one sequence computes in an iteration: its scheduler's token budget, which
        under attention data parallelism is one rank's share of the replica's (a sequence lives on one rank;
        apmw.perf.serving_policy.schedulers_per_limit; the simulator's ranks take the same)."""
        return self.policy.token_budget // self.step.parallel.dp

    @property
    def arch(self) -> Architecture:
        return self.step.arch

    @property
    def gpu(self) -> GpuSpec:
        return self.step.gpu

    @property
    def gpus(self) -> int:
        return self.step.gpus


def engine_refusal(gpu: GpuSpec, engine: str) -> str | None:
    """Why ``engine`` cannot run on ``gpu``, or None where it can: TensorRT-LLM builds CUDA kernels only, so a
    catalogued AMD part refuses it (a custom GPU's vendor is not known: it is the user's to say)."""
    if engine == "trtllm" and gpu.vendor == "AMD":
        return (f"engine trtllm (TensorRT-LLM) runs on NVIDIA GPUs only, and {gpu.name} is {gpu.vendor}'s. "
                "Use engine sglang or vllm")
    return None


def weight_dtype_refusal(weight_dtype: str, moe_dtype: str | None, engine: str) -> str | None:
    """Why ``engine`` cannot serve weights of ``weight_dtype`` (or routed experts of ``moe_dtype``), or None where it
    can: llama.cpp reads GGUF files, whose weight types are 16- and 32-bit floats, integer blocks (Q8_0, Q4_K, ...)
    and MXFP4 (ggml's type list), with no 8-bit float."""
    if engine != "llamacpp":
        return None
    odd = [f"{name} {dtype}" for name, dtype in (("weight_dtype", weight_dtype), ("moe_dtype", moe_dtype))
           if dtype is not None and canonical_dtype(dtype, name) == "fp8"]
    if not odd:
        return None
    return (f"{' and '.join(odd)}: llama.cpp serves GGUF weights, which have no 8-bit float type (16-bit floats, "
            "integer blocks such as Q8_0 and Q4_K, and MXFP4). Use weight_dtype int8 (Q8_0), int4 or bf16, or "
            "an engine that serves FP8 (vllm, sglang, trtllm)")


def kv_dtype_refusal(gpu: GpuSpec, kv_dtype: str, engine: str) -> str | None:
    """Why ``engine`` on ``gpu`` cannot hold a KV cache of ``kv_dtype``, or None where it can: the engine stores
    only the dtypes it has a name for (:data:`apmw.perf.serving_policy.KV_CACHE_DTYPES`: no integer KV in vLLM or
    SGLang, no float8 or float4 in llama.cpp); and a 4-bit float cache needs FP4 tensor cores and the kernels
    that read it (NVFP4 KV, Blackwell), so a GPU whose catalogue row has no FP4 rate (Hopper, Ampere, MI300X)
    cannot run one; nor can an AMD part that has FP4 rates (MI355X), since the FP4 KV kernels are NVIDIA's."""
    stored = KV_CACHE_DTYPES.get(engine)
    if stored is not None and kv_dtype not in stored:
        able = sorted(e for e, row in KV_CACHE_DTYPES.items() if kv_dtype in row)
        return (f"kv_dtype {kv_dtype}: {engine} stores its KV cache in {', '.join(sorted(stored))} only. Use one of "
                f"those" + (f", or engine {' or '.join(able)}" if able else ""))
    if kv_dtype == "fp4" and gpu.vendor == "AMD":
        return (f"kv_dtype fp4: the engines' 4-bit KV caches are NVIDIA Blackwell kernels (vLLM's and TensorRT-LLM's "
                f"NVFP4 KV, SGLang's fp4_e2m1 through FlashInfer and TensorRT-LLM's XQA), and {gpu.name} is "
                f"{gpu.vendor}'s. Use kv_dtype fp8")
    if kv_dtype == "fp4" and gpu.fp4_flops is None:
        return (f"kv_dtype fp4 needs a GPU with FP4 tensor cores: a 4-bit KV cache is read by FP4 kernels (NVFP4 "
                f"KV, Blackwell), and {gpu.name} has none (no FP4 rate in apmw's GPU catalogue), so no engine stores "
                "KV in 4 bits on it. Use kv_dtype fp8")
    return None


def context_kv_refusal(arch: Architecture) -> str | None:
    """Why apmw cannot price ``arch``'s KV, or None where it can: a model none of whose layers keeps KV that grows
    with the context (every attention layer windowed, or no attention at all) holds only a fixed state per
    sequence, and apmw's KV pool, its memory check and its overflow model count tokens of context."""
    if arch.kv_bytes_per_token("bf16") > 0:
        return None
    window = (f"every attention layer keeps a sliding window of {arch.sliding_window:,} tokens"
              if arch.sliding_window_layers else "no layer keeps attention KV")
    return (f"{arch.name}: {window}, so no KV grows with the context and each sequence holds a fixed state; "
            "apmw sizes the KV pool in tokens of context and cannot price such a model exactly. A model with "
            "some full-attention layers it can price (windowed layers as per-sequence state)")


def build_step_model(arch: Architecture, gpu: GpuSpec, gpus: int, weight_dtype: str, kv_dtype: str,
                     efficiency: Efficiency | None = None, engine: str = DEFAULT_ENGINE,
                     calibrated: bool = True, layout: Layout | None = None,
                     moe_dtype: str | None = None, engine_version: str | None = None,
                     mxfp4_moe_activations: str | None = None) -> StepModel:
    """The calibrated step model where measured tables cover the replica, else the roofline.

    Read ``.source`` on the result (``calibrated``, ``scaled`` or ``roofline``) to know which. The
    measured tables compose tensor-parallel replicas with one weight dtype; other layouts (``layout``) and
    routed experts in a dtype of their own (``moe_dtype``) take the roofline.
    ``efficiency`` defaults to the GPU's own measured roofline efficiencies
    (:func:`apmw.perf.efficiency.efficiency_for_gpu`). ``engine_version`` pins the engine's own
    measured tables of that release: a replica they cannot price is refused, not estimated otherwise.
    ``mxfp4_moe_activations`` ("bf16" or "mxfp8"; None: the engine's default on the GPU) picks the measured
    kernel of MXFP4 routed experts (:func:`apmw.perf.serving_policy.mxfp4_moe_activations`).
    """
    for field, refused in (("model.config", context_kv_refusal(arch)), ("serving.engine", engine_refusal(gpu, engine)),
                           ("model.weight_dtype", weight_dtype_refusal(weight_dtype, moe_dtype, engine)),
                           ("model.kv_dtype", kv_dtype_refusal(gpu, kv_dtype, engine))):
        if refused:
            raise FieldRefusal(refused, field)
    if moe_dtype is not None and not arch.moe_layers:
        raise FieldRefusal(f"moe_dtype '{moe_dtype}' is set, but {arch.name} has no routed experts for it to apply "
                           "to; leave it out (weight_dtype sets a dense model's weights)", "model.moe_dtype")
    if engine_version is not None:
        return _pinned_step_model(arch, gpu, gpus, weight_dtype, kv_dtype, efficiency, engine, calibrated, layout,
                                  moe_dtype, engine_version, mxfp4_moe_activations)
    acts = resolve_mxfp4_activations(mxfp4_moe_activations, engine, gpu,
                                      (moe_dtype or weight_dtype) if arch.moe_layers else None)
    if efficiency is None:
        efficiency = efficiency_for_gpu(gpu.name)
    calibrated = calibrated and engine not in ROOFLINE_ONLY_ENGINES     # the tables are other engines' kernels
    if layout is not None and layout.is_tensor_parallel:
        layout = None
    if moe_dtype == weight_dtype or not arch.moe_layers:
        moe_dtype = None
    calibrated = calibrated and moe_dtype is None
    if calibrated and calibration_gap(arch, gpu, gpus, weight_dtype, kv_dtype, layout, engine, acts) is None:
        return CalibratedStepModel(arch=arch, gpu=gpu, gpus=gpus, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                                   efficiency=efficiency, layout=layout, engine=engine, mxfp4_moe_activations=acts)
    if calibrated:
        scaled = scaled_step_model(arch, gpu, gpus, weight_dtype, kv_dtype, efficiency, engine, layout, acts)
        if scaled is not None:
            return scaled
    return RooflineStepModel(arch=arch, gpu=gpu, gpus=gpus, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                             efficiency=efficiency, layout=layout, moe_dtype=moe_dtype, engine=engine,
                             mxfp4_moe_activations=acts)


def _pinned_step_model(arch: Architecture, gpu: GpuSpec, gpus: int, weight_dtype: str, kv_dtype: str,
                       efficiency: Efficiency | None, engine: str, calibrated: bool, layout: Layout | None,
                       moe_dtype: str | None, engine_version: str,
                       mxfp4_activations: str | None = None) -> StepModel:
    """The step model priced by ``engine``'s own tables of release ``engine_version``, or the reason it cannot be."""
    check_engine_version(gpu.name, engine, engine_version)
    pinned = f"engine_version '{engine_version}' ({engine})"
    if not calibrated:
        raise EngineVersionError(f"{pinned} pins measured tables, and the plain roofline was asked for; leave one out")
    step = build_step_model(arch, gpu, gpus, weight_dtype, kv_dtype, efficiency, engine, calibrated, layout, moe_dtype,
                            mxfp4_moe_activations=mxfp4_activations)
    acts = resolve_mxfp4_activations(mxfp4_activations, engine, gpu, weight_dtype if arch.moe_layers else None)
    tables, gap = covering_tables(arch, gpu, gpus, weight_dtype, kv_dtype,
                                  None if layout is None or layout.is_tensor_parallel else layout, engine, acts)
    if step.source != "calibrated" or tables is None or tables.engine != engine:
        why = gap or (f"{engine}'s tables do not cover it, and vLLM's stand in" if tables is not None
                      else f"it is priced on the {step.source} path")
        raise EngineVersionError(f"{pinned}: its tables cannot price this replica ({why}); leave the version out to "
                        "let apmw estimate it")
    return step


def _as_laid_out(step: StepModel) -> str:
    lay = step.parallel
    return "" if lay.is_tensor_parallel else f" as {lay.describe()}"


def replica_memory(step: StepModel, policy: ServingPolicy,
                   speculative: SpeculativeDecoding | None = None) -> MemoryBudget:
    """The memory budget of ``step``'s GPUs under the engine's memory share, as the engine reads it, with the
    weights and KV of the draft ``speculative`` drafts with, where the engine holds them (:mod:`apmw.perf.memory`)."""
    draft_weights, draft_kv = draft_memory(speculative, step)
    return memory_budget(step.gpu.hbm_bytes, step.gpus, policy.kv_memory_fraction, step.held_weight_bytes,
                         policy.workspace_bytes_per_gpu, fraction_of_free=policy.memory_fraction_of_free,
                         draft_weight_bytes=draft_weights, draft_kv_bytes_per_token=draft_kv,
                         kv_bytes_per_token=step.kv_bytes_per_token, draft_outside_share=policy.draft_outside_share)


class DoesNotFitError(ApmwError):
    """The weights and workspace leave no KV memory on the replica."""


def _check_fits(step: StepModel, policy: ServingPolicy, mem: MemoryBudget, gpus_field: str,
                fraction_field: str, dtype_field: str) -> None:
    """Refuse a replica whose weights and workspace leave no KV memory, or whose draft does not fit where its
    engine holds it, naming what would help in the caller's terms (spec fields or API parameters)."""
    _check_draft_fits(step, policy, mem, fraction_field)
    if mem.fits:
        return
    g, gpu = step.gpus, step.gpu
    ws = policy.workspace_bytes_per_gpu
    in_share = 0.0 if mem.draft_outside_share else mem.draft_weight_bytes
    held = mem.weight_bytes + in_share
    need = held + g * ws
    per_gpu = gpu.hbm_bytes * (1.0 if policy.memory_fraction_of_free else policy.kv_memory_fraction) - ws
    # the checkpoint's weights, each held once, and the draft's as the layout holds them (an upper bound)
    min_gpus = int(-(-(step.weight_bytes + in_share) // per_gpu)) + 1 if per_gpu > 0 else None
    whole = memory_budget(gpu.hbm_bytes, g, 1.0, held, ws)
    hint = (f", a larger {fraction_field} (it is {policy.kv_memory_fraction:g} of the memory)"
            if not policy.memory_fraction_of_free and whole.fits else "")
    at_least = f" of at least {min_gpus}" if min_gpus else ""
    heads = step.arch.num_heads
    if min_gpus and step.parallel.is_tensor_parallel and min_gpus <= heads:
        # tensor parallelism shards the heads evenly: the least count that does and holds the weights
        min_gpus = next(n for n in range(min_gpus, heads + 1) if heads % n == 0)
        at_least = f" of at least {min_gpus}, a count that divides the {heads} attention heads"
    what = f"Use more GPUs per replica ({gpus_field}{at_least}){hint}, a smaller {dtype_field}, or a larger GPU."
    if min_gpus and min_gpus > MAX_GPUS_PER_REPLICA:
        what = (f"No replica holds it: its {step.weight_bytes / 1e9:,.0f} GB of weights need at least {min_gpus:,} x "
                f"{gpu.name}, past the {MAX_GPUS_PER_REPLICA:,} GPUs a replica may have. Use a smaller {dtype_field} "
                "or a larger GPU, or check the model's config.json (its sizes give these weights).")
    if min_gpus and min_gpus <= g:
        # the checkpoint would fit on these GPUs held once: the layout's copies are what does not
        lay = step.parallel
        copies = [c for c, on in ((f"its {lay.redundant_experts} redundant experts", lay.redundant_experts),
                                  (f"the attention on each of its {lay.dp} attention-DP ranks", lay.dp > 1)) if on]
        what = (f"The checkpoint's {step.weight_bytes / 1e9:.1f} GB would fit on these GPUs; the layout holds more "
                f"({' and '.join(copies) or 'its replicated weights'}): hold fewer copies{hint}, use a smaller "
                f"{dtype_field}, or a larger GPU.")
    raise DoesNotFitError(
        f"{step.arch.name} does not fit{_as_laid_out(step)}: weights {held / 1e9:.1f} GB{_with_draft(mem)} + workspace "
        f"{ws / 2**30:.1f} GiB per GPU leave no KV memory on {g} x {gpu.label} ({mem.usable_bytes / 1e9:.1f} GB "
        f"usable, {need / 1e9:.1f} GB needed). {what}")


def _with_draft(mem: MemoryBudget) -> str:
    in_share = mem.draft_weight_bytes and not mem.draft_outside_share
    return f" (of them {mem.draft_weight_bytes / 1e9:.1f} GB the draft's)" if in_share else ""


def _check_draft_fits(step: StepModel, policy: ServingPolicy, mem: MemoryBudget, fraction_field: str) -> None:
    """Refuse a draft held outside the engine's memory share (SGLang) that the memory left there cannot hold,
    saying the largest share that leaves room for it."""
    if mem.draft_fits:
        return
    outside = mem.hbm_bytes - mem.usable_bytes
    # the draft's KV grows with the pool: a share f leaves room where f <= (hbm - w + (weights + ws) r) / (hbm (1 + r)),
    # r the draft's KV bytes per byte of the target's pool
    pool = mem.kv_capacity_bytes
    r = mem.draft_kv_bytes / pool if pool > 0 else 0.0
    largest = (mem.hbm_bytes - mem.draft_weight_bytes + (mem.weight_bytes + mem.workspace_bytes) * r) / (
        mem.hbm_bytes * (1 + r))
    raise DoesNotFitError(
        f"{step.arch.name}'s draft does not fit on {step.gpus} x {step.gpu.label}: {policy.engine} holds its "
        f"{mem.draft_weight_bytes / 1e9:.1f} GB of weights and {mem.draft_kv_bytes / 1e9:.1f} GB of KV outside its "
        f"memory share, where {outside / 1e9:.1f} GB are left ({1 - policy.kv_memory_fraction:.0%} of the memory). "
        f"Lower {fraction_field} to at most {largest:.3f}, or use more GPUs per replica.")


def replica_from_spec(spec: Spec, efficiency: Efficiency | None = None, calibrated: bool = True,
                      step: StepModel | None = None) -> Replica:
    """A replica for the spec; its step model is ``calibrated`` where measured tables cover it.

    Pass ``calibrated=False`` to force the roofline (e.g. to compare the two paths), or a ``step``
    model already built for the spec's model and GPUs (a server's measured one,
    :mod:`apmw.perf.measured`).
    """
    with _named_in("model.config", spec):
        arch = load_architecture(spec.model.config)
    with _named_in("hardware.gpu", spec):
        gpu = resolve_gpu(spec.hardware.gpu)
    g = spec.hardware.gpus_per_replica
    layout = layout_of(spec.serving, g)
    if layout.gpus != g:
        raise ApmwError(f"{spec.where('hardware.gpus_per_replica')}hardware.gpus_per_replica: {g} GPUs, but "
                        f"serving.parallelism lays out {layout.gpus} ({layout.describe()}); make them equal (or leave "
                        "gpus_per_replica out)")
    if arch.num_heads % layout.tp and spec.serving.parallelism is None:
        raise ApmwError(
            f"{spec.where('hardware.gpus_per_replica')}hardware.gpus_per_replica: {g} GPUs do not divide "
            f"{arch.name}'s {arch.num_heads} attention heads; tensor parallelism shards heads evenly, so use a count "
            f"that divides {arch.num_heads} (or serving.parallelism: {{tp: T, dp_attention: {g}/T}})")
    try:
        check_layout(layout, arch, spec.serving.engine)
    except ApmwError as exc:
        raise ApmwError(f"{spec.where('serving.parallelism')}{exc}") from None
    with _located_in(spec):
        if step is None:
            step = _step_model(arch, gpu, g, spec, efficiency, calibrated, layout)
        policy = resolve_policy(spec.serving, gpu.name, gpu.hbm_bytes, attention_dp_ranks=layout.dp,
                                own_kernels=_prices_own_kernels(step))
        power = PowerModel.of(gpu, spec.power)
    speculative = speculative_decoding(spec.serving.speculative, step.arch, step.weight_dtype, step.moe_dtype)
    mem = replica_memory(step, policy, speculative)
    _check_fits(step, policy, mem, "hardware.gpus_per_replica", "serving.kv_memory_fraction", "model.weight_dtype")
    policy = _pool_sized(policy, spec.serving, step, mem)
    return Replica(step=step, memory=mem, policy=policy, power=power, speculative=speculative)


def _pool_sized(policy: ServingPolicy, serving: Serving, step: StepModel, mem: MemoryBudget) -> ServingPolicy:
    """:func:`apmw.perf.serving_policy.pool_sized_max_batch` for a replica: its KV pool in tokens of unique KV."""
    per_token = step.kv_bytes_per_token
    tokens = mem.kv_capacity_bytes / step.kv_replication / per_token if per_token > 0 else float("inf")
    return pool_sized_max_batch(policy, serving, tokens, step.arch.max_context_tokens, step.parallel.dp)


@contextmanager
def _named_in(spec_field: str, spec: Spec | None = None) -> Iterator[None]:
    """An unknown name or unreadable config refused with the spec field that gave it (and its file and line, where
    ``spec`` was read from a file)."""
    try:
        yield
    except (UnknownNameError, ConfigError) as exc:
        raise type(exc)(f"{spec.where(spec_field) if spec is not None else ''}{spec_field}: {exc}") from None


@contextmanager
def _located_in(spec: Spec) -> Iterator[None]:
    """A setting refused while the replica is built, named with the spec's file and its field's line: a
    :class:`FieldRefusal` names its field; an engine-version or serving-setting error starts with the name of
    its ``serving`` field."""
    try:
        yield
    except FieldRefusal as exc:
        raise ApmwError(f"{spec.where(exc.field)}{exc}") from None
    except (EngineVersionError, ServingSettingError) as exc:
        field = "serving." + str(exc).split(" ", 1)[0]
        raise ApmwError(f"{spec.where(field)}serving.{exc}") from None


# Step models recently built, by everything :func:`build_step_model` reads: a design-space search re-plans one
# model on the same GPUs at other batch limits, token budgets and tool-wait policies, which the step model does
# not read, and the engine curves built on it are kept by it (apmw.capacity.engine_curve). Step models are
# frozen; a handful, since each holds its interpolated tables.
STEP_MODEL_CACHE_ENTRIES = 8
_STEP_MODELS: OrderedDict[tuple, StepModel] = OrderedDict()


def _step_model(arch: Architecture, gpu: GpuSpec, gpus: int, spec: Spec, efficiency: Efficiency | None,
                calibrated: bool, layout: Layout) -> StepModel:
    """:func:`build_step_model` for the spec, or the one it built the last time it was asked the same (shared);
    a given ``efficiency`` is always built afresh."""
    m, sv = spec.model, spec.serving
    key = (arch, gpu, gpus, m.weight_dtype, m.kv_dtype, sv.engine, calibrated, layout, m.moe_dtype,
           sv.engine_version, sv.mxfp4_moe_activations)
    shared = efficiency is None and _hashable(key)
    if shared and key in _STEP_MODELS:
        _STEP_MODELS.move_to_end(key)
        return _STEP_MODELS[key]
    step = build_step_model(arch, gpu, gpus, m.weight_dtype, m.kv_dtype, efficiency, engine=sv.engine,
                            calibrated=calibrated, layout=layout, moe_dtype=m.moe_dtype,
                            engine_version=sv.engine_version, mxfp4_moe_activations=sv.mxfp4_moe_activations)
    if shared:
        _STEP_MODELS[key] = step
        while len(_STEP_MODELS) > STEP_MODEL_CACHE_ENTRIES:
            _STEP_MODELS.popitem(last=False)
    return step


def _hashable(key: tuple) -> bool:
    try:
        hash(key)
    except TypeError:       # an architecture holding a mapping: nothing to share its step model by
        return False
    return True


def _prices_own_kernels(step: StepModel) -> bool:
    return isinstance(step, CalibratedStepModel) and step.prices_own_kernels


def replica_with_step(step: StepModel, serving: Serving | None = None, power: Power | None = None,
                      request_overhead_s: float | None = None) -> Replica:
    """A replica around a step model already built: ``serving``'s engine settings (default: vLLM's)
    resolved for its GPU, its memory budget, and the GPU's power with ``power`` over it."""
    policy = resolve_policy(Serving() if serving is None else serving, step.gpu.name, step.gpu.hbm_bytes,
                            request_overhead_s, attention_dp_ranks=step.parallel.dp,
                            own_kernels=_prices_own_kernels(step))
    speculative = speculative_decoding(serving.speculative if serving else None, step.arch, step.weight_dtype,
                                       step.moe_dtype)
    mem = replica_memory(step, policy, speculative)
    _check_fits(step, policy, mem, "tp", "kv_memory_fraction", "weight_dtype")
    policy = _pool_sized(policy, Serving() if serving is None else serving, step, mem)
    return Replica(step=step, memory=mem, policy=policy, power=PowerModel.of(step.gpu, power), speculative=speculative)


def benchmark_replica(model: str, gpu: str | GpuSpec, tp: int, weight_dtype: str, kv_dtype: str,
                      serving: Serving | None = None, calibrated: bool = True,
                      request_overhead_s: float | None = None, moe_dtype: str | None = None) -> Replica:
    """A replica for a serving benchmark: a model (config path or bundled name), a GPU, a tensor-parallel
    size, dtypes and the engine's settings as a :class:`apmw.spec.Serving` (default: vLLM's). A layout in
    ``serving.parallelism`` (resolved, :meth:`apmw.spec.Parallelism.resolved`) sets the GPUs instead, its
    ``tp`` being ``tp``.

    Raises :class:`ApmwError` naming these parameters (``tp``, ``kv_memory_fraction``, ...).
    """
    serving = Serving() if serving is None else serving
    arch = load_architecture(model)
    spec_gpu = resolve_gpu(gpu) if not isinstance(gpu, GpuSpec) else gpu
    if tp < 1:
        raise ApmwError(f"tp must be at least 1 (got {tp})")
    if arch.num_heads % tp:
        raise ApmwError(f"tp {tp} does not divide {arch.name}'s {arch.num_heads} attention heads; vLLM, "
                        f"SGLang and TensorRT-LLM shard heads evenly, so use a tp that divides {arch.num_heads}")
    gpus = serving.parallelism.gpus if serving.parallelism is not None else tp
    layout = layout_of(serving, gpus)
    check_layout(layout, arch, serving.engine, field="layout")
    weight_dtype, kv_dtype = canonical_dtype(weight_dtype, "weight"), canonical_dtype(kv_dtype, "KV")
    moe_dtype = canonical_dtype(moe_dtype, "expert") if moe_dtype else None
    step = build_step_model(arch, spec_gpu, gpus, weight_dtype, kv_dtype, engine=serving.engine,
                            calibrated=calibrated, layout=layout, moe_dtype=moe_dtype,
                            engine_version=serving.engine_version,
                            mxfp4_moe_activations=serving.mxfp4_moe_activations)
    return replica_with_step(step, serving, request_overhead_s=request_overhead_s)
