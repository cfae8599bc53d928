"""The `apmw` command line: one module per verb, one thin function each, no logic here.

Every module in this package registers its verb(s) on :data:`app` when imported;
:func:`main` imports them all (``pkgutil``), so adding a verb is adding a file.
Shared helpers (error exit, JSON output) live in :mod:`apmw.cli.common`.
"""

from __future__ import annotations

import importlib
import pkgutil

from apmw.cli.common import app


def _register_verbs() -> None:
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "common"):
        importlib.import_module(f"{__name__}.{module}")


def main() -> None:
    _register_verbs()
    app()


__all__ = ["app", "main"]
