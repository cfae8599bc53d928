"""The day simulated task by task (apmw.sim.fleet_day) against the analytic day (apmw.capacity.fleet_day)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from apmw.capacity import plan
from apmw.capacity.closed_loop import ClosedLoopModel
from apmw.capacity.fleet_day import fleet_day
from apmw.design_search.executor import execute
from apmw.errors import ApmwError
from apmw.sim.fleet_day import DAY_S, replica_table, simulate_cells, simulate_day
from apmw.spec import load_spec


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "coding-agent.yaml"


@functools.cache
def _planned(scale: float = 1.0, scale_up_s: float = 0.0):
    s = load_spec(EXAMPLE)
    s = s.model_copy(update={"fleet": s.fleet.model_copy(update={
        "tasks_per_hour": [t * scale for t in s.fleet.tasks_per_hour], "scale_up_s": scale_up_s})})
    p = plan(s)
    return p, fleet_day(p, compare_routing=False), replica_table(p, ClosedLoopModel(s, p.replica, p.sample))


@functools.cache
def _coding_day():
    p, analytic, table = _planned()
    return analytic, simulate_day(table, seed=7)


def test_simulated_day_within_5_percent_of_analytic():
    analytic, sim = _coding_day()
    assert 25 <= max(h.replicas for h in analytic.hours) <= 60          # tens of replicas at the peak
    replica_hours = sum(h.gpu_hours for h in analytic.hours) / (sim["gpu_hours_per_day"] / sim["replica_hours_per_day"])
    assert sim["replica_hours_per_day"] == pytest.approx(replica_hours, rel=0.05)
    assert sim["facility_mwh_per_day"] == pytest.approx(analytic.facility_mwh_per_day, rel=0.05)
    assert sim["tasks_per_day"] == pytest.approx(analytic.tasks_per_day, rel=0.03)   # Poisson: sd 0.5 %
    assert sim["tasks_queued"] == 0          # no scale-up delay: the fleet is never short
    # the peak hour's replicas follow the analytic day's (hourly means, within the autoscaler's rounding)
    peak = max(range(24), key=lambda h: analytic.hours[h].replicas)
    assert sim["hours"][peak]["replica_hours"] == pytest.approx(analytic.hours[peak].replicas, rel=0.1)


def test_littles_law_over_the_simulated_day():
    _, sim = _coding_day()
    started_times_residence = sim["tasks_per_day"] * sim["task_latency_mean_s"]
    integral = sim["concurrent_agents_mean"] * DAY_S
    # edge effects only (tasks in flight at midnight, about 60 of 40,000), well inside 2 %
    assert started_times_residence == pytest.approx(integral, rel=0.02)


def test_same_seed_same_day_on_one_and_two_workers():
    _, _, table = _planned(0.5)

    def on(workers: int) -> dict:
        return simulate_day(table, seed=3, replications=2, cells=3,
                            run=lambda base, todo: list(execute(base, todo, workers, fn=simulate_cells)))

    one, two = on(1), on(2)
    assert one == two
    assert one["interval_95"]["replica_hours_per_day"] is not None
    other = simulate_day(table, seed=4, cells=3)
    assert other["tasks_per_day"] != one["tasks_per_day"]          # the seed is used


def test_short_fleet_queues_tasks_at_admission():
    # the autoscaler reacts to the agents it sees; with a 30-minute scale-up the morning ramp outruns it
    _, _, table = _planned(1.0, scale_up_s=1800.0)
    sim = simulate_day(table, seed=7)
    assert sim["tasks_queued"] > 100
    assert sim["admission_wait_mean_s"] > 10.0
    ramp = sum(sim["hours"][h]["tasks_queued"] for h in (7, 8, 9, 10))
    night = sum(sim["hours"][h]["tasks_queued"] for h in (0, 1, 2, 3))
    assert ramp > night
    _, ready = _coding_day()
    assert sim["task_latency_p95_s"] > ready["task_latency_p95_s"]       # the wait is in the task time


def test_bad_input_is_refused():
    p, _, _ = _planned()
    with pytest.raises(ApmwError, match="replicas-scale"):
        replica_table(p, ClosedLoopModel(p.spec, p.replica, p.sample), scale=0.0)
    with pytest.raises(ApmwError, match="at least 1"):
        simulate_day(_planned()[2], cells=0)


def test_a_day_too_big_to_simulate_is_refused_with_what_it_would_take(tmp_path):
    """A day of 10^9 tasks (within the spec's limits) was simulated task by task: about three core-hours with
    nothing said (fuzzing, session 45). Refused before any work, with the estimate and what to do instead."""
    import subprocess

    import yaml

    from tests.conftest import EXAMPLES
    from tests.e2e.test_cli import APMW

    d = yaml.safe_load((EXAMPLES / "coding-agent.yaml").read_text())
    d["fleet"]["tasks_per_hour"] = [0.0] * 23 + [1e9]
    spec = tmp_path / "huge.yaml"
    spec.write_text(yaml.safe_dump(d))
    r = subprocess.run([APMW, "fleet", str(spec), "--simulate"], capture_output=True, text=True, timeout=300)
    said = " ".join(r.stderr.split())
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "1,000,000,000 tasks to simulate one by one" in said and "core-hours" in said
    assert "--replicas-scale" in said


@pytest.mark.parametrize("scale", [0.0, 1e-5])
def test_replicated_days_in_which_no_task_finishes(scale):
    """A day with no finished task has no task latency: replications of an idle or almost idle fleet still give the
    day's intervals (the latency's over the days that have one) instead of an internal error, none below zero."""
    _, _, table = _planned(scale)
    sim = simulate_day(table, seed=3, replications=8)
    assert sim["interval_95"]["replica_hours_per_day"] is not None
    assert all(low >= 0 for low, _ in filter(None, sim["interval_95"].values()))
    if scale == 0.0:
        assert sim["tasks_per_day"] == 0 and sim["interval_95"]["task_latency_p95_s"] is None
