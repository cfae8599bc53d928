"""`apmw plan` on DeepSeek-V4-Pro runs end to end and sizes the pool by V4's compressed KV."""

from __future__ import annotations

import json
import subprocess

from tests.conftest import ROOT
from tests.e2e.test_cli import APMW

SPEC = ROOT / "tests" / "fixtures" / "specs" / "deepseek-v4-pro.yaml"


def test_plan_on_deepseek_v4_pro_runs_and_uses_its_kv_per_token():
    r = subprocess.run([APMW, "plan", str(SPEC), "--analytic", "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    out = json.loads(r.stdout)
    assert out["agents_per_replica"] > 0
    assert out["kv_bytes_per_token"] == 30 * (512 + 128) / 4 + 31 * 512 / 128     # V4-Pro at fp8 (docs/models.md)
