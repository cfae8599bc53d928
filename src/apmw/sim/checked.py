"""`apmw plan`'s checked N*: the analytic model brackets it, the simulator settles it.

The analytic plan (:func:`apmw.capacity.plan`) is fast but approximate where an engine runs
full: admission waits and preemptions near the KV pool's capacity are outside it. So the
answer ``apmw plan`` prints is re-derived in the simulator:

1. **Start at the analytic N*.** Simulate it once, to steer (a steering run). Every other
   count gets ``replications`` seeded runs at once (seeds ``spec.seed``, ``spec.seed + 1``,
   ...; the same seeds at every agent count, so two counts differ by the agents, not the
   luck), each long enough that the runs together record about ``tasks_per_point`` tasks and
   :data:`CALLS_PER_CHECKED_TASK` times as many calls (the TTFT and TPOT p95s are read over calls), and
   pools their tasks. A count the first runs already put clearly inside or outside the SLO
   (:data:`DECIDED_MARGIN`) gets no more runs. Such a count, or one with all its runs, is
   *settled*.
2. **Correct the analytic curve and step.** The simulated SLO slack at a point (largest
   figure / limit over the SLOs set, :func:`apmw.capacity.slo.slo_slack`) over the analytic
   one there is a correction factor; the next count is the largest whose corrected analytic
   slack is at most 1, kept strictly inside the bracket found so far.
3. **Stop** when a count that meets the SLO and the next one that misses it are one agent
   apart and both are settled (the analytic N* gets the rest of its runs here if it is one of
   them, and the search goes on if they move the bracket), or after ``max_points`` settled
   counts (then, while no settled count meets the SLO, halving towards one that does; a bracket
   wider than one agent is narrowed for up to ``max_points`` counts more).
4. **Not past the KV pool.** The search never goes above the most agents whose KV demand fits
   the pool in the analytic model (its 95th percentile, the analytic plan's memory check): when
   that count meets the SLO it is N*, and KV memory binds. Past it the simulator is no guide a
   plan can afford: the engine falls, every few hours of simulated time, into thrashing (it
   re-prefills evicted and preempted contexts while decode nearly stops, for thousands of
   seconds), and runs of a few hundred tasks seldom contain one, so they read the p95 low. On
   coding-agent, 28 agents gave a task p95 of 1,562 s over 330 simulated tasks and 2,021 s over
   14,093 (three runs of about 4,700; the SLO is 1,800 s), while at 27, the most whose KV fits,
   runs of about 10,000 tasks agree with the analytic p95 within 6 % (bench/README.md,
   agreement_at_nstar).

The analytic N* is often not where N* lies (near a full KV pool the analytic model misses what
binds), so its steering run saves the two runs it would otherwise get; it never enters the
answer, the interval or the points below unless it is settled (``check.steering`` in the JSON
lists it otherwise).

**The answer.** N* is the largest settled count that meets the SLO below the smallest that
misses it. Its interval runs from where the upper end of the pooled p95's confidence interval
crosses the SLO to where the lower end does (linear between settled counts, over all of them):
the agent counts the simulation cannot tell apart from N*. A count past the first miss whose
interval still reaches under the SLO (a miss the runs cannot tell from luck) widens it, and where
no count simulated is surely past the SLO its upper end is open. The pooled p95's interval is
the wider of two: the distribution-free one of the pooled tasks
(:func:`apmw.sim.result.quantile_interval`, which takes tasks as independent) and the replication
one, from how far the runs' own p95s spread (tasks of one run share the engine's state: near a KV
limit, runs differ by far more than their tasks suggest). The per-run p95s are listed beside it.

**What is simulated and what is not.** The figures the simulator measures at N* replace the
analytic ones (task latency, TTFT and TPOT p95, decode batch, resident KV mean, utilisation, and
the power, energy and cost built on them); the rest (the residence breakdown, the KV p95) is the
analytic model's at N*. The analytic plan's own answer is kept under ``analytic``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
from scipy.stats import t as student_t

from apmw.capacity import Plan
from apmw.capacity.api_inputs import require_plan
from apmw.capacity.closed_loop import closed_loop_model
from apmw.capacity.economics import economics, fleet_size
from apmw.capacity.search import largest_near, largest_passing
from apmw.capacity.slo import check_slo, slo_slack, slo_table
from apmw.errors import ApmwError
from apmw.sim.result import SimResult, percentiles, quantile_interval
from apmw.sim.run import DEFAULT_WARMUP_SHARE, MAX_AGENTS, MAX_DURATION_S, simulate, unsupported_on_one_replica

# Tasks recorded per agent count, pooled over the replications: about 300 puts the p95 in a
# distribution-free 95 % interval of roughly +-10 % on the bundled examples (docs/simulate.md).
CHECK_TASKS_PER_POINT = 300
# ... and at least this many calls per checked task, where the tasks make fewer. The TTFT and TPOT p95s
# are read over calls: support-chat's tasks are 1.5 calls each and its TTFT p99 is about four times its
# p95 (heavy-tailed prompts), so 300 tasks held some 450 calls, runs of 140, whose TTFT p95s ran from 2 to
# 49 s at 15 agents (60,000-call runs: 4.5-4.6 s), and the check settled N* at 11 where long runs put it
# at 18-20 (docs/simulate.md, "Calls as well as tasks"). Coding-agent and deep-research make 30-80
# calls a task, so the tasks already record more.
CALLS_PER_CHECKED_TASK = 10
CHECK_REPLICATIONS = 3
# Agent counts settled at most (each is up to ``replications`` runs; the analytic N*'s steering run aside).
CHECK_MAX_POINTS = 5
# Each run covers at least this many mean task times, so a fifth of it (the warm-up) fills the engine.
MIN_RUN_TASK_TIMES = 4.0
# A count whose first two or more runs each put its SLO slack this far from 1, on the same side, gets no
# more replications: it is clearly in or clearly out, and the runs are better spent near N*.
DECIDED_MARGIN = 0.2
# A run's own p95 joins the replication interval when it rests on at least this many samples.
MIN_RUN_SAMPLES = 20
# Before a bracket is found, one step raises the agent count by at most this share.
MAX_STEP_SHARE = 0.2
# Calls preempted above this share at the first count that misses the SLO: the KV pool, not the
# step time, is what stops N* (more KV memory would raise it).
KV_BINDING_PREEMPTED_SHARE = 0.01


@dataclass(frozen=True)
class SimulatedPoint:
    """One agent count, simulated ``len(runs)`` times with consecutive seeds; its tasks pooled."""

    agents: int
    runs: tuple[SimResult, ...]

    def _pooled(self, name: str) -> np.ndarray:
        return np.concatenate([r.samples[name] for r in self.runs])

    @property
    def completed_tasks(self) -> int:
        return sum(r.completed_tasks for r in self.runs)

    @property
    def task_latency(self) -> dict:
        return percentiles(self._pooled("task_latency_s"))

    def p95(self, name: str) -> float | None:
        v = self._pooled(name)
        return float(np.quantile(v, 0.95)) if len(v) else None

    def p95_interval(self, name: str) -> tuple[float, float]:
        """The pooled p95's 95 % confidence interval: the hull of the order-statistic interval of the
        pooled samples (tasks taken as independent) and the replication interval (the pooled p95
        plus or minus Student's t times the standard error of the runs' own p95s: tasks of one run
        share the engine's state, so runs differ by more than their tasks' spread says). (0, inf)
        where too few samples bracket it."""
        pooled = self._pooled(name)
        ci = quantile_interval(pooled)
        if ci is None:
            return 0.0, math.inf
        per_run = [float(np.quantile(r.samples[name], 0.95)) for r in self.runs
                   if len(r.samples[name]) >= MIN_RUN_SAMPLES]
        if len(per_run) < 2:
            return ci
        k = len(per_run)
        half = float(student_t.ppf(0.975, k - 1)) * float(np.std(per_run, ddof=1)) / math.sqrt(k)
        centre = float(np.quantile(pooled, 0.95))
        # a latency is not negative: a few runs far apart can put the replication interval's low end below 0
        return max(min(ci[0], centre - half), 0.0), max(ci[1], centre + half)

    def slack(self, spec_slo, end: int | None = None) -> float:
        """SLO slack at the pooled p95s; ``end`` 0 or 1 takes the low or high end of their intervals."""
        figures = [self.p95(n) if end is None else self.p95_interval(n)[end]
                   for n in ("task_latency_s", "ttft_s", "tpot_s")]
        return slo_slack(spec_slo, *figures)

    def mean_of(self, name: str) -> float | None:
        v = self._pooled(name)
        return float(v.mean()) if len(v) else None

    @property
    def preempted_share(self) -> float:
        calls = sum(len(r.samples["ttft_s"]) for r in self.runs)
        return sum(r.preemptions for r in self.runs) / calls if calls else 0.0

    def mean(self, field: str) -> float:
        return float(np.mean([getattr(r, field) for r in self.runs]))

    def to_dict(self, slo) -> dict:
        ttft, tpot = self.p95("ttft_s"), self.p95("tpot_s")
        return {
            "agents": self.agents, "completed_tasks": self.completed_tasks,
            "task_latency_s": self.task_latency,
            "task_latency_p95_interval_s": _interval(self.p95_interval("task_latency_s")),
            "task_latency_p95_by_run_s": [r.task_latency["p95"] for r in self.runs],
            "ttft_p95_s": ttft, "ttft_p95_interval_s": _interval(self.p95_interval("ttft_s")),
            "tpot_p95_s": tpot, "tpot_p95_interval_s": _interval(self.p95_interval("tpot_s")),
            "meets_slo": check_slo(slo, self.p95("task_latency_s"), ttft, tpot).meets,
            "slo_slack": _finite(self.slack(slo)), "preempted_call_share": self.preempted_share,
            "simulated_s_per_run": self.runs[0].duration_s, "seeds": [r.seed for r in self.runs],
        }


def interval_text(interval: list | tuple, counts: list[int]) -> str:
    """N*'s interval as tables print it: "28-30"; "<17-18" or "30->33" where an end lies below or above
    the agent ``counts`` simulated."""
    lo, hi = interval
    return f"{f'<{min(counts):,}' if lo is None else f'{lo:,}'}-{f'>{max(counts):,}' if hi is None else f'{hi:,}'}"


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _interval(ci: tuple[float, float]) -> list[float | None]:
    return [ci[0], None if math.isinf(ci[1]) else ci[1]]


def _crossing(points: list[SimulatedPoint], slack: Callable[[SimulatedPoint], float]) -> int | None:
    """The largest agent count whose slack, linear between simulated counts, is at most 1 below the
    first count that exceeds it; None when even the smallest simulated count exceeds it."""
    previous = None
    for p in points:
        s = slack(p)
        if s > 1.0:
            if previous is None:
                return None
            n0, s0 = previous
            share = (1.0 - s0) / (s - s0) if s > s0 else 0.0
            return min(n0 + int(math.floor(share * (p.agents - n0))), p.agents - 1)
        previous = (p.agents, s)
    assert previous is not None
    return previous[0]


def n_star_interval(points: list, high_end: Callable, low_end: Callable) -> tuple[int | None, int | None]:
    """The agent counts the simulation cannot tell from N*, from the settled ``points`` (by count): up to where the
    high end of the SLO slack's interval crosses 1, and up to where its low end does. Every count takes part, so
    one past the first miss whose interval still reaches under the SLO (a miss the runs cannot tell from luck)
    widens it; where no count is surely past the SLO the upper end is open (None)."""
    upper = None if all(low_end(p) <= 1.0 for p in points) else _crossing(points, low_end)
    return _crossing(points, high_end), upper


@dataclass(frozen=True)
class CheckedPlan:
    """``plan`` re-derived at the simulated N* (module docstring); ``analytic`` is the plan it started from."""

    plan: Plan                       # the plan at the checked N*, its economics from the simulation
    analytic: Plan
    points: tuple[SimulatedPoint, ...]   # every settled agent count simulated, by count
    agents: int                      # the checked N*
    interval: tuple[int | None, int | None]   # (None: below / above the counts simulated)
    tasks_per_point: int
    replications: int
    kv_limit: int                    # the most agents whose KV demand fits the pool (analytic): the search's ceiling
    # counts simulated once to steer the search and not settled (not part of the answer)
    steering: tuple[SimulatedPoint, ...] = ()

    @property
    def at(self) -> SimulatedPoint:
        return next(p for p in self.points if p.agents == self.agents)

    @property
    def first_miss(self) -> SimulatedPoint | None:
        return next((p for p in self.points if p.agents > self.agents), None)

    @property
    def binding(self) -> tuple[str, list[str] | None]:
        """(binding constraint, the SLOs missed) at the first simulated count past N*; ``kv_memory``
        with no SLO where N* is the most agents whose KV fits (the search goes no higher)."""
        if self.agents >= self.kv_limit:
            return "kv_memory", None
        miss = self.first_miss
        if miss is None:
            return "not_found", None
        slo = self.plan.spec.slo
        failed = list(check_slo(slo, miss.p95("task_latency_s"), miss.p95("ttft_s"), miss.p95("tpot_s")).failed)
        if miss.preempted_share >= KV_BINDING_PREEMPTED_SHARE:
            return "kv_memory", failed
        return "slo", failed

    def to_dict(self) -> dict:
        d = self.plan.to_dict()
        at, slo = self.at, self.plan.spec.slo
        ttft, tpot, task_p95 = at.p95("ttft_s"), at.p95("tpot_s"), at.p95("task_latency_s")
        verdict = check_slo(slo, task_p95, ttft, tpot)
        binding, binding_slo = self.binding
        a = self.analytic.to_dict()
        x = self.agents / at.task_latency["mean"]        # tasks per second, by Little's law
        d.update({
            "agents_per_replica": self.agents,
            "agents_per_replica_max": self.agents,
            "agents_per_replica_interval": list(self.interval),
            "agents_per_replica_source": "simulated",
            "binding_constraint": binding, "binding_slo": binding_slo,
            "meets_slo": verdict.meets, "slo_failed": list(verdict.failed),
            "slo_verdict": slo_table(slo, task_p95, ttft, tpot),
            "task_latency_s": at.task_latency,
            "task_latency_p95_interval_s": _interval(at.p95_interval("task_latency_s")),
            "completed_tasks": at.completed_tasks,
            "ttft_p95_s": ttft, "tpot_p95_s": tpot, "time_per_output_token_s": at.mean_of("tpot_s"),
            "warnings": self.plan.warnings_at(ttft, tpot),
            "decode_batch_mean": at.mean("decode_batch_mean"), "running_batch_mean": at.mean("running_batch_mean"),
            "engine_utilisation": at.mean("engine_utilisation"), "compute_bound_share": at.mean("compute_bound_share"),
            "kv_tokens_resident_mean": at.mean("kv_tokens_resident_mean"),
            "preempted_call_share": at.preempted_share,
            "sessions_per_s": x, "tokens_per_s": {k: x * v for k, v in self.plan.tokens_per_task.items()},
            "analytic": {k: a[k] for k in ("agents_per_replica", "binding_constraint", "binding_slo", "meets_slo",
                                           "task_latency_s", "ttft_p95_s", "tpot_p95_s", "agents_per_mw")},
            "check": {"tasks_per_point": self.tasks_per_point,
                      "calls_per_point": CALLS_PER_CHECKED_TASK * self.tasks_per_point,
                      "replications": self.replications,
                      "kv_limit_agents": self.kv_limit,
                      "points": [p.to_dict(slo) for p in self.points],
                      "steering": [p.to_dict(slo) for p in self.steering]},
        })
        return d


def why_not_checked(analytic: Plan) -> str | None:
    """Why the simulator cannot settle ``analytic``'s N* (None when it can): a spec it does not model, an N* at or
    past the most agents it runs (the check simulates counts on both sides of N*), or tasks so long that a run
    covering ``MIN_RUN_TASK_TIMES`` of them is past the longest run (``MAX_DURATION_S``)."""
    gap = unsupported_on_one_replica(analytic.spec)
    if gap:
        return f"the simulator does not model {gap}"
    if analytic.agents_per_replica >= MAX_AGENTS:
        return (f"the analytic N* ({analytic.agents_per_replica:,} agents) is at or past the {MAX_AGENTS:,} agents "
                "the simulator runs")
    task_s = analytic.at.task_latency_mean_s
    if MIN_RUN_TASK_TIMES * task_s > MAX_DURATION_S:
        return (f"a task takes {task_s:,.0f} s ({task_s / 86400:,.1f} days) on average at N*, and a run covers at "
                f"least {MIN_RUN_TASK_TIMES:g} of them so that its warm-up fills the engine: longer than the "
                f"{MAX_DURATION_S / 86400:g} days the simulator runs")
    return None


def check_plan(analytic: Plan, tasks_per_point: int = CHECK_TASKS_PER_POINT, replications: int = CHECK_REPLICATIONS,
               max_points: int = CHECK_MAX_POINTS, progress: Callable[[str, float], None] | None = None
               ) -> CheckedPlan:
    """The analytic plan's N* settled in the simulator (module docstring). ``progress(what, done)``
    is told what runs and the share of the largest possible work done."""
    analytic = require_plan(analytic, "check_plan")
    spec, replica = analytic.spec, analytic.replica
    why = why_not_checked(analytic)
    if why:
        raise ApmwError(f"{why}, so N* cannot be checked; use --analytic")
    if tasks_per_point < 1 or replications < 1 or max_points < 1:
        raise ApmwError("tasks_per_point, replications and max_points must each be at least 1")
    model = closed_loop_model(spec, replica)
    kv_limit = largest_near(lambda n: model.evaluate(n).fits_memory, max(analytic.agents_per_replica, 1), MAX_AGENTS)
    analytic_slack: dict[int, float] = {}

    def slack_a(n: int) -> float:
        if n not in analytic_slack:
            ev = model.evaluate(n)
            analytic_slack[n] = slo_slack(spec.slo, ev.task_latency_p95_s, ev.ttft_p95_s, ev.tpot_p95_s)
        return analytic_slack[n]

    points: dict[int, SimulatedPoint] = {}
    durations: dict[int, float] = {}
    runs_total = max_points * replications
    per_run = math.ceil(tasks_per_point / replications)
    # a run records at least its share of the calls too: as many tasks as hold them
    per_run = max(per_run, math.ceil(CALLS_PER_CHECKED_TASK * per_run / model.sample.mean_calls))

    def add_run(n: int) -> None:
        """One more seeded run at ``n`` agents (seed ``spec.seed + runs so far``), pooled into its point."""
        if n not in durations:      # every run of a count is as long
            x = n / model.evaluate(n).task_latency_mean_s           # tasks started per second, analytic
            durations[n] = min(max(per_run / ((1 - DEFAULT_WARMUP_SHARE) * x), MIN_RUN_TASK_TIMES * n / x),
                               MAX_DURATION_S)
        duration = durations[n]
        before = points[n].runs if n in points else ()
        i = len(before)
        done = min(sum(len(p.runs) for p in points.values()) / runs_total, 1.0)
        what = f"simulating {n:,} agents, run {i + 1}/{replications}"
        cb = None
        if progress is not None:
            told = progress
            told(what, done)

            def cb(now: float, end: float) -> None:
                told(what, min(done + now / end / runs_total, 1.0))
        run = simulate(spec, n, duration_s=duration, seed=spec.seed + i, replica=replica, progress=cb)
        points[n] = SimulatedPoint(n, (*before, run))

    def settled(n: int) -> bool:
        p = points[n]
        return len(p.runs) >= replications or _decided(p, spec.slo)

    def settle(counts) -> bool:
        """Give ``counts`` their remaining replications; whether any ran."""
        ran = False
        for k in counts:
            if k is not None:
                while not settled(k):
                    add_run(k)
                    ran = True
        return ran

    # the analytic N* is simulated once first: that run steers the search, and the rest of its
    # replications run only if it ends up bracketing N* (it often does not: the analytic model misses
    # what binds near a full KV pool). Every other count gets its replications at once.
    add_run(max(analytic.agents_per_replica, 1))
    while True:
        lo, hi = _bracket(points, spec.slo)
        at_limit = lo is not None and lo >= kv_limit     # the most agents whose KV fits meet the SLO
        if at_limit or (lo is not None and hi is not None and hi - lo <= 1):
            if settle((lo,) if at_limit else (lo, hi)):
                continue                 # the added runs may move the bracket
            break
        # at most max_points counts get their replications (the first count's steering run aside), unless none
        # of them meets the SLO (the search then halves its way down to one that does) or the bracket they make
        # is wider than one agent (it is then narrowed, up to max_points counts more: its lower end alone would
        # be the answer, 33 agents where 66 missed the SLO by 1 %)
        count = sum(settled(k) for k in points)
        if count < max_points:
            nxt = _next_count(points, lo, hi, spec.slo, slack_a, kv_limit)
        elif lo is None and hi is not None and hi > 1:
            nxt = min(_next_count(points, lo, hi, spec.slo, slack_a, kv_limit) or hi, hi // 2)
        elif lo is not None and hi is not None and count < 2 * max_points:
            nxt = _next_count(points, lo, hi, spec.slo, slack_a, kv_limit)
        else:
            nxt = None
        if nxt is None or nxt in points:
            if settle((lo, hi)):        # the search stops here: the answer rests on settled counts
                continue
            break
        add_run(nxt)
        settle((nxt,))
    full = {k: p for k, p in points.items() if settled(k)}
    ordered = [full[k] for k in sorted(full)]
    steering = tuple(points[k] for k in sorted(points) if k not in full)
    lo, hi = _bracket(full, spec.slo)
    if lo is None:
        first = ordered[0] if ordered else points[min(points)]
        raise ApmwError(
            f"the simulator misses the SLO at every agent count it checked, down to {first.agents} "
            f"(task p95 {first.p95('task_latency_s') or math.nan:,.0f} s over {first.completed_tasks:,} tasks; "
            f"the analytic N* was {analytic.agents_per_replica}): run apmw simulate at fewer agents, or "
            "use --analytic for the analytic answer")
    interval = n_star_interval(ordered, lambda p: p.slack(spec.slo, 1), lambda p: p.slack(spec.slo, 0))
    if lo >= kv_limit:          # past the pool the simulation is not asked (module docstring, step 4)
        interval = (interval[0], kv_limit)
    at = full[lo]
    econ = economics(spec, replica, lo, at.task_latency["mean"], at.mean("engine_utilisation"),
                     at.mean("compute_bound_share"))
    fleet = None
    if spec.fleet.target_agents is not None:
        fleet = fleet_size(spec.fleet.target_agents, lo, replica.gpus, econ.facility_power_w,
                           econ.provisioned_power_w)
    if progress is not None:
        progress("done", 1.0)
    return CheckedPlan(plan=replace(analytic, at=model.evaluate(lo), economics=econ, fleet=fleet), analytic=analytic,
                       points=tuple(ordered), agents=lo, interval=interval, tasks_per_point=tasks_per_point,
                       replications=replications, kv_limit=kv_limit, steering=steering)


def _decided(point: SimulatedPoint, slo) -> bool:
    """A count is settled before its last replication when at least two runs each put its SLO slack
    DECIDED_MARGIN or more on the same side of 1. Runs, not the pooled interval, decide: tasks of one
    run share the engine's state, so one run's interval understates how much the next run differs."""
    if len(point.runs) < 2:
        return False
    slacks = [SimulatedPoint(point.agents, (r,)).slack(slo) for r in point.runs]
    return all(x <= 1 - DECIDED_MARGIN for x in slacks) or all(x >= 1 + DECIDED_MARGIN for x in slacks)


def _bracket(points: dict[int, SimulatedPoint], slo) -> tuple[int | None, int | None]:
    """(largest count meeting the SLO below the smallest that misses it, that smallest missing count)."""
    missing = [n for n, p in points.items() if p.slack(slo) > 1.0]
    hi = min(missing) if missing else None
    meeting = [n for n, p in points.items() if p.slack(slo) <= 1.0 and (hi is None or n < hi)]
    return (max(meeting) if meeting else None), hi


def _next_count(points: dict[int, SimulatedPoint], lo: int | None, hi: int | None, slo,
                slack_a: Callable[[int], float], kv_limit: int) -> int | None:
    """Where to simulate next (None: nowhere left to look). Inside a bracket, where the line through
    its two ends' simulated slacks crosses 1; before there is one, the largest count whose analytic
    slack, times the simulated over the analytic slack at the count just simulated, is at most 1.
    Never above ``kv_limit`` (module docstring, step 4)."""
    if lo is not None and hi is not None:
        s0, s1 = points[lo].slack(slo), points[hi].slack(slo)
        share = (1.0 - s0) / (s1 - s0) if math.isfinite(s1) and s1 > s0 else 0.5
        return min(max(lo + int(round(share * (hi - lo))), lo + 1), hi - 1, kv_limit)
    ref = lo if lo is not None else hi
    assert ref is not None
    correction = points[ref].slack(slo) / max(slack_a(ref), 1e-12)
    n = largest_passing(lambda m: slack_a(m) * correction <= 1.0, MAX_AGENTS if hi is None else hi - 1)
    # the analytic curve misses what binds in the simulator (a KV pool that runs short), so it may
    # point far too high: a step up goes at most MAX_STEP_SHARE higher (down, the jump is on the safe side)
    n = min(n, math.ceil(ref * (1 + MAX_STEP_SHARE)))
    if n < 1 and hi is not None and hi > 1:
        n = hi // 2         # the corrected curve misses even at one agent: halve towards it
    if lo is not None:
        n = max(n, lo + 1)
    if hi is not None:
        n = min(n, hi - 1)
    n = min(n, kv_limit)
    return n if n >= 1 and (lo is None or n > lo) else None
