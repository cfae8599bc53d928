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
