"""Levers on workloads where the right answer is known by construction."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from apmw.levers import elasticities, evaluate_levers, top_two
from apmw.spec import spec_from_dict
from tests.conftest import EXAMPLES, small_spec_dict
from tests.e2e.test_cli import APMW


def long_context_long_waits() -> dict:
    """Big contexts held through minute-long tool waits: KV residency must dominate."""
    d = small_spec_dict()
    d["workload"].update(steps_per_task=20, new_input_tokens_per_call={"mean": 2000, "p95": 5000},
                         output_tokens_per_call={"mean": 100, "p95": 300}, tool_wait_s={"p50": 60, "p95": 180})
    d["serving"].update(tool_wait_kv_policy="retain", max_batch=256)
    d["slo"]["task_latency_p95_s"] = 3600
    return d


def short_context_output_heavy() -> dict:
    """Tiny prompts, long outputs, short tool waits and a low batch limit: batching must dominate."""
    d = small_spec_dict()
    d["workload"].update(steps_per_task=5, system_prompt_tokens=200,
                         new_input_tokens_per_call={"mean": 100, "p95": 200},
                         output_tokens_per_call={"mean": 800, "p95": 1500}, tool_wait_s={"p50": 0.5, "p95": 1.5})
    d["serving"].update(max_batch=16)
    d["slo"]["task_latency_p95_s"] = 600
    return d


def test_kv_residency_leads_for_long_context_with_long_waits():
    results = evaluate_levers(spec_from_dict(long_context_long_waits()))
    best = top_two(results)
    assert best and best[0].group == "kv_residency"
    assert best[0].binding_before == "kv_memory"
    assert best[0].gain > 1.3


def test_batching_leads_for_short_context_output_heavy():
    results = evaluate_levers(spec_from_dict(short_context_output_heavy()))
    best = top_two(results)
    assert [r.group for r in best] == ["decode_batching", "decode_batching"]
    assert best[0].binding_before == "batch_limit"
    assert next(r for r in results if r.lever == "batch_limit_x2").gain > 1.3


def test_gain_is_after_over_before_and_backfires_are_flagged():
    results = evaluate_levers(spec_from_dict(long_context_long_waits()))
    for r in results:
        d = r.to_dict()
        assert d["gain"] == pytest.approx(d["agents_per_mw_after"] / d["agents_per_mw_before"])
        assert d["lowers_agents_per_mw"] == (d["gain"] < 1)
    # halving KV bytes relieves the binding KV memory
    assert next(r for r in results if r.lever == "kv_fp8").gain > 1


def test_pue_elasticity_is_minus_one():
    """N* does not depend on PUE and facility power is proportional to it: elasticity exactly -1."""
    e = elasticities(spec_from_dict(small_spec_dict()))
    assert e["power.pue"] == pytest.approx(-1.0, abs=1e-9)
    assert e["slo.task_latency_p95_s"] >= 0


def test_an_input_at_zero_has_no_elasticity_and_does_not_stop_the_others():
    """A share of 0 is still 0: host power set to 0 W (a spec may say so) cannot move, so its elasticity is None
    (it raised ZeroDivisionError) while PUE's is still -1."""
    d = small_spec_dict()
    d.setdefault("power", {})["host_power_w_per_gpu"] = 0
    e = elasticities(spec_from_dict(d))
    assert e["power.host_power_w_per_gpu"] is None
    assert e["power.pue"] == pytest.approx(-1.0, abs=1e-9)


def test_cli_json(tmp_path):
    import yaml

    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(long_context_long_waits()))
    r = subprocess.run([APMW, "levers", str(p), "--json", "--no-elasticities"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["top_two"] and {"lever", "group", "agents_per_mw_before", "agents_per_mw_after", "gain",
                             "relaxes"} <= d["levers"][0].keys()
    assert {x["group"] for x in d["levers"]} <= {"kv_residency", "decode_batching", "other"}


@pytest.mark.slow
def test_verify_rechecks_the_top_levers_in_the_simulator():
    from apmw.levers import verify_levers

    d = long_context_long_waits()
    d["workload"]["steps_per_task"] = 6
    results = verify_levers(evaluate_levers(spec_from_dict(d)), top=2)
    checked = [r for r in results if r.verified is not None]
    assert len(checked) == 2
    for r in checked:
        v = r.verified
        if "skipped" in v:        # summarisation / disaggregated prefill: not in the simulator
            assert "does not model" in v["skipped"]
        else:
            assert v["agents"] == r.agents_per_replica_after and v["completed_tasks"] > 0


def test_a_4bit_kv_cache_is_offered_only_on_gpus_with_fp4():
    # NVFP4 KV needs Blackwell: on an H100 (no FP4 rate in the catalogue) the lever is not
    # applicable; on a B200 it is
    d = long_context_long_waits()
    d["model"]["kv_dtype"] = "fp8"
    for gpu, offered in (("H100", False), ("B200", True)):
        d["hardware"]["gpu"] = gpu
        names = {r.lever for r in evaluate_levers(spec_from_dict(d))}
        assert ("kv_fp4" in names) is offered, gpu


def test_levers_a_llamacpp_server_cannot_take_are_not_offered():
    """llama.cpp has no retain/ttl/offload policy and no speculative decoding here: a lever that would
    need one is not a valid spec for that engine, so it is left out rather than priced."""
    from tests.sim.helpers import spec_with

    spec = spec_with(engine="llamacpp", max_batch=8)
    names = {r.lever for r in evaluate_levers(spec)}
    assert names and not names & {"policy_retain", "policy_offload", "policy_ttl", "speculative_decoding"}
    vllm = {r.lever for r in evaluate_levers(spec_with(max_batch=8, tool_wait_kv_policy="evict"))}
    assert "policy_retain" in vllm


@pytest.mark.parametrize("gpu,doubled", [("H200", None), ("GB300", 16)])
def test_doubling_the_gpus_stays_inside_the_scale_up_domain(gpu, doubled):
    from apmw.levers import LEVERS

    d = small_spec_dict()
    d["hardware"] = {"gpu": gpu, "gpus_per_replica": 8}
    spec = spec_from_dict(d)
    (lever,) = [lv for lv in LEVERS if lv.name == "gpus_x2"]
    changed = lever.change(spec, None)
    assert (None if isinstance(changed, str) else changed.hardware.gpus_per_replica) == doubled


def test_every_lever_left_out_says_why():
    d = long_context_long_waits()
    reasons: dict[str, str] = {}
    results = evaluate_levers(spec_from_dict(d), not_applicable=reasons)
    from apmw.levers import LEVERS
    assert {r.lever for r in results} | set(reasons) == {lever.name for lever in LEVERS}
    assert not {r.lever for r in results} & set(reasons)
    assert reasons["policy_retain"] == "the tool-wait KV policy is already retain"
    assert reasons["prefix_caching"] == "prefix caching is already on"
    assert all(why.strip() for why in reasons.values())


def test_levers_json_lists_the_levers_that_do_not_apply(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps(long_context_long_waits()))
    r = subprocess.run([APMW, "levers", str(spec), "--json", "--no-elasticities"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert "policy_retain" in d["not_applicable"] and "policy_retain" not in {x["lever"] for x in d["levers"]}


def test_a_lever_that_leaves_no_capacity_says_why():
    """Halving support-chat's 2 H100s leaves 0.9 GB of KV memory for a session whose p95 needs 2.4 GB: the lever
    stays in the ranking at gain 0 (it lowers agents/MW) and its detail carries the planner's reason, which the
    table printed as only 'infeasible'."""
    from tests.conftest import EXAMPLES
    from apmw.spec import load_spec
    half = next(r for r in evaluate_levers(load_spec(EXAMPLES / "support-chat.yaml")) if r.lever == "gpus_half")
    assert half.gain == 0 and half.plan_after is None
    assert "one session's KV" in half.detail and "exceeds the replica's KV memory" in half.detail


def test_an_integer_input_steps_at_least_one_and_is_divided_by_the_step_it_took():
    """A batch limit of 4 scaled by 0.9 and 1.1 rounded to 4 both ways: elasticity 0.0 printed as 'no effect' where
    the limit binds (fuzzing, session 45), and a rounded step was divided by ln(1.1 / 0.9) whatever it was.
    The step is at least one either way (3 and 5), and the elasticity is over that step."""
    import math

    from apmw.capacity import plan

    d = small_spec_dict()
    d["serving"]["max_batch"] = 4
    spec = spec_from_dict(d)
    assert plan(spec).search.binding_constraint == "batch_limit"

    def per_mw(limit: int) -> float:
        d["serving"]["max_batch"] = limit
        return plan(spec_from_dict(d)).to_dict()["agents_per_mw"]

    e = elasticities(spec)
    assert e["serving.max_batch"] == pytest.approx(math.log(per_mw(5) / per_mw(3)) / math.log(5 / 3))
    assert e["serving.max_batch"] > 0.1


def test_levers_verify_exits_3_where_the_simulator_misses_and_names_the_slo_it_misses():
    """`levers --verify` exited 0 with both verified levers missing the SLO in simulation, and its line gave the task
    p95s (which met it) and 'SLO missed', not the TTFT p95 that missed (fuzzing, session 45). It exits 3 as
    `plan --verify` does, naming each missed SLO with its figure and limit."""
    spec = str(EXAMPLES / "support-chat.yaml")
    r = subprocess.run([APMW, "levers", spec, "--verify", "--no-elasticities", "--json"], capture_output=True,
                       text=True, timeout=600)
    verified = [lv for lv in json.loads(r.stdout)["levers"] if lv.get("verify") and "skipped" not in lv["verify"]]
    assert verified
    missed = [lv for lv in verified if not lv["verify"]["simulated_meets_slo"]]
    assert r.returncode == (3 if missed else 0), r.stderr
    text = subprocess.run([APMW, "levers", spec, "--verify", "--no-elasticities"], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert text.returncode == r.returncode
    said = " ".join(text.stdout.split())
    for lv in verified:
        verdict = lv["verify"]["simulated_slo_verdict"]
        assert f"verified {lv['lever']}: simulated task p95" in said
        for name, v in verdict.items():
            if not v["met"]:
                assert f"{lv['lever']}'s {lv['verify']['agents']} agents" in text.stderr
                assert name in text.stderr


def test_disaggregation_that_cannot_be_planned_says_why():
    """support-chat frees contexts at tool waits, which disaggregated serving does not model: the lever said "no
    prefill instance of 1/2/4/8 GPUs gives a feasible plan", as if each split had been planned (fuzz round 5)."""
    from apmw.levers import LEVERS
    from apmw.spec import load_spec

    (lever,) = [lv for lv in LEVERS if lv.name == "disaggregated_prefill"]
    why = lever.change(load_spec(EXAMPLES / "support-chat.yaml"), None)
    assert isinstance(why, str) and why.startswith("no prefill instance gives a feasible plan: 1/2/4/8 GPUs: ")
    assert "('evict') is not modelled" in why
