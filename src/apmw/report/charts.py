"""Charts for the HTML report, drawn with matplotlib and returned as inline SVG strings.

Inline SVG needs no JavaScript and no network at view time. Every function takes
plain numbers (the JSON-ready results of the verbs) and returns one ``<svg>``.
"""

from __future__ import annotations

import html
import io
import re

import matplotlib

matplotlib.use("Agg")  # no display: render to files only
import matplotlib.pyplot as plt  # noqa: E402

from apmw.capacity.fleet_day import WEEKDAYS  # noqa: E402

plt.rcParams.update({"svg.fonttype": "none", "font.size": 9, "axes.spines.top": False,
                     "axes.spines.right": False, "figure.dpi": 100})
BLUE, ORANGE, GREY, RED, GREEN = "#1f77b4", "#ff7f0e", "#7f7f7f", "#d62728", "#2ca02c"


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})  # no date: reproducible files
    plt.close(fig)
    text = buf.getvalue()
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)   # RDF block: noise in the HTML
    return text[text.index("<svg"):]


def latency_curve(agents: list[int], mean_s: list[float], p95_s: list[float], slo_s: float, n_star: int,
                  simulated: list[tuple[int, float, float, float | None]] | None = None) -> str:
    """``simulated``: (agents, p95, low, high) of each simulated count; a missing high end is drawn to the p95."""
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    ax.plot(agents, mean_s, color=BLUE, label="mean (analytic)")
    ax.plot(agents, p95_s, color=ORANGE, label="p95 (analytic)")
    if simulated:
        n, p95 = [s[0] for s in simulated], [s[1] for s in simulated]
        below = [p - s[2] for p, s in zip(p95, simulated)]
        above = [(s[3] if s[3] is not None else p) - p for p, s in zip(p95, simulated)]
        ax.errorbar(n, p95, yerr=[below, above], fmt="o", color=RED, zorder=3, capsize=3,
                    label="p95 (simulated, 95% interval)")
    ax.axhline(slo_s, color=GREY, linestyle="--", label=f"SLO p95 {slo_s:,.0f} s")
    ax.axvline(n_star, color=GREEN, linestyle=":", label=f"N* = {n_star}")
    ax.set_xlabel("concurrent agents per replica")
    ax.set_ylabel("task latency (s)")
    ax.legend(frameon=False)
    return _svg(fig)


def per_call_curve(agents: list[int], p95_s: list[float], slo_s: float | None, n_star: int, label: str,
                   simulated: list[tuple[int, float]] | None = None) -> str:
    """A per-call latency's p95 (TTFT, or time per output token) against concurrency, in ms, with its SLO."""
    fig, ax = plt.subplots(figsize=(6.4, 3.0))
    ax.plot(agents, [p * 1e3 for p in p95_s], color=ORANGE, label=f"{label} p95 (analytic)")
    if simulated:
        ax.scatter([n for n, _ in simulated], [p * 1e3 for _, p in simulated], color=RED, zorder=3,
                   label=f"{label} p95 (simulated)")
    if slo_s is not None:
        ax.axhline(slo_s * 1e3, color=GREY, linestyle="--", label=f"SLO p95 {slo_s * 1e3:,.0f} ms")
    ax.axvline(n_star, color=GREEN, linestyle=":", label=f"N* = {n_star}")
    ax.set_xlabel("concurrent agents per replica")
    ax.set_ylabel(f"{label} (ms)")
    ax.legend(frameon=False)
    return _svg(fig)


def kv_curve(agents: list[int], kv_mean: list[float], kv_p95: list[float], capacity: float, n_star: int) -> str:
    fig, ax = plt.subplots(figsize=(6.4, 3.0))
    ax.plot(agents, [k / 1e6 for k in kv_mean], color=BLUE, label="resident KV, mean")
    ax.plot(agents, [k / 1e6 for k in kv_p95], color=ORANGE, label="resident KV, p95")
    ax.axhline(capacity / 1e6, color=GREY, linestyle="--", label="KV capacity")
    ax.axvline(n_star, color=GREEN, linestyle=":", label=f"N* = {n_star}")
    ax.set_xlabel("concurrent agents per replica")
    ax.set_ylabel("KV tokens (millions)")
    ax.legend(frameon=False)
    return _svg(fig)


def breakdown(parts: dict[str, float], unit: str, title: str) -> str:
    items = [(k, v) for k, v in parts.items() if v > 0]
    fig, ax = plt.subplots(figsize=(6.4, 1.0 + 0.3 * len(items)))
    colors = [BLUE, ORANGE, GREEN, RED, GREY, "#9467bd"]
    left = 0.0
    for i, (k, v) in enumerate(items):
        ax.barh([0], [v], left=left, color=colors[i % len(colors)], label=f"{k}: {v:,.4g} {unit}")
        left += v
    ax.set_yticks([])
    ax.set_xlabel(unit)
    ax.set_title(title, loc="left")
    ax.legend(frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.5), ncol=min(len(items), 3))
    return _svg(fig)


def tornado(levers: list[dict]) -> str:
    rows = sorted(levers, key=lambda r: r["gain"])
    fig, ax = plt.subplots(figsize=(6.4, 0.8 + 0.32 * max(len(rows), 1)))
    ax.barh([r["lever"] for r in rows], [r["gain"] - 1 for r in rows],
            color=[GREEN if r["gain"] >= 1 else RED for r in rows])
    ax.axvline(0, color=GREY)
    ax.set_xlabel("change in agents per MW (+0.5 = 1.5x, -0.2 = 0.8x)")
    return _svg(fig)


def agents_vs_tokens(points: list[dict], highlight: str) -> str:
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for p in points:
        ours = p["name"] == highlight
        ax.scatter(p["output_tokens_per_s_per_mw"], p["agents_per_mw"], s=70 if ours else 40,
                   color=ORANGE if ours else BLUE, zorder=3)
        ax.annotate(p["name"], (p["output_tokens_per_s_per_mw"], p["agents_per_mw"]), textcoords="offset points",
                    xytext=(5, 4))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("output tokens/s per MW at N*")
    ax.set_ylabel("agents per MW")
    return _svg(fig)


def fleet_day_curves(hours: list[dict], power_cap_mw: float | None = None) -> str:
    """A day of demand (apmw fleet): tasks started and concurrent agents, replicas up and needed, and
    facility and provisioned power, hour by hour (three panels on one hour axis)."""
    h = [x["hour"] for x in hours]
    fig, (demand, replicas, power) = plt.subplots(3, 1, figsize=(6.4, 6.6), sharex=True)
    demand.bar(h, [x["tasks"] for x in hours], color=BLUE, width=0.8, label="tasks started")
    demand.set_ylabel("tasks per hour")
    agents = demand.twinx()
    agents.plot(h, [x["concurrent_agents"] for x in hours], color=ORANGE, marker=".", label="concurrent agents")
    agents.set_ylabel("concurrent agents")
    agents.spines["right"].set_visible(True)
    lines = demand.get_legend_handles_labels()[0] + agents.get_legend_handles_labels()[0]
    demand.legend(lines, ["tasks started", "concurrent agents"], frameon=False, loc="upper left")
    replicas.step(h, [x["replicas"] for x in hours], where="mid", color=BLUE, label="replicas up")
    replicas.step(h, [x["replicas_needed"] for x in hours], where="mid", color=GREY, linestyle="--",
                  label="replicas needed")
    replicas.set_ylabel("replicas")
    replicas.legend(frameon=False, loc="upper left")
    power.plot(h, [x["facility_power_w"] / 1e6 for x in hours], color=BLUE, marker=".", label="facility (modelled)")
    power.plot(h, [x["provisioned_power_w"] / 1e6 for x in hours], color=ORANGE, marker=".", label="provisioned")
    if power_cap_mw is not None:
        power.axhline(power_cap_mw, color=RED, linestyle="--", label=f"power cap {power_cap_mw:,.2f} MW")
    power.set_ylabel("MW")
    if len(hours) > 24:         # a week from Monday 00:00: one tick a day
        power.set_xlabel("hour of the week")
        power.set_xticks(range(0, len(hours), 24), list(WEEKDAYS[:len(hours) // 24]))
    else:
        power.set_xlabel("hour of the day")
        power.set_xticks(range(0, 24, 3))
    power.legend(frameon=False, loc="upper left")
    return _svg(fig)


def search_scatter(x: list[float], y: list[float], hover: list[str], front: list[int], chosen: int,
                   x_label: str, y_label: str) -> str:
    """A search's feasible points (grey), its front joined in blue and the chosen point ringed; each
    point carries its ``hover`` text as an SVG ``<title>``: the browser shows it on hover, no script."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.scatter(x, y, s=22, color=GREY, alpha=0.6, label="feasible point", gid="search-points", zorder=2)
    order = sorted(front, key=lambda i: x[i])
    ax.plot([x[i] for i in order], [y[i] for i in order], color=BLUE, marker="o", markersize=5, label="front",
            zorder=3, gid="search-overlay")
    ax.scatter([x[chosen]], [y[chosen]], s=140, facecolors="none", edgecolors=ORANGE, linewidths=2,
               label="best agents/MW", zorder=4, gid="search-overlay")
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.legend(frameon=False)
    svg = _with_titles(_svg(fig), "search-points", hover)
    # classes, not ids (a page has two such charts); the overlay lets the pointer through to the points
    svg = svg.replace('<g id="search-points">', '<g class="search-points">')
    return svg.replace('<g id="search-overlay">', '<g class="search-overlay" style="pointer-events:none">')


def _with_titles(svg: str, gid: str, titles: list[str]) -> str:
    """Each marker of the scatter ``gid`` (its ``<use>`` elements, in data order) given a ``<title>``."""
    start = svg.index(f'<g id="{gid}">')
    end = svg.index("</g>", svg.index("<use", start))
    uses = iter(titles)
    body = re.sub(r"<use ([^>]*?)/>", lambda m: f"<use {m.group(1)}><title>{html.escape(next(uses))}</title></use>",
                  svg[start:end])
    return svg[:start] + body + svg[end:]
