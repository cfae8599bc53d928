"""What does an engine curve under attention data parallelism cost to build, against one on a single rank?

Run: .venv/bin/python bench/dp_curve_cost.py [--ranks 8] [--max-batch 256]

The coding agent's replica (examples/coding-agent.yaml) laid out as ``--ranks`` attention-DP ranks
(``serving.parallelism: {dp_attention: N}``) and, as the baseline in the same process, as one rank of the same
GPUs (tensor parallel). Each curve is built with ``build_engine_curve`` (no cache) on a session sample of its
own replica; prints the best of 5 builds of each and their ratio. Under DP the curve prices the chunks on the
busiest rank, and a call's own full chunk on a rank of its own (``EngineCurve.full_chunk_iteration_s``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import yaml  # noqa: E402

from apmw.capacity.engine_curve import build_engine_curve  # noqa: E402
from apmw.capacity.sessions import sample_sessions  # noqa: E402
from apmw.perf import replica_from_spec  # noqa: E402
from apmw.spec import spec_from_dict  # noqa: E402


def best_build_s(parallelism: dict, max_batch: int) -> float:
    d = yaml.safe_load((ROOT / "examples" / "coding-agent.yaml").read_text())
    d["serving"]["parallelism"] = parallelism
    spec = spec_from_dict(d)
    replica = replica_from_spec(spec)
    s = sample_sessions(spec, replica)
    build_engine_curve(replica.step, s, max_batch, token_budget=replica.policy.token_budget)   # warm the draws
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        build_engine_curve(replica.step, s, max_batch, token_budget=replica.policy.token_budget)
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--max-batch", type=int, default=256)
    a = ap.parse_args()
    one = best_build_s({"tp": a.ranks}, a.max_batch)
    dp = best_build_s({"dp_attention": a.ranks}, a.max_batch)
    print(f"{a.max_batch} batch sizes: one rank (TP{a.ranks}) {one * 1e3:.1f} ms, DP{a.ranks} {dp * 1e3:.1f} ms, "
          f"ratio {dp / one:.2f}")


if __name__ == "__main__":
    main()
