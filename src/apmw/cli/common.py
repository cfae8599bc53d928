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
