"""The README's numbers are what apmw prints today.

Each figure in the README's worked example, its table of bundled examples, its levers line and
its contrast paragraph is recomputed here from the bundled specs. A change to the step-time,
power or capacity model that moves them fails this test until the README is regenerated
(session 9 found the contrast paragraph two model changes stale).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from apmw.capacity.plan import plan
from apmw.contrast import contrast
from apmw.capacity.slo import SLO_LABELS
from apmw.levers import evaluate_levers, top_two
from apmw.sim.checked import check_plan, interval_text
from apmw.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
EXAMPLES = ("coding-agent", "support-chat", "deep-research")


@pytest.fixture(scope="module")
def plans():
    return {name: plan(load_spec(ROOT / "examples" / f"{name}.yaml")) for name in EXAMPLES}


def _block_after(command: str) -> list[str]:
    """The lines of the fenced block that follows ``$ command`` in the README."""
    start = README.index(f"$ {command}\n") + len(f"$ {command}\n")
    return README[start:README.index("```", start)].rstrip("\n").splitlines()


@pytest.mark.slow
def test_the_worked_example_is_what_apmw_plan_prints():
    # the `apmw` entry point (apmw.cli:main) in a fresh interpreter, on a 120-column terminal
    env = {k: v for k, v in os.environ.items() if k != "FORCE_COLOR"} | {"COLUMNS": "120", "NO_COLOR": "1"}
    out = subprocess.run([sys.executable, "-c", "from apmw.cli import main; main()", "plan",
                          "examples/coding-agent.yaml"], cwd=ROOT, capture_output=True, text=True, env=env,
                         check=True).stdout
    printed = [line.rstrip() for line in out.splitlines() if line.strip() and not line.startswith("apmw plan:")]
    assert printed == [line.rstrip() for line in _block_after("apmw plan examples/coding-agent.yaml")]


@pytest.fixture(scope="module")
def checked(plans):
    """The default `apmw plan` answer per example: N* settled in the simulator (about 100 s in all)."""
    return {name: check_plan(p) for name, p in plans.items()}


def example_row(name: str, p, c) -> str:
    """The README's examples-table row for one example, from its analytic plan and checked answer."""
    d, a = c.to_dict(), p.to_dict()
    span = interval_text(d["agents_per_replica_interval"], [q["agents"] for q in d["check"]["points"]])
    binding = d["binding_constraint"] + (f" ({', '.join(SLO_LABELS[s] for s in d['binding_slo'])})"
                                         if d["binding_slo"] else "")
    return (f"| `{name}.yaml` | {REPLICAS[name]} | {d['step_time_source']} | {d['agents_per_replica']} ({span}) | "
            f"{a['agents_per_replica']} | {binding} | {d['agents_per_mw']:,.0f} / {d['agents_per_mw_provisioned']:,.0f} | "
            f"{d['tokens_per_s']['output']:,.0f} | {d['cost_per_session_usd']:.3g} |")


REPLICAS = {"coding-agent": "DeepSeek-V3 FP8, 8 × H200", "support-chat": "Llama-3.1-70B FP8, 2 × H100",
            "deep-research": "gpt-oss-120b MXFP4, 1 × H200"}


@pytest.mark.slow
def test_the_examples_table_is_what_apmw_plan_gives(plans, checked):
    for name in EXAMPLES:
        row = next(line for line in README.splitlines() if line.startswith(f"| `{name}.yaml` |"))
        assert row == example_row(name, plans[name], checked[name]), name


def test_the_levers_line_is_what_apmw_levers_ranks_first(plans):
    spec = load_spec(ROOT / "examples" / "coding-agent.yaml")
    first, second = top_two(evaluate_levers(spec, base=plans["coding-agent"]))
    line = _block_after("apmw levers examples/coding-agent.yaml --no-elasticities")[0]
    assert line.startswith(f"top two: {first.lever} ({first.gain:.2f}x, relaxes {first.relaxes}); "
                           f"{second.lever} ({second.gain:.2f}x, relaxes {second.relaxes})")
    assert f"attention first ({first.gain:.1f}×:" in README


def test_the_levers_bullets_are_what_apmw_levers_gives(plans):
    # "What leads", "What does little" and "What backfires" quote each lever's gain on the coding agent
    results = {r.lever: r for r in evaluate_levers(load_spec(ROOT / "examples" / "coding-agent.yaml"),
                                                   base=plans["coding-agent"])}
    start = README.index("- **What leads.**")
    text = " ".join(README[start:README.index("- **`--verify`**", start)].split())
    gains = {name: f"{results[name].gain:.2f}×" for name in ("dp_attention", "summarise_history", "kv_fp8",
                                                             "batch_limit_x2", "speculative_decoding",
                                                             "disaggregated_prefill")}
    policies = sorted(results[p].gain for p in ("policy_evict", "policy_offload", "policy_ttl"))
    gains["policies"] = f"{policies[0]:.2f}–{policies[-1]:.2f}×"
    assert re.findall(r"\d\.\d\d(?:–\d\.\d\d)?×", text) == [
        gains[k] for k in ("dp_attention", "summarise_history", "kv_fp8", "policies", "batch_limit_x2",
                           "speculative_decoding", "disaggregated_prefill")]


def test_the_contrast_paragraph_is_what_apmw_contrast_computes(plans):
    # apmw contrast examples/*.yaml takes the files in name order: coding-agent is the reference
    ratios = {r["name"]: r for r in contrast({n: plans[n] for n in sorted(plans)})["ratios_to_first"]}
    chat, research = ratios["support-chat"], ratios["deep-research"]
    text = " ".join(README[README.index("bundled examples, support-chat emits"):].split("\n\n")[0].split())
    numbers = [float(x) for x in re.findall(r"(\d+\.\d+)×", text)]
    assert numbers == [round(chat["output_tokens_per_s_per_mw"], 2), round(chat["agents_per_mw"], 2),
                       round(chat["residence_s_per_output_token"], 2),
                       round(research["output_tokens_per_s_per_mw"], 2), round(research["agents_per_mw"], 2)]


def _buyers_comparison():
    import importlib.util
    spec = importlib.util.spec_from_file_location("buyers_comparison", ROOT / "bench" / "buyers_comparison.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_buyers_comparison_is_what_the_bench_script_prints():
    module = _buyers_comparison()
    assert module.markdown(module.rows()) in README


def test_the_capped_rack_is_what_apmw_plan_gives():
    # "Capping the running requests is a lever here": the GB300 rack at 60 tokens/s with MTP and max_batch 2048
    from apmw.spec import spec_from_dict

    d = _buyers_comparison().spec_for("GB300", {"dp_attention": 72, "ep": 72, "redundant_experts": 48}, 60.0,
                                      {"draft": "mtp"})
    d["serving"]["max_batch"] = 2048
    p = plan(spec_from_dict(d)).to_dict()
    said = (f"the plan gives {p['agents_per_replica']:,} agents (TTFT binding at 10 s; "
            f"{p['agents_per_mw_provisioned']:,.0f} agents per provisioned MW")
    assert p["binding_slo"] == ["ttft_p95"] and said in " ".join(README.split())


def _documented_fields(heading: str) -> tuple[set[str], dict[str, str]]:
    """The field names in the first column of the README's table under ``heading``, and each row's text by name."""
    start = README.index(heading)
    rows = [line for line in README[start:README.index("\n## ", start + len(heading))].splitlines()
            if line.startswith("| `")]
    names, text = set(), {}
    for line in rows:
        for name in re.findall(r"`([a-z_0-9]+)`", line.split("|")[1]):
            names.add(name)
            text[name] = line
    return names, text


@pytest.mark.slow
def test_every_field_apmw_plan_prints_is_documented(plans, checked):
    # the plan's JSON grew `slo`, `routing` and two serving_policy keys that no table named (session 55's audit)
    names, text = _documented_fields("## `apmw plan --json` fields (stable)")
    for name in EXAMPLES:
        for d in (plans[name].to_dict(), checked[name].to_dict() | {"slo_sensitivity": []}):
            assert set(d) <= names, sorted(set(d) - names)
            assert [k for k in d["serving_policy"] if f"`{k}`" not in text["serving_policy"]] == []
