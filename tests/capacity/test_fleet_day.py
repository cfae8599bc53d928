"""A day of demand to replicas, MW and dollars (apmw fleet): Little's law, the fewest replicas, the totals."""

from __future__ import annotations

import copy

import json
import math
import re
import subprocess
from pathlib import Path

import pytest

from apmw.capacity import plan
from apmw.capacity.closed_loop import ClosedLoopModel
from apmw.capacity.fleet_day import DAYS_PER_MONTH, _load, admission_cap, fleet_day
from apmw.errors import ApmwError
from apmw.spec import SpecError, spec_from_dict
from tests.conftest import EXAMPLES, small_spec_dict

DAY = [0, 50, 100, 400, 900, 1500, 2200, 3000, 3600, 4000, 4200, 4000,
       3800, 3500, 3000, 2600, 2000, 1500, 1000, 700, 400, 200, 100, 0]


def _spec(**fleet):
    d = small_spec_dict()
    d["fleet"] = {"tasks_per_hour": DAY, **fleet}
    return spec_from_dict(d)


@pytest.fixture(scope="module")
def day():
    result = plan(_spec(headroom=0.2, min_replicas=2))
    return result, fleet_day(result)


def test_each_hour_holds_littles_law(day):
    _, d = day
    for h in d.hours:
        if h.tasks:
            assert h.concurrent_agents == pytest.approx(h.tasks / 3600 * h.task_latency_mean_s, rel=1e-6)


def test_each_hour_has_the_fewest_replicas_that_keep_the_headroom(day):
    result, d = day
    model = ClosedLoopModel(result.spec, result.replica, result.sample)
    cap = d.agents_per_replica_admitted         # N*, or fewer where a replica at N* finishes fewer tasks
    assert cap <= result.agents_per_replica
    for h in d.hours:
        assert h.replicas >= 2
        if h.tasks:
            assert h.agents_per_replica * 1.2 <= cap + 1e-9
        if h.replicas > 2:
            fewer, _ = _load(model.evaluate, h.tasks / 3600, h.replicas - 1, cap,
                             model.evaluate(cap).task_latency_mean_s)
            assert fewer * 1.2 > cap


def test_the_day_adds_up(day):
    result, d = day
    out = d.to_dict()
    assert out["tasks_per_day"] == sum(DAY)
    assert out["cost_per_day_usd"] == pytest.approx(sum(h.gpu_cost_usd + h.electricity_cost_usd for h in d.hours))
    assert out["cost_per_month_usd"] == pytest.approx(out["cost_per_day_usd"] * 365.25 / 12)
    assert DAYS_PER_MONTH == pytest.approx(30.4375)
    assert out["facility_mwh_per_day"] == pytest.approx(sum(h.facility_power_w for h in d.hours) / 1e6)
    assert out["gpu_hours_per_day"] == pytest.approx(sum(h.gpus for h in d.hours))     # nothing warms: no scale_up_s
    peak = max(d.hours, key=lambda h: h.replicas)
    assert (out["peak_hour"], out["peak_replicas"]) == (peak.hour, peak.replicas)
    for h in d.hours:
        assert h.gpu_cost_usd == pytest.approx(h.gpus * result.spec.cost.gpu_hour_usd)


def test_a_quiet_hour_keeps_its_minimum_idle_and_none_costs_nothing(day):
    _, d = day
    quiet = d.hours[0]
    assert quiet.tasks == 0 and quiet.replicas == 2 and quiet.facility_power_w > 0
    none = fleet_day(plan(_spec(min_replicas=0))).hours[0]
    assert (none.replicas, none.facility_power_w, none.gpu_cost_usd) == (0, 0.0, 0.0)


def test_a_busier_hour_never_gets_fewer_replicas(day):
    _, d = day
    by_tasks = sorted(d.hours, key=lambda h: h.tasks)
    assert all(a.replicas <= b.replicas for a, b in zip(by_tasks, by_tasks[1:]))


@pytest.mark.parametrize("value,words", [
    # 23 values said "List should have at least 24 items after validation", 25 what to give (fuzzing, session 43)
    (DAY[:23], "23 values; give 24 .a day, hour 0 first. or 168"),
    (DAY + [1], "25 values; give 24"),
    (DAY * 8, "192 values; give 24"),
    (DAY[:23] + [-5], "tasks_per_hour.23: -5 tasks in hour 23"),
    (DAY[:23] + [1e12], "each hour needs 0 to 1,000,000,000 tasks"),
])
def test_a_bad_day_is_refused_by_field(value, words):
    with pytest.raises(SpecError, match=words):
        _spec(tasks_per_hour=value)


def test_a_spec_without_a_day_says_what_to_add():
    d = small_spec_dict()
    with pytest.raises(ApmwError, match="apmw fleet needs fleet.tasks_per_hour"):
        fleet_day(plan(spec_from_dict(d)))


def _fleet_cli(spec: Path, *flags: str) -> subprocess.CompletedProcess:
    """`apmw fleet SPEC FLAGS...` through the installed entry point."""
    from tests.e2e.test_cli import APMW

    return subprocess.run([APMW, "fleet", str(spec), *flags], capture_output=True, text=True, timeout=120)


def test_the_cli_writes_json_and_the_hours_as_csv(tmp_path):
    csv_path = tmp_path / "day.csv"
    r = _fleet_cli(EXAMPLES / "coding-agent.yaml", "--json", "--csv", str(csv_path))
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert len(d["hours"]) == 24 and d["tasks_per_day"] == 40_000
    assert math.isfinite(d["cost_per_task_usd"]) and d["peak_replicas"] >= 1
    lines = csv_path.read_text().splitlines()
    assert lines[0].startswith("hour,tasks,concurrent_agents") and len(lines) == 25
    r = _fleet_cli(EXAMPLES / "support-chat.yaml")
    assert r.returncode == 1 and "fleet.tasks_per_hour" in r.stderr
    # how the day would be simulated, given without --simulate, is refused rather than ignored
    r = _fleet_cli(EXAMPLES / "coding-agent.yaml", "--replications", "0", "--seed", "3")
    assert r.returncode == 1 and "--seed, --replications: apply only with --simulate" in r.stderr
    r = _fleet_cli(EXAMPLES / "coding-agent.yaml", "--simulate", "--workers", "2", "--ray", "auto")
    assert r.returncode == 1 and "--workers 2 and --ray auto both given" in " ".join(r.stderr.split())


def test_a_simulated_day_in_which_no_task_finishes_says_so(tmp_path):
    """A day of no tasks (fuzzing: exit 70 where the table formatted a missing latency) is simulated, and says
    that no latency was measured; a negative seed is refused naming the flag."""
    spec = tmp_path / "quiet.yaml"
    text = (EXAMPLES / "support-chat.yaml").read_text()
    spec.write_text(text.replace("fleet:\n", "fleet:\n  tasks_per_hour: [" + ", ".join(["0"] * 24) + "]\n", 1))
    r = _fleet_cli(spec, "--simulate")
    assert r.returncode == 0, r.stderr
    assert "none finished in the simulated day, so no task latency was measured" in " ".join(r.stdout.split())
    r = _fleet_cli(spec, "--simulate", "--seed", "-1")
    assert r.returncode == 1 and "Traceback" not in r.stderr and "'--seed'" in r.stderr
    # no upper bound let a run go on for hours (fuzzing): more days than 100, or more cells than replicas, refused
    r = _fleet_cli(spec, "--simulate", "--replications", "100000")
    assert r.returncode == 1 and "at most 100 days are simulated" in " ".join(r.stderr.split())
    r = _fleet_cli(spec, "--simulate", "--cells", "100000")
    assert r.returncode == 1 and "--cells 100000: the day's analytic peak is" in " ".join(r.stderr.split())


def test_the_cli_writes_the_hours_as_parquet_with_the_totals_in_its_metadata(tmp_path):
    import pyarrow.parquet as pq

    path = tmp_path / "day.parquet"
    r = _fleet_cli(EXAMPLES / "coding-agent.yaml", "--json", "--parquet", str(path))
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    table = pq.read_table(path)
    assert table.num_rows == 24 and table.column_names[:3] == ["hour", "tasks", "concurrent_agents"]
    assert table.to_pylist() == [{k: h[k] for k in table.column_names} for h in d["hours"]]
    assert str(table.schema.field("replicas").type) == "int64"
    totals = json.loads(table.schema.metadata[b"apmw.fleet_day"])
    assert totals["cost_per_month_usd"] == d["cost_per_month_usd"] and "hours" not in totals
    r = _fleet_cli(EXAMPLES / "coding-agent.yaml", "--parquet", str(tmp_path / "no" / "x"))
    assert r.returncode == 1 and "--parquet" in r.stderr and "does not exist" in r.stderr


def test_a_task_on_the_api_is_priced_from_its_own_tokens():
    d = small_spec_dict()
    d["fleet"] = {"tasks_per_hour": DAY}
    d["cost"]["api_usd_per_million_tokens"] = {"input": 1.0, "cached_input": 0.1, "output": 4.0}
    result = plan(spec_from_dict(d))
    t = result.tokens_per_task
    api = float(result.sample.api_prefill_tokens.mean())        # each call's new tokens (the rest cached)
    expected = (api * 1.0 + (t["input"] - api) * 0.1 + t["output"] * 4.0) / 1e6
    assert result.to_dict()["api_cost_per_session_usd"] == pytest.approx(expected)
    day = fleet_day(result).to_dict()
    assert day["api_cost_per_task_usd"] == pytest.approx(expected)
    assert day["api_cost_per_day_usd"] == pytest.approx(expected * sum(DAY))
    d["cost"]["api_usd_per_million_tokens"] = {"input": 1.0, "output": 4.0}      # no cache discount
    uncached = plan(spec_from_dict(d)).to_dict()["api_cost_per_session_usd"]
    assert uncached == pytest.approx((t["input"] * 1.0 + t["output"] * 4.0) / 1e6)
    assert plan(_spec()).to_dict()["api_cost_per_session_usd"] is None


def test_the_api_bill_does_not_depend_on_how_the_replica_is_served():
    """An API with a context cache computes each call's new tokens and serves the system prompt and the session's
    history from its cache. The bill followed the self-hosted replica's own cache instead: random routing over
    100 replicas took the coding agent's from $0.156 to $0.372 a task. By hand: 10 calls of 300 new tokens and
    150 output after a 1,000-token system prompt; call i's prompt is 1,000 + 300 i + 150 (i - 1)."""
    d = small_spec_dict()
    d["workload"].update(steps_per_task=10, new_input_tokens_per_call=300, output_tokens_per_call=150)
    d["cost"]["api_usd_per_million_tokens"] = {"input": 1.0, "cached_input": 0.1, "output": 4.0}
    prompts = sum(1000 + 300 * i + 150 * (i - 1) for i in range(1, 11))
    expected = (3000 * 1.0 + (prompts - 3000) * 0.1 + 1500 * 4.0) / 1e6
    bills = []
    for serving in ({}, {"tool_wait_kv_policy": "evict"}, {"prefix_caching": False},
                    {"max_batch": 8}):
        v = copy.deepcopy(d)
        v["serving"].update(serving)
        bills.append(plan(spec_from_dict(v)).to_dict()["api_cost_per_session_usd"])
    v = copy.deepcopy(d)
    v["fleet"] = {"routing": "random", "routing_replicas": 100}
    bills.append(plan(spec_from_dict(v)).to_dict()["api_cost_per_session_usd"])
    assert bills == pytest.approx([expected] * len(bills), rel=1e-9)


def test_a_power_cap_names_the_hours_over_it_and_the_fleet_that_fits():
    cap_mw = fleet_day(plan(_spec())).to_dict()["peak_provisioned_mw"] / 2
    result = plan(_spec(power_cap_mw=cap_mw))
    d = fleet_day(result).to_dict()
    per_replica = result.economics.provisioned_power_w
    over = [h["hour"] for h in d["hours"] if h["provisioned_power_w"] > cap_mw * 1e6]
    assert over and d["hours_over_power_cap"] == over
    fits = d["within_power_cap"]
    assert fits["replicas"] == int(cap_mw * 1e6 // per_replica)
    headroom = result.spec.fleet.headroom
    assert fits["concurrent_agents"] == pytest.approx(fits["replicas"] * result.agents_per_replica / (1 + headroom))
    assert fits["tasks_per_hour"] == pytest.approx(fits["concurrent_agents"] / result.at.task_latency_mean_s * 3600)
    roomy = fleet_day(plan(_spec(power_cap_mw=1e3))).to_dict()
    assert roomy["hours_over_power_cap"] == []


@pytest.mark.parametrize("headroom", [0.0, 0.1, 0.3])
def test_the_demand_a_power_cap_is_said_to_hold_is_sized_inside_it(headroom):
    per_replica = plan(_spec()).economics.provisioned_power_w
    cap_mw = 3.5 * per_replica / 1e6                  # three replicas fit
    fits = fleet_day(plan(_spec(power_cap_mw=cap_mw, headroom=headroom))).within_power_cap()
    assert fits["replicas"] == 3
    flat = fleet_day(plan(_spec(power_cap_mw=cap_mw, headroom=headroom,
                                tasks_per_hour=[math.floor(fits["tasks_per_hour"])] * 24)))
    assert flat.hours_over_power_cap == []
    assert max(h.replicas for h in flat.hours) == 3


def test_the_cli_exits_2_when_the_fleet_does_not_fit_its_hall(tmp_path):
    text = (EXAMPLES / "coding-agent.yaml").read_text().replace("  headroom: 0.1\n",
                                                               "  headroom: 0.1\n  power_cap_mw: 0.3\n")
    spec = tmp_path / "hall.yaml"
    spec.write_text(text)
    r = _fleet_cli(spec, "--json")
    assert r.returncode == 2
    d = json.loads(r.stdout)
    over = [h["hour"] for h in d["hours"] if h["provisioned_power_w"] > 0.3e6]
    assert over and d["hours_over_power_cap"] == over
    assert (f"does not fit fleet.power_cap_mw 0.3 MW in hour(s) {', '.join(map(str, over))}"
            in " ".join(r.stderr.split()))


def test_scaling_ahead_and_holding_back_cost_what_they_keep_up():
    busy = [20 * x for x in DAY]
    base = fleet_day(plan(_spec(tasks_per_hour=busy))).hours
    result = plan(_spec(tasks_per_hour=busy, scale_up_s=1800, scale_down_delay_s=7200))
    held = fleet_day(result).hours
    needed = [h.replicas_needed for h in held]
    assert needed == [h.replicas for h in base]            # the demand's own sizing is unchanged
    for h in range(24):
        # up: the most any of this and the two hours before needed (the day repeats)
        assert held[h].replicas == max(needed[(h - j) % 24] for j in range(3))
        warming = max(held[(h + 1) % 24].replicas - held[h].replicas, 0)
        assert held[h].replicas_warming == warming
        gpus = result.replica.gpus
        assert held[h].gpu_hours == pytest.approx((held[h].replicas + 0.5 * warming) * gpus)
        assert held[h].gpu_cost_usd == pytest.approx(held[h].gpu_hours * result.spec.cost.gpu_hour_usd)
    assert max(needed) > 3 and sum(h.gpu_hours for h in held) > sum(h.gpu_hours for h in base)


def _with_cost(cost: dict) -> dict:
    d = small_spec_dict()
    d["fleet"] = {"tasks_per_hour": DAY}
    d["cost"] = {"electricity_usd_per_kwh": d["cost"]["electricity_usd_per_kwh"], **cost}
    return d


def test_capex_alone_prices_a_gpu_hour_as_its_amortised_purchase():
    spec = spec_from_dict(_with_cost({"capex": {"usd_per_gpu": 35_064.0, "years": 4}}))
    assert spec.cost.gpu_hour_usd == pytest.approx(35_064.0 / (4 * 8766))      # $1.00 an hour
    per_system = spec_from_dict(_with_cost({"capex": {"usd_per_system": 8 * 35_064.0, "gpus_per_system": 8,
                                                      "years": 4}}))
    assert per_system.cost.gpu_hour_usd == pytest.approx(spec.cost.gpu_hour_usd)


@pytest.mark.parametrize("cost, words", [
    ({}, "give gpu_hour_usd"),
    ({"capex": {"usd_per_gpu": 1.0, "usd_per_system": 8.0, "years": 4}}, "not both"),
    ({"capex": {"usd_per_system": 8.0, "years": 4}}, "go together"),
    ({"capex": {"usd_per_gpu": 1.0, "years": 0}}, "years"),
    # under a month is a unit slip: priced, it made a GPU-hour cost $3.4 million
    ({"capex": {"usd_per_gpu": 30_000.0, "years": 1e-6}}, r"cost.capex.years: 1e-06 years is under a month"),
])
def test_a_bad_cost_is_refused_by_field(cost, words):
    with pytest.raises(SpecError, match=words) as err:
        spec_from_dict(_with_cost(cost))
    if "capex" in cost:         # only capex's own error: no hourly price is missing beside a capex given wrong
        assert "gpu_hour_usd" not in str(err.value)


def test_the_owned_fleet_buys_the_most_gpus_any_hour_has_up_and_pays_the_same_electricity():
    billed = fleet_day(plan(spec_from_dict(_with_cost({"gpu_hour_usd": 2.5}))), compare_routing=False).to_dict()
    assert billed["owned"] is None
    spec = spec_from_dict(_with_cost({"gpu_hour_usd": 2.5, "capex": {"usd_per_gpu": 30_000.0, "years": 3}}))
    d = fleet_day(plan(spec), compare_routing=False).to_dict()
    o = d["owned"]
    assert o["gpus"] == max((h["replicas"] + h["replicas_warming"]) * h["gpus"] / max(h["replicas"], 1)
                            for h in d["hours"]) == d["peak_gpus"]
    assert o["capex_per_month_usd"] == pytest.approx(o["gpus"] * 30_000.0 / 36)
    electricity = sum(h["electricity_cost_usd"] for h in d["hours"]) * DAYS_PER_MONTH
    assert o["cost_per_month_usd"] == pytest.approx(o["capex_per_month_usd"] + electricity)
    assert o["cost_per_task_usd"] == pytest.approx(o["cost_per_month_usd"] / (d["tasks_per_day"] * DAYS_PER_MONTH))
    # the billed month is unchanged by the capex beside it
    assert d["cost_per_month_usd"] == pytest.approx(billed["cost_per_month_usd"])


def test_a_week_of_the_same_day_prices_as_the_day():
    day = fleet_day(plan(_spec()), compare_routing=False).to_dict()
    week = fleet_day(plan(spec_from_dict({**small_spec_dict(), "fleet": {"tasks_per_hour": DAY * 7}})),
                     compare_routing=False).to_dict()
    assert (day["period_hours"], week["period_hours"], len(week["hours"])) == (24, 168, 168)
    for key in ("tasks_per_day", "gpu_hours_per_day", "facility_mwh_per_day", "cost_per_day_usd", "cost_per_month_usd",
                "average_facility_mw", "peak_gpus"):
        assert week[key] == pytest.approx(day[key]), key
    assert (day["peak_hour_label"], week["peak_hour_label"]) == (f"{day['peak_hour']:02d}", f"Mon {day['peak_hour']:02d}")


def test_a_quieter_weekend_lowers_the_average_day_not_the_peak():
    weekend = [x * 0.25 for x in DAY]
    week = fleet_day(plan(spec_from_dict({**small_spec_dict(), "fleet": {"tasks_per_hour": DAY * 5 + weekend * 2}})),
                     compare_routing=False).to_dict()
    day = fleet_day(plan(_spec()), compare_routing=False).to_dict()
    assert week["tasks_per_day"] == pytest.approx(sum(DAY) * (5 + 2 * 0.25) / 7)
    assert week["peak_gpus"] == day["peak_gpus"] and week["cost_per_day_usd"] < day["cost_per_day_usd"]
    assert [h["hour"] for h in week["hours"]] == list(range(168))


@pytest.mark.parametrize("n", [23, 48, 169])
def test_a_profile_neither_a_day_nor_a_week_is_refused(n):
    with pytest.raises(SpecError, match="tasks_per_hour"):
        spec_from_dict({**small_spec_dict(), "fleet": {"tasks_per_hour": [1.0] * n}})


def test_the_week_is_drawn_with_a_tick_a_day():
    from apmw.report.charts import fleet_day_curves

    week = fleet_day(plan(spec_from_dict({**small_spec_dict(), "fleet": {"tasks_per_hour": DAY * 7}})),
                     compare_routing=False).to_dict()
    svg = fleet_day_curves(week["hours"])
    assert "hour of the week" in svg and all(d in svg for d in ("Mon", "Thu", "Sun"))


def test_a_week_is_not_simulated_but_says_why(tmp_path):
    import yaml

    path = tmp_path / "week.yaml"
    path.write_text(yaml.safe_dump({**small_spec_dict(), "fleet": {"tasks_per_hour": DAY * 7}}))
    r = _fleet_cli(path, "--simulate")
    assert r.returncode == 1 and "simulates one day" in r.stderr and "168 values" in r.stderr


def test_the_replicas_an_hour_needs_are_the_first_count_that_fits_found_by_bisection():
    from apmw.capacity.fleet_day import smallest_fitting

    for threshold in range(1, 40):
        asked: list[int] = []

        def fits(r: int) -> bool:
            asked.append(r)
            return r >= threshold

        assert smallest_fitting(fits, 1, 40) == threshold
        assert len(asked) <= 7                            # log2(40) + 1, not a scan
    assert smallest_fitting(lambda r: False, 5, 5) == 5    # low meets high: as the scan it replaces
    assert smallest_fitting(lambda r: False, 9, 5) == 9


def test_a_day_of_a_billion_tasks_an_hour_is_sized_in_moments():
    result = plan(_spec(tasks_per_hour=[1e9] * 24, headroom=0.0))
    hours = fleet_day(result, compare_routing=False).hours
    assert hours[0].replicas >= 1e9 / 3600 * result.search.single_agent.task_latency_mean_s / result.agents_per_replica


def test_replicas_that_start_at_once_are_never_shown_warming():
    instant = fleet_day(plan(_spec(tasks_per_hour=DAY, min_replicas=0)), compare_routing=False)
    assert [h.replicas_warming for h in instant.hours] == [0] * 24
    ahead = fleet_day(plan(_spec(tasks_per_hour=DAY, min_replicas=0, scale_up_s=600)), compare_routing=False)
    assert any(h.replicas_warming for h in ahead.hours)
    assert instant.owned() is None or instant.owned()["gpus"] == max(h.gpus for h in instant.hours)


def test_a_replica_is_given_no_more_agents_than_finish_the_most_tasks():
    """Near a full KV pool the mean task time can grow faster than the agents: the bundled coding agent finishes
    153.9 tasks an hour at 24 agents and 139.1 at its N* of 27. A fleet is given the count where that peaks, not N*;
    a curve still rising at N* keeps N*."""
    def peaked(c: int) -> float:        # tasks a second c / R(c) peak at 6 of N* 9
        return c / (1.0 + c / 10.0 + (0.5 * (c - 6) ** 2 if c > 6 else 0.0))

    assert admission_cap(lambda c: c / peaked(c), 9) == 6
    assert admission_cap(lambda c: 1.0 + c / 10.0, 9) == 9
    assert admission_cap(lambda c: 1.0, 1) == 1


def test_a_looser_slo_never_needs_more_replicas():
    """The coding agent's day took 30 replicas at its peak under a 1,800 s SLO (N* 27) and 27 under 1,200 s (N* 25):
    replicas allowed up to N* settle where a full KV pool slows every task (fuzzing, session 43)."""
    import yaml

    base = yaml.safe_load((EXAMPLES / "coding-agent.yaml").read_text())
    peaks = []
    for slo in (900, 1200, 1800):
        base["slo"]["task_latency_p95_s"] = slo
        d = fleet_day(plan(spec_from_dict(base)))
        peaks.append(max(h.replicas for h in d.hours))
    assert peaks == sorted(peaks, reverse=True), peaks


@pytest.mark.parametrize("extra,advice", [
    # a cap below one replica was told "or at most 0 tasks per hour", which did not fit either (fuzzing, session 43)
    ("  power_cap_mw: 0.001\n", r"a cap of [\d.]+ MW \(the cap holds no replica: one needs 0\.013 MW provisioned\), or"),
    ("  power_cap_mw: 0.04\n  min_replicas: 5\n", r"or fleet\.min_replicas of at most 3 \(it is 5\), or"),
])
def test_a_cap_the_kept_replicas_do_not_fit_says_what_would(tmp_path, extra, advice):
    text = (EXAMPLES / "coding-agent.yaml").read_text().replace("  headroom: 0.1\n", "  headroom: 0.1\n" + extra)
    spec = tmp_path / "hall.yaml"
    spec.write_text(text)
    r = _fleet_cli(spec)
    assert r.returncode == 2 and re.search(advice, " ".join(r.stderr.split())), r.stderr
    assert "tasks per hour" not in r.stderr.split("Needed:")[-1]


def test_a_day_of_fewer_than_one_task_is_not_printed_as_zero_tasks():
    """`--replicas-scale 1e-12` printed 'day: 0 tasks ... $12,181,609,289.68 per task' (fuzzing, session 45): the
    count of tasks the per-task cost divides by is shown as it is."""
    from apmw.cli.fleet import _count

    assert _count(4e-08) == "4e-08" and _count(0.4) == "0.4" and _count(12.5) == "12.5"
    assert _count(40_000) == "40,000" and _count(0) == "0"


def test_a_disaggregated_fleet_comes_in_whole_deployments_of_whole_gpus():
    """Two 8-GPU prefill workers shared by three decode workers: a replica is one decode worker and a third of the
    prefill workers' GPUs (16 / 3), so replicas come up three at a time and every count of GPUs is whole (fuzz
    round 8: "385 replicas, 5,133.333333333333 GPUs", hours of 53.33 GPUs paid by the GPU-hour)."""
    import yaml

    d = yaml.safe_load((EXAMPLES / "coding-agent.yaml").read_text())
    d["serving"]["disaggregation"] = {"prefill_gpus": 8, "prefill_workers": 2, "decode_workers": 3}
    p = plan(spec_from_dict(d))
    assert p.prefill_gpus == pytest.approx(16 / 3)
    fleet = p.to_dict()["fleet"]
    assert fleet["replicas"] % 3 == 0 and fleet["gpus"] == fleet["replicas"] // 3 * (3 * 8 + 2 * 8)
    assert isinstance(fleet["gpus"], int)
    day = fleet_day(p).to_dict()
    assert all(h["replicas"] % 3 == 0 and h["replicas_needed"] % 3 == 0 for h in day["hours"])
    assert all(h["gpus"] == h["replicas"] // 3 * 40 for h in day["hours"])
    assert day["peak_gpus"] == max(h["gpus"] + h["replicas_warming"] // 3 * 40 for h in day["hours"])
    from apmw.capacity.economics import replicas_per_deployment     # 2 prefill and 4 decode workers: 2 and one
    d["serving"]["disaggregation"] = {"prefill_gpus": 8, "prefill_workers": 2, "decode_workers": 4}
    assert replicas_per_deployment(spec_from_dict(d)) == 2


def test_a_disaggregated_day_is_not_simulated_without_its_prefill_workers(tmp_path):
    """The simulator does not model disaggregated prefill; `apmw fleet --simulate` ran such a day anyway, prefill on
    the replicas (a wrong answer, found reviewing session 57's whole deployments)."""
    import yaml

    d = yaml.safe_load((EXAMPLES / "coding-agent.yaml").read_text())
    d["serving"]["disaggregation"] = {"prefill_gpus": 8, "prefill_workers": 2, "decode_workers": 3}
    spec = tmp_path / "disagg.yaml"
    spec.write_text(yaml.safe_dump(d))
    r = _fleet_cli(spec, "--simulate")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "--simulate: the simulator does not model disaggregated prefill" in " ".join(r.stderr.split())
