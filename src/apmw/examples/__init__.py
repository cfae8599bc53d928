"""Bundled example specs (also reachable as ``examples/`` in a checkout).

Each YAML file's header cites where its numbers come from.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent


def bundled_examples() -> dict[str, Path]:
    """Example name -> path of its YAML spec."""
    return {p.stem: p for p in sorted(HERE.glob("*.yaml"))}
