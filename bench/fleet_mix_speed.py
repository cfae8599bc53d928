"""How long does `apmw fleet` take on a fleet file (mixed fleets), and where does the time go?

Run: .venv/bin/python bench/fleet_mix_speed.py [FLEET.yaml]

Prints, for the bundled fleet file (examples/fleets/mixed-fleet.yaml) or the one given, the wall and
CPU time of the whole comparison (every pool planned, every placement priced: what `apmw fleet
FLEET.yaml` does after loading), the pools planned alone and shared, the distinct hourly mixes the
shared pools were sized at and the closed-loop evaluations made, best of 3 runs in one process.
CPU time is what to compare across machines (this one is often shared).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from apmw.capacity import fleet_mix as mix_module
from apmw.capacity.closed_loop import ClosedLoopModel
from apmw.spec.fleet_file import load_fleet_file

FLEET = Path(__file__).resolve().parents[1] / "examples" / "fleets" / "mixed-fleet.yaml"


def main() -> None:
    loaded = load_fleet_file(sys.argv[1] if len(sys.argv) > 1 else FLEET)
    counts = {"evaluations": 0, "mixes": 0}
    evaluate, mixed_hour = ClosedLoopModel.evaluate, mix_module._mixed_hour

    def counted_evaluate(self, agents):
        counts["evaluations"] += 1
        return evaluate(self, agents)

    def counted_hour(*args, **kwargs):
        counts["mixes"] += 1
        return mixed_hour(*args, **kwargs)

    ClosedLoopModel.evaluate = counted_evaluate
    mix_module._mixed_hour = counted_hour
    result = mix_module.fleet_mix(loaded)
    ClosedLoopModel.evaluate, mix_module._mixed_hour = evaluate, mixed_hour
    best_wall = best_cpu = float("inf")
    for _ in range(3):
        wall, cpu = time.perf_counter(), time.process_time()
        mix_module.fleet_mix(loaded)
        best_wall, best_cpu = min(best_wall, time.perf_counter() - wall), min(best_cpu, time.process_time() - cpu)
    served = [p for p in result.pools if p.served]
    shared = sum(len(p.workloads) > 1 for p in served)
    print(f"{'fleet file':<24}{'wall s':>8}{'CPU s':>8}{'pools':>7}{'shared':>8}{'mixes':>7}{'evaluations':>13}")
    print(f"{Path(loaded.path).name:<24}{best_wall:>8.2f}{best_cpu:>8.2f}{len(served):>7}{shared:>8}"
          f"{counts['mixes']:>7}{counts['evaluations']:>13}")
    print(f"cheapest: {result.to_dict()['cheapest_placement']}")


if __name__ == "__main__":
    main()
