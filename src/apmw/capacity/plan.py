"""`apmw plan`: size a replica by the task-latency SLO, then price it.

``plan(spec)`` samples sessions, builds the replica's step model, searches N*,
and returns a :class:`Plan` whose :meth:`Plan.to_dict` is the stable JSON of
``apmw plan --json`` (field names documented in the README).
"""

from __future__ import annotations

import math

from dataclasses import dataclass

from apmw.capacity.api_inputs import check_agents, require_spec
from apmw.capacity.closed_loop import ClosedLoopModel, closed_loop_model, unpriced_overflow
from apmw.capacity.economics import (Economics, FleetSize, api_cost_per_task_usd, economics, fleet_size,
                                     replicas_per_deployment)
from apmw.capacity.evaluate import Evaluation
from apmw.capacity.routing import routing_of
from apmw.capacity.search import MAX_AGENTS, SearchResult, search
from apmw.capacity.slo import seconds_text, slo_table, warnings_for
from apmw.capacity.sessions import SessionSample
from apmw.catalog.gpus import gpu_label
from apmw.errors import ApmwError
from apmw.perf import Efficiency, Replica, StepModel, replica_from_spec
from apmw.perf.parallelism import prefill_layout
from apmw.spec import Spec


# Why no number of agents works (InfeasibleError.cause).
NO_KV_ROOM = "one session's KV exceeds the replica's KV memory"
NO_SLO = "no number of agents meets the SLO"


def gpu_text(rep: dict) -> str:
    """A plan's GPU (its JSON ``replica``) as messages name it (:attr:`apmw.catalog.gpus.GpuSpec.label`)."""
    return gpu_label(rep["gpu"], rep.get("gpu_overridden") or ())


def _seconds(value: float) -> str:
    """A task latency in a message: to 0.1 s, or in milliseconds below a second (a 6 ms task is not "0.0 s")."""
    return f"{value:,.1f} s" if value >= 1 else seconds_text(value)


def _at_least_s(value: float) -> str:
    """The least SLO, in seconds, that ``value`` meets: whole seconds from one up, else three significant digits
    rounded up (0.0061 s, not 0 s)."""
    if value >= 1:
        return f"{value:,.0f}"
    step = 10.0 ** (math.floor(math.log10(value)) - 2) if value > 0 else 1e-6
    return f"{math.ceil(value / step) * step:.3g}"

class InfeasibleError(ApmwError):
    """No number of agents meets the SLO on this replica, or fits its KV memory (CLI exit code 2); ``cause`` says
    which, in words (what a search counts its pruned points by)."""

    exit_code = 2

    def __init__(self, message: str, cause: str = NO_SLO):
        super().__init__(message)
        self.cause = cause


@dataclass(frozen=True)
class Plan:
    spec: Spec
    replica: Replica
    sample: SessionSample
    search: SearchResult
    at: Evaluation          # the evaluation reported (at N*, or at --agents N)
    economics: Economics
    fleet: FleetSize | None

    @property
    def prefill_gpus(self) -> float:
        """Prefill GPUs per decode worker under disaggregation: the prefill workers' GPUs over the decode
        workers that share them (0 when prefill runs on the replica)."""
        d = self.spec.serving.disaggregation
        return d.prefill_gpus_per_worker * d.prefill_workers / d.decode_workers if d else 0

    def _disaggregation_dict(self) -> dict | None:
        """Under disaggregation, the workers behind the figures: this replica is one decode worker and its
        share (``prefill_gpus``) of the prefill workers."""
        d = self.spec.serving.disaggregation
        if d is None:
            return None
        return {"prefill_workers": d.prefill_workers, "prefill_gpus_per_worker": d.prefill_gpus_per_worker,
                "decode_workers": d.decode_workers,
                "prefill_layout": prefill_layout(self.spec.serving).describe()}

    @property
    def binding_slo(self) -> list[str] | None:
        """Which SLOs stop N* from going higher (those N* + 1 misses), where an SLO binds."""
        if self.search.binding_constraint != "slo":
            return None
        return list(self.search.first_failure.slo.failed)

    @property
    def agents_per_replica(self) -> int:
        return self.at.agents

    @property
    def tokens_per_task(self) -> dict[str, float]:
        """Mean tokens of one task: prompt (input), generated (output) and computed prompt (prefill:
        the input its prefix cache does not serve)."""
        prefill = self.at.prefill_tokens_per_session
        return {"input": float(self.sample.input_tokens.mean()), "output": float(self.sample.output_tokens.mean()),
                "prefill": float(self.sample.prefill_tokens.mean()) if prefill is None else prefill}

    @property
    def tokens_per_s(self) -> dict[str, float]:
        x = self.at.session_throughput_per_s
        return {k: x * v for k, v in self.tokens_per_task.items()}

    @property
    def api_cost_per_session_usd(self) -> float | None:
        t = self.tokens_per_task
        return api_cost_per_task_usd(self.spec, t["input"], float(self.sample.api_prefill_tokens.mean()), t["output"])

    @property
    def tpot_p95_s(self) -> float | None:
        """The time per output token's p95 at the operating point; None where no call outputs a second token, so
        none has a time per output token (as the simulator and a load test read it)."""
        return self.at.tpot_p95_s if self.sample.call_decode_iters > 0 else None

    def warnings_at(self, ttft_p95_s: float | None, tpot_p95_s: float | None) -> list[str]:
        """The plan's warnings, its per-call latencies judged at the TTFT and TPOT p95 given: the analytic
        model's, or the simulator's where the checked plan measured them at its own N* (None: not measured)."""
        one, ev = self.search.single_agent, self.at
        return (warnings_for(self.spec.slo, ttft_p95_s, tpot_p95_s,
                             (one.task_latency_p95_s, one.ttft_p95_s, one.tpot_p95_s))
                + [w for w in (unpriced_overflow(self.spec, ev),
                               past_window_note(self.replica, self.sample, self.spec.workload.summarize_at_tokens))
                   if w])

    def to_dict(self) -> dict:
        e, ev, r, one = self.economics, self.at, self.replica, self.search.single_agent
        kv_per_token = r.step.kv_bytes_per_token
        return {
            "agents_per_replica": ev.agents,
            "agents_per_replica_max": self.search.agents,
            "agents_per_replica_source": "analytic",
            "binding_constraint": self.search.binding_constraint,
            "meets_slo": ev.meets_latency,
            "slo_failed": list(ev.slo.failed),
            "slo_verdict": slo_table(self.spec.slo, ev.task_latency_p95_s, ev.ttft_p95_s, ev.tpot_p95_s),
            "binding_slo": self.binding_slo,
            "single_agent_task_latency_p95_s": one.task_latency_p95_s,
            "warnings": self.warnings_at(ev.ttft_p95_s, self.tpot_p95_s),
            "fits_kv_memory": ev.fits_memory,
            "slo": {"task_latency_p95_s": self.spec.slo.task_latency_p95_s, "ttft_p95_s": self.spec.slo.ttft_p95_s,
                    "tpot_p95_s": self.spec.slo.tpot_p95_s,
                    "output_speed_tokens_per_s": self.spec.slo.output_speed_tokens_per_s},
            "task_latency_s": {"mean": ev.task_latency_mean_s, "p50": ev.task_latency_p50_s,
                               "p95": ev.task_latency_p95_s, "p99": ev.task_latency_p99_s},
            "residence_breakdown_s": {"queue": ev.queue_s, "prefill": ev.prefill_s, "decode": ev.decode_s,
                                      "tool": ev.tool_s, "kv_transfer": ev.kv_transfer_s},
            "ttft_p95_s": ev.ttft_p95_s,
            "tpot_p95_s": self.tpot_p95_s,
            "time_per_output_token_s": (ev.loop.decode_iteration_s / self.sample.accepted_tokens_per_iteration
                                        if self.tpot_p95_s is not None else None),
            "calls_per_session": self.sample.mean_calls,
            "decode_batch_mean": ev.loop.decode_batch_mean,
            "running_batch_mean": ev.loop.running_batch_mean,
            "engine_utilisation": ev.loop.engine_utilisation,
            "prefill_utilisation": ev.prefill_utilisation,
            "freed_context_hit_rate": ev.freed_context_hit_rate,
            "kv_overflow_share": ev.kv_overflow_share,
            "compute_bound_share": ev.loop.compute_share,
            "kv_tokens_resident_mean": ev.kv_bytes_resident_mean / kv_per_token,
            "kv_tokens_resident_p95": ev.kv_bytes_resident_p95 / kv_per_token,
            "kv_tokens_capacity": r.kv_capacity_bytes / kv_per_token,
            "kv_replication": r.step.kv_replication,
            "kv_bytes_per_token": kv_per_token,
            "kv_capacity_bytes": r.kv_capacity_bytes,
            "weight_bytes": r.memory.weight_bytes,
            "draft_weight_bytes": r.memory.draft_weight_bytes,
            "draft_kv_bytes": r.memory.draft_kv_bytes / r.step.kv_replication,
            "tokens_per_s": self.tokens_per_s,
            "sessions_per_s": ev.session_throughput_per_s,
            "replica": {"gpus": r.gpus + self.prefill_gpus, "decode_gpus": r.gpus, "prefill_gpus": self.prefill_gpus,
                        "gpu": r.gpu.name, "gpu_overridden": list(r.gpu.overridden), "model": r.arch.name,
                        "layout": r.step.parallel.to_dict(),
                        "disaggregation": self._disaggregation_dict(),
                        "power_w": e.replica_power_w, "facility_power_w": e.facility_power_w,
                        "provisioned_power_w": e.provisioned_power_w},
            "agents_per_mw": e.agents_per_mw,
            "agents_per_mw_provisioned": e.agents_per_mw_provisioned,
            "energy_per_session_j": e.energy_per_session_j,
            "facility_energy_per_session_j": e.facility_energy_per_session_j,
            "cost_per_session_usd": e.cost_per_session_usd,
            "cost_breakdown_usd": {"electricity": e.electricity_cost_per_session_usd,
                                   "gpu_time": e.gpu_time_cost_per_session_usd},
            "api_cost_per_session_usd": self.api_cost_per_session_usd,
            "fleet": None if self.fleet is None else {
                "agents": self.fleet.agents, "replicas": self.fleet.replicas, "gpus": self.fleet.gpus,
                "facility_power_w": self.fleet.facility_power_w,
                "provisioned_power_w": self.fleet.provisioned_power_w},
            "sources": {"gpu": r.gpu.source, "gpu_power": r.gpu.power_source, "model": r.arch.source,
                        "provisioned_power": r.power.nameplate_source,
                        "step_time": r.step.source_detail},
            "step_time_source": r.step.source,
            "serving_policy": r.policy.to_dict(),
            "routing": routing_of(self.spec).to_dict(),
        }


def _smaller_kv_dtype(spec: Spec, replica: Replica) -> str | None:
    """The next smaller KV dtype the replica's engine can store on its GPU, or None (already the smallest)."""
    from apmw.perf.replica import kv_dtype_refusal

    smaller = {"bf16": "fp8", "fp16": "fp8", "fp8": "fp4", "int8": "int4"}.get(spec.model.kv_dtype)
    if smaller is None or kv_dtype_refusal(replica.gpu, smaller, replica.policy.engine):
        return None
    return smaller


def _explain_infeasible(spec: Spec, replica: Replica, result: SearchResult) -> str:
    ev = result.first_failure     # the evaluation at N = 1
    if not ev.fits_memory:
        smaller = _smaller_kv_dtype(spec, replica)
        kv = f"kv_dtype {smaller} (now {spec.model.kv_dtype}), " if smaller else ""
        return (f"no number of agents fits: one session's KV (p95 {ev.kv_bytes_resident_p95 / 1e9:.1f} GB) exceeds "
                f"the replica's KV memory ({ev.kv_capacity_bytes / 1e9:.1f} GB). Use more GPUs per replica, "
                f"{kv}or shorter contexts (summarisation).")
    parts = {"queue": ev.queue_s, "prefill": ev.prefill_s, "decode": ev.decode_s, "tool": ev.tool_s,
             "kv_transfer": ev.kv_transfer_s}
    top = max(parts, key=lambda k: parts[k])
    detail = ", ".join(f"{k} {_seconds(v)}" for k, v in parts.items() if v > 0)
    slo, missed = spec.slo, set(ev.slo.failed)
    failures = []
    if "task_latency_p95" in missed:
        disagg = spec.serving.disaggregation
        if top == "tool":
            need = "shorter tool waits or tasks (a faster replica helps only the model's share)"
        elif top == "kv_transfer":
            # KV moved over a link (the tool-wait offload's reload, the prefill workers' hand-off), which the
            # replica's speed does not touch
            links = []
            if disagg is not None:
                links.append("a faster KV link from the prefill workers (serving.disaggregation."
                             f"kv_transfer_bandwidth_bytes_per_s, now {disagg.kv_transfer_bandwidth_bytes_per_s / 1e9:g}"
                             " GB/s per prefill GPU)")
            if spec.serving.tool_wait_kv_policy == "offload":
                links.append("a faster host link for the offloaded KV (serving.offload_bandwidth_bytes_per_s, now "
                             f"{spec.serving.offload_bandwidth_bytes_per_s / 1e9:g} GB/s), or tool_wait_kv_policy "
                             "retain or evict")
            need = ", or ".join(links)
        elif top == "queue" and disagg is not None:
            # a disaggregated replica queues its prompts for the prefill workers its decode workers share
            need = (f"more prefill workers for its {disagg.decode_workers} decode worker(s) "
                    f"(serving.disaggregation.prefill_workers, now {disagg.prefill_workers}), fewer decode workers, "
                    "or larger prefill workers (prefill_gpus)")
        else:
            need = "a faster replica (more GPUs per replica, a faster GPU, lower-byte weights)"
        failures.append(
            f"p95 task latency {_seconds(ev.task_latency_p95_s)} against task_latency_p95_s {slo.task_latency_p95_s:g} s "
            f"(mean {_seconds(ev.task_latency_mean_s)}: {detail}; {top} dominates). Needed: an SLO of at least "
            f"{_at_least_s(ev.task_latency_p95_s)} s, or {need}")
    if "ttft_p95" in missed:
        failures.append(
            f"TTFT p95 {ev.ttft_p95_s:.3f} s against ttft_p95_s {slo.ttft_p95_s:g} s (prefill of the longest prompts "
            f"dominates). Needed: ttft_p95_s of at least {ev.ttft_p95_s:.2f} s, "
            + ("" if spec.serving.prefix_caching else "prefix caching, ")
            + "a larger max_batched_tokens (fewer chunks to a prompt), or more GPUs per replica")
    if "tpot_p95" in missed:
        failures.append(
            f"time per output token p95 {ev.tpot_p95_s * 1e3:.1f} ms against tpot_p95_s {slo.tpot_p95_s:g} s. "
            f"Needed: tpot_p95_s of at least {ev.tpot_p95_s:.3f} s, or a faster replica")
    if "output_speed" in missed:
        failures.append(
            f"output speed {1 / ev.tpot_p95_s:.1f} tokens/s per agent (p95 time per output token "
            f"{ev.tpot_p95_s * 1e3:.1f} ms) against output_speed_tokens_per_s {slo.output_speed_tokens_per_s:g}. Needed: "
            f"output_speed_tokens_per_s of at most {1 / ev.tpot_p95_s:.1f}, or a faster replica")
    return "no number of agents meets the SLO; even one agent alone has " + "; and ".join(failures) + "."


def plan(spec: Spec, agents: int | None = None, efficiency: Efficiency | None = None,
         step: StepModel | None = None, guess: int | None = None) -> Plan:
    """Solve the spec. With ``agents``, report the closed loop at exactly that many agents.

    ``efficiency`` prices iterations with the roofline at those efficiencies instead of the built-in
    step model; ``step`` with that step model (a server's measured one, ``apmw bench --calibrate``).
    ``guess`` starts the N* search near a neighbouring spec's N* (:func:`apmw.capacity.search.search`).
    """
    spec = require_spec(spec, "plan")
    if agents is not None:
        agents = check_agents(agents, MAX_AGENTS)
    if guess is not None:
        guess = check_agents(guess, MAX_AGENTS, "guess")
    if step is not None:
        replica = replica_from_spec(spec, step=step)
    else:
        replica = (replica_from_spec(spec) if efficiency is None
                   else replica_from_spec(spec, efficiency, calibrated=False))
    model = closed_loop_model(spec, replica)
    sample = model.sample
    refuse_past_window(spec, replica, sample)
    refuse_unmeasurable_slo(spec, sample)
    result = search(spec, replica, sample, model, guess)
    if agents is None:
        if result.agents == 0:
            raise InfeasibleError(_explain_infeasible(spec, replica, result),
                                  NO_SLO if result.first_failure.fits_memory else NO_KV_ROOM)
        at = result.at_optimum
        assert at is not None      # N* > 0 was checked above
    else:
        at = model.evaluate(agents)
    stage = model.prefill
    econ = economics(spec, replica, at.agents, at.task_latency_mean_s, at.loop.engine_utilisation,
                     at.loop.compute_share, prefill_gpus=stage.gpus if stage else 0,
                     prefill_utilisation=at.prefill_utilisation or 0.0,
                     prefill_compute_share=stage.compute_share if stage else 1.0)
    fleet = None
    if spec.fleet.target_agents is not None:
        fleet = fleet_size(spec.fleet.target_agents, at.agents, replica.gpus + (stage.gpus if stage else 0),
                           econ.facility_power_w, econ.provisioned_power_w, replicas_per_deployment(spec))
    return Plan(spec=spec, replica=replica, sample=sample, search=result, at=at, economics=econ, fleet=fleet)


# Calls past the model's context window that a plan prices as if served (an engine refuses them; an agent
# framework truncates or summarises first): any are noted with their share; where they are most calls, the
# workload is not one this model runs (nine calls in ten), and the plan is refused.
MAX_PAST_WINDOW_SHARE = 0.9


def past_window_note(replica: Replica, sample: SessionSample, summarize_at_tokens: int | None = None) -> str | None:
    """A warning where some sampled calls exceed the model's context window (None where none do). Where the
    workload already summarises, what passes the window is a call's new input and output on top of a history
    just under the cap."""
    share = sample.call_past_window_share
    if share <= 0:
        return None
    amount = f"{share:.2%}" if share >= 0.0001 else "under 0.01%"
    fix = ("set workload.summarize_at_tokens below the window to model what the agent does instead"
           if summarize_at_tokens is None else
           f"their history is under workload.summarize_at_tokens ({summarize_at_tokens:,}) but their new input and "
           "output carry them past it: lower the cap, or bound the new input's tail (a 'quantiles' table)")
    return (f"{amount} of the sampled calls hold more tokens (prompt and output) than {replica.arch.name}'s "
            f"{replica.arch.max_context_tokens:,}-token context window; an engine refuses them, and apmw prices them "
            f"as if served: {fix}")


def refuse_past_window(spec: Spec, replica: Replica, sample: SessionSample) -> None:
    """Refuse a workload whose calls exceed the model's context window more than rarely."""
    share = sample.call_past_window_share
    if share > MAX_PAST_WINDOW_SHARE:
        raise ApmwError(
            f"{share:.1%} of the workload's calls hold more tokens (prompt and output) than {replica.arch.name}'s "
            f"context window of {replica.arch.max_context_tokens:,} tokens (max_position_embeddings in its "
            "config.json), and an engine refuses such requests. Set workload.summarize_at_tokens below the window "
            "(the agent summarises its history), shorten the workload's prompts, or use a model with a longer window")


def refuse_unmeasurable_slo(spec: Spec, sample: SessionSample) -> None:
    """Refuse a per-token SLO (``tpot_p95_s``, ``output_speed_tokens_per_s``) where no call outputs a second token:
    a call's time per output token is the gap between its tokens, and the simulator, like a load test, measures
    none (an SLO on a figure not measured fails, :func:`apmw.capacity.slo.check_slo`)."""
    if sample.call_decode_iters > 0:
        return
    for field in ("tpot_p95_s", "output_speed_tokens_per_s"):
        if getattr(spec.slo, field) is not None:
            raise ApmwError(f"slo.{field} is set, but no call of this workload outputs more than one token "
                            "(workload.output_tokens_per_call), so no call has a time per output token to hold to "
                            f"it: remove slo.{field}, or give the calls the output they make")


def sweep(result: Plan, agents: list[int]) -> list[Evaluation]:
    """The closed loop of ``result``'s replica and sessions at each agent count (for curves)."""
    model = ClosedLoopModel(result.spec, result.replica, result.sample)
    return [model.evaluate(n) for n in agents]
