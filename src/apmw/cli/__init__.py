"""The `apmw` command line: one module per verb, one thin function each, no logic here.

Every module in this package registers its verb(s) on :data:`app` when imported;
:func:`main` imports them all (``pkgutil``), so adding a verb is adding a file.
Shared helpers (error exit, JSON output) live in :mod:`apmw.cli.common`.
"""

from __future__ import annotations

import errno
import importlib
import os
import pkgutil
import sys
import traceback

import typer

from apmw import __version__
from apmw.cli.common import INTERNAL_ERROR_EXIT, INTERRUPTED_EXIT, USER_ERROR_EXIT, app, err


def _register_verbs() -> None:
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "common"):
        importlib.import_module(f"{__name__}.{module}")


@app.callback(invoke_without_command=True)
def _options(version: bool = typer.Option(False, "--version", help="print apmw's version and exit"),
             debug: bool = typer.Option(False, "--debug", help="on an internal error, print its traceback (may "
                                        "also follow the verb's own options)")) -> None:
    """Agents per megawatt: size LLM agent-serving fleets by task-latency SLO.

    --version prints the version; --debug shows the traceback of an internal error.
    """
    if version:
        print(f"apmw {__version__}")
        raise typer.Exit(0)


def main() -> None:
    """Run the CLI with one error path: user errors exit 1 (the parser's too, where click would
    use 2, the code of an infeasible SLO), a bug exits 70 with one line (its traceback under
    --debug), an interrupt 130."""
    _register_verbs()
    args = sys.argv[1:]
    debug = "--debug" in args
    verb = _verb_command(args)
    both, twice = _both_sides_of_a_switch(args, verb), _given_twice(args, verb)
    if both or twice:
        err.print(f"error: {both[0]} and {both[1]} are the two sides of one switch: give one of them" if both else
                  f"error: {twice} is given more than once, and only one value would be used: give it once",
                  highlight=False, markup=False)
        sys.exit(USER_ERROR_EXIT)
    try:
        code = app(args=[a for a in args if a != "--debug"], prog_name="apmw", standalone_mode=False)
    except Exception as exc:  # the one place where an exception becomes an exit code
        if _is_a(exc, "ClickException"):        # the parser's: a missing argument, an unknown option
            exc.show()
            code = USER_ERROR_EXIT
        elif _is_a(exc, "Abort") and not isinstance(exc.__cause__, EOFError):
            err.print("interrupted", highlight=False, markup=False)
            code = INTERRUPTED_EXIT
        elif isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG:
            name = str(exc.filename or "")
            shown = name if len(name) <= 120 else f"{name[:60]}...{name[-40:]}"
            err.print(f"error: {shown}: {_too_long(name)}", highlight=False, markup=False)
            code = USER_ERROR_EXIT
        else:
            code = _internal_error(exc.__cause__ if _is_a(exc, "Abort") else exc, debug)
    sys.exit(code if isinstance(code, int) else 0)


def _too_long(path: str) -> str:
    """What is too long in a path the system refused as too long (wherever apmw first touched it, reading or
    writing): a name past the file system's limit (255 bytes on most), or the whole path past the system's."""
    limit = _path_limit("PC_NAME_MAX", 255)
    longest = max((len(part.encode()) for part in path.split("/")), default=0)
    if longest > limit:
        return f"a name in this path is {longest:,} bytes long, past the file system's {limit:,}: shorten it"
    return (f"the path is {len(path.encode()):,} bytes long, past the system's {_path_limit('PC_PATH_MAX', 4096):,}: "
            "shorten it")


def _path_limit(name: str, default: int) -> int:
    try:
        return os.pathconf(".", name)
    except (OSError, ValueError):
        return default


def _both_sides_of_a_switch(args: list[str], sub) -> tuple[str, str] | None:
    """An on/off switch of the verb command ``sub`` given both ways (``--mixed-prefill --prefill-first``), which the
    parser would settle by the last one silently: the two flags, or None."""
    given = set(args)
    for param in getattr(sub, "params", ()):
        on = [o for o in getattr(param, "opts", ()) if o in given]
        off = [o for o in getattr(param, "secondary_opts", ()) if o in given]
        if on and off:
            return on[0], off[0]
    return None


def _given_twice(args: list[str], sub) -> str | None:
    """An option of the verb command ``sub`` given more than once (``--gpu H100 ... --gpu B200``, ``--agents 3
    --agents 5``), which the parser would settle by the last one silently (an option that takes a list apart): the
    option as written, or None."""
    if sub is None:
        return None
    options = {o: p for p in getattr(sub, "params", ()) if getattr(p, "param_type_name", "") == "option"
               and not getattr(p, "multiple", False) and not getattr(p, "count", False)
               for o in (*p.opts, *p.secondary_opts)}
    seen: dict[int, str] = {}
    rest = iter(args[args.index(sub.name) + 1:] if sub.name in args else args)
    for a in rest:
        name = a.split("=", 1)[0]
        param = options.get(name)
        if param is None:
            continue
        if id(param) in seen:
            return name if name == seen[id(param)] else f"{name} (as {seen[id(param)]})"
        seen[id(param)] = name
        if not param.is_flag and "=" not in a:
            next(rest, None)        # its value, whatever it looks like
    return None


def _verb_command(args: list[str]):
    """The click command of the verb ``args`` name, or None."""
    command = typer.main.get_command(app)
    verb = next((a for a in args if not a.startswith("-")), None)
    return command.get_command(None, verb) if verb is not None and hasattr(command, "get_command") else None


def _is_a(exc: BaseException, name: str) -> bool:
    """Whether ``exc`` is click's exception ``name``: typer runs on click or, in recent releases, on
    a copy of it of its own, so the class is matched by name."""
    return any(c.__name__ == name for c in type(exc).__mro__)


def _internal_error(exc: BaseException, debug: bool) -> int:
    if debug:
        traceback.print_exception(exc)
    err.print(f"internal error: {type(exc).__name__}: {exc}. This is a bug in apmw {__version__}; please report "
              "it with the command that caused it" + ("" if debug else " (rerun with --debug for the traceback)"),
              highlight=False, markup=False, soft_wrap=True)
    return INTERNAL_ERROR_EXIT


__all__ = ["app", "main"]
