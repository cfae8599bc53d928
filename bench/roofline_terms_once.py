"""An engine curve on the plain roofline prices each load's terms once for its time and its compute share.

Run: .venv/bin/python bench/roofline_terms_once.py [--ranks 8] [--max-batch 256]

The coding agent's replica (examples/coding-agent.yaml, DeepSeek-V3 on the plain roofline) laid out as
``--ranks`` attention-DP ranks with experts over all GPUs (``serving.parallelism: {tp: 1, dp_attention: N, ep: N}``,
the layout whose curves are largest). Its engine curve is built with ``build_engine_curve`` (no cache) as apmw
builds it, ``step.time_and_compute_share`` pricing the roofline's terms once for both, and, as the baseline in the
same process, with that method standing in as the two calls it replaced (``iteration_time_s`` then
``compute_share``, each pricing the terms). Prints the best of 5 builds of each, their ratio, and checks that the
two curves are equal to the bit.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import yaml  # noqa: E402

from apmw.capacity.engine_curve import build_engine_curve  # noqa: E402
from apmw.capacity.sessions import sample_sessions  # noqa: E402
from apmw.perf import replica_from_spec  # noqa: E402
from apmw.spec import spec_from_dict  # noqa: E402


class TwoCalls:
    """The step model with its time and compute share priced by two calls, as before: the baseline."""

    def __init__(self, step):
        self._step = step

    def __getattr__(self, name):
        return getattr(self._step, name)

    def time_and_compute_share(self, load):
        return self._step.iteration_time_s(load), self._step.compute_share(load)


def best_build_s(step, s, max_batch: int, budget: int | None):
    build_engine_curve(step, s, max_batch, token_budget=budget)       # warm the draws
    best, curve = float("inf"), None
    for _ in range(5):
        t = time.perf_counter()
        curve = build_engine_curve(step, s, max_batch, token_budget=budget)
        best = min(best, time.perf_counter() - t)
    return best, curve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--max-batch", type=int, default=256)
    args = ap.parse_args()
    d = yaml.safe_load((ROOT / "src" / "apmw" / "examples" / "coding-agent.yaml").read_text())
    d["serving"]["parallelism"] = {"tp": 1, "dp_attention": args.ranks, "ep": args.ranks}
    spec = spec_from_dict(d)
    replica = replica_from_spec(spec)
    s = sample_sessions(spec, replica)
    budget = replica.policy.token_budget
    once_s, once = best_build_s(replica.step, s, args.max_batch, budget)
    two_s, two = best_build_s(TwoCalls(replica.step), s, args.max_batch, budget)
    same = all(np.array_equal(a, b) for a, b in zip(once._rows().values(), two._rows().values()))
    print(f"{replica.step.source} step, DP{args.ranks} x EP{args.ranks}, batch 1-{args.max_batch}: "
          f"terms once {once_s * 1e3:.0f} ms, twice {two_s * 1e3:.0f} ms: {two_s / once_s:.2f}x; "
          f"curves identical: {same}")


if __name__ == "__main__":
    main()
