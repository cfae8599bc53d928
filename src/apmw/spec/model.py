"""The planner's input: one validated document with eight sections.

Every field carries its unit in its name (``_s``, ``_bytes``, ``_w``, ``_usd``).
Unknown keys are errors (``extra="forbid"``) so that a typo never silently
falls back to a default. Defaults that are physical constants cite their source.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from apmw.spec.distribution import Constant, Distribution

Dtype = Literal["bf16", "fp16", "fp8", "int8", "fp4", "int4"]

# Other spellings of apmw's dtypes: HF ``torch_dtype``, vLLM ``--dtype`` and
# ``--kv-cache-dtype`` (fp8_e4m3, fp8_e5m2), and the 4-bit block formats (NVFP4, MXFP4).
DTYPE_SPELLINGS = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8",
                   "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "e4m3": "fp8", "e5m2": "fp8", "nvfp4": "fp4",
                   "mxfp4": "fp4", "fp8_block": "fp8", "fp8block": "fp8", "int4_wo": "int4"}
# vLLM's `--kv-cache-dtype auto` follows the model's activation dtype, which is bf16 for most fp8
# checkpoints too: it cannot be read from a weight dtype, so apmw asks for the dtype itself.
AUTO_DTYPE_HINT = ("'auto' depends on the checkpoint: vLLM's follows the model's activation dtype, bf16 even for "
                   "most fp8 checkpoints; say which")
# Other ways engines are written ("vLLM", "TensorRT-LLM", "trtllm-serve"), once case and
# punctuation are dropped.
ENGINE_SPELLINGS = {"tensorrtllm": "trtllm", "trtllmserve": "trtllm", "llamaserver": "llamacpp",
                    "llamacppserver": "llamacpp"}


def dtype_key(dtype: object) -> object:
    """apmw's spelling of a dtype ("bfloat16" -> "bf16"); anything else is returned as given."""
    if not isinstance(dtype, str):
        return dtype
    key = dtype.strip().lower()
    return DTYPE_SPELLINGS.get(key, key)


def _dtype_field(dtype: object) -> object:
    """A spec dtype in apmw's spelling; 'auto' is refused with the reason."""
    key = dtype_key(dtype)
    if key == "auto":
        raise ValueError(AUTO_DTYPE_HINT)
    return key


def engine_key(engine: object) -> object:
    """apmw's spelling of an engine ("TensorRT-LLM" -> "trtllm"); anything else is returned as given."""
    if not isinstance(engine, str):
        return engine
    key = "".join(ch for ch in engine.lower() if ch.isalnum())
    return ENGINE_SPELLINGS.get(key, key)


# Running sequences per iteration apmw models at most: engines cap theirs in the thousands
# (TensorRT-LLM's default max_batch_size is 2048), and the closed loop sizes arrays by it.
MAX_BATCH_LIMIT = 65536


# Model calls per task apmw will sample: the longest session in the bundled agent traces made 189
# calls (mini-swe-agent x DeepSeek, ../shared/data/README.md); these bounds are ten times that on
# average and a hundred times at the 99th percentile. Past them the session sampler would need
# gigabytes for a spec no agent resembles.
MAX_MEAN_CALLS_PER_TASK = 2_000
MAX_P99_CALLS_PER_TASK = 20_000
# Tokens per call past any model's context window (the largest bundled is 1M tokens).
MAX_TOKENS_PER_CALL = 10_000_000
# A tool wait past a week (at the 99th percentile, or on average) is no closed loop on one replica:
# the session would outlive any deployment it is planned for.
MAX_TOOL_WAIT_S = 7 * 86400.0


def _big(x: float) -> str:
    """A figure for a message: digits up to a trillion, then powers of ten."""
    return f"{x:,.0f}" if x < 1e12 else f"{x:.2e}"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _settle(section: BaseModel, **resolved: object) -> None:
    """Write fields a validator resolved (a layout's unset sizes) into a frozen section while it is being
    validated; nothing else may change a section once validated."""
    for name, value in resolved.items():
        object.__setattr__(section, name, value)


class Workload(_Section):
    """What one agent task (a session) asks of the model.

    A task runs ``steps_per_task`` steps; each step makes ``calls_per_step`` model
    calls back to back, then waits ``tool_wait_s`` for tools. Call ``i``'s prompt is
    the system prompt plus every earlier call's new input and output plus its own
    new input: context grows call by call, as in a real agent loop.
    """

    name: str = "workload"
    steps_per_task: Distribution
    calls_per_step: Distribution = Field(default_factory=lambda: Constant(value=1))
    system_prompt_tokens: int = Field(ge=0, description="shared prefix, identical for every session")
    first_call_input_tokens: Distribution | None = Field(
        default=None,
        description="new tokens of the first call (task description); defaults to new_input_tokens_per_call",
    )
    new_input_tokens_per_call: Distribution
    output_tokens_per_call: Distribution
    tool_wait_s: Distribution
    summarize_at_tokens: int | None = Field(
        default=None, gt=0,
        description="history summarisation: when a session's context would pass this many tokens, one extra call "
        "writes a summary and the context restarts from system prompt + summary",
    )
    summary_tokens: int = Field(default=1000, gt=0, description="length of each summary (output of the extra call)")
    source: str = Field(default="", description="where these numbers come from")

    @model_validator(mode="after")
    def _positive(self) -> "Workload":
        for name in ("steps_per_task", "calls_per_step", "output_tokens_per_call"):
            if getattr(self, name).mean <= 0:
                raise ValueError(f"{name} must be > 0: an agent task makes at least one call with some output")
        calls = self.steps_per_task.mean * self.calls_per_step.mean
        if calls > MAX_MEAN_CALLS_PER_TASK:
            raise ValueError(f"steps_per_task x calls_per_step averages {_big(calls)} calls per task; apmw samples "
                             f"tasks of at most {MAX_MEAN_CALLS_PER_TASK:,} calls on average (the longest recorded "
                             "agent session made 189)")
        tail = self.steps_per_task.quantile(0.99) * self.calls_per_step.quantile(0.99)
        if tail > MAX_P99_CALLS_PER_TASK:
            raise ValueError(f"steps_per_task x calls_per_step reaches {_big(tail)} calls per task at the 99th "
                             f"percentile; at most {MAX_P99_CALLS_PER_TASK:,} are modelled: narrow the tails")
        wait = max(self.tool_wait_s.quantile(0.99), self.tool_wait_s.mean)
        if wait > MAX_TOOL_WAIT_S:
            raise ValueError(f"tool_wait_s reaches {_big(wait)} s (99th percentile or mean); at most "
                             f"{MAX_TOOL_WAIT_S:,.0f} s (a week) is modelled: check its p50/p95 or quantiles")
        tokens = [self.new_input_tokens_per_call, self.output_tokens_per_call] + (
            [self.first_call_input_tokens] if self.first_call_input_tokens is not None else [])
        if max(d.quantile(0.99) for d in tokens) > MAX_TOKENS_PER_CALL or self.system_prompt_tokens > MAX_TOKENS_PER_CALL:
            raise ValueError(f"a call of more than {MAX_TOKENS_PER_CALL:,} tokens at the 99th percentile is past any "
                             "model's context window")
        if self.summarize_at_tokens is not None:
            room = self.summarize_at_tokens - self.system_prompt_tokens
            if room < 2 * self.summary_tokens:
                raise ValueError(
                    f"summarize_at_tokens ({self.summarize_at_tokens}) leaves {room} tokens after the system prompt; "
                    f"it must leave at least twice summary_tokens ({2 * self.summary_tokens})")
        return self


class Model(_Section):
    """The served model: a HF ``config.json`` path or a bundled name, and its dtypes."""

    config: str = Field(description="path to a HuggingFace config.json or checkpoint directory, a bundled name "
                        "(apmw model --list), or a derived checkpoint's hub id (meta-llama/Llama-3.1-8B-Instruct)")
    weight_dtype: Dtype = "bf16"
    kv_dtype: Dtype = "bf16"
    moe_dtype: Dtype | None = Field(default=None, description="the routed experts' dtype where it differs from "
                                    "weight_dtype (NVFP4 experts beside FP8 layers; DeepSeek-V4's FP4 experts)")

    _spellings = field_validator("weight_dtype", "kv_dtype", "moe_dtype", mode="before")(_dtype_field)


class GpuOverride(_Section):
    """A catalogue GPU with fields overridden, or (without ``name``) a custom GPU."""

    name: str | None = None
    hbm_bytes: float | None = Field(default=None, gt=0)
    hbm_bandwidth_bytes_per_s: float | None = Field(default=None, gt=0)
    bf16_flops: float | None = Field(default=None, gt=0)
    fp8_flops: float | None = Field(default=None, gt=0)
    fp4_flops: float | None = Field(default=None, gt=0)
    tdp_w: float | None = Field(default=None, gt=0)
    idle_power_w: float | None = Field(default=None, ge=0)
    busy_power_w: float | None = Field(default=None, gt=0)
    scaleup_bw_bytes_per_s: float | None = Field(default=None, gt=0)


class Hardware(_Section):
    gpu: str | GpuOverride
    gpus_per_replica: int = Field(default=1, ge=1, le=1024, description="GPUs of one replica: tp x pp x dp_attention "
                                  "(serving.parallelism); without a layout, its tensor-parallel size")


class Speculative(_Section):
    """Speculative decoding: a draft proposes ``draft_tokens``, the target verifies them in one iteration.

    Each proposed token is accepted with probability ``acceptance_rate`` (independently,
    Leviathan et al. 2023), so one iteration yields ``(1 - a^(k+1)) / (1 - a)`` tokens
    per sequence while processing ``k + 1`` tokens per sequence; the draft adds
    ``draft_cost_fraction`` of an iteration's time.

    ``draft: model`` (a separate draft model, n-gram, EAGLE) needs ``draft_tokens`` and
    ``acceptance_rate``. ``draft: mtp`` drafts with the served model's own multi-token-prediction
    head (DeepSeek-V3/R1, GLM-5, ...): ``draft_tokens`` defaults to its MTP modules,
    ``acceptance_rate`` to a cited figure and the draft's cost follows from the architecture
    (apmw.perf.speculative).
    """

    draft: Literal["model", "mtp"] = "model"
    draft_tokens: int | None = Field(default=None, ge=1, le=16)
    acceptance_rate: float | None = Field(default=None, ge=0, lt=1)
    draft_cost_fraction: float | None = Field(default=None, ge=0, le=10,
                                              description="draft time per iteration / target time")

    @model_validator(mode="after")
    def _draft_model_needs_its_figures(self):
        missing = [n for n in ("draft_tokens", "acceptance_rate") if getattr(self, n) is None]
        if self.draft == "model" and missing:
            raise ValueError(f"a separate draft model needs {' and '.join(missing)} (or draft: mtp to use "
                             "the model's own multi-token-prediction head)")
        return self


class Parallelism(_Section):
    """How the replica's GPUs split the model (MODEL.md section 10): GPUs = tp x pp x dp_attention, and the
    MoE layers run on moe_tp x ep = tp x dp_attention of them. Names as vLLM, SGLang and aiconfigurator write
    them (``apmw.perf.parallelism`` says what each engine does under each)."""

    tp: int | None = Field(default=None, ge=1, le=1024,
                           description="tensor-parallel size of attention (and of everything but the routed experts) "
                           "within one attention data-parallel rank [vLLM --tensor-parallel-size]; unset: the "
                           "GPUs left over by pp and dp_attention")
    pp: int = Field(default=1, ge=1, le=128, description="pipeline-parallel stages [--pipeline-parallel-size]")
    dp_attention: int = Field(default=1, ge=1, le=1024,
                              description="attention data-parallel ranks: each runs attention for its own requests "
                              "and holds their KV [vLLM --data-parallel-size with expert parallel; SGLang --dp with "
                              "--enable-dp-attention]")
    moe_tp: int | None = Field(default=None, ge=1, le=1024,
                               description="tensor-parallel size of each routed expert; unset: tp x dp_attention / ep")
    ep: int = Field(default=1, ge=1, le=1024, description="expert-parallel size: routed experts spread over ep GPUs "
                    "[vLLM --enable-expert-parallel, SGLang --ep-size]")
    redundant_experts: int = Field(default=0, ge=0, le=4096,
                                   description="extra copies of hot experts spread over the EP ranks [SGLang "
                                   "--ep-num-redundant-experts, vLLM --num-redundant-experts]: more weight memory, "
                                   "less imbalance")
    expert_imbalance: float | None = Field(
        default=None, ge=1, le=64,
        description="the busiest EP rank's routed tokens over the mean (measured, e.g. from the engine's expert "
        "load logs); unset: what uniform random routing gives at each batch (apmw.perf.parallelism)")
    two_batch_overlap: bool = Field(default=False, description="split each batch in two so one half's MoE "
                                    "all-to-all hides behind the other's compute [SGLang --enable-two-batch-overlap]")

    @property
    def gpus(self) -> int:
        return (self.tp or 1) * self.pp * self.dp_attention

    def resolved(self, gpus: int | None, gpus_field: str = "GPUs") -> "Parallelism":
        """This layout with ``tp`` and ``moe_tp`` filled in and checked, the arithmetic shown when it fails:
        GPUs = tp x pp x dp_attention, and moe_tp x ep = tp x dp_attention. ``gpus`` is the replica's GPU
        count where one is given (``gpus_field`` names it): an unset tp is what pp and dp_attention leave of
        it; without it an unset tp is 1. An unset moe_tp is what ep leaves of tp x dp_attention."""
        tp = self.tp
        if tp is None:
            if gpus is not None and gpus % (self.pp * self.dp_attention):
                raise ValueError(f"serving.parallelism: {gpus_field} {gpus} is not a multiple of pp "
                                 f"{self.pp} x dp_attention {self.dp_attention} = {self.pp * self.dp_attention}, so "
                                 "no tp makes them multiply out; give tp, or a GPU count that is a multiple")
            tp = gpus // (self.pp * self.dp_attention) if gpus is not None else 1
        product = tp * self.pp * self.dp_attention
        if gpus is not None and product != gpus:
            raise ValueError(f"serving.parallelism: tp {tp} x pp {self.pp} x dp_attention {self.dp_attention} = "
                             f"{product} GPUs, but {gpus_field} is {gpus}; make them equal (or leave "
                             f"{gpus_field.split('.')[-1]} out: it is then {product})")
        if product > 1024:
            raise ValueError(f"serving.parallelism: tp {tp} x pp {self.pp} x dp_attention {self.dp_attention} = "
                             f"{product} GPUs; apmw models replicas of at most 1,024 GPUs")
        moe_gpus = tp * self.dp_attention
        moe_tp = self.moe_tp
        if moe_tp is None:
            if moe_gpus % self.ep:
                raise ValueError(f"serving.parallelism: ep {self.ep} does not divide the MoE layers' tp {tp} x "
                                 f"dp_attention {self.dp_attention} = {moe_gpus} GPUs; use an ep that divides "
                                 f"{moe_gpus}")
            moe_tp = moe_gpus // self.ep
        if moe_tp * self.ep != moe_gpus:
            raise ValueError(f"serving.parallelism: moe_tp {moe_tp} x ep {self.ep} = {moe_tp * self.ep}, but the MoE "
                             f"layers run on tp {tp} x dp_attention {self.dp_attention} = {moe_gpus} GPUs; make "
                             "moe_tp x ep equal to tp x dp_attention")
        return self.model_copy(update={"tp": tp, "moe_tp": moe_tp})


class Disaggregation(_Section):
    """Prefill on workers of its own, decode on the replica's GPUs; each call's KV crosses to a decode worker.

    A replica is ``decode_workers`` decode workers, each laid out as the replica (``hardware.gpus_per_replica``,
    ``serving.parallelism``), sharing ``prefill_workers`` prefill workers of ``prefill_gpus`` GPUs each (laid out
    as ``prefill_parallelism``, tensor parallel without it): Dynamo's "xPyD". Agents spread evenly over the
    decode workers; every call queues for the first free prefill worker."""

    prefill_gpus: int | None = Field(default=None, ge=1, le=1024,
                                     description="GPUs of one prefill worker; unset: prefill_parallelism's product")
    prefill_workers: int = Field(default=1, ge=1, le=1024, description="prefill workers shared by the decode workers")
    decode_workers: int = Field(default=1, ge=1, le=1024,
                                description="decode workers, each with the replica's GPUs and layout")
    prefill_parallelism: Parallelism | None = Field(
        default=None, description="layout of one prefill worker (tp, pp, dp_attention, moe_tp, ep); unset: tensor "
        "parallel over prefill_gpus")
    kv_transfer_bandwidth_bytes_per_s: float = Field(
        default=50e9, gt=0,
        description="per-GPU link for the KV hand-off; 50 GB/s is one 400 Gb/s NIC per GPU "
        "(aiconfigurator systems/h200_sxm.yaml inter_node_bw)",
    )

    @model_validator(mode="after")
    def _prefill_layout(self) -> "Disaggregation":
        """prefill_gpus and prefill_parallelism agree (:meth:`Parallelism.resolved`); one of them is given."""
        if self.prefill_parallelism is None:
            if self.prefill_gpus is None:
                raise ValueError("give prefill_gpus (GPUs of one prefill worker) or prefill_parallelism")
            return self
        try:
            par = self.prefill_parallelism.resolved(self.prefill_gpus, "prefill_gpus")
        except ValueError as exc:
            raise ValueError(str(exc).replace("serving.parallelism", "prefill_parallelism")) from None
        _settle(self, prefill_parallelism=par, prefill_gpus=par.gpus)
        return self

    @property
    def prefill_gpus_per_worker(self) -> int:
        return self.prefill_gpus or 1

class Serving(_Section):
    """The engine's knobs (vLLM names in brackets)."""

    engine: Literal["vllm", "sglang", "trtllm", "llamacpp"] = Field(
        default="vllm",
        description="the serving engine whose measured behaviour prices iterations: its fixed cost per layer "
        "of each iteration; for trtllm also fp8-KV attention at bf16 bandwidth and kv_memory_fraction read as a share "
        "of the memory free after weights [TensorRT-LLM free_gpu_memory_fraction] (docs/accuracy.md); llamacpp: "
        "llama.cpp's server, one cached prompt per slot (max_batch is its --parallel slots), iterations on the "
        "roofline (calibrate with apmw bench --calibrate)",
    )
    engine_version: str | None = Field(
        default=None, min_length=1, max_length=40,
        description="pin the engine release whose measured kernel tables price iterations (vllm 0.24.0, sglang "
        "0.5.14, trtllm 1.3.0rc20: the releases apmw bundles, catalog/data/calibration/SOURCES.md); a replica "
        "those tables cannot price is refused. Unset: the tables apmw holds for the GPU (or another estimate, "
        "named in step_time_source)")
    mixed_prefill: bool | None = Field(
        default=None,
        description="whether prompt chunks ride in the same iteration as decodes; unset: the engine's default "
        "(vllm, trtllm: yes; sglang: no, a prefill batch runs alone and first [SGLang --enable-mixed-chunk])",
    )
    overlap_scheduling: bool | None = Field(
        default=None,
        description="whether the scheduler forms the next iteration's batch while the current one runs, so a "
        "call arriving at a busy engine waits one more iteration (apmw plan, simulate and predict); unset: the "
        "engine's default, yes for current versions of all three [vLLM async scheduling, default since late 2025: "
        "false for older vLLM or --no-async-scheduling; SGLang --disable-overlap-schedule; TensorRT-LLM's legacy "
        "engine backend]",
    )
    max_batch: int | None = Field(
        default=None, ge=1, le=MAX_BATCH_LIMIT,
        description="running sequences per iteration [max_num_seqs]; unset: the engine's default for the GPU "
        "(vLLM 1024 on >=70 GiB GPUs other than A100, else 256; SGLang and TensorRT-LLM 2048: "
        "apmw.perf.serving_policy)")
    max_batched_tokens: int | None = Field(
        default=None, ge=1, description="token budget per iteration, chunked prefill [max_num_batched_tokens]; "
        "unset: the engine's default for the GPU (vLLM 8192 on >=70 GiB GPUs other than A100, else 2048; "
        "SGLang and TensorRT-LLM 8192; llama.cpp 2048, its --batch-size)")
    kv_memory_fraction: float = Field(
        default=0.9, gt=0, le=1, description="share of HBM the engine may use [gpu_memory_utilization]"
    )
    workspace_bytes_per_gpu: float = Field(
        default=3758096384,
        ge=0,
        description="activations, CUDA graphs, NCCL buffers; 3.5 GiB is aiconfigurator's 'other_mem' "
        "(systems/h200_sxm.yaml) -- read yours from vLLM's 'Available KV cache memory' log line",
    )
    tool_wait_kv_policy: Literal["retain", "evict", "offload", "ttl"] = "retain"
    ttl_s: float | None = Field(default=None, gt=0)
    offload_bandwidth_bytes_per_s: float = Field(
        default=64e9, gt=0, description="host link for 'offload'; PCIe 5.0 x16 per direction (aiconfigurator pcie_bw)"
    )
    prefix_caching: bool = True
    attention_data_parallel: bool = Field(
        default=False,
        description="data-parallel attention across the replica's GPUs (SGLang --enable-dp-attention; vLLM "
        "data parallel with expert parallel): KV is not replicated on every rank (matters for MLA models)",
    )
    parallelism: Parallelism | None = Field(
        default=None, description="the replica's layout: tp, pp, dp_attention, moe_tp, ep; unset: tensor parallel "
        "over hardware.gpus_per_replica (or, with attention_data_parallel, one attention rank per GPU)")
    speculative: Speculative | None = None
    disaggregation: Disaggregation | None = None

    @field_validator("engine", mode="before")
    @classmethod
    def _engine_spelling(cls, v: object) -> object:
        return engine_key(v)

    @model_validator(mode="before")
    @classmethod
    def _llamacpp_default_policy(cls, data: object) -> object:
        """llama.cpp's server frees a finished call's KV into its slot's prompt cache: 'evict' unless said."""
        if isinstance(data, dict) and engine_key(data.get("engine")) == "llamacpp":
            data = {"tool_wait_kv_policy": "evict", **data}
        return data

    @model_validator(mode="after")
    def _llamacpp(self) -> "Serving":
        if self.engine != "llamacpp":
            return self
        if self.max_batch is None:
            raise ValueError("engine llamacpp needs max_batch: the server's slots (llama-server --parallel N)")
        if self.tool_wait_kv_policy != "evict":
            raise ValueError(f"engine llamacpp: tool_wait_kv_policy '{self.tool_wait_kv_policy}' is not what "
                             "llama.cpp does; its server keeps a finished call's prompt in the slot until another "
                             "request takes the slot, which is 'evict' with its per-slot prompt cache: set "
                             "tool_wait_kv_policy: evict")
        for name in ("speculative", "disaggregation", "parallelism"):
            if getattr(self, name) is not None:
                raise ValueError(f"engine llamacpp with serving.{name} is not modelled")
        if self.attention_data_parallel:
            raise ValueError("engine llamacpp has no attention data parallelism; leave attention_data_parallel off")
        return self

    @model_validator(mode="after")
    def _ttl(self) -> "Serving":
        if self.tool_wait_kv_policy == "ttl" and self.ttl_s is None:
            raise ValueError("tool_wait_kv_policy 'ttl' needs ttl_s (seconds to keep a waiting session's KV)")
        if self.tool_wait_kv_policy != "ttl" and self.ttl_s is not None:
            raise ValueError(f"ttl_s only applies to tool_wait_kv_policy 'ttl', not '{self.tool_wait_kv_policy}'")
        return self


class Slo(_Section):
    """The service level: a task-latency p95 and, optionally, per-call levels as public agent
    benchmarks state them (a time to first token, an output speed per agent)."""

    task_latency_p95_s: float = Field(gt=0, description="95th percentile of task wall-clock time")
    ttft_p95_s: float | None = Field(default=None, gt=0, description="95th percentile of a call's time to first token")
    tpot_p95_s: float | None = Field(default=None, gt=0, description="95th percentile of the time per output token")
    output_speed_tokens_per_s: float | None = Field(
        default=None, gt=0, description="per-agent output speed during decode, met when the p95 time per output "
        "token is at most 1 / this (tiers of 20 and 60 tokens/s are 50 and 17 ms)")


class Power(_Section):
    pue: float = Field(default=1.3, ge=1.0, description="facility / IT power")
    host_power_w_per_gpu: float = Field(
        default=125.0,
        ge=0,
        description="modelled draw of CPUs, DRAM, NICs and fans per GPU: 1.0 kW per 8-GPU node, checked against "
        "MLPerf node power (docs/accuracy.md)",
    )
    host_nameplate_w_per_gpu: float = Field(
        default=575.0,
        ge=0,
        description="host nameplate per GPU for provisioned power: (10.2 kW DGX H100 max - 8 x 700 W GPUs) / 8, "
        "NVIDIA DGX H100 datasheet",
    )
    provisioned_kw_per_gpu: float | None = Field(
        default=None, gt=0, description="all-in facility kW budgeted per GPU (nameplate incl. host and cooling)"
    )
    gpu_idle_power_w: float | None = Field(default=None, ge=0, description="overrides the catalogue")
    gpu_busy_power_w: float | None = Field(default=None, gt=0, description="overrides the catalogue")


class ApiPrice(_Section):
    """A per-token API's list price, to set a self-served task against: USD per million tokens."""

    input: float = Field(ge=0, le=1e4, description="USD per million prompt tokens that miss the API's cache")
    cached_input: float | None = Field(default=None, ge=0, le=1e4,
                                       description="USD per million prompt tokens read from its cache (default: input)")
    output: float = Field(ge=0, le=1e4, description="USD per million output tokens")


# Hours in a year of 365.25 days: what a capex is amortised over, year by year.
HOURS_PER_YEAR = 365.25 * 24


class Capex(_Section):
    """The price of owning the GPUs, paid once and amortised straight-line over ``years``: per GPU, or per
    system (a node or rack: its price over the GPUs in it)."""

    usd_per_gpu: float | None = Field(default=None, gt=0, le=1e7, description="purchase price of one GPU, its "
                                      "share of the host and network included")
    usd_per_system: float | None = Field(default=None, gt=0, le=1e10, description="purchase price of one system "
                                         "(an HGX node, an NVL72 rack), with gpus_per_system")
    gpus_per_system: int | None = Field(default=None, ge=1, le=100_000, description="GPUs in that system")
    years: float = Field(gt=0, le=30, description="years the purchase is amortised over (straight line)")

    @model_validator(mode="after")
    def _one_price(self) -> "Capex":
        if (self.usd_per_gpu is None) == (self.usd_per_system is None):
            raise ValueError("give either usd_per_gpu or usd_per_system (with gpus_per_system), not "
                             + ("both" if self.usd_per_gpu is not None else "neither"))
        if (self.usd_per_system is None) != (self.gpus_per_system is None):
            raise ValueError("usd_per_system and gpus_per_system go together: the system's price and the GPUs in it")
        return self

    @property
    def per_gpu_usd(self) -> float:
        if self.usd_per_gpu is not None:
            return self.usd_per_gpu
        assert self.usd_per_system is not None and self.gpus_per_system is not None     # _one_price
        return self.usd_per_system / self.gpus_per_system

    @property
    def gpu_hour_usd(self) -> float:
        """One GPU's purchase spread over every hour of its amortisation."""
        return self.per_gpu_usd / (self.years * HOURS_PER_YEAR)


class Cost(_Section):
    """Prices have no defaults: they differ by site and contract, and a silent guess would be a wrong answer."""

    electricity_usd_per_kwh: float = Field(ge=0)
    gpu_hour_usd: float = Field(ge=0, description="price of one GPU-hour as billed (rental, or all-in owned); "
                                "required unless capex is given, which then sets it to the amortised purchase alone")
    capex: Capex | None = Field(default=None, description="the purchase price of the GPUs and the years it is "
                                "amortised over: the owned fleet's cost beside the hourly price (apmw fleet)")
    api_usd_per_million_tokens: ApiPrice | None = Field(
        default=None, description="the API the fleet would replace, for $ per task against it")

    @model_validator(mode="before")
    @classmethod
    def _hourly_from_capex(cls, data: object) -> object:
        """Without an hourly price, a GPU-hour costs its amortised purchase (capex's own errors are its field's)."""
        if not isinstance(data, dict) or data.get("gpu_hour_usd") is not None:
            return data
        if data.get("capex") is None:
            raise ValueError("give gpu_hour_usd (the price of one GPU-hour as billed) or capex ({usd_per_gpu, years}: "
                             "the purchase, amortised), or both")
        try:
            capex = Capex.model_validate(data["capex"])
        except ValidationError:
            return data
        return {**data, "gpu_hour_usd": capex.gpu_hour_usd}


class Fleet(_Section):
    """The fleet the replicas make up: a constant concurrency (``target_agents``), or a day of
    demand (``tasks_per_hour``, 24 values from hour 0) that ``apmw fleet`` turns into replicas,
    megawatts and dollars hour by hour."""

    target_agents: int | None = Field(
        default=None, ge=1, le=10**9, description="concurrent agents the fleet serves (at most a billion: past "
        "that the figure is a typo)")
    tasks_per_hour: list[float] | None = Field(
        default=None, min_length=24, max_length=168,
        description="tasks started in each hour, hour 0 first: a day (24 values) or a week from Monday 00:00 "
        "(168 values), each 0 to a billion; the period repeats")
    headroom: float = Field(default=0.0, ge=0, le=10, description="spare share of capacity kept above the demand "
                            "(0.1: replicas for 10 % more agents than the hour needs)")
    min_replicas: int = Field(default=1, ge=0, le=10**6, description="replicas kept up in the quietest hour")
    power_cap_mw: float | None = Field(default=None, gt=0, le=1e4, description="the hall's power: the fleet's "
                                       "provisioned (nameplate) facility power must fit in it every hour")
    scale_up_s: float = Field(default=0.0, ge=0, le=3600, description="from starting a replica to its serving "
                              "(provisioning, weight load, warm-up): replicas for the next hour start this early")
    scale_down_delay_s: float = Field(default=0.0, ge=0, le=86400, description="a replica no longer needed stays up "
                                      "this long (hysteresis)")
    routing: Literal["affinity", "least_loaded", "random"] = Field(
        default="affinity", description="how a router spreads each agent's calls over the replicas: affinity "
        "(every call of a task to the replica that holds its context: sticky sessions, KV-aware routers), "
        "least_loaded or random (a call finds its own context only where it lands on the replica that holds it; "
        "docs/fleet.md, Routing)")
    routing_replicas: int | None = Field(
        default=None, ge=1, le=10**6, description="replicas a least_loaded or random router spreads calls over, "
        "for apmw plan (apmw fleet uses the day's peak replica count); unset: 1 for apmw plan")

    @field_validator("tasks_per_hour")
    @classmethod
    def _rates_are_counts(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and len(v) not in (24, 168):
            raise ValueError(f"{len(v)} values; give 24 (a day, hour 0 first) or 168 (a week from Monday 00:00)")
        if v is not None:
            bad = [i for i, x in enumerate(v) if not 0 <= x <= 1e9]
            if bad:
                raise ValueError(f"hour {bad[0]} has {v[bad[0]]!r} tasks; each hour needs 0 to 1e9 tasks")
        return v


class Spec(_Section):
    """A whole planning problem."""

    workload: Workload
    model: Model
    hardware: Hardware
    serving: Serving = Field(default_factory=Serving)
    slo: Slo
    power: Power = Field(default_factory=Power)
    cost: Cost
    fleet: Fleet = Field(default_factory=Fleet)
    seed: int = Field(default=0, ge=0, lt=2**63, description="seed of the session sampler (p95 from sampled sessions)")

    @model_validator(mode="after")
    def _layout_multiplies_out(self) -> "Spec":
        """serving.parallelism's sizes resolved against the GPU count (:meth:`Parallelism.resolved`); an
        unset gpus_per_replica is the layout's product."""
        par = self.serving.parallelism
        if par is None:
            return self
        if self.serving.attention_data_parallel:
            raise ValueError("serving.attention_data_parallel and serving.parallelism both given; say it once: "
                             "parallelism: {dp_attention: N, ...} (attention_data_parallel: true is short for "
                             "tp 1, dp_attention = gpus_per_replica)")
        given = "gpus_per_replica" in self.hardware.model_fields_set
        resolved = par.resolved(self.hardware.gpus_per_replica if given else None, "hardware.gpus_per_replica")
        _settle(self.serving, parallelism=resolved)
        _settle(self.hardware, gpus_per_replica=resolved.gpus)
        return self
