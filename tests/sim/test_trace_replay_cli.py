"""`apmw simulate --trace`: replay recorded sessions instead of sampling the workload."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES
from tests.e2e.test_cli import APMW

TRACE = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "mini_swe_calls_3sessions.csv"


def _sim(*extra: str) -> dict:
    r = subprocess.run([APMW, "simulate", str(EXAMPLES / "coding-agent.yaml"), "--agents", "3", "--duration-s",
                        "1500", "--json", "--seed", "1", *extra], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.slow
def test_trace_replay_runs_the_recorded_sessions():
    replayed = _sim("--trace", str(TRACE))
    sampled = _sim()
    assert replayed["completed_tasks"] > 0
    # the three recorded sessions have 84 calls each on average; the sampled ones differ
    assert replayed["task_latency_s"]["mean"] != sampled["task_latency_s"]["mean"]


def test_trace_replay_bad_file(tmp_path):
    bad = tmp_path / "x.jsonl"
    bad.write_text("")
    r = subprocess.run([APMW, "simulate", str(EXAMPLES / "coding-agent.yaml"), "--agents", "2", "--trace", str(bad)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
