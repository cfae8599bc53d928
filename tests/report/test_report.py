"""The HTML report, opened in real headless Chromium (Debian's `chromium`, installed by .ci/run)."""

from __future__ import annotations

import base64
import math
import json
import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES
from tests.e2e.test_cli import APMW

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Flags for a closed network: without the background-networking ones Chromium keeps dialling out.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
CHARTS = 10      # coding-agent has a day of demand: its curves are the tenth


@pytest.fixture(scope="module")
def report_path(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "report.html"
    r = subprocess.run([APMW, "report", str(EXAMPLES / "coding-agent.yaml"), "-o", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out


@pytest.mark.slow
def _attached_plan(text: str) -> dict:
    """The plan.json the report carries (a base64 data link)."""
    start = text.index('download="plan.json" href="data:application/json;base64,') + len(
        'download="plan.json" href="data:application/json;base64,')
    return json.loads(base64.b64decode(text[start:text.index('"', start)]))


def test_report_is_one_self_contained_file(report_path):
    text = report_path.read_text()
    plan = _attached_plan(text)
    day = plan["fleet_day"]
    assert f"<div>GPUs at peak<b>{day['peak_gpus']:,}</b>" in text
    assert f"<div>MWh a month<b>{day['facility_mwh_per_month']:,.0f}</b>" in text
    ratio = day["cost_per_task_usd"] / day["api_cost_per_task_usd"]
    assert f"<div>per task vs the API<b>{ratio:.2f}x" in text
    # the routing comparison at the peak: every policy's N* from the attached plan's own day
    assert "<h3>Routing across replicas</h3>" in text
    for r in day["routing_comparison"]:
        assert f"<td>{r['agents_per_replica']:,}</td>" in text and r["policy"] in text
    assert text.startswith("<!DOCTYPE html>")
    for fetch in ('src="http', "src='http", 'href="http', "href='http", "url(http", "@import", "<script"):
        assert fetch not in text, f"the report would fetch something at view time: {fetch}"
    assert text.count("<svg") == CHARTS
    for section in ("Task latency against concurrency", "KV cache occupancy", "What to change first",
                    "Why tokens per second misled", "Cost and energy per session", "Inputs and assumptions",
                    "SLO verdicts at N*", "Binding: kv_memory", "A day of demand (apmw fleet)", "40,000 tasks a day",
                    f"At N* = {plan['agents_per_replica']} (settled in the simulator from",
                    f"the analytic model gives {plan['analytic']['agents_per_replica']})",
                    "<h2>The fleet</h2>", "<div>GPUs at peak<b>", "<div>MWh a month<b>", "<div>cost per task<b>",
                    "<div>per task vs the API<b>", "The day hour by hour",
                    "of calls preempted", "p95 (simulated, 95% interval)",
                    "Per call: time to first token and time per output token", "by apmw 0.1.0 with <code>apmw report",
                    'download="plan.json" href="data:application/json;base64,', 'download="spec.yaml"',
                    "<td>workload.steps_per_task</td><td>mean: 80.3, p95: 134</td>"):
        assert section in text
    assert "<h2>Plan (JSON)</h2>" not in text           # attached, not dumped
    assert " 0.0" not in text.split("energy per session")[1][:40]     # readable units: Wh, not 0.0xx kWh


@contextmanager
def opened(path: Path):
    """``path`` open in headless Chromium at 1,100 px: the page, and the console problems and the
    requests it makes, gathered while it is open."""
    from playwright.sync_api import sync_playwright

    problems: list[str] = []
    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.on("request", lambda r: requests.append(r.url))
        page.goto(path.as_uri())
        try:
            yield page, problems, requests
        finally:
            browser.close()


def shoot_sections(page, shot: Path) -> list[tuple[str, float, int]]:
    """Every section of the open page, from its heading to the next, shot on its own next to ``shot``:
    (heading, height in px, PNG bytes) each, so a test can check that each draws something."""
    sections = page.eval_on_selector_all(
        "h2", "els => els.map((e, i) => {const next = els[i + 1]; const top = e.getBoundingClientRect().top"
              " + window.scrollY; const end = next ? next.getBoundingClientRect().top + window.scrollY"
              " : document.body.scrollHeight; return [e.textContent, top, end - top]})")
    shots = []
    for i, (name, top, height) in enumerate(sections):
        path = shot.with_name(f"{shot.stem}-section{i}.png")
        page.screenshot(path=str(path), full_page=True, clip={"x": 0, "y": top, "width": 1100, "height": height})
        shots.append((name, height, path.stat().st_size))
    return shots


@pytest.mark.slow
def test_report_renders_in_chromium_without_errors(report_path):

    assert Path(CHROMIUM).exists(), "Debian's chromium is needed: apt-get install chromium (.ci/run does this)"
    with opened(report_path) as (page, problems, requests):
        charts = page.eval_on_selector_all(
            "figure.chart svg",
            "els => els.map(e => {const b = e.getBoundingClientRect();"
            " return [b.width, b.height, e.querySelectorAll('path,rect,line,text,use').length]})")
        shot = Path(os.environ.get("APMW_REPORT_SCREENSHOT", report_path.with_suffix(".png")))
        page.screenshot(path=str(shot), full_page=True)
        section_shots = shoot_sections(page, shot)
    assert not problems, problems
    assert all(u.startswith("file:") or u.startswith("data:") for u in requests), requests
    assert len(charts) == CHARTS
    for width, height, marks in charts:
        assert width > 200 and height > 100 and marks > 10
    assert shot.stat().st_size > 50_000
    assert [name for name, _, _ in section_shots] == [
        "Task latency against concurrency", "KV cache occupancy", "Where a task's time goes", "What to change first",
        "Why tokens per second misled", "Cost and energy per session", "The fleet", "Inputs and assumptions"]
    for name, height, size in section_shots:
        assert height > 100 and size > 5_000, (name, height, size)


def test_fleet_tiles_read_in_the_units_a_budget_uses():
    from apmw.report.html import _money, fleet_tiles

    assert [_money(x) for x in (0.15514, 84.2, 12_345.0, 1_520_000.0, 2.5e9)] == [
        "$0.1551", "$84.20", "$12,345", "$1.52M", "$2.50B"]
    day = {"peak_gpus": 2864, "peak_facility_mw": 1.913, "peak_provisioned_mw": 4.75, "average_facility_mw": 0.9,
           "facility_mwh_per_month": 657.0, "cost_per_month_usd": 1_520_000.0, "cost_per_task_usd": 0.31,
           "api_cost_per_task_usd": 0.62}
    tiles = dict(fleet_tiles(day))
    assert tiles["GPUs at peak"] == "2,864" and tiles["MW at peak (provisioned)"] == "1.91 (4.75)"
    assert tiles["cost a month"] == "$1.52M" and tiles["per task vs the API"] == "0.50x ($0.6200 on the API)"
    assert "per task vs the API" not in dict(fleet_tiles(day | {"api_cost_per_task_usd": None}))
    assert "a month owned (capex)" not in tiles
    owned = {"cost_per_month_usd": 1_610_000.0, "gpus": 2864, "years": 4.0}
    assert dict(fleet_tiles(day | {"owned": owned}))["a month owned (capex)"] == "$1.61M (2,864 GPUs over 4 years)"
    # a small fleet's month read "0" MWh beside the text's 0.5 (fuzz round 5)
    assert tiles["MWh a month"] == "657"
    assert dict(fleet_tiles(day | {"facility_mwh_per_month": 0.4978}))["MWh a month"] == "0.5"


def test_a_week_of_demand_is_called_a_week():
    """A spec with 168 hours of demand was reported as "A day of demand" charted "The day hour by hour"."""
    from apmw.capacity import plan
    from apmw.capacity.fleet_day import fleet_day
    from apmw.report.html import _fleet_day
    from apmw.spec import load_spec

    s = load_spec(EXAMPLES / "coding-agent.yaml")
    s = s.model_copy(update={"fleet": s.fleet.model_copy(update={"tasks_per_hour": s.fleet.tasks_per_hour * 7})})
    day = fleet_day(plan(s), compare_routing=False).to_dict()
    html = _fleet_day(day, "<svg></svg>")
    assert "A week of demand (apmw fleet)" in html and "The week hour by hour" in html and "A day of" not in html


def test_a_workload_with_no_second_token_has_no_time_per_output_token_to_plot():
    """Calls of one output token have no time per output token: the report drew the analytic model's TPOT
    anyway, a curve of a figure nothing measures, and rounded task latencies under a minute to whole seconds."""
    from apmw.report import build_report
    from apmw.spec import spec_from_dict
    from tests.conftest import small_spec_dict

    d = small_spec_dict()
    d["workload"]["output_tokens_per_call"] = {"mean": 1, "p95": 1}
    text = build_report(spec_from_dict(d), "one token", simulated=False)
    assert "No call of this workload outputs a second token, so there is no time per output token." in text
    assert text.count("<svg") == CHARTS - 2          # no TPOT curve, and no day of demand (no tasks_per_hour)
    took = text.split("the task takes")[1].split("</p>")[0]
    p95 = _attached_plan(text)["task_latency_s"]["p95"]
    assert p95 < 100 and f"p95 {p95:.{3 - int(math.floor(math.log10(p95)))}f} s" in " ".join(took.split())
