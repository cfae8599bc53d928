"""Mixed fleets (apmw fleet FLEET.yaml): placements of several workloads on pools and GPU types, each priced."""

from __future__ import annotations

import dataclasses
import json
import re
import math
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from apmw.capacity import plan
from apmw.capacity.fleet_day import fleet_day
from apmw.capacity.fleet_mix import fleet_mix
from apmw.capacity.session_mix import PER_CALL_MEAN, PER_DECODE_MEAN, PER_TASK, mix_counts, mix_samples
from apmw.capacity.sessions import SessionSample, sample_sessions
from apmw.perf import replica_from_spec
from apmw.spec import spec_from_dict
from apmw.spec.fleet_file import FleetFileError, load_fleet_file
from tests.conftest import EXAMPLES, small_spec_dict

# The tests' day (tests/capacity/test_fleet_day.py) and the same day six hours later.
DAY = [0, 50, 100, 400, 900, 1500, 2200, 3000, 3600, 4000, 4200, 4000,
       3800, 3500, 3000, 2600, 2000, 1500, 1000, 700, 400, 200, 100, 0]
LATER = DAY[-6:] + DAY[:-6]


def _spec_dict(day=DAY, **sections) -> dict:
    d = small_spec_dict()
    d["workload"]["steps_per_task"] = {"mean": 40, "p95": 80}      # fewer, longer sessions: a quicker sample
    d["slo"] = {"task_latency_p95_s": 600}
    d["fleet"] = {"tasks_per_hour": list(day), "headroom": 0.1}
    for k, v in sections.items():
        d[k] = {**d.get(k, {}), **v}
    return d


def _fleet(tmp_path: Path, workloads: list[dict], specs: dict[str, dict], **top) -> Path:
    """A fleet file in ``tmp_path`` with its spec files beside it."""
    for name, d in specs.items():
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(d))
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({"workloads": workloads, **top}, sort_keys=False))
    return path


def _placement(d: dict, name: str) -> dict:
    return next(p for p in d["placements"] if p["placement"] == name)


def _pool(d: dict, name: str) -> dict:
    return next(p for p in d["pools"] if p["name"] == name)


@pytest.fixture(scope="module")
def two_shifted(tmp_path_factory):
    """Two workloads of one model whose busiest hours are six hours apart, split and shared."""
    tmp = tmp_path_factory.mktemp("mix")
    path = _fleet(tmp, [{"name": "a", "spec": "a.yaml"}, {"name": "b", "spec": "b.yaml"}],
                  {"a": _spec_dict(), "b": _spec_dict(LATER)})
    return fleet_mix(load_fleet_file(path)).to_dict()


def test_a_pool_of_one_workload_is_apmw_fleet_on_its_spec(tmp_path):
    d = _spec_dict()
    path = _fleet(tmp_path, [{"name": "a", "spec": "a.yaml"}], {"a": d},
                  hardware=[{"gpu": "H100", "gpus_per_replica": 1, "gpu_hour_usd": 2.0}])
    day = fleet_day(plan(spec_from_dict(d)), compare_routing=False).to_dict()
    for hw_list in (False, True):       # the workload's own hardware, and the same listed as a candidate
        if not hw_list:
            path = _fleet(tmp_path, [{"name": "a", "spec": "a.yaml"}], {"a": d})
        out = fleet_mix(load_fleet_file(path)).to_dict()
        (split,) = [p for p in out["placements"] if p["kind"] == "split"]
        (pool,) = out["pools"]
        assert split["pools"] == [pool["name"]] == ["a@H100x1"]
        for k in ("peak_replicas", "peak_gpus", "gpu_hours_per_day", "facility_mwh_per_day", "cost_per_day_usd",
                  "cost_per_month_usd", "cost_per_task_usd", "tasks_per_day"):
            assert split[k] == pytest.approx(day[k], rel=1e-12), k
            if k != "tasks_per_day":
                assert pool[k] == pytest.approx(day[k], rel=1e-12), k
        assert [h["replicas"] for h in pool["hours"]] == [h["replicas"] for h in day["hours"]]
        assert pool["agents_per_replica_max_at_peak"] == day["agents_per_replica_max"]
        assert out["cheapest_placement"] == split["placement"]


def test_peaks_at_different_hours_share_replicas(two_shifted):
    d = two_shifted
    split, shared = _placement(d, "split:own"), _placement(d, "shared:H100x1")
    a, b, ab = _pool(d, "a@H100x1"), _pool(d, "b@H100x1"), _pool(d, "a+b@H100x1")
    # the shared pool's busiest hour needs fewer replicas than the two pools' busiest hours together
    assert ab["peak_replicas"] < a["peak_replicas"] + b["peak_replicas"]
    assert shared["peak_gpus"] < split["peak_gpus"]
    assert shared["secured_gpu_cost_per_month_usd"] < split["secured_gpu_cost_per_month_usd"]
    c = shared["compared_with_split"]
    assert c["placement"] == "split:own" and c["peak_gpus_saved"] == split["peak_gpus"] - shared["peak_gpus"] > 0
    # and every hour holds Little's law on the summed demand, with each workload's tasks named
    for h in ab["hours"]:
        assert h["tasks"] == pytest.approx(h["tasks_by_workload"]["a"] + h["tasks_by_workload"]["b"])
        if h["tasks"]:
            assert h["concurrent_agents"] == pytest.approx(h["tasks"] / 3600 * h["task_latency_mean_s"], rel=1e-6)
            assert h["agents_per_replica"] * 1.1 <= h["agents_per_replica_max"] + 1e-9
    assert split["coincident_peak_gpus"] <= split["peak_gpus"]
    assert d["cheapest_placement"] in {"split:own", "shared:H100x1"}


def test_each_workload_meets_its_own_slo_in_a_shared_pool(two_shifted):
    ab = _pool(two_shifted, "a+b@H100x1")
    rows = {r["workload"]: r for r in ab["slo_at_peak"]}
    assert set(rows) == {"a", "b"}
    for r in rows.values():
        assert r["meets_slo"] and r["task_latency_p95_s"] <= r["slo"]["task_latency_p95_s"]


def test_two_copies_of_a_workload_share_like_one_workload_with_their_summed_demand(tmp_path):
    path = _fleet(tmp_path, [{"name": "a", "spec": "a.yaml"}, {"name": "b", "spec": "a.yaml"}], {"a": _spec_dict()})
    ab = _pool(fleet_mix(load_fleet_file(path)).to_dict(), "a+b@H100x1")
    double = fleet_day(plan(spec_from_dict(_spec_dict([2 * t for t in DAY]))), compare_routing=False)
    for mixed, alone in zip(ab["hours"], double.hours):
        assert abs(mixed["replicas"] - alone.replicas) <= max(1, 0.05 * alone.replicas), mixed["hour"]


def test_workloads_on_different_models_do_not_share_a_replica(tmp_path):
    other = _spec_dict(LATER, model={"config": "Qwen/Qwen3-8B"})
    path = _fleet(tmp_path, [{"name": "a", "spec": "a.yaml"}, {"name": "q", "spec": "q.yaml"}],
                  {"a": _spec_dict(), "q": other})
    d = fleet_mix(load_fleet_file(path)).to_dict()
    shared = _placement(d, "shared")
    assert shared["pools"] == ["a+q@any"] and "use different models" in shared["refused"]
    assert "cost_per_month_usd" not in shared
    assert d["cheapest_placement"] == "split:own"


def test_workloads_with_different_engine_settings_do_not_share(tmp_path):
    path = _fleet(tmp_path, [{"name": "a", "spec": "a.yaml"}, {"name": "b", "spec": "a.yaml",
                                                                "overrides": {"serving": {"tool_wait_kv_policy": "evict"}}}],
                  {"a": _spec_dict()})
    d = fleet_mix(load_fleet_file(path)).to_dict()
    assert "serving.tool_wait_kv_policy" in _placement(d, "shared")["refused"]


def test_an_slo_no_mix_can_meet_refuses_the_shared_pool_naming_it(tmp_path):
    path = _fleet(tmp_path, [{"name": "a", "spec": "a.yaml"},
                             {"name": "fast", "spec": "a.yaml", "overrides": {"slo": {"ttft_p95_s": 1e-4},
                                                                              "fleet": {"tasks_per_hour": LATER}}}],
                  {"a": _spec_dict()})
    d = fleet_mix(load_fleet_file(path)).to_dict()
    shared = _placement(d, "shared:H100x1")
    assert "no number of agents meets every workload's SLO" in shared["refused"]
    assert "fast TTFT p95" in shared["refused"] and d["cheapest_placement"] is None
    # what it takes, what its SLO allows and what would help: it said "fast TTFT p95" alone (fuzzing, session 43)
    assert re.search(r"at one agent, fast TTFT p95 [\d.,]+ m?s against its SLO's 0.1 ms\. Needed: a looser SLO",
                     shared["refused"]), shared["refused"]


@pytest.mark.slow
def test_a_stricter_slo_on_one_workload_never_raises_the_shared_n_star(tmp_path):
    loose = _fleet(tmp_path, [{"name": "a", "spec": "a.yaml"}, {"name": "b", "spec": "b.yaml"}],
                   {"a": _spec_dict(), "b": _spec_dict(LATER)})
    n_loose = [h["agents_per_replica_max"] for h in _pool(fleet_mix(load_fleet_file(loose)).to_dict(),
                                                          "a+b@H100x1")["hours"]]
    strict = _fleet(tmp_path, [{"name": "a", "spec": "a.yaml"}, {"name": "b", "spec": "b.yaml"}],
                    {"a": _spec_dict(), "b": _spec_dict(LATER, slo={"task_latency_p95_s": 400})})
    pool = _pool(fleet_mix(load_fleet_file(strict)).to_dict(), "a+b@H100x1")
    n_strict = [h["agents_per_replica_max"] for h in pool["hours"]]
    assert all(s <= lo for s, lo in zip(n_strict, n_loose)) and sum(n_strict) < sum(n_loose)
    assert "b task p95" in pool["binding_at_peak"]


@pytest.mark.slow
def test_each_gpu_type_is_priced_at_its_own_price_and_the_best_is_chosen_per_workload(tmp_path):
    path = _fleet(tmp_path, [{"name": "a", "spec": "a.yaml"}, {"name": "b", "spec": "b.yaml"}],
                  {"a": _spec_dict(), "b": _spec_dict(LATER)},
                  hardware=[{"gpu": "H100", "gpus_per_replica": 1, "gpu_hour_usd": 2.0},
                            {"gpu": "H200", "gpus_per_replica": 1, "gpu_hour_usd": 9.0}])
    d = fleet_mix(load_fleet_file(path)).to_dict()
    names = [p["placement"] for p in d["placements"]]
    assert names == ["split:H100x1", "split:H200x1", "split:best", "shared:H100x1", "shared:H200x1"]
    for p in d["pools"]:
        for h in p["hours"]:
            assert h["gpu_cost_usd"] == pytest.approx(h["gpu_hours"] * p["gpu_hour_usd"])
        assert p["gpu_hour_usd"] == (2.0 if p["hardware"] == "H100x1" else 9.0)
    best = _placement(d, "split:best")
    for pool in best["pools"]:
        w = pool.split("@")[0]
        assert _pool(d, pool)["cost_per_day_usd"] == min(_pool(d, f"{w}@{hw}")["cost_per_day_usd"]
                                                         for hw in ("H100x1", "H200x1"))


def test_a_placement_over_the_power_cap_is_not_chosen(tmp_path):
    path = _fleet(tmp_path, [{"name": "a", "spec": "a.yaml"}], {"a": _spec_dict()}, power_cap_mw=0.001)
    d = fleet_mix(load_fleet_file(path)).to_dict()
    assert d["placements"][0]["within_power_cap"] is False and d["cheapest_placement"] is None


# ---- the pooled session sample


def _sample(steps: float, seed: int, sessions: int) -> SessionSample:
    d = _spec_dict()
    d["workload"]["steps_per_task"] = {"mean": steps, "p95": 2 * steps}
    spec = spec_from_dict(d | {"seed": seed})
    return sample_sessions(spec, replica_from_spec(spec), sessions=sessions)


def test_every_session_sample_field_is_pooled_and_one_workload_pools_to_itself():
    s = _sample(10, 0, 300)
    m = mix_samples([s], [True])
    assert m.tasks == (slice(0, 300),) and m.calls == (slice(0, len(s.call_queue_exp)),)
    for f in dataclasses.fields(SessionSample):
        a, b = getattr(s, f.name), getattr(m.sample, f.name)
        assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == pytest.approx(b), f.name


def test_pooled_means_weigh_tasks_and_calls():
    short, long = _sample(5, 0, 400), _sample(40, 1, 100)
    mixed = mix_samples([short, long], [True, False])
    m = mixed.sample
    assert m.sessions == 500
    assert m.mean_calls == pytest.approx((short.calls.sum() + long.calls.sum()) / 500)
    rows = np.array([short.calls.sum(), long.calls.sum()])
    for name in PER_CALL_MEAN:
        assert getattr(m, name) == pytest.approx(np.dot(rows, [getattr(short, name), getattr(long, name)]) / rows.sum())
    dec = np.array([short.decode_iters.sum(), long.decode_iters.sum()])
    for name in PER_DECODE_MEAN:
        assert getattr(m, name) == pytest.approx(np.dot(dec, [getattr(short, name), getattr(long, name)]) / dec.sum())
    for name in PER_TASK:
        assert len(getattr(m, name)) == 500
    # the tail calls in proportion to calls; the second workload's system prompt is the first's (cached once)
    first, second = mixed.calls
    assert (first.stop - first.start) / len(m.call_queue_exp) == pytest.approx(rows[0] / rows.sum(), abs=1e-3)
    assert np.array_equal(m.call_prefill_tokens_sample[first], short.call_prefill_tokens_sample[:first.stop])
    assert np.array_equal(m.calls[mixed.tasks[1]], long.calls)
    assert m.shared_prefix_kv_bytes == short.shared_prefix_kv_bytes


def test_an_hours_mix_is_sampled_in_proportion_to_the_tasks_started():
    spec = spec_from_dict(_spec_dict())
    counts = mix_counts([300.0, 100.0, 0.0], [spec, spec, spec])
    assert counts[2] == 0 and counts[0] == pytest.approx(3 * counts[1], abs=1)
    tiny = mix_counts([1e6, 1.0], [spec, spec])
    assert tiny[1] >= 1


# ---- the fleet file: clear errors naming the file, line and field


def _error(path: Path) -> str:
    with pytest.raises(FleetFileError) as info:
        fleet_mix(load_fleet_file(path))
    return str(info.value)


def test_a_mistyped_key_is_named_with_its_line(tmp_path):
    path = tmp_path / "f.yaml"
    path.write_text("workloads:\n  - name: a\n    spec: a.yaml\n    overides: {}\n")
    msg = _error(path)
    assert f"{path}: invalid fleet file" in msg and "line 4: workloads.0.overides: unknown field" in msg


def test_a_missing_spec_file_is_named(tmp_path):
    path = _fleet(tmp_path, [{"name": "a", "spec": "nowhere.yaml"}], {})
    assert f"line 3: workloads.0.spec: {tmp_path / 'nowhere.yaml'}: file not found" in _error(path)


def test_a_spec_that_is_a_folder_is_called_one_not_missing(tmp_path):
    (tmp_path / "specs").mkdir()
    path = _fleet(tmp_path, [{"name": "a", "spec": "specs"}], {})
    msg = _error(path)
    assert f"line 3: workloads.0.spec: {tmp_path / 'specs'}: is a directory, not a file" in msg
    assert "not found" not in msg


def test_a_bad_override_is_named_in_the_fleet_file_and_a_bad_spec_in_its_own(tmp_path):
    path = tmp_path / "fleet.yaml"
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(_spec_dict()))
    bad = _spec_dict()
    bad["slo"]["task_latency_p95_s"] = -1
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad, sort_keys=False))
    path.write_text("workloads:\n  - name: a\n    spec: a.yaml\n    overrides:\n      fleet:\n"
                    "        headroom: -3\n  - name: b\n    spec: bad.yaml\n")
    msg = _error(path)
    assert "line 6: workloads.0.overrides.fleet.headroom: Input should be greater than or equal to 0" in msg
    line = (tmp_path / "bad.yaml").read_text().splitlines().index("  task_latency_p95_s: -1") + 1
    assert f"workloads.1 ({tmp_path / 'bad.yaml'}, line {line}): slo.task_latency_p95_s:" in msg


def test_overrides_the_hardware_list_would_replace_are_refused_with_their_lines(tmp_path):
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(_spec_dict()))
    path = tmp_path / "f.yaml"
    path.write_text("workloads:\n  - name: a\n    spec: a.yaml\n    overrides:\n      hardware: {gpu: B200}\n"
                    "      cost: {gpu_hour_usd: 9}\nhardware:\n  - {gpu: H100, gpus_per_replica: 1, gpu_hour_usd: 2}\n")
    msg = _error(path)
    assert "line 5: workloads.0.overrides.hardware: the fleet file's hardware list replaces" in msg
    assert "line 6: workloads.0.overrides.cost.gpu_hour_usd: the fleet file's hardware list replaces" in msg
    path.write_text("workloads:\n  - name: a\n    spec: a.yaml\n    overrides:\n      hardware: {gpu: B200}\n")
    assert load_fleet_file(path).specs[0].hardware.gpu == "B200"      # without a hardware list they apply


def test_fleet_file_rules_are_named(tmp_path):
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(_spec_dict()))
    cases = {
        "workloads: []\n": "workloads: List should have at least 1 item",
        "workloads:\n  - {name: a, spec: a.yaml}\n  - {name: a, spec: a.yaml}\n": "workload name a is given twice",
        "workloads:\n  - {name: a, spec: a.yaml}\nhardware:\n  - {gpu: H100, gpus_per_replica: 1}\n":
            "line 4: hardware.0.gpu_hour_usd: missing (required)",
        "workloads:\n  - {name: a, spec: a.yaml}\nhardware:\n  - {gpu: H1000, gpus_per_replica: 1, gpu_hour_usd: 2}\n":
            "line 4: hardware.0.gpu: unknown GPU 'H1000'",
        "workloads:\n  - {name: 'a+b', spec: a.yaml}\n": "workloads.0.name",
        # a name a spreadsheet reads as a formula in --csv (fuzzing, session 45), or that splits a column
        "workloads:\n  - {name: '=HYPERLINK(\"http://x\")', spec: a.yaml}\n": "may not start with '=' or '-'",
        "workloads:\n  - {name: \"a\\tb\", spec: a.yaml}\n": "a tab",
        "workloads:\n  - {name: a, spec: a.yaml}\nhardware:\n  - {name: 'x@y', gpu: H100, gpus_per_replica: 1, "
        "gpu_hour_usd: 2}\n": "a hardware candidate's name may not contain '+', '@'",
        "workloads:\n  - {name: a, spec: f.yaml}\n": "f.yaml is this fleet file itself",
    }
    d = _spec_dict(model={"config": "Qwen/Qwen2.5-7B"})
    (tmp_path / "q.yaml").write_text(yaml.safe_dump(d))
    cases["workloads:\n  - {name: q, spec: q.yaml}\n"] = "workloads.0 (" + str(tmp_path / "q.yaml") + \
        "): model.config: unknown model 'Qwen/Qwen2.5-7B'"
    for text, words in cases.items():
        path = tmp_path / "f.yaml"
        path.write_text(text)
        assert words in _error(path), text


def test_a_workload_without_a_day_of_demand_is_named(tmp_path):
    d = _spec_dict()
    del d["fleet"]
    path = _fleet(tmp_path, [{"name": "a", "spec": "a.yaml"}], {"a": d})
    assert "fleet.tasks_per_hour: missing; a mixed fleet needs each workload's day of demand" in _error(path)


# ---- the command line


APMW = str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "apmw")

TOP = {"fleet_file", "power_cap_mw", "workloads", "hardware", "hardware_source", "placements", "cheapest_placement",
       "pools"}
PLACEMENT = {"placement", "kind", "pools", "refused", "tasks_per_day", "peak_replicas", "peak_gpus",
             "coincident_peak_gpus", "peak_facility_mw", "peak_provisioned_mw", "replica_hours_per_day",
             "gpu_hours_per_day", "facility_mwh_per_day", "facility_mwh_per_month", "cost_per_day_usd",
             "cost_per_month_usd", "cost_per_task_usd", "secured_gpu_cost_per_month_usd", "api_cost_per_day_usd",
             "within_power_cap", "compared_with_split"}
POOL = {"name", "workloads", "hardware", "refused", "tasks_per_day", "peak_hour", "peak_replicas", "peak_gpus",
        "peak_facility_mw", "peak_provisioned_mw", "average_facility_mw", "gpu_hours_per_day", "facility_mwh_per_day",
        "facility_mwh_per_month", "cost_per_day_usd", "cost_per_month_usd", "cost_per_task_usd", "headroom",
        "min_replicas", "scale_up_s", "scale_down_delay_s", "gpus_per_replica", "gpu_hour_usd",
        "replica_hours_per_day", "agents_per_replica_max_at_peak", "binding_at_peak", "slo_at_peak", "hours"}
WORKLOAD = {"name", "spec", "model", "tasks_per_day", "peak_hour", "api_cost_per_task_usd", "slo"}


def run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "FORCE_COLOR"} | {"COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([APMW, *args], capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def cli_fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    return _fleet(tmp, [{"name": "a", "spec": "a.yaml"}, {"name": "b", "spec": "b.yaml"}],
                  {"a": _spec_dict(), "b": _spec_dict(LATER)})


@pytest.mark.slow
def test_json_field_names_are_stable(cli_fleet, tmp_path):
    r = run("fleet", str(cli_fleet), "--json", "--csv", str(tmp_path / "mix.csv"), "--parquet",
            str(tmp_path / "mix.parquet"))
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert set(d) == TOP
    assert all(set(w) == WORKLOAD for w in d["workloads"])
    for p in d["placements"]:
        assert set(p) == (PLACEMENT if p["refused"] is None else {"placement", "kind", "pools", "refused",
                                                                  "compared_with_split"})
    for p in d["pools"]:
        assert set(p) == POOL
        assert len(p["hours"]) == 24
    rows = (tmp_path / "mix.csv").read_text().splitlines()
    assert rows[0].split(",")[:4] == ["pool", "hardware", "hour", "agents_per_replica_max"]
    assert len(rows) == 1 + 24 * len(d["pools"])
    pq = pytest.importorskip("pyarrow.parquet")
    table = pq.read_table(tmp_path / "mix.parquet")
    assert table.column_names == rows[0].split(",") and table.num_rows == len(rows) - 1
    meta = json.loads(table.schema.metadata[b"apmw.fleet_mix"])
    assert meta["placements"] == d["placements"] and all("hours" not in p for p in meta["pools"])
    r = run("fleet", str(cli_fleet))
    assert r.returncode == 0 and "placements" in r.stdout and "shared:H100x1" in r.stdout
    assert "cheapest: " + d["cheapest_placement"] in r.stdout


@pytest.mark.slow
def test_cli_refuses_simulation_of_a_fleet_file_and_exits_2_when_nothing_serves(cli_fleet, tmp_path):
    r = run("fleet", str(cli_fleet), "--simulate")
    assert r.returncode == 1 and "not for a fleet file" in r.stderr
    path = _fleet(tmp_path, [{"name": "a", "spec": "a.yaml"}],
                  {"a": _spec_dict(slo={"task_latency_p95_s": 1})})
    r = run("fleet", str(path))
    assert r.returncode == 2 and "no placement serves every workload" in r.stderr
    (tmp_path / "typo.yaml").write_text("workloads:\n  - {name: a, spec: a.yaml, overides: {}}\n")
    r = run("fleet", str(tmp_path / "typo.yaml"))
    assert r.returncode == 1 and "typo.yaml: invalid fleet file" in r.stderr and "workloads.0.overides" in r.stderr


def test_the_bundled_fleet_file_loads():
    loaded = load_fleet_file(EXAMPLES / "fleets" / "mixed-fleet.yaml")
    assert loaded.names == ("coding-emea", "coding-apac", "research")
    emea, apac = (s.fleet.tasks_per_hour for s in loaded.specs[:2])
    assert int(np.argmax(emea)) == 11 and int(np.argmax(apac)) == 3
    assert math.isclose(sum(apac), sum(emea) / 2, rel_tol=1e-3)


@pytest.mark.slow
def test_the_bundled_mixed_fleet():
    d = fleet_mix(load_fleet_file(EXAMPLES / "fleets" / "mixed-fleet.yaml")).to_dict()
    assert "use different models" in _placement(d, "shared")["refused"]
    assert "does not fit" in _placement(d, "split:H200x1")["refused"]
    by_model = _placement(d, "by_model:H200x8")
    assert by_model["pools"] == ["coding-emea+coding-apac@H200x8", "research@H200x8"]
    assert by_model["compared_with_split"]["peak_gpus_saved"] > 0
    assert d["cheapest_placement"] is not None


def test_names_with_brackets_are_printed_as_written(tmp_path):
    """A workload named "[/]" was read as a closing markup tag by the tables (an internal error), and "b[x]" lost
    its "[x]" in them."""
    path = _fleet(tmp_path, [{"name": "[/]", "spec": "a.yaml"}, {"name": "b[x]", "spec": "a.yaml"}],
                  {"a": _spec_dict()})
    r = run("fleet", str(path))
    assert r.returncode == 0, r.stderr
    assert "[/]@H100x1" in r.stdout and "b[x]@H100x1" in r.stdout


def test_a_workload_cap_or_purchase_a_fleet_file_would_not_read_is_refused_where_it_is_written(tmp_path):
    """A workload's fleet.power_cap_mw and cost.capex were dropped in a fleet file: a placement over that cap was
    named the cheapest (fuzzing, session 43)."""
    capped = _spec_dict(fleet={"power_cap_mw": 0.0001})
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(_spec_dict()))
    (tmp_path / "capped.yaml").write_text(yaml.safe_dump(capped, sort_keys=False))
    path = tmp_path / "f.yaml"
    path.write_text("workloads:\n  - name: a\n    spec: a.yaml\n    overrides:\n      cost:\n"
                    "        capex: {usd_per_gpu: 30000, years: 4}\n  - name: b\n    spec: capped.yaml\n")
    msg = _error(path)
    assert "line 6: workloads.0.overrides.cost.capex: the owned-GPU month is priced for one spec only" in msg
    line = (tmp_path / "capped.yaml").read_text().splitlines().index("  power_cap_mw: 0.0001") + 1
    assert (f"workloads.1 ({tmp_path / 'capped.yaml'}, line {line}): fleet.power_cap_mw: a fleet file's workloads "
            "share one hall") in msg


def test_one_model_or_gpu_spelt_two_ways_is_one(tmp_path):
    """'meta-llama/meta-llama-3.1-8b' and 'Meta-Llama-3.1-8B' are the bundled Llama-3.1-8B: the workloads were
    refused a shared replica as 'different models', and 'h100' beside 'H100' doubled the own-hardware
    candidates (every placement priced twice). A listed candidate spelt twice is refused with its place."""
    a = _spec_dict(model={"config": "meta-llama/meta-llama-3.1-8b"})
    b = _spec_dict(LATER, model={"config": "Meta-Llama-3.1-8B"}, hardware={"gpu": "h100"})
    path = _fleet(tmp_path, [{"name": "a", "spec": "a.yaml"}, {"name": "b", "spec": "b.yaml"}], {"a": a, "b": b})
    d = fleet_mix(load_fleet_file(path)).to_dict()
    assert len(d["hardware"]) == 1
    assert _placement(d, "shared:H100x1").get("refused") is None
    listed = [{"gpu": "H100", "gpus_per_replica": 1, "gpu_hour_usd": 2.0},
              {"gpu": "h100_sxm", "gpus_per_replica": 1, "gpu_hour_usd": 2.0}]
    path = _fleet(tmp_path, [{"name": "a", "spec": "a.yaml"}], {"a": a}, hardware=listed)
    with pytest.raises(FleetFileError) as err:
        fleet_mix(load_fleet_file(path))
    assert "hardware.1" in str(err.value) and "the same hardware as hardware.0" in str(err.value)


def test_piped_tables_print_every_figure_whole(cli_fleet):
    """Into a pipe at the default 80 columns the placements table cut '$9,438' to '$9,4…' (fuzzing, session 44):
    a pipe has no width, so the tables print at the width they need."""
    r = subprocess.run([APMW, "fleet", str(cli_fleet)], capture_output=True, text=True, timeout=600,
                       env={k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR")})
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout
    d = json.loads(run("fleet", str(cli_fleet), "--json").stdout)
    for p in d["placements"]:
        if "cost_per_month_usd" in p:
            assert f"${p['cost_per_month_usd']:,.0f}" in r.stdout


def test_a_relative_model_config_is_read_beside_the_file_that_gives_it(tmp_path, monkeypatch):
    """A spec in another folder whose `model.config: cfg.json` sits beside it was read as the fleet's current
    folder's cfg.json (the 70B, refused: 'does not fit'; fuzzing, session 45). It is read beside the spec, and
    an override's beside the fleet file."""
    from apmw.catalog.models import load_config

    small, _ = load_config("meta-llama/Meta-Llama-3.1-8B")
    large, _ = load_config("meta-llama/Meta-Llama-3.1-70B")
    (tmp_path / "sub").mkdir()
    (tmp_path / "ff").mkdir()
    (tmp_path / "sub" / "cfg.json").write_text(json.dumps(small))
    (tmp_path / "cfg.json").write_text(json.dumps(large))
    (tmp_path / "ff" / "big.json").write_text(json.dumps(large))
    d = small_spec_dict()
    d["model"]["config"] = "cfg.json"
    d["fleet"] = {"tasks_per_hour": [10.0] * 24}
    (tmp_path / "sub" / "a.yaml").write_text(yaml.safe_dump(d))
    fleet = tmp_path / "ff" / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"workloads": [
        {"name": "a", "spec": "../sub/a.yaml"},
        {"name": "b", "spec": "../sub/a.yaml", "overrides": {"model": {"config": "big.json"}}}]}))
    monkeypatch.chdir(tmp_path)
    loaded = load_fleet_file(fleet)
    a, b = loaded.specs
    assert Path(a.model.config).resolve() == (tmp_path / "sub" / "cfg.json").resolve()
    assert Path(b.model.config).resolve() == (tmp_path / "ff" / "big.json").resolve()
    assert loaded.data[0]["model"]["config"] == a.model.config


def test_copies_of_one_workload_pooled_size_like_that_workload(tmp_path):
    """16 copies of support-chat on one shared pool sized at N* 3 and 48 replicas where the spec alone sizes at
    N* 20 (fuzzing, session 45): each copy's p95 was read off a sixteenth of the sample and the worst of 16 noisy
    p95s bound. Copies with the same workload and SLO are one population, read together."""
    d = yaml.safe_load((EXAMPLES / "support-chat.yaml").read_text())
    d["fleet"] = {"tasks_per_hour": [100.0] * 24}
    alone = plan(spec_from_dict(d)).agents_per_replica
    path = _fleet(tmp_path, [{"name": f"w{i}", "spec": "sc.yaml"} for i in range(16)], {"sc": d})
    out = fleet_mix(load_fleet_file(path)).to_dict()
    shared = next(p for p in out["pools"] if p["name"].count("+") == 15)
    assert shared["refused"] is None
    assert shared["agents_per_replica_max_at_peak"] >= 0.7 * alone
    rows = shared["slo_at_peak"]
    assert len({(r["task_latency_p95_s"], r["ttft_p95_s"]) for r in rows}) == 1     # one population, one p95


def test_a_fleet_file_that_is_not_readable_yaml_is_not_called_a_spec(tmp_path):
    """A fleet file with a Latin-1 byte was refused as "invalid spec" (fuzz round 5): which of the two kinds an
    unreadable file was meant to be is not known, so the error names both."""
    from tests.e2e.test_cli import APMW

    fleet = tmp_path / "fleet.yaml"
    fleet.write_bytes(b"# caf\xe9\nworkloads:\n  - name: a\n")
    r = subprocess.run([APMW, "fleet", str(fleet)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"{fleet}: invalid spec or fleet file" in r.stderr and "line 1: byte 0xe9 is not UTF-8" in r.stderr


@pytest.mark.parametrize("doubled,words", [
    ("workloads", "line 4: workloads.1.name: workload name a is given twice (entries 1 and 2)"),
    ("hardware", "line 8: hardware.1: hardware H200x8 is listed twice (entries 1 and 2)"),
])
def test_a_name_given_twice_in_a_fleet_file_is_named_at_its_line(tmp_path, doubled, words):
    """A name given twice was reported at '(top level)', with no line (fuzz round 5)."""
    spec = EXAMPLES / "coding-agent.yaml"
    second = "a" if doubled == "workloads" else "b"
    gpu = "H200" if doubled == "hardware" else "B200"
    path = tmp_path / "fleet.yaml"
    path.write_text(f"workloads:\n  - name: a\n    spec: {spec}\n  - name: {second}\n    spec: {spec}\nhardware:\n"
                    f"  - {{gpu: H200, gpus_per_replica: 8, gpu_hour_usd: 2}}\n"
                    f"  - {{gpu: {gpu}, gpus_per_replica: 8, gpu_hour_usd: 2}}\n")
    with pytest.raises(FleetFileError) as exc:
        load_fleet_file(path)
    assert words in " ".join(str(exc.value).split())


def test_one_hardware_priced_two_ways_by_its_workloads_is_refused(tmp_path):
    """Two workloads on H200x8 at $10 and $2.50 a GPU-hour: their shared pools were keyed by the name H200x8, so
    both shared rows were priced at $10, the $2.50 candidate never, and "cheapest" named the wrong placement
    (fuzz round 9)."""
    d = yaml.safe_load((EXAMPLES / "coding-agent.yaml").read_text())
    path = _fleet(tmp_path, [{"name": "a", "spec": "ca.yaml", "overrides": {"cost": {"gpu_hour_usd": 10}}},
                             {"name": "b", "spec": "ca.yaml"}], {"ca": d})
    with pytest.raises(FleetFileError) as err:
        fleet_mix(load_fleet_file(path))
    assert (f"its replica hardware, H200x8, is priced at cost.gpu_hour_usd {d['cost']['gpu_hour_usd']:g} where "
            "workloads.0 (a) pays 10") in str(err.value)
    # one GPU spelt two ways at one price is one hardware, not a clash
    from apmw.capacity.fleet_mix import _own_hardware_clashes

    path = _fleet(tmp_path, [{"name": "a", "spec": "ca.yaml",
                              "overrides": {"hardware": {"gpu": {"name": d["hardware"]["gpu"]}}}},
                             {"name": "b", "spec": "ca.yaml"}], {"ca": d})
    assert _own_hardware_clashes(load_fleet_file(path)) == []


def test_one_model_in_other_dtypes_is_refused_a_shared_pool_for_its_dtypes():
    """"a (deepseek-ai/DeepSeek-V3, fp8) and b (deepseek-ai/DeepSeek-V3, fp8) use different models": the KV dtype
    that differed was not named (fuzz round 9)."""
    from apmw.capacity.fleet_mix import share_refusal
    from apmw.spec import load_spec

    a = load_spec(EXAMPLES / "coding-agent.yaml")
    b = a.model_copy(update={"model": a.model.model_copy(update={"kv_dtype": "fp8"})})
    assert a.model.kv_dtype != "fp8"
    said = share_refusal([a, b], ["a", "b"])
    assert said is not None and f"differ in model.kv_dtype ({a.model.kv_dtype} and fp8)" in said
