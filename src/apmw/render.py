"""Rich tables for people. Reads only the JSON-ready dicts the verbs produce."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from apmw.capacity.economics import energy_text
from apmw.capacity.plan import gpu_text
from apmw.capacity.slo import SLO_LABELS, binding_text, seconds_text, task_s
from apmw.sim.checked import interval_text


def _si(value: float, unit: str) -> str:
    for factor, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:,.2f} {prefix}{unit}"
    return f"{value:,.2f} {unit}"


# How the tables name each SLO (apmw.capacity.slo names).
def slo_line(verdict: dict) -> str:
    """Each SLO the spec sets, its figure and whether it holds: "task p95 1,073 s <= 1,800 s met"."""
    parts = []
    for name, v in verdict.items():
        word = "[green]met[/]" if v["met"] else "[bold red]MISSED[/]"
        if name == "output_speed":      # tokens/s per agent at the p95 time per output token
            speed = "not measured" if v["value_s"] is None else f"{1 / v['value_s']:,.1f}"
            parts.append(f"{SLO_LABELS[name]} {speed} {'>=' if v['met'] else '<'} {1 / v['limit_s']:,.1f} "
                         f"tokens/s {word}")
            continue
        sign = "<=" if v["met"] else ">"
        parts.append(f"{SLO_LABELS[name]} {seconds_text(v['value_s'])} {sign} {seconds_text(v['limit_s'])} {word}")
    return "; ".join(parts)


def replica_text(rep: dict) -> str:
    """'DeepSeek-V3 on 8 x H200 (TP1 x DP8, EP8)'; under disaggregation the decode worker and its share of
    the prefill workers ('... decode, + 2 x H200 prefill: 3 prefill workers of TP4 for 2 decode workers')."""
    layout = rep.get("layout") or {}
    laid = f" ({layout['text']})" if layout and layout["text"] != f"TP{layout['gpus']}" else ""
    text = f"{rep['model']} on {rep['decode_gpus']:g} x {gpu_text(rep)}{laid}"
    d = rep.get("disaggregation")
    if d:
        text += (f" decode, + {rep['prefill_gpus']:g} x {gpu_text(rep)} prefill: {d['prefill_workers']} prefill "
                 f"worker{'s' if d['prefill_workers'] > 1 else ''} of {d['prefill_layout']} for "
                 f"{d['decode_workers']} decode worker{'s' if d['decode_workers'] > 1 else ''}")
    return text


def plan_table(console: Console, p: dict, title: str) -> None:
    lat, br, tok, rep = p["task_latency_s"], p["residence_breakdown_s"], p["tokens_per_s"], p["replica"]
    simulated = p.get("agents_per_replica_source") == "simulated"
    t = Table(title=f"apmw plan: {title}", show_header=False, title_justify="left")
    t.add_column("", style="bold")
    t.add_column("")
    t.add_row("replica", replica_text(rep))
    t.add_row("agents per replica", f"{p['agents_per_replica']:,}  (binding: {binding_text(p)})" + _source_text(p))
    t.add_row("SLO", slo_line(p["slo_verdict"]))
    if p.get("slo_sensitivity"):
        t.add_row("N* as the SLO moves", sensitivity_text(p["slo_sensitivity"]))
    ci = p.get("task_latency_p95_interval_s")
    t.add_row("task latency", f"mean {task_s(lat['mean'])} s, p50 {task_s(lat['p50'])} s, p95 {task_s(lat['p95'])} s"
              + ("" if not ci else (f" (95% CI {task_s(ci[0])}-{task_s(ci[1])}" if ci[1] is not None else
                                    " (too few tasks for a 95% CI")
                 + f", {p['completed_tasks']:,} simulated tasks)")
              + f", p99 {task_s(lat['p99'])} s")
    t.add_row("residence per task" + (" (analytic)" if simulated else ""), ", ".join(f"{k} {v:,.1f} s" for k, v in br.items() if v > 0))
    t.add_row("per call", f"TTFT p95 {seconds_text(p['ttft_p95_s'])}, time per output token "
              f"{seconds_text(p['time_per_output_token_s'])} (p95 {seconds_text(p['tpot_p95_s'])})")
    t.add_row("decode batch", f"{p['decode_batch_mean']:,.1f} mean  (engine busy {p['engine_utilisation']:.0%})")
    if simulated:       # the simulator allocates blocks: a pool that runs short preempts, at a latency cost
        t.add_row("KV resident", f"{p['kv_tokens_resident_mean']:,.0f} tokens mean (simulated) of "
                  f"{p['kv_tokens_capacity']:,.0f} ({p['kv_bytes_per_token']:,.0f} B/token); "
                  f"{p['preempted_call_share']:.1%} of calls preempted")
    else:
        t.add_row("KV resident", f"{p['kv_tokens_resident_mean']:,.0f} tokens mean, {p['kv_tokens_resident_p95']:,.0f} "
                  f"p95 of {p['kv_tokens_capacity']:,.0f} ({p['kv_bytes_per_token']:,.0f} B/token), "
                  + ("fits" if p["fits_kv_memory"] else "[bold red]DOES NOT FIT[/]")
                  + (f"; demand exceeds it {share:.1%} of the time (those calls re-prefill their context)"
                     if (share := p.get("kv_overflow_share")) and share >= 0.0005 else ""))
    if p.get("draft_weight_bytes"):
        t.add_row("draft", f"{p['draft_weight_bytes'] / 1e9:,.1f} GB of weights, {p['draft_kv_bytes'] / 1e9:,.1f} GB "
                  "of KV (its own cache, as many tokens as the model's; in the pool under vLLM and TensorRT-LLM, "
                  "outside SGLang's memory share)")
    t.add_row("tokens/s", f"output {tok['output']:,.0f}, input {tok['input']:,.0f} (prefilled {tok['prefill']:,.0f})")
    t.add_row("replica power", f"{_si(rep['power_w'], 'W')} IT, {_si(rep['facility_power_w'], 'W')} facility, "
              f"{_si(rep['provisioned_power_w'], 'W')} provisioned")
    valid = p["meets_slo"] and (simulated or p["fits_kv_memory"])
    t.add_row("agents per MW", f"[bold {'green' if valid else 'red'}]{p['agents_per_mw']:,.0f}[/] modelled, "
              f"{p['agents_per_mw_provisioned']:,.0f} provisioned" + ("" if valid else "  (not a valid operating point)"))
    t.add_row("per session", f"{energy_text(p['energy_per_session_j'])} IT energy, "
              f"${p['cost_per_session_usd']:,.4f} (electricity ${p['cost_breakdown_usd']['electricity']:,.4f}, "
              f"GPU time ${p['cost_breakdown_usd']['gpu_time']:,.4f})")
    f = p.get("fleet")
    if f:
        t.add_row("fleet", f"{f['agents']:,} agents: {f['replicas']:,} replicas, {f['gpus']:,} GPUs, "
                  f"{_si(f['facility_power_w'], 'W')} facility ({_si(f['provisioned_power_w'], 'W')} provisioned)")
    console.print(t)
    if not valid:
        console.print(f"[bold red]not a valid operating point:[/] at {p['agents_per_replica']:,} agents the replica "
                      + ("misses the SLO" if not p["meets_slo"] else "")
                      + (" and " if not p["meets_slo"] and not p["fits_kv_memory"] else "")
                      + ("does not fit its KV in memory" if not p["fits_kv_memory"] else "")
                      + f"; N* is {p['agents_per_replica_max']:,}")
    for note in p.get("warnings", []):
        console.print(f"[yellow]warning:[/] {note}")


def sensitivity_text(points: list[dict]) -> str:
    """N* at each SLO scale (analytic), and where the KV memory rather than the SLO stops it."""
    kv = [f"{q['slo_scale']:.1f}x" for q in points if q["stopped_by"] == "kv_memory"]
    return ("SLO " + ", ".join(f"{q['slo_scale']:.1f}x: {q['agents_per_replica']:,}" for q in points) + " (analytic)"
            + (f"; the KV memory stops it at {', '.join(kv)}" if kv else ""))


def _source_text(p: dict) -> str:
    """Where N* came from: the simulator (with its interval and the analytic answer) or the analytic model."""
    if p.get("agents_per_replica_source") != "simulated":
        return ""
    span = interval_text(p["agents_per_replica_interval"], [q["agents"] for q in p["check"]["points"]])
    return f"; simulated, 95% interval {span}; analytic {p['analytic']['agents_per_replica']:,}"


def _with_interval(p95_s: float | None, interval_s: list) -> str:
    """A simulated p95 and its 95 % interval in the p95's unit: "4.8 s (2.1-7.5)", "33.8 ms (18.4-49.2)";
    "(too few calls)" where none brackets it."""
    if p95_s is None:
        return seconds_text(None)
    lo, hi = interval_s
    return f"{seconds_text(p95_s)} (too few calls)" if hi is None else seconds_text(p95_s, (lo, hi))


def check_table(console: Console, p: dict) -> None:
    """The agent counts simulated to settle N*: pooled tasks, p95 with its interval, verdict, preemptions."""
    c = p["check"]
    t = Table(title=f"N* checked in the simulator: up to {c['replications']} seeded runs per count, "
                    f"about {c['tasks_per_point']:,} tasks, {c['calls_per_point']:,}+ calls in all",
              title_justify="left")
    for col in ("agents", "tasks", "task p95 s (95% CI)", "TTFT p95 (95% CI)", "per token p95 (95% CI)",
                "preempted calls", "SLO"):
        t.add_column(col, justify="right" if col != "SLO" else "left", overflow="fold")
    for q in c["points"]:
        lo, hi = q["task_latency_p95_interval_s"]
        p95 = q["task_latency_s"]["p95"]
        ci = "" if p95 is None else (" (too few tasks)" if hi is None else f" ({task_s(lo)}-{task_s(hi)})")
        t.add_row(f"{q['agents']:,}", f"{q['completed_tasks']:,}", ("n/a" if p95 is None else task_s(p95)) + ci,
                  _with_interval(q["ttft_p95_s"], q["ttft_p95_interval_s"]),
                  _with_interval(q["tpot_p95_s"], q["tpot_p95_interval_s"]), f"{q['preempted_call_share']:.1%}",
                  "met" if q["meets_slo"] else "[red]MISSED[/]")
    console.print(t)


def verify_table(console: Console, v: dict) -> None:
    t = Table(title=f"--verify: simulated {v['simulated_s']:,.0f} s at {v['agents']:,} agents "
                    f"({v['completed_tasks']:,} tasks)", title_justify="left")
    for col in ("task latency", "analytic s", "simulated s", "ratio"):
        t.add_column(col, justify="left" if col == "task latency" else "right")
    a, s, r = v["task_latency_s"]["analytic"], v["task_latency_s"]["simulated"], v["simulated_over_analytic"]
    ci = v.get("simulated_task_latency_p95_interval_s")
    for k in ("mean", "p50", "p95", "p99"):
        sim = "n/a" if s[k] is None else task_s(s[k])
        if k == "p95" and ci:
            sim += f" (95% CI {task_s(ci[0])}-{task_s(ci[1])})"
        t.add_row(k, task_s(a[k]), sim, "n/a" if r[k] is None else f"{r[k]:.2f}")
    console.print(t)
    console.print(f"decode batch {v['decode_batch_mean']['analytic']:.1f} analytic vs "
                  f"{v['decode_batch_mean']['simulated']:.1f} simulated; preemptions {v['preemptions']:,}; "
                  f"prefix hit rate {v['prefix_hit_rate']:.1%}; simulated SLO "
                  f"{'met' if v['simulated_meets_slo'] else '[red]missed[/]: ' + missed_slos(v['simulated_slo_verdict'])}")


def missed_slos(verdict: dict) -> str:
    """The SLOs a verdict (apmw.capacity.slo.slo_table) misses, each with its figure and limit."""
    return "; ".join(f"{name} {seconds_text(x['value_s'])} > {seconds_text(x['limit_s'])}"
                     for name, x in verdict.items() if not x["met"])
