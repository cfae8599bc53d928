"""`apmw fit` as a user runs it: JSON fields, YAML that `apmw plan` accepts, export, errors without tracebacks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import EXAMPLES
from tests.traces.conftest import FIXTURES

APMW = shutil.which("apmw") or str(Path(sys.executable).parent / "apmw")
JSON_FIELDS = {"sessions", "calls", "calls_per_session", "input_tokens_per_call", "output_tokens_per_call",
               "tool_wait_s", "cached_prompt_share", "skipped_lines", "skipped", "notes", "format",
               "system_prompt_tokens", "new_input_tokens_per_call", "reusable_prefix_share", "workload"}


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([APMW, "fit", *args], capture_output=True, text=True, timeout=120)


def test_json_summary_fields():
    r = run(str(FIXTURES / "otel_genai.jsonl"), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert JSON_FIELDS <= d.keys()
    for key in ("calls_per_session", "input_tokens_per_call", "output_tokens_per_call", "tool_wait_s"):
        assert {"mean", "p50", "p95", "p99"} <= d[key].keys()
    assert (d["sessions"], d["calls"], d["skipped_lines"]) == (3, 9, 0)


def test_yaml_output_plans(tmp_path):
    out = tmp_path / "workload.yaml"
    r = run(str(FIXTURES / "mini_swe_calls_3sessions.csv"), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "calls per session" in r.stderr and "cached prompt share" in r.stderr
    spec = yaml.safe_load((EXAMPLES / "coding-agent.yaml").read_text())
    spec["workload"] = yaml.safe_load(out.read_text())["workload"]
    full = tmp_path / "spec.yaml"
    full.write_text(yaml.safe_dump(spec))
    p = subprocess.run([APMW, "plan", str(full), "--json", "--analytic"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["agents_per_replica"] >= 1


def test_skips_are_reported_and_strict_fails(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5}\nnot json\n')
    r = run(str(p), "--format", "mooncake")
    assert r.returncode == 0 and "skipped 1 malformed line" in r.stderr and f"{p}:2" in r.stderr
    r = run(str(p), "--format", "mooncake", "--strict")
    assert r.returncode == 1 and f"{p}:2" in r.stderr and "Traceback" not in r.stderr


def test_unrecognised_file_errors_cleanly(tmp_path):
    p = tmp_path / "x.txt"
    p.write_text("hello\n")
    r = run(str(p))
    assert r.returncode == 1 and "error:" in r.stderr and "accepted formats" in r.stderr
    assert "Traceback" not in r.stderr


def test_export_aiperf_round_trip(tmp_path):
    target = tmp_path / "replay.jsonl"
    r = run(str(FIXTURES / "mini_swe_calls_3sessions.csv"), "--export", "aiperf", "--export-path", str(target),
            "--json")
    assert r.returncode == 0, r.stderr
    orig = json.loads(r.stdout)
    assert orig["export"]["lines"] == 252
    back = json.loads(run(str(target), "--format", "aiperf-mooncake", "--json").stdout)
    assert (back["sessions"], back["calls"]) == (3, 252)
    for key in ("input_tokens_per_call", "output_tokens_per_call", "new_input_tokens_per_call"):
        assert back[key]["mean"] == orig[key]["mean"]
    # tool waits between calls survive as AIPerf 'delay' (ms, 3 decimals); the last call's wait has no next turn
    assert abs(back["tool_wait_s"]["p50"] - orig["tool_wait_s"]["p50"]) < 0.01
    # the hash_ids we wrote make the history reusable: block-granular, so a little below the structural share
    assert 0.9 < back["cached_prompt_share"] <= orig["reusable_prefix_share"]
    # the system prompt comes back in whole 512-token blocks, and the export says so (it claimed the same figures)
    assert back["system_prompt_tokens"] == orig["system_prompt_tokens"] // 512 * 512 < orig["system_prompt_tokens"]
    assert orig["export"]["notes"] == [f"the system prompt's {orig['system_prompt_tokens']:,} tokens are shared in "
                                       f"whole 512-token blocks (hash_ids): the replay, and apmw fit on the export, "
                                       f"share {back['system_prompt_tokens']:,}"]


def test_an_export_of_steps_of_several_calls_says_they_come_back_one_call_a_step(tmp_path):
    target = tmp_path / "replay.jsonl"
    r = run(str(FIXTURES / "otel_steps.jsonl"), "--export", "aiperf", "--export-path", str(target), "--json")
    assert r.returncode == 0, r.stderr
    notes = json.loads(r.stdout)["export"]["notes"]
    assert any("steps of several calls (1.60 calls a step)" in n for n in notes)
    back = json.loads(run(str(target), "--json").stdout)
    assert back["calls_per_step"] is None or back["calls_per_step"]["mean"] == 1.0


def test_export_keeps_sessions_apart_whose_names_would_meet(tmp_path):
    """Runs 'a-b' with instance 'c' and 'a' with 'b-c' were both written as session 'a-b-c', one session of six
    turns on the way back (fuzzing, session 42)."""
    src, target = tmp_path / "calls.csv", tmp_path / "out.jsonl"
    src.write_text("run,instance_id,call_index,prompt_tokens,completion_tokens\n"
                   + "".join(f"{r},{i},{k},{1000 + 200 * k},50\n" for r, i in (("a-b", "c"), ("a", "b-c"))
                             for k in range(3)))
    assert run(str(src), "--export", "aiperf", "--export-path", str(target)).returncode == 0
    names = [json.loads(line)["session_id"] for line in target.read_text().splitlines()]
    assert len(set(names)) == 2 and names[:3] == [names[0]] * 3
    back = json.loads(run(str(target), "--json").stdout)
    assert (back["sessions"], back["calls"]) == (2, 6)


def test_export_fitted_is_seeded(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    src = str(FIXTURES / "otel_genai.jsonl")
    for path in (a, b):
        r = run(src, "--export", "aiperf", "--export-from", "fitted", "--export-sessions", "50", "--seed", "3",
                "--export-path", str(path), "--json")
        assert r.returncode == 0, r.stderr
    assert a.read_bytes() == b.read_bytes()
    back = json.loads(run(str(a), "--json").stdout)
    assert back["sessions"] == 50
    assert back["system_prompt_tokens"] >= 1024   # the shared system-prompt blocks: 1200 // 512 full blocks


def test_stdout_is_the_yaml_section_alone():
    r = run(str(FIXTURES / "otel_genai.jsonl"))
    assert r.returncode == 0, r.stderr
    section = yaml.safe_load(r.stdout)["workload"]
    assert section["system_prompt_tokens"] == 1200 and section["calls_per_step"] == 1
    assert "calls per session" in r.stderr


def test_export_is_accepted_by_aiperf_itself(tmp_path):
    """Runs where aiperf is installed (pip install aiperf==0.13.0; not a project dependency)."""
    import pytest

    models = pytest.importorskip("aiperf.dataset.loader.models")
    loader = pytest.importorskip("aiperf.dataset.loader.mooncake_trace")
    target = tmp_path / "replay.jsonl"
    assert run(str(FIXTURES / "mini_swe_calls_3sessions.csv"), "--export", "aiperf", "--export-path",
               str(target)).returncode == 0
    rows = [json.loads(line) for line in target.read_text().splitlines()]
    for row in rows:
        models.MooncakeTrace.model_validate(row)
    assert loader.MooncakeTraceDatasetLoader.can_load(rows[0])


def test_options_that_do_not_apply_are_errors():
    src = str(FIXTURES / "mini_swe_calls_3sessions.csv")
    r = run(src, "--map", "input_tokens=prompt_tokens,output_tokens=completion_tokens")
    assert r.returncode == 1 and "--format csv" in r.stderr
    r = run(src, "--export", "aiperf", "--export-sessions", "5")
    assert r.returncode == 1 and "--export-from fitted" in r.stderr


def test_paths_on_stderr_stay_whole_and_as_written(tmp_path):
    """A long path, or one with ``[red]`` in its name, is printed whole and as written on stderr: rich wrapped a
    pipe at 80 columns, cutting ``file:line`` across lines, and read ``[red]`` as a colour."""
    folder = tmp_path / ("a-folder-name-long-enough-to-push-the-line-past-eighty-columns" * 2)
    folder.mkdir()
    p = folder / "t[red].jsonl"
    p.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5}\nnot json\n')
    out = folder / "w[red].yaml"
    r = run(str(p), "--format", "mooncake", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert f"{p}:2" in r.stderr and f"wrote {out}\n" in r.stderr
