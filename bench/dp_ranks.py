"""How much does the busiest attention data-parallel rank cost an agent workload? (docs/simulate.md)

Run: .venv/bin/python bench/dp_ranks.py [SPEC] [--ranks 8] [--agents 86] [--seed 1] [--duration-s 3600]

The spec (default: the bundled coding agent) is laid out as ``tp 1 x dp_attention R`` over its GPUs and
run three ways at the same agent count: the analytic model (``apmw plan --agents N``), the simulator as it
is (each rank's own KV bytes and attention FLOPs set the busiest rank's pace), and the same simulation with
the ranks priced as an even split of the decoding sequences, which is all the analytic model can know
(``Engine._busiest_rank_loads`` replaced for that run: the counterfactual, not a mode of apmw), and with
only the KV bytes or only the attention FLOPs taken rank by rank, to say which imbalance costs what.
Prints the time per output token, task p95 and TTFT p95 of each.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from apmw import load_spec, plan  # noqa: E402
from apmw.design_search import spec_document  # noqa: E402
from apmw.sim import simulate  # noqa: E402
from apmw.sim.engine import Engine  # noqa: E402
from apmw.spec import spec_from_dict  # noqa: E402


def _even_split(self, decode_seqs, kv_by_rank, attn_by_rank):
    """The load as the analytic model prices it: the replica's totals, the step model's even split."""
    return sum(kv_by_rank), sum(attn_by_rank)


def _kv_by_rank(self, decode_seqs, kv_by_rank, attn_by_rank):
    """Each rank's own KV bytes, the attention FLOPs as an even split."""
    return OWN(self, decode_seqs, kv_by_rank, attn_by_rank)[0], sum(attn_by_rank)


def _attention_by_rank(self, decode_seqs, kv_by_rank, attn_by_rank):
    """Each rank's own attention FLOPs (a prompt chunk's land on its rank alone), the KV bytes as an even split."""
    return sum(kv_by_rank), OWN(self, decode_seqs, kv_by_rank, attn_by_rank)[1]


OWN = Engine._busiest_rank_loads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", nargs="?", default=str(ROOT / "examples" / "coding-agent.yaml"))
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--agents", type=int, default=86)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration-s", type=float, default=3600.0)
    a = ap.parse_args()
    d = spec_document(load_spec(a.spec))
    d["serving"]["parallelism"] = {"tp": 1, "dp_attention": a.ranks}
    d["hardware"]["gpus_per_replica"] = a.ranks
    spec = spec_from_dict(d)
    p = plan(spec, agents=a.agents).to_dict()
    print(f"{Path(a.spec).name}, TP1 x DP{a.ranks}, {a.agents} agents, seed {a.seed}, {a.duration_s:.0f} s simulated")
    print(f"{'':48} {'TPOT mean ms':>12} {'TPOT p95 ms':>12} {'task p95 s':>11} {'TTFT p95 ms':>12} {'tasks':>6}")
    print(f"{'analytic (apmw plan --agents N)':48} {p['time_per_output_token_s'] * 1e3:12.1f} "
          f"{p['tpot_p95_s'] * 1e3:12.1f} {p['task_latency_s']['p95']:11,.0f} {p['ttft_p95_s'] * 1e3:12.0f} {'-':>6}")
    own = OWN
    for name, pricing in (("simulated, ranks priced as an even split", _even_split),
                          ("simulated, each rank's own KV bytes only", _kv_by_rank),
                          ("simulated, each rank's own attention FLOPs only", _attention_by_rank),
                          ("simulated, each rank's own load (apmw)", own)):
        Engine._busiest_rank_loads = pricing
        t = time.perf_counter()
        try:
            r = simulate(spec, a.agents, duration_s=a.duration_s, seed=a.seed)
        finally:
            Engine._busiest_rank_loads = own
        print(f"{name:48} {r.tpot['mean'] * 1e3:12.1f} {r.tpot['p95'] * 1e3:12.1f} {r.task_latency['p95']:11,.0f} "
              f"{r.ttft['p95'] * 1e3:12.0f} {r.completed_tasks:6d}  ({time.perf_counter() - t:.0f} s)")


if __name__ == "__main__":
    main()
