"""One self-contained HTML file: charts as inline SVG, tables, every input and source.

Nothing is fetched at view time (no scripts, fonts or images from a network), so
the file can be mailed to finance and opened offline.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import json
from importlib.metadata import version

import yaml

from apmw.capacity.economics import energy_text
from apmw.capacity.fleet_day import hour_label
from apmw.capacity.slo import binding_text, slo_rows, task_s
from apmw.capacity.plan import gpu_text
from apmw.sim.checked import interval_text

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:980px;margin:2em auto;
color:#222;line-height:1.45;padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em} h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.6em 0} td,th{border:1px solid #ddd;padding:.25em .6em;text-align:right}
td:first-child,th:first-child{text-align:left} .kpi{display:flex;gap:1.2em;flex-wrap:wrap}
.kpi div{border:1px solid #ddd;border-radius:6px;padding:.6em 1em} .kpi b{display:block;font-size:1.4em}
figure{margin:1em 0} figure.chart svg{width:100%;height:auto} figcaption{color:#555;font-size:.9em}
pre{background:#f6f6f6;padding:.8em;overflow:auto} .meta{color:#555;font-size:.9em}
.bad{color:#b00}
"""


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _inputs(spec_dict: dict, prefix: str = "") -> list[list[str]]:
    """The spec as rows of dotted field and value (lists and short mappings written inline)."""
    rows = []
    for key, value in spec_dict.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and len(json.dumps(value)) > 60:
            rows += _inputs(value, f"{name}.")
        else:
            rows.append([name, _inline(value)])
    return rows


def _inline(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_inline(v)}" for k, v in value.items())
    if isinstance(value, list):
        return "[" + ", ".join(_inline(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _attachment(name: str, text: str, mime: str) -> str:
    """A link that saves ``text`` as ``name``: the data travels inside the page, nothing is fetched."""
    data = base64.b64encode(text.encode()).decode()
    return f'<a download="{html.escape(name)}" href="data:{mime};base64,{data}">{html.escape(name)}</a>'


def _figure(svg: str, caption: str) -> str:
    return f'<figure class="chart">{svg}<figcaption>{html.escape(caption)}</figcaption></figure>'


def _tiles(items: list[tuple[str, str]]) -> str:
    return '<div class="kpi">' + "".join(f"<div>{html.escape(k)}<b>{html.escape(v)}</b></div>" for k, v in items) + "</div>"


def _money(usd: float) -> str:
    """Dollars in the unit their size reads best in: "$0.1551", "$84.20", "$1.52M"."""
    for factor, unit in ((1e9, "B"), (1e6, "M")):
        if abs(usd) >= factor:
            return f"${usd / factor:,.2f}{unit}"
    return f"${usd:,.0f}" if abs(usd) >= 1000 else (f"${usd:,.2f}" if abs(usd) >= 1 else f"${usd:,.4f}")


def _energy_mwh(mwh: float) -> str:
    """MWh whole from 10 up, else to two significant figures: a small fleet's month read "0" beside "0.5 MWh"."""
    return f"{mwh:,.0f}" if mwh >= 10 else f"{mwh:.2g}"


def fleet_tiles(day: dict) -> list[tuple[str, str]]:
    """The day's figures a budget is signed on: GPUs at peak, MW, MWh and dollars a month, $ per task."""
    tiles = [("GPUs at peak", f"{day['peak_gpus']:,}"),
             ("MW at peak (provisioned)", f"{day['peak_facility_mw']:,.2f} ({day['peak_provisioned_mw']:,.2f})"),
             ("MW on average", f"{day['average_facility_mw']:,.2f}"),
             ("MWh a month", _energy_mwh(day["facility_mwh_per_month"])),
             ("cost a month", _money(day["cost_per_month_usd"]))]
    if day["cost_per_task_usd"] is not None:
        tiles.append(("cost per task", _money(day["cost_per_task_usd"])))
        api = day["api_cost_per_task_usd"]
        if api:
            tiles.append(("per task vs the API", f"{day['cost_per_task_usd'] / api:.2f}x ({_money(api)} on the API)"))
    owned = day.get("owned")
    if owned:
        tiles.append(("a month owned (capex)", f"{_money(owned['cost_per_month_usd'])} ({owned['gpus']:,.0f} GPUs "
                      f"over {owned['years']:g} years)"))
    return tiles


def _fleet_day(day: dict | None, chart: str | None) -> str:
    """The spec's day of demand (apmw fleet): the tile row, its curves, its totals and the 24 hours."""
    if not day:
        return ""
    api = "" if day["api_cost_per_task_usd"] is None else (
        f" The same tasks on the API the spec prices cost ${day['api_cost_per_task_usd']:,.4f} each.")
    per_task = "" if day["cost_per_task_usd"] is None else f", ${day['cost_per_task_usd']:,.4f} per task"
    rows = [[hour_label(h["hour"], len(day["hours"])), f"{h['tasks']:,.0f}", f"{h['concurrent_agents']:,.1f}",
             f"{h['replicas']:,} ({h['replicas_needed']:,})", f"{h['gpus']:,}", f"{h['facility_power_w'] / 1e3:,.1f}",
             f"{h['gpu_cost_usd'] + h['electricity_cost_usd']:,.2f}"] for h in day["hours"]]
    cap = "" if day["power_cap_mw"] is None else (
        f" The hall's cap, {day['power_cap_mw']:,.2f} MW provisioned, is exceeded in hour(s) "
        f"{', '.join(hour_label(h, len(day['hours'])) for h in day['hours_over_power_cap'])}." if day["hours_over_power_cap"] else
        f" The fleet stays inside the hall's cap of {day['power_cap_mw']:,.2f} MW provisioned all day.")
    period = "day" if len(day["hours"]) == 24 else "week"      # a spec's demand is 24 hours or 168
    figure = "" if chart is None else _figure(chart, f"The {period} hour by hour: tasks started and concurrent agents; "
                                              "replicas up (with scale-up and scale-down delays) and needed; facility "
                                              "power as modelled and as provisioned (nameplate), and the hall's cap.")
    return (f"<h3>A {period} of demand (apmw fleet)</h3>" + _tiles(fleet_tiles(day)) + figure +
            f"<p>{day['tasks_per_day']:,.0f} tasks a day, sized with the analytic model (N* "
            f"{day['agents_per_replica_max']:,}, the curve it uses for each hour's load). Peak at hour {day['peak_hour_label']}: "
            f"{day['peak_replicas']:,} replicas, {day['peak_gpus']:,} GPUs, {day['peak_facility_mw']:,.3f} MW facility "
            f"({day['peak_provisioned_mw']:,.3f} MW provisioned). A day: {day['gpu_hours_per_day']:,.0f} GPU-hours, "
            f"{day['facility_mwh_per_day']:,.2f} MWh, ${day['cost_per_day_usd']:,.2f}{per_task}; a month: "
            f"{day['facility_mwh_per_month']:,.1f} MWh, ${day['cost_per_month_usd']:,.0f}.{api}{cap}</p>"
            + _table(["hour", "tasks", "agents", "replicas up (needed)", "GPUs", "facility kW", "USD"], rows)
            + _routing(day))


def _routing(day: dict) -> str:
    """Each routing policy at the day's peak replica count: what sending a task's calls anywhere costs
    against keeping them on the replica that holds its context (apmw.capacity.routing)."""
    rows = day.get("routing_comparison") or []
    if not rows:
        return ""
    used = day["routing"]["policy"]
    body = [[r["policy"] + (" (used)" if r["policy"] == used else ""), f"{r['agents_per_replica']:,}",
             r["binding_constraint"], "-" if r["prefix_hit_rate"] is None else f"{r['prefix_hit_rate']:.1%}",
             f"{r['prefill_tokens_per_s_per_replica']:,.0f}", task_s(r["task_latency_p95_s"])]
            if r["agents_per_replica"] is not None else
            [r["policy"] + (" (used)" if r["policy"] == used else ""), "-", f"not modelled: {r['refused']}", "-", "-",
             "-"] for r in rows]
    return (f"<h3>Routing across replicas</h3><p>At the peak's {rows[0]['replicas']:,} replicas: session "
            "affinity keeps a task's calls on the replica that holds its context; least-loaded and random "
            "routing send them anywhere, so a call finds only the context its task left there (priced alike "
            "for identical replicas).</p>"
            + _table(["routing", "N* per replica", "binds", "prefix hits", "prefill tok/s per replica",
                      "task p95 s"], body))


def _source(plan: dict) -> str:
    """Where N* comes from, in words: the simulator's answer with its interval, or the analytic one."""
    if plan.get("agents_per_replica_source") != "simulated":
        return " (analytic model)"
    span = interval_text(plan["agents_per_replica_interval"], [p["agents"] for p in plan["check"]["points"]])
    ci = plan["task_latency_p95_interval_s"]
    ci_text = "" if ci[1] is None else f", task p95 95% interval {task_s(ci[0])}-{task_s(ci[1])} s"
    return (f" (settled in the simulator from {plan['completed_tasks']:,} tasks; 95% interval {span} agents"
            f"{ci_text}; the analytic model gives {plan['analytic']['agents_per_replica']:,})")


def _tpot_figure(svg: str | None) -> str:
    if svg is None:
        return "<p>No call of this workload outputs a second token, so there is no time per output token.</p>"
    return _figure(svg, 'Time per output token p95 per number of concurrent agents; dashed: the tighter of the '
                   'TPOT and output-speed SLOs where the spec sets one; red: simulated.')


def _kv_sentence(plan: dict) -> str:
    if plan.get("agents_per_replica_source") == "simulated":
        return (f"KV cache: {plan['kv_tokens_resident_mean']:,.0f} tokens resident on average (simulated) of "
                f"{plan['kv_tokens_capacity']:,.0f}; {plan['preempted_call_share']:.1%} of calls preempted.")
    return (f"KV cache {'fits' if plan['fits_kv_memory'] else 'does not fit'}: "
            f"{plan['kv_tokens_resident_p95']:,.0f} tokens at p95 of {plan['kv_tokens_capacity']:,.0f}.")


def render(title: str, plan: dict, charts: dict[str, str | None], levers: list[dict], contrast_rows: list[dict],
           spec_dict: dict, notes: list[str], command: str | None = None) -> str:
    kpis = [("agents per replica", f"{plan['agents_per_replica']:,}"),
            ("binding constraint", plan["binding_constraint"]),
            ("agents per MW", f"{plan['agents_per_mw']:,.0f}"),
            ("agents per MW (provisioned)", f"{plan['agents_per_mw_provisioned']:,.0f}"),
            ("cost per session", f"${plan['cost_per_session_usd']:,.4f}"),
            ("energy per session", energy_text(plan["energy_per_session_j"]))]
    lat = plan["task_latency_s"]
    lever_rows = [[r["lever"], r["group"], r["relaxes"], f"{r['agents_per_mw_after']:,.0f}", f"{r['gain']:.2f}x",
                   r["binding_after"] or "infeasible"] for r in levers]
    contrast_table = [[c["name"], f"{c['agents_per_mw']:,.0f}", f"{c['output_tokens_per_s_per_mw']:,.0f}",
                       f"{c['residence_s_per_output_token']:.3f}", f"{c['calls_per_task']:.1f}",
                       f"{c['tool_share']:.0%}", c["binding_constraint"]] for c in contrast_rows]
    fleet = plan.get("fleet")
    fleet_html = "" if not fleet else (
        f"<p>For {fleet['agents']:,} concurrent agents (<code>fleet.target_agents</code>): {fleet['replicas']:,} "
        f"replicas, {fleet['gpus']:,} GPUs, {fleet['facility_power_w'] / 1e6:,.2f} MW modelled facility power "
        f"({fleet['provisioned_power_w'] / 1e6:,.2f} MW provisioned).</p>")
    fleet_html += _fleet_day(plan.get("fleet_day"), charts.get("fleet_day"))
    if fleet_html:
        fleet_html = "<h2>The fleet</h2>\n" + fleet_html
    sources = _table(["figure", "source"], [[k, v] for k, v in plan["sources"].items()])
    generated = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{_CSS}</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p>{html.escape(plan['replica']['model'])} on {plan['replica']['gpus']:g} x {html.escape(gpu_text(plan['replica']))}.</p>
<p class="meta">Generated {generated} by apmw {html.escape(version('apmw'))}{'' if not command else
' with <code>' + html.escape(command) + '</code>'}.</p>
{_tiles(kpis)}

<h2>Task latency against concurrency</h2>
<p>The SLO is a p95 of the whole task. At N* = {plan['agents_per_replica']}{_source(plan)} the task takes
{task_s(lat['mean'])} s on average, p50 {task_s(lat['p50'])} s, p95 {task_s(lat['p95'])} s, p99 {task_s(lat['p99'])} s.</p>
{_figure(charts['latency'], 'Mean and p95 task latency per number of concurrent agents; dashed: the SLO; red: p95 '
         'from the iteration-level simulator with its 95% interval, at each agent count apmw plan simulated to '
         'settle N*. Where KV memory runs short, the analytic curve does not queue calls for memory or price '
         'preemptions; the simulated points show the real knee.')}
<h3>Per call: time to first token and time per output token</h3>
{_figure(charts['ttft'], 'TTFT p95 per number of concurrent agents; dashed: the TTFT SLO where the spec sets one; '
         'red: the simulated p95 at each agent count apmw plan simulated.')}
{_tpot_figure(charts['tpot'])}
<h3>SLO verdicts at N*</h3>
<p>Binding: {html.escape(binding_text(plan))}. {_kv_sentence(plan)}</p>
{_table(['SLO', 'limit', 'at N*', 'verdict'], slo_rows(plan['slo_verdict']))}

<h2>KV cache occupancy</h2>
{_figure(charts['kv'], 'Resident KV tokens (mean and p95) against the replica capacity.')}

<h2>Where a task's time goes</h2>
{_figure(charts['residence'], 'Mean seconds per task in each phase at N*.')}

<h2>What to change first</h2>
{_figure(charts['tornado'], 'Gain in agents per MW from each modelled action on this workload.')}
{_table(['lever', 'group', 'relaxes', 'agents/MW after', 'gain', 'binding after'], lever_rows)}

<h2>Why tokens per second misled</h2>
<p>agents/MW = (output tokens/s per MW) x (task seconds per output token). Workloads that emit similar
tokens/s can sustain very different numbers of agents.</p>
{_figure(charts['contrast'], 'Agents per MW against output tokens/s per MW: this workload and the bundled ones.')}
{_table(['workload', 'agents/MW', 'out tok/s per MW', 's per out token', 'calls/task', 'tool share', 'binding'],
        contrast_table)}

<h2>Cost and energy per session</h2>
{_figure(charts['cost'], 'Dollars per session: electricity and GPU time.')}
{_figure(charts['energy'], 'Energy per session: IT and facility overhead (PUE).')}
{fleet_html}

<h2>Inputs and assumptions</h2>
{sources}
<ul>{''.join(f'<li>{html.escape(n)}</li>' for n in notes)}</ul>
{_table(['input', 'value'], _inputs(spec_dict))}
<p>Attached: the spec {_attachment('spec.yaml', yaml.safe_dump(spec_dict, sort_keys=False), 'application/x-yaml')}
and every figure of this report as {_attachment('plan.json', json.dumps(plan, indent=2), 'application/json')}
(the fields of <code>apmw plan --json</code>).</p>
</body></html>
"""
