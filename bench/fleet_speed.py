"""How long does `apmw fleet` take for a day of demand, against the plan it starts from?

Run: .venv/bin/python bench/fleet_speed.py

Prints, for the bundled coding-agent example with its day of demand, the time of the plan (N*)
and of the day on top of it (24 hours, each a Little's-law fixed point over closed-loop
evaluations), the closed-loop evaluations the day made, and the ratio day / plan: the ratio
is what to compare across machines.
"""

from __future__ import annotations

from plan_speed import EXAMPLES, best_of     # this folder: run as python bench/fleet_speed.py

from apmw import load_spec, plan
from apmw.capacity import fleet_day as fleet_module
from apmw.capacity.closed_loop import ClosedLoopModel


def main() -> None:
    spec = load_spec(EXAMPLES / "coding-agent.yaml")
    result = plan(spec)                      # warm caches
    evaluations = 0
    evaluate = ClosedLoopModel.evaluate

    def counted(self, agents):
        nonlocal evaluations
        evaluations += 1
        return evaluate(self, agents)

    ClosedLoopModel.evaluate = counted
    fleet_module.fleet_day(result)
    ClosedLoopModel.evaluate = evaluate
    t_plan = best_of(lambda: plan(spec))
    t_day = best_of(lambda: fleet_module.fleet_day(result))
    print(f"{'example':<14}{'plan ms':>9}{'day ms':>9}{'evaluations':>13}{'day/plan':>10}")
    print(f"{'coding-agent':<14}{t_plan * 1e3:>9.1f}{t_day * 1e3:>9.1f}{evaluations:>13}{t_day / t_plan:>10.2f}")


if __name__ == "__main__":
    main()
