"""`apmw search --html`: a search's answer as one self-contained HTML file.

The front on two planes (agents per MW against per-agent output speed, and against dollars per
session) with every feasible point's settings on hover, the chosen point's settings and launch
line, the front and the best point per objective, what was pruned and why, and the inputs. Like
the report: inline SVG, no script, nothing fetched at view time.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
from importlib.metadata import version

import yaml

from apmw.capacity.slo import speed_text, task_s
from apmw.design_search.space import settings_text
from apmw.report import charts
from apmw.report.html import _CSS, _attachment, _figure, _inputs, _money, _table, _tiles


OBJECTIVE_FORMATS = {"agents_per_mw": "{:,.0f}".format, "agents_per_mw_provisioned": "{:,.0f}".format,
                     "cost_per_session_usd": "${:,.4f}".format, "agents_per_gpu": "{:,.1f}".format,
                     "task_latency_p95_s": lambda s: f"{task_s(s)} s",
                     "output_speed_tokens_per_s": lambda v: f"{speed_text(v)} tokens/s"}
# Long launch lines wrap rather than scroll, so that a printed or shot page shows them whole.
_PAGE_CSS = _CSS + "pre{white-space:pre-wrap;overflow-wrap:anywhere}"
# Feasible points drawn with their hover text, at most.
MAX_PLOTTED = 5000


def _hover(p: dict) -> str:
    return (f"{settings_text(p['settings'])}\nN* {p['agents_per_replica']:,} ({p['binding_constraint']}), "
            f"{p['agents_per_mw']:,.0f} agents/MW, {_speed(p)}${p['cost_per_session_usd']:,.4f}/session, "
            f"task p95 {task_s(p['task_latency_p95_s'])} s")


def _speed(p: dict) -> str:
    """ "12.3 tokens/s per agent, ", or nothing where no call outputs a second token."""
    speed = p["output_speed_tokens_per_s"]
    return "" if speed is None else f"{speed:,.1f} tokens/s per agent, "


def plotted(answer: dict, points: list[dict]) -> list[dict]:
    """The points drawn: all of them up to MAX_PLOTTED, else both fronts, the chosen point and an even
    share of the rest (a page of 100,000 hover titles would not open)."""
    if len(points) <= MAX_PLOTTED:
        return points
    keep = {p["point"] for p in answer["front"]} | {points[i]["point"] for i in _cost_front(points)}
    keep.add(answer["best"]["agents_per_mw"]["point"])
    step = -(-len(points) // (MAX_PLOTTED - len(keep)))
    keep |= {p["point"] for p in points[::step]}
    return [p for p in points if p["point"] in keep]


def search_charts(answer: dict, points: list[dict]) -> dict[str, str | None]:
    """The two planes: ``points`` are the feasible points drawn (``point`` index, ``settings`` and figures). A
    search's points share one workload, so where no call outputs a second token none has an output speed and
    there is no speed plane (None)."""
    where = {p["point"]: i for i, p in enumerate(points)}
    front = [where[p["point"]] for p in answer["front"]]
    chosen = where[answer["best"]["agents_per_mw"]["point"]]
    hover = [_hover(p) for p in points]
    agents_per_mw = [p["agents_per_mw"] for p in points]
    speed = None if all(p["output_speed_tokens_per_s"] is None for p in points) else charts.search_scatter(
        [p["output_speed_tokens_per_s"] for p in points], agents_per_mw, hover, front, chosen,
        "per-agent output speed (tokens/s at the p95 time per output token)", "agents per MW")
    cost = charts.search_scatter([p["cost_per_session_usd"] for p in points], agents_per_mw, hover,
                                 _cost_front(points), chosen, "cost per session ($)", "agents per MW")
    return {"speed": speed, "cost": cost}


def _cost_front(points: list[dict]) -> list[int]:
    """Indices of the points no other beats on both agents per MW and cost per session."""
    front, cheapest = [], float("inf")
    for i in sorted(range(len(points)), key=lambda i: (-points[i]["agents_per_mw"], points[i]["cost_per_session_usd"])):
        if points[i]["cost_per_session_usd"] < cheapest:
            front.append(i)
            cheapest = points[i]["cost_per_session_usd"]
    return front


def _speed_plane(svg: str | None, share: str) -> str:
    if svg is None:
        return ("<p>No call of this workload outputs a second token, so no point has a per-agent output speed: "
                f"the front is the most agents per MW.{share}</p>")
    return _figure(svg, 'Every feasible point (grey; hover for its settings and figures), the Pareto front in '
                   'blue (no point is better on both), and the point with the most agents per MW ringed.' + share)


def _checked(p: dict) -> str:
    c = p.get("checked")
    if c is None:
        return "-"
    if "not_checked" in c:
        return "not checked: " + c["not_checked"]
    return f"{c['agents_per_replica']:,} ({c['agents_per_mw']:,.0f} agents/MW)"


def render_search(title: str, answer: dict, points: list[dict], spec_dict: dict, axes: dict,
                  command: str | None = None) -> str:
    """The page for ``answer`` (``SearchAnswer.to_dict(explain=True)``); ``points``: every feasible point."""
    if not points:
        body = "<p>No point of the space is feasible: see the pruned points below.</p>"
    else:
        drawn = plotted(answer, points)
        figures = search_charts(answer, drawn)
        share = "" if len(drawn) == len(points) else (
            f" {len(drawn):,} of the {len(points):,} feasible points are drawn: both fronts, the chosen point and an "
            "even share of the rest; the Parquet or CSV output has them all.")
        best = answer["best"]["agents_per_mw"]
        front_rows = [[settings_text(p["settings"]), f"{p['agents_per_replica']:,}", f"{p['agents_per_mw']:,.0f}",
                       speed_text(p["output_speed_tokens_per_s"]), f"{p['cost_per_session_usd']:,.4f}",
                       task_s(p["task_latency_p95_s"]), _checked(p)] for p in answer["front"]]
        best_rows = [[name, settings_text(p["settings"]), OBJECTIVE_FORMATS[name](p[name])]
                     for name, p in answer["best"].items()]
        body = f"""
{_tiles([('best agents per MW', f"{best['agents_per_mw']:,.0f}"), ('its N*', f"{best['agents_per_replica']:,}"),
         ('its cost per session', _money(best['cost_per_session_usd'])),
         ('points on the front', f"{len(answer['front']):,}")])}
<h2>Agents per MW against per-agent output speed</h2>
{_speed_plane(figures['speed'], share)}
<h2>Agents per MW against cost per session</h2>
{_figure(figures['cost'], 'The same points against dollars per session; blue: the points no other beats on both.')}
<h2>The chosen point</h2>
<p>The most agents per MW: N* {best['agents_per_replica']:,} per replica (binding: {html.escape(best['binding_constraint'])}),
{best['agents_per_mw']:,.0f} agents per MW ({best['agents_per_mw_provisioned']:,.0f} provisioned),
${best['cost_per_session_usd']:,.4f} per session, task p95 {task_s(best['task_latency_p95_s'])} s{
'' if best['output_speed_tokens_per_s'] is None else f", {best['output_speed_tokens_per_s']:,.1f} tokens/s per agent"}.</p>
{_table(['setting', 'value'], [[k, json.dumps(v) if isinstance(v, (dict, list)) else str(v)]
                                for k, v in best['settings'].items()])}
<p>Launch it with:</p><pre>{html.escape(best['launch'])}</pre>
<h2>The front</h2>
{_table(['settings', 'N*', 'agents/MW', 'tokens/s per agent', '$/session', 'task p95 s', 'simulated N*'], front_rows)}
<h2>Best per objective</h2>
{_table(['objective', 'settings', 'value'], best_rows)}"""
    reasons = [[why, f"{n:,}"] for why, n in answer["pruned_by_reason"].items()]
    pruned = ("<p>No point was pruned.</p>" if not reasons else _table(["reason", "points"], reasons))
    generated = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    axis_rows = [[path, ", ".join(json.dumps(v) if isinstance(v, (dict, list)) else str(v) for v in values)]
                 for path, values in axes.items()]
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{_PAGE_CSS}</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p>{answer['evaluated']:,} points evaluated, {answer['feasible']:,} feasible, {answer['pruned']:,} pruned; each
planned with the analytic model as <code>apmw plan --analytic</code> does.</p>
<p class="meta">Generated {generated} by apmw {html.escape(version('apmw'))}{'' if not command else
' with <code>' + html.escape(command) + '</code>'}.</p>
{body}
<h2>Pruned points</h2>
{pruned}
<h2>Inputs</h2>
{_table(['axis', 'values'], axis_rows)}
{_table(['input', 'value'], _inputs(spec_dict))}
<p>Attached: the spec {_attachment('spec.yaml', yaml.safe_dump(spec_dict, sort_keys=False), 'application/x-yaml')}
and the answer as {_attachment('search.json', json.dumps(answer, indent=2), 'application/json')}
(the fields of <code>apmw search --json --explain</code>).</p>
</body></html>
"""
