"""`apmw report`: one self-contained HTML file."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.progress import BarColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from apmw.cli.common import app, err, fail, file_path, files_read_by, out, output_path, progress_bar, write_text
from apmw.errors import ApmwError
from apmw.spec import SpecError


@app.command()
def report(
    spec: Path = typer.Argument(..., help="YAML spec"),
    output: Path = typer.Option(Path("report.html"), "-o", "--output", parser=file_path, help="where to write the HTML file (-: to "
                                "standard output)"),
    simulate: bool = typer.Option(True, "--simulate/--no-simulate",
                                  help="settle N* in the simulator as apmw plan does, and draw its points (--no-simulate: "
                                  "the analytic answer, seconds)"),
) -> None:
    """Latency and KV curves, residence breakdown, levers, tokens/s contrast, cost, inputs: one HTML file."""
    from apmw.capacity import InfeasibleError
    from apmw.report import build_report
    from apmw.spec import load_spec

    to_stdout = str(output) == "-"
    if not to_stdout:
        output_path(output, "-o", inputs=[spec, *files_read_by(spec)], example="report.html")
    try:
        with progress_bar(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                          console=err if to_stdout else out) as bar:
            task = bar.add_task("planning", total=1.0)
            html = build_report(load_spec(spec), spec.stem,
                                lambda what, done: bar.update(task, description=what, completed=done), simulate,
                                f"apmw report {spec} -o {output}" + ("" if simulate else " --no-simulate"))
    except InfeasibleError as exc:
        fail(str(exc), exc.exit_code)
    except (ApmwError, SpecError) as exc:
        fail(str(exc))
    if to_stdout:
        sys.stdout.write(html)
        return
    write_text(output, html, "-o")
    out.print(f"wrote {output} ({output.stat().st_size / 1024:,.0f} KiB)")
