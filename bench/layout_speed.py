"""How much a parallel layout or disaggregation costs `apmw plan` and `apmw predict`, against plain TP.

Run: .venv/bin/python bench/layout_speed.py

The coding-agent example (DeepSeek-V3 on 8 x H200) planned analytically as laid out by the README's
"Parallel layouts" section, each against the plain TP8 plan in the same process (the ratio is what
travels between machines); then `apmw predict --disagg` against the aggregated benchmark. Best of 5.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from apmw.capacity import plan
from apmw.capacity.benchmark import predict
from apmw.capacity.disaggregated_benchmark import Workers, predict_disaggregated
from apmw.spec import spec_from_dict
from plan_speed import best_of  # bench/ is on the path when a bench script runs

SPEC = Path(__file__).resolve().parents[1] / "examples" / "coding-agent.yaml"

LAYOUTS = {
    "TP8 (baseline)": ("H200", None, None),
    "DP8 x EP8": ("H200", {"dp_attention": 8, "ep": 8}, None),
    "TP8 x PP2 (16 GPUs)": ("H200", {"tp": 8, "pp": 2}, None),
    "DP16 x EP16 (two nodes)": ("H200", {"dp_attention": 16, "ep": 16}, None),
    "DP64 x EP64 (GB300 rack)": ("GB300", {"dp_attention": 64, "ep": 64}, None),
    "TP8 + 2 prefill workers (2P1D)": ("H200", None, {"prefill_gpus": 8, "prefill_workers": 2}),
}


def spec_for(gpu: str, parallelism: dict | None, disaggregation: dict | None):
    d = yaml.safe_load(SPEC.read_text())
    d["hardware"] = {"gpu": gpu} | ({} if parallelism else {"gpus_per_replica": 8})
    if parallelism:
        d["serving"]["parallelism"] = parallelism
    if disaggregation:
        d["serving"]["disaggregation"] = disaggregation
    return spec_from_dict(d)


def main() -> None:
    print(f"{'layout':<34}{'plan ms':>9}{'ratio':>8}{'N*':>8}")
    base = None
    for name, args in LAYOUTS.items():
        spec = spec_for(*args)
        plan(spec)
        t = best_of(lambda: plan(spec))
        base = base or t
        print(f"{name:<34}{t * 1e3:>9.1f}{t / base:>8.2f}{plan(spec).agents_per_replica:>8,}")
    r1 = ("deepseek-ai/DeepSeek-R1", "H200", "fp8", "fp8")
    agg = best_of(lambda: predict(r1[0], r1[1], 8, r1[2], r1[3], 1024, 1024, 256))
    dis = best_of(lambda: predict_disaggregated(*r1, 1024, 1024, 256, Workers(2, 8),
                                                Workers(1, 1, {"dp_attention": 8, "ep": 8})))
    print(f"\n{'predict, concurrency 256':<34}{'ms':>9}{'ratio':>8}")
    print(f"{'aggregated TP8 (baseline)':<34}{agg * 1e3:>9.1f}{1.0:>8.2f}")
    print(f"{'disaggregated 2P1D, DP8 x EP8':<34}{dis * 1e3:>9.1f}{dis / agg:>8.2f}")


if __name__ == "__main__":
    main()
