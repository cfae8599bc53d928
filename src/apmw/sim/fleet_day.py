"""A day of a fleet, simulated task by task (``apmw fleet --simulate``), beside the analytic day.

Why task level. The iteration-level simulator (:mod:`apmw.sim.engine`) runs about 1,000 to 20,000
simulated seconds a wall second for one replica: a day of 1,000 replicas is 86.4 million
replica-seconds, days of wall time. This module simulates the fleet one level up, by discrete
events on tasks, with each replica's speed taken from the analytic closed loop of that replica
(:class:`apmw.capacity.closed_loop.ClosedLoopModel`, evaluated once per agent count 1..N*):

* **Arrivals.** Tasks start by a non-homogeneous Poisson process, piecewise constant at
  ``fleet.tasks_per_hour`` (times ``scale``, the ``--replicas-scale`` of the CLI); the day is a
  repeating forecast, so it starts after ``WARMUP_S`` of the previous day's last hours.
* **Router (affinity).** A new task goes to the ready replica with the fewest agents (lowest
  replica id among equals) and all its calls stay there. A replica takes at most N* agents (the
  plan's, within the SLO); when every ready replica holds N*, the task waits at admission (FIFO)
  and its wait is part of its task time (``queued`` and ``admission_wait_mean_s``).
* **Service.** A replica holding ``n`` agents runs each of them at the pace of the closed loop at
  ``n``: a task's work is its size ``s`` (its sampled session's task time at the load it found,
  over that load's mean, so sizes average 1 and carry the sampled tail), done at rate ``1 / R(n)``
  per second while the replica holds ``n`` agents (a per-replica virtual clock, as in processor
  sharing): a task whose replica's load stays at ``n`` takes exactly its sample at ``n``, and one
  whose load changes speeds up or slows down with it. ASSUMPTION: the shape of the task-time
  distribution at the admission load is kept when the load changes (only its scale follows R(n)).
* **Autoscaler.** Every ``tick_s`` it observes the cell's concurrent agents ``N`` (in service and
  waiting), infers the arrival rate by Little's law, ``lambda = N / R(n)`` at the replicas' present
  load, and asks the analytic day's rule for it (the fewest replicas whose self-consistent load,
  with ``fleet.headroom``, stays within N*; the rule of :mod:`apmw.capacity.fleet_day`). The rule
  is applied to the load the fleet would settle at, not to ``N`` as observed, because R rises
  steeply with the load: ``ceil(N (1 + headroom) / N*)`` at today's short tasks undersizes the
  fleet it then slows down. Scale-down waits for ``fleet.scale_down_delay_s`` (the target is the
  most the rule asked for over that window, as Kubernetes' stabilisation window does); surplus
  replicas stop taking tasks (draining) and retire when their last agent finishes (affinity: a
  task is never moved). New replicas serve ``fleet.scale_up_s`` after they start, billed and at
  idle power meanwhile; a draining replica is taken back before a new one is started.
  Unlike the analytic day the autoscaler reacts to what it sees, not to the forecast, so with a
  scale-up delay a rising hour queues tasks at admission.
* **Power.** Each replica draws the one power formula's IT power at its present agent count
  (:func:`apmw.capacity.economics.economics`, which calls ``replica.power.it_power_w(GpuGroup(...))``
  at the closed loop's engine utilisation there, as the analytic hours do); an empty or warming
  replica draws idle power. Energy is the integral over the day.

**Parallel, deterministic.** The fleet is simulated as ``cells`` independent cells (groups of
replicas with their own router and autoscaler; a two-level router that first picks a cell at
random): splitting a Poisson process at random gives independent Poisson processes of rate
``lambda / cells``, so cells are independent and run anywhere, on the local process pool or a
Ray cluster, through :func:`apmw.design_search.executor.execute` (the CLI's job: this layer does
not import it). Each cell draws from ``SeedSequence([seed, replication, cell])``, so a cell's
answer does not depend on where or with what it ran. Each cell rounds its replicas up on its
own, so cells cost up to one replica each over one fleet-wide autoscaler: ``REPLICAS_PER_CELL``
keeps that near 1 %. Replications (independent days, seeds per replication) give a 95 % interval
on the day's totals.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Callable

import numpy as np

from apmw.capacity.economics import economics
from apmw.capacity.fleet_day import admission_cap, smallest_fitting
from apmw.capacity.closed_loop import ClosedLoopModel
from apmw.capacity.plan import Plan
from apmw.errors import ApmwError
from apmw.perf import GpuGroup

HOURS = 24
DAY_S = 86_400.0
# Seconds of the previous day (its last hours) simulated first, so the day starts loaded.
WARMUP_S = 7_200.0
# Seconds between autoscaler decisions.
TICK_S = 60.0
# Replicas per cell when the CLI chooses the cells (each cell rounds its replicas up on its own).
REPLICAS_PER_CELL = 100
# Fixed-point iterations of n = lambda * R(n) / r, as the analytic day.
LITTLE_ITERATIONS = 8
# Student's t at 97.5 % for 1..30 degrees of freedom (the 95 % interval over replications).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def replica_table(result: Plan, model: ClosedLoopModel, scale: float = 1.0) -> dict:
    """What a cell needs of the plan ``result`` and its closed loop ``model``, as plain data that
    travels to workers: the closed loop's mean task time and task-time samples at 1..N* agents, the
    replica's IT and facility power at 0..N* agents, the fleet settings and the demand times ``scale``."""
    spec, replica = result.spec, result.replica
    fleet = spec.fleet
    if fleet.tasks_per_hour is None:
        raise ApmwError("apmw fleet --simulate needs fleet.tasks_per_hour in the spec (24 values)")
    if len(spec.fleet.tasks_per_hour) != HOURS:
        raise ApmwError(f"apmw fleet --simulate simulates one day; fleet.tasks_per_hour gives a week "
                        f"({len(spec.fleet.tasks_per_hour)} values), which apmw fleet sizes analytically only: leave out "
                        "--simulate, or simulate one day's 24 values")
    if not scale > 0 or not math.isfinite(scale):
        raise ApmwError(f"--replicas-scale must be a positive number, got {scale}")
    if fleet.routing != "affinity":
        raise ApmwError(f"apmw fleet --simulate routes by affinity only; fleet.routing is '{fleet.routing}' "
                        "(the analytic day prices it: leave out --simulate)")
    # replicas take at most the analytic day's admitted agents (apmw.capacity.fleet_day.admission_cap)
    n_star = admission_cap(lambda c: model.evaluate(c).task_latency_mean_s, result.agents_per_replica)
    stage = model.prefill
    prefill_gpus = stage.gpus if stage else 0
    power = replica.power
    idle_it = power.it_power_w(GpuGroup(replica.gpus, 0.0, 0.0), GpuGroup(prefill_gpus, 0.0, 0.0))
    means, samples, it_w, fac_w = [0.0], [], [idle_it], [power.facility_power_w(idle_it)]
    for n in range(1, n_star + 1):
        at = model.evaluate(n)
        econ = economics(spec, replica, at.agents, at.task_latency_mean_s, at.loop.engine_utilisation,
                         at.loop.compute_share, prefill_gpus=prefill_gpus,
                         prefill_utilisation=at.prefill_utilisation or 0.0,
                         prefill_compute_share=stage.compute_share if stage else 1.0)
        means.append(at.task_latency_mean_s)
        draws = np.asarray(at.task_latency_samples_s, dtype=float)
        if len(draws) == 0:
            draws = np.array([at.task_latency_mean_s])
        samples.append(draws / draws.mean())        # sizes: mean 1, the sample's shape at n agents
        it_w.append(econ.replica_power_w)
        fac_w.append(econ.facility_power_w)
    means[0] = means[1]
    width = min(len(s) for s in samples)
    return {"n_star": n_star, "latency_mean_s": means, "sizes": np.stack([s[:width] for s in samples]),
            "it_power_w": it_w, "facility_power_w": fac_w, "gpus_per_replica": replica.gpus + prefill_gpus,
            "headroom": fleet.headroom, "min_replicas": fleet.min_replicas, "scale_up_s": fleet.scale_up_s,
            "scale_down_delay_s": fleet.scale_down_delay_s,
            "tasks_per_hour": [float(t) * scale for t in fleet.tasks_per_hour],
            "gpu_hour_usd": spec.cost.gpu_hour_usd, "electricity_usd_per_kwh": spec.cost.electricity_usd_per_kwh}


def replicas_needed(table: dict, rate_per_s: float) -> int:
    """The analytic day's rule: the fewest replicas ``r >= min_replicas`` whose self-consistent load
    ``n = rate * R(ceil n) / r`` keeps ``n * (1 + headroom) <= N*``."""
    n_star, means, need = table["n_star"], table["latency_mean_s"], 1.0 + table["headroom"]
    low = max(table["min_replicas"], math.ceil(rate_per_s * means[1] * need / n_star - 1e-9))
    high = max(table["min_replicas"], math.ceil(rate_per_s * means[n_star] * need / n_star - 1e-9))
    if rate_per_s <= 0 or low <= 0:
        return low

    def fits(r: int) -> bool:
        if r >= high:
            return True
        n = rate_per_s * means[n_star] / r
        for _ in range(LITTLE_ITERATIONS):
            n_next = rate_per_s * means[max(1, min(n_star, math.ceil(n - 1e-9)))] / r
            if abs(n_next - n) <= 1e-9 * max(n, 1.0):
                break
            n = n_next
        return n * need <= n_star + 1e-9

    return smallest_fitting(fits, low, high)


def simulate_cells(base: dict, batch: list[tuple[int, dict]]) -> list[dict]:
    """The executor's unit of work: each ``(index, {"replication": r, "cell": c})`` of ``batch``
    simulated from ``base`` (``table``, ``seed``, ``cells``, ``tick_s``); one row each."""
    return [dict(simulate_cell(base["table"], base["seed"], point["replication"], point["cell"], base["cells"],
                               base.get("tick_s", TICK_S)), index=i) for i, point in batch]


class _Cell:
    """The event loop of one cell (its own router and autoscaler, its share of the arrivals)."""

    def __init__(self, table: dict, rng: np.random.Generator, cells: int, tick_s: float):
        self.t = table
        self.rng, self.cells, self.tick_s = rng, cells, tick_s
        self.n_star: int = table["n_star"]
        self.rate_of_n = [1.0 / r for r in table["latency_mean_s"]]     # work (mean tasks) per second
        self.it_w, self.fac_w = table["it_power_w"], table["facility_power_w"]
        self.sizes: np.ndarray = table["sizes"]
        # per replica: agents, state (0 warming, 1 ready, 2 draining, 3 retired), virtual clock, its time,
        # the virtual finish times of its tasks (heap of (v, task)), the version of its next-finish event
        self.agents: list[int] = []
        self.state: list[int] = []
        self.v: list[float] = []
        self.v_at: list[float] = []
        self.finishing: list[list[tuple[float, int]]] = []
        self.version: list[int] = []
        self.buckets: list[dict[int, None]] = [dict() for _ in range(self.n_star)]   # ready, by agents < N*
        self.events: list[tuple[float, int, int, int]] = []       # (time, seq, kind, replica/version)
        self.seq = 0
        self.queue: deque[tuple[float, int]] = deque()            # (arrival time, task)
        self.now = -WARMUP_S
        self.last = -WARMUP_S
        self.in_service = 0
        self.up = 0                 # replicas billed: warming, ready or draining
        self.it_now = 0.0
        self.fac_now = 0.0
        self.history: deque[tuple[float, int]] = deque()          # (tick time, replicas asked for)
        zeros = lambda: np.zeros(HOURS)  # noqa: E731
        self.replica_s, self.it_j, self.fac_j, self.agent_s, self.queued_s = (zeros() for _ in range(5))
        self.task_start: list[float] = []
        self.task_admit: list[float] = []
        self.task_end: list[float] = []

    # -- integrals ---------------------------------------------------------------------------------
    def advance(self, t: float) -> None:
        a, b = max(self.last, 0.0), min(t, DAY_S)
        while a < b:
            h = int(a // 3600.0)
            end = min(b, (h + 1) * 3600.0)
            dt = end - a
            self.replica_s[h] += self.up * dt
            self.it_j[h] += self.it_now * dt
            self.fac_j[h] += self.fac_now * dt
            self.agent_s[h] += (self.in_service + len(self.queue)) * dt
            self.queued_s[h] += len(self.queue) * dt
            a = end
        self.last = t
        self.now = t

    def _power(self, n: int, sign: int) -> None:
        self.it_now += sign * self.it_w[n]
        self.fac_now += sign * self.fac_w[n]

    # -- replicas ----------------------------------------------------------------------------------
    def _sync(self, r: int) -> None:
        """Bring replica ``r``'s virtual clock to now (at its present load)."""
        n = self.agents[r]
        if n:
            self.v[r] += (self.now - self.v_at[r]) * self.rate_of_n[n]
        self.v_at[r] = self.now

    def _reschedule(self, r: int) -> None:
        self.version[r] += 1
        if self.finishing[r]:
            v_end = self.finishing[r][0][0]
            t_end = self.now + max(v_end - self.v[r], 0.0) / self.rate_of_n[self.agents[r]]
            self.seq += 1
            heapq.heappush(self.events, (t_end, self.seq, r, self.version[r]))

    def _set_agents(self, r: int, n: int) -> None:
        old = self.agents[r]
        if self.state[r] == 1 and old < self.n_star:
            del self.buckets[old][r]
        if self.state[r] in (1, 2):
            self._power(old, -1)
            self._power(n, +1)
        self.agents[r] = n
        if self.state[r] == 1 and n < self.n_star:
            self.buckets[n][r] = None

    def _set_state(self, r: int, state: int) -> None:
        """Warming (0) draws idle power, ready (1) and draining (2) their load's, retired (3) none."""
        old, n = self.state[r], self.agents[r]
        if old == 1 and n < self.n_star:
            del self.buckets[n][r]
        draw_old = None if old == 3 else (0 if old == 0 else n)
        draw_new = None if state == 3 else (0 if state == 0 else n)
        if draw_old != draw_new:
            if draw_old is not None:
                self._power(draw_old, -1)
            if draw_new is not None:
                self._power(draw_new, +1)
        if state == 3 and old != 3:
            self.up -= 1
        self.state[r] = state
        if state == 1 and n < self.n_star:
            self.buckets[n][r] = None

    def _start_replica(self, ready_now: bool) -> None:
        r = len(self.agents)
        self.agents.append(0)
        self.state.append(0)
        self.v.append(0.0)
        self.v_at.append(self.now)
        self.finishing.append([])
        self.version.append(0)
        self.up += 1
        self._power(0, +1)
        if ready_now or self.t["scale_up_s"] <= 0:
            self._set_state(r, 1)
        else:
            self.seq += 1
            heapq.heappush(self.events, (self.now + self.t["scale_up_s"], self.seq, r, -1))

    # -- tasks ---------------------------------------------------------------------------------------
    def _admit(self, task: int) -> bool:
        for n in range(self.n_star):
            bucket = self.buckets[n]
            if bucket:
                r = next(iter(bucket))
                break
        else:
            return False
        self._sync(r)
        self._set_agents(r, n + 1)
        size = float(self.sizes[n, int(self.rng.integers(self.sizes.shape[1]))])   # the sample at n + 1 agents
        heapq.heappush(self.finishing[r], (self.v[r] + size, task))
        self.in_service += 1
        self.task_admit[task] = self.now
        self._reschedule(r)
        return True

    def _admit_queued(self) -> None:
        while self.queue and self._admit(self.queue[0][1]):
            self.queue.popleft()

    def _finish(self, r: int) -> None:
        self._sync(r)
        _, task = heapq.heappop(self.finishing[r])
        self.task_end[task] = self.now
        self.in_service -= 1
        self._set_agents(r, self.agents[r] - 1)
        if self.state[r] == 2 and self.agents[r] == 0:
            self._set_state(r, 3)
        self._reschedule(r)
        self._admit_queued()

    # -- autoscaler -----------------------------------------------------------------------------------
    def _tick(self) -> None:
        serving = [r for r, s in enumerate(self.state) if s in (1, 2)]
        observed = self.in_service + len(self.queue)
        per = self.in_service / len(serving) if serving else 0.0
        r_s = self.t["latency_mean_s"][max(1, min(self.n_star, math.ceil(per - 1e-9)))]
        asked = replicas_needed(self.t, observed / r_s)
        self.history.append((self.now, asked))
        while self.history and self.history[0][0] < self.now - self.t["scale_down_delay_s"] - 1e-9:
            self.history.popleft()
        self.scale_to(max(a for _, a in self.history), ready_now=False)

    def scale_to(self, target: int, ready_now: bool) -> None:
        active = [r for r, s in enumerate(self.state) if s in (0, 1)]
        if target > len(active):
            draining = sorted((r for r, s in enumerate(self.state) if s == 2), key=lambda r: -self.agents[r])
            for r in draining[:target - len(active)]:
                self._set_state(r, 1)
            for _ in range(target - len(active) - min(len(draining), target - len(active))):
                self._start_replica(ready_now)
        elif target < len(active):
            warming = [r for r in active if self.state[r] == 0]
            ready = sorted((r for r in active if self.state[r] == 1), key=lambda r: (self.agents[r], -r))
            for r in (warming[::-1] + ready)[:len(active) - target]:
                self._set_state(r, 3 if self.state[r] == 0 or self.agents[r] == 0 else 2)
        self._admit_queued()

    # -- the day ----------------------------------------------------------------------------------------
    def run(self) -> dict:
        rates = self.t["tasks_per_hour"]
        arrivals = []
        warm_hours = math.ceil(WARMUP_S / 3600.0)
        for h in range(-warm_hours, HOURS):
            lo = max(h * 3600.0, -WARMUP_S)
            lam = rates[h % HOURS] / self.cells / 3600.0
            count = int(self.rng.poisson(lam * (h * 3600.0 + 3600.0 - lo)))
            arrivals.append(np.sort(self.rng.uniform(lo, (h + 1) * 3600.0, count)))
        times = np.concatenate(arrivals).tolist()
        self.task_start = times
        self.task_admit = [math.nan] * len(times)
        self.task_end = [math.nan] * len(times)
        self.scale_to(replicas_needed(self.t, rates[-1] / self.cells / 3600.0), ready_now=True)
        next_tick = self.now + self.tick_s
        i, total = 0, len(times)
        events = self.events
        while True:
            t_arrival = times[i] if i < total else math.inf
            t_event = events[0][0] if events else math.inf
            t_next = min(t_arrival, t_event, next_tick)
            if t_next == math.inf:
                break
            self.advance(t_next)
            if t_next == t_event:
                _, _, r, version = heapq.heappop(events)
                if version == -1:
                    if self.state[r] == 0:
                        self._set_state(r, 1)
                        self._admit_queued()
                elif version == self.version[r]:
                    self._finish(r)
            elif t_next == t_arrival:
                if not self._admit(i):
                    self.queue.append((t_arrival, i))
                i += 1
            else:
                if next_tick < DAY_S:
                    self._tick()
                    next_tick += self.tick_s
                else:
                    next_tick = math.inf          # the day is over: its last tasks finish, nothing is counted
        return self._row()

    def _row(self) -> dict:
        start = np.asarray(self.task_start)
        admit, end = np.asarray(self.task_admit), np.asarray(self.task_end)
        day = (start >= 0) & (start < DAY_S)
        hour = (start[day] // 3600.0).astype(int)
        wait = admit[day] - start[day]
        queued = wait > 1e-9
        latency = end[day] - start[day]
        return {"replica_s": self.replica_s, "it_j": self.it_j, "facility_j": self.fac_j, "agent_s": self.agent_s,
                "queued_agent_s": self.queued_s,
                "tasks": np.bincount(hour, minlength=HOURS),
                "queued": np.bincount(hour, weights=queued, minlength=HOURS).astype(int),
                "wait_s": np.bincount(hour, weights=wait, minlength=HOURS),
                "latency_s": latency, "hour": hour}


def simulate_cell(table: dict, seed: int, replication: int, cell: int, cells: int, tick_s: float = TICK_S) -> dict:
    """One cell's day: its share ``1 / cells`` of the arrivals on its own replicas, seeded by
    ``(seed, replication, cell)`` alone."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, replication, cell]))
    return _Cell(table, rng, cells, tick_s).run()


def cells_for(peak_replicas: int) -> int:
    """Cells for a fleet whose analytic peak is ``peak_replicas``: about ``REPLICAS_PER_CELL`` each."""
    return max(1, round(peak_replicas / REPLICAS_PER_CELL))


def work(replications: int, cells: int) -> list[tuple[int, dict]]:
    """The executor's to-do list: one item per (replication, cell)."""
    return [(i, {"replication": r, "cell": c})
            for i, (r, c) in enumerate((r, c) for r in range(replications) for c in range(cells))]


def _interval(values: list[float]) -> list[float] | None:
    """Student's t 95 % interval of the mean of ``values``, a quantity that is never negative (hours, energy, cost,
    latency, counts): with a few spread replications t's lower end falls below zero, which no day can reach, so it
    stops at zero."""
    k = len(values)
    if k < 2:
        return None
    mean, sd = float(np.mean(values)), float(np.std(values, ddof=1))
    half = (_T975[k - 2] if k - 2 < len(_T975) else 1.96) * sd / math.sqrt(k)
    return [max(0.0, mean - half), mean + half]


def summarise(table: dict, rows: list[dict], seed: int, replications: int, cells: int) -> dict:
    """The simulated day from every cell's row (in any order): hour by hour and for the day, replication 0's
    figures with the 95 % interval over replications of the day's totals."""
    rows = sorted(rows, key=lambda row: row["index"])
    by_rep = [rows[r * cells:(r + 1) * cells] for r in range(replications)]
    gpus, gpu_usd, kwh_usd = table["gpus_per_replica"], table["gpu_hour_usd"], table["electricity_usd_per_kwh"]
    days = []
    for rep in by_rep:
        total = {k: sum(row[k] for row in rep) for k in ("replica_s", "it_j", "facility_j", "agent_s",
                                                        "queued_agent_s", "tasks", "queued", "wait_s")}
        latency = np.concatenate([row["latency_s"] for row in rep])
        hour = np.concatenate([row["hour"] for row in rep])
        hours = []
        for h in range(HOURS):
            lat = latency[hour == h]
            tasks, queued = int(total["tasks"][h]), int(total["queued"][h])
            hours.append({"hour": h, "tasks": tasks, "concurrent_agents": total["agent_s"][h] / 3600.0,
                          "replica_hours": total["replica_s"][h] / 3600.0,
                          "gpu_hours": total["replica_s"][h] / 3600.0 * gpus,
                          "it_energy_kwh": total["it_j"][h] / 3.6e6,
                          "facility_energy_kwh": total["facility_j"][h] / 3.6e6,
                          "task_latency_mean_s": float(lat.mean()) if len(lat) else None,
                          "task_latency_p95_s": float(np.quantile(lat, 0.95)) if len(lat) else None,
                          "tasks_queued": queued,
                          "admission_wait_mean_s": float(total["wait_s"][h] / queued) if queued else 0.0})
        replica_h = float(total["replica_s"].sum()) / 3600.0
        mwh = float(total["facility_j"].sum()) / 3.6e9
        queued = int(total["queued"].sum())
        days.append({
            "tasks_per_day": int(total["tasks"].sum()),
            "replica_hours_per_day": replica_h, "gpu_hours_per_day": replica_h * gpus,
            "it_mwh_per_day": float(total["it_j"].sum()) / 3.6e9, "facility_mwh_per_day": mwh,
            "cost_per_day_usd": replica_h * gpus * gpu_usd + mwh * 1e3 * kwh_usd,
            "peak_replicas_mean_in_hour": max(h["replica_hours"] for h in hours),
            "task_latency_mean_s": float(latency.mean()) if len(latency) else None,
            "task_latency_p95_s": float(np.quantile(latency, 0.95)) if len(latency) else None,
            "tasks_queued": queued,
            "admission_wait_mean_s": float(total["wait_s"].sum() / queued) if queued else 0.0,
            "concurrent_agents_mean": float(total["agent_s"].sum()) / DAY_S,
            "hours": hours})
    out = {k: v for k, v in days[0].items()}
    out.update({"seed": seed, "replications": replications, "cells": cells, "tick_s": TICK_S,
                # a day in which no task finished has no task latency: it stays out of that interval
                "interval_95": {k: _interval([d[k] for d in days if d[k] is not None])
                                for k in ("replica_hours_per_day", "gpu_hours_per_day", "facility_mwh_per_day",
                                          "cost_per_day_usd", "task_latency_p95_s", "tasks_queued")}
                if replications > 1 else None})
    return out


def simulate_day(table: dict, seed: int = 0, replications: int = 1, cells: int = 1,
                 run: Callable[[dict, list[tuple[int, dict]]], list[list[dict]]] | None = None) -> dict:
    """The simulated day in this process (``run`` None) or through ``run(base, todo)`` (the CLI passes the
    executor), summarised by :func:`summarise`."""
    if replications < 1 or cells < 1:
        raise ApmwError(f"replications and cells must be at least 1, got {replications} and {cells}")
    base = {"table": table, "seed": seed, "cells": cells, "tick_s": TICK_S}
    todo = work(replications, cells)
    batches = run(base, todo) if run is not None else [simulate_cells(base, todo)]
    return summarise(table, [row for batch in batches for row in batch], seed, replications, cells)
