"""How fast does the simulator run a replica of many attention data-parallel ranks?

Run: .venv/bin/python bench/dp_sim_speed.py [--agents 2221] [--duration-s 20] [--repeat 2]
     [--coding-agents 109] [--coding-duration-s 300]

Two comparisons, each against a baseline in the same process, each printing the best wall time of ``--repeat``
runs and the ratio:

1. The buyers' comparison's widest replica (DeepSeek-V4-Pro on a GB300 NVL72 rack as one DP72 x EP72 replica,
   SGLang, 60 tokens/s per agent: ``bench/buyers_comparison.py``'s spec) at its analytic N*. Each iteration
   prices its 72 ranks' KV reads and attention FLOPs in one pass over all of them
   (``apmw.sim.pricing.Pricer.loads_by_rank``); the baseline prices them rank by rank with ``Pricer.loads``
   (what the simulator did before session 35). Both give the same SimResult (compared, less wall time).
2. The coding agent (examples/coding-agent.yaml: DeepSeek-V3 on 8 x H200) laid out as eight attention-DP ranks
   with its experts over eight (tp 1, dp_attention 8, ep 8) at ``--coding-agents``. Its roofline iterations
   come from the parts tabulated by token count, the busiest rank's share applied to the KV and attention
   slopes (``apmw.sim.pricing._RooflineParts``); the baseline asks the step model every iteration (what the
   simulator did under attention DP before session 39). The results agree up to floating-point rounding
   (the largest relative difference of any number in the SimResult is printed).
3. The same replica, its iterations where every running sequence of a rank decodes one token handled without
   the per-sequence masks (``Scheduler.all_decoding``, ``Engine._advance``'s common case); the baseline masks
   every rank's sequences as a mixed iteration does (``all_decoding`` kept false). Same SimResult (compared).
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

import yaml  # noqa: E402

from buyers_comparison import spec_for  # noqa: E402
from apmw.sim import simulate  # noqa: E402
from apmw.sim import pricing  # noqa: E402
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


def _numbers(d, path=""):
    """Every number in a SimResult dict, by its path."""
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _numbers(v, f"{path}.{k}")
    elif isinstance(d, list):
        for i, v in enumerate(d):
            yield from _numbers(v, f"{path}[{i}]")
    elif isinstance(d, (int, float)) and not isinstance(d, bool):
        yield path, float(d)


def _largest_difference(a: dict, b: dict) -> float:
    """The largest relative difference between two SimResults' numbers (inf where their shapes differ)."""
    x, y = dict(_numbers(a)), dict(_numbers(b))
    if x.keys() != y.keys():
        return float("inf")
    return max((abs(x[k] - y[k]) / max(abs(x[k]), abs(y[k]), 1e-300) for k in x if x[k] != y[k]), default=0.0)


def _asking_under_dp(build):
    """The baseline of comparison 2: no tabulated parts for a replica of attention-DP ranks."""
    def declined(step, max_tokens, max_batch):
        return None if step.parallel.dp > 1 else build(step, max_tokens, max_batch)
    return staticmethod(declined)


def coding_agent_dp8(a) -> None:
    d = yaml.safe_load((ROOT / "examples" / "coding-agent.yaml").read_text())
    d["serving"]["parallelism"] = {"tp": 1, "dp_attention": 8, "ep": 8}
    spec = spec_from_dict(d)
    pricing._PRICERS.clear()        # a pricer is kept per step model: neither run finds the other's
    parts, first = _best(spec, a.coding_agents, a.coding_duration_s, a.repeat)
    build = pricing._RooflineParts.__dict__["build"]
    pricing._RooflineParts.build = _asking_under_dp(pricing._RooflineParts.build)
    pricing._PRICERS.clear()
    try:
        asking, second = _best(spec, a.coding_agents, a.coding_duration_s, a.repeat)
    finally:
        pricing._RooflineParts.build = build
        pricing._PRICERS.clear()
    print(f"\ncoding agent, DeepSeek-V3 on 8 x H200 as DP8 x EP8, {a.coding_agents} agents, "
          f"{a.coding_duration_s:g} s simulated ({first['iterations']} iterations), best of {a.repeat}")
    print(f"step model asked every iteration (baseline)  {asking:7.2f} s")
    print(f"roofline parts by token count              {parts:7.2f} s   {asking / parts:.2f}x faster")
    print(f"largest relative difference in the result: {_largest_difference(first, second):.1e}")


def _masked(schedule):
    """The baseline of comparison 3: a schedule that never reports an all-decode iteration."""
    def every_rank_masked(self, *args, **kwargs):
        n = schedule(self, *args, **kwargs)
        self.all_decoding = False
        return n
    return every_rank_masked


def all_decode_ranks(a) -> None:
    from apmw.sim.scheduler import Scheduler

    d = yaml.safe_load((ROOT / "examples" / "coding-agent.yaml").read_text())
    d["serving"]["parallelism"] = {"tp": 1, "dp_attention": 8, "ep": 8}
    spec = spec_from_dict(d)
    plain, first = _best(spec, a.coding_agents, a.coding_duration_s, a.repeat)
    schedule = Scheduler.schedule
    Scheduler.schedule = _masked(schedule)
    try:
        masked, second = _best(spec, a.coding_agents, a.coding_duration_s, a.repeat)
    finally:
        Scheduler.schedule = schedule
    print(f"\nthe same, {first['iterations']} iterations")
    print(f"every rank's sequences masked (baseline)     {masked:7.2f} s")
    print(f"all-decode ranks without masks             {plain:7.2f} s   {masked / plain:.2f}x faster")
    print("same result:", first == second)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=2221)
    ap.add_argument("--duration-s", type=float, default=20.0)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--coding-agents", type=int, default=109)
    ap.add_argument("--coding-duration-s", type=float, default=300.0)
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
    coding_agent_dp8(a)
    all_decode_ranks(a)


if __name__ == "__main__":
    main()
