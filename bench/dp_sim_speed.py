"""How fast does the simulator run a replica of many attention data-parallel ranks?

Run: .venv/bin/python bench/dp_sim_speed.py [--agents 2221] [--duration-s 20] [--repeat 2]

The replica is the buyers' comparison's widest (DeepSeek-V4-Pro on a GB300 NVL72 rack as one DP72 x EP72
replica, SGLang, 60 tokens/s per agent: ``bench/buyers_comparison.py``'s spec) at its analytic N*. Each
iteration prices its 72 ranks' KV reads and attention FLOPs in one pass over all of them
(``apmw.sim.pricing.Pricer.loads_by_rank``); the baseline, in the same process, prices them rank by rank with
``Pricer.loads`` (what the simulator did before). Both give the same SimResult (compared here, less wall
time). Prints each one's best wall time of ``--repeat`` runs and the ratio.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402

from buyers_comparison import spec_for  # noqa: E402
from apmw.sim import simulate  # noqa: E402
from apmw.sim.pricing import Pricer  # noqa: E402
from apmw.spec import spec_from_dict  # noqa: E402


def _rank_by_rank(self, kv, n, prefill):
    """The baseline: each rank's loads on its own."""
    loads = [self.loads(k, m, p) for k, m, p in zip(kv, n, prefill)]
    return np.array([x for x, _ in loads]), np.array([y for _, y in loads])


def _best(spec, agents: int, duration_s: float, repeat: int) -> tuple[float, dict]:
    best, result = float("inf"), {}
    for _ in range(repeat):
        t = time.perf_counter()
        result = simulate(spec, agents, duration_s=duration_s, seed=1).to_dict()
        best = min(best, time.perf_counter() - t)
    result.pop("wall_s", None)
    return best, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=2221)
    ap.add_argument("--duration-s", type=float, default=20.0)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    spec = spec_from_dict(spec_for("GB300", {"dp_attention": 72, "ep": 72, "redundant_experts": 48}, 60.0))
    together, first = _best(spec, a.agents, a.duration_s, a.repeat)
    one_pass = Pricer.loads_by_rank
    Pricer.loads_by_rank = _rank_by_rank
    try:
        apart, second = _best(spec, a.agents, a.duration_s, a.repeat)
    finally:
        Pricer.loads_by_rank = one_pass
    print(f"GB300 DP72 x EP72, {a.agents} agents, {a.duration_s:g} s simulated ({first['iterations']} iterations), "
          f"best of {a.repeat}")
    print(f"ranks priced one by one (baseline)   {apart:7.2f} s")
    print(f"ranks priced in one pass            {together:7.2f} s   {apart / together:.2f}x faster")
    print("same result:", first == second)


if __name__ == "__main__":
    main()
