"""What to change first: concrete actions and elasticities of agents per MW.

Every lever is a small function from the user's spec to a changed spec (or
``None`` where it does not apply, e.g. FP8 KV when the KV is already FP8). Each
changed spec is re-planned with the same seed, so the gain is the planner's own
answer for *this* workload, not a rule of thumb. Levers are grouped as the
source text groups them (MODEL.md section 8):

* ``kv_residency`` -- shrink the live KV-token integral: lower-byte KV, prefix
  caching, history summarisation, what happens to KV during tool waits;
* ``decode_batching`` -- more useful work per iteration: a larger batch limit,
  speculative decoding;
* ``other`` -- more or fewer GPUs per replica.

``relaxes`` names the constraint a lever acts on by its mechanism (``kv_memory``,
``slo`` or ``batch_limit``); the result also reports the binding constraint
before and after, so a lever that relaxes a constraint that does not bind shows
a gain near 1. Levers that lower agents per MW are kept and flagged: adding
work (summary calls, recompute after eviction) or tail latency can backfire.

Elasticities are ``d ln(agents/MW) / d ln(x)`` by a central difference of
``+-ELASTICITY_STEP`` in ``x`` (an integer input at least one either way, divided by the step it took). N* is an
integer, so for small N* they are coarse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

from pydantic import ValidationError

from apmw.capacity import InfeasibleError, Plan, plan
from apmw.sim import unsupported_on_one_replica, verify_plan
from apmw.errors import ApmwError
from apmw.perf import replica_from_spec, resolve_gpu
from apmw.perf.interconnect import scaleup_domain_gpus
from apmw.perf.replica import kv_dtype_refusal
from apmw.perf.serving_policy import schedulers_per_limit
from apmw.spec import Disaggregation, GpuOverride, Spec, Speculative
from apmw.spec.serving import OFFLOAD_BANDWIDTH_BYTES_PER_S

GROUPS = ("kv_residency", "decode_batching", "other")
# Relative step of the elasticity finite differences.
ELASTICITY_STEP = 0.10
# Speculative-decoding assumption for the lever: 4 draft tokens, 70% acceptance and a draft
# costing 10% of an iteration -- the range EAGLE-style drafts report on chat data
# (Li et al., "EAGLE", ICML 2024: acceptance 0.6-0.8). Users with measured figures set
# serving.speculative in their spec instead.
SPECULATIVE_ASSUMED = Speculative(draft_tokens=4, acceptance_rate=0.7, draft_cost_fraction=0.1)
# Summary length for the summarisation lever (a one-page summary of the history).
SUMMARY_TOKENS = 1000


@dataclass(frozen=True)
class Lever:
    name: str
    group: str
    relaxes: str
    description: str
    change: Callable[[Spec, Plan], Spec | str]     # the changed spec, or why the lever does not apply
    detail: Callable[[Spec], str] | None = None   # what the changed spec chose (e.g. a searched split)


@dataclass(frozen=True)
class LeverResult:
    lever: str
    group: str
    relaxes: str
    description: str
    agents_per_mw_before: float
    agents_per_mw_after: float
    agents_per_replica_before: int
    agents_per_replica_after: int
    binding_before: str
    binding_after: str | None
    cost_per_session_usd_before: float
    cost_per_session_usd_after: float | None
    plan_after: Plan | None = field(default=None, repr=False, compare=False)
    verified: dict | None = None     # the simulator at the lever's N* (with --verify)
    detail: str | None = None

    @property
    def gain(self) -> float:
        return self.agents_per_mw_after / self.agents_per_mw_before

    def to_dict(self) -> dict:
        return {
            "lever": self.lever, "group": self.group, "relaxes": self.relaxes, "description": self.description,
            "agents_per_mw_before": self.agents_per_mw_before, "agents_per_mw_after": self.agents_per_mw_after,
            "gain": self.gain,
            "agents_per_replica_before": self.agents_per_replica_before,
            "agents_per_replica_after": self.agents_per_replica_after,
            "binding_before": self.binding_before, "binding_after": self.binding_after,
            "cost_per_session_usd_before": self.cost_per_session_usd_before,
            "cost_per_session_usd_after": self.cost_per_session_usd_after,
            "lowers_agents_per_mw": self.gain < 1.0,
            "detail": self.detail,
            **({"verify": self.verified} if self.verified is not None else {}),
        }


def _with(spec: Spec, section: str, **changes) -> Spec:
    """``spec`` with ``changes`` in one section, checked as a spec file would be: a lever whose change
    the section refuses (retain on llama.cpp, which has no such policy) raises ValueError."""
    old = getattr(spec, section)
    part = type(old).model_validate({**dict(old), **changes})
    return spec.model_copy(update={section: part})


def _kv_dtype(target: str, lower_than: tuple[str, ...]) -> Callable[[Spec, Plan], Spec | str]:
    def change(spec: Spec, _: Plan) -> Spec | str:
        if spec.model.kv_dtype not in lower_than:
            return f"the KV is already {spec.model.kv_dtype}"
        refusal = kv_dtype_refusal(resolve_gpu(spec.hardware.gpu), target, spec.serving.engine)
        if refusal:
            return refusal
        return _with(spec, "model", kv_dtype=target)
    return change


def _prefix_caching(spec: Spec, _: Plan) -> Spec | str:
    return "prefix caching is already on" if spec.serving.prefix_caching else _with(spec, "serving", prefix_caching=True)


def _policy(policy: str) -> Callable[[Spec, Plan], Spec | str]:
    def change(spec: Spec, _: Plan) -> Spec | str:
        if spec.serving.tool_wait_kv_policy == policy:
            return f"the tool-wait KV policy is already {policy}"
        if not spec.serving.prefix_caching:
            return "without prefix caching no context outlives its call, whatever the tool-wait policy"
        ttl = spec.workload.tool_wait_s.quantile(0.9) if policy == "ttl" else None
        if policy == "ttl" and ttl <= 0:
            return "the tool waits' p90 is 0 s: a ttl of it frees every context at once, as evict does"
        link = {} if policy == "offload" else {"offload_bandwidth_bytes_per_s": OFFLOAD_BANDWIDTH_BYTES_PER_S}
        return _with(spec, "serving", tool_wait_kv_policy=policy, ttl_s=ttl, **link)
    return change


def _summarise(spec: Spec, p: Plan) -> Spec | str:
    """Cap the history at half the mean peak context a session reaches (if that leaves room)."""
    s = p.sample
    mean_input_per_call = float(s.input_tokens.sum() / s.calls.sum())
    system = spec.workload.system_prompt_tokens
    peak_history = 2 * (mean_input_per_call - system)      # history grows ~linearly from 0 to its peak
    cap = int(system + peak_history / 2)
    if spec.workload.summarize_at_tokens is not None:
        return "the history is already summarised (workload.summarize_at_tokens)"
    if cap - spec.workload.system_prompt_tokens < 4 * SUMMARY_TOKENS:
        return (f"the history peaks at about {peak_history:,.0f} tokens: half of it leaves less than "
                f"{4 * SUMMARY_TOKENS:,} tokens to summarise into {SUMMARY_TOKENS:,}")
    return _with(spec, "workload", summarize_at_tokens=cap, summary_tokens=SUMMARY_TOKENS)


def _dp_attention(spec: Spec, p: Plan) -> Spec | str:
    """Only where tensor parallelism replicates KV (MLA, or fewer KV heads than GPUs): the same layout
    with its tp groups turned into attention data-parallel ranks. Only where the replica is priced on
    the roofline already: a DP layout is priced on the roofline (the tables compose TP replicas), so
    against a calibrated base the gain would be the estimator's, not the layout's."""
    if spec.serving.attention_data_parallel or p.replica.step.kv_replication <= 1:
        return "each sequence's KV is already held once (no tensor-parallel rank replicates it)"
    if p.replica.step.source != "roofline":
        return (f"the replica is priced from measured tables ({p.replica.step.source}), which compose "
                "tensor-parallel replicas only: a data-parallel one would be priced on the roofline, and the gain "
                "would be the estimator's, not the layout's")
    par = spec.serving.parallelism
    if par is None:
        return _with(spec, "serving", attention_data_parallel=True)
    tp = par.tp or 1
    dp = par.model_copy(update={"tp": 1, "dp_attention": par.dp_attention * tp})
    return _with(spec, "serving", parallelism=dp)


# Prefill-instance sizes tried by the disaggregation lever (GPUs, tensor parallel).
PREFILL_SPLITS = (1, 2, 4, 8)


def _disaggregate(spec: Spec, _: Plan) -> Spec | str:
    """A separate prefill instance: the split (prefill GPUs) with the most agents per MW."""
    if spec.serving.disaggregation is not None:
        return "prefill is already disaggregated"
    best: Spec | None = None
    best_mw = -1.0
    refused: dict[str, list[int]] = {}     # why each split cannot be planned, the splits it refused
    for n in PREFILL_SPLITS:
        candidate = _with(spec, "serving", disaggregation=Disaggregation(prefill_gpus=n))
        try:
            p = plan(candidate)
        except ApmwError as exc:          # infeasible, does not fit, or not modelled with this policy
            refused.setdefault(_first_line(exc), []).append(n)
            continue
        mw = p.to_dict()["agents_per_mw"]
        if mw > best_mw:
            best, best_mw = candidate, mw
    if best is None:
        return "no prefill instance gives a feasible plan: " + "; ".join(
            f"{'/'.join(map(str, splits))} GPUs: {why}" for why, splits in refused.items())
    return best


def _bigger_batch(spec: Spec, p: Plan) -> Spec | str:
    return _with(spec, "serving", max_batch=p.replica.policy.max_batch * 2)


def _speculative(spec: Spec, _: Plan) -> Spec | str:
    return ("the spec already decodes speculatively" if spec.serving.speculative
            else _with(spec, "serving", speculative=SPECULATIVE_ASSUMED))


def _gpus(factor: float) -> Callable[[Spec, Plan], Spec | str]:
    def change(spec: Spec, _: Plan) -> Spec | str:
        if spec.serving.parallelism is not None or spec.serving.attention_data_parallel:
            return "the spec's layout says how its GPUs split: another GPU count is another layout"
        g = spec.hardware.gpus_per_replica * factor
        # tensor parallelism stays inside the scale-up domain (8 GPUs on an HGX node, 72 on an NVL72 rack)
        domain = scaleup_domain_gpus(resolve_gpu(spec.hardware.gpu))
        if g < 1 or g != int(g):
            return f"{spec.hardware.gpus_per_replica} GPUs do not split in two"
        if g > domain:
            return f"{int(g)} GPUs of tensor parallelism would leave the {domain}-GPU scale-up domain"
        return _with(spec, "hardware", gpus_per_replica=int(g))
    return change


LEVERS: tuple[Lever, ...] = (
    Lever("kv_fp8", "kv_residency", "kv_memory", "store the KV cache in FP8", _kv_dtype("fp8", ("bf16", "fp16"))),
    Lever("kv_fp4", "kv_residency", "kv_memory", "store the KV cache in 4-bit (NVFP4-style, with scales)",
          _kv_dtype("fp4", ("bf16", "fp16", "fp8", "int8"))),
    Lever("prefix_caching", "kv_residency", "slo", "turn on prefix caching (shared system prompt, reused history)",
          _prefix_caching),
    Lever("summarise_history", "kv_residency", "kv_memory",
          f"summarise the history into {SUMMARY_TOKENS} tokens when it reaches half the mean peak context",
          _summarise),
    Lever("policy_retain", "kv_residency", "slo", "keep each session's KV in HBM through tool waits", _policy("retain")),
    Lever("policy_evict", "kv_residency", "kv_memory", "free KV at each tool wait and recompute it after",
          _policy("evict")),
    Lever("policy_offload", "kv_residency", "kv_memory", "move KV to host memory during tool waits",
          _policy("offload")),
    Lever("policy_ttl", "kv_residency", "kv_memory", "keep KV through a tool wait up to its p90, then free it",
          _policy("ttl")),
    Lever("dp_attention", "kv_residency", "kv_memory",
          "data-parallel attention: one copy of each sequence's KV instead of one per tensor-parallel rank",
          _dp_attention),
    Lever("batch_limit_x2", "decode_batching", "batch_limit", "double max_batch", _bigger_batch),
    Lever("disaggregated_prefill", "decode_batching", "slo",
          "prefill on a separate instance (best of 1/2/4/8 GPUs), KV handed over at 50 GB/s per GPU; decode "
          "iterations carry no prefill", _disaggregate,
          detail=lambda s: f"prefill_gpus={s.serving.disaggregation.prefill_gpus}"),
    Lever("speculative_decoding", "decode_batching", "slo",
          "speculative decoding, 4 draft tokens at 70% acceptance, draft 10% of an iteration (assumed)",
          _speculative),
    Lever("gpus_x2", "other", "slo", "twice the GPUs per replica (tensor parallel)", _gpus(2)),
    Lever("gpus_half", "other", "slo", "half the GPUs per replica", _gpus(0.5)),
)


def _first_line(exc: Exception) -> str:
    """What a refused change breaks: a validation error's first problem with its field (pydantic's own first line
    only counts them), else the message's first line."""
    if isinstance(exc, ValidationError) and exc.errors():
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ()))
        message = str(first.get("msg", "")).removeprefix("Value error, ")
        return f"{where}: {message}" if where else message
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _replan(spec: Spec) -> Plan | None:
    return _replan_or_why(spec)[0]


def _replan_or_why(spec: Spec) -> tuple[Plan | None, str | None]:
    """The changed spec's plan, or None and why no agent count meets it (the lever leaves no capacity)."""
    try:
        return plan(spec), None
    except InfeasibleError as exc:
        return None, _first_line(exc)


def evaluate_levers(spec: Spec, base: Plan | None = None, progress: Callable[[str], None] | None = None,
                    not_applicable: dict[str, str] | None = None) -> list[LeverResult]:
    """Every applicable lever on ``spec``, best gain first. ``not_applicable`` (if given) gets each other
    lever's reason: already so in the spec, refused by it, or a change that cannot be planned."""
    base = base or plan(spec)
    before = base.to_dict()
    results = []
    skipped = not_applicable if not_applicable is not None else {}
    for lever in LEVERS:
        if progress:
            progress(lever.name)
        try:
            changed = lever.change(spec, base)
        except ValueError as exc:         # not a valid spec for this engine (the section refuses it)
            skipped[lever.name] = f"the spec refuses the change: {_first_line(exc)}"
            continue
        if isinstance(changed, str):
            skipped[lever.name] = changed
            continue
        try:
            after, infeasible = _replan_or_why(changed)
        except ApmwError as exc:          # e.g. the model no longer fits on fewer GPUs
            skipped[lever.name] = f"the changed spec cannot be planned: {_first_line(exc)}"
            continue
        a = after.to_dict() if after else None
        results.append(LeverResult(
            lever=lever.name, group=lever.group, relaxes=lever.relaxes, description=lever.description,
            agents_per_mw_before=before["agents_per_mw"], agents_per_mw_after=a["agents_per_mw"] if a else 0.0,
            agents_per_replica_before=before["agents_per_replica"],
            agents_per_replica_after=a["agents_per_replica"] if a else 0,
            binding_before=before["binding_constraint"], binding_after=a["binding_constraint"] if a else None,
            cost_per_session_usd_before=before["cost_per_session_usd"],
            cost_per_session_usd_after=a["cost_per_session_usd"] if a else None,
            plan_after=after,
            detail=infeasible or (lever.detail(changed) if lever.detail else None),
        ))
    return sorted(results, key=lambda r: -r.gain)


# --- elasticities -------------------------------------------------------------------------------

def _stepped(value: int, f: float) -> int:
    """``value`` scaled by ``f`` and rounded, but at least one away from it (where it can be, staying >= 1): a step
    that rounding cancels (a batch limit of 4 scaled by 0.9 and 1.1) would read as no effect at all."""
    v = round(value * f)
    return max(1, min(v, value - 1) if f < 1 else max(v, value + 1))


# Each input's change: (the spec with the input scaled by about f, the factor the input actually moved by).
Change = Callable[[Spec, float], tuple[Spec, float]]


def _scale_workload(field: str) -> Change:
    def change(spec: Spec, f: float) -> tuple[Spec, float]:
        value = getattr(spec.workload, field)
        if isinstance(value, int):
            stepped = _stepped(value, f)
            return _with(spec, "workload", **{field: stepped}), stepped / value if value else 1.0
        return _with(spec, "workload", **{field: value.scaled(f)}), f
    return change


def _scale_gpu(field: str) -> Change:
    def change(spec: Spec, f: float) -> tuple[Spec, float]:
        gpu = resolve_gpu(spec.hardware.gpu)
        base = spec.hardware.gpu if isinstance(spec.hardware.gpu, GpuOverride) else GpuOverride(name=gpu.name)
        return _with(spec, "hardware", gpu=base.model_copy(update={field: getattr(gpu, field) * f})), f
    return change


def _scale_batch_limit(spec: Spec, f: float) -> tuple[Spec, float]:
    """The batch limit scaled from what the engine runs with (its default where the spec sets none: SGLang's
    sized from the KV pool), as ``serving.max_batch`` counts it (per attention-DP rank on vLLM and TensorRT-LLM)."""
    replica = replica_from_spec(spec)
    policy = replica.policy
    limit = policy.max_batch // schedulers_per_limit(policy.engine, replica.step.parallel.dp)
    stepped = _stepped(limit, f)
    return _with(spec, "serving", max_batch=stepped), stepped / limit


def _scale(section: str, field: str, upper: float | None = None) -> Change:
    def change(spec: Spec, f: float) -> tuple[Spec, float]:
        value = getattr(getattr(spec, section), field)
        v = min(value * f, upper) if upper else value * f
        return _with(spec, section, **{field: v}), v / value if value else 1.0     # 0 cannot move by a share
    return change


ELASTICITY_INPUTS: dict[str, Change] = {
    "workload.steps_per_task": _scale_workload("steps_per_task"),
    "workload.new_input_tokens_per_call": _scale_workload("new_input_tokens_per_call"),
    "workload.output_tokens_per_call": _scale_workload("output_tokens_per_call"),
    "workload.tool_wait_s": _scale_workload("tool_wait_s"),
    "workload.system_prompt_tokens": _scale_workload("system_prompt_tokens"),
    "hardware.gpu.hbm_bytes": _scale_gpu("hbm_bytes"),
    "hardware.gpu.hbm_bandwidth_bytes_per_s": _scale_gpu("hbm_bandwidth_bytes_per_s"),
    "hardware.gpu.bf16_flops": _scale_gpu("bf16_flops"),
    "serving.max_batch": _scale_batch_limit,
    "slo.task_latency_p95_s": _scale("slo", "task_latency_p95_s"),
    "power.pue": _scale("power", "pue"),
    "power.host_power_w_per_gpu": _scale("power", "host_power_w_per_gpu"),
}


def elasticities(spec: Spec, progress: Callable[[str], None] | None = None) -> dict[str, float | None]:
    """d ln(agents/MW) / d ln(x) for each continuous input, over the step the input actually took (an integer
    input's rounded one); None where a side is infeasible or the input cannot move."""
    out: dict[str, float | None] = {}
    for name, change in ELASTICITY_INPUTS.items():
        if progress:
            progress(name)
        sides, factors = [], []
        for f in (1 - ELASTICITY_STEP, 1 + ELASTICITY_STEP):
            try:
                changed, moved = change(spec, f)
                p = _replan(changed)
            except (ApmwError, ValueError):
                p, moved = None, f
            sides.append(p.to_dict()["agents_per_mw"] if p and p.agents_per_replica > 0 else None)
            factors.append(moved)
        lo, hi = sides
        step = math.log(factors[1] / factors[0]) if factors[0] > 0 else 0.0
        out[name] = math.log(hi / lo) / step if lo and hi and step > 0 else None
    return out


def top_two(results: list[LeverResult]) -> list[LeverResult]:
    """The two levers with the largest gain above 1."""
    return [r for r in results if r.gain > 1.0][:2]


def verify_levers(results: list[LeverResult], top: int = 2,
                  progress: Callable[[str], None] | None = None) -> list[LeverResult]:
    """Re-check the ``top`` levers in the simulator at their new N* (``apmw levers --verify``).

    The simulator has the real LRU prefix cache, memory queueing and iteration jitter;
    a lever whose simulated p95 misses the SLO at its analytic N* is overstated.
    """
    out, done = [], 0
    for r in results:
        if done < top and r.gain > 1.0 and r.plan_after is not None:
            if progress:
                progress(f"simulating {r.lever}")
            gap = unsupported_on_one_replica(r.plan_after.spec)
            r = replace(r, verified={"skipped": f"the simulator does not model {gap}"} if gap
                        else verify_plan(r.plan_after))
            done += 1
        out.append(r)
    return out
