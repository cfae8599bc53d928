"""How much does summing only the weighted states save where a search reaches a million agents?

Run: .venv/bin/python bench/many_agents.py

A task SLO far looser than the work needs (support-chat with ``task_latency_p95_s`` of a billion seconds, and no
per-call SLO) leaves latency met up to the search's ceiling of a million agents, so the N* search gallops there
before KV memory answers (N* 138). Each closed-loop solve at N agents sums N + 1 states
(``capacity.closed_network``); above ``SPARSE_AGENTS`` it sums only the states up to the batch limit and the stretch
of the tail within e^-60 of the largest weight. Prints, in one process, the plan and ``levers`` (no simulator
checks, no elasticities) with every state summed (``SPARSE_AGENTS`` set past the ceiling: the baseline) and with
the sparse states, the ratio, and whether the answers agree.
"""

from __future__ import annotations

import time
from pathlib import Path

from apmw import load_spec, plan
from apmw.capacity import closed_network
from apmw.design_search import spec_document
from apmw.levers import evaluate_levers
from apmw.spec import spec_from_dict

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "support-chat.yaml"


def loose_spec():
    doc = spec_document(load_spec(EXAMPLE))
    doc["slo"] = {"task_latency_p95_s": 1e9}
    return spec_from_dict(doc)


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> None:
    spec = loose_spec()
    plan(spec)                                                  # samples and tables loaded once, for both
    sparse_at = closed_network.SPARSE_AGENTS
    print(f"{'run':<28}{'every state s':>15}{'sparse s':>10}{'ratio':>7}  same answer")
    for name, fn, key in (("plan (analytic N*)", lambda: plan(spec), lambda p: (p.at.agents, p.search.binding_constraint)),
                          ("levers (analytic)", lambda: evaluate_levers(spec, plan(spec)),
                           lambda rs: [(r.lever, r.agents_per_replica_after, r.agents_per_mw_after) for r in rs])):
        closed_network.SPARSE_AGENTS = 10**9
        full_s, full = _timed(fn)
        closed_network.SPARSE_AGENTS = sparse_at
        sparse_s, sparse = _timed(fn)
        print(f"{name:<28}{full_s:>15.2f}{sparse_s:>10.2f}{full_s / sparse_s:>7.1f}  {key(full) == key(sparse)}")


if __name__ == "__main__":
    main()
