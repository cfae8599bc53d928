"""Which system to buy for a DeepSeek-V4-Pro coding-agent fleet: N* per replica, per GPU and per MW.

Run:  python bench/buyers_comparison.py [--markdown]

The spec is tests/fixtures/specs/deepseek-v4-pro.yaml: the coding agent whose session shape apmw fit
took from the mini-swe-agent x DeepSeek trace (examples/coding-agent.yaml), served by DeepSeek-V4-Pro as
its checkpoint ships (FP8 weights, FP4 routed experts, FP8 KV). Each system gets one layout, the wide
expert-parallel layouts these systems are bought for and plain tensor parallelism (SYSTEMS; each system
is shown at the layout with the most agents per provisioned MW), on SGLang, and two per-call service tiers as public agent benchmarks state them: an output speed of
20 or 60 tokens/s per agent and a TTFT p95 of at most 10 s (the task p95 stays the spec's 1,800 s), each
without speculative decoding and drafting with the model's own MTP module (DRAFTS).
N* is the analytic model's (``apmw plan --analytic``): the simulator's check of thousands of agents on a
72-GPU replica is out of a benchmark's time, so these are rankings to settle with ``apmw plan``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from apmw.capacity import plan  # noqa: E402
from apmw.errors import ApmwError  # noqa: E402
from apmw.spec import spec_from_dict  # noqa: E402

SPEC = ROOT / "tests" / "fixtures" / "specs" / "deepseek-v4-pro.yaml"

# system -> (catalogue GPU, the layouts tried: serving.parallelism). Each system is shown at the layout with the
# most agents per provisioned MW in each tier. GB300 NVL72: one replica over the rack's whole NVLink domain
# (384 routed experts do not divide over 72 ranks, so 48 redundant experts, SGLang --ep-num-redundant-experts,
# make 432 = 6 per rank), or 8-GPU replicas inside it. 8-GPU nodes: one attention rank per GPU with the experts
# spread (DP8 x EP8), attention tensor parallel with the experts spread (TP8, EP8), or plain TP8.
NODE_LAYOUTS = ({"dp_attention": 8, "ep": 8}, {"tp": 8, "ep": 8}, {"tp": 8})
SYSTEMS = {
    "GB300 NVL72": ("GB300", ({"dp_attention": 72, "ep": 72, "redundant_experts": 48},) + NODE_LAYOUTS),
    "HGX B300": ("B300", NODE_LAYOUTS),
    "MI355X platform": ("MI355X", NODE_LAYOUTS),
    "HGX H200": ("H200", NODE_LAYOUTS),
}
TIERS = (20.0, 60.0)
TTFT_P95_S = 10.0
# Each system and tier without speculative decoding, and drafting with V4-Pro's own MTP module
# (serving.speculative.draft: mtp): one draft token, apmw's cited 85 % acceptance, the module's weights and
# KV in memory (apmw.perf.speculative, apmw.perf.memory).
DRAFTS = (None, {"draft": "mtp"})


def spec_for(gpu: str, parallelism: dict, tokens_per_s: float, speculative: dict | None = None) -> dict:
    d = yaml.safe_load(SPEC.read_text())
    d["hardware"] = {"gpu": gpu}
    d["serving"] = {**d["serving"], "engine": "sglang", "parallelism": parallelism}
    d["serving"].pop("max_batch", None)          # SGLang sizes its running requests from the KV pool,
    d["serving"].pop("max_batched_tokens", None)  # and its chunked prefill from the GPU's memory
    if speculative is not None:
        d["serving"]["speculative"] = speculative
    d["slo"] = {**d["slo"], "ttft_p95_s": TTFT_P95_S, "output_speed_tokens_per_s": tokens_per_s}
    return d


def rows(systems: list[str] | None = None) -> list[dict]:
    """One row per system, tier and draft: the layout with the most agents per provisioned MW (of ``systems``;
    None: every one)."""
    out = []
    for system, (gpu, layouts) in SYSTEMS.items():
        if systems is not None and system not in systems:
            continue
        for tier in TIERS:
            for draft in DRAFTS:
                tried = [_row(system, gpu, par, tier, draft) for par in layouts]
                planned = [r for r in tried if "error" not in r]
                out.append(max(planned, key=lambda r: r["per_mw_provisioned"]) if planned else tried[0])
    return out


def _row(system: str, gpu: str, par: dict, tier: float, draft: dict | None = None) -> dict:
    name = "none" if draft is None else "MTP"
    try:
        p = plan(spec_from_dict(spec_for(gpu, par, tier, draft))).to_dict()
    except ApmwError as exc:
        return {"system": system, "tier": tier, "draft": name, "error": str(exc).splitlines()[0]}
    rep = p["replica"]
    return {"system": system, "tier": tier, "draft": name, "layout": rep["layout"]["text"], "gpus": rep["gpus"],
            "agents": p["agents_per_replica"], "per_gpu": p["agents_per_replica"] / rep["gpus"],
            "per_mw": p["agents_per_mw"], "per_mw_provisioned": p["agents_per_mw_provisioned"],
            "binding": p["binding_constraint"] + (f" ({', '.join(p['binding_slo'])})" if p.get("binding_slo") else ""),
            "tpot_ms": p["tpot_p95_s"] * 1e3, "step": p["step_time_source"]}


def markdown(rs: list[dict]) -> str:
    lines = ["| system | layout | tier (tokens/s per agent) | draft | agents per replica | per GPU | per MW (modelled / "
             "provisioned) | binds | TPOT p95 |", "|---|---|---:|---|---:|---:|---:|---|---:|"]
    for r in rs:
        if "error" in r:
            lines.append(f"| {r['system']} | | {r['tier']:.0f} | {r['draft']} | refused: {r['error']} | | | | |")
            continue
        lines.append(f"| {r['system']} | {r['gpus']:g} GPUs, {r['layout']} | {r['tier']:.0f} | {r['draft']} | {r['agents']:,} | "
                     f"{r['per_gpu']:.1f} | {r['per_mw']:,.0f} / {r['per_mw_provisioned']:,.0f} | {r['binding']} | "
                     f"{r['tpot_ms']:.1f} ms |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="print the README table")
    ap.add_argument("--system", action="append", choices=list(SYSTEMS),
                    help="only this system's rows (repeatable), e.g. to redo one after its figures change")
    args = ap.parse_args()
    print(markdown(rows(args.system)))


if __name__ == "__main__":
    main()
