"""Imports run one way: cli -> {report, levers, traces, loadgen} -> sim -> capacity -> perf -> arch, catalog -> spec.

``apmw.errors`` is a leaf every layer may raise from. A module may import its own
layer or any layer below, never above.
"""

from __future__ import annotations

import ast
from pathlib import Path

import apmw

SRC = Path(apmw.__file__).parent

LAYER = {
    "errors": 0, "spec": 0, "examples": 0,
    "catalog": 1, "arch": 1, "config_fields": 1,
    "perf": 2,
    "capacity": 3,
    "sim": 4,
    "levers": 5, "contrast": 5, "report": 5, "design_search": 5, "traces": 5, "loadgen": 5, "calibration": 5,
    "render": 6, "cli": 6, "__init__": 6, "__main__": 6,
}


def _area(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _apmw_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("apmw")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("apmw"):
            found.add(node.module)
    return found


def test_every_area_has_a_layer():
    areas = {p.stem if p.is_file() else p.name for p in SRC.iterdir() if p.suffix == ".py" or
             (p.is_dir() and (p / "__init__.py").exists())}
    assert areas <= LAYER.keys(), f"give these a layer in tests/test_layering.py: {areas - LAYER.keys()}"


def test_imports_point_down():
    bad = []
    for path in SRC.rglob("*.py"):
        module = "apmw." + ".".join(path.relative_to(SRC).with_suffix("").parts)
        here = LAYER[_area(module)]
        for imported in _apmw_imports(path):
            if imported == "apmw":
                there = LAYER["__init__"]
            else:
                there = LAYER[_area(imported)]
            if there > here:
                bad.append(f"{module} imports {imported}")
    assert not bad, "imports that point up the chain:\n" + "\n".join(bad)


def test_spec_imports_no_other_apmw_module():
    for path in (SRC / "spec").rglob("*.py"):
        others = {m for m in _apmw_imports(path) if not m.startswith("apmw.spec")}
        assert not others, f"{path.name} imports {others}"
