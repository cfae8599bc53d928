"""`apmw fleet`: a day of task demand to replicas, GPUs, megawatts and dollars, hour by hour."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from collections.abc import Callable
from typing import Optional

import typer
from rich.table import Table

from apmw.cli.common import (app, distinct_outputs, emit_json, fail, file_path, files_read_by, note_checkpoint_dtype, note_gpu_basis,
                             out, output_path, plain_row, plain_table, print_table, write_text)
from apmw.errors import ApmwError
from apmw.spec import SpecError
from apmw.spec.economics import MAX_TASKS_PER_HOUR

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
    t = plain_table(f"routing at the peak's {rows[0]['replicas']:,} replicas (* used; N* and prefill tokens/s "
              "per replica)" if rows else "routing",
              title_justify="left")
    for col in ("routing", "N*", "bound", "prefix hits", "prefill tok/s", "task p95 s"):
        t.add_column(col, justify="right")
    for r in rows:
        mark = "*" if r["policy"] == d["routing"]["policy"] else ""
        if r["agents_per_replica"] is None:      # the policy cannot serve this spec: say why
            plain_row(t, r["policy"] + mark, "-", f"not modelled: {r['refused']}", "-", "-", "-")
            continue
        hit = "-" if r["prefix_hit_rate"] is None else f"{r['prefix_hit_rate']:.1%}"
        plain_row(t, r["policy"] + mark, f"{r['agents_per_replica']:,}", r["binding_constraint"], hit,
                  f"{r['prefill_tokens_per_s_per_replica']:,.0f}", f"{r['task_latency_p95_s']:,.0f}")
    return t


def _parquet(day: dict, path: Path) -> None:
    """The hours (24, or 168 for a week) as a Parquet table (one row an hour, the CSV's columns and types), the
    day's totals as JSON in the file's metadata under ``apmw.fleet_day``."""
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
    from apmw.capacity.fleet_day import hour_label

    t = plain_table(title, title_justify="left")
    sim = d.get("simulated")
    cols = ("hour", "tasks", "agents", "task s", "up (needed)", "warming", "GPUs", "facility kW", "USD")
    for col in cols + (("sim up", "sim kW", "sim p95 s", "sim queued") if sim else ()):
        t.add_column(col, justify="right")
    for i, h in enumerate(d["hours"]):
        row = [hour_label(h["hour"], len(d["hours"])), f"{h['tasks']:,.0f}", f"{h['concurrent_agents']:,.1f}",
               f"{h['task_latency_mean_s']:,.0f}", f"{h['replicas']:,} ({h['replicas_needed']:,})",
               f"{h['replicas_warming']:,}", f"{h['gpus']:,}",
               f"{h['facility_power_w'] / 1e3:,.1f}", f"{h['gpu_cost_usd'] + h['electricity_cost_usd']:,.2f}"]
        if sim:
            s = sim["hours"][i]
            p95 = "-" if s["task_latency_p95_s"] is None else f"{s['task_latency_p95_s']:,.0f}"
            row += [f"{s['replica_hours']:,.1f}", f"{s['facility_energy_kwh']:,.1f}", p95, f"{s['tasks_queued']:,}"]
        plain_row(t, *row)
    return t


def _sim_summary(d: dict) -> list[str]:
    """The simulated day beside the analytic one."""
    s = d["simulated"]
    rel = lambda a, b: f"{(a - b) / b:+.1%}" if b else "-"  # noqa: E731
    ci = s["interval_95"]
    band = lambda k, f: "" if not ci or ci[k] is None else f" (95 % {f.format(ci[k][0])}-{f.format(ci[k][1])})"  # noqa: E731
    replica_h = d["gpu_hours_per_day"] / s["gpus_per_replica"]
    return [
        f"simulated day (seed {s['seed']}, {s['replications']} replication(s), {s['cells']} cell(s)): "
        f"{s['tasks_per_day']:,} tasks, "
        f"{s['replica_hours_per_day']:,.1f} replica-hours{band('replica_hours_per_day', '{:,.1f}')} against "
        f"{replica_h:,.1f} analytic ({rel(s['replica_hours_per_day'], replica_h)}), "
        f"{s['facility_mwh_per_day']:,.3f} MWh{band('facility_mwh_per_day', '{:,.3f}')} against "
        f"{d['facility_mwh_per_day']:,.3f} ({rel(s['facility_mwh_per_day'], d['facility_mwh_per_day'])}), "
        f"${s['cost_per_day_usd']:,.2f} a day",
        _simulated_tasks(s),
    ]


def _simulated_tasks(s: dict) -> str:
    """The simulated tasks' latency and admission, or that none finished in the measured day (JSON: null)."""
    if s["task_latency_p95_s"] is None:
        return ("simulated tasks: none finished in the simulated day, so no task latency was measured (JSON: null); "
                "a day with more tasks (fleet.tasks_per_hour) gives one")
    return (f"simulated tasks: p95 {s['task_latency_p95_s']:,.0f} s, mean {s['task_latency_mean_s']:,.0f} s; "
            f"{s['tasks_queued']:,} queued at admission (mean wait {s['admission_wait_mean_s']:,.0f} s)")


def _owned(o: dict | None) -> list[str]:
    """The owned fleet's month beside the billed one (cost.capex)."""
    if o is None:
        return []
    per_task = "-" if o["cost_per_task_usd"] is None else f"${o['cost_per_task_usd']:,.4f}"
    return [f"owned instead (cost.capex): {o['gpus']:,.0f} GPUs bought at ${o['usd_per_gpu']:,.0f} each "
            f"(${o['capex_usd']:,.0f}) over {o['years']:g} years = ${o['capex_per_month_usd']:,.0f} a month "
            f"(${o['gpu_hour_usd']:,.2f} per GPU-hour, busy or not) + electricity ${o['electricity_per_month_usd']:,.0f}: "
            f"${o['cost_per_month_usd']:,.0f} a month, {per_task} per task"]


def _count(x: float) -> str:
    """A count of tasks as read: whole from 100 up, three significant figures below (a day of 0.4 tasks, priced per
    task, is not '0 tasks')."""
    return f"{x:,.0f}" if x >= 100 or x == 0 else f"{x:.3g}"


def _summary(d: dict) -> list[str]:
    per_task = "-" if d["cost_per_task_usd"] is None else f"${d['cost_per_task_usd']:,.4f}"
    return [
        f"N* {d['agents_per_replica_max']} agents per replica, headroom {d['headroom']:.0%}, "
        f"at least {d['min_replicas']:,} replica(s), scale-up {d['scale_up_s']:,.0f} s, "
        f"scale-down delay {d['scale_down_delay_s']:,.0f} s",
        f"peak at hour {d['peak_hour_label']}: {d['peak_replicas']:,} replicas, {d['peak_gpus']:,} GPUs, "
        f"{d['peak_facility_mw']:,.3f} MW facility ({d['peak_provisioned_mw']:,.3f} MW provisioned)",
        f"day: {_count(d['tasks_per_day'])} tasks, {d['gpu_hours_per_day']:,.0f} GPU-hours, "
        f"{d['facility_mwh_per_day']:,.2f} MWh (average {d['average_facility_mw']:,.3f} MW), "
        f"${d['cost_per_day_usd']:,.2f}, {per_task} per task",
        f"month: {d['facility_mwh_per_month']:,.1f} MWh, ${d['cost_per_month_usd']:,.0f}",
    ] + _owned(d.get("owned")) + [
        f"routing: {d['routing']['policy']}" + ("" if d["routing"]["policy"] == "affinity" else
                                                 f", N* sized at the peak's {d['routing']['replicas']:,} replicas"),
    ] + ([] if d["within_power_cap"] is None else [
        f"inside the {d['power_cap_mw']:g} MW cap: at most {d['within_power_cap']['replicas']:,} replicas, "
        f"{d['within_power_cap']['concurrent_agents']:,.0f} agents at once, "
        f"{d['within_power_cap']['tasks_per_hour']:,.0f} tasks per hour"]) + ([] if d["api_cost_per_task_usd"] is None else [
        f"the same tasks on the API priced in the spec: ${d['api_cost_per_task_usd']:,.4f} per task, "
        f"${d['api_cost_per_day_usd']:,.2f} a day"])


@app.command()
def fleet(
    spec: Path = typer.Argument(..., help="YAML spec with fleet.tasks_per_hour (24 values: a day; or 168: a week "
                                          "from Monday), or a fleet file of several workloads and hardware "
                                          "candidates (docs/fleet.md, 'Mixed fleets')"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object (fields in docs/fleet.md)"),
    csv_out: Optional[Path] = typer.Option(None, "--csv", parser=file_path,
                                           help="also write the hours (24, or 168 for a week) to this CSV file"),
    parquet_out: Optional[Path] = typer.Option(None, "--parquet", parser=file_path,
                                               help="also write the hours (24, or 168) to this Parquet file (totals "
                                                    "in its metadata; needs pyarrow)"),
    simulate: bool = typer.Option(False, "--simulate", help="also simulate the day task by task (docs/fleet.md, "
                                                             "'Simulating the day') and show it beside the analytic day"),
    replicas_scale: float = typer.Option(1.0, "--replicas-scale",
                                         help="multiply fleet.tasks_per_hour by this (a fleet K times as big)"),
    workers: int = typer.Option(1, "--workers", help="--simulate: processes of the local pool running the cells"),
    ray_address: Optional[str] = typer.Option(None, "--ray", help="--simulate: run the cells on this Ray cluster "
                                                                 "(auto, host:port or ray://host:port)"),
    seed: Optional[int] = typer.Option(None, "--seed", min=0, max=2**63 - 1, help="--simulate: seed of the simulated day (default: the "
                                                            "spec's seed)"),
    replications: int = typer.Option(1, "--replications", help="--simulate: independent days (2 or more give a 95 % "
                                                               "interval on the day's totals)"),
    cells: Optional[int] = typer.Option(None, "--cells", help="--simulate: independent cells of replicas (default: "
                                                              "one per 100 replicas at the analytic peak)"),
) -> None:
    """Size the fleet for a day of demand: replicas, GPUs, MW and dollars each hour, with day and month totals.

    Given a fleet file (a top-level 'workloads' list: docs/fleet.md, 'Mixed fleets'), compare placements of
    several workloads on pools and GPU types instead."""
    from apmw.capacity import InfeasibleError, plan
    from apmw.capacity.fleet_day import fleet_day
    from apmw.spec import load_spec

    if csv_out is not None:
        output_path(csv_out, "--csv", inputs=[spec, *files_read_by(spec)])
    if parquet_out is not None:
        output_path(parquet_out, "--parquet", inputs=[spec, *files_read_by(spec)], put_in_place=True)
    distinct_outputs({"--csv": csv_out, "--parquet": parquet_out}, json_on_stdout=as_json)
    simulation_only = [flag for flag, on in (("--workers", workers != 1), ("--ray", ray_address is not None),
                                             ("--seed", seed is not None), ("--replications", replications != 1),
                                             ("--cells", cells is not None)) if on]
    if workers != 1 and ray_address is not None:
        fail(f"--workers {workers} and --ray {ray_address} both given: --workers sizes the process pool on this "
             "machine, --ray runs the cells on the Ray cluster's workers instead; give one")
    if not spec.is_file():
        fail(f"{spec}: {'is a directory' if spec.is_dir() else 'no such file' if not spec.exists() else 'not a file'}: "
             "give one workload's spec (e.g. examples/coding-agent.yaml) or a fleet file (examples/fleets/)")
    if _is_fleet_file(spec):
        given = [flag for flag, on in (("--simulate", simulate), ("--replicas-scale", replicas_scale != 1.0)) if on]
        given += simulation_only
        if given:
            fail(f"{', '.join(given)}: not for a fleet file (mixed fleets are sized analytically); run apmw fleet "
                 "on one workload's spec to simulate its day")
        _mixed(spec, as_json, csv_out, parquet_out)
        return
    if simulation_only and not simulate:
        one = len(simulation_only) == 1
        fail(f"{', '.join(simulation_only)}: appl{'ies' if one else 'y'} only with --simulate (how the day is "
             f"simulated); add --simulate, or leave {'it' if one else 'them'} out")
    try:
        s = load_spec(spec)
        note_checkpoint_dtype(s.model.config, s.model.weight_dtype, s.model.moe_dtype)
        note_gpu_basis(s.hardware.gpu)
        s = _scaled(s, replicas_scale)
        result = plan(s)
        day = fleet_day(result).to_dict()
        day["replicas_scale"] = replicas_scale
        if simulate:
            day["simulated"] = _simulated(result, day, workers, ray_address,
                                          s.seed if seed is None else seed, replications, cells)
    except InfeasibleError as exc:
        fail(str(exc), exc.exit_code)
    except (ApmwError, SpecError) as exc:
        fail(str(exc))
    _emit(day, csv_out, parquet_out, as_json, _csv, _parquet, lambda: [
        _table(day, f"apmw fleet: {spec}"), *([_routing_table(day)] if day["routing_comparison"] else []),
        *_summary(day), *(_sim_summary(day) if simulate else [])])
    over = day["hours_over_power_cap"]
    if over:
        from apmw.capacity.fleet_day import hour_label

        need = day["peak_provisioned_mw"]
        fits = day["within_power_cap"]
        one_mw = max(h["provisioned_power_w"] / h["replicas"] for h in day["hours"] if h["replicas"]) / 1e6
        if fits["replicas"] == 0:
            less = f" (the cap holds no replica: one needs {one_mw:,.3f} MW provisioned)"
        elif fits["replicas"] < day["min_replicas"]:
            less = f", or fleet.min_replicas of at most {fits['replicas']} (it is {day['min_replicas']})"
        else:
            less = f", or at most {fits['tasks_per_hour']:,.0f} tasks per hour"
        fail(f"the fleet does not fit fleet.power_cap_mw {day['power_cap_mw']:g} MW in hour(s) "
             f"{', '.join(hour_label(h, day['period_hours']) for h in over)}: its peak needs {need:,.3f} MW provisioned. Needed: a cap of "
             f"{need:,.3f} MW{less}, or a replica that does more per MW (apmw levers)", code=2)


def _emit(d: dict, csv_out: Path | None, parquet_out: Path | None, as_json: bool, csv_text: Callable[[dict], str],
          parquet: Callable[[dict, Path], None], printed: Callable[[], list]) -> None:
    """Both forms' outputs: the rows to --csv and --parquet, then the JSON, or the tables and lines ``printed``."""
    if csv_out is not None:
        write_text(csv_out, csv_text(d), "--csv")
    if parquet_out is not None:
        parquet(d, parquet_out)
    if as_json:
        emit_json(d)
        return
    for item in printed():
        if isinstance(item, str):
            out.print(item, highlight=False, markup=False)
        else:
            print_table(item)


def _scaled(s, scale: float):
    """The spec with its day's demand times ``scale`` (``--replicas-scale``)."""
    if not (scale > 0 and scale < float("inf")):
        raise ApmwError(f"--replicas-scale must be a positive number, got {scale}")
    if scale == 1.0 or s.fleet.tasks_per_hour is None:
        return s
    scaled = [t * scale for t in s.fleet.tasks_per_hour]
    if max(scaled) > MAX_TASKS_PER_HOUR:
        raise ApmwError(f"--replicas-scale {scale:g} makes the busiest hour {max(scaled):.3g} tasks; an hour starts at "
                        f"most {MAX_TASKS_PER_HOUR:,.0f} tasks: use a scale of at most "
                        f"{MAX_TASKS_PER_HOUR / max(s.fleet.tasks_per_hour):.3g}")
    return s.model_copy(update={"fleet": s.fleet.model_copy(update={"tasks_per_hour": scaled})})


# Independent simulated days at most (--replications): each is a whole day, task by task.
MAX_REPLICATIONS = 100
# Tasks simulated at most in one --simulate (the day's tasks x replications), and the simulator's pace: the bundled
# coding agent's day of 40,000 tasks in 0.4 s on one core (`apmw fleet examples/coding-agent.yaml --simulate
# --workers 1`, 2026-12-06), so the limit is about 17 core-minutes.
MAX_SIMULATED_TASKS = 100_000_000
SIMULATED_TASKS_PER_CORE_S = 100_000


def _simulated(result, day: dict, workers: int, ray_address: Optional[str], seed: int, replications: int,
               cells: Optional[int]) -> dict:
    """The day simulated task by task (:mod:`apmw.sim.fleet_day`), its cells on the executor of apmw search."""
    import time

    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

    from apmw.capacity.closed_loop import ClosedLoopModel
    from apmw.cli.common import err, progress_bar, say
    from apmw.design_search.executor import execute
    from apmw.sim.fleet_day import cells_for, replica_table, simulate_cells, simulate_day
    from apmw.sim.run import unsupported

    gap = unsupported(result.spec)
    if gap:         # simulated anyway, the day would drop the feature: a wrong answer
        raise ApmwError(f"--simulate: the simulator does not model {gap}; leave --simulate out for the analytic "
                        "day")
    if workers < 1:
        raise ApmwError(f"--workers must be at least 1, got {workers}")
    if cells is not None and cells < 1:
        raise ApmwError(f"--cells must be at least 1, got {cells}")
    if cells is not None and cells > max(day["peak_replicas"], 1):
        raise ApmwError(f"--cells {cells}: the day's analytic peak is {day['peak_replicas']:,} replica(s) and each cell "
                        f"keeps at least one up, so more cells than that price replicas the day does not need: give at "
                        f"most {max(day['peak_replicas'], 1):,}")
    if replications < 1:
        raise ApmwError(f"--replications must be at least 1 (one simulated day), got {replications}")
    if replications > MAX_REPLICATIONS:
        raise ApmwError(f"--replications {replications}: at most {MAX_REPLICATIONS} days are simulated (each a whole day, "
                        "task by task; 30 already put the 95 % interval within 5 % of its limit)")
    tasks = day["tasks_per_day"] * replications
    if tasks > MAX_SIMULATED_TASKS:
        hours = tasks / SIMULATED_TASKS_PER_CORE_S / 3600
        raise ApmwError(f"--simulate: {replications} day(s) of {day['tasks_per_day']:,.0f} tasks is {tasks:,.0f} tasks "
                        f"to simulate one by one, about {hours:,.1f} core-hours at the simulator's pace (some "
                        f"{SIMULATED_TASKS_PER_CORE_S:,} tasks a second a core); at most {MAX_SIMULATED_TASKS:,} are "
                        "simulated: simulate a scaled day (--replicas-scale) or "
                        "fewer --replications, or leave --simulate out for the analytic day")
    table = replica_table(result, ClosedLoopModel(result.spec, result.replica, result.sample))
    n_cells = cells_for(day["peak_replicas"]) if cells is None else cells
    start = time.perf_counter()
    with progress_bar(TextColumn("simulating the day"), BarColumn(), TextColumn("{task.completed}/{task.total} cells"),
                      TimeElapsedColumn(), console=err) as bar:
        task = bar.add_task("simulate", total=replications * n_cells)

        def run(base: dict, todo: list) -> list:
            batches = []
            for rows in execute(base, todo, workers, ray_address, fn=simulate_cells):
                batches.append(rows)
                bar.advance(task, len(rows))
            return batches

        sim = simulate_day(table, seed=seed, replications=replications, cells=n_cells, run=run)
    say(f"simulated {replications * n_cells} cell-day(s) in {time.perf_counter() - start:,.1f} s")
    sim["gpus_per_replica"] = table["gpus_per_replica"]
    return sim


# The mixed form (a fleet file): one row per pool and hour in --csv and --parquet.
MIX_CSV_COLUMNS = ("pool", "hardware", "hour", "agents_per_replica_max") + CSV_COLUMNS[1:]


def _is_fleet_file(path: Path) -> bool:
    """Whether ``path`` is a fleet file (a spec, or a missing file: not; apmw fleet then reports it as it reports a
    spec). A file that is not readable YAML is refused here as either kind: which it was meant to be is not known."""
    from apmw.spec.fleet_file import is_fleet_file
    from apmw.spec.load import load_yaml

    try:
        return is_fleet_file(load_yaml(path, "spec or fleet file"))
    except SpecError as exc:
        fail(str(SpecError(exc.path, exc.problems, "spec or fleet file")))
    except OSError:
        return False


def _mix_rows(d: dict) -> list[dict]:
    return [{"pool": p["name"], "hardware": p["hardware"]} | {c: h[c] for c in MIX_CSV_COLUMNS[2:]}
            for p in d["pools"] if p["refused"] is None for h in p["hours"]]


def _mix_csv(d: dict) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=MIX_CSV_COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(_mix_rows(d))
    return buf.getvalue()


def _mix_parquet(d: dict, path: Path) -> None:
    """One row per served pool and hour (the CSV's columns), everything else as JSON in the metadata under
    ``apmw.fleet_mix`` (the pools without their hours)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        fail("--parquet needs pyarrow, which is not installed: pip install 'apmw[parquet]' (or use --csv)")
    meta = dict(d, pools=[{k: v for k, v in p.items() if k != "hours"} for p in d["pools"]])
    table = pa.Table.from_pylist(_mix_rows(d), schema=pa.schema(
        [(c, pa.string() if c in ("pool", "hardware", "routing") else
          pa.int64() if c in ("hour", "agents_per_replica_max", "replicas_needed", "replicas", "replicas_warming")
          else pa.float64()) for c in MIX_CSV_COLUMNS]))
    table = table.replace_schema_metadata({"apmw.fleet_mix": json.dumps(meta, allow_nan=False)})
    try:
        pq.write_table(table, path)
    except OSError as exc:
        fail(f"--parquet {path}: cannot write it ({exc})")


def _money(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"${x:,.{digits}f}"


def _placements_table(d: dict) -> Table:
    t = plain_table("placements: GPUs at each pool's peak and at once, a day's replica-hours, MWh and $, a month's $, "
              f"the secured GPUs a month (* cheapest a month{'' if d['power_cap_mw'] is None else ' inside the cap'})",
              title_justify="left")
    for col in ("placement", "pools", "peak GPUs", "at once", "replica-h", "MWh", "$/day", "$/month", "$/task",
                "secured $/mo"):
        t.add_column(col, justify="left" if col in ("placement", "pools") else "right",
                     overflow="fold" if col in ("placement", "pools") else "ellipsis")
    refused = {p["name"] for p in d["pools"] if p["refused"] is not None}
    for r in d["placements"]:
        mark = "*" if r["placement"] == d["cheapest_placement"] else ""
        if r["refused"] is not None:      # the reasons once, in the pools table
            plain_row(t, r["placement"], "refused: pool " + ", ".join(q for q in r["pools"] if q in refused),
                      *["-"] * 8)
            continue
        over = " (over cap)" if r["within_power_cap"] is False else ""
        plain_row(t, r["placement"] + mark + over, "\n".join(r["pools"]), f"{r['peak_gpus']:,.0f}",
                  f"{r['coincident_peak_gpus']:,.0f}", f"{r['replica_hours_per_day']:,.0f}",
                  f"{r['facility_mwh_per_day']:,.2f}", _money(r["cost_per_day_usd"]), _money(r["cost_per_month_usd"]),
                  _money(r["cost_per_task_usd"], 4), _money(r["secured_gpu_cost_per_month_usd"]))
    return t


def _pools_table(d: dict) -> Table:
    t = plain_table("pools (N* and what bounds it at the pool's peak hour)", title_justify="left")
    for col in ("pool", "N*", "bound by", "peak replicas", "GPUs", "replica-h/day", "$/day", "$/task"):
        t.add_column(col, justify="left" if col in ("pool", "bound by") else "right",
                     overflow="fold" if col == "pool" else "ellipsis")
    for p in d["pools"]:
        if p["refused"] is not None:
            plain_row(t, p["name"], "-", f"refused: {_first_sentence(p['refused'])}", *["-"] * 5)
            continue
        plain_row(t, p["name"], f"{p['agents_per_replica_max_at_peak']:,}", p["binding_at_peak"],
                  f"{p['peak_replicas']:,} at {p['peak_hour']:02d}", f"{p['peak_gpus']:,.0f}",
                  f"{p['replica_hours_per_day']:,.0f}", _money(p["cost_per_day_usd"]), _money(p["cost_per_task_usd"], 4))
    return t


def _first_sentence(text: str) -> str:
    """A refusal's first sentence (the whole reason is in --json)."""
    end = text.find(". ")
    return text if end < 0 else text[:end + 1]


def _mix_summary(d: dict) -> list[str]:
    lines = [f"workload {w['name']}: {w['model']}, {w['tasks_per_day']:,.0f} tasks a day, busiest hour "
             f"{w['peak_hour']:02d}:00" for w in d["workloads"]]
    for r in d["placements"]:
        c = r.get("compared_with_split")
        if c is not None:
            gpus = c["peak_gpus_saved"]
            lines.append(f"{r['placement']} against {c['placement']}: {abs(gpus):,.0f} "
                         f"{'fewer' if gpus >= 0 else 'more'} GPUs at peak, "
                         f"{_money(abs(c['secured_gpu_cost_per_month_saved_usd']))} a month "
                         f"{'less' if c['secured_gpu_cost_per_month_saved_usd'] >= 0 else 'more'} secured, "
                         f"{_money(abs(c['cost_per_month_saved_usd']))} a month "
                         f"{'less' if c['cost_per_month_saved_usd'] >= 0 else 'more'} as used")
    best = next((r for r in d["placements"] if r["placement"] == d["cheapest_placement"]), None)
    if best is not None:
        api = "" if best["api_cost_per_day_usd"] is None else (
            f"; the same tasks on the APIs the specs price: {_money(best['api_cost_per_day_usd'])} a day")
        lines.append(f"cheapest: {best['placement']} ({', '.join(best['pools'])}): {_money(best['cost_per_month_usd'])} "
                     f"a month, {_money(best['cost_per_task_usd'], 4)} per task, {best['peak_gpus']:,.0f} GPUs at "
                     f"peak, {best['facility_mwh_per_month']:,.1f} MWh a month{api}")
    return lines


def _mixed(path: Path, as_json: bool, csv_out: Optional[Path], parquet_out: Optional[Path]) -> None:
    """apmw fleet on a fleet file: every placement of its workloads, priced (apmw.capacity.fleet_mix)."""
    from apmw.capacity.fleet_mix import fleet_mix
    from apmw.spec.fleet_file import load_fleet_file

    try:
        loaded = load_fleet_file(path)
        for s in {(s.model.config, s.model.weight_dtype): s for s in loaded.specs}.values():
            note_checkpoint_dtype(s.model.config, s.model.weight_dtype, s.model.moe_dtype)
        gpus = [h.gpu for h in loaded.fleet.hardware] if loaded.fleet.hardware else [s.hardware.gpu for s in loaded.specs]
        for gpu in {str(g): g for g in gpus}.values():
            note_gpu_basis(gpu)
        d = fleet_mix(loaded).to_dict()
    except (ApmwError, SpecError) as exc:
        fail(str(exc))
    _emit(d, csv_out, parquet_out, as_json, _mix_csv, _mix_parquet,
          lambda: [_placements_table(d), _pools_table(d), *_mix_summary(d)])
    if d["cheapest_placement"] is None:
        served = [r for r in d["placements"] if r["refused"] is None]
        if served:
            need = min(r["peak_provisioned_mw"] for r in served)
            fail(f"no placement fits power_cap_mw {d['power_cap_mw']:g} MW: the smallest needs {need:,.3f} MW "
                 "provisioned. Needed: a larger cap, less demand, or hardware that does more per MW", code=2)
        fail("no placement serves every workload: " + "; ".join(f"{r['placement']}: {r['refused']}"
                                                                 for r in d["placements"]), code=2)
