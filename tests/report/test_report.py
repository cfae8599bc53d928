"""The HTML report, opened in real headless Chromium (Debian's `chromium`, installed by .ci/run)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES
from tests.e2e.test_cli import APMW

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Flags for a closed network: without the background-networking ones Chromium keeps dialling out.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
CHARTS = 9


@pytest.fixture(scope="module")
def report_path(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "report.html"
    r = subprocess.run([APMW, "report", str(EXAMPLES / "coding-agent.yaml"), "-o", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out


@pytest.mark.slow
def test_report_is_one_self_contained_file(report_path):
    text = report_path.read_text()
    assert text.startswith("<!DOCTYPE html>")
    for fetch in ('src="http', "src='http", 'href="http', "href='http", "url(http", "@import", "<script"):
        assert fetch not in text, f"the report would fetch something at view time: {fetch}"
    assert text.count("<svg") == CHARTS
    for section in ("Task latency against concurrency", "KV cache occupancy", "What to change first",
                    "Why tokens per second misled", "Cost and energy per session", "Inputs and assumptions",
                    "SLO verdicts at N*", "Binding: kv_memory", "A day of demand (apmw fleet)", "40,000 tasks a day",
                    "At N* = 30 (settled in the simulator from", "the analytic model gives 27",
                    "of calls preempted", "p95 (simulated, 95% interval)",
                    "Per call: time to first token and time per output token", "by apmw 0.1.0 with <code>apmw report",
                    'download="plan.json" href="data:application/json;base64,', 'download="spec.yaml"',
                    "<td>workload.steps_per_task</td><td>mean: 80.3, p95: 134</td>"):
        assert section in text
    assert "<h2>Plan (JSON)</h2>" not in text           # attached, not dumped
    assert " 0.0" not in text.split("energy per session")[1][:40]     # readable units: Wh, not 0.0xx kWh


@pytest.mark.slow
def test_report_renders_in_chromium_without_errors(report_path):
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "Debian's chromium is needed: apt-get install chromium (.ci/run does this)"
    problems, requests = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.on("request", lambda r: requests.append(r.url))
        page.goto(report_path.as_uri())
        charts = page.eval_on_selector_all(
            "figure.chart svg",
            "els => els.map(e => {const b = e.getBoundingClientRect();"
            " return [b.width, b.height, e.querySelectorAll('path,rect,line,text,use').length]})")
        shot = Path(os.environ.get("APMW_REPORT_SCREENSHOT", report_path.with_suffix(".png")))
        page.screenshot(path=str(shot), full_page=True)
        # every section, from its heading to the next, shot on its own: each must draw something
        sections = page.eval_on_selector_all(
            "h2", "els => els.map((e, i) => {const next = els[i + 1]; const top = e.getBoundingClientRect().top"
                  " + window.scrollY; const end = next ? next.getBoundingClientRect().top + window.scrollY"
                  " : document.body.scrollHeight; return [e.textContent, top, end - top]})")
        section_shots = []
        for i, (name, top, height) in enumerate(sections):
            path = shot.with_name(f"{shot.stem}-section{i}.png")
            page.screenshot(path=str(path), full_page=True, clip={"x": 0, "y": top, "width": 1100, "height": height})
            section_shots.append((name, height, path.stat().st_size))
        browser.close()
    assert not problems, problems
    assert all(u.startswith("file:") or u.startswith("data:") for u in requests), requests
    assert len(charts) == CHARTS
    for width, height, marks in charts:
        assert width > 200 and height > 100 and marks > 10
    assert shot.stat().st_size > 50_000
    assert [name for name, _, _ in section_shots] == [
        "Task latency against concurrency", "KV cache occupancy", "Where a task's time goes", "What to change first",
        "Why tokens per second misled", "Cost and energy per session", "Inputs and assumptions"]
    for name, height, size in section_shots:
        assert height > 100 and size > 5_000, (name, height, size)
