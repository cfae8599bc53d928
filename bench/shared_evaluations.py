"""What sharing evaluations between closed-loop models that differ in their batch limit alone saves a design search.

Run: .venv/bin/python bench/shared_evaluations.py

Below its batch limit a closed loop never reaches it, so models that differ in the limit alone give the same
evaluation at every agent count below both (``apmw.capacity.closed_loop.ClosedLoopModel.evaluate``), and a design
search whose space has a batch-limit axis evaluates each count once for all of them. For each bundled example, its
default search space (``apmw search`` without ``--space``), in one process: once to draw its samples and build its
curves (not timed), then with no evaluation kept (``SHARED_EVALUATIONS = 0``, the baseline), then as shipped. Prints
each one's time, the ratio, the share of evaluations reused, and checks that every row is the same both ways.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from apmw import load_spec  # noqa: E402
from apmw.arch import load_architecture  # noqa: E402
from apmw.capacity import closed_loop  # noqa: E402
from apmw.design_search import search, spec_document  # noqa: E402
from apmw.design_search.space import default_space  # noqa: E402

SHIPPED = closed_loop.SHARED_EVALUATIONS


def timed_rows(spec, space, kept: int) -> tuple[list, float, int, int]:
    """(rows, seconds, evaluations made, evaluations reused) with ``kept`` evaluations shared."""
    closed_loop.SHARED_EVALUATIONS = kept
    closed_loop._EVALUATIONS.clear()
    made = reused = 0
    evaluate, shared = closed_loop.ClosedLoopModel._evaluate, closed_loop.ClosedLoopModel.evaluate

    def counted(self, agents):
        nonlocal made
        made += 1
        return evaluate(self, agents)

    def asked(self, agents):
        nonlocal reused
        reused += 1
        return shared(self, agents)

    closed_loop.ClosedLoopModel._evaluate, closed_loop.ClosedLoopModel.evaluate = counted, asked
    try:
        t = time.perf_counter()
        rows = search(spec, space).rows
        return rows, time.perf_counter() - t, made, reused - made
    finally:
        closed_loop.ClosedLoopModel._evaluate, closed_loop.ClosedLoopModel.evaluate = evaluate, shared
        closed_loop.SHARED_EVALUATIONS = SHIPPED


def main() -> None:
    print(f"{'example':<14} {'points':>6} {'none kept s':>11} {'shared s':>9} {'ratio':>6} {'evaluations':>11} "
          f"{'reused':>7}")
    for name in ("support-chat", "coding-agent", "deep-research"):
        spec = load_spec(ROOT / "examples" / f"{name}.yaml")
        space = default_space(spec_document(spec), moe=load_architecture(spec.model.config).num_experts > 0)
        timed_rows(spec, space, 0)                                   # samples drawn, curves built
        before, before_s, _, _ = timed_rows(spec, space, 0)
        after, after_s, made, reused = timed_rows(spec, space, SHIPPED)
        assert before == after, name
        print(f"{name:<14} {len(after):>6} {before_s:>11.2f} {after_s:>9.2f} {before_s / after_s:>5.2f}x "
              f"{made + reused:>11,} {reused / (made + reused):>6.0%}")
    print("every row the same both ways")


if __name__ == "__main__":
    main()
