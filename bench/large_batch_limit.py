"""How much does a batch limit far above the agents cost the N* search, now that a closed loop builds its engine
curve only to the agents it is asked about?

Run: .venv/bin/python bench/large_batch_limit.py [--max-batch 65536]

SGLang sizes its running requests from the KV pool, up to 4,096 per attention-DP rank (294,912 on a GB300 NVL72
replica of 72 ranks; ``apmw.perf.serving_policy.pool_sized_max_batch``), and a spec may set any limit up to
``serving.max_batch``'s bound. The coding agent (examples/coding-agent.yaml) with its batch limit raised to
``--max-batch``: ``apmw plan``'s N* search on its closed-loop model as it is built (its curves extended block by
block as the search asks for more agents, ``ClosedLoopModel._curves_to``), against the baseline, in the same
process, of the same model with its curves built to the whole limit first (what every model did before). Prints
each one's wall time, the ratio, and checks that both find the same N* and binding constraint.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from curve_memory import coding_agent_at  # noqa: E402  (this folder: run as python bench/large_batch_limit.py)

from apmw.capacity import engine_curve as curves  # noqa: E402
from apmw.capacity.closed_loop import closed_loop_model  # noqa: E402
from apmw.capacity.search import search  # noqa: E402


def _timed_search(spec, replica, whole: bool):
    curves._CURVES.clear()          # neither run finds the other's curve
    t = time.perf_counter()
    model = closed_loop_model(spec, replica)
    if whole:
        model._curves_to(model.max_batch)
    result = search(spec, replica, model.sample, model)
    return result, time.perf_counter() - t, len(model.curve.batch)


def main() -> None:
    args, spec, replica = coding_agent_at(description=__doc__)
    closed_loop_model(spec, replica)            # warm: the session sample, imports
    whole, t_whole, rows_whole = _timed_search(spec, replica, whole=True)
    lazy, t_lazy, rows_lazy = _timed_search(spec, replica, whole=False)
    assert (lazy.agents, lazy.binding_constraint) == (whole.agents, whole.binding_constraint)
    print(f"coding agent, max_batch {args.max_batch:,}: N* {lazy.agents} ({lazy.binding_constraint}), both ways")
    print(f"{'curves':<34}{'rows built':>12}{'search s':>10}")
    print(f"{'built to the whole limit first':<34}{rows_whole:>12,}{t_whole:>10.2f}")
    print(f"{'built to the agents asked about':<34}{rows_lazy:>12,}{t_lazy:>10.2f}")
    print(f"ratio whole / as asked: {t_whole / t_lazy:.1f}x")


if __name__ == "__main__":
    main()
