"""`apmw simulate`'s table says, per SLO, whether it holds, and whether the KV pool held every call."""

from __future__ import annotations

import os
import subprocess

from tests.e2e.test_cli import APMW, EXAMPLES


def _table(*args: str) -> str:
    r = subprocess.run([APMW, "simulate", *args], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "COLUMNS": "220"})
    assert r.returncode == 0, r.stderr
    return " ".join(r.stdout.split())


def test_each_slo_and_the_kv_pool_have_a_verdict():
    # support-chat at 30 agents: its TTFT p95 passes the 5 s SLO, the task p95 and TPOT hold
    text = _table(str(EXAMPLES / "support-chat.yaml"), "--agents", "30", "--duration-s", "2000")
    assert "TTFT p95" in text and "> 5.0 s MISSED" in text
    assert "task p95" in text and "<= 1,500 s met" in text and "<= 60.0 ms met" in text
    assert "KV pool │ fits (peak" in text and "no preemption" in text


def test_a_pool_that_runs_short_says_so():
    text = _table(str(EXAMPLES / "coding-agent.yaml"), "--agents", "40", "--duration-s", "600")
    assert "KV pool │ RAN SHORT:" in text and "preemptions (peak" in text
