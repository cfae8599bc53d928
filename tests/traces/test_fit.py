"""The fitter: distributions the spec accepts, the mini-swe-agent README figures, and `apmw plan` on the fit."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from apmw.capacity import plan
from apmw.spec import parse_distribution, spec_from_dict
from apmw.traces import TraceError, fit_trace, workload_from_trace
from apmw.traces.fit import FORMS, fit_distribution
from tests.conftest import EXAMPLES
from tests.traces.conftest import FIXTURES, SHARED

MINI_SWE = SHARED / "mini_swe_agent_deepseek" / "calls.csv"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1, max_size=200),
       st.sampled_from(FORMS))
def test_every_fit_is_a_distribution_the_spec_accepts(values, form):
    parse_distribution(fit_distribution(np.array(values), form))


def test_lognormal_fit_keeps_mean_and_p95():
    rng = np.random.default_rng(7)
    x = rng.lognormal(5.0, 0.6, 20000)
    d = fit_distribution(x, "auto")
    assert set(d) == {"mean", "p95"}
    assert d["mean"] == pytest.approx(x.mean(), abs=0.1)


def test_heavy_tail_falls_back_to_quantiles():
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.lognormal(-1.4, 0.4, 9800), rng.uniform(20, 60, 200)])  # 2% minute-long outliers
    d = fit_distribution(x, "auto", seconds=True)
    assert "quantiles" in d
    assert d["quantiles"][0.99] == pytest.approx(np.quantile(x, 0.99), rel=1e-3)


def test_fitted_section_validates_inside_a_full_spec_and_plans(example_dict):
    r = fit_trace(FIXTURES / "mini_swe_calls_3sessions.csv")
    spec = example_dict("coding-agent")
    spec["workload"] = yaml.safe_load(r.workload_yaml())["workload"]
    result = plan(spec_from_dict(spec))
    assert result.agents_per_replica >= 1


def test_workload_from_trace_is_the_fit():
    w = workload_from_trace(FIXTURES / "otel_genai.jsonl")
    assert w.system_prompt_tokens == 1200
    assert w.steps_per_task.mean == pytest.approx(3.0)


@pytest.mark.skipif(not MINI_SWE.exists(), reason="needs ../shared/data (the full mini-swe-agent trace)")
def test_mini_swe_agent_readme_figures():
    r = fit_trace(MINI_SWE)
    s = r.summary
    # ../shared/data/README.md: 192 sessions, 15,415 calls, mean 80.3 calls per session, prompt p50 19,214,
    # output mean 221, 98.1 % of prompt tokens from the provider's prefix cache
    assert (s["sessions"], s["calls"]) == (192, 15415)
    assert round(s["calls_per_session"]["mean"], 1) == 80.3
    assert s["input_tokens_per_call"]["p50"] == 19214
    assert round(s["output_tokens_per_call"]["mean"]) == 221
    assert round(s["cached_prompt_share"] * 100, 1) == 98.1
    # and the lead's hand fit in examples/coding-agent.yaml
    hand = yaml.safe_load((EXAMPLES / "coding-agent.yaml").read_text())["workload"]
    w = r.workload_section
    assert w["system_prompt_tokens"] == hand["system_prompt_tokens"] == 1390
    assert w["new_input_tokens_per_call"] == {"mean": 226.0, "p95": pytest.approx(780, abs=1)}
    assert w["steps_per_task"] == {"mean": 80.3, "p95": pytest.approx(134, abs=1)}
    for q, v in hand["tool_wait_s"]["quantiles"].items():
        assert w["tool_wait_s"]["quantiles"][q] == pytest.approx(v, abs=0.002)


@pytest.mark.skipif(not (SHARED / "mooncake").exists(), reason="needs ../shared/data (the Mooncake traces)")
def test_mooncake_readme_figures():
    # ../shared/data/README.md: infinite-cache prefix hit ratio 0.374 (conversation) and 0.651 (synthetic);
    # conversation sessions inferred from hash_ids: 8,056, mean 1.5 calls, p95 3, max 43
    conv = fit_trace(SHARED / "mooncake" / "conversation_trace.jsonl").summary
    assert round(conv["cached_prompt_share"], 3) == 0.374
    assert conv["sessions"] == 8056
    assert round(conv["calls_per_session"]["mean"], 1) == 1.5
    assert (conv["calls_per_session"]["p95"], conv["calls_per_session"]["max"]) == (3, 43)
    assert conv["system_prompt_tokens"] == 512   # block 0, shared by every request
    syn = fit_trace(SHARED / "mooncake" / "synthetic_trace.jsonl").summary
    assert round(syn["cached_prompt_share"], 3) == 0.651
    assert syn["system_prompt_tokens"] == 0      # built from public datasets: no common first block


@pytest.mark.skipif(not (SHARED / "azure_llm_2023").exists(), reason="needs ../shared/data (the Azure traces)")
def test_azure_readme_figures():
    # ../shared/data/README.md: conv 19,366 requests, input mean 1,155 p50 1,020 p95 4,083; output mean 211
    s = fit_trace(SHARED / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv").summary
    assert s["calls"] == 19366 and s["sessions"] == 19366
    assert round(s["input_tokens_per_call"]["mean"]) == 1155
    assert (s["input_tokens_per_call"]["p50"], s["input_tokens_per_call"]["p95"]) == (1020, 4083)
    assert round(s["output_tokens_per_call"]["mean"]) == 211


def _two_days(tmp_path, days: float = 2.0):
    t0 = 1_700_000_000 - (1_700_000_000 % 86400)     # a UTC midnight
    rows = ["sid,inp,out,t0"]
    k = 0
    for day in range(int(days)):
        for h in range(24):
            n = 2 if h < 8 else 10
            for i in range(n):
                start = t0 + day * 86400 + h * 3600 + (i + 0.5) * 3600 / n
                rows += [f"s{k},{1000 + 100 * c},50,{(start + 10 * c) * 1000:.0f}" for c in range(3)]
                k += 1
    path = tmp_path / "days.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


MAP = "session=sid,input_tokens=inp,output_tokens=out,start_ms=t0"


def test_a_day_of_demand_is_fitted_from_wall_clock_task_starts(tmp_path):
    result = fit_trace(_two_days(tmp_path), "csv", mapping=MAP)
    rates = result.summary["tasks_per_hour"]
    assert len(rates) == 24
    # the first and last hours are covered from the first start and up to the last one only
    assert rates[1:8] == [2.0] * 7 and rates[8:23] == [10.0] * 15
    assert rates[0] == pytest.approx(2.0, rel=0.2) and rates[23] == pytest.approx(10.0, rel=0.05)
    text = result.workload_yaml()
    assert "fleet:\n  tasks_per_hour: [" in text
    assert yaml.safe_load(text)["fleet"]["tasks_per_hour"] == rates


def test_no_day_of_demand_from_a_short_or_relative_trace():
    from tests.traces.conftest import FIXTURES

    short = fit_trace(FIXTURES / "otel_genai.jsonl")
    assert short.summary["tasks_per_hour"] is None
    assert any("needs a trace of at least 24 h" in n for n in short.summary["notes"])
    relative = fit_trace(FIXTURES / "mooncake_conversation_head200.jsonl")
    assert relative.summary["tasks_per_hour"] is None


def _eight_days(tmp_path):
    """Eight days from a Monday 00:00 UTC: 4 tasks an hour on weekdays, 1 on weekends."""
    t0 = 1_700_438_400         # 2023-11-20 00:00 UTC, a Monday
    rows = ["sid,inp,out,t0"]
    k = 0
    for day in range(8):
        n = 1 if day % 7 >= 5 else 4
        for h in range(24):
            for i in range(n):
                start = t0 + day * 86400 + h * 3600 + (i + 0.5) * 3600 / n
                rows += [f"s{k},{1000 + 100 * c},50,{(start + 10 * c) * 1000:.0f}" for c in range(2)]
                k += 1
    path = tmp_path / "week.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def test_a_week_of_demand_starts_on_monday(tmp_path):
    rates = fit_trace(_eight_days(tmp_path), "csv", mapping=MAP, weekly=True).summary["tasks_per_hour"]
    assert len(rates) == 168
    assert rates[24:120] == [4.0] * 96 and rates[120:167] == [1.0] * 47     # Tuesday to Friday; the weekend
    assert rates[0] == pytest.approx(4.0, rel=0.2)       # Monday 00:00, covered twice (the first and eighth day)
    daily = fit_trace(_eight_days(tmp_path), "csv", mapping=MAP).summary["tasks_per_hour"]
    assert len(daily) == 24 and daily[5] == pytest.approx((6 * 4 + 2 * 1) / 8, rel=0.02)


@settings(max_examples=300, deadline=None)
@given(st.floats(1.0e9, 1.8e9), st.floats(0, 4.0e6), st.sampled_from([24, 168]))
def test_the_seconds_a_trace_covers_each_hour_are_counted_in_closed_form(lo, span, period_h):
    """The same seconds per hour of the period as a loop over every hour of the span (which took minutes on a start
    time in ns read as s: fuzzing, session 42)."""
    from apmw.traces.fit import EPOCH_HOURS_AFTER_MONDAY, seconds_covered

    hi = lo + span
    looped = np.zeros(period_h)
    for h in range(int(lo // 3600), int(hi // 3600) + 1):
        looped[(h + EPOCH_HOURS_AFTER_MONDAY) % period_h] += min(hi, (h + 1) * 3600.0) - max(lo, h * 3600.0)
    assert np.allclose(seconds_covered(lo, hi, period_h), looped, rtol=0, atol=1e-4)


def test_a_time_past_2262_is_a_time_in_another_unit(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("sid,inp,out,t0\na,100,10,1700000000\nb,100,10,1700000000000\n")
    summary = fit_trace(path, "csv", mapping=MAP.replace("start_ms", "start_s")).summary
    assert summary["calls"] == 1
    reason, = summary["skipped"]
    assert "past the year 2262 as Unix seconds" in reason and "start_ms" in reason


def test_no_week_from_two_days(tmp_path):
    """Asked for by name (--weekly), a week the trace cannot give is an error; the day's profile stays a note."""
    with pytest.raises(TraceError, match="--weekly: task starts cover .* needs a trace of at least 168 h"):
        fit_trace(_two_days(tmp_path), "csv", mapping=MAP, weekly=True)
    assert fit_trace(_two_days(tmp_path), "csv", mapping=MAP).summary["tasks_per_hour"] is not None


def test_the_first_and_last_hours_are_not_overcounted(tmp_path):
    """One task an hour, each at half past, for 48 h read 1.33 in the first and last hours: the window's edges are
    the first and last starts themselves (fuzzing, session 44). By hand: 1.0 every hour."""
    t0 = 1_767_225_600                  # 2026-01-01 00:00 UTC
    rows = ["sid,inp,out,t0"] + [f"s{h},1000,50,{(t0 + h * 3600 + 1800) * 1000}" for h in range(48)]
    path = tmp_path / "hourly.csv"
    path.write_text("\n".join(rows) + "\n")
    assert fit_trace(path, "csv", mapping=MAP).summary["tasks_per_hour"] == [1.0] * 24


def test_a_few_tasks_over_months_are_not_read_as_no_demand(tmp_path):
    """Three tasks 1,000 days apart, each at 12:30 UTC, gave 24 hours of 0.0 (two decimals): a fleet of no demand
    (fuzzing, session 53). By hand: 3 starts over the 2,000 days between the first and the last, plus half a gap at
    each end (1,000 days), 3 / (3,000 x 1 h) = 0.001 an hour; the hours with no start stay 0."""
    t0 = 1_767_270_600                  # 2026-01-01 12:30 UTC
    rows = ["sid,inp,out,t0"] + [f"s{k},1000,50,{(t0 + k * 1000 * 86400) * 1000}" for k in range(3)]
    path = tmp_path / "sparse.csv"
    path.write_text("\n".join(rows) + "\n")
    rates = fit_trace(path, "csv", mapping=MAP).summary["tasks_per_hour"]
    assert rates[12] == pytest.approx(0.001, rel=0.02) and rates[:12] + rates[13:] == [0.0] * 23


def test_a_trace_without_sessions_gives_its_calls_per_hour_as_tasks(tmp_path):
    """An Azure trace of 26 h gave tasks_per_hour null and no note, though each call is its own task in the fitted
    workload (fuzzing, session 44): a call every 7.5 minutes is 8 tasks an hour."""
    import datetime

    t0 = datetime.datetime(2023, 11, 16)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"] + [
        (t0 + datetime.timedelta(seconds=450 * i)).strftime("%Y-%m-%d %H:%M:%S.0000000") + ",1000,100"
        for i in range(26 * 8)]
    path = tmp_path / "azure.csv"
    path.write_text("\n".join(lines) + "\n")
    s = fit_trace(path).summary
    assert s["format"] == "azure" and not s["has_sessions"]
    rates = s["tasks_per_hour"]
    assert rates == pytest.approx([8.0] * 24, rel=0.1)          # hours 0 and 1, covered twice, within a call
    assert sum(rates) / 24 == pytest.approx(8.0, rel=0.01)


@pytest.mark.parametrize("name", ["", "   "])
def test_an_empty_workload_name_is_refused_not_replaced(name):
    """`--name ""` is a slip, not a request for the file's stem (fuzz round 7: it fell back to the stem)."""
    with pytest.raises(TraceError, match="workload name .* is empty"):
        fit_trace(FIXTURES / "otel_genai.jsonl", name=name)
    assert fit_trace(FIXTURES / "otel_genai.jsonl", name="support").workload.name == "support"
