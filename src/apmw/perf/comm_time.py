"""Seconds of communication in one iteration of a replica, by its layout: tensor-parallel all-reduces, the MoE
layers' token exchange, the dense layers' all-gathers where the engine spreads them wider, pipeline hops.

Each collective is priced over the per-GPU link its group reaches (:mod:`apmw.perf.interconnect`) plus a fixed
latency, and read off the system's measured tables where they cover it (:mod:`apmw.perf.communication`):
DeepEP's and TensorRT-LLM's MoE dispatch/combine at the measured EP sizes, and past the measured GPU counts
the widest measured exchange or all-reduce as a floor. Every step model shares one :class:`CommTime`
(:attr:`apmw.perf.step.RooflineFigures.comm`); ``source_detail`` names which tables answered
(:attr:`CommTime.moe_exchange_source`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import cast

import numpy as np

from apmw.arch import Architecture
from apmw.catalog.gpus import GpuSpec, get_gpu
from apmw.errors import UnknownNameError
from apmw.perf.communication import ENGINES, Engine, MeasuredCollectives, MoECurves, measured_collectives
from apmw.perf.interconnect import link_bandwidth_bytes_per_s, scaleup_domain_gpus
from apmw.perf.parallelism import Layout, expert_imbalance

# Activations cross the TP all-reduce in 16-bit (vLLM keeps activations in the model dtype).
ACTIVATION_BYTES = 2
# What TensorRT-LLM's MoE all-to-all dispatches, by routed-expert dtype: experts that take quantised
# activations have them quantised before the dispatch (its post-quantisation all-to-all; ASSUMPTION: on,
# as by default, TRTLLM_MOE_POST_QUANT_ALLTOALLV), so NVFP4 (W4A4) experts send NVFP4 and FP8 experts FP8;
# an MXFP4 checkpoint's experts (Architecture.mxfp4_experts) send MXFP8 (8 bits) with MXFP8 activations and
# bf16 with bf16 ones. A 4-bit MoE whose checkpoint does not say MXFP4 is taken as NVFP4, the format
# TensorRT-LLM's 4-bit DeepSeek checkpoints (ModelOpt's) are in. Other experts dispatch bf16.
TRTLLM_DISPATCH_PAYLOAD = {"fp4": "nvfp4", "nvfp4": "nvfp4", "fp8": "fp8"}
# DeepEP's low-latency dispatch buffer as SGLang sets it (num_max_dispatch_tokens_per_rank): tokens per rank up to
# which ``--deepep-mode auto`` runs the low-latency kernels, and past which the normal ones.
DEEPEP_LOW_LATENCY_TOKENS = 128


@dataclass(frozen=True)
class CommTime:
    """The communication of one replica: ``gpus`` GPUs laid out as ``layout``, serving ``arch`` on ``engine``
    with routed experts in ``expert_dtype``; ``latency_s`` is each collective's fixed latency (the step model's
    efficiency)."""

    arch: Architecture
    gpu: GpuSpec
    gpus: int
    layout: Layout
    engine: str
    expert_dtype: str
    mxfp4_moe_activations: str
    latency_s: float

    def comm_time_s(self, tokens: np.ndarray | float) -> np.ndarray:
        """Seconds of communication in one cycle of ``tokens`` tokens (:mod:`apmw.perf.parallelism`):

        - two ring all-reduces of the hidden state per layer within each ``tp`` group, of the
          tokens of one DP rank's micro-batch;
        - per MoE layer, with expert parallelism a dispatch and a combine all-to-all, each GPU sending
          its share of the tokens' top-k hidden states to the other ranks (the busiest rank's share,
          :func:`apmw.perf.parallelism.expert_imbalance`); with ``dp > 1`` and no EP an all-gather of
          the ranks' tokens and a reduce-scatter back;
        - per dense layer where the engine runs the dense MLP over more GPUs than a rank's ``tp``
          (``dense_tp``: SGLang, TensorRT-LLM under attention DP), the same all-gather and reduce-scatter;
        - with pipeline stages, each micro-batch's hidden states sent on to the next stage.

        Each over the per-GPU link its group reaches (:func:`apmw.perf.interconnect.link_bandwidth_bytes_per_s`:
        the scale-up domain's, or the scale-out network's beyond it), plus a fixed latency per collective.
        """
        lay, a, lat = self.layout, self.arch, self.latency_s
        micro = np.asarray(tokens, dtype=float) / lay.pp
        hidden_bytes = a.hidden_size * ACTIVATION_BYTES
        per_stage = np.zeros_like(micro)
        if lay.tp > 1:
            message = micro / lay.dp * hidden_bytes
            ring = 2 * (lay.tp - 1) / lay.tp * message / link_bandwidth_bytes_per_s(self.gpu, lay.tp)
            all_reduce = np.maximum(lat + ring, self.all_reduce_floor_s(message))
            per_stage = per_stage + 2 * a.num_layers / lay.pp * all_reduce
        if not lay.two_batch_overlap:
            per_stage = per_stage + self._moe_exchange_s(micro)
        dense_layers = a.num_layers - a.moe_layers
        if lay.dense_tp > lay.tp and dense_layers:
            sent = micro * (lay.dense_tp - lay.tp) / lay.dense_tp * hidden_bytes
            per_stage = per_stage + dense_layers / lay.pp * 2 * (
                lat + sent / link_bandwidth_bytes_per_s(self.gpu, lay.dense_tp))
        if lay.pp > 1:
            hop = lat + micro / lay.dp * hidden_bytes / link_bandwidth_bytes_per_s(self.gpu, self.gpus)
            per_stage = per_stage + hop
        return lay.pp * per_stage

    def overlapped_s(self, tokens: np.ndarray | float) -> np.ndarray:
        """Seconds of communication that run beside the kernels instead of before them: with two-batch
        overlap, each half-batch's MoE dispatch and combine hide behind the other half's compute
        (SGLang ``--enable-two-batch-overlap``), so an iteration takes the longer of the two."""
        micro = np.asarray(tokens, dtype=float) / self.layout.pp
        if not self.layout.two_batch_overlap:
            return np.zeros_like(micro)
        return self.layout.pp * self._moe_exchange_s(micro)

    def _moe_exchange_s(self, micro: np.ndarray) -> np.ndarray:
        """One stage's MoE token exchange for a micro-batch of ``micro`` tokens: with expert parallelism
        a dispatch and a combine per MoE layer, measured where the system's tables cover the EP size
        (:func:`_measured_dispatch_combine_s`), else each GPU's share of the tokens' top-k hidden states
        (the busiest rank's) over the link; with ``dp > 1`` and no EP an all-gather and a reduce-scatter."""
        lay, a = self.layout, self.arch
        moe_gpus = lay.tp * lay.dp
        if not a.moe_layers or (lay.ep == 1 and lay.dp == 1):
            return np.zeros_like(micro)
        layers = a.moe_layers / lay.pp
        measured = self._measured_dispatch_combine_s(micro / moe_gpus) if lay.ep > 1 else None
        if measured is not None:
            return layers * self._skewed(*measured, micro)
        bw = link_bandwidth_bytes_per_s(self.gpu, moe_gpus)
        hidden_bytes = a.hidden_size * ACTIVATION_BYTES
        if lay.ep > 1:
            routed = micro * a.experts_per_token
            sent = routed / moe_gpus * expert_imbalance(lay, routed) * (lay.ep - 1) / lay.ep * hidden_bytes
        else:
            sent = micro * (moe_gpus - 1) / moe_gpus * hidden_bytes
        per_layer = 2 * (self.latency_s + sent / bw)
        if lay.ep > 1:
            # past the measured EP sizes, an exchange among more ranks costs no less than the measured one among fewer
            fewer = self._measured_dispatch_combine_s(micro / moe_gpus, fewer_ranks=True)
            if fewer is not None:
                per_layer = np.maximum(per_layer, self._skewed(*fewer, micro))
        return layers * per_layer

    def _skewed(self, measured: np.ndarray, ep: int, micro: np.ndarray) -> np.ndarray:
        """An exchange measured at EP ``ep`` under the layout's expert imbalance: the tables' routing taken as
        uniform's at that EP, a given skew scales the busiest rank by its excess over uniform's."""
        lay = self.layout
        if lay.expert_imbalance is None:
            return measured
        routed = micro * self.arch.experts_per_token
        uniform = expert_imbalance(replace(lay, ep=ep, expert_imbalance=None), routed)
        return measured * lay.expert_imbalance / uniform

    @cached_property
    def _measured_comm(self) -> MeasuredCollectives | None:
        """The system's measured communication tables (:mod:`apmw.perf.communication`), for a stock GPU only."""
        try:
            stock = get_gpu(self.gpu.name) == self.gpu
        except UnknownNameError:
            stock = False
        return measured_collectives(self.gpu.name) if stock else None

    @cached_property
    def _all_reduce_floor(self) -> tuple[MeasuredCollectives, int, Engine | None] | None:
        """Where the tensor-parallel group is past every GPU count measured on this system (TP16 across two HGX
        nodes): the tables, the widest count measured and whose all-reduce it is (the engine's own where it
        reaches furthest inside the scale-up domain, else NCCL's, None). None where a measurement covers the
        group or none exists. Worked out once: :meth:`comm_time_s` prices every iteration."""
        comm = self._measured_comm
        if comm is None:
            return None
        library = comm.gpu_counts("all_reduce")
        # an engine's custom all-reduce writes its peers' memory over the scale-up links: past the domain the
        # engines fall back to NCCL
        within = self.layout.tp <= scaleup_domain_gpus(self.gpu)
        own = cast(Engine, self.engine) if self.engine in ENGINES and within else None
        engine = comm.gpu_counts("all_reduce", own) if own else ()
        widest = max(library + engine, default=0)
        if not widest or self.layout.tp <= widest:
            return None
        return comm, widest, own if widest in engine else None

    def all_reduce_floor_s(self, message_bytes: np.ndarray) -> np.ndarray | float:
        """What a tensor-parallel all-reduce costs at least past the measured GPU counts (:attr:`_all_reduce_floor`):
        the widest measured all-reduce at the same message; more ranks, over a network no faster, never cost
        less. 0 where none applies (the link formula then stands alone)."""
        if self._all_reduce_floor is None:
            return 0.0
        comm, widest, engine = self._all_reduce_floor
        floor = comm.all_reduce_s(widest, message_bytes, engine)
        return 0.0 if floor is None else floor

    def _exchange_curves(self, fewer_ranks: bool = False) -> list[tuple[MoECurves, str]] | None:
        """The measured curves that price one MoE layer's dispatch + combine here, each with what it prices:
        TensorRT-LLM's all-to-all as ``"dispatch"`` and ``"combine"``, or DeepEP's low-latency and normal modes
        as the tokens per rank each runs at (:meth:`_measured_dispatch_combine_s`); None where the tables do
        not cover this GPU (a stock part only), EP size or mode."""
        lay, a = self.layout, self.arch
        comm = self._measured_comm
        if comm is None:
            return None
        shape = (a.hidden_size, a.experts_per_token, a.num_experts)
        if self.engine == "trtllm":
            payload = TRTLLM_DISPATCH_PAYLOAD.get(self.expert_dtype.lower(), "bfloat16")
            if payload == "nvfp4" and a.mxfp4_experts:       # gpt-oss: W4A8 sends MXFP8, W4A16 bf16
                payload = "fp8" if self.mxfp4_moe_activations == "mxfp8" else "bfloat16"
            dispatch = comm.moe_curves("trtllm_alltoall", lay.ep, *shape, dtype=payload, fewer_ranks=fewer_ranks)
            combine = comm.moe_curves("trtllm_alltoall", lay.ep, *shape, fewer_ranks=fewer_ranks)
            if dispatch is not None and combine is not None:
                return [(dispatch, "dispatch"), (combine, "combine")]
        low = comm.moe_curves("low_latency", lay.ep, *shape, fewer_ranks=fewer_ranks)
        normal = comm.moe_curves("normal", lay.ep, *shape, fewer_ranks=fewer_ranks)
        if low is None or normal is None:
            return None
        return [(low, f"<= {DEEPEP_LOW_LATENCY_TOKENS}"), (normal, f"> {DEEPEP_LOW_LATENCY_TOKENS}")]

    def _measured_dispatch_combine_s(self, tokens_per_rank: np.ndarray,
                                     fewer_ranks: bool = False) -> tuple[np.ndarray, int] | None:
        """One MoE layer's dispatch + combine from the system's measured tables (:mod:`apmw.perf.communication`),
        and the EP size that answered:

        - TensorRT-LLM: its own NVLink all-to-all where measured (GB200 NVL72, EP 2-64), its dispatch carrying
          the experts' activation format (:data:`TRTLLM_DISPATCH_PAYLOAD`), its combine bf16;
        - otherwise DeepEP: low-latency mode up to its dispatch buffer of 128 tokens per rank (DeepEP's
          ``num_max_dispatch_tokens_per_rank`` as SGLang sets it), normal mode above, as SGLang's
          ``--deepep-mode auto`` picks for decode and prefill batches.

        None where the tables do not cover this GPU (a stock part only), EP size or mode. ``fewer_ranks``
        reads the largest EP measured at or below the layout's instead (a floor past the tables)."""
        curves = self._exchange_curves(fewer_ranks)
        if curves is None:
            return None
        (first, first_phase), (second, second_phase) = curves
        if first_phase == "dispatch":
            return first(tokens_per_rank, "dispatch") + second(tokens_per_rank, "combine"), first.ep
        tokens = np.asarray(tokens_per_rank, dtype=float)
        small = tokens <= DEEPEP_LOW_LATENCY_TOKENS   # each mode read only where it runs: these arrays span every batch
        seconds = np.empty_like(tokens)
        seconds[small] = first(tokens[small])
        seconds[~small] = second(tokens[~small])
        return seconds, first.ep

    @property
    def moe_exchange_floor_ep(self) -> int | None:
        """Where the layout's EP is past every EP size measured on this system for its engine's exchange, the
        largest measured one, whose measurement floors the link-bandwidth estimate (:meth:`_moe_exchange_s`);
        None where a measurement answers, or none exists, or nothing is exchanged."""
        if not self.arch.moe_layers or self.layout.ep == 1 or self._exchange_curves() is not None:
            return None
        floor = self._exchange_curves(fewer_ranks=True)
        return None if floor is None else floor[0][0].ep

    @property
    def moe_exchange_source(self) -> str | None:
        """Where the MoE layers' token exchange is priced from at this layout, for ``source_detail``: the
        measured tables that answer (and at which EP size), the bandwidth formula floored by a smaller EP's
        measurement where the layout's EP is past the tables, or the bandwidth formula alone; None where
        nothing is exchanged (no routed experts, or neither EP nor attention DP)."""
        lay, a = self.layout, self.arch
        if not a.moe_layers or (lay.ep == 1 and lay.dp == 1):
            return None
        if lay.ep == 1:
            return "MoE all-gather/reduce-scatter over attention-DP ranks: the link-bandwidth formula"

        def tables(curves: list[tuple[MoECurves, str]]) -> str:
            return "; ".join(f"{c.source} ({phase})" for c, phase in curves)

        measured = self._exchange_curves()
        if measured is not None:
            ep = measured[0][0].ep
            at = "" if ep == lay.ep else f" (EP {lay.ep} read at the nearest measured EP above, {ep})"
            return f"MoE dispatch/combine at EP {lay.ep}: measured{at}: {tables(measured)}"
        floor = self._exchange_curves(fewer_ranks=True) if self.moe_exchange_floor_ep is not None else None
        if floor is not None:
            return (f"MoE dispatch/combine at EP {lay.ep}, past the measured EP sizes: the link-bandwidth formula, "
                    f"no faster than the measured EP {self.moe_exchange_floor_ep} (an estimate, not a measurement): "
                    f"{tables(floor)}")
        return f"MoE dispatch/combine at EP {lay.ep}: the link-bandwidth formula (no measured tables for {self.gpu.name})"
