"""A day of demand to replicas, megawatts and dollars, hour by hour (``apmw fleet``).

Each hour ``h`` of ``fleet.tasks_per_hour`` starts ``lambda_h`` tasks per second. By Little's law
the fleet then holds ``N_h = lambda_h * R`` agents at once, ``R`` the mean task time at the load each
replica carries. The hour gets

    replicas_h = max(min_replicas, ceil(N_h * (1 + headroom) / N*))

with ``N*`` the agents one replica sustains within the SLO (``apmw plan``). Each replica then
carries ``n_h = N_h / replicas_h <= N*`` agents, whose closed loop gives ``R`` again (lighter load,
shorter tasks): the two are solved together by fixed-point iteration, starting from ``R`` at ``N*``
(an upper bound, so the iteration only lowers ``N_h``). Near N*, where R rises steeply with the load,
two loads can satisfy both: a lower one, and one just below N* that a burst of arrivals tips into. Starting
from above, the iteration keeps the higher, a stability margin the headroom alone does not give: with the
lower, the bundled coding-agent's peak hour would take 26 replicas instead of 30, and its simulated day
(``apmw fleet --simulate``, seed 7, tests/sim/test_fleet_day_sim.py) queues 9,834 tasks there instead of none. Power is the replica's at ``n_h`` agents
(:class:`apmw.perf.PowerModel`, the one power formula), for every replica that is up; GPU time is
billed for every replica that is up. A month is 365.25 / 12 days.

With ``fleet.power_cap_mw`` (the hall's power), the hours whose provisioned facility power does
not fit are named, and the largest fleet that fits is given: ``floor(cap / provisioned power per
replica)`` replicas at ``admitted / (1 + headroom)`` agents each (the agents a replica is admitted:
:func:`admission_cap`), and the tasks per hour they start at that load's task time (a day of that demand
is sized at those replicas).

The day is a forecast that repeats, so the autoscaler scales ahead of it: the replicas the next
hour adds start ``fleet.scale_up_s`` before it (provisioning, weight load, warm-up), billed and
drawing idle power meanwhile; a replica no longer needed stays up ``fleet.scale_down_delay_s``
(hysteresis), and the hour's tasks spread over every replica up.

Routing (``fleet.routing``, :mod:`apmw.capacity.routing`): under affinity (the default) N* does not
depend on the replica count. Under random or least-loaded routing it does (a returning call finds its
context on about 1 replica in R), so the day is sized at the N* of its own peak replica count: from the
plan's, the peak is recomputed until it settles (``ROUTING_ITERATIONS`` at most; N* falls as R grows, so
the peak only rises). :func:`routing_comparison` gives every policy's N*, prefix hit rate and prefilled
tokens at that peak replica count.

Not modelled here: demand the forecast misses (what a short fleet does to tasks: `apmw fleet
--simulate`, apmw.sim.fleet_day); each hour is a steady state. Several workloads on pools of several
GPU types: :mod:`apmw.capacity.fleet_mix`, which sizes each hour with :func:`day_hours` and a
:class:`Sizing` per hour.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

from apmw.capacity.api_inputs import require_plan
from apmw.capacity.closed_loop import ClosedLoopModel
from apmw.capacity.disaggregation import PrefillStage
from apmw.capacity.economics import J_PER_KWH, economics, replicas_per_deployment, whole_deployments
from apmw.capacity.evaluate import Evaluation
from apmw.capacity.plan import Plan, plan
from apmw.capacity.routing import POLICIES, Routing, routing_of, with_routing
from apmw.capacity.search import largest_below
from apmw.errors import ApmwError
from apmw.perf import GpuGroup, Replica
from apmw.spec import Spec
from apmw.spec.economics import Capex

HOURS = 24
# The days of a weekly profile (fleet.tasks_per_hour of 168 values), Monday first.
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def hour_label(hour: int, period_hours: int) -> str:
    """An hour of the period as people read it: ``11`` in a day, ``Tue 11`` in a week."""
    return f"{hour:02d}" if period_hours == HOURS else f"{WEEKDAYS[hour // HOURS]} {hour % HOURS:02d}"
DAYS_PER_MONTH = 365.25 / 12
# Fixed-point iterations of N_h = lambda_h * R(N_h / replicas_h); R falls with the load and settles in a few.
LITTLE_ITERATIONS = 8
# Re-plans of a spreading router at the day's peak replica count, until the peak settles.
ROUTING_ITERATIONS = 6


@dataclass(frozen=True)
class FleetHour:
    hour: int
    tasks: float                     # tasks started in the hour
    concurrent_agents: float         # N_h = lambda_h * R
    task_latency_mean_s: float       # R at the hour's load per replica
    replicas_needed: int             # the fewest that keep the headroom under N*
    replicas: int                    # up and serving: needed, or more while scale-down waits
    replicas_warming: int            # started in this hour for the next one, up for fleet.scale_up_s
    gpus: int
    gpu_hours: float                 # GPUs up for the hour, plus the warming ones for their share of it
    agents_per_replica: float        # n_h = N_h / replicas
    it_power_w: float
    facility_power_w: float
    provisioned_power_w: float
    gpu_cost_usd: float
    electricity_cost_usd: float
    routing: str = "affinity"        # fleet.routing, the router's policy


@dataclass(frozen=True)
class FleetDay:
    agents_per_replica_max: int      # N*, from the plan
    agents_per_replica_admitted: int  # the most agents the fleet gives a replica (admission_cap): N* or fewer
    headroom: float
    min_replicas: int
    scale_up_s: float
    scale_down_delay_s: float
    hours: list[FleetHour]
    api_cost_per_task_usd: float | None = None     # the same task's tokens at cost.api_usd_per_million_tokens
    power_cap_mw: float | None = None
    provisioned_w_per_replica: float = 0.0
    task_latency_at_admitted_s: float = 0.0
    routing: Routing = Routing()
    routing_comparison: tuple[dict, ...] = ()
    capex: Capex | None = None       # cost.capex: the GPUs' purchase, for the owned fleet's month
    gpus_per_replica: float = 0.0
    replicas_per_deployment: int = 1     # replicas come up in whole deployments of this many (disaggregated)

    @property
    def hours_over_power_cap(self) -> list[int]:
        cap = self.power_cap_mw
        return [] if cap is None else [h.hour for h in self.hours if h.provisioned_power_w > cap * 1e6 * (1 + 1e-12)]

    def within_power_cap(self) -> dict | None:
        """How big a fleet fits in the cap: replicas, the agents they hold with the headroom (the admitted agents
        / (1 + headroom) each, as the hours are sized), and the tasks per hour they start at that load's task time
        (a day of that demand is sized at these replicas)."""
        if self.power_cap_mw is None:
            return None
        replicas = math.floor(self.power_cap_mw * 1e6 / self.provisioned_w_per_replica + 1e-9)
        replicas -= replicas % self.replicas_per_deployment
        agents = replicas * self.agents_per_replica_admitted / (1 + self.headroom)
        return {"replicas": replicas, "concurrent_agents": agents,
                "tasks_per_hour": agents / self.task_latency_at_admitted_s * 3600.0}

    @property
    def days(self) -> float:
        """Days in the period the hours cover (1, or 7 for a weekly profile): "per day" figures average over them."""
        return len(self.hours) / HOURS

    @property
    def tasks_per_day(self) -> float:
        return sum(h.tasks for h in self.hours) / self.days

    @property
    def cost_per_day_usd(self) -> float:
        return sum(h.gpu_cost_usd + h.electricity_cost_usd for h in self.hours) / self.days

    @property
    def facility_mwh_per_day(self) -> float:
        return sum(h.facility_power_w for h in self.hours) / 1e6 / self.days      # one hour each

    def owned(self) -> dict | None:
        """The same day on GPUs bought (``cost.capex``) instead of billed by the hour: the fleet owns the most
        GPUs any hour has up or warming, each amortised straight-line over the years whether busy or not, and
        pays the day's electricity as billed."""
        capex = self.capex
        if capex is None:
            return None
        gpus = max(round((h.replicas + h.replicas_warming) * self.gpus_per_replica) for h in self.hours)
        capex_month = gpus * capex.per_gpu_usd / (capex.years * 12)
        electricity_month = sum(h.electricity_cost_usd for h in self.hours) / self.days * DAYS_PER_MONTH
        month = capex_month + electricity_month
        tasks_month = self.tasks_per_day * DAYS_PER_MONTH
        return {"gpus": gpus, "usd_per_gpu": capex.per_gpu_usd, "years": capex.years,
                "capex_usd": gpus * capex.per_gpu_usd, "gpu_hour_usd": capex.gpu_hour_usd,
                "capex_per_month_usd": capex_month, "electricity_per_month_usd": electricity_month,
                "cost_per_month_usd": month, "cost_per_task_usd": month / tasks_month if tasks_month else None}

    def to_dict(self) -> dict:
        peak = max(self.hours, key=lambda h: h.replicas)
        day_usd = self.cost_per_day_usd
        return {
            "agents_per_replica_max": self.agents_per_replica_max,
            "agents_per_replica_admitted": self.agents_per_replica_admitted,
            "headroom": self.headroom,
            "min_replicas": self.min_replicas,
            "scale_up_s": self.scale_up_s,
            "scale_down_delay_s": self.scale_down_delay_s,
            "period_hours": len(self.hours),
            "tasks_per_day": self.tasks_per_day,
            "peak_hour": peak.hour,
            "peak_hour_label": hour_label(peak.hour, len(self.hours)),
            "peak_replicas": peak.replicas,
            "peak_gpus": peak.gpus,
            "peak_facility_mw": max(h.facility_power_w for h in self.hours) / 1e6,
            "peak_provisioned_mw": max(h.provisioned_power_w for h in self.hours) / 1e6,
            "average_facility_mw": self.facility_mwh_per_day / HOURS,
            "gpu_hours_per_day": sum(h.gpu_hours for h in self.hours) / self.days,
            "facility_mwh_per_day": self.facility_mwh_per_day,
            "facility_mwh_per_month": self.facility_mwh_per_day * DAYS_PER_MONTH,
            "cost_per_day_usd": day_usd,
            "cost_per_month_usd": day_usd * DAYS_PER_MONTH,
            "cost_per_task_usd": day_usd / self.tasks_per_day if self.tasks_per_day else None,
            "power_cap_mw": self.power_cap_mw,
            "hours_over_power_cap": self.hours_over_power_cap,
            "within_power_cap": self.within_power_cap(),
            "api_cost_per_task_usd": self.api_cost_per_task_usd,
            "api_cost_per_day_usd": (None if self.api_cost_per_task_usd is None
                                     else self.api_cost_per_task_usd * self.tasks_per_day),
            "owned": self.owned(),
            "routing": self.routing.to_dict(),
            "routing_comparison": list(self.routing_comparison),
            "hours": [asdict(h) for h in self.hours],
        }


def fleet_day(result: Plan, compare_routing: bool = True) -> FleetDay:
    """The spec's day of demand (``fleet.tasks_per_hour``) on replicas sized by ``result`` (a plan at N*).

    Under a router that spreads a task's calls (``fleet.routing`` random or least_loaded) the plan is
    redone at the day's peak replica count until that settles. ``compare_routing`` adds every policy's
    figures at the peak replica count (:func:`routing_comparison`)."""
    result = require_plan(result, "fleet_day")
    day = _day(result)
    routing = routing_of(result.spec)
    if routing.policy != "affinity":
        for _ in range(ROUTING_ITERATIONS):
            peak = max(max(h.replicas for h in day.hours), 1)
            if peak == routing.replicas:
                break
            routing = Routing(routing.policy, peak)
            result = plan(with_routing(result.spec, routing.policy, peak))
            day = _day(result)
    else:
        routing = Routing("affinity", max(max(h.replicas for h in day.hours), 1))
    comparison = routing_comparison(result, routing.replicas) if compare_routing else ()
    return dataclasses.replace(day, routing=routing, routing_comparison=comparison)


def routing_comparison(result: Plan, replicas: int) -> tuple[dict, ...]:
    """Each routing policy over ``replicas`` replicas: N* per replica, the share of prompt tokens its prefix
    cache serves at N*, and the prompt tokens one replica prefills per second there (least_loaded is
    priced as random: :mod:`apmw.capacity.routing`)."""
    rows = []
    for policy in POLICIES:
        try:
            p = plan(with_routing(result.spec, policy, replicas))
        except ApmwError as exc:        # a spec the policy cannot serve (or no N meets the SLO under it)
            rows.append({"policy": policy, "replicas": replicas, "agents_per_replica": None,
                         "binding_constraint": None, "prefix_hit_rate": None,
                         "prefill_tokens_per_s_per_replica": None, "kv_tokens_resident_mean": None,
                         "task_latency_p95_s": None, "refused": str(exc).splitlines()[0]})
            continue
        tokens, per_s = p.tokens_per_task, p.tokens_per_s
        rows.append({"policy": policy, "replicas": replicas, "agents_per_replica": p.agents_per_replica,
                     "binding_constraint": p.search.binding_constraint,
                     "prefix_hit_rate": 1.0 - tokens["prefill"] / tokens["input"] if tokens["input"] else None,
                     "prefill_tokens_per_s_per_replica": per_s["prefill"],
                     "kv_tokens_resident_mean": p.at.kv_bytes_resident_mean / p.replica.step.kv_bytes_per_token,
                     "task_latency_p95_s": p.at.task_latency_p95_s})
    return tuple(rows)


@dataclass(frozen=True)
class Sizing:
    """What sizing an hour asks of one replica: its closed loop at any load and the most agents it takes.

    :func:`sizing_of` gives a plan's; a shared pool of several workloads has one per hour, each at that
    hour's mix of tasks (:mod:`apmw.capacity.fleet_mix`)."""

    spec: Spec                                  # fleet policy (headroom, minimum, delays), prices, routing
    replica: Replica
    stage: PrefillStage | None                  # a disaggregated prefill instance counted with the replica
    agents_max: int                             # the most agents a replica is given (admission_cap)
    slowest_s: float                            # mean task time there
    fastest_s: float                            # ... at one agent
    evaluate: Callable[[int], Evaluation]       # the closed loop at n agents


def sizing_of(result: Plan) -> Sizing:
    """The sizing of ``result``'s replica: its closed loop (cached per load: the hours share most of theirs)."""
    model = ClosedLoopModel(result.spec, result.replica, result.sample)
    evaluate = functools.cache(model.evaluate)
    cap = admission_cap(lambda c: evaluate(c).task_latency_mean_s, result.agents_per_replica)
    return Sizing(spec=result.spec, replica=result.replica, stage=model.prefill, agents_max=cap,
                  slowest_s=evaluate(cap).task_latency_mean_s, fastest_s=evaluate(1).task_latency_mean_s,
                  evaluate=evaluate)


def admission_cap(task_time_s: Callable[[int], float], n_star: int) -> int:
    """The most agents a fleet gives one replica: N*, or fewer where a replica at N* finishes fewer tasks a second
    than with fewer agents, ``c / R(c)`` (``task_time_s``: R, the mean task time at ``c`` agents) falling towards N*
    as the KV pool fills (the bundled coding agent: 153.9 tasks an hour at 24 agents, 139.1 at its N* of 27). Then
    the count where it peaks (taken as rising to one peak and falling after it).

    A fleet whose replicas take up to N* each can settle in that slower state: tasks arrive faster than replicas at
    N* finish them, so they stay at N*, while at the peak count the same replicas keep up. Sizing for it needed
    more replicas under a looser SLO (a larger N*) than under a tighter one; sizing for the lower state alone left
    the simulated day's fleet short (tasks queued), since nothing kept its replicas from filling up to N*."""
    def done_per_s(c: int) -> float:
        return c / task_time_s(c)

    if n_star <= 1 or done_per_s(n_star) >= done_per_s(n_star - 1):
        return n_star
    return largest_below(lambda c: c == 1 or done_per_s(c) >= done_per_s(c - 1), 1, n_star)


def _day(result: Plan) -> FleetDay:
    """The day on replicas sized by ``result``, routing as its spec says."""
    spec = result.spec
    rates = spec.fleet.tasks_per_hour
    if rates is None:
        raise ApmwError("apmw fleet needs fleet.tasks_per_hour in the spec: the tasks started in each hour from hour 0, "
                        "24 values for a day or 168 for a week from Monday 00:00 (fleet.target_agents alone is sized "
                        "by apmw plan)")
    sizing = sizing_of(result)
    return FleetDay(agents_per_replica_max=result.agents_per_replica, agents_per_replica_admitted=sizing.agents_max,
                    headroom=spec.fleet.headroom,
                    min_replicas=spec.fleet.min_replicas, scale_up_s=spec.fleet.scale_up_s,
                    scale_down_delay_s=spec.fleet.scale_down_delay_s,
                    hours=day_hours([sizing] * len(rates), rates),
                    api_cost_per_task_usd=result.api_cost_per_session_usd, power_cap_mw=spec.fleet.power_cap_mw,
                    provisioned_w_per_replica=result.economics.provisioned_power_w,
                    task_latency_at_admitted_s=sizing.slowest_s, capex=spec.cost.capex,
                    gpus_per_replica=result.replica.gpus + result.prefill_gpus,
                    replicas_per_deployment=replicas_per_deployment(spec))


def day_hours(sizings: Sequence[Sizing], rates: Sequence[float]) -> list[FleetHour]:
    """The period's hours (24, or 168 for a week), hour ``h`` starting ``rates[h]`` tasks on replicas sized by
    ``sizings[h]`` (the fleet policy is the first sizing's spec's); the period repeats."""
    period = len(rates)
    needed = [_needed(sizings[h], rates[h]) for h in range(period)]
    fleet = sizings[0].spec.fleet
    up = _kept_up(needed, fleet.scale_down_delay_s)
    ahead = fleet.scale_up_s > 0            # replicas that start at once are never seen warming
    return [_hour(sizings[h], h, rates[h], needed[h], up[h], max(up[(h + 1) % period] - up[h], 0) if ahead else 0)
            for h in range(period)]


def _kept_up(needed: list[int], scale_down_delay_s: float) -> list[int]:
    """Replicas up each hour: the most any of the last ``ceil(delay / 1 h)`` hours needed (the period repeats)."""
    back = math.ceil(scale_down_delay_s / 3600.0 - 1e-9)
    period = len(needed)
    return [max(needed[(h - j) % period] for j in range(back + 1)) for h in range(period)]


def _load(evaluate: Callable[[int], Evaluation], rate: float, replicas: int, n_star: int, slowest_s: float
          ) -> tuple[float, Evaluation]:
    """Agents per replica where ``n = rate * R(n) / replicas`` (Little's law), and the closed loop there.

    Starting from R at N* (the slowest), n only falls; R is taken at ceil(n) agents, never below the load."""
    n = rate * slowest_s / replicas
    at = evaluate(max(1, min(n_star, math.ceil(n - 1e-9))))
    for _ in range(LITTLE_ITERATIONS):
        n_next = rate * at.task_latency_mean_s / replicas
        if abs(n_next - n) <= 1e-9 * max(n, 1.0):
            break
        n = n_next
        at = evaluate(max(1, min(n_star, math.ceil(n - 1e-9))))
    return n, at


def _needed(sz: Sizing, tasks: float) -> int:
    """The fewest replicas whose self-consistent load, with the headroom, stays within N* each."""
    fleet = sz.spec.fleet
    n_star, slowest_s = sz.agents_max, sz.slowest_s
    rate, need = tasks / 3600.0, 1 + fleet.headroom
    replicas = max(fleet.min_replicas, math.ceil(rate * sz.fastest_s * need / n_star - 1e-9))
    upper = max(fleet.min_replicas, math.ceil(rate * slowest_s * need / n_star - 1e-9))
    unit = replicas_per_deployment(sz.spec)
    if rate <= 0 or replicas <= 0:
        return whole_deployments(replicas, unit)

    def fits(r: int) -> bool:           # more replicas carry less each: true from some count on (upper fits)
        return r >= upper or _load(sz.evaluate, rate, r, n_star, slowest_s)[0] * need <= n_star + 1e-9

    return whole_deployments(smallest_fitting(fits, replicas, upper), unit)


def smallest_fitting(fits: Callable[[int], bool], low: int, high: int) -> int:
    """The smallest count in [low, high] that ``fits``, given ``fits(high)`` and that it stays true above any count
    where it holds (bisection: a day of a billion tasks an hour asks a few dozen counts, not millions)."""
    if low >= high or fits(low):
        return low
    return largest_below(lambda r: not fits(r), low, high) + 1      # the last count that does not fit, and one


def _hour(sz: Sizing, hour: int, tasks: float, needed: int, replicas: int, warming: int) -> FleetHour:
    """The hour with its tasks spread over the ``replicas`` up, and ``warming`` more started for the next hour."""
    spec, replica, stage = sz.spec, sz.replica, sz.stage
    rate = tasks / 3600.0
    n, at = (0.0, None) if rate == 0 or replicas == 0 else _load(sz.evaluate, rate, replicas, sz.agents_max,
                                                                 sz.slowest_s)
    gpus_per_replica = replica.gpus + (stage.gpus if stage else 0)
    power = replica.power
    idle_it_w = power.it_power_w(GpuGroup(replica.gpus, 0.0, 0.0), GpuGroup(stage.gpus if stage else 0, 0.0, 0.0))
    idle_facility_w = power.facility_power_w(idle_it_w)
    if at is not None:
        econ = economics(spec, replica, at.agents, at.task_latency_mean_s, at.loop.engine_utilisation,
                         at.loop.compute_share, prefill_gpus=stage.gpus if stage else 0,
                         prefill_utilisation=at.prefill_utilisation or 0.0,
                         prefill_compute_share=stage.compute_share if stage else 1.0)
        it_w, facility_w, latency = econ.replica_power_w, econ.facility_power_w, at.task_latency_mean_s
    else:       # no task starts: the replicas kept up idle
        it_w, facility_w, latency = idle_it_w, idle_facility_w, sz.fastest_s
    # a warming replica loads weights at idle power (ASSUMPTION: loading draws no more than idling) and is
    # billed from its start, for fleet.scale_up_s of this hour
    warm_share = min(spec.fleet.scale_up_s, 3600.0) / 3600.0 * warming
    facility_total = replicas * facility_w + warm_share * idle_facility_w
    return FleetHour(
        hour=hour, tasks=tasks, concurrent_agents=n * replicas, task_latency_mean_s=latency, replicas_needed=needed,
        replicas=replicas, replicas_warming=warming,
        gpus=round(replicas * gpus_per_replica), gpu_hours=(replicas + warm_share) * gpus_per_replica, agents_per_replica=n,
        it_power_w=replicas * it_w + warm_share * idle_it_w, facility_power_w=facility_total,
        provisioned_power_w=(replicas + (warming if spec.fleet.scale_up_s > 0 else 0))
        * power.provisioned_power_w(gpus_per_replica),
        gpu_cost_usd=(replicas + warm_share) * gpus_per_replica * spec.cost.gpu_hour_usd,
        electricity_cost_usd=facility_total * 3600.0 / J_PER_KWH * spec.cost.electricity_usd_per_kwh,
        routing=spec.fleet.routing,
    )
