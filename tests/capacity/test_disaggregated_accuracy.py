"""What a disaggregated prediction is worth, said where one is made: the held-out figures the caveat quotes are
what bench/accuracy.py finds on the published runs, and `apmw predict --disagg` and a disaggregated `apmw plan`
print the caveat."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from apmw.capacity import disaggregated_benchmark as db
from apmw.cli import _register_verbs, app
from tests.conftest import small_spec_dict

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data" / "benchmarks"
_register_verbs()   # every verb, as the `apmw` entry point does


@pytest.mark.skipif(not (DATA / "inferencemax").is_dir(), reason="needs ../shared/data (the InferenceMAX CSV)")
def test_the_caveat_quotes_what_the_published_runs_show():
    pytest.importorskip("pandas")
    sys.path.insert(0, str(ROOT / "bench"))
    import accuracy  # noqa: E402  (bench/accuracy.py)

    rows = accuracy.imax_disagg_rows(DATA)
    for r in rows:
        accuracy.predict_row(r)
    predicted = [r for r in rows if r.predicted]
    assert len(predicted) == db.HELD_OUT_POINTS
    for metric, quoted in (("ttft_s", db.HELD_OUT_TTFT_ERROR), ("tpot_s", db.HELD_OUT_TPOT_ERROR)):
        found = accuracy.errors(predicted, metric)
        assert len(found) == db.HELD_OUT_POINTS
        assert statistics.median(abs(x) for x in found) / 100 == pytest.approx(quoted, abs=0.0005)
    assert sum(r.predicted["ttft_s"] < r.measured["ttft_s"] for r in predicted) == db.HELD_OUT_TTFT_BELOW


def test_predict_disagg_says_how_far_its_ttft_is_from_published_runs():
    r = CliRunner().invoke(app, ["predict", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100", "--tp", "1",
                                 "--kv-dtype", "bf16", "--isl", "1000", "--osl", "200", "--concurrency", "8", "--disagg",
                                 "--json"])
    assert r.exit_code == 0, r.output
    assert "ttft_s" in json.loads(r.stdout)
    assert db.accuracy_caveat() in " ".join(r.stderr.split())
    assert f"a median {db.HELD_OUT_TTFT_ERROR:.0%}" in db.accuracy_caveat()
    aggregated = CliRunner().invoke(app, ["predict", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100",
                                          "--tp", "1", "--kv-dtype", "bf16", "--isl", "1000", "--osl", "200",
                                          "--concurrency", "8", "--json"])
    assert aggregated.exit_code == 0 and "least checked" not in aggregated.stderr


def test_a_disaggregated_plan_carries_the_same_caveat(tmp_path):
    d = small_spec_dict()
    d["serving"] = {"disaggregation": {"prefill_gpus": 1}}
    spec = tmp_path / "disagg.yaml"
    spec.write_text(yaml.safe_dump(d))
    r = CliRunner().invoke(app, ["plan", str(spec), "--analytic", "--json"])
    assert r.exit_code in (0, 2), r.output
    assert db.accuracy_caveat() in " ".join(r.stderr.split())
    d.pop("serving")
    spec.write_text(yaml.safe_dump(d))
    r = CliRunner().invoke(app, ["plan", str(spec), "--analytic", "--json"])
    assert "least checked" not in r.stderr
