"""How long does `apmw fleet --simulate` take for a day of a 1,000-replica fleet?

Run: .venv/bin/python bench/fleet_sim_speed.py [--scale K] [--seed S]

The bundled coding-agent example's day of demand times K (default 37: about 1,000 replicas at the
analytic peak, 988, and 1.48 million tasks a day), simulated task by task (apmw.sim.fleet_day) in cells of about
100 replicas on the local process pool (the executor of apmw search) with 1 and 2 workers. Prints the
wall time of each against the analytic day's in the same process (the ratio is what to compare across
machines), the two runs' agreement (same seed, same day), and the simulated day beside the analytic one
on replica-hours and facility MWh (the issue's bar: within 5 %; 10 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import time

from plan_speed import EXAMPLES     # this folder: run as python bench/fleet_sim_speed.py

from apmw import load_spec, plan
from apmw.capacity.closed_loop import ClosedLoopModel
from apmw.capacity.fleet_day import fleet_day
from apmw.design_search.executor import execute
from apmw.sim.fleet_day import cells_for, replica_table, simulate_cells, simulate_day


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=float, default=37.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    spec = load_spec(EXAMPLES / "coding-agent.yaml")
    spec = spec.model_copy(update={"fleet": spec.fleet.model_copy(
        update={"tasks_per_hour": [t * args.scale for t in spec.fleet.tasks_per_hour]})})
    start = time.perf_counter()
    result = plan(spec)
    day = fleet_day(result, compare_routing=False)
    t_analytic = time.perf_counter() - start
    table = replica_table(result, ClosedLoopModel(spec, result.replica, result.sample))
    peak = max(h.replicas for h in day.hours)
    cells = cells_for(peak)
    replica_hours = sum(h.gpu_hours for h in day.hours) / table["gpus_per_replica"]
    print(f"coding-agent x{args.scale:g}: analytic peak {peak:,} replicas, {day.tasks_per_day:,.0f} tasks, "
          f"{replica_hours:,.1f} replica-hours, {day.facility_mwh_per_day:,.3f} MWh; analytic day "
          f"{t_analytic:.2f} s (plan included); {cells} cells")
    print(f"{'workers':>8}{'wall s':>9}{'x analytic':>12}{'replica-h':>12}{'vs':>8}{'MWh':>9}{'vs':>8}{'p95 s':>8}"
          f"{'queued':>8}")
    answers = []
    for workers in (1, 2):
        start = time.perf_counter()
        sim = simulate_day(table, seed=args.seed, cells=cells,
                           run=lambda base, todo: list(execute(base, todo, workers, fn=simulate_cells)))
        wall = time.perf_counter() - start
        answers.append(sim)
        print(f"{workers:>8}{wall:>9.1f}{wall / t_analytic:>12.0f}{sim['replica_hours_per_day']:>12,.1f}"
              f"{sim['replica_hours_per_day'] / replica_hours - 1:>+8.1%}{sim['facility_mwh_per_day']:>9.3f}"
              f"{sim['facility_mwh_per_day'] / day.facility_mwh_per_day - 1:>+8.1%}"
              f"{sim['task_latency_p95_s']:>8.0f}{sim['tasks_queued']:>8,}")
    print("same seed, same day on 1 and 2 workers:", answers[0] == answers[1])


if __name__ == "__main__":
    main()
