"""The real-engine loop: apmw's plan, priced from a llama.cpp server's own calibration, against what
that server does under closed-loop agents at the edges of the plan's tolerance (issue 20; bench/README.md
"The llama.cpp loop").

The claim under test is the issue's: the measured N* lies within 15 % (or one agent) of the predicted
one. A measured knee is itself uncertain by several agents on this machine (levels of a hundred-odd
tasks put the p95's 95 % interval 2-3 s wide around an 8 s SLO), so instead of measuring the knee and
comparing two noisy numbers, the test measures the two levels that bound the claim and asks each for
the verdict its own interval allows:

- at the fewest agents whose knee the claim admits, the server must not surely miss the SLO (the
  p95 interval's lower end above it): were the knee lower, that level would lie past it;
- at one more than the most agents the claim admits, the server must not surely meet it (the
  interval's upper end at or below it): were the knee higher, that level would still lie before it.

A prediction far off either way fails (the one this test was written for, 19 against a measured 8,
puts its lower level at 17 agents, where this server's p95 is past 12 s).

The plan that places the levels is calibrated after a warm-up run; the plan held to the claim is
calibrated again after the levels, with the steps all three runs saw (docs/bench.md, "Calibration":
a calibration is good for the server as it was when taken). On CI's 2-core machine the server's
speed moved between the warm-up and the levels: a plan of 18 from the warm-up's steps against a
server that surely missed the SLO at 16 agents, and once a plan of 11 against one that surely met
it at 14. The verdicts stay those of the levels measured: a level the server surely misses puts
the knee below it, one it surely meets puts the knee at or above it, and the plan's admitted
knees must include one that agrees with both. Where the later plan's admitted knees reach past the
two levels, its own bounds are measured as well, so the levels always bracket the claim.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.loadgen.conftest import CLIENT_CPUS, on_cpus
from tests.loadgen.test_bench import APMW

HERE = Path(__file__).parent
LEVEL_S = 60        # about 100-130 tasks a level at 8-18 agents: the p95's interval brackets it
WARMUP_AGENTS, WARMUP_S = 8, 30


def knees_within_tolerance(predicted: int) -> tuple[int, int]:
    """The measured knees K the issue's claim admits for a predicted N*: |predicted - K| <= max(1, 15 % of K)."""
    admitted = [k for k in range(1, 2 * predicted + 3) if abs(predicted - k) <= max(1, round(0.15 * k))]
    return min(admitted), max(admitted)


def test_the_tolerance_band_is_the_issues_fifteen_percent_or_one_agent():
    assert knees_within_tolerance(3) == (2, 4)
    assert knees_within_tolerance(9) == (8, 11)
    assert knees_within_tolerance(14) == (12, 17)
    assert knees_within_tolerance(19) == (17, 22)


def _verdict_run(plan_after: int, *levels: tuple[int, float, float]) -> dict:
    return {"plan_after": {"agents_per_replica": plan_after}, "slo_s": 8.0,
            "levels": [{"agents": a, "task_latency_p95_interval_s": [lo, hi]} for a, lo, hi in levels]}


def test_a_level_on_the_sure_side_of_the_slo_bounds_the_knee_the_plan_must_admit():
    # CI, 2026-12-03: planned 18 from the warm-up; surely missed at 16 agents (p95 in [9.44, 12.16] s)
    ci_levels = (16, 9.44, 12.16), (22, 11.89, 15.87)
    assert claim_failures(_verdict_run(18, *ci_levels))                    # admits 16-21: knee below 16 is not
    # a plan of 14 admits 12-17: the levels bracket it only once one is measured at 12 or fewer agents
    assert claim_failures(_verdict_run(14, *ci_levels)) == ["no level at 12 agents or fewer bounds the claim"]
    assert not claim_failures(_verdict_run(14, (12, 6.9, 8.3), *ci_levels))
    surely_met_at_14 = (10, 6.2, 7.9), (14, 6.9, 7.99)
    assert claim_failures(_verdict_run(11, *surely_met_at_14))             # admits 10-13
    assert claim_failures(_verdict_run(12, *surely_met_at_14)) == ["no level past 14 agents bounds the claim"]
    assert not claim_failures(_verdict_run(12, *surely_met_at_14, (15, 7.6, 9.1)))   # admits 10-14
    straddling = (10, 6.5, 8.5), (14, 7.5, 9.5)
    assert not claim_failures(_verdict_run(11, *straddling))
    # a plan far off either way is never bracketed by levels placed near the knee
    assert claim_failures(_verdict_run(1, *straddling)) and claim_failures(_verdict_run(100, *straddling))


def _run(args: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    done = subprocess.run(APMW + args, capture_output=True, text=True, timeout=timeout_s,
                          preexec_fn=on_cpus(CLIENT_CPUS))
    assert done.returncode in (0, 2), done.stderr[-2000:]
    return done


def _level(spec_path: Path, server, agents: int, duration_s: float, out: Path) -> dict:
    summary = json.loads(_run(["bench", str(spec_path), "--endpoint", server.url, "--model", "tiny",
                               "--agents", str(agents), "--duration-s", str(duration_s), "--warmup-s", "5",
                               "--seed", "2", "--out", str(out), "--no-live", "--json"], 600).stdout)
    return summary["levels"][0]


def _calibrate_and_plan(spec_path: Path, server, cal: Path, loop_results: list[Path]) -> dict:
    args = ["bench", "--calibrate", str(cal), "--endpoint", server.url, "--model", "tiny"]
    for results in loop_results:
        args += ["--loop-results", str(results)]
    _run(args, 120)
    return json.loads(_run(["plan", str(spec_path), "--calibration", str(cal), "--json"], 300).stdout)


def around_the_plan(spec_file: Path, server, tmp_path: Path) -> dict:
    """Warm ``server`` up, calibrate it with the warm-up's steps under load, plan ``spec_file`` with that
    calibration, measure the two levels that bound the claim, and plan again from a calibration taken
    after them with every run's steps; where that plan's admitted knees reach past the levels, measure
    its own bounds too. ``{"plan", "plan_after", "calibration", "fewest", "most", "levels", "slo_s"}``
    (the levels as ``apmw bench --json`` summarises them, by agents; ``fewest`` and ``most`` the first
    plan's admitted knees). bench/llamacpp_loop.py runs it on every server shape and workload recorded
    in bench/README.md."""
    spec = yaml.safe_load(spec_file.read_text())
    spec["model"]["config"] = str(server.config_path)
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    # the server as it serves: a calibration taken after a loop has run, with the steps that loop's calls
    # saw (docs/bench.md, "Calibration")
    warm_up = tmp_path / "warm-up.jsonl"
    _level(spec_path, server, WARMUP_AGENTS, WARMUP_S, warm_up)
    plan = _calibrate_and_plan(spec_path, server, tmp_path / "cal.json", [warm_up])
    fewest, most = knees_within_tolerance(plan["agents_per_replica"])
    levels = {n: _level(spec_path, server, n, LEVEL_S, tmp_path / f"level-{n}.jsonl") for n in (fewest, most + 1)}
    plan_after = _calibrate_and_plan(spec_path, server, tmp_path / "cal-after.json",
                                     [warm_up, *(tmp_path / f"level-{n}.jsonl" for n in levels)])
    fewest_after, most_after = knees_within_tolerance(plan_after["agents_per_replica"])
    for n in (fewest_after, most_after + 1):
        if n not in levels and (n < min(levels) or n > max(levels)):
            levels[n] = _level(spec_path, server, n, LEVEL_S, tmp_path / f"level-{n}.jsonl")
    return {"plan": plan, "plan_after": plan_after, "calibration": json.loads((tmp_path / "cal.json").read_text()),
            "fewest": fewest, "most": most, "levels": [levels[n] for n in sorted(levels)],
            "slo_s": spec["slo"]["task_latency_p95_s"]}


def claim_failures(run: dict) -> list[str]:
    """Where the levels of ``run`` fail the claim against the plan calibrated after them. A level the
    server surely misses the SLO at (the p95 interval's lower end above it) puts the knee below it, one it
    surely meets (the upper end at or below it) puts the knee at or above it: the plan's admitted knees
    must reach both. And the levels must bracket those knees (one at or below the fewest, one past the
    most), or a plan far off would go untested."""
    n_star, slo_s = run["plan_after"]["agents_per_replica"], run["slo_s"]
    fewest, most = knees_within_tolerance(n_star)
    failures = []
    for level in run["levels"]:
        agents, (lower_s, upper_s) = level["agents"], level["task_latency_p95_interval_s"]
        if lower_s > slo_s and fewest >= agents:
            failures.append(f"at {agents} agents the server surely misses the SLO: its knee lies below {agents}, "
                            f"and N* {n_star} admits knees {fewest}-{most}")
        if upper_s <= slo_s and most < agents:
            failures.append(f"at {agents} agents the server surely meets the SLO: its knee lies at {agents} or "
                            f"above, and N* {n_star} admits knees {fewest}-{most}")
    agents = [level["agents"] for level in run["levels"]]
    if min(agents) > fewest:
        failures.append(f"no level at {fewest} agents or fewer bounds the claim")
    if max(agents) <= most:
        failures.append(f"no level past {most} agents bounds the claim")
    return failures


def level_text(run: dict, level: dict) -> str:
    ci = level["task_latency_p95_interval_s"]
    return (f"planned N* {run['plan']['agents_per_replica']} (admits knees {run['fewest']}-{run['most']}), "
            f"{run['plan_after']['agents_per_replica']} calibrated after the levels; at "
            f"{level['agents']} agents: {level['completed_tasks']} tasks, p95 {level['task_latency_s']['p95']:.2f} s "
            + ("(too few tasks for an interval)" if ci is None else f"[{ci[0]:.2f}, {ci[1]:.2f}]")
            + f" against the {run['slo_s']:g} s SLO")


# Measured 2026-12-02 (bench/README.md, "Where the time per token goes"): calibrated from the idle server
# alone, five runs planned 12, 15, 13, 15 and 10 against a knee of 11-13, and two failed here; with the
# warm-up's steps under load in the calibration, five runs planned 10, 10, 11, 13 and 11 and all held.
@pytest.mark.slow     # about five and a half minutes: a warm-up run, two calibrations, two (at most four) 60 s levels
@pytest.mark.serial   # the knee is timed on this machine: nothing else may run beside it
def test_the_servers_knee_lies_where_the_plan_from_its_calibration_puts_it(pinned_server, tmp_path):
    run = around_the_plan(HERE / "llamacpp-knee-4slots.yaml", pinned_server, tmp_path)
    plan = run["plan"]
    assert any(r["decode_seqs"] >= 3 for r in run["calibration"]["steps_under_load"])
    for p in (plan, run["plan_after"]):
        assert p["agents_per_replica_source"] == "simulated"
        assert p["sources"]["step_time"].startswith("measured on")
    for lv in run["levels"]:
        assert lv["task_latency_p95_interval_s"] is not None, f"too few tasks to bracket the p95: {lv}"
        print(level_text(run, lv))
    assert not claim_failures(run), claim_failures(run)
