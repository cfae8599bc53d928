"""The spec's ``serving`` section: the engine, its limits and policies, the parallel layout,
disaggregation and speculative decoding."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from apmw.spec.section import FieldError, Section, settle
from apmw.spec.spellings import engine_key

# Running sequences per iteration apmw models at most: engines cap theirs in the thousands
# (TensorRT-LLM's default max_batch_size is 2048), and the closed loop sizes arrays by it.
MAX_BATCH_LIMIT = 65536
# Tokens one iteration may carry: 2^20, sixteen times the largest chunked-prefill budget engines' recipes set
# (65,536); larger only overflows the arithmetic.
MAX_TOKEN_BUDGET = 1 << 20
# Bounds of a link the KV crosses (host offload, the prefill-to-decode hand-off): 1 MB/s, below any disk or
# network a KV cache is moved over, and 100 TB/s, past any GPU's own memory; outside them a context's move
# takes forever or nothing, and the arithmetic stops meaning anything.
MIN_LINK_BYTES_PER_S = 1e6
MAX_LINK_BYTES_PER_S = 1e14
# The host link a tool wait's offloaded KV crosses by default: PCIe 5.0 x16, one direction (aiconfigurator pcie_bw).
OFFLOAD_BANDWIDTH_BYTES_PER_S = 64e9


class Speculative(Section):
    """Speculative decoding: a draft proposes ``draft_tokens``, the target verifies them in one iteration.

    Each proposed token is accepted with probability ``acceptance_rate`` (independently,
    Leviathan et al. 2023), so one iteration yields ``(1 - a^(k+1)) / (1 - a)`` tokens
    per sequence while processing ``k + 1`` tokens per sequence; the draft adds
    ``draft_cost_fraction`` of an iteration's time.

    ``draft: model`` (a separate draft model, n-gram, EAGLE) needs ``draft_tokens`` and
    ``acceptance_rate``; naming the draft model (``draft_model``: a config.json path or a bundled name)
    puts its weights and KV in memory and prices its passes. ``draft: mtp`` drafts with the served model's own multi-token-prediction
    head (DeepSeek-V3/R1, GLM-5, ...): ``draft_tokens`` defaults to its MTP modules,
    ``acceptance_rate`` to a cited figure and the draft's cost follows from the architecture
    (apmw.perf.speculative).
    """

    draft: Literal["model", "mtp"] = "model"
    draft_tokens: int | None = Field(default=None, ge=1, le=16)
    acceptance_rate: float | None = Field(default=None, ge=0, lt=1)
    draft_cost_fraction: float | None = Field(default=None, ge=0, le=10,
                                              description="draft time per iteration / target time")
    draft_model: str | None = Field(default=None, min_length=1,
                                    description="the separate draft model: a config.json path or a bundled name")

    @model_validator(mode="after")
    def _draft_model_needs_its_figures(self):
        missing = [n for n in ("draft_tokens", "acceptance_rate") if getattr(self, n) is None]
        if self.draft == "model" and missing:
            raise ValueError(f"a separate draft model needs {' and '.join(missing)} (or draft: mtp to use "
                             "the model's own multi-token-prediction head)")
        if self.draft == "mtp" and self.draft_model is not None:
            raise FieldError("draft_model", "names a separate draft model; draft: mtp drafts with the model's own "
                             "head (use draft: model with it, or leave draft_model out)")
        return self


class Parallelism(Section):
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
                                   "--ep-num-redundant-experts, vLLM --enable-eplb with eplb-config's "
                                   "num_redundant_experts, TensorRT-LLM moe_config.load_balancer.num_slots]: more "
                                   "weight memory, less imbalance")
    expert_imbalance: float | None = Field(
        default=None, ge=1, le=64,
        description="the busiest EP rank's routed tokens over the mean (measured, e.g. from the engine's expert "
        "load logs); unset: what uniform random routing gives at each batch (apmw.perf.parallelism)")
    two_batch_overlap: bool = Field(default=False, description="split each batch in two so one half's MoE "
                                    "all-to-all hides behind the other's compute [SGLang --enable-two-batch-overlap; vLLM "
                                    "--enable-dbo, with dp_attention > 1 and ep > 1; TensorRT-LLM has none]")

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
                raise ValueError(f"{gpus_field} {gpus} is not a multiple of pp "
                                 f"{self.pp} x dp_attention {self.dp_attention} = {self.pp * self.dp_attention}, so "
                                 "no tp makes them multiply out; give tp, or a GPU count that is a multiple")
            tp = gpus // (self.pp * self.dp_attention) if gpus is not None else 1
        product = tp * self.pp * self.dp_attention
        if gpus is not None and product != gpus:
            raise ValueError(f"tp {tp} x pp {self.pp} x dp_attention {self.dp_attention} = "
                             f"{product} GPUs, but {gpus_field} is {gpus}; make them equal (or leave "
                             f"{gpus_field.split('.')[-1]} out: it is then {product})")
        if product > 1024:
            raise ValueError(f"tp {tp} x pp {self.pp} x dp_attention {self.dp_attention} = "
                             f"{product} GPUs; apmw models replicas of at most 1,024 GPUs")
        moe_gpus = tp * self.dp_attention
        moe_tp = self.moe_tp
        if moe_tp is None:
            if moe_gpus % self.ep:
                raise ValueError(f"ep {self.ep} does not divide the MoE layers' tp {tp} x "
                                 f"dp_attention {self.dp_attention} = {moe_gpus} GPUs; use an ep that divides "
                                 f"{moe_gpus}")
            moe_tp = moe_gpus // self.ep
        if moe_tp * self.ep != moe_gpus:
            raise ValueError(f"moe_tp {moe_tp} x ep {self.ep} = {moe_tp * self.ep}, but the MoE "
                             f"layers run on tp {tp} x dp_attention {self.dp_attention} = {moe_gpus} GPUs; make "
                             "moe_tp x ep equal to tp x dp_attention")
        return self.model_copy(update={"tp": tp, "moe_tp": moe_tp})


# Prefill or decode workers of one disaggregated replica, at most (1,024 workers of 8 GPUs is 8,192 GPUs).
MAX_DISAGG_WORKERS = 1024


class Disaggregation(Section):
    """Prefill on workers of its own, decode on the replica's GPUs; each call's KV crosses to a decode worker.

    A replica is ``decode_workers`` decode workers, each laid out as the replica (``hardware.gpus_per_replica``,
    ``serving.parallelism``), sharing ``prefill_workers`` prefill workers of ``prefill_gpus`` GPUs each (laid out
    as ``prefill_parallelism``, tensor parallel without it): Dynamo's "xPyD". Agents spread evenly over the
    decode workers; every call queues for the first free prefill worker."""

    prefill_gpus: int | None = Field(default=None, ge=1, le=1024,
                                     description="GPUs of one prefill worker; unset: prefill_parallelism's product")
    prefill_workers: int = Field(default=1, ge=1, le=MAX_DISAGG_WORKERS, description="prefill workers shared by the decode workers")
    decode_workers: int = Field(default=1, ge=1, le=MAX_DISAGG_WORKERS,
                                description="decode workers, each with the replica's GPUs and layout")
    prefill_parallelism: Parallelism | None = Field(
        default=None, description="layout of one prefill worker (tp, pp, dp_attention, moe_tp, ep); unset: tensor "
        "parallel over prefill_gpus")
    kv_transfer_bandwidth_bytes_per_s: float = Field(
        default=50e9, ge=MIN_LINK_BYTES_PER_S, le=MAX_LINK_BYTES_PER_S,
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
            raise FieldError("prefill_parallelism", str(exc)) from None
        settle(self, prefill_parallelism=par, prefill_gpus=par.gpus)
        return self

    @property
    def prefill_gpus_per_worker(self) -> int:
        return self.prefill_gpus or 1

class Serving(Section):
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
    mxfp4_moe_activations: Literal["bf16", "mxfp8"] | None = Field(
        default=None,
        description="what MXFP4 routed experts (gpt-oss's) take as activations, which picks the measured MoE kernel: "
        "bf16 (W4A16) or mxfp8 (W4A8, FlashInfer's TensorRT-LLM-generated kernel; Blackwell only); unset: the "
        "engine's default, mxfp8 for trtllm on Blackwell (its TRTLLM MoE backend), bf16 otherwise (vLLM runs mxfp8 "
        "only when started with VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1)")
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
    scheduler_recv_interval: int | None = Field(
        default=None, ge=1, le=1000,
        description="SGLang only: decode iterations between the scheduler's polls for new requests [SGLang "
        "--scheduler-recv-interval], so a call arriving at a busy engine waits half that many iterations on "
        "average before it can be scheduled (it polls again right after any prefill); unset: 1, every iteration, "
        "SGLang's default and what vLLM and TensorRT-LLM do")
    max_batch: int | None = Field(
        default=None, ge=1, le=MAX_BATCH_LIMIT,
        description="running sequences per iteration [max_num_seqs]; unset: the engine's default for the GPU "
        "(vLLM 1024 on >=70 GiB GPUs other than A100, else 256; SGLang and TensorRT-LLM 2048: "
        "apmw.perf.serving_policy)")
    max_batched_tokens: int | None = Field(
        default=None, ge=1, le=MAX_TOKEN_BUDGET, description="token budget per iteration, chunked prefill [max_num_batched_tokens]; "
        "unset: the engine's default for the GPU (vLLM 8192 on >=70 GiB GPUs other than A100, else 2048; "
        "SGLang and TensorRT-LLM 8192; llama.cpp 2048, its --batch-size)")
    kv_memory_fraction: float = Field(
        default=0.9, gt=0, le=1, description="share of HBM the engine may use [gpu_memory_utilization]"
    )
    workspace_bytes_per_gpu: float = Field(
        default=3758096384,
        ge=0, le=1e15,     # a petabyte: past any GPU's memory, so a typo is refused rather than printed
        description="activations, CUDA graphs, NCCL buffers; 3.5 GiB is aiconfigurator's 'other_mem' "
        "(systems/h200_sxm.yaml) -- read yours from vLLM's 'Available KV cache memory' log line",
    )
    tool_wait_kv_policy: Literal["retain", "evict", "offload", "ttl"] = "retain"
    ttl_s: float | None = Field(default=None, gt=0)
    offload_bandwidth_bytes_per_s: float = Field(
        default=OFFLOAD_BANDWIDTH_BYTES_PER_S, ge=MIN_LINK_BYTES_PER_S, le=MAX_LINK_BYTES_PER_S, description="host link for 'offload'; PCIe 5.0 x16 per direction (aiconfigurator pcie_bw)"
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
            raise FieldError("engine", "llamacpp needs max_batch: the server's slots (llama-server --parallel N)")
        if self.tool_wait_kv_policy != "evict":
            raise FieldError("tool_wait_kv_policy", f"'{self.tool_wait_kv_policy}' is not what engine llamacpp does; "
                             "its server keeps a finished call's prompt in the slot until another "
                             "request takes the slot, which is 'evict' with its per-slot prompt cache: set "
                             "tool_wait_kv_policy: evict")
        for name in ("speculative", "disaggregation", "parallelism"):
            if getattr(self, name) is not None:
                raise FieldError(name, "not modelled with engine llamacpp")
        if self.attention_data_parallel:
            raise FieldError("attention_data_parallel", "engine llamacpp has no attention data parallelism; leave attention_data_parallel off")
        if self.overlap_scheduling:
            raise FieldError("overlap_scheduling", "engine llamacpp forms each batch after the last one ends (no "
                             "overlap scheduling); leave overlap_scheduling out")
        if self.mxfp4_moe_activations is not None:
            raise FieldError("mxfp4_moe_activations", "picks the MXFP4 MoE kernel of vLLM, SGLang or TensorRT-LLM "
                             "(FlashInfer's); engine llamacpp runs its own: leave mxfp4_moe_activations out")
        return self

    @model_validator(mode="after")
    def _scheduler_recv_interval(self) -> "Serving":
        """SGLang's --scheduler-recv-interval (SchedulerRecvSkipper, python/sglang/srt/managers/
        scheduler_recv_skipper.py): the scheduler adds each finished iteration's weight to a counter (1 for a
        decode iteration, 1000 for any other) and takes new requests from the tokenizer only once it reaches
        the interval, so a busy one polls every N decode iterations and right after every prefill. vLLM's and
        TensorRT-LLM's schedulers take what arrived before every iteration. A disaggregated decode worker takes
        its requests from the prefill workers' KV transfers, which apmw prices apart: not modelled there."""
        n = self.scheduler_recv_interval
        if n is None or n == 1:
            return self
        if self.engine != "sglang":
            raise FieldError("scheduler_recv_interval", f"{n} is SGLang's --scheduler-recv-interval; engine "
                             f"{self.engine} takes new requests before every iteration: leave it out")
        if self.disaggregation is not None:
            raise FieldError("scheduler_recv_interval", f"{n} is not modelled with disaggregation (the decode workers "
                             "take requests from the prefill workers' transfers): leave it out")
        return self

    @model_validator(mode="after")
    def _ttl(self) -> "Serving":
        if self.tool_wait_kv_policy == "ttl" and self.ttl_s is None:
            raise FieldError("tool_wait_kv_policy", "'ttl' needs ttl_s (seconds to keep a waiting session's KV)")
        if self.tool_wait_kv_policy != "ttl" and self.ttl_s is not None:
            raise FieldError("ttl_s", f"only applies to tool_wait_kv_policy 'ttl', not '{self.tool_wait_kv_policy}'")
        return self

    @model_validator(mode="after")
    def _policy_needs_prefix_caching(self) -> "Serving":
        """Without prefix caching no call reuses an earlier call's KV (every call prefills its whole prompt), so
        keeping a waiting session's KV in host memory or for a while has nothing to act on."""
        if not self.prefix_caching and self.tool_wait_kv_policy in ("offload", "ttl"):
            raise FieldError("tool_wait_kv_policy", f"'{self.tool_wait_kv_policy}' keeps a waiting session's KV for "
                             "its next call, which only prefix caching reuses; with prefix_caching: false every call "
                             "prefills its whole prompt. Turn prefix_caching on, or set tool_wait_kv_policy: evict")
        return self

    @model_validator(mode="after")
    def _offload_bandwidth(self) -> "Serving":
        """The host link is read only where tool waits offload their KV: a figure beside another policy would be
        ignored silently (its default is not told apart from the same value written)."""
        if (self.tool_wait_kv_policy != "offload"
                and self.offload_bandwidth_bytes_per_s != OFFLOAD_BANDWIDTH_BYTES_PER_S):
            raise FieldError("offload_bandwidth_bytes_per_s", "only applies to tool_wait_kv_policy 'offload', not "
                             f"'{self.tool_wait_kv_policy}': leave it out, or set tool_wait_kv_policy: offload")
        return self
