"""`apmw levers`: which changes move agents per MW for this workload, and by how much."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from apmw.cli.common import (app, emit_json, fail, note_checkpoint_dtype, note_gpu_basis, out, plain_table,
                             print_table, progress_bar)
from apmw.errors import ApmwError
from apmw.spec import SpecError


@app.command()
def levers(
    spec: Path = typer.Argument(..., help="YAML spec"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object (levers, top_two, elasticities)"),
    no_elasticities: bool = typer.Option(False, "--no-elasticities", help="skip the elasticity sweep"),
    verify: bool = typer.Option(False, "--verify", help="re-check the top two levers in the simulator"),
) -> None:
    """Rank modelled actions (KV residency, decode batching, other) by their gain in agents per MW."""
    from apmw.capacity import InfeasibleError, plan
    from apmw.levers import ELASTICITY_INPUTS, LEVERS, elasticities, evaluate_levers, top_two, verify_levers
    from apmw.spec import load_spec

    try:
        s = load_spec(spec)
        note_checkpoint_dtype(s.model.config, s.model.weight_dtype, s.model.moe_dtype)
        note_gpu_basis(s.hardware.gpu)
        base = plan(s)
        total = len(LEVERS) + (0 if no_elasticities else len(ELASTICITY_INPUTS)) + (2 if verify else 0)
        with progress_bar(console=out, disable=as_json) as bar:
            task = bar.add_task("re-planning", total=total)
            step = lambda name: bar.update(task, advance=1, description=name)  # noqa: E731
            not_applicable: dict[str, str] = {}
            results = evaluate_levers(s, base, progress=step, not_applicable=not_applicable)
            if verify:
                results = verify_levers(results, top=2, progress=step)
            elastic = {} if no_elasticities else elasticities(s, progress=step)
    except InfeasibleError as exc:
        fail(f"the spec itself is infeasible, so no lever can be ranked against it: {exc}", exc.exit_code)
    except (ApmwError, SpecError) as exc:
        fail(str(exc))
    best = top_two(results)
    if as_json:
        emit_json({"agents_per_mw": base.to_dict()["agents_per_mw"],
                   "binding_constraint": base.search.binding_constraint,
                   "levers": [r.to_dict() for r in results],
                   "top_two": [r.lever for r in best],
                   "not_applicable": not_applicable,
                   "elasticities": elastic})
        _exit_if_a_verified_lever_missed(results)
        return
    t = plain_table(f"levers for {spec} (now {base.to_dict()['agents_per_mw']:,.0f} agents/MW analytic, "
                    f"binding: {base.search.binding_constraint})", title_justify="left")
    for col in ("lever", "group", "relaxes", "agents/MW after", "gain", "N* after", "binding after"):
        t.add_column(col, justify="right" if col in ("agents/MW after", "gain", "N* after") else "left")
    for r in results:
        style = "green" if r in best else ("red" if r.gain < 1 else "")
        t.add_row(r.lever, r.group, r.relaxes, f"{r.agents_per_mw_after:,.0f}", f"{r.gain:.2f}x",
                  f"{r.agents_per_replica_after:,}", r.binding_after or "infeasible", style=style)
    print_table(t)
    from apmw.render import slo_line

    for r in results:
        if r.verified and "skipped" in r.verified:
            out.print(f"not verified {r.lever}: {r.verified['skipped']}")
        elif r.verified:
            v = r.verified
            out.print(f"verified {r.lever}: simulated task p95 {v['task_latency_s']['simulated']['p95']:,.0f} s vs "
                      f"analytic {v['task_latency_s']['analytic']['p95']:,.0f} s at {v['agents']:,} agents; in "
                      f"simulation {slo_line(v['simulated_slo_verdict'])}")
    if best:
        out.print("top two: " + "; ".join(f"[bold]{r.lever}[/] ({r.gain:.2f}x, relaxes {r.relaxes})" for r in best))
    lowered = [r.lever for r in results if r.gain < 1]
    if lowered:
        out.print(f"[red]lower agents/MW here:[/] {', '.join(lowered)}")
    for r in results:
        if r.plan_after is None and r.detail:
            out.print(f"{r.lever} leaves no capacity: {r.detail}", markup=False, highlight=False)
    for name, why in not_applicable.items():
        out.print(f"not applicable: {name}: {why}", markup=False, highlight=False)
    if elastic:
        e = Table(title="elasticity of agents/MW (d ln agents/MW / d ln x, +-10%)", title_justify="left")
        e.add_column("input")
        e.add_column("elasticity", justify="right")
        for name, v in sorted(elastic.items(), key=lambda kv: -abs(kv[1] or 0)):
            e.add_row(name, "n/a" if v is None else f"{v:+.2f}")
        print_table(e)
    _exit_if_a_verified_lever_missed(results)


def _exit_if_a_verified_lever_missed(results) -> None:
    """``--verify``: exit 3, as ``apmw plan --verify`` does, where the simulator misses the SLO at a verified
    lever's new N* (its gain is overstated), naming the SLOs it misses."""
    from apmw.cli.plan import SIMULATED_SLO_MISSED_EXIT
    from apmw.render import missed_slos

    missed = [r for r in results if r.verified and r.verified.get("simulated_meets_slo") is False]
    if missed:
        typer.echo("apmw levers --verify: the simulator misses the SLO at " + "; ".join(
            f"{r.lever}'s {r.verified['agents']} agents ({missed_slos(r.verified['simulated_slo_verdict'])})"
            for r in missed) + f"; exit {SIMULATED_SLO_MISSED_EXIT}", err=True)
        raise typer.Exit(SIMULATED_SLO_MISSED_EXIT)
