"""`apmw fleet`: a day of task demand to replicas, GPUs, megawatts and dollars, hour by hour."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from apmw.cli.common import app, emit_json, fail, note_checkpoint_dtype, note_gpu_basis, out, output_path, write_text
from apmw.errors import ApmwError
from apmw.spec import SpecError

CSV_COLUMNS = ("hour", "tasks", "concurrent_agents", "task_latency_mean_s", "replicas_needed", "replicas",
               "replicas_warming", "gpus", "gpu_hours", "agents_per_replica",
               "it_power_w", "facility_power_w", "provisioned_power_w", "gpu_cost_usd", "electricity_cost_usd",
               "routing")


def _rows(day: dict) -> list[dict]:
    """The hours as the CSV and Parquet files have them."""
    return [{c: h[c] for c in CSV_COLUMNS} for h in day["hours"]]


def _csv(day: dict) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(_rows(day))
    return buf.getvalue()


def _routing_table(d: dict) -> Table:
    rows = d["routing_comparison"]
    t = Table(title=f"routing at the peak's {rows[0]['replicas']:,} replicas (* used; N* and prefill tokens/s "
              "per replica)" if rows else "routing",
              title_justify="left")
    for col in ("routing", "N*", "bound", "prefix hits", "prefill tok/s", "task p95 s"):
        t.add_column(col, justify="right")
    for r in rows:
        mark = "*" if r["policy"] == d["routing"]["policy"] else ""
        hit = "-" if r["prefix_hit_rate"] is None else f"{r['prefix_hit_rate']:.1%}"
        t.add_row(r["policy"] + mark, f"{r['agents_per_replica']:,}", r["binding_constraint"], hit,
                  f"{r['prefill_tokens_per_s_per_replica']:,.0f}", f"{r['task_latency_p95_s']:,.0f}")
    return t


def _parquet(day: dict, path: Path) -> None:
    """The 24 hours as a Parquet table (one row an hour, the CSV's columns and types), the day's
    totals as JSON in the file's metadata under ``apmw.fleet_day``."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        fail("--parquet needs pyarrow, which is not installed: pip install 'apmw[parquet]' (or use --csv)")
    totals = {k: v for k, v in day.items() if k != "hours"}
    table = pa.Table.from_pylist(_rows(day))
    table = table.replace_schema_metadata({"apmw.fleet_day": json.dumps(totals, allow_nan=False)})
    try:
        pq.write_table(table, path)
    except OSError as exc:
        fail(f"--parquet {path}: cannot write it ({exc})")


def _table(d: dict, title: str) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("hour", "tasks", "agents", "task s", "up (needed)", "warming", "GPUs", "facility kW", "USD"):
        t.add_column(col, justify="right")
    for h in d["hours"]:
        t.add_row(f"{h['hour']:02d}", f"{h['tasks']:,.0f}", f"{h['concurrent_agents']:,.1f}",
                  f"{h['task_latency_mean_s']:,.0f}", f"{h['replicas']:,} ({h['replicas_needed']:,})",
                  f"{h['replicas_warming']:,}", f"{h['gpus']:,}",
                  f"{h['facility_power_w'] / 1e3:,.1f}", f"{h['gpu_cost_usd'] + h['electricity_cost_usd']:,.2f}")
    return t


def _summary(d: dict) -> list[str]:
    per_task = "-" if d["cost_per_task_usd"] is None else f"${d['cost_per_task_usd']:,.4f}"
    return [
        f"N* {d['agents_per_replica_max']} agents per replica, headroom {d['headroom']:.0%}, "
        f"at least {d['min_replicas']} replica(s), scale-up {d['scale_up_s']:,.0f} s, "
        f"scale-down delay {d['scale_down_delay_s']:,.0f} s",
        f"peak at hour {d['peak_hour']:02d}: {d['peak_replicas']:,} replicas, {d['peak_gpus']:,} GPUs, "
        f"{d['peak_facility_mw']:,.3f} MW facility ({d['peak_provisioned_mw']:,.3f} MW provisioned)",
        f"day: {d['tasks_per_day']:,.0f} tasks, {d['gpu_hours_per_day']:,.0f} GPU-hours, "
        f"{d['facility_mwh_per_day']:,.2f} MWh (average {d['average_facility_mw']:,.3f} MW), "
        f"${d['cost_per_day_usd']:,.2f}, {per_task} per task",
        f"month: {d['facility_mwh_per_month']:,.1f} MWh, ${d['cost_per_month_usd']:,.0f}",
        f"routing: {d['routing']['policy']}" + ("" if d["routing"]["policy"] == "affinity" else
                                                 f", N* sized at the peak's {d['routing']['replicas']:,} replicas"),
    ] + ([] if d["within_power_cap"] is None else [
        f"inside the {d['power_cap_mw']:g} MW cap: at most {d['within_power_cap']['replicas']:,} replicas, "
        f"{d['within_power_cap']['concurrent_agents']:,} agents at once, "
        f"{d['within_power_cap']['tasks_per_hour']:,.0f} tasks per hour"]) + ([] if d["api_cost_per_task_usd"] is None else [
        f"the same tasks on the API priced in the spec: ${d['api_cost_per_task_usd']:,.4f} per task, "
        f"${d['api_cost_per_day_usd']:,.2f} a day"])


@app.command()
def fleet(
    spec: Path = typer.Argument(..., help="YAML spec with fleet.tasks_per_hour (24 values)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object (fields in docs/fleet.md)"),
    csv_out: Optional[Path] = typer.Option(None, "--csv", help="also write the 24 hours to this CSV file"),
    parquet_out: Optional[Path] = typer.Option(None, "--parquet",
                                               help="also write the 24 hours to this Parquet file (totals in its "
                                                    "metadata; needs pyarrow)"),
) -> None:
    """Size the fleet for a day of demand: replicas, GPUs, MW and dollars each hour, with day and month totals."""
    from apmw.capacity import InfeasibleError, plan
    from apmw.capacity.fleet_day import fleet_day
    from apmw.spec import load_spec

    if csv_out is not None:
        output_path(csv_out, "--csv")
    if parquet_out is not None:
        output_path(parquet_out, "--parquet")
    try:
        s = load_spec(spec)
        note_checkpoint_dtype(s.model.config, s.model.weight_dtype)
        note_gpu_basis(s.hardware.gpu)
        day = fleet_day(plan(s)).to_dict()
    except InfeasibleError as exc:
        fail(str(exc), exc.exit_code)
    except (ApmwError, SpecError) as exc:
        fail(str(exc))
    if csv_out is not None:
        write_text(csv_out, _csv(day), "--csv")
    if parquet_out is not None:
        _parquet(day, parquet_out)
    if as_json:
        emit_json(day)
    else:
        out.print(_table(day, f"apmw fleet: {spec}"))
        if day["routing_comparison"]:
            out.print(_routing_table(day))
        for line in _summary(day):
            out.print(line, highlight=False, markup=False)
    over = day["hours_over_power_cap"]
    if over:
        need = day["peak_provisioned_mw"]
        fail(f"the fleet does not fit fleet.power_cap_mw {day['power_cap_mw']:g} MW in hour(s) "
             f"{', '.join(f'{h:02d}' for h in over)}: its peak needs {need:,.3f} MW provisioned. Needed: a cap of "
             f"{need:,.3f} MW, or at most {day['within_power_cap']['tasks_per_hour']:,.0f} tasks per hour, or a "
             "replica that does more per MW (apmw levers)", code=2)
