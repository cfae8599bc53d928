"""`apmw contrast`: workloads side by side -- why tokens/s did not predict agents/MW."""

from __future__ import annotations

from pathlib import Path

import typer
from rich import box
from rich.table import Table

from apmw.cli.common import app, emit_json, fail, plain_row, print_table
from apmw.errors import ApmwError
from apmw.spec import SpecError


@app.command()
def contrast(
    specs: list[Path] = typer.Argument(..., help="two or more YAML specs"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Agents/MW = output tokens/s per MW x task seconds per output token, for each workload, at the analytic N*."""
    from apmw.capacity import InfeasibleError, plan
    from apmw.contrast import contrast as build
    from apmw.spec import load_spec

    if len(specs) < 2:
        fail("give at least two specs to contrast")
    seen: dict[Path, Path] = {}
    for p in specs:
        first = seen.setdefault(p.resolve(), p)
        if first is not p:
            also = "" if str(first) == str(p) else f" (also as {first})"
            fail(f"{p} is given twice{also}; contrast compares different specs: give each once")
    plans = {}
    for p in specs:
        try:
            spec = load_spec(p)
        except (ApmwError, SpecError) as exc:      # a spec's own errors name its file, line and field
            fail(str(exc))
        try:
            plans[str(p)] = plan(spec)
        except InfeasibleError as exc:
            fail(f"{p}: {exc}", exc.exit_code)
        except ApmwError as exc:
            fail(f"{p}: {exc}")
    result = build(plans)
    if as_json:
        emit_json(result)
        return
    # borderless, short headings, each ratio under its figure: nine columns fit 80 characters with no figure cut
    t = Table(title="agents/MW = (output tokens/s per MW) x (task seconds per output token), at the analytic N*",
              title_justify="left", caption="tok/s/MW: output tokens/s per MW; s/token: task seconds per output "
              "token; calls, prompt, KV tok: per task, per call, per agent; tool: the tool share of a task. N* is the "
              "analytic model's, as `apmw plan --analytic`; `apmw plan SPEC` settles it in the simulator and may "
              "answer fewer agents", caption_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
              collapse_padding=True)
    rows = [[label, f"{row['agents_per_mw']:,.0f}\n({ratio['agents_per_mw']:.2f}x)",
             f"{row['output_tokens_per_s_per_mw']:,.0f}\n({ratio['output_tokens_per_s_per_mw']:.2f}x)",
             f"{row['residence_s_per_output_token']:.3f}\n({ratio['residence_s_per_output_token']:.2f}x)",
             f"{row['calls_per_task']:.1f}", f"{row['mean_prompt_tokens']:,.0f}",
             f"{row['kv_tokens_per_agent']:,.0f}", f"{row['tool_share']:.0%}", row["binding_constraint"]]
            for label, row, ratio in zip(_labels([row["name"] for row in result["workloads"]]), result["workloads"],
                                         result["ratios_to_first"])]
    for i, col in enumerate(("workload", "agents/MW", "tok/s/MW", "s/token", "calls", "prompt", "KV tok", "tool",
                             "binding")):
        t.add_column(col, justify="left" if i in (0, 8) else "right", overflow="fold", no_wrap=i != 0)
    for r in rows:
        plain_row(t, *r)
    print_table(t)


def _labels(paths: list[str]) -> list[str]:
    """Each spec's row label: its file name without the suffix, or the path as given where two specs share a name
    (a/coding-agent.yaml and b/coding-agent.yaml), which the names alone would not tell apart."""
    stems = [Path(p).stem for p in paths]
    return [stem if stems.count(stem) == 1 else p for stem, p in zip(stems, paths)]
