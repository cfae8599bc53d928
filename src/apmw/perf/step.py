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
from apmw.arch.dtypes import UNQUANTISED_BYTES
from apmw.catalog.gpus import GpuSpec
from apmw.perf.comm_time import CommTime
from apmw.perf.efficiency import DEFAULT_EFFICIENCY, Efficiency
from apmw.perf.parallelism import Layout, busiest_rank_share, expert_imbalance
from apmw.perf.served_moe import ServedMoeCeiling, served_moe_ceiling
from apmw.perf.serving_policy import DEFAULT_ENGINE

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
    def moe_dtype(self) -> str | None:
        """The routed experts' dtype where it differs from ``weight_dtype`` (None: the same)."""
        ...

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

    @property
    def held_weight_bytes(self) -> float:
        """Weight bytes the replica's GPUs hold together, each copy counted (the memory budget's)."""
        ...

    @property
    def held_mtp_module_bytes(self) -> float:
        """Weight bytes the replica's GPUs hold of one multi-token-prediction module (a draft's weights)."""
        ...

    @property
    def parallel(self) -> Layout: ...

    def iteration_time_s(self, load: IterationLoad) -> np.ndarray:
        """Seconds for one engine iteration carrying ``load``."""
        ...

    def compute_share(self, load: IterationLoad) -> np.ndarray:
        """Fraction of the iteration the roofline calls compute-bound (0..1); drives power."""
        ...

    def time_and_compute_share(self, load: IterationLoad) -> tuple[np.ndarray, np.ndarray]:
        """(:meth:`iteration_time_s`, :meth:`compute_share`) of one ``load``, each priced once."""
        ...

    def roofline_terms(self, load: IterationLoad) -> tuple[np.ndarray, np.ndarray]:
        """(memory-bound seconds, compute-bound seconds) of an iteration, before overheads."""
        ...


class _Rates(NamedTuple):
    """The per-replica constants of the roofline terms (:attr:`RooflineFigures._rates`)."""

    held_rest_bytes: float       # bytes held of everything but attention and the routed experts
    read_rest_bytes: float       # of them, those a step reads: the dense FFN, lm_head, norms, routers (and
                                 # the experts of a model that routes to every one of them)
    expert_bytes_per_param: float
    expert_params: float         # one routed expert's parameters (0: dense)
    attention_params: float      # the attention projections (sharded over tp, copied per DP rank)
    attention_bytes: float       # their bytes, each part in the dtype the checkpoint keeps it in
    attention_bw: float          # bytes/s the attention projections stream at
    rest_bw: float               # bytes/s the rest a step reads streams at
    num_experts: float
    expert_miss: float           # chance a token does not route to a given expert
    log_expert_miss: float       # its natural logarithm
    weight_bw: float             # bytes/s the routed experts stream at (the weight dtype's efficiency)
    kv_bw: float                 # bytes/s KV streams at, per byte of KV read (replication included)
    flops_per_token: float       # matmul FLOPs per token per GPU
    expert_share: float          # share of them in routed experts
    expert_rate: float           # FLOP/s of the routed experts' GEMMs
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
    # How the GPUs split the model (apmw.perf.parallelism); None: tensor parallel over all of them.
    layout: Layout | None = None
    # The routed experts' dtype where it differs from weight_dtype (FP4 experts beside FP8 layers).
    moe_dtype: str | None = None
    # The serving engine: whose measured MoE kernel the served MoE ceiling is read from.
    engine: str = DEFAULT_ENGINE
    # What MXFP4 routed experts' GEMMs take as activations: "bf16" (W4A16) or "mxfp8" (W4A8), resolved by
    # apmw.perf.serving_policy.mxfp4_moe_activations; it picks the measured MoE kernel.
    mxfp4_moe_activations: str = "bf16"

    @property
    def expert_dtype(self) -> str:
        return self.moe_dtype or self.weight_dtype

    @cached_property
    def parallel(self) -> Layout:
        """The layout (tensor parallel over every GPU where none is given), built once: every term reads it."""
        return self.layout if self.layout is not None else Layout.tensor(self.gpus)

    @property
    def weight_bytes(self) -> float:
        return self.arch.weight_bytes(self.weight_dtype, self.moe_dtype)

    @property
    def kv_bytes_per_token(self) -> float:
        return self.arch.kv_bytes_per_token(self.kv_dtype)

    @property
    def kv_replication(self) -> float:
        """How many GPUs of the replica hold a copy of each KV byte (:meth:`Layout.kv_replication`).

        TP shards attention by KV head. MLA has a single latent KV "head", so every GPU of a
        tensor-parallel group keeps its rank's whole latent cache; GQA with fewer KV heads than
        ``tp`` replicates each head ``tp / kv_heads`` times. Attention data-parallel ranks each
        hold their own sequences, so they add no copies.
        """
        return self.parallel.kv_replication(self.arch)

    @property
    def held_weight_bytes(self) -> float:
        """Weight bytes the replica's GPUs hold together, as the layout splits them
        (:meth:`apmw.perf.parallelism.Layout.held_bytes`). Plain tensor parallelism holds the checkpoint once."""
        c = self._rates
        return self.parallel.held_bytes(c.attention_bytes, c.held_rest_bytes, c.num_experts * c.expert_params,
                                        c.expert_bytes_per_param, c.num_experts)

    @property
    def held_mtp_module_bytes(self) -> float:
        """Weight bytes the replica's GPUs hold of one of the model's multi-token-prediction modules
        (:meth:`apmw.arch.Architecture.mtp_module_bytes`): its layer split over the layout as a layer of the
        model is, its projection on every GPU of the last stage."""
        a, lay = self.arch, self.parallel
        attention, rest, routed, projection = a.mtp_module_bytes(self.weight_dtype, self.moe_dtype)
        per_param = a.expert_bytes_per_param(self.weight_dtype, self.moe_dtype)
        layer = lay.held_bytes(attention, rest, routed / per_param if routed else 0.0, per_param, a.num_experts)
        return layer + projection * self.gpus / lay.pp

    def _weight_reads_per_gpu(self, tokens: np.ndarray | float) -> tuple[float, float, np.ndarray]:
        """(attention, the rest every token reads, routed experts): bytes each GPU reads in one cycle of
        ``tokens`` tokens (:meth:`weight_read_bytes_per_gpu`)."""
        c, lay = self._rates, self.parallel
        micro = np.asarray(tokens, dtype=float) / lay.pp
        attention, rest = c.attention_bytes / lay.tp, c.read_rest_bytes / lay.dense_tp
        if not c.expert_params:
            return attention, rest, np.zeros_like(micro)
        # expert_miss ** tokens as exp(tokens * ln expert_miss): numpy's float power is several times slower,
        # and this runs over every cell of every engine curve
        experts = c.num_experts * -np.expm1(np.maximum(micro, 1.0) * c.log_expert_miss) * c.expert_params
        return attention, rest, experts / (lay.moe_tp * lay.ep) * c.expert_bytes_per_param

    def weight_read_bytes_per_gpu(self, tokens: np.ndarray | float) -> np.ndarray:
        """Weight bytes each GPU reads in one cycle of ``tokens`` tokens (every running sequence one
        step): its attention shard, its dense shard (dense FFN, lm_head, norms, routers; the input
        embedding is looked up, not read), and of its routed experts those the tokens touch,
        once per pipeline micro-batch (``tokens / pp`` each).

        Dense weights are read once per iteration, however many tokens share them (why batching is a
        lever). In an MoE layer each token routes to ``k`` of ``E`` experts; with uniform routing the
        expected number of distinct experts ``T`` tokens touch is ``E * (1 - (1 - k/E)^T)``."""
        attention, rest, experts = self._weight_reads_per_gpu(tokens)
        return attention + rest + experts

    @cached_property
    def gemm_launches(self) -> float:
        """GEMMs one step launches on each GPU, in sequence: per layer the attention projections (fused qkv
        and output; MLA's fused down-projection, query up-projection, the two absorbed key/value products and
        output; a sparse-attention indexer's two), then the MLP (gate/up and down; a MoE layer's router, its
        fused routed-expert pair and a shared expert's pair), and the lm_head. Pipeline stages each run their
        own share of the layers. Other attention (DeepSeek-V4's compressed, linear attention) counts as GQA's
        two: a floor, since their extra projections are not counted."""
        a = self.arch
        attention = (5 if a.attention == "mla" else 2) + (2 if a.attention_topk else 0)
        moe = 3 + (2 if a.shared_expert_params else 0)
        per_step = a.num_layers * attention + (a.num_layers - a.moe_layers) * 2 + a.moe_layers * moe
        return per_step / self.parallel.pp + 1

    def weight_read_s(self, tokens: np.ndarray | float) -> np.ndarray:
        """Seconds each GPU streams :meth:`weight_read_bytes_per_gpu` for, each part at its dtype's
        bandwidth: a 4-bit MoE's 16-bit attention, a 16-bit dense FFN beside 4-bit experts."""
        c = self._rates
        attention, rest, experts = self._weight_reads_per_gpu(tokens)
        return attention / c.attention_bw + rest / c.rest_bw + experts / c.weight_bw

    @cached_property
    def comm(self) -> CommTime:
        """The replica's communication (:mod:`apmw.perf.comm_time`), worked out once."""
        return CommTime(arch=self.arch, gpu=self.gpu, gpus=self.gpus, layout=self.parallel, engine=self.engine,
                        expert_dtype=self.expert_dtype, mxfp4_moe_activations=self.mxfp4_moe_activations,
                        latency_s=self.efficiency.comm_latency_s)

    def comm_time_s(self, tokens: np.ndarray | float) -> np.ndarray:
        """Seconds of communication in one cycle of ``tokens`` tokens (:meth:`apmw.perf.comm_time.CommTime.comm_time_s`)."""
        return self.comm.comm_time_s(tokens)

    def overlapped_comm_s(self, tokens: np.ndarray | float) -> np.ndarray:
        """Seconds of communication that run beside the kernels (:meth:`apmw.perf.comm_time.CommTime.overlapped_s`)."""
        return self.comm.overlapped_s(tokens)

    @property
    def moe_exchange_floor_ep(self) -> int | None:
        """:attr:`apmw.perf.comm_time.CommTime.moe_exchange_floor_ep`."""
        return self.comm.moe_exchange_floor_ep

    @property
    def moe_exchange_source(self) -> str | None:
        """:attr:`apmw.perf.comm_time.CommTime.moe_exchange_source`."""
        return self.comm.moe_exchange_source

    @property
    def _routed_expert_params(self) -> float:
        """Parameters of one routed expert (0 for a dense model, or one that routes to every expert)."""
        a = self.arch
        if a.num_experts <= 1 or a.experts_per_token >= a.num_experts:
            return 0.0
        return (a.params - a.active_params) / (a.num_experts - a.experts_per_token)

    @cached_property
    def served_moe(self) -> ServedMoeCeiling | None:
        """How fast routed-expert GEMMs run as served on this GPU (:mod:`apmw.perf.served_moe`); None for
        a model without routed experts or an efficiency without the ceiling."""
        fitted = self.efficiency.served_moe_flops_per_s
        if not fitted or not self._routed_expert_params:
            return None
        return served_moe_ceiling(fitted, self.arch, self.gpu, self.expert_dtype, self.parallel.moe_tp, self.engine,
                                  self.mxfp4_moe_activations)

    @cached_property
    def _rates(self) -> "_Rates":
        """The constants of :meth:`_terms`, worked out once per replica (an iteration is priced
        hundreds of thousands of times in a simulation)."""
        a, eff, gpu = self.arch, self.efficiency, self.gpu
        expert_params = self._routed_expert_params
        expert_rate, bf16_rate = self._rate(self.expert_dtype), self._rate("bf16")
        served = self.served_moe
        served_extra_per_flop = 0.0
        if served is not None:
            served_rate = served.flops_per_s
            served_extra_per_flop = max(1.0 / served_rate - 1.0 / expert_rate, 0.0)
        bw = gpu.hbm_bandwidth_bytes_per_s
        weight_bw = bw * eff.bandwidth_for(self.weight_dtype)

        def dtype_bw(dtype: str) -> float:
            return bw * eff.bandwidth_for(dtype) if dtype != self.weight_dtype else weight_bw

        # each part at the dtype the checkpoint stores it in (Architecture.part_dtypes); the 16-bit lm_head,
        # norms and routers stream at the weight dtype's efficiency, as the efficiencies were fitted
        kept, output, ffn = a.part_dtypes(self.weight_dtype, self.moe_dtype)
        unquantised = a.attention_unquantised_params * UNQUANTISED_BYTES
        out = a.attention_output_params * a.stored_bytes_per_param(output, self.weight_dtype, self.moe_dtype)
        attention_bytes = a.attention_bytes(self.weight_dtype, self.moe_dtype)
        dense_ffn = a.dense_ffn_bytes(self.weight_dtype, self.moe_dtype)
        read_unquantised = a.active_read_unquantised_params * UNQUANTISED_BYTES
        expert_per_param = a.expert_bytes_per_param(self.weight_dtype, self.moe_dtype)
        routed = a.num_experts * expert_params
        held_rest = self.weight_bytes - attention_bytes - routed * expert_per_param
        # a model that routes every token to every expert reads all of them every step, as it does its dense FFN
        every_expert = 0.0 if expert_params else float(a.active_routed_expert_params)
        # the non-expert GEMMs, each part at its dtype's rate: attention and dense FFN as the checkpoint stores
        # them; lm_head, routers (and V4's 16-bit attention parts) as Architecture.unquantised_gemm_dtype says
        unquantised_rate = self._rate(a.unquantised_gemm_dtype(self.weight_dtype, self.moe_dtype))
        dense_rate = _combined_rate([
            (a.attention_params - a.attention_unquantised_params - a.attention_output_params, self._rate(kept)),
            (a.attention_output_params, self._rate(output)), (a.dense_ffn_params, self._rate(ffn)),
            (every_expert, expert_rate), (a.active_unquantized_params, unquantised_rate)])
        return _Rates(
            held_rest_bytes=held_rest, read_rest_bytes=dense_ffn + read_unquantised + every_expert * expert_per_param,
            expert_bytes_per_param=expert_per_param, expert_params=expert_params,
            attention_params=float(a.attention_params), attention_bytes=attention_bytes,
            attention_bw=_combined_rate([(attention_bytes - out - unquantised, dtype_bw(kept)), (out, dtype_bw(output)),
                                         (unquantised, weight_bw)]),
            rest_bw=_combined_rate([(dense_ffn, dtype_bw(ffn)), (read_unquantised, weight_bw),
                                    (every_expert * expert_per_param, weight_bw)]),
            num_experts=float(a.num_experts),
            expert_miss=(miss := 1.0 - a.experts_per_token / a.num_experts if expert_params else 1.0),
            log_expert_miss=float(np.log(miss)),
            weight_bw=weight_bw,
            kv_bw=bw * eff.kv_bandwidth_for(self.kv_dtype) / self.kv_replication,
            flops_per_token=a.flops_per_token() / self.gpus,
            expert_share=a.experts_per_token * expert_params / (a.active_params - a.embedding_params),
            expert_rate=expert_rate, bf16_rate=bf16_rate, dense_rate=dense_rate,
            served_extra_per_flop=served_extra_per_flop)

    def roofline_terms(self, load: IterationLoad) -> tuple[np.ndarray, np.ndarray]:
        """(memory-bound seconds, compute-bound seconds) of an iteration, before overheads.

        Each FLOP runs at the rate of the kernel that computes it: each part's GEMMs at the peak of the
        format the checkpoint stores that part in (:meth:`apmw.arch.Architecture.part_dtypes`: a 4-bit MoE's
        16-bit attention at bf16, its 4-bit shared experts and dense MLPs at FP4 where the GPU has it), lm_head
        and routers beside 4-bit experts at bf16, and the bf16 peak for attention itself (FlashAttention
        computes in 16 bits whatever the KV format).
        """
        memory_s, compute_s, _ = self._terms(load)
        return memory_s, compute_s

    def _terms(self, load: IterationLoad) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`roofline_terms`, and the seconds the routed experts would add at the served MoE
        ceiling (:attr:`served_moe`)."""
        c = self._rates
        tokens = np.asarray(load.decode_seqs, dtype=float) + np.asarray(load.prefill_tokens, dtype=float)
        # attention DP: each rank reads its own sequences' KV and computes their attention, and the busiest
        # rank holds ceil(seqs / dp) of them (a lone sequence's KV is read by one rank, not spread over all)
        per_rank = self.busiest_rank_share(np.asarray(load.decode_seqs, dtype=float))
        # pipeline stages: with fewer sequences than stages the stages' per-token work does not overlap
        idle = self._pipeline_idle_share(load)
        per_rank = per_rank * idle
        kv_bytes = np.asarray(load.kv_read_bytes, dtype=float) * per_rank
        memory_s = self.weight_read_s(tokens) + kv_bytes / c.kv_bw / self.gpus
        flops = c.flops_per_token * tokens
        expert_flops = flops * c.expert_share
        dense_flops = flops - expert_flops
        if self.parallel.ep > 1:
            # the busiest expert-parallel rank sets the pace of the routed experts
            expert_flops = expert_flops * expert_imbalance(self.parallel, tokens / self.parallel.pp
                                                           * self.arch.experts_per_token)
        attention_flops = np.asarray(load.attention_flops, dtype=float) * per_rank / self.gpus
        compute_s = ((expert_flops / c.expert_rate + dense_flops / c.dense_rate) * idle
                     + attention_flops / c.bf16_rate)
        return memory_s, compute_s, expert_flops * c.served_extra_per_flop * idle

    def _pipeline_idle_share(self, load: IterationLoad) -> np.ndarray:
        """``pp / m`` for the ``m = min(pp, sequences)`` micro-batches a cycle fills on the busiest attention-DP
        rank (a sequence is never split
        across micro-batches: vLLM's and SGLang's pipelines batch whole requests; a prompt chunk counts as one
        sequence beside the decoders): how much longer the per-token work (GEMMs, KV reads,
        attention) takes than with every stage busy, since with fewer sequences than stages the stages work in
        turn (1 without pipeline stages, or with a sequence per stage): one prompt alone crosses the stages one
        after another, as on one GPU. The weights do not care: each stage reads its own once per micro-batch
        however many run. With a sequence per stage a prompt's chunk is taken as spread over the micro-batches
        (the engines give each in-flight batch a budget of its own, so several waiting prompts fill them)."""
        pp, dp = self.parallel.pp, self.parallel.dp
        decode = np.asarray(load.decode_seqs, dtype=float)
        if pp == 1:
            return np.ones_like(decode)
        prompts = (np.asarray(load.prefill_tokens, dtype=float) > 0).astype(float)
        per_rank = np.ceil(decode / dp)           # each attention-DP rank pipelines its own sequences
        return pp / np.clip(per_rank + prompts, 1.0, pp)

    def busiest_rank_share(self, seqs: np.ndarray) -> np.ndarray:
        """:func:`apmw.perf.parallelism.busiest_rank_share` of this layout."""
        return busiest_rank_share(self.parallel, seqs)

    def _rate(self, dtype: str) -> float:
        """FLOP/s of a GEMM whose weights are stored as ``dtype`` (4-bit without FP4 tensor cores: bf16)."""
        return self.gpu.flops_for(dtype) * self.efficiency.flops_for(dtype)

    def served_compute_s(self, load: IterationLoad) -> np.ndarray:
        """The compute-bound seconds as served: routed-expert GEMMs run no faster than the served
        MoE ceiling (:attr:`served_moe`)."""
        _, compute_s, served_extra = self._terms(load)
        return compute_s + served_extra

    def compute_share(self, load: IterationLoad) -> np.ndarray:
        """Fraction of the iteration the roofline calls compute-bound (0..1); drives power.

        Compute as served (:meth:`served_compute_s`): a MoE prefill held to the served ceiling keeps
        the GPU busy computing for as long as it lasts."""
        return self._compute_share_of(self._terms(load))

    def iteration_time_s(self, load: IterationLoad) -> np.ndarray:
        """Seconds for one engine iteration carrying ``load``: each estimator's own."""
        raise NotImplementedError(type(self).__name__)

    def time_and_compute_share(self, load: IterationLoad) -> tuple[np.ndarray, np.ndarray]:
        """(:meth:`iteration_time_s`, :meth:`compute_share`) of one ``load``; the plain roofline prices its
        terms once for both (:meth:`apmw.perf.roofline.RooflineStepModel.time_and_compute_share`)."""
        return self.iteration_time_s(load), self.compute_share(load)

    @staticmethod
    def _compute_share_of(terms: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
        memory_s, compute_s, served_extra = terms
        return np.minimum((compute_s + served_extra) / np.maximum(memory_s, 1e-30), 1.0)


def _combined_rate(parts: list[tuple[float, float]]) -> float:
    """The rate of (amount, amount per second) parts run one after another, FLOPs or bytes: their amount over
    their summed seconds; the last part's rate where there is nothing to run."""
    work = sum(p for p, _ in parts if p > 0)
    return work / sum(p / rate for p, rate in parts if p > 0) if work else parts[-1][1]
