"""What the Python API's verbs check of the arguments the CLI checks as it parses them: a spec where a path was
given (the CLI takes a path, ``plan`` and ``simulate`` a loaded :class:`apmw.spec.Spec`), and a seed."""

from __future__ import annotations

from numbers import Integral
from pathlib import Path

from apmw.errors import ApmwError
from apmw.spec import Spec


def require_spec(spec: object, verb: str) -> Spec:
    """``spec`` where it is a :class:`Spec`; else an error saying how to make one."""
    if isinstance(spec, Spec):
        return spec
    hint = (f"load the file first: {verb}(apmw.load_spec({str(spec)!r}), ...)" if isinstance(spec, (str, Path))
            else "load a spec file with apmw.load_spec(path), or build one with apmw.spec.spec_from_dict(document)")
    raise ApmwError(f"{verb} takes a Spec, got {type(spec).__name__}; {hint}")


def check_seed(seed: object) -> int:
    """``seed`` where it is a whole number a spec's ``seed`` may be (0 to 2**63 - 1, as ``--seed``); else an error."""
    if isinstance(seed, bool) or not isinstance(seed, Integral) or not 0 <= int(seed) < 2**63:
        raise ApmwError(f"seed {seed!r}: give a whole number from 0 to {2**63 - 1} (the same seed gives the same run)")
    return int(seed)
