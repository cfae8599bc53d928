"""How a replica's GPUs split the model, and what each engine does under each split (MODEL.md section 10).

A replica of ``g = tp x pp x dp`` GPUs runs

* **pipeline stages** (``pp``): each holds ``1/pp`` of the layers. The scheduler keeps ``pp``
  micro-batches in flight, so every running sequence advances one token per *cycle* of ``pp`` stage
  times; each micro-batch reads its stage's weights again (why pipeline parallelism costs weight
  bandwidth at small batches);
* **attention data-parallel ranks** (``dp``): each runs attention for its own requests and holds
  their KV, on ``tp`` GPUs sharded by head. A one-head latent (MLA, MQA) cannot be split by head, so
  every GPU of a ``tp`` group holds its rank's whole latent: KV is replicated ``tp`` times, not
  ``g`` times (:attr:`Layout.kv_replication`);
* **MoE layers** over all ``tp x dp`` GPUs of a stage, as ``moe_tp x ep``: each GPU holds
  ``(experts + redundant) / ep`` routed experts, each split ``moe_tp`` ways. Under expert
  parallelism every MoE layer *dispatches* each token's hidden state to its top-k experts' ranks and
  *combines* the results: two all-to-alls per MoE layer. Without it (``ep = 1``) and with ``dp > 1``
  the tokens of all ranks are gathered before the layer and scattered after it. The busiest rank
  sets the pace (:func:`expert_imbalance`).

What the engines do with the weights that are neither attention nor routed experts (dense MLP
layers, shared experts, embeddings, LM head) under attention data parallelism, ``dense_tp``:

* vLLM runs each DP rank as its own engine core ("each DP rank is deployed as a separate core
  engine process", docs/serving/data_parallel_deployment.md); only the MoE layers span the ranks, so
  the dense weights are replicated per rank and sharded over its ``tp`` GPUs.
* SGLang under ``--enable-dp-attention`` runs the dense MLPs tensor parallel over the whole
  ``--tp-size`` (``moe_dense_tp_size`` unset, server_args.py), i.e. over ``tp x dp`` GPUs.
* TensorRT-LLM keeps its FFN module tensor parallel over ``tensor_parallel_size`` (all ``tp x dp``
  GPUs) whether attention runs TP or DP ("Parallelism in TensorRT LLM", FFN module parallelism).

The batch limit and token budget apply per DP rank or per replica as
:func:`apmw.perf.serving_policy.schedulers_per_limit` says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import NoReturn

import numpy as np

from apmw.arch import Architecture
from apmw.errors import ApmwError
from apmw.spec import Serving

# Engines that lay a replica out in more than one way; llama.cpp's server is one process per model.
LAYOUT_ENGINES = ("vllm", "sglang", "trtllm")


@dataclass(frozen=True)
class Layout:
    """A replica's parallel sizes, resolved (module docstring). ``dense_tp`` is the engine's rule."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    moe_tp: int = 1
    ep: int = 1
    dense_tp: int = 1
    redundant_experts: int = 0
    expert_imbalance: float | None = None
    two_batch_overlap: bool = False

    @classmethod
    def tensor(cls, gpus: int) -> "Layout":
        """Plain tensor parallelism over ``gpus`` GPUs (what a replica is without a layout)."""
        return cls(tp=gpus, moe_tp=gpus, dense_tp=gpus)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def is_tensor_parallel(self) -> bool:
        """Plain tensor parallelism in effect: one stage, one attention rank, the experts split like the rest
        (an imbalance or an overlap setting changes nothing without expert parallelism)."""
        return (self.pp == 1 and self.dp == 1 and self.ep == 1 and self.moe_tp == self.tp
                and not self.redundant_experts)

    def describe(self) -> str:
        """The layout in engine terms: 'TP8', 'TP1 x DP8, EP8', 'TP4 x PP2'."""
        parts = [f"TP{self.tp}"] + [f"{n}{v}" for n, v in (("PP", self.pp), ("DP", self.dp)) if v > 1]
        moe = [f"{n}{v}" for n, v in (("EP", self.ep),) if v > 1]
        if self.moe_tp != self.tp * self.dp or self.ep > 1:
            moe = ([f"MoE-TP{self.moe_tp}"] if self.moe_tp > 1 else []) + moe
        return " x ".join(parts) + (", " + " ".join(moe) if moe else "")

    def held_bytes(self, attention_bytes: float, rest_bytes: float, routed_params: float, expert_bytes_per_param: float,
                   num_experts: float) -> float:
        """Bytes the GPUs of this layout hold together of weights split this way: every GPU holds its stage's
        attention over ``tp``, the rest (dense FFN, lm_head, norms, routers) over ``dense_tp`` and its routed
        experts (``routed_params`` at ``expert_bytes_per_param``, redundant copies included) over
        ``moe_tp x ep``; copies across attention DP ranks count each time. Plain tensor parallelism holds the
        weights once."""
        slots = (num_experts + self.redundant_experts) / num_experts if routed_params else 1.0
        per_gpu = (attention_bytes / self.tp + rest_bytes / self.dense_tp
                   + routed_params * slots / (self.moe_tp * self.ep) * expert_bytes_per_param) / self.pp
        return per_gpu * self.gpus

    def kv_replication(self, arch: Architecture) -> float:
        """How many GPUs hold a copy of each KV byte: a one-head latent (MLA, MQA) on every GPU of its
        rank's ``tp`` group; GQA with fewer KV heads than ``tp`` ``tp / kv_heads`` times; else once."""
        if arch.attention == "mla" or arch.num_kv_heads <= 1:
            return float(self.tp)
        return max(1.0, self.tp / arch.num_kv_heads)

    def to_dict(self) -> dict:
        return {"tp": self.tp, "pp": self.pp, "dp_attention": self.dp, "moe_tp": self.moe_tp, "ep": self.ep,
                "dense_tp": self.dense_tp, "redundant_experts": self.redundant_experts,
                "expert_imbalance": self.expert_imbalance, "two_batch_overlap": self.two_batch_overlap,
                "gpus": self.gpus, "text": self.describe()}


def dense_tp(engine: str, tp: int, dp: int) -> int:
    """The tensor-parallel size of the dense (non-attention, non-routed) weights (module docstring)."""
    return tp * dp if engine in ("sglang", "trtllm") else tp


def layout_of(serving: Serving, gpus: int) -> Layout:
    """The layout a validated spec's serving section sets on ``gpus`` GPUs: its ``parallelism``
    (already checked to multiply out, :class:`apmw.spec.Spec`), ``attention_data_parallel: true``
    as one attention rank per GPU with the MoE layers tensor parallel over all, or plain TP."""
    par = serving.parallelism
    if par is not None:
        tp = par.tp or 1
        return Layout(tp=tp, pp=par.pp, dp=par.dp_attention, moe_tp=par.moe_tp or tp * par.dp_attention,
                      ep=par.ep, dense_tp=dense_tp(serving.engine, tp, par.dp_attention),
                      redundant_experts=par.redundant_experts, expert_imbalance=par.expert_imbalance,
                      two_batch_overlap=par.two_batch_overlap)
    if serving.attention_data_parallel:
        return Layout(tp=1, dp=gpus, moe_tp=gpus, dense_tp=dense_tp(serving.engine, 1, gpus))
    return Layout.tensor(gpus)


def prefill_layout(serving: Serving) -> Layout:
    """One disaggregated prefill worker's layout: ``prefill_parallelism``, or tensor parallel over its
    ``prefill_gpus`` when that is unset (the decode side's attention DP is not inherited)."""
    d = serving.disaggregation
    if d is None:
        raise ValueError("prefill_layout needs serving.disaggregation")
    if d.prefill_parallelism is None:
        return Layout.tensor(d.prefill_gpus_per_worker)
    return layout_of(serving.model_copy(update={"parallelism": d.prefill_parallelism,
                                                "attention_data_parallel": False}), d.prefill_gpus_per_worker)


# A layout's settings of routed experts: none applies to a model without them.
EXPERT_SETTINGS = ("ep", "moe_tp", "redundant_experts", "expert_imbalance", "two_batch_overlap")


def refuse_expert_settings(arch: Architecture, field: str) -> NoReturn:
    """Refuse :data:`EXPERT_SETTINGS` on ``arch``, a model without routed experts."""
    named = f"{', '.join(EXPERT_SETTINGS[:-1])} and {EXPERT_SETTINGS[-1]}"
    raise ApmwError(f"{field}: {arch.name} has no routed experts, so {named} do not apply; leave them out")


def check_layout(layout: Layout, arch: Architecture, engine: str, field: str = "serving.parallelism") -> None:
    """Refuse a layout the model or the engine cannot run, saying why and what would."""
    if engine not in LAYOUT_ENGINES and not layout.is_tensor_parallel:
        raise ApmwError(f"{field}: engine {engine} runs one process per model; only tensor parallelism "
                        f"(hardware.gpus_per_replica) is modelled for it")
    # TensorRT-LLM's docs ("Parallelism in TensorRT-LLM", the attention module) name two strategies, TP or DP
    if engine == "trtllm" and layout.tp > 1 and layout.dp > 1:
        raise ApmwError(f"{field}: TensorRT-LLM runs attention either tensor parallel or data parallel "
                        "(enable_attention_dp gives every GPU its own attention rank), not tensor parallel inside "
                        f"data-parallel ranks: tp {layout.tp} x dp_attention {layout.dp} has no setting there. Use "
                        f"tp 1 x dp_attention {layout.tp * layout.dp} or tp {layout.tp * layout.dp} x dp_attention 1, "
                        "or SGLang or vLLM, which run it")
    if arch.num_heads % layout.tp:
        raise ApmwError(f"{field}: tp {layout.tp} does not divide {arch.name}'s {arch.num_heads} attention heads; "
                        f"engines shard heads evenly, so use a tp that divides {arch.num_heads} (and put the other "
                        "GPUs in dp_attention)")
    if layout.pp > arch.num_layers:
        raise ApmwError(f"{field}: pp {layout.pp} is more stages than {arch.name}'s {arch.num_layers} layers")
    moe_split = layout.ep > 1 or layout.moe_tp != layout.tp * layout.dp or layout.redundant_experts
    if not arch.moe_layers:
        if moe_split or layout.expert_imbalance is not None or layout.two_batch_overlap:
            refuse_expert_settings(arch, field)
        return
    if layout.ep == 1:
        why = {"redundant_experts": "the engines take redundant experts only with expert parallelism on",
               "expert_imbalance": "every GPU holds a slice of every expert, so no rank is busier than another"}
        idle = [name for name, given in (("redundant_experts", layout.redundant_experts),
                                         ("expert_imbalance", layout.expert_imbalance is not None)) if given]
        if idle:
            raise ApmwError(f"{field}: {' and '.join(idle)} {'apply' if len(idle) > 1 else 'applies'} to expert "
                            f"parallelism, and ep is 1 ({'; '.join(why[n] for n in idle)}); set ep, or leave "
                            f"{'them' if len(idle) > 1 else 'it'} out")
        if layout.two_batch_overlap and layout.dp == 1:
            raise ApmwError(f"{field}: two_batch_overlap hides the MoE token exchange of expert parallelism or "
                            "attention data parallelism, and this layout has neither (ep 1, dp_attention 1); "
                            "leave it out")
    if layout.expert_imbalance is not None and layout.expert_imbalance > layout.ep:
        raise ApmwError(f"{field}: expert_imbalance {layout.expert_imbalance:g} is more than ep {layout.ep}: the "
                        f"busiest of {layout.ep} expert-parallel ranks carries at most all the tokens, {layout.ep} "
                        "times the mean; give at most that")
    slots = arch.num_experts + layout.redundant_experts
    if slots % layout.ep:
        raise ApmwError(f"{field}: ep {layout.ep} does not divide {arch.name}'s {arch.num_experts} routed experts"
                        + (f" + {layout.redundant_experts} redundant = {slots}" if layout.redundant_experts else "")
                        + f"; use an ep that divides {slots}")
    # vLLM's dual batch overlap "only targets DP+EP deployments" (its docs/design/dbo.md)
    if layout.two_batch_overlap and engine == "trtllm":
        raise ApmwError(f"{field}: two_batch_overlap is SGLang's --enable-two-batch-overlap (vLLM's --enable-dbo); "
                        "TensorRT-LLM has no such setting, so leave it out or serve with one of those")
    if layout.two_batch_overlap and engine == "vllm" and not (layout.dp > 1 and layout.ep > 1):
        raise ApmwError(f"{field}: vLLM's two-batch overlap (--enable-dbo) runs only with data parallel attention "
                        f"and expert parallelism (dp_attention > 1 and ep > 1; this layout has dp_attention "
                        f"{layout.dp}, ep {layout.ep}); leave it out, or serve with SGLang")


def busiest_rank_share(layout: Layout, seqs: np.ndarray) -> np.ndarray:
    """The busiest attention-DP rank's sequences over an even share: ``dp x ceil(seqs / dp) / seqs``
    (1 without attention DP, or when the sequences divide evenly): what a step model knowing only how many
    sequences decode charges the rank that sets every rank's pace."""
    dp = layout.dp
    if np.ndim(seqs) == 0:      # one iteration's count (the simulator's): Python arithmetic, not numpy's per call
        s = float(seqs)
        return dp * math.ceil(s / dp) / s if dp > 1 and s >= 1 else 1.0
    if dp <= 1:
        return np.ones_like(seqs)
    return np.where(seqs >= 1, dp * np.ceil(seqs / dp) / np.maximum(seqs, 1.0), 1.0)


def at_busiest_rank(layout: Layout, seqs, busiest):
    """The replica-wide load (KV bytes read, attention FLOPs) to hand a step model so that, taking
    :func:`busiest_rank_share` of ``seqs`` decoding sequences, it charges a rank ``busiest`` of it: how a
    caller that knows the busiest rank's own load (the simulator's ranks, a prompt on its rank) prices it."""
    if np.ndim(seqs) == 0 and np.ndim(busiest) == 0:
        return layout.dp * float(busiest) / busiest_rank_share(layout, seqs)
    return layout.dp * np.asarray(busiest, dtype=np.float64) / busiest_rank_share(layout, np.asarray(seqs, dtype=np.float64))


def busiest_rank_spread(layout: Layout, seqs: np.ndarray, cv: float) -> np.ndarray:
    """The busiest attention-DP rank's decoders' KV bytes (or attention FLOPs) over their mean, where each
    sequence's differs from the others' with coefficient of variation ``cv`` (its context's): a rank's sum
    of ``n = seqs / dp`` of them has a relative spread ``cv / sqrt(n)``, and the largest of ``dp`` such sums
    lies :func:`expected_max_of_normals` of ``dp`` spreads above the mean (the sums taken as normal).
    The simulator places the sequences and needs no such figure (``apmw.sim.engine``)."""
    seqs = np.asarray(seqs, dtype=np.float64)
    if layout.dp <= 1 or cv <= 0:
        return np.ones_like(seqs)
    return 1.0 + expected_max_of_normals(layout.dp) * cv / np.sqrt(np.maximum(seqs / layout.dp, 1.0))


@lru_cache(maxsize=64)
def expected_max_of_normals(n: int) -> float:
    """E[max of ``n`` independent standard normals]: 0.56 for 2, 1.42 for 8, 2.39 for 72 (integrated)."""
    if n <= 1:
        return 0.0
    from scipy.special import ndtr      # here, not at import: every verb imports this module

    # the integrand x n phi(x) Phi(x)^(n-1) is smooth and negligible past 12, where the trapezoid rule on a
    # fine grid is exact to rounding
    x = np.linspace(-12.0, 12.0, 24001)
    density = n * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi) * ndtr(x) ** (n - 1)
    return float(np.trapezoid(x * density, x))


def expert_imbalance(layout: Layout, routed_tokens: np.ndarray) -> np.ndarray:
    """The busiest expert-parallel rank's routed tokens over the mean, at ``routed_tokens`` token-expert
    assignments per MoE layer (tokens x top-k) spread over ``ep`` ranks.

    Given, :attr:`Layout.expert_imbalance` (a measured figure). Otherwise the floor that uniform random
    routing sets: each rank's count is Binomial(n, 1/ep), and the largest of ``ep`` such counts lies
    about ``sqrt(2 ln ep)`` standard deviations above the mean (the Gaussian maximum of ``ep`` draws).
    Real routing is skewed on top of this (hot experts), so the floor is optimistic; redundant experts
    and expert-placement balancing (EPLB) work to bring a deployment towards it.
    """
    n = np.maximum(np.asarray(routed_tokens, dtype=float), 1.0)
    if layout.ep <= 1:
        return np.ones_like(n)
    if layout.expert_imbalance is not None:
        return np.full_like(n, layout.expert_imbalance)
    mean = n / layout.ep
    sd = np.sqrt(n * (1.0 / layout.ep) * (1.0 - 1.0 / layout.ep))
    return np.minimum(1.0 + math.sqrt(2.0 * math.log(layout.ep)) * sd / mean, float(layout.ep))
