"""apmw search --html: the answer as one self-contained page, opened in real headless Chromium."""

from __future__ import annotations

import html

import base64
import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES
from tests.e2e.test_cli import APMW
from tests.report.test_report import opened, shoot_sections

SPACE = "axes:\n  hardware.gpus_per_replica: [1, 2, 4, 8]\n  serving.max_batch: [32, 128, 256]\n"


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> tuple[Path, dict]:
    d = tmp_path_factory.mktemp("search-page")
    (d / "space.yaml").write_text(SPACE)
    out = d / "search.html"
    r = subprocess.run([APMW, "search", str(EXAMPLES / "support-chat.yaml"), "--space", str(d / "space.yaml"),
                        "--html", str(out), "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out, json.loads(r.stdout)


def _attached(text: str, name: str) -> str:
    marker = f'download="{name}" href="data:'
    start = text.index(";base64,", text.index(marker)) + len(";base64,")
    return base64.b64decode(text[start:text.index('"', start)]).decode()


def test_the_page_holds_the_answer_and_every_feasible_point_on_hover(page):
    path, answer = page
    text = path.read_text()
    assert text.startswith("<!DOCTYPE html>")
    for fetch in ('src="http', "src='http", 'href="http', "url(http", "@import", "<script"):
        assert fetch not in text
    assert text.count("<svg") == 2
    # each feasible point is drawn once per plane, with its settings as its hover title
    assert text.count("<title>") == 2 * answer["feasible"] + 1          # and the page's own <title>
    best = answer["best"]["agents_per_mw"]
    assert best["launch"] in text.replace("&quot;", '"')
    assert f"{best['agents_per_mw']:,.0f}" in text
    for why in answer["pruned_by_reason"]:
        assert html.escape(why) in text
    attached = json.loads(_attached(text, "search.json"))
    assert attached["front"] == answer["front"] and attached["best"] == answer["best"]
    assert len(attached["pruned_points"]) == answer["pruned"] > 0
    assert "by apmw 0.1.0 with <code>apmw search" in text and "--html" in text


@pytest.mark.slow
def test_the_page_renders_in_chromium_with_a_hover_title_on_each_point(page):
    path, answer = page
    with opened(path) as (view, problems, requests):
        titles = view.eval_on_selector_all(".search-points use > title", "els => els.map(e => e.textContent)")
        charts = view.eval_on_selector_all("figure.chart svg", "els => els.map(e => {const b = "
                                           "e.getBoundingClientRect(); return [b.width, b.height]})")
        best = answer["best"]["agents_per_mw"]
        chosen = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in best["settings"].items())
        # a real pointer over the chosen point's marker lands on a point with a title, not on the front line or
        # the ring drawn over it (a point drawn at the same place may be the one on top)
        box = view.locator(".search-points use", has=view.locator("title", has_text=chosen)).first.bounding_box()
        x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        view.mouse.move(x, y)
        under = view.evaluate(f"(() => {{const e = document.elementFromPoint({x}, {y}).closest('use');"
                              " return e && e.closest('.search-points') ? e.querySelector('title').textContent : null})()")
        # the titles of every point drawn where the chosen one is (within a pixel)
        here = view.evaluate(f"Array.from(document.querySelectorAll('.search-points use')).filter(e => {{"
                             "const b = e.getBoundingClientRect(); return Math.abs(b.x + b.width / 2 - "
                             f"{x}) < 1 && Math.abs(b.y + b.height / 2 - {y}) < 1}}).map(e => e.querySelector('title').textContent)")
        sizes = shoot_sections(view, path.with_suffix(".png"))
    assert not problems, problems
    assert all(u.startswith("file:") or u.startswith("data:") for u in requests), requests
    assert len(titles) == 2 * answer["feasible"]
    assert under is not None and under in here
    assert any(t.startswith(chosen + "\n") and f"{best['agents_per_mw']:,.0f} agents/MW" in t for t in here)
    front_settings = {", ".join(f"{k.split('.')[-1]}={v}" for k, v in p["settings"].items()) for p in answer["front"]}
    assert front_settings <= {t.split("\n")[0] for t in titles}
    assert all(w > 300 and h > 150 for w, h in charts)
    assert [name for name, _, _ in sizes] == [
        "Agents per MW against per-agent output speed", "Agents per MW against cost per session", "The chosen point",
        "The front", "Best per objective", "Pruned points", "Inputs"]
    for name, height, size in sizes:
        assert height > 60 and size > 3_000, (name, height, size)


def test_a_large_space_draws_both_fronts_the_chosen_point_and_a_share_of_the_rest():
    from apmw.report.search_page import MAX_PLOTTED, _cost_front, plotted

    points = [{"point": i, "agents_per_mw": float((i * 7919) % 10007), "cost_per_session_usd": 1.0 + (i % 97),
               "output_speed_tokens_per_s": float(i % 113)} for i in range(12_000)]
    front = [points[i] for i in (5, 17, 3_000)]
    answer = {"front": front, "best": {"agents_per_mw": max(points, key=lambda p: p["agents_per_mw"])}}
    drawn = plotted(answer, points)
    ids = {p["point"] for p in drawn}
    assert len(drawn) <= MAX_PLOTTED
    assert {5, 17, 3_000, answer["best"]["agents_per_mw"]["point"]} <= ids
    assert {points[i]["point"] for i in _cost_front(points)} <= ids
    assert plotted(answer, points[:100]) == points[:100]
