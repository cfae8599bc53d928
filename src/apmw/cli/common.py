"""What every verb shares: the typer app, consoles, error exits, JSON output."""

from __future__ import annotations

import json
import sys
from typing import NoReturn

import typer
from rich.console import Console

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Agents per megawatt: size LLM agent-serving fleets by task-latency SLO.")
out = Console()
err = Console(stderr=True)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print a user error (never a traceback) and exit with ``code``."""
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def emit_json(obj: object) -> None:
    """One JSON document on stdout (NaN/inf are bugs, so they raise)."""
    sys.stdout.write(json.dumps(obj, indent=2, allow_nan=False) + "\n")


def note(message: str) -> None:
    """A remark on stderr that does not stop the verb (stdout stays clean for --json)."""
    err.print(f"[yellow]note:[/] {message}", highlight=False, soft_wrap=True)


def note_checkpoint_dtype(model: str, weight_dtype: str) -> None:
    """Say so when a checkpoint's name states other weights than the dtype being priced
    ("...-FP8" priced at bf16): the dtype is the user's to give, but a mismatch is usually a slip."""
    from apmw.catalog.models import checkpoint_weight_dtype
    from apmw.spec.model import dtype_key

    named = checkpoint_weight_dtype(model)
    if named and named != dtype_key(weight_dtype):
        note(f"'{model}' names {named} weights, but {weight_dtype} weights are priced; give "
             f"--weight-dtype {named} (weight_dtype: {named} in a spec) if that is what it serves")
