"""What the N* search costs where memory binds and the latency SLO is loose, searched together or one after the other.

Run: .venv/bin/python bench/loose_slo_search.py

A spec whose task SLO no agent count breaks (1e9 s, no per-call SLO) on an engine with a batch limit of 65,536:
memory stops N* near a hundred agents. The search checks latency and memory together at each agent count and stops
at the first that fails either (``apmw.capacity.search.search``). The baseline, in the same process, is the search
as it was before: latency alone up to its own limit (here the search's ceiling of a million agents, where the
closed loop reads its engine curves to every one of the 65,536 batch sizes), then memory below it
(:func:`two_phase_n_star`, kept here for the comparison). Each run starts from an empty curve cache; both must find
the same N* and binding constraint. Two specs: support-chat and the coding agent, each with the limits and SLO
above.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from apmw.capacity import engine_curve as curves  # noqa: E402
from apmw.capacity.closed_loop import closed_loop_model  # noqa: E402
from apmw.capacity.search import MAX_AGENTS, largest_passing, search  # noqa: E402
from apmw.perf import replica_from_spec  # noqa: E402
from apmw.spec.load import spec_from_dict  # noqa: E402

LIMIT = 65_536


def loose_spec(name: str):
    """The bundled example ``name`` with a batch limit and token budget of 65,536 and a task SLO of 1e9 s alone."""
    doc = yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())
    doc["serving"].update(max_batch=LIMIT, max_batched_tokens=LIMIT)
    doc["slo"] = {"task_latency_p95_s": 1e9}
    return spec_from_dict(doc)


def two_phase_n_star(model) -> tuple[int, str, int]:
    """(N*, binding, agent counts asked): latency searched alone to its limit, then memory up to it (the baseline)."""
    seen: dict = {}

    def at(n: int):
        if n not in seen:
            seen[n] = model.evaluate(n)
        return seen[n]

    n_latency = largest_passing(lambda n: at(n).meets_latency)
    n_memory = (n_latency if n_latency > 0 and at(n_latency).fits_memory
                else largest_passing(lambda n: at(n).fits_memory, limit=max(n_latency, 1)))
    binding = ("kv_memory" if n_memory < n_latency else "agent_limit" if n_latency >= MAX_AGENTS else "slo")
    return min(n_latency, n_memory), binding, len(seen)


def timed(spec, together: bool) -> tuple[int, str, int, float]:
    curves._CURVES.clear()
    t = time.perf_counter()
    replica = replica_from_spec(spec)
    model = closed_loop_model(spec, replica)
    if together:
        asked: list[int] = []
        evaluate = model.evaluate
        model.evaluate = lambda n: asked.append(n) or evaluate(n)          # type: ignore[method-assign]
        result = search(spec, replica, model.sample, model)
        answer = (result.agents, result.binding_constraint, len(set(asked)))
    else:
        answer = two_phase_n_star(model)
    return (*answer, time.perf_counter() - t)


def main() -> None:
    print(f"{'spec':<14} {'search':<28} {'N*':>5} {'binding':<10} {'counts asked':>12} {'s':>7}")
    for name in ("support-chat", "coding-agent"):
        spec = loose_spec(name)
        timed(spec, True)                                                  # the session sample, drawn once
        before = timed(spec, False)
        after = timed(spec, True)
        for label, (n, binding, asked, s) in (("latency, then memory", before), ("together", after)):
            print(f"{name:<14} {label:<28} {n:>5} {binding:<10} {asked:>12} {s:>7.2f}")
        assert before[:2] == after[:2], (name, before, after)
        print(f"{name:<14} ratio before / together: {before[3] / after[3]:.1f}x, same N* and binding")


if __name__ == "__main__":
    main()
