"""`apmw search`: the spec's workload and SLO planned over a design space; the Pareto front."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, TextColumn, TimeRemainingColumn

from apmw.design_search.space import settings_text
from apmw.cli.common import (app, progress_bar, distinct_outputs, emit_json, err, fail, file_path, files_read_by, note, note_checkpoint_dtype, note_context_window,
                             note_gpu_basis, out, output_path, plain_row, plain_table, SafeInterrupt, write_text, print_table)
from apmw.capacity.slo import speed_text, task_s
from apmw.errors import ApmwError
from apmw.sim.checked import CHECK_TASKS_PER_POINT, interval_text
from apmw.spec import SpecError


def _checked_cells(c: dict | None) -> tuple[str, str]:
    if c is None:
        return "-", "-"
    if "not_checked" in c:
        return "not checked", c["not_checked"]
    span = interval_text(c["agents_per_replica_interval"], c["agents_simulated"])
    return f"{c['agents_per_replica']:,} ({span})", f"{c['agents_per_mw']:,.0f}"


# Below this many points a pool's start-up (a second or two a worker) outweighs what it saves.
POOL_FROM_POINTS = 32


def _workers(asked: int, axes: dict) -> int:
    """Processes to plan on: as asked, or one per core for a space big enough to pay for them; never more than
    the space has points (each further process only starts), nor, noted, more than this machine's cores (planning
    is computing: more processes than cores only take turns)."""
    from apmw.design_search.space import space_size

    cores, points = max(1, len(os.sched_getaffinity(0))), space_size(axes)
    if not asked:
        return 1 if points < POOL_FROM_POINTS else min(cores, points)
    if asked > cores:
        note(f"--workers {asked}: this machine gives apmw {cores} core(s), and planning a point is computing, so "
             f"more processes than cores only take turns: planning on {cores}")
    return max(1, min(asked, cores, points))


def _page(answer, spec, axes: dict, spec_path: Path, argv: list[str]) -> str:
    from apmw.design_search import spec_document
    from apmw.design_search.answer import point_dict
    from apmw.report.search_page import render_search

    return render_search(f"apmw search: {spec_path.stem}", answer.to_dict(explain=True),
                         [point_dict(p) for p in answer.points], spec_document(spec), axes,
                         "apmw " + " ".join(shlex.quote(a) for a in argv))


def _print_as_specified(d: dict) -> None:
    """Where the spec's own settings stand: the question a search answers is whether to change them."""
    own = d["as_specified"]
    if own is None:
        return
    if "reason" in own:
        text = f"as specified ({settings_text(own['settings'])}): pruned, {own['reason']}"
    else:
        best = d["best"]["agents_per_mw"]["agents_per_mw"]
        text = (f"as specified ({settings_text(own['settings'])}): N* {own['agents_per_replica']:,}, "
                f"{own['agents_per_mw']:,.0f} agents/MW, rank {own['rank_by_agents_per_mw']:,} of {d['feasible']:,}; "
                f"the best has {best / own['agents_per_mw']:.2f}x its agents per MW (analytic: --check K settles the "
                "best front points in the simulator)")
    out.print(text, highlight=False, markup=False, soft_wrap=True)


@app.command()
def search(
    spec: Path = typer.Argument(..., help="YAML spec: its workload and SLO are fixed, the space varies the rest"),
    space: Optional[Path] = typer.Option(None, "--space", help="YAML with axes: {spec.field: [values]} "
                                         "(default: GPUs per replica 1/2/4/8, vLLM/SGLang/TensorRT-LLM, weight and KV "
                                         "dtype fp8/bf16, batch cap 64-512, and for a mixture of experts attention data "
                                         "parallel off/on; each axis also holds the spec's own value)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object (front, best, pruned counts)"),
    explain: bool = typer.Option(False, "--explain", help="list every pruned point with its reason"),
    check: int = typer.Option(0, "--check", min=0, max=50, help="settle N* in the simulator for this many front "
                              "points, best agents/MW first, as apmw plan does (tens of seconds each)"),
    check_tasks: Optional[int] = typer.Option(None, "--check-tasks", min=1, max=10_000,
                                              help="tasks simulated per agent count when checking (default "
                                              f"{CHECK_TASKS_PER_POINT}; needs --check)"),
    workers: int = typer.Option(0, "--workers", min=0, max=1024, help="processes planning points on this machine "
                                "(0: one per core, in this process when the space has under 32 points)"),
    ray_address: Optional[str] = typer.Option(None, "--ray", help="plan on an existing Ray cluster: auto, "
                                              "host:port or ray://host:port (needs apmw[ray])"),
    parquet_out: Optional[Path] = typer.Option(None, "--parquet", parser=file_path, help="write every evaluated point to this "
                                               "Parquet file, saved as it arrives (needs pyarrow)"),
    csv_out: Optional[Path] = typer.Option(None, "--csv", parser=file_path, help="write every evaluated point to this CSV file"),
    html_out: Optional[Path] = typer.Option(None, "--html", parser=file_path, help="write the answer as one HTML page: the front "
                                            "plotted with each point's settings on hover, the chosen point's launch"),
    resume: bool = typer.Option(False, "--resume", help="continue the search whose results --parquet holds: "
                                "plan only the points it lacks"),
) -> None:
    """Plan every point of a design space: the agents/MW against output-speed front and how to launch it."""
    from apmw.design_search import (ResultStore, check_front, configs_beside, default_space, read_space, search as run,
                                    search_key, spec_document, write_csv)
    from apmw.arch.from_config import load_architecture
    from apmw.spec import load_spec
    from apmw.spec.load import load_yaml_lines

    if workers and ray_address is not None:
        fail(f"--workers {workers} and --ray {ray_address} both given: --workers sizes the process pool on this "
             "machine, --ray plans on the Ray cluster's workers instead; give one")
    if check_tasks is not None and not check:
        note("--check-tasks has no effect without --check K: nothing is checked in the simulator (--check K "
             "settles the K best front points)")
    check_tasks = CHECK_TASKS_PER_POINT if check_tasks is None else check_tasks
    if resume and parquet_out is None:
        fail("--resume continues the search saved in --parquet OUT: give the same --parquet path as the stopped run")
    for path, flag in ((parquet_out, "--parquet"), (csv_out, "--csv"), (html_out, "--html")):
        if path is not None:
            output_path(path, flag, inputs=[spec, space, *files_read_by(spec)], put_in_place=flag == "--parquet")
    distinct_outputs({"--parquet": parquet_out, "--csv": csv_out, "--html": html_out}, json_on_stdout=as_json)
    store = None
    try:
        s = load_spec(spec)
        note_checkpoint_dtype(s.model.config, s.model.weight_dtype, s.model.moe_dtype)
        note_context_window(s.model.config)
        if space is None:
            axes = default_space(spec_document(s), moe=load_architecture(s.model.config).num_experts > 0)
        else:
            document, lines = load_yaml_lines(space, "search space")
            axes = configs_beside(read_space(document, str(space), lines), space.parent)
        # a catalogued GPU whose step times are least checked, wherever the space puts it (a custom GPU's own
        # figures are the user's)
        for gpu in dict.fromkeys(g for g in [s.hardware.gpu, *axes.get("hardware.gpu", [])] if isinstance(g, str)):
            note_gpu_basis(gpu)
        if parquet_out is not None:
            store = ResultStore(parquet_out, search_key(spec_document(s), axes), axes)
            if resume and not store.path.is_file() and not store.parts.is_dir():
                raise ApmwError(f"--resume: nothing to resume at --parquet {parquet_out} (neither it nor "
                                f"{store.parts} exists); check the path, or leave --resume out to start the search")
            if not resume and (held := store.clear()):
                note(f"started afresh: {held} point(s) saved in {store.parts} by a stopped run were dropped "
                     "(--resume continues one)")
        # read before the search, so that a damaged file is refused before any work
        earlier = store.saved_checks() if store is not None and resume else {}
        procs = _workers(workers, axes)
        # planned in this process, a Ctrl-C waits for the point in hand to be saved (a pool's or Ray's workers are
        # stopped by it where they are, and the parent mostly waits on them)
        with SafeInterrupt(hold=procs <= 1 and ray_address is None) as ctrl_c, \
                progress_bar(TextColumn("searching"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                             TimeRemainingColumn(), console=err) as bar:
            task = bar.add_task("search", total=None)

            def progress(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)
                ctrl_c.check()

            answer = run(s, axes, progress=progress, workers=procs, ray_address=ray_address, store=store,
                         resume=resume)
        if check:
            with progress_bar(TextColumn("{task.description}"), console=err) as bar:
                task = bar.add_task("checking", total=None)
                answer = check_front(s, answer, check, check_tasks,
                                     progress=lambda what: bar.update(task, description=what))
        checked = {p.index: p.checked for p in answer.points if p.checked is not None}
        if store is not None:
            if earlier and not check:
                note(f"{len(earlier)} point(s) checked in the simulator by the earlier run keep their answers in "
                     f"{store.path} (--check K checks afresh)")
            store.finish(answer.rows, {**earlier, **checked})
        if csv_out is not None:
            write_csv(answer.rows, axes, csv_out)
        if html_out is not None:
            write_text(html_out, _page(answer, s, axes, spec, sys.argv[1:]), "--html")
    except (ApmwError, SpecError) as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        if store is not None:
            err.print(f"interrupted: the points planned so far are saved in {store.parts}; run the same command "
                      "with --resume to continue", highlight=False, markup=False, soft_wrap=True)
        raise
    d = answer.to_dict(explain)
    if as_json:
        emit_json(d)
        _none_feasible(d, explain)
        return
    _print_answer(d, spec, bool(check), explain)


def _print_answer(d: dict, spec: Path, checked: bool, explain: bool) -> None:
    """The answer in the terminal: the front as a table, the best point per objective, the best point's launch
    line, where the spec itself ranks, the pruned points by reason (each with --explain)."""
    t = plain_table(f"apmw search: {spec} ({d['feasible']} of {d['evaluated']} points feasible)", title_justify="left")
    cols = ["settings", "N*", "agents/MW", "tokens/s per agent", "$/session", "task p95 s"]
    if checked:
        cols += ["simulated N* (interval)", "simulated agents/MW"]
    for col in cols:
        t.add_column(col, justify="left" if col == "settings" else "right", overflow="fold")
    for p in d["front"]:
        plain_row(t, settings_text(p["settings"]), f"{p['agents_per_replica']:,}", f"{p['agents_per_mw']:,.0f}",
                  speed_text(p["output_speed_tokens_per_s"]), f"{p['cost_per_session_usd']:,.4f}",
                  task_s(p["task_latency_p95_s"]), *(_checked_cells(p.get("checked")) if checked else ()))
    print_table(t)
    for name, p in d["best"].items():
        out.print(f"best {name}: {settings_text(p['settings'])}", highlight=False, markup=False)
    for p in d["front"][:1]:
        out.print(f"launch (best agents/MW): {p['launch']}", highlight=False, markup=False, soft_wrap=True)
    _print_as_specified(d)
    if d["pruned"]:
        out.print(f"pruned {d['pruned']} point(s): " + "; ".join(f"{why} ({n})" for why, n in d["pruned_by_reason"].items()),
                  highlight=False, markup=False, soft_wrap=True)
    if explain:
        for p in d.get("pruned_points", []):
            why = "; ".join(line.strip() for line in p["message"].splitlines() if line.strip())
            out.print(f"  {settings_text(p['settings'])}: {why}", highlight=False, markup=False, soft_wrap=True)
    _none_feasible(d, explain)


def _none_feasible(d: dict, explain: bool) -> None:
    """A search none of whose points is feasible exits as an infeasible plan does (2), after its output."""
    from apmw.capacity import InfeasibleError

    if d["feasible"] == 0:
        fail(f"none of the {d['evaluated']:,} point(s) of the space is feasible"
             + ("" if explain else "; --explain gives each point's reason"), InfeasibleError.exit_code)
