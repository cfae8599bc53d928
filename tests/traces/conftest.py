from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces"


@pytest.fixture
def fixture_path():
    def get(name: str) -> Path:
        return FIXTURES / name

    return get
