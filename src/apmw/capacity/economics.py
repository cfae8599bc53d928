"""Agents per megawatt, energy and money per session, fleet size (MODEL.md section 6).

Replica power (modelled IT, facility and provisioned) is :class:`apmw.perf.PowerModel`'s, the
one power formula; from it:

    agents/MW   = N* / (P_facility / 1e6)
    energy/session (IT, J)   = P_replica * R / N*
    cost/session (USD)       = P_facility * R / N* (in kWh) * price + g * gpu_hour_usd * R / N* / 3600

``R / N*`` is the replica time one session consumes: N* sessions share the
replica for R seconds each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from apmw.perf import GpuGroup, Replica
from apmw.spec import Spec

J_PER_KWH = 3.6e6


def energy_text(joules: float) -> str:
    """Energy in the unit its size reads best in: "23.4 Wh", "1.25 kWh", "3.2 MWh"."""
    wh = joules / 3600.0
    for factor, unit in ((1e6, "MWh"), (1e3, "kWh")):
        if wh >= factor:
            return f"{wh / factor:,.2f} {unit}"
    return f"{wh:,.1f} Wh" if wh >= 1 else f"{wh * 1e3:,.0f} mWh"


@dataclass(frozen=True)
class Economics:
    replica_power_w: float
    facility_power_w: float
    provisioned_power_w: float
    agents_per_mw: float
    agents_per_mw_provisioned: float
    energy_per_session_j: float
    facility_energy_per_session_j: float
    electricity_cost_per_session_usd: float
    gpu_time_cost_per_session_usd: float

    @property
    def cost_per_session_usd(self) -> float:
        return self.electricity_cost_per_session_usd + self.gpu_time_cost_per_session_usd


def economics(spec: Spec, replica: Replica, agents: int, task_latency_mean_s: float,
              engine_utilisation: float, compute_share: float, prefill_gpus: float = 0,
              prefill_utilisation: float = 0.0, prefill_compute_share: float = 1.0) -> Economics:
    """``prefill_gpus`` etc. describe a disaggregated prefill instance counted with the replica."""
    power = replica.power
    g = replica.gpus + prefill_gpus
    replica_w = power.it_power_w(GpuGroup(replica.gpus, engine_utilisation, compute_share),
                                 GpuGroup(prefill_gpus, prefill_utilisation, prefill_compute_share))
    facility_w = power.facility_power_w(replica_w)
    provisioned_w = power.provisioned_power_w(g)
    per_session_s = task_latency_mean_s / agents if agents > 0 else math.inf
    it_j = replica_w * per_session_s
    facility_j = facility_w * per_session_s
    return Economics(
        replica_power_w=replica_w,
        facility_power_w=facility_w,
        provisioned_power_w=provisioned_w,
        # no draw at all only with no agents (a busy GPU draws at least apmw.spec.economics.MIN_BUSY_WATTS)
        agents_per_mw=agents / (facility_w / 1e6) if facility_w > 0 else 0.0,
        agents_per_mw_provisioned=agents / (provisioned_w / 1e6),
        energy_per_session_j=it_j,
        facility_energy_per_session_j=facility_j,
        electricity_cost_per_session_usd=facility_j / J_PER_KWH * spec.cost.electricity_usd_per_kwh,
        gpu_time_cost_per_session_usd=g * spec.cost.gpu_hour_usd * per_session_s / 3600.0,
    )


@dataclass(frozen=True)
class FleetSize:
    agents: int
    replicas: int
    gpus: int                       # whole: replicas come in whole deployments
    facility_power_w: float
    provisioned_power_w: float


def fleet_size(target_agents: int, agents_per_replica: int, gpus_per_replica: float, facility_power_w: float,
               provisioned_power_w: float, replicas_per_deployment: int = 1) -> FleetSize:
    """The replicas ``target_agents`` need, in whole deployments of ``replicas_per_deployment`` (the decode workers
    that share a disaggregated replica's prefill workers), so the GPUs they hold are whole."""
    replicas = whole_deployments(math.ceil(target_agents / agents_per_replica), replicas_per_deployment)
    return FleetSize(agents=target_agents, replicas=replicas, gpus=round(replicas * gpus_per_replica),
                     facility_power_w=replicas * facility_power_w,
                     provisioned_power_w=replicas * provisioned_power_w)


def whole_deployments(replicas: int, replicas_per_deployment: int) -> int:
    """``replicas`` rounded up to whole deployments of ``replicas_per_deployment``."""
    return math.ceil(replicas / replicas_per_deployment) * replicas_per_deployment


def replicas_per_deployment(spec: Spec) -> int:
    """The fewest replicas deployed together: under disaggregation each replica is a decode worker with its share
    of the prefill workers' GPUs, and a fleet holds whole prefill workers, so the smallest whole step is
    ``decode_workers / gcd(prefill_workers, decode_workers)`` (2 prefill and 4 decode workers: 2 replicas and one
    prefill worker); 1 where prefill runs on the replica."""
    d = spec.serving.disaggregation
    return d.decode_workers // math.gcd(d.prefill_workers, d.decode_workers) if d is not None else 1


def api_cost_per_task_usd(spec: Spec, input_tokens: float, prefilled_tokens: float, output_tokens: float
                          ) -> float | None:
    """What one task's tokens cost at ``cost.api_usd_per_million_tokens`` (None without a price).

    ``prefilled_tokens`` are those the API computes, :attr:`apmw.capacity.sessions.SessionSample.api_prefill_tokens`:
    each call's new tokens. The rest (``input - prefilled``: the system prompt and the session's history) are
    priced as the API's cached input, an ASSUMPTION that its context cache keeps a session's prefix between calls
    (as DeepSeek's and OpenAI's do for repeated prefixes), whatever the self-hosted replica's routing or
    tool-wait policy would find."""
    price = spec.cost.api_usd_per_million_tokens
    if price is None:
        return None
    cached = price.input if price.cached_input is None else price.cached_input
    hits = max(input_tokens - prefilled_tokens, 0.0)
    return (min(prefilled_tokens, input_tokens) * price.input + hits * cached + output_tokens * price.output) / 1e6

