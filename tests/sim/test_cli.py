"""`apmw simulate` as a user runs it: JSON fields, the sweep, errors without tracebacks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.sim.helpers import BASE

APMW = shutil.which("apmw") or str(Path(sys.executable).parent / "apmw")
FIELDS = {"task_latency_s", "decode_batch_mean", "kv_tokens_resident_mean", "preemptions", "prefix_hit_rate",
          "completed_tasks", "simulated_s", "ttft_s", "tpot_s", "energy_j", "energy_per_task_j", "replica_power_w"}


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([APMW, "simulate", *args], capture_output=True, text=True, timeout=120)


def _spec(tmp_path: Path) -> str:
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(BASE))
    return str(path)


@pytest.mark.slow
def test_json_fields_and_seed(tmp_path):
    spec = _spec(tmp_path)
    r = run(spec, "--agents", "6", "--duration-s", "150", "--seed", "3", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert FIELDS <= d.keys()
    for key in ("task_latency_s", "ttft_s", "tpot_s"):
        assert set(d[key]) == {"mean", "p50", "p95", "p99"}
    assert d["completed_tasks"] > 0 and d["simulated_s"] >= 150
    again = json.loads(run(spec, "--agents", "6", "--duration-s", "150", "--seed", "3", "--json").stdout)
    assert again["task_latency_s"] == d["task_latency_s"]


@pytest.mark.slow
def test_sweep_reports_agents_per_replica_and_curve(tmp_path):
    r = run(_spec(tmp_path), "--agents-sweep", "2:10:4", "--duration-s", "120", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert [p["agents"] for p in d["curve"]] == [2, 6, 10]
    assert d["agents_per_replica"] in (0, 2, 6, 10)
    assert all(p["meets_slo"] == (p["task_latency_s"]["p95"] <= d["slo_task_latency_p95_s"]) for p in d["curve"])
    table = run(_spec(tmp_path), "--agents-sweep", "2:6:4", "--duration-s", "100")
    assert table.returncode == 0 and "simulated N*" in table.stdout


@pytest.mark.slow
def test_user_errors_are_one_line_not_tracebacks(tmp_path):
    for args in (["--agents-sweep", "10:2:1"], ["--agents", "3", "--warmup-s", "500", "--duration-s", "100"], []):
        r = run(_spec(tmp_path), *args)
        assert r.returncode != 0
        assert "Traceback" not in r.stderr and "error" in r.stderr.lower()


def test_auto_sweep_brackets_the_plan_n_star(tmp_path):
    from apmw.capacity import plan
    from apmw.cli.simulate import auto_sweep
    from apmw.spec import load_spec

    spec = load_spec(_spec(tmp_path))
    counts = auto_sweep(spec)
    n_star = plan(spec).agents_per_replica
    assert counts == sorted(counts) and counts[0] <= n_star <= counts[-1] and len(counts) >= 3


@pytest.mark.slow
def test_start_together_flag_reaches_the_simulator(tmp_path):
    spec = _spec(tmp_path)
    together = run(spec, "--agents", "4", "--duration-s", "200", "--json", "--start-together")
    spread = run(spec, "--agents", "4", "--duration-s", "200", "--json")
    assert together.returncode == 0 and spread.returncode == 0, together.stderr
    a, b = json.loads(together.stdout), json.loads(spread.stdout)
    assert a["completed_tasks"] > 0 and a["task_latency_s"] != b["task_latency_s"]


def test_a_short_run_where_the_pool_ran_short_warns_that_its_p95_may_be_far_off():
    """Near the KV limit the engine thrashes every few hours of simulated time, so a short run's p95
    swings with whether it caught an episode (docs/simulate.md, "The KV-bound regime"); a run that
    never preempted gets no warning."""
    from apmw import load_spec
    from apmw.sim import simulate

    spec = load_spec(Path(__file__).resolve().parents[2] / "examples" / "coding-agent.yaml")
    short = simulate(spec, 32, duration_s=3000, seed=1)
    assert short.preemptions > 0 and short.completed_tasks < 10_000
    (warning,) = [w for w in short.to_dict()["warnings"] if "ran short" in w]
    assert "ran short at 32 agents" in warning and f"recorded {short.completed_tasks:,}" in warning
    calm = simulate(spec, 4, duration_s=3000, seed=1)
    assert calm.preemptions == 0 and not any("ran short" in w for w in calm.to_dict()["warnings"])


def test_a_run_of_too_few_tasks_to_bracket_their_p95_says_so():
    # a sweep of 600 s runs answered "simulated N* 27" on support-chat from 8-34 tasks a count without a word
    # (session 55's audit); 72 tasks is the fewest whose p95 a 95 % order-statistic interval brackets
    from apmw import load_spec
    from apmw.sim import simulate
    from apmw.sim.result import min_tasks_for_p95_interval

    spec = load_spec(Path(__file__).resolve().parents[2] / "examples" / "support-chat.yaml")
    few = simulate(spec, 9, duration_s=600, seed=0)
    assert few.completed_tasks < min_tasks_for_p95_interval() == 72
    assert [w for w in few.to_dict()["warnings"] if "too few to bracket their p95" in w]
    enough = simulate(spec, 9, duration_s=20_000, seed=0)
    assert enough.completed_tasks >= 72 and enough.to_dict()["warnings"] == []


def test_a_run_that_records_no_task_says_so_and_what_to_do():
    spec = Path(__file__).resolve().parents[2] / "examples" / "coding-agent.yaml"
    r = run(spec, "--agents", "10", "--duration-s", "1e-9", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["completed_tasks"] == 0 and d["meets_slo"] is False
    (warning,) = d["warnings"]
    assert "no task was recorded at 10 agent(s) in the 8e-10 s measurement window" in warning and "run longer" in warning
    assert "warning: no task was recorded" in r.stderr


def test_a_sweep_without_a_knee_says_so_in_words(tmp_path):
    """Two agents far below saturation bend nothing: the table said 'knee: None' (fuzzing, session 44)."""
    r = run(_spec(tmp_path), "--agents-sweep", "1:2:1", "--duration-s", "150")
    assert r.returncode == 0, r.stderr
    said = " ".join(r.stdout.split())
    assert "knee: none (no N's mean task latency is 25% above the first N's)" in said and "None" not in said


def test_a_sweep_row_that_misses_an_slo_names_it(tmp_path):
    """Rows within the task p95 in the title said "meets SLO False" with no word of the TTFT SLO they missed (fuzz
    round 5): the table and the JSON curve name the SLOs each N misses."""
    spec = yaml.safe_load(yaml.safe_dump(BASE))
    spec["slo"] = {"task_latency_p95_s": 1e6, "ttft_p95_s": 1e-6}
    path = tmp_path / "ttft.yaml"
    path.write_text(yaml.safe_dump(spec))
    d = json.loads(run(str(path), "--agents-sweep", "1:2:1", "--duration-s", "100", "--json").stdout)
    assert [p["slo_failed"] for p in d["curve"]] == [["ttft_p95"], ["ttft_p95"]]
    table = run(str(path), "--agents-sweep", "1:2:1", "--duration-s", "100")
    assert table.returncode == 0, table.stderr
    assert table.stdout.count("no: ttft_p95") == 2


def test_auto_is_read_in_any_case_and_a_bad_sweep_names_it(tmp_path):
    """`--agents-sweep AUTO` is `auto`; a sweep simulate cannot read says both forms it takes (fuzz round 7: the
    error named only a:b[:step], though the help offers auto)."""
    from apmw.cli.common import parse_sweep
    from apmw.errors import ApmwError

    with pytest.raises(ApmwError, match=r"e\.g\. 10:100:10, or auto$"):
        parse_sweep("AUTO!", also="auto")
    with pytest.raises(ApmwError, match=r"e\.g\. 10:100:10$"):
        parse_sweep("x")            # bench's sweep has no auto
    r = run(_spec(tmp_path), "--agents-sweep", "AUTO", "--duration-s", "60", "--json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["curve"]) > 1
