"""Read a spec from YAML with errors that point at the file, line and field.

YAML is parsed with ``yaml.safe_load`` semantics (no arbitrary objects). Before
validation the document is composed once more to record where each key sits,
so that a pydantic error on ``workload.tool_wait_s.p95`` can be reported as
``coding-agent.yaml:14: workload.tool_wait_s.p95: ...``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from apmw.spec.model import Spec


class SpecError(ValueError):
    """A spec that cannot be used, with every problem found and where it is."""

    def __init__(self, path: str, problems: list[str]):
        self.path = path
        self.problems = problems
        super().__init__(f"{path}: invalid spec\n" + "\n".join(f"  {p}" for p in problems))


def _key_lines(node: yaml.Node, prefix: tuple = ()) -> dict[tuple, int]:
    """Map each key path (as tuple of keys / indices) to its 1-based line."""
    lines: dict[tuple, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            path = prefix + (key_node.value,)
            lines[path] = key_node.start_mark.line + 1
            lines.update(_key_lines(value_node, path))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[prefix + (i,)] = item.start_mark.line + 1
            lines.update(_key_lines(item, prefix + (i,)))
    return lines


def _line_for(loc: tuple, lines: dict[tuple, int]) -> int | None:
    """The line of the deepest key of ``loc`` that exists in the file."""
    keys = tuple(str(k) if not isinstance(k, int) else k for k in loc)
    for n in range(len(keys), 0, -1):
        if keys[:n] in lines:
            return lines[keys[:n]]
    return None


def _describe(err: dict[str, Any]) -> str:
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "missing":
        return "missing (required)"
    if err["type"] == "extra_forbidden":
        return "unknown field (check the spelling; see the README's spec reference)"
    return msg


def _clean_loc(loc: tuple) -> tuple:
    # pydantic adds union member names (e.g. 'str', 'GpuOverride') and 'function-before[...]' to locations
    return tuple(
        p for p in loc if not (isinstance(p, str) and (p[:1].isupper() or p.startswith("function-") or p == "str"))
    )


def spec_from_dict(data: Any, path: str = "<spec>", lines: dict[tuple, int] | None = None) -> Spec:
    """Validate a parsed document, raising :class:`SpecError` with every problem."""
    if not isinstance(data, dict):
        raise SpecError(path, ["the file must be a YAML mapping with sections workload, model, hardware, slo, cost"])
    try:
        return Spec.model_validate(data)
    except ValidationError as exc:
        problems, seen = [], set()
        for err in exc.errors():
            loc = _clean_loc(err["loc"])
            field = ".".join(str(p) for p in loc) or "(top level)"
            text = _describe(err)
            if (field, text) in seen:
                continue
            seen.add((field, text))
            line = _line_for(loc, lines or {})
            where = f"line {line}: " if line else ""
            problems.append(f"{where}{field}: {text}")
        raise SpecError(path, problems) from None


def load_spec(path: str | Path) -> Spec:
    """Load and validate a YAML spec file."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(str(path), ["file not found (give the path of a YAML spec; see examples/)"])
    text = p.read_text(encoding="utf-8")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise SpecError(str(path), [f"{where}YAML syntax error: {exc.problem}"]) from None
    except yaml.YAMLError as exc:
        raise SpecError(str(path), [f"YAML error: {exc}"]) from None
    lines = _key_lines(node) if node is not None else {}
    return spec_from_dict(data, str(path), lines)
