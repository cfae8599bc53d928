"""The rich live view of a running bench: agents in calls and in tools, rates, p95 so far, errors."""

from __future__ import annotations

import time

from rich.table import Table

from apmw.loadgen.runner import LiveStats


def live_table(s: LiveStats) -> Table:
    elapsed = max(time.monotonic() - s.started, 1e-9)
    p95 = s.p95(s.task_latencies)
    ttft = s.p95(s.ttfts)
    t = Table(title=f"apmw bench: {s.agents} agents, {s.phase}", show_header=False, title_justify="left")
    t.add_column("", style="bold")
    t.add_column("")
    t.add_row("elapsed", f"{elapsed:,.0f} s")
    t.add_row("agents", f"{s.in_call} in a call, {s.in_tool} in a tool wait")
    t.add_row("calls", f"{s.calls:,} ({s.calls / elapsed:,.1f}/s)")
    t.add_row("tasks completed", f"{s.tasks:,}")
    t.add_row("task latency p95 so far", "-" if p95 is None else f"{p95:,.2f} s")
    t.add_row("TTFT p95 so far", "-" if ttft is None else f"{ttft * 1e3:,.0f} ms")
    t.add_row("errors", f"[red]{s.errors:,}[/]" if s.errors else "0")
    return t
