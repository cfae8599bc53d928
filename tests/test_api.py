"""The Python API answers what the CLI prints: `plan` is `apmw plan --analytic`, `check_plan(plan(spec))` is
`apmw plan` (README, "The Python API mirrors the CLI")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import apmw

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "deep-research.yaml"
FIGURES = ("agents_per_replica", "agents_per_replica_source", "binding_constraint", "agents_per_mw",
           "agents_per_mw_provisioned", "cost_per_session_usd")


def _cli_plan(*flags: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "apmw", "plan", str(SPEC), "--json", *flags], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


@pytest.mark.slow
def test_plan_and_check_plan_give_what_apmw_plan_prints():
    analytic = apmw.plan(apmw.load_spec(SPEC))
    checked = apmw.check_plan(analytic).to_dict()
    cli_analytic, cli_checked = _cli_plan("--analytic"), _cli_plan()
    assert {k: analytic.to_dict()[k] for k in FIGURES} == {k: cli_analytic[k] for k in FIGURES}
    assert {k: checked[k] for k in (*FIGURES, "agents_per_replica_interval")} == \
           {k: cli_checked[k] for k in (*FIGURES, "agents_per_replica_interval")}
    assert checked["agents_per_replica_source"] == "simulated"
    assert set(cli_checked) - set(checked) == {"slo_sensitivity"}


@pytest.fixture(scope="module")
def spec():
    return apmw.load_spec(SPEC)


@pytest.mark.parametrize("agents", [0, -5, 1.5, float("nan"), True, 10**7])
def test_plan_refuses_an_agent_count_the_cli_would(spec, agents):
    # 0 divided by zero, -5 and 1.5 failed deep in numpy (fuzz round 6)
    with pytest.raises(apmw.ApmwError, match=r"agents .*: give a whole number from 1 to 1,000,000"):
        apmw.plan(spec, agents=agents)


def test_a_verb_that_takes_a_plan_says_so_when_given_a_spec(spec):
    for verb in (apmw.check_plan, apmw.fleet_day):
        with pytest.raises(apmw.ApmwError, match=rf"{verb.__name__} takes a Plan, got Spec; plan it first"):
            verb(spec)


def test_load_architecture_reads_a_path_and_refuses_what_is_not_a_name():
    config = ROOT / "src" / "apmw" / "catalog" / "data" / "models" / "Qwen--Qwen3-8B.json"
    assert apmw.load_architecture(config).params == apmw.load_architecture(str(config)).params
    for bad in (None, 5):
        with pytest.raises(apmw.ApmwError, match="load_architecture takes a bundled model's name"):
            apmw.load_architecture(bad)


@pytest.mark.parametrize("change, said", [({"isl": float("nan")}, "isl must be a whole number of at least 1"),
                                          ({"osl": 10.5}, "osl must be a whole number of at least 1"),
                                          ({"gpu": None}, "gpu None: give a GPU's name")])
def test_predict_refuses_what_the_cli_cannot_pass(change, said):
    base = dict(model="Qwen/Qwen3-8B", gpu="H100", tp=1, weight_dtype="bf16", kv_dtype="bf16", isl=1000, osl=100,
                concurrency=8)
    with pytest.raises(apmw.ApmwError, match=said):
        apmw.predict(**{**base, **change})


@pytest.mark.parametrize("drain", [-1.0, float("inf"), float("nan")])
def test_simulate_refuses_a_drain_limit_that_is_not_a_duration(spec, drain):
    """How long the tasks in flight may run on after the window: a finite number of seconds, 0 or more (fuzz
    round 7: -1 was taken)."""
    with pytest.raises(apmw.ApmwError, match="drain_limit_s"):
        apmw.simulate(spec, 2, 60, drain_limit_s=drain)
