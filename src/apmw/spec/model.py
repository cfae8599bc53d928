"""The planner's input: one validated document with eight sections.

Every field carries its unit in its name (``_s``, ``_bytes``, ``_w``, ``_usd``).
Unknown keys are errors (``extra="forbid"``) so that a typo never silently
falls back to a default. Defaults that are physical constants cite their source.
"""

from __future__ import annotations

from pydantic import Field, PrivateAttr, field_validator, model_validator

from apmw.spec.distribution import Constant, Distribution, Empirical, reach
from apmw.spec.economics import MIN_BUSY_WATTS, Cost, Fleet, Power
from apmw.spec.section import FieldError, Section, line_for, settle
from apmw.spec.serving import Serving
from apmw.spec.spellings import Dtype, dtype_field


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


def _reach_of(d: object) -> str:
    """Where :func:`apmw.spec.distribution.reach` reads a distribution, for a message."""
    return "its top quantile" if isinstance(d, Empirical) else "one call in a million, its lognormal tail"


def _big(x: float) -> str:
    """A figure for a message: digits up to a trillion, then powers of ten."""
    return f"{x:,.0f}" if x < 1e12 else f"{x:.2e}"



class Workload(Section):
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
            if getattr(self, name).mean < 1:
                raise FieldError(name, f"averages {getattr(self, name).mean:g}; it must average at least 1: an agent "
                                 "task makes at least one step of at least one call, and a call generates at least "
                                 "one token")
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
            raise FieldError("tool_wait_s", f"reaches {_big(wait)} s (99th percentile or mean); at most "
                             f"{MAX_TOOL_WAIT_S:,.0f} s (a week) is modelled: check its p50/p95 or quantiles")
        first = "first_call_input_tokens" if self.first_call_input_tokens is not None else "new_input_tokens_per_call"
        if self.system_prompt_tokens == 0 and getattr(self, first).mean == 0:
            raise FieldError(first, "is 0 tokens in every call and system_prompt_tokens is 0, so every task's first "
                             "call would send an empty prompt, which an engine refuses: give the first call's input "
                             "(or the system prompt) at least one token")
        tokens = {"new_input_tokens_per_call": self.new_input_tokens_per_call,
                  "output_tokens_per_call": self.output_tokens_per_call}
        if self.first_call_input_tokens is not None:
            tokens["first_call_input_tokens"] = self.first_call_input_tokens
        if max(d.quantile(0.99) for d in tokens.values()) > MAX_TOKENS_PER_CALL or self.system_prompt_tokens > MAX_TOKENS_PER_CALL:
            raise ValueError(f"a call of more than {MAX_TOKENS_PER_CALL:,} tokens at the 99th percentile is past any "
                             "model's context window")
        for name, d in tokens.items():      # and no call drawn in a run (a table's top point, a lognormal's far tail)
            if reach(d) > MAX_TOKENS_PER_CALL:
                raise FieldError(name, f"reaches {_big(reach(d))} tokens in a call ({_reach_of(d)}); a call of more "
                                 f"than {MAX_TOKENS_PER_CALL:,} tokens is past any model's context window: lower its "
                                 "top quantile, or narrow its tail")
        if self.summarize_at_tokens is not None:
            room = self.summarize_at_tokens - self.system_prompt_tokens
            if room < 2 * self.summary_tokens:
                raise FieldError(
                    "summarize_at_tokens", f"{self.summarize_at_tokens} leaves {room} tokens after the system prompt; "
                    f"it must leave at least twice summary_tokens ({2 * self.summary_tokens})")
            # the context grows by each call's new input and output, and each summary leaves room - summary_tokens
            growth = calls * (self.new_input_tokens_per_call.mean + self.output_tokens_per_call.mean)
            summaries = growth / (room - self.summary_tokens)
            if calls + summaries > MAX_MEAN_CALLS_PER_TASK:
                raise FieldError(
                    "summarize_at_tokens", f"{self.summarize_at_tokens} would write about {_big(summaries)} summaries a "
                    f"task (its context grows by about {_big(growth)} tokens, and each summary leaves "
                    f"{room - self.summary_tokens:,} tokens of room); apmw samples tasks of at most "
                    f"{MAX_MEAN_CALLS_PER_TASK:,} calls on average: raise summarize_at_tokens")
        return self


class Model(Section):
    """The served model: a HF ``config.json`` path or a bundled name, and its dtypes."""

    config: str = Field(description="path to a HuggingFace config.json or checkpoint directory (a relative path is "
                        "read beside the spec file), a bundled name (apmw model --list), or a derived checkpoint's "
                        "hub id (meta-llama/Llama-3.1-8B-Instruct)")
    weight_dtype: Dtype = "bf16"
    kv_dtype: Dtype = "bf16"
    moe_dtype: Dtype | None = Field(default=None, description="the routed experts' dtype where it differs from "
                                    "weight_dtype (NVFP4 experts beside FP8 layers; DeepSeek-V4's FP4 experts)")

    _spellings = field_validator("weight_dtype", "kv_dtype", "moe_dtype", mode="before")(dtype_field)

    @field_validator("config")
    @classmethod
    def _named(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("is empty: name a bundled model (apmw model --list), a config.json or a checkpoint "
                             "directory")
        return v


# What a described GPU may be, each bound far past any real part on both sides (a CPU core, which the tests
# describe as a GPU, has about 50 MB, 20 GB/s and 80 GFLOP/s; a GB300 288 GB, 8 TB/s and 5 PFLOP/s dense FP4):
# a value outside is a typo, and would print infinities or divide by almost nothing.
GPU_BYTES = {"ge": 1e6, "le": 1e15}           # a megabyte to a petabyte of memory
GPU_RATE = {"ge": 1e6, "le": 1e18}            # per second: bytes over a link or memory, or FLOPs
GPU_WATTS = {"le": 1e5}


class GpuOverride(Section):
    """A catalogue GPU with fields overridden, or (without ``name``) a custom GPU."""

    name: str | None = None
    hbm_bytes: float | None = Field(default=None, **GPU_BYTES)
    hbm_bandwidth_bytes_per_s: float | None = Field(default=None, **GPU_RATE)
    bf16_flops: float | None = Field(default=None, **GPU_RATE)
    fp8_flops: float | None = Field(default=None, **GPU_RATE)
    fp4_flops: float | None = Field(default=None, **GPU_RATE)
    tdp_w: float | None = Field(default=None, gt=0, **GPU_WATTS)
    idle_power_w: float | None = Field(default=None, ge=0, **GPU_WATTS)
    busy_power_w: float | None = Field(default=None, ge=MIN_BUSY_WATTS, **GPU_WATTS)
    scaleup_bw_bytes_per_s: float | None = Field(default=None, **GPU_RATE)


# GPUs of one replica at most: a whole NVL72 rack's 72 and wide-EP deployments of several racks fit well inside.
MAX_GPUS_PER_REPLICA = 1024


class Hardware(Section):
    gpu: str | GpuOverride
    gpus_per_replica: int = Field(default=1, ge=1, le=MAX_GPUS_PER_REPLICA, description="GPUs of one replica: tp x pp x dp_attention "
                                  "(serving.parallelism); without a layout, its tensor-parallel size")


class Slo(Section):
    """The service level: a task-latency p95 and, optionally, per-call levels as public agent
    benchmarks state them (a time to first token, an output speed per agent)."""

    task_latency_p95_s: float = Field(gt=0, description="95th percentile of task wall-clock time")
    ttft_p95_s: float | None = Field(default=None, gt=0, description="95th percentile of a call's time to first token")
    tpot_p95_s: float | None = Field(default=None, gt=0, description="95th percentile of the time per output token")
    output_speed_tokens_per_s: float | None = Field(
        default=None, gt=0, description="per-agent output speed during decode, met when the p95 time per output "
        "token is at most 1 / this (tiers of 20 and 60 tokens/s are 50 and 17 ms)")


class SpecSource:
    """Where a spec was read from: the file and its keys' lines (an empty path: built from a dict). Not part of
    what the spec says, so any two compare equal (a spec read from a file equals the same spec built from a
    dict)."""

    __slots__ = ("path", "lines")

    def __init__(self, path: str, lines: dict[tuple, int]):
        self.path, self.lines = path, lines

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SpecSource)

    def __hash__(self) -> int:
        return 0


class Spec(Section):
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
    # the file the spec was read from, for errors found past loading (apmw.spec.load.load_spec sets it)
    _source: SpecSource = PrivateAttr(default_factory=lambda: SpecSource("", {}))

    def where(self, field: str) -> str:
        """``FILE: line N: `` for a dotted spec field (the deepest of its keys the file has), where the spec was
        read from a file; else empty."""
        if not self._source.path:
            return ""
        line = line_for(tuple(field.split(".")), self._source.lines)
        return f"{self._source.path}: line {line}: " if line else f"{self._source.path}: "

    @model_validator(mode="after")
    def _layout_multiplies_out(self) -> "Spec":
        """serving.parallelism's sizes resolved against the GPU count (:meth:`Parallelism.resolved`); an
        unset gpus_per_replica is the layout's product."""
        par = self.serving.parallelism
        if par is None:
            return self
        if self.serving.attention_data_parallel:
            raise FieldError(("serving", "attention_data_parallel"), "serving.attention_data_parallel and serving.parallelism both given; say it once: "
                             "parallelism: {dp_attention: N, ...} (attention_data_parallel: true is short for "
                             "tp 1, dp_attention = gpus_per_replica)")
        given = "gpus_per_replica" in self.hardware.model_fields_set
        try:
            resolved = par.resolved(self.hardware.gpus_per_replica if given else None, "hardware.gpus_per_replica")
        except ValueError as exc:
            raise FieldError(("serving", "parallelism"), str(exc)) from None
        settle(self.serving, parallelism=resolved)
        settle(self.hardware, gpus_per_replica=resolved.gpus)
        return self
