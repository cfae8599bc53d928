"""Mixed fleets: several workloads split into pools or sharing one, on several GPU types, each placement priced.

A fleet file (:mod:`apmw.spec.fleet_file`) lists workloads, each with its own day of demand
(``fleet.tasks_per_hour``), and the replica hardware to compare. A **pool** is a group of workloads
on replicas of one hardware; its day is sized hour by hour as ``apmw fleet`` sizes one workload's
(:mod:`apmw.capacity.fleet_day`). A **placement** is a set of pools that serves every workload:

* ``split:<hw>``: each workload on a pool of its own, all on ``hw``;
* ``split:best``: each workload on its own pool, on the hardware where its day costs least;
* ``shared:<hw>``: every workload on one pool of ``hw`` (``shared``, refused with the reason, where the
  workloads cannot share a replica whatever it is);
* ``by_model:<hw>`` and ``by_model:best``: the workloads that use the same model on one pool (the rest
  alone), all on ``hw``, or each pool on its cheapest hardware; offered where the models differ and some
  model serves several workloads.

Without a ``hardware`` list the candidates are the workloads' own: ``split:own`` puts each workload on
its spec as written (so it equals ``apmw fleet`` on each spec), and a shared pool is tried on each
distinct hardware of its workloads. Two workloads whose hardware goes by one name (``H200x8``) at two
GPU-hour prices, or as two GPUs, are refused: a pool on it is one GPU at one price (list the hardware,
each entry named, to compare both).

**A pool of one workload** is ``apmw plan`` and ``apmw fleet`` on its spec with the candidate's
hardware and price.

**A shared pool** serves its workloads' tasks on the same replicas: each hour's replica is the closed
loop of a session sample pooled from the workloads in proportion to the tasks each starts, every
workload held to its own SLO (:mod:`apmw.capacity.session_mix`). Each hour has its own mix, hence
its own N* (searched outwards from the hour before's).

**What cannot share a replica** (a pool refused with the reason, never approximated): workloads on
different models; different ``serving`` sections (one engine configuration per replica); different
``power`` sections or electricity prices (one hall); a ``fleet.routing`` other than affinity.
A shared pool takes the largest ``headroom``, ``min_replicas``, ``scale_up_s`` and
``scale_down_delay_s`` of its workloads.

**Prices.** A pool's day is priced as ``apmw fleet`` prices one (GPU time of the replicas up,
electricity at facility power). A placement adds its pools: its replica-hours, MWh and dollars;
``peak_gpus`` is the sum of its pools' own peaks (what the placement must secure: a pool cannot
borrow another's replicas) and ``coincident_peak_gpus`` the most up at once. Peaks at different
hours are where sharing pays: a shared pool's peak is that of the sum of the demands, a split
placement's the sum of the peaks. ``secured_gpu_cost_per_month_usd`` prices the secured GPUs for
the whole month (a reservation). With ``power_cap_mw`` a placement whose provisioned facility power
exceeds the cap in some hour does not fit. The cheapest placement is the one with the lowest
``cost_per_month_usd`` among those that are served and fit.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace

import numpy as np

from apmw.capacity.closed_loop import ClosedLoopModel
from apmw.capacity.fleet_day import (DAYS_PER_MONTH, HOURS, FleetDay, Sizing, admission_cap, day_hours,
                                     fleet_day, sizing_of)
from apmw.capacity.plan import plan
from apmw.capacity.routing import with_routing
from apmw.capacity.search import SearchResult, largest_near, search
from apmw.capacity.session_mix import (JointSlo, mix_counts, mix_samples, mixed_variant, priced_variants,
                                       workload_figures)
from apmw.capacity.sessions import (SessionSample)
from apmw.capacity.slo import SLO_LABELS, seconds_text
from apmw.arch import load_architecture
from apmw.errors import ApmwError
from apmw.perf import Replica, replica_from_spec
from apmw.perf.replica import resolve_gpu
from apmw.spec import Slo, Spec, SpecError
from apmw.spec.fleet_file import FleetFileError, FleetHardware, LoadedFleet

def _differing(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Dotted names of the leaves where two dumped sections differ."""
    out = []
    for k in sorted(set(a) | set(b), key=str):
        x, y = a.get(k), b.get(k)
        if isinstance(x, dict) and isinstance(y, dict):
            out += _differing(x, y, f"{prefix}{k}.")
        elif x != y:
            out.append(f"{prefix}{k}")
    return out


def model_key(model) -> str:
    """One model as a replica serves it, however its config is spelt: a bundled name in any case or short form
    (``DeepSeek-V3``, ``deepseek-ai/deepseek-v3``), a config path by the file it reaches; a published
    derivative (``nvidia/DeepSeek-R1-NVFP4``) is a checkpoint of its own. With its dtypes."""
    from apmw.catalog.models import local_path, on_disk, published_format, resolve_model_name

    c = model.config.strip()
    name = (str(local_path(c).resolve()) if on_disk(c) else c.lower() if published_format(c) is not None
            else resolve_model_name(c) or c)
    return json.dumps([name, model.weight_dtype, model.kv_dtype, model.moe_dtype])


def hardware_key(hw: FleetHardware) -> str:
    """One replica hardware candidate, however its GPU is spelt (``H200``, ``h200_sxm``): the catalogue row, the
    GPUs per replica and the GPU-hour price."""
    gpu = resolve_gpu(hw.gpu)
    return json.dumps([gpu.name if isinstance(hw.gpu, str) else hw.gpu.model_dump_json(), hw.gpus_per_replica,
                       hw.gpu_hour_usd])


def share_refusal(specs: list[Spec], names: list[str]) -> str | None:
    """Why these workloads cannot share a replica, or None (module docstring)."""
    a = specs[0]
    for s, name in zip(specs[1:], names[1:]):
        if model_key(s.model) != model_key(a.model):
            mine, theirs = json.loads(model_key(a.model)), json.loads(model_key(s.model))
            if mine[0] == theirs[0]:        # one checkpoint, served in other dtypes
                fields = [f"model.{f} ({x} and {y})" for f, x, y in
                          zip(("weight_dtype", "kv_dtype", "moe_dtype"), mine[1:], theirs[1:]) if x != y]
                return (f"{names[0]} and {name} serve {a.model.config} but differ in {', '.join(fields)}; a replica "
                        "serves one model in one set of dtypes: give them the same (overrides) to share")
            return (f"{names[0]} ({a.model.config}, {a.model.weight_dtype}) and {name} ({s.model.config}, "
                    f"{s.model.weight_dtype}) use different models; a replica serves one model")
        for section in ("serving", "power"):
            diff = _differing(getattr(a, section).model_dump(), getattr(s, section).model_dump())
            if diff:
                return (f"{names[0]} and {name} differ in {', '.join(f'{section}.{d}' for d in diff)}; a replica runs "
                        f"one {'engine configuration' if section == 'serving' else 'power model (one hall)'}: give "
                        "them the same section (overrides) to share")
        if s.cost.electricity_usd_per_kwh != a.cost.electricity_usd_per_kwh:
            return f"{names[0]} and {name} differ in cost.electricity_usd_per_kwh; a pool is in one hall"
    spreading = [n for s, n in zip(specs, names) if s.fleet.routing != "affinity"]
    if spreading:
        return (f"fleet.routing other than affinity ({', '.join(spreading)}) is not modelled in a shared pool yet; "
                "use affinity")
    return None


def pool_spec(specs: list[Spec]) -> Spec:
    """The shared pool's spec: the first workload's, with the others' demand added, the largest of each
    autoscaling setting, and a task SLO that never binds beyond each workload's own (the pooled p95 is at
    most the largest workload's p95; :class:`JointSlo` checks each)."""
    first = specs[0]
    rates = [sum((s.fleet.tasks_per_hour or [0.0] * HOURS)[h] for s in specs) for h in range(HOURS)]
    fleet = first.fleet.model_copy(update={
        "tasks_per_hour": rates, "target_agents": None, "power_cap_mw": None,
        "headroom": max(s.fleet.headroom for s in specs), "min_replicas": max(s.fleet.min_replicas for s in specs),
        "scale_up_s": max(s.fleet.scale_up_s for s in specs),
        "scale_down_delay_s": max(s.fleet.scale_down_delay_s for s in specs)})
    slo = Slo(task_latency_p95_s=max(s.slo.task_latency_p95_s for s in specs))
    return first.model_copy(update={"fleet": fleet, "slo": slo})


class _Refused(Exception):
    pass


@dataclass(frozen=True)
class _Hour:
    """A shared pool's replica at one mix of sessions."""

    sizing: Sizing
    joint: JointSlo
    sample: SessionSample
    n_star: int

    def binding(self) -> str:
        """What bounds N* (the full search, its evaluations mostly cached)."""
        return _binding(search(self.sizing.spec, self.sizing.replica, self.sample, self.joint))  # type: ignore[arg-type]


def _mixed_hour(spec: Spec, replica: Replica, specs: list[Spec], names: list[str], counts: tuple[int, ...],
                guess: int | None) -> _Hour:
    """The replica at one mix: its pooled sessions, the joint SLO and N* (searched from ``guess`` where given)."""
    present = [i for i, n in enumerate(counts) if n > 0]
    variants = [priced_variants(specs[i], replica, counts[i], specs[i].seed + i) for i in present]
    own = [all(specs[j].workload != specs[i].workload for j in present[:k]) for k, i in enumerate(present)]
    main = mix_samples([v[0] for v in variants], own)
    found = mixed_variant([v[1] for v in variants], own)
    lost = mixed_variant([v[2] for v in variants], own)
    model = ClosedLoopModel(spec, replica, main.sample, found_sample=found, lost_sample=lost)
    # workloads with the same sessions and SLO are one population: their p95s are read together
    alike = tuple(next(k for k, j in enumerate(present) if (specs[j].workload, specs[j].slo) == (specs[i].workload,
                                                                                               specs[i].slo))
                  for i in present)
    joint = JointSlo(model, [names[i] for i in present], [specs[i].slo for i in present], main, alike)
    feasible = lambda n: n == 0 or joint.evaluate(n).feasible  # noqa: E731
    n_star = (search(spec, replica, main.sample, joint).agents if guess is None  # type: ignore[arg-type]
              else largest_near(feasible, max(guess, 1)))
    if n_star == 0:
        mix = ", ".join(f"{names[i]} {counts[i] / sum(counts):.0%}" for i in present)
        failed = _missed(joint, joint.evaluate(1)) or "the KV of one agent does not fit"
        raise _Refused(f"no number of agents meets every workload's SLO at the mix {mix} (tasks started): at one "
                       f"agent, {failed}. Needed: a looser SLO for those workloads (at least what they take at one "
                       "agent), a faster replica, or a pool of their own (the split placements)")
    cap = admission_cap(lambda c: joint.evaluate(c).task_latency_mean_s, n_star)
    sizing = Sizing(spec=spec, replica=replica, stage=model.prefill, agents_max=cap,
                    slowest_s=joint.evaluate(cap).task_latency_mean_s,
                    fastest_s=joint.evaluate(1).task_latency_mean_s, evaluate=joint.evaluate)
    return _Hour(sizing, joint, main.sample, n_star)


def _missed(joint: JointSlo, ev) -> str:
    """Each workload's SLO ``ev`` misses, with what it takes and what its SLO allows."""
    out = []
    for r in joint.figures(ev):
        for f in r["slo_failed"]:
            label = f"{r['workload']} {SLO_LABELS[f]}"
            if f == "output_speed":
                out.append(f"{label} below its SLO's {r['slo']['output_speed_tokens_per_s']:g} tokens/s")
            else:
                out.append(f"{label} {seconds_text(r.get(f + '_s'))} against its SLO's "
                           f"{seconds_text(r['slo'].get(f + '_s'))}")
    return "; ".join(out)


@dataclass(frozen=True)
class Pool:
    """A group of workloads on replicas of one hardware, over the day (or why it cannot be)."""

    workloads: tuple[str, ...]
    hardware: str
    refused: str | None = None
    day: FleetDay | None = None
    gpus_per_replica: float = 0.0
    gpu_hour_usd: float = 0.0
    agents_max_by_hour: tuple[int, ...] = ()
    binding_at_peak: str | None = None
    slo_at_peak: tuple[dict, ...] = ()
    tasks_by_workload: tuple[tuple[float, ...], ...] = ()     # per workload, 24 hours
    api_cost_per_task_usd: float | None = None                # one workload's tasks on its API (pools of one)

    @property
    def name(self) -> str:
        return f"{'+'.join(self.workloads)}@{self.hardware}"

    @property
    def served(self) -> bool:
        return self.refused is None

    def to_dict(self) -> dict:
        out: dict = {"name": self.name, "workloads": list(self.workloads), "hardware": self.hardware,
                     "refused": self.refused}
        if self.day is None:
            return out
        d = self.day.to_dict()
        keys = ("tasks_per_day", "peak_hour", "peak_replicas", "peak_gpus", "peak_facility_mw", "peak_provisioned_mw",
                "average_facility_mw", "gpu_hours_per_day", "facility_mwh_per_day", "facility_mwh_per_month",
                "cost_per_day_usd", "cost_per_month_usd", "cost_per_task_usd", "headroom", "min_replicas",
                "scale_up_s", "scale_down_delay_s")
        peak = d["peak_hour"]
        out.update({k: d[k] for k in keys})
        out.update({
            "gpus_per_replica": self.gpus_per_replica, "gpu_hour_usd": self.gpu_hour_usd,
            "replica_hours_per_day": d["gpu_hours_per_day"] / self.gpus_per_replica,
            "agents_per_replica_max_at_peak": self.agents_max_by_hour[peak],
            "binding_at_peak": self.binding_at_peak,
            "slo_at_peak": list(self.slo_at_peak),
            "hours": [asdict(h) | {"agents_per_replica_max": self.agents_max_by_hour[h.hour],
                                   "tasks_by_workload": {w: t[h.hour] for w, t in zip(self.workloads,
                                                                                       self.tasks_by_workload)}}
                      for h in self.day.hours],
        })
        return out


def _binding(result: SearchResult) -> str:
    """What stops N* going higher, naming the workload and SLO where an SLO binds: "slo (chat TTFT p95)"."""
    if result.binding_constraint != "slo" or not result.first_failure.slo.failed:
        return result.binding_constraint
    return f"slo ({', '.join(result.first_failure.slo.failed)})"


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return " ".join(t.strip() for t in text) if isinstance(exc, SpecError) else (text[0] if text else type(exc).__name__)


def single_pool(loaded: LoadedFleet, i: int, hw: FleetHardware | None) -> Pool:
    """Workload ``i`` alone on ``hw`` (None: its own hardware and price, the spec as written): ``apmw fleet``."""
    name = loaded.names[i]
    spec = loaded.specs[i]
    label = hw.label if hw is not None else own_hardware(spec).label
    try:
        spec = spec if hw is None else loaded.with_hardware(i, hw)
        result = plan(spec)
        day = fleet_day(result, compare_routing=False)
        if day.routing.policy != "affinity":        # a spreading router: the plan at the day's peak replica count
            result = plan(with_routing(spec, day.routing.policy, day.routing.replicas))
    except (ApmwError, SpecError) as exc:
        return Pool((name,), label, refused=_first_line(exc))
    sz = sizing_of(result)
    peak = max(day.hours, key=lambda h: h.replicas)
    at = sz.evaluate(max(1, min(sz.agents_max, math.ceil(peak.agents_per_replica - 1e-9))))
    whole = slice(0, None)
    figures = workload_figures(at, [name], [spec.slo], (whole,), (whole,))
    return Pool((name,), label, day=day, gpus_per_replica=_gpus(sz), gpu_hour_usd=spec.cost.gpu_hour_usd,
                agents_max_by_hour=(day.agents_per_replica_max,) * HOURS,
                binding_at_peak=result.search.binding_constraint if result.binding_slo is None else
                f"slo ({', '.join(f'{name} {SLO_LABELS[s]}' for s in result.binding_slo)})",
                slo_at_peak=tuple(figures), tasks_by_workload=(tuple(spec.fleet.tasks_per_hour or ()),),
                api_cost_per_task_usd=day.api_cost_per_task_usd)


def _gpus(sz: Sizing) -> float:
    return sz.replica.gpus + (sz.stage.gpus if sz.stage else 0)


def shared_pool(loaded: LoadedFleet, group: tuple[int, ...], hw: FleetHardware) -> Pool:
    """The workloads ``group`` on one pool of ``hw`` (module docstring)."""
    names = [loaded.names[i] for i in group]
    try:
        specs = [loaded.with_hardware(i, hw) for i in group]
    except SpecError as exc:
        return Pool(tuple(names), hw.label, refused=_first_line(exc))
    reason = share_refusal(specs, names)
    if reason is not None:
        return Pool(tuple(names), hw.label, refused=reason)
    spec = pool_spec(specs)
    try:
        replica = replica_from_spec(spec)
    except ApmwError as exc:
        return Pool(tuple(names), hw.label, refused=_first_line(exc))
    rates = [list(s.fleet.tasks_per_hour or [0.0] * HOURS) for s in specs]
    day_tasks = [sum(r) for r in rates]
    if sum(day_tasks) == 0:
        day_tasks = [1.0] * len(specs)
    cache: dict[tuple[int, ...], _Hour] = {}

    try:
        hours: list[_Hour] = []
        for h in range(HOURS):      # each hour's N* searched from the hour before's
            tasks = [r[h] for r in rates]
            counts = mix_counts(tasks if sum(tasks) > 0 else day_tasks, specs)
            if counts not in cache:
                cache[counts] = _mixed_hour(spec, replica, specs, names, counts,
                                            hours[-1].n_star if hours else None)
            hours.append(cache[counts])
    except (_Refused, ApmwError) as exc:
        return Pool(tuple(names), hw.label, refused=_first_line(exc))
    totals = [sum(r[h] for r in rates) for h in range(HOURS)]
    fh = day_hours([h.sizing for h in hours], totals)
    peak = max(fh, key=lambda h: h.replicas)
    top = hours[peak.hour]
    day = FleetDay(agents_per_replica_max=top.n_star, agents_per_replica_admitted=top.sizing.agents_max,
                   headroom=spec.fleet.headroom,
                   min_replicas=spec.fleet.min_replicas, scale_up_s=spec.fleet.scale_up_s,
                   scale_down_delay_s=spec.fleet.scale_down_delay_s, hours=fh)
    at_peak = top.joint.evaluate(max(1, min(top.sizing.agents_max, math.ceil(peak.agents_per_replica - 1e-9))))
    figures = top.joint.figures(at_peak)      # the workloads with tasks in the peak hour's mix
    return Pool(tuple(names), hw.label, day=day, gpus_per_replica=_gpus(top.sizing),
                gpu_hour_usd=spec.cost.gpu_hour_usd, agents_max_by_hour=tuple(h.n_star for h in hours),
                binding_at_peak=top.binding(), slo_at_peak=tuple(figures),
                tasks_by_workload=tuple(tuple(r) for r in rates))


# The hardware named for a pool refused whatever it runs on (workloads that cannot share a replica).
ANY_HARDWARE = "any"


def own_hardware(spec: Spec) -> FleetHardware:
    """A spec's own replica hardware and GPU-hour price, as a candidate."""
    return FleetHardware(gpu=spec.hardware.gpu, gpus_per_replica=spec.hardware.gpus_per_replica,
                         gpu_hour_usd=spec.cost.gpu_hour_usd)


@dataclass(frozen=True)
class Placement:
    name: str                       # split:<hw> | split:own | split:best | shared[:<hw>] | by_model:<hw> | by_model:best
    kind: str                       # split | shared | by_model
    pools: tuple[Pool, ...]
    refused: str | None = None

    def totals(self, api_cost_per_task_usd: dict[str, float | None]) -> dict:
        """The placement's day (module docstring, 'Prices'); ``api_cost_per_task_usd``: each workload's tasks on
        its API, for the same tasks' API bill (None unless every workload has a price)."""
        pools = [p for p in self.pools if p.day is not None]
        hours = [[h for h in p.day.hours] for p in pools if p.day is not None]
        tasks = sum(p.day.tasks_per_day for p in pools if p.day is not None)
        per_day = sum(p.day.cost_per_day_usd for p in pools if p.day is not None)
        mwh = sum(p.day.facility_mwh_per_day for p in pools if p.day is not None)
        peak_gpus = sum(max(h.gpus for h in hs) for hs in hours)
        return {
            "tasks_per_day": tasks,
            "peak_replicas": sum(max(h.replicas for h in hs) for hs in hours),
            "peak_gpus": peak_gpus,
            "coincident_peak_gpus": max(sum(hs[h].gpus for hs in hours) for h in range(HOURS)),
            "peak_facility_mw": max(sum(hs[h].facility_power_w for hs in hours) for h in range(HOURS)) / 1e6,
            "peak_provisioned_mw": max(sum(hs[h].provisioned_power_w for hs in hours) for h in range(HOURS)) / 1e6,
            "replica_hours_per_day": sum(sum(h.gpu_hours for h in hs) / p.gpus_per_replica
                                         for p, hs in zip(pools, hours)),
            "gpu_hours_per_day": sum(h.gpu_hours for hs in hours for h in hs),
            "facility_mwh_per_day": mwh,
            "facility_mwh_per_month": mwh * DAYS_PER_MONTH,
            "cost_per_day_usd": per_day,
            "cost_per_month_usd": per_day * DAYS_PER_MONTH,
            "cost_per_task_usd": per_day / tasks if tasks else None,
            "secured_gpu_cost_per_month_usd": sum(max(h.gpus for h in hs) * p.gpu_hour_usd * HOURS * DAYS_PER_MONTH
                                                  for p, hs in zip(pools, hours)),
            "api_cost_per_day_usd": _api_day(pools, api_cost_per_task_usd),
        }


def _api_day(pools: list[Pool], per_task: dict[str, float | None]) -> float | None:
    """The placement's tasks on their APIs (None unless every workload has a price)."""
    total = 0.0
    for p in pools:
        for w, tasks in zip(p.workloads, p.tasks_by_workload):
            price = per_task.get(w)
            if price is None:
                return None
            total += price * sum(tasks)
    return total


@dataclass(frozen=True)
class FleetMix:
    loaded: LoadedFleet
    hardware: tuple[FleetHardware, ...]       # the candidates (the workloads' own without a hardware list)
    pools: tuple[Pool, ...]                   # every pool evaluated
    placements: tuple[Placement, ...]

    def api_cost_per_task_usd(self) -> dict[str, float | None]:
        """Each workload's task on the API its spec prices (from its first pool of its own that is served; the
        share of prompt tokens cached, priced at the cached rate, is that pool's)."""
        out: dict[str, float | None] = {n: None for n in self.loaded.names}
        for p in self.pools:
            if len(p.workloads) == 1 and p.served and out[p.workloads[0]] is None:
                out[p.workloads[0]] = p.api_cost_per_task_usd
        return out

    def to_dict(self) -> dict:
        cap = self.loaded.fleet.power_cap_mw
        api = self.api_cost_per_task_usd()
        rows = []
        for p in self.placements:
            row: dict = {"placement": p.name, "kind": p.kind, "pools": [q.name for q in p.pools],
                         "refused": p.refused}
            if p.refused is None:
                row.update(p.totals(api))
                row["within_power_cap"] = None if cap is None else row["peak_provisioned_mw"] <= cap * (1 + 1e-12)
            rows.append(row)
        by_name = {r["placement"]: r for r in rows}
        for r in rows:
            split = (by_name.get(r["placement"].replace(f"{r['kind']}:", "split:", 1)) or by_name.get("split:own")
                     if r["kind"] != "split" else None)
            r["compared_with_split"] = None if split is None or r["refused"] or split["refused"] else {
                "placement": split["placement"], "peak_gpus_saved": split["peak_gpus"] - r["peak_gpus"],
                "cost_per_month_saved_usd": split["cost_per_month_usd"] - r["cost_per_month_usd"],
                "secured_gpu_cost_per_month_saved_usd": (split["secured_gpu_cost_per_month_usd"]
                                                         - r["secured_gpu_cost_per_month_usd"])}
        fit = [r for r in rows if r["refused"] is None and r.get("within_power_cap") is not False]
        cheapest = min(fit, key=lambda r: (r["cost_per_month_usd"], r["peak_gpus"]))["placement"] if fit else None
        workloads = []
        for i, (name, spec) in enumerate(zip(self.loaded.names, self.loaded.specs)):
            rates = spec.fleet.tasks_per_hour or []
            workloads.append({"name": name, "spec": self.loaded.spec_paths[i], "model": spec.model.config,
                              "tasks_per_day": sum(rates), "peak_hour": int(np.argmax(rates)) if rates else None,
                              "api_cost_per_task_usd": api[name],
                              "slo": {"task_latency_p95_s": spec.slo.task_latency_p95_s, "ttft_p95_s": spec.slo.ttft_p95_s,
                                      "tpot_p95_s": spec.slo.tpot_p95_s,
                                      "output_speed_tokens_per_s": spec.slo.output_speed_tokens_per_s}})
        return {
            "fleet_file": self.loaded.path,
            "power_cap_mw": cap,
            "workloads": workloads,
            "hardware": [{"name": h.label, "gpu": h.gpu if isinstance(h.gpu, str) else h.gpu.model_dump(exclude_none=True),
                          "gpus_per_replica": h.gpus_per_replica, "gpu_hour_usd": h.gpu_hour_usd}
                         for h in self.hardware],
            "hardware_source": "fleet_file" if self.loaded.fleet.hardware else "workload_specs",
            "placements": rows,
            "cheapest_placement": cheapest,
            "pools": [p.to_dict() for p in self.pools],
        }


def _check_names(loaded: LoadedFleet) -> None:
    """Every model and GPU named is known (a catalogue name, a config path, a complete custom GPU): a misspelt
    name is bad input, named with its file and field, not a pool refused."""
    problems = []
    first: dict[str, int] = {}
    for j, hw in enumerate(loaded.fleet.hardware or []):
        try:
            key = hardware_key(hw)
        except ApmwError as exc:
            problems.append(f"{loaded.where('hardware', j, 'gpu')}: {exc}")
            continue
        if key in first:
            problems.append(f"{loaded.where('hardware', j, 'gpu')}: the same hardware as hardware.{first[key]} (the "
                            "same GPU, GPUs per replica and GPU-hour price, spelt another way): list it once")
        first.setdefault(key, j)
    for i, (spec, path) in enumerate(zip(loaded.specs, loaded.spec_paths)):
        try:
            load_architecture(spec.model.config)
        except ApmwError as exc:
            problems.append(f"workloads.{i} ({path}): model.config: {exc}")
        try:
            if not loaded.fleet.hardware:
                resolve_gpu(spec.hardware.gpu)
        except ApmwError as exc:
            problems.append(f"workloads.{i} ({path}): hardware.gpu: {exc}")
    if not loaded.fleet.hardware and not problems:
        problems += _own_hardware_clashes(loaded)
    if problems:
        raise FleetFileError(loaded.path, problems)


def _own_hardware_clashes(loaded: LoadedFleet) -> list[str]:
    """Workloads whose own hardware goes by one name (``H200x8``) but is priced or described apart: the pools
    they share are keyed by that name, so one of them would be priced as the other."""
    problems: list[str] = []
    first: dict[str, tuple[int, tuple]] = {}
    for i, (spec, path) in enumerate(zip(loaded.specs, loaded.spec_paths)):
        hw = own_hardware(spec)
        # the GPU's figures however it is spelt (a catalogue name or {name: ...}), not where they were read
        gpu = replace(resolve_gpu(hw.gpu), source="", power_source="", overridden=())
        figures = (gpu, hw.gpus_per_replica, hw.gpu_hour_usd)
        j, seen = first.setdefault(hw.label, (i, figures))
        if seen != figures:
            other = own_hardware(loaded.specs[j])
            what = (f"is priced at cost.gpu_hour_usd {hw.gpu_hour_usd:g} where workloads.{j} ({loaded.names[j]}) "
                    f"pays {other.gpu_hour_usd:g}" if other.gpu_hour_usd != hw.gpu_hour_usd else
                    f"has other GPU figures than workloads.{j}'s ({loaded.names[j]})")
            problems.append(f"workloads.{i} ({path}): its replica hardware, {hw.label}, {what}; a pool on "
                            f"{hw.label} is one GPU at one price: give them the same, or list each as a fleet-file "
                            "hardware entry with a name of its own")
    return problems


def _cheapest(pools: list[Pool]) -> Pool | None:
    served = [(p.day.cost_per_day_usd, sum(h.gpu_hours for h in p.day.hours), k, p)
              for k, p in enumerate(pools) if p.day is not None]
    return min(served)[-1] if served else None


def _placement(name: str, kind: str, pools: list[Pool]) -> Placement:
    refused = [p for p in pools if not p.served]
    reason = "; ".join(f"pool {p.name} refused: {p.refused}" for p in refused) or None
    return Placement(name, kind, tuple(pools), refused=reason)


def fleet_mix(loaded: LoadedFleet) -> FleetMix:
    """Every placement of the fleet file's workloads on its hardware candidates, each priced (module docstring)."""
    _check_names(loaded)
    n = len(loaded.specs)
    listed = loaded.fleet.hardware
    pools: dict[tuple[tuple[int, ...], str], Pool] = {}

    def pool(group: tuple[int, ...], hw: FleetHardware | None) -> Pool:
        """``group`` on ``hw`` (None: a workload alone on its own hardware), each evaluated once."""
        key = (group, "" if hw is None else hw.label)
        if key not in pools:
            pools[key] = (single_pool(loaded, group[0], hw) if len(group) == 1 else
                          shared_pool(loaded, group, hw) if hw is not None else
                          Pool(tuple(loaded.names[i] for i in group), ANY_HARDWARE, refused="no hardware"))
        return pools[key]

    def own_of(group: tuple[int, ...]) -> tuple[FleetHardware, ...]:
        seen: dict[str, FleetHardware] = {}
        for i in group:
            hw = own_hardware(loaded.specs[i])
            seen.setdefault(hardware_key(hw), hw)
        return tuple(seen.values())

    candidates = tuple(listed) if listed else own_of(tuple(range(n)))

    def options(group: tuple[int, ...]) -> list[Pool]:
        if listed:
            return [pool(group, hw) for hw in candidates]
        return [pool(group, None)] if len(group) == 1 else [pool(group, hw) for hw in own_of(group)]

    def best(group: tuple[int, ...]) -> Pool:
        found = options(group)
        return _cheapest(found) or found[0]

    singles = [(i,) for i in range(n)]
    placements: list[Placement] = []
    if listed:
        placements += [_placement(f"split:{hw.label}", "split", [pool(g, hw) for g in singles]) for hw in candidates]
        if len(candidates) > 1:
            placements.append(_placement("split:best", "split", [best(g) for g in singles]))
    else:
        placements.append(_placement("split:own", "split", [pool(g, None) for g in singles]))
    extra: list[Pool] = []
    if n > 1:
        everyone = tuple(range(n))
        reason = share_refusal(list(loaded.specs), list(loaded.names))     # nothing a hardware candidate changes
        if reason is not None:
            extra.append(Pool(loaded.names, ANY_HARDWARE, refused=reason))
            placements.append(_placement("shared", "shared", extra[-1:]))
        else:
            placements += [_placement(f"shared:{p.hardware}", "shared", [p]) for p in options(everyone)]
        by_model: dict[str, list[int]] = {}
        for i, s in enumerate(loaded.specs):
            by_model.setdefault(model_key(s.model), []).append(i)
        groups = [tuple(g) for g in by_model.values()]
        if len(groups) > 1 and any(len(g) > 1 for g in groups):
            if listed:
                placements += [_placement(f"by_model:{hw.label}", "by_model", [pool(g, hw) for g in groups])
                               for hw in candidates]
            placements.append(_placement("by_model:best", "by_model", [best(g) for g in groups]))
    return FleetMix(loaded=loaded, hardware=candidates, pools=tuple(pools.values()) + tuple(extra),
                    placements=tuple(placements))
