"""How fast is `apmw plan`, and how much does its sampled p95 move with the seed?

Run: .venv/bin/python bench/plan_speed.py

Prints, per bundled example: full SLO solves per second in-process (session
sampling + N* search + economics), the time of one solve, the share spent
sampling sessions, and the spread of the p95 task latency and of N* across 10
seeds (range and standard deviation). The baseline in the same process is the cost of sampling alone, so the
ratio (solve / sampling) is stable across machines.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from apmw import load_spec, plan
from apmw.capacity import sessions
from apmw.capacity.sessions import default_session_count, sample_sessions
from apmw.perf import replica_from_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def best_of(fn, repeats: int = 7) -> float:
    """The fastest of ``repeats`` calls, each with the process's session samples forgotten (a plan would
    otherwise reuse the last one's, and sampling would cost nothing)."""
    times = []
    for _ in range(repeats):
        sessions._SAMPLES.clear()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    print(f"{'example':<16}{'sessions':>9}{'solve ms':>10}{'plans/s':>9}{'sampling ms':>13}{'solve/sampling':>16}"
          f"{'p95 spread':>12}{'N* range':>12}{'N* sd':>8}")
    for path in sorted(EXAMPLES.glob("*.yaml")):
        spec = load_spec(path)
        replica = replica_from_spec(spec)
        plan(spec)  # warm caches (config parsing, imports)
        solve = best_of(lambda: plan(spec))
        sampling = best_of(lambda: sample_sessions(spec, replica))
        p95s, stars = [], []
        for seed in range(10):
            result = plan(spec.model_copy(update={"seed": seed}))
            p95s.append(result.at.task_latency_p95_s)
            stars.append(result.agents_per_replica)
        spread = statistics.pstdev(p95s) / statistics.mean(p95s)
        print(f"{path.stem:<16}{default_session_count(spec):>9}{solve * 1e3:>10.1f}{1 / solve:>9.1f}{sampling * 1e3:>13.1f}"
              f"{solve / sampling:>16.2f}{spread:>11.1%}{f'{min(stars)}-{max(stars)}':>12}"
              f"{statistics.pstdev(stars):>8.2f}")


if __name__ == "__main__":
    main()
