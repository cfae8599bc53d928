"""What every verb shares: the typer app, consoles, error exits, JSON output."""

from __future__ import annotations

import json
import sys
from typing import NoReturn

import typer
from rich.console import Console
from rich.text import Text

# Exit codes, one meaning each (README, "Exit codes"): 1 bad input (a spec, a trace, a flag: the
# command-line parser's errors too), 2 no number of agents meets the SLO, 3 `plan --verify`'s
# simulator misses the SLO, 70 an internal error (a bug; BSD sysexits EX_SOFTWARE), 130 interrupted.
USER_ERROR_EXIT = 1
INTERNAL_ERROR_EXIT = 70
INTERRUPTED_EXIT = 130

# Help text is printed as written: rich markup would read "a:b:step" as an emoji code.
app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None, pretty_exceptions_enable=False,
                  help="Agents per megawatt: size LLM agent-serving fleets by task-latency SLO.")
out = Console(emoji=False)
err = Console(stderr=True, emoji=False)


def fail(message: str, code: int = USER_ERROR_EXIT) -> NoReturn:
    """Print a user error (never a traceback) and exit with ``code``. The message is printed as
    written: no markup or emoji codes are read in it (a file name with ``[x]`` or ``:100:``)."""
    err.print(Text.assemble(("error:", "bold red"), " ", message), highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def emit_json(obj: object) -> None:
    """One JSON document on stdout (NaN/inf are bugs, so they raise)."""
    sys.stdout.write(json.dumps(obj, indent=2, allow_nan=False) + "\n")


def note(message: str) -> None:
    """A remark on stderr that does not stop the verb (stdout stays clean for --json)."""
    err.print(Text.assemble(("note:", "yellow"), " ", message), highlight=False, soft_wrap=True)


def note_checkpoint_dtype(model: str, weight_dtype: str) -> None:
    """Say so when a checkpoint's name states other weights than the dtype being priced
    ("...-FP8" priced at bf16): the dtype is the user's to give, but a mismatch is usually a slip."""
    from apmw.catalog.models import checkpoint_weight_dtype
    from apmw.spec.model import dtype_key

    named = checkpoint_weight_dtype(model)
    if named and named != dtype_key(weight_dtype):
        note(f"'{model}' names {named} weights, but {weight_dtype} weights are priced; give "
             f"--weight-dtype {named} (weight_dtype: {named} in a spec) if that is what it serves")
