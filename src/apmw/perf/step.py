"""The step-model protocol: what every estimator of one engine iteration offers its callers.

An iteration runs every running sequence one step: ``decode_seqs`` sequences produce one token
each and ``prefill_tokens`` new prompt tokens are processed (chunked prefill, vLLM V1). Four
estimators price it, siblings behind :class:`StepModel`, each naming itself in ``source``:

* ``roofline`` (:class:`apmw.perf.roofline.RooflineStepModel`): spec sheets and fitted efficiencies;
* ``calibrated`` (:class:`apmw.perf.calibrated.CalibratedStepModel`): measured kernel tables;
* ``scaled`` (:class:`apmw.perf.scaled.ScaledStepModel`): a measured relative's calibrated
  iteration, scaled by the two GPUs' roofline ratio;
* ``measured`` (:class:`apmw.perf.measured.MeasuredStepModel`): one server's own measured step
  times (``apmw bench --calibrate``), as a line in the iteration's load.

All four share :class:`RooflineFigures`, the replica's hardware figures: weight and KV bytes,
KV replication under tensor parallelism, the weights an iteration touches, the TP all-reduce,
and the memory- and compute-bound roofline terms,

    memory_s = weights / (BW * eta_w) + kv / (BW * eta_kv)        compute_s = flops / (peak * eta_f)

per GPU of a tensor-parallel replica of ``g`` GPUs, where bytes are the weights the iteration
touches (MoE: the experts its tokens route to) plus the KV cache attention reads, and flops are
the matmul FLOPs (2 x active params per token) plus attention FLOPs. The compute-bound share of
those terms drives power (:mod:`apmw.perf.power`) whichever estimator prices the time.
Everything is vectorised over numpy arrays so that the capacity solver can evaluate every batch
size at once. See MODEL.md section 3.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple
from typing import Protocol

import numpy as np

from apmw.arch import Architecture
from apmw.catalog.gpus import GpuSpec
from apmw.perf.efficiency import DEFAULT_EFFICIENCY, HOPPER_BF16_FLOPS, Efficiency

# Activations cross the TP all-reduce in 16-bit (vLLM keeps activations in the model dtype).
ACTIVATION_BYTES = 2


@dataclass(frozen=True)
class IterationLoad:
    """What one iteration processes; fields may be numpy arrays of equal shape."""

    decode_seqs: np.ndarray | float
    prefill_tokens: np.ndarray | float
    kv_read_bytes: np.ndarray | float
    attention_flops: np.ndarray | float


class StepModel(Protocol):
    """What the models of a replica ask of its step-time estimator."""

    @property
    def arch(self) -> Architecture: ...

    @property
    def gpu(self) -> GpuSpec: ...

    @property
    def gpus(self) -> int: ...

    @property
    def weight_dtype(self) -> str: ...

    @property
    def kv_dtype(self) -> str: ...

    @property
    def efficiency(self) -> Efficiency: ...

    @property
    def source(self) -> str:
        """Which estimator priced the step times: ``roofline``, ``calibrated``, ``scaled`` or ``measured``."""
        ...

    @property
    def source_detail(self) -> str:
        """Where its figures come from, for the user to inspect."""
        ...

    @property
    def weight_bytes(self) -> float: ...

    @property
    def kv_bytes_per_token(self) -> float: ...

    @property
    def kv_replication(self) -> float: ...

    def iteration_time_s(self, load: IterationLoad) -> np.ndarray:
        """Seconds for one engine iteration carrying ``load``."""
        ...

    def compute_share(self, load: IterationLoad) -> np.ndarray:
        """Fraction of the iteration the roofline calls compute-bound (0..1); drives power."""
        ...

    def roofline_terms(self, load: IterationLoad) -> tuple[np.ndarray, np.ndarray]:
        """(memory-bound seconds, compute-bound seconds) of an iteration, before overheads."""
        ...


class _Rates(NamedTuple):
    """The per-replica constants of the roofline terms (:attr:`RooflineFigures._rates`)."""

    bytes_per_param: float
    expert_params: float         # one routed expert's parameters (0: dense)
    always_params: float         # active parameters every token reads
    num_experts: float
    expert_miss: float           # chance a token does not route to a given expert
    weight_bw: float             # bytes/s weights stream at
    kv_bw: float                 # bytes/s KV streams at, per byte of KV read (replication included)
    flops_per_token: float       # matmul FLOPs per token per GPU
    expert_share: float          # share of them in routed experts
    weight_rate: float
    bf16_rate: float
    dense_rate: float            # FLOP/s of the non-expert GEMMs
    served_extra_per_flop: float  # seconds a routed-expert FLOP adds at the served MoE ceiling


@dataclass(frozen=True)
class RooflineFigures:
    """The hardware figures of one replica that every estimator shares (module docstring)."""

    arch: Architecture
    gpu: GpuSpec
    gpus: int
    weight_dtype: str
    kv_dtype: str
    efficiency: Efficiency = DEFAULT_EFFICIENCY
    # Data-parallel attention (SGLang --enable-dp-attention, vLLM data parallel + expert
    # parallel): each GPU runs attention for its own sequences, so KV is not replicated.
    attention_data_parallel: bool = False

    @property
    def weight_bytes(self) -> float:
        return self.arch.weight_bytes(self.weight_dtype)

    @property
    def kv_bytes_per_token(self) -> float:
        return self.arch.kv_bytes_per_token(self.kv_dtype)

    @property
    def kv_replication(self) -> float:
        """How many GPUs of the replica hold a copy of each KV byte under tensor parallelism.

        TP shards attention by KV head. MLA has a single latent KV "head", so every
        rank keeps the whole latent cache (vLLM without data-parallel attention); GQA
        with fewer KV heads than ranks replicates each head ``g / kv_heads`` times.
        Data-parallel attention keeps one copy: each rank holds its own sequences.
        """
        if self.attention_data_parallel:
            return 1.0
        if self.arch.attention == "mla":
            return float(self.gpus)
        return max(1.0, self.gpus / max(self.arch.num_kv_heads, 1))

    def touched_weight_bytes(self, tokens: np.ndarray | float) -> np.ndarray:
        """Weight bytes one iteration of ``tokens`` tokens reads from HBM.

        Dense models read every weight once per iteration, however many tokens
        share it (why batching is a lever). In an MoE layer each token routes to
        ``k`` of ``E`` experts; with uniform routing the expected number of
        distinct experts touched by ``T`` tokens is ``E * (1 - (1 - k/E)^T)``.
        """
        tokens = np.asarray(tokens, dtype=float)
        c = self._rates
        if not c.expert_params:
            return np.full_like(tokens, self.weight_bytes)
        frac = 1.0 - c.expert_miss ** np.maximum(tokens, 1.0)
        return (c.always_params + c.num_experts * frac * c.expert_params) * c.bytes_per_param

    def comm_time_s(self, tokens: np.ndarray | float) -> np.ndarray:
        """Two ring all-reduces of the hidden state per layer under tensor parallelism."""
        tokens = np.asarray(tokens, dtype=float)
        g = self.gpus
        if g == 1:
            return np.zeros_like(tokens)
        message = tokens * self.arch.hidden_size * ACTIVATION_BYTES
        ring = 2 * (g - 1) / g * message / self.gpu.scaleup_bw_bytes_per_s
        per_allreduce = self.efficiency.comm_latency_s + ring
        return 2 * self.arch.num_layers * per_allreduce

    @property
    def _routed_expert_params(self) -> float:
        """Parameters of one routed expert (0 for a dense model, or one that routes to every expert)."""
        a = self.arch
        if a.num_experts <= 1 or a.experts_per_token >= a.num_experts:
            return 0.0
        return (a.params - a.active_params) / (a.num_experts - a.experts_per_token)

    @cached_property
    def _rates(self) -> "_Rates":
        """The constants of :meth:`_terms`, worked out once per replica (an iteration is priced
        hundreds of thousands of times in a simulation)."""
        a, eff, gpu = self.arch, self.efficiency, self.gpu
        expert_params = self._routed_expert_params
        weight_rate = gpu.flops_for(self.weight_dtype) * eff.flops_for(self.weight_dtype)
        bf16_rate = gpu.flops_for("bf16") * eff.flops_for("bf16")
        ceiling = eff.served_moe_flops_per_s
        served_extra_per_flop = 0.0
        if ceiling and expert_params:
            served_rate = ceiling * gpu.bf16_flops / HOPPER_BF16_FLOPS
            served_extra_per_flop = max(1.0 / served_rate - 1.0 / weight_rate, 0.0)
        bw = gpu.hbm_bandwidth_bytes_per_s
        return _Rates(
            bytes_per_param=self.weight_bytes / a.params, expert_params=expert_params,
            always_params=a.active_params - a.experts_per_token * expert_params,
            num_experts=float(a.num_experts),
            expert_miss=1.0 - a.experts_per_token / a.num_experts if expert_params else 1.0,
            weight_bw=bw * eff.bandwidth_for(self.weight_dtype),
            kv_bw=bw * eff.kv_bandwidth_for(self.kv_dtype) / self.kv_replication,
            flops_per_token=a.flops_per_token() / self.gpus,
            expert_share=a.experts_per_token * expert_params / (a.active_params - a.embedding_params),
            weight_rate=weight_rate, bf16_rate=bf16_rate,
            dense_rate=bf16_rate if a.num_experts > 1 and self._four_bit else weight_rate,
            served_extra_per_flop=served_extra_per_flop)

    def roofline_terms(self, load: IterationLoad) -> tuple[np.ndarray, np.ndarray]:
        """(memory-bound seconds, compute-bound seconds) of an iteration, before overheads.

        Each FLOP runs at the rate of the kernel that computes it: the weight format's peak for
        the GEMMs, the bf16 peak for attention (FlashAttention computes in 16 bits whatever the
        KV format) and for the non-expert GEMMs of a 4-bit MoE checkpoint, which quantises only
        its experts (gpt-oss keeps attention, router and LM head in bf16:
        apmw.perf.calibrated._DENSE_DTYPE_OF_4BIT_MOE).
        """
        memory_s, compute_s, _ = self._terms(load)
        return memory_s, compute_s

    def _terms(self, load: IterationLoad) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`roofline_terms`, and the seconds the routed experts would add at the served MoE
        ceiling (``Efficiency.served_moe_flops_per_s``, scaled from Hopper by the bf16 peak)."""
        c = self._rates
        tokens = np.asarray(load.decode_seqs, dtype=float) + np.asarray(load.prefill_tokens, dtype=float)
        kv_bytes = np.asarray(load.kv_read_bytes, dtype=float)
        memory_s = (self.touched_weight_bytes(tokens) / c.weight_bw + kv_bytes / c.kv_bw) / self.gpus
        flops = c.flops_per_token * tokens
        expert_flops = flops * c.expert_share
        attention_flops = np.asarray(load.attention_flops, dtype=float) / self.gpus
        compute_s = (expert_flops / c.weight_rate + (flops - expert_flops) / c.dense_rate
                     + attention_flops / c.bf16_rate)
        return memory_s, compute_s, expert_flops * c.served_extra_per_flop

    @property
    def _four_bit(self) -> bool:
        return self.weight_dtype.lower() in ("fp4", "int4")

    def served_compute_s(self, load: IterationLoad) -> np.ndarray:
        """The compute-bound seconds as served: routed-expert GEMMs run no faster than the served
        MoE ceiling (``Efficiency.served_moe_flops_per_s``, scaled from Hopper by the bf16 peak)."""
        _, compute_s, served_extra = self._terms(load)
        return compute_s + served_extra

    def compute_share(self, load: IterationLoad) -> np.ndarray:
        """Fraction of the iteration the roofline calls compute-bound (0..1); drives power.

        Compute as served (:meth:`served_compute_s`): a MoE prefill held to the served ceiling keeps
        the GPU busy computing for as long as it lasts."""
        memory_s, compute_s, served_extra = self._terms(load)
        return np.minimum((compute_s + served_extra) / np.maximum(memory_s, 1e-30), 1.0)
