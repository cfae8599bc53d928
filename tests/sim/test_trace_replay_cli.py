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


BROKEN = ('{"session_id": "s1", "input_length": 1000, "output_length": 50, "timestamp": 0}\n'
          '{"session_id": "s1", "input_length": 200, "delay": 2000}\n'
          '{"session_id": "s2", "input_length": 1000, "output_length": 50, "timestamp": 100}\n')


def test_a_replayed_trace_says_what_it_skipped(tmp_path):
    """A line without an output count was dropped: `apmw fit` said so, simulate --trace and plan --workload-from did
    not (the dropped line held the trace's only tool wait; fuzzing, session 44)."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(BROKEN)
    spec = str(EXAMPLES / "support-chat.yaml")
    r = subprocess.run([APMW, "simulate", spec, "--agents", "2", "--duration-s", "300", "--trace", str(trace), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    skipped = "skipped 1 malformed line(s) of the trace: 1 x no output token count"
    assert skipped in json.loads(r.stdout)["trace_notes"][0] and "t.jsonl:2" in r.stdout
    assert skipped in " ".join(r.stderr.split())
    r = subprocess.run([APMW, "plan", spec, "--analytic", "--workload-from", str(trace), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert skipped in json.loads(r.stdout)["workload_fit_notes"][0]


def _mooncake(tmp_path, lengths: list[int]):
    p = tmp_path / "calls.jsonl"
    p.write_text("".join(f'{{"timestamp": {i}, "input_length": {n}, "output_length": 100, "hash_ids": [{i}]}}\n'
                         for i, n in enumerate(lengths)))
    return p


def test_replayed_calls_past_the_context_window_are_noted_or_refused(tmp_path):
    """They were replayed as if an engine served them, without a word (Llama-3.1-70B's window: 131,072)."""
    spec = str(EXAMPLES / "support-chat.yaml")
    some = _mooncake(tmp_path, [220_000] + [2_000] * 9)
    r = subprocess.run([APMW, "simulate", spec, "--agents", "1", "--duration-s", "600", "--trace", str(some), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode in (0, 3), r.stderr
    said = "1 replayed call(s) (10.00%) hold more tokens (prompt and output) than the model's context window of 131,072"
    assert said in " ".join(r.stderr.split())
    assert any(said in n for n in json.loads(r.stdout)["trace_notes"])
    every = _mooncake(tmp_path, [220_000] * 3)
    r = subprocess.run([APMW, "simulate", spec, "--agents", "1", "--duration-s", "600", "--trace", str(every)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "100.0% of the replayed calls (3) hold more tokens" in " ".join(r.stderr.split())
