"""`apmw report`: one self-contained HTML file."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from apmw.cli.common import app, fail, out
from apmw.errors import ApmwError
from apmw.spec import SpecError


@app.command()
def report(
    spec: Path = typer.Argument(..., help="YAML spec"),
    output: Path = typer.Option(Path("report.html"), "-o", "--output", help="where to write the HTML file"),
    simulate: bool = typer.Option(True, "--simulate/--no-simulate",
                                  help="add simulated p95 points to the latency curve (takes longer)"),
) -> None:
    """Latency and KV curves, residence breakdown, levers, tokens/s contrast, cost, inputs: one HTML file."""
    from apmw.capacity import InfeasibleError
    from apmw.report import write_report

    if output.parent and not output.parent.exists():
        fail(f"the folder of {output} does not exist; create it or choose another -o path")
    try:
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=out,
                      transient=True) as bar:
            task = bar.add_task("planning", total=None)
            write_report(spec, output, progress=lambda msg: bar.update(task, description=msg), simulated=simulate)
    except InfeasibleError as exc:
        fail(str(exc), exc.exit_code)
    except (ApmwError, SpecError) as exc:
        fail(str(exc))
    out.print(f"wrote {output} ({output.stat().st_size / 1024:,.0f} KiB)")
