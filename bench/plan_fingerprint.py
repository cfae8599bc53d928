"""Every figure `apmw plan` gives on variants of the bundled examples, as one JSON file to compare byte for byte
between two checkouts: a change meant to be exact (a faster tail, a cheaper search) must leave it identical.

Run: .venv/bin/python bench/plan_fingerprint.py OUT.json          (this checkout)
     PYTHONPATH=/path/to/other/src .venv/bin/python bench/plan_fingerprint.py OTHER.json
     cmp OUT.json OTHER.json

Variants: each example under every tool-wait KV policy, with and without prefix caching, on each engine;
disaggregated; batch caps 2-16; a tight TTFT SLO. For each, the plan's JSON (less its SLO sensitivity) and the
closed loop at five other agent counts (p50/p95/p99, TTFT p95, the verdicts), or the infeasible message.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

import yaml

from apmw import plan
from apmw.capacity.plan import sweep
from apmw.errors import ApmwError
from apmw.spec import SpecError, spec_from_dict

EXAMPLES = Path(__file__).resolve().parents[1] / "src" / "apmw" / "examples"


def variants() -> list[tuple[str, dict]]:
    out = []
    for ex in ("support-chat", "coding-agent", "deep-research"):
        base = yaml.safe_load((EXAMPLES / f"{ex}.yaml").read_text())
        for policy in ("evict", "retain", "offload"):
            for caching in (True, False):
                for engine in ("vllm", "sglang", "trtllm"):
                    d = copy.deepcopy(base)
                    d["serving"].update(tool_wait_kv_policy=policy, prefix_caching=caching, engine=engine)
                    out.append((f"{ex}/{policy}/{caching}/{engine}", d))
        d = copy.deepcopy(base)
        d["serving"]["tool_wait_kv_policy"] = "retain"
        d["serving"]["disaggregation"] = {"prefill_gpus": d["hardware"]["gpus_per_replica"]}
        out.append((f"{ex}/disagg", d))
        for cap in (2, 4, 6, 8, 12, 16):
            d = copy.deepcopy(base)
            d["serving"]["max_batch"] = cap
            if cap != 16:
                d["slo"].pop("ttft_p95_s", None)
            out.append((f"{ex}/batch{cap}", d))
        d = copy.deepcopy(base)
        d["slo"]["ttft_p95_s"] = 0.5
        out.append((f"{ex}/ttft0.5", d))
    return out


def fingerprint(d: dict) -> dict | str:
    try:
        s = spec_from_dict(d)
    except SpecError as exc:          # a combination the spec refuses (offload without prefix caching)
        return "refused: " + str(exc)
    try:
        r = plan(s)
    except ApmwError as exc:
        return "infeasible: " + str(exc)
    x = r.to_dict()
    x.pop("slo_sensitivity", None)
    n = r.search.agents
    x["_sweep"] = [[e.agents, e.task_latency_p50_s, e.task_latency_p95_s, e.task_latency_p99_s, e.ttft_p95_s,
                    e.meets_latency, e.fits_memory, list(e.slo.failed)]
                   for e in sweep(r, [1, 3, max(1, n // 2), n + 1, 2 * n + 1])]
    return x


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    t = time.perf_counter()
    vs = variants()
    out = {name: fingerprint(d) for name, d in vs}
    Path(sys.argv[1]).write_text(json.dumps(out, sort_keys=True, default=str, indent=0))
    print(f"{len(vs)} variants in {time.perf_counter() - t:.1f} s -> {sys.argv[1]}", file=sys.stderr)


if __name__ == "__main__":
    main()
