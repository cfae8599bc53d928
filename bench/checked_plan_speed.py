"""How long does the default `apmw plan` (N* settled in the simulator) take on each bundled example?

Run: .venv/bin/python bench/checked_plan_speed.py [--check-tasks 300] [--cpu N]

Prints, per bundled example: the analytic plan's time (the baseline, same process), the checked
plan's time and their ratio, the agent counts settled (with all their runs) and the runs simulated
in all (a steering run at the analytic N* included), the simulated seconds covered and the
simulated seconds per wall second, and the answer (checked N*, its interval, the analytic N*).
The issue's target is 15 s per example on one core: the process is pinned to one CPU (``--cpu``,
default the first this process may use), so wall time on an otherwise idle core is the figure to
compare (CPU seconds printed beside it).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from apmw import load_spec, plan
from apmw.sim.checked import CHECK_TASKS_PER_POINT, check_plan, interval_text

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check-tasks", type=int, default=CHECK_TASKS_PER_POINT)
    ap.add_argument("--cpu", type=int, default=min(os.sched_getaffinity(0)), help="the one CPU to run on")
    args = ap.parse_args()
    os.sched_setaffinity(0, {args.cpu})
    print(f"pinned to CPU {args.cpu}")
    print(f"{'example':<16}{'analytic s':>11}{'checked s':>10}{'CPU s':>8}{'ratio':>8}{'counts':>8}{'runs':>6}"
          f"{'sim s':>10}{'sim s/wall s':>13}   answer")
    for path in sorted(EXAMPLES.glob("*.yaml")):
        spec = load_spec(path)
        plan(spec)                                    # warm caches (config parsing, imports)
        t = time.perf_counter()
        analytic = plan(spec)
        analytic_s = time.perf_counter() - t
        t, cpu = time.perf_counter(), time.process_time()
        checked = check_plan(analytic, tasks_per_point=args.check_tasks)
        checked_s, cpu_s = time.perf_counter() - t, time.process_time() - cpu
        runs = [r for p in checked.points + checked.steering for r in p.runs]
        simulated = sum(r.simulated_s for r in runs)
        span = interval_text(checked.interval, [p.agents for p in checked.points])
        answer = (f"N* {checked.agents} ({span}), "
                  f"analytic {analytic.agents_per_replica}")
        print(f"{path.stem:<16}{analytic_s:>11.3f}{checked_s:>10.1f}{cpu_s:>8.1f}{checked_s / analytic_s:>8.0f}"
              f"{len(checked.points):>8}{len(runs):>6}{simulated:>10,.0f}{simulated / checked_s:>13,.0f}   {answer}")


if __name__ == "__main__":
    main()
