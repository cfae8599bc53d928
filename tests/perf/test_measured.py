"""The measured step model: a server's calibration rows as a line in what an iteration does."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from apmw.errors import ApmwError
from apmw.loadgen.calibrate import _points, read_calibration, step_model_from_calibration
from apmw.loadgen.client import BenchError
from apmw.perf import IterationLoad, replica_from_spec
from apmw.perf.measured import TERMS, MeasuredStepModel
from apmw.spec import spec_from_dict
from tests.loadgen.conftest import tiny_spec_dict

HERE = Path(__file__).parent
# A calibration of the tiny test model on llama.cpp (4 slots, one thread), measured with
# `apmw bench --calibrate` on the 2-core development machine (bench/README.md "loadgen").
MEASURED = HERE.parent / "fixtures" / "calibration" / "llamacpp-tiny-4slots.json"
TINY_CONFIG = HERE.parent / "fixtures" / "calibration" / "tiny-llama-config.json"
# The same server measured on 2026-12-02 (bench/llamacpp_token_gaps.py, after two loop levels): one
# sequence decodes in 1.2 ms, two in 3.5 ms, four in 7.4 ms, a line through two and more sequences whose
# intercept is negative.
BATCH_STEP = HERE.parent / "fixtures" / "calibration" / "llamacpp-tiny-4slots-batch-step.json"


def _spec(**serving):
    d = tiny_spec_dict(TINY_CONFIG)
    d["serving"].update(serving)
    return spec_from_dict(d)


def _synthetic(spec, coef) -> dict:
    """A calibration file whose rows follow ``coef`` exactly (times inside the engine + overhead)."""
    cal = read_calibration(MEASURED)
    step, loads, _ = _points(cal, spec)
    exact = MeasuredStepModel.fit(step, loads, np.ones(len(loads)), origin="")
    exact = replace(exact, coefficients=coef)
    overhead = replica_from_spec(spec).policy.request_overhead_s
    rows = iter(float(exact.iteration_time_s(ld)) for ld in loads)
    for r in cal["ttft_vs_prompt_tokens"]:
        r["ttft_s_p50"] = next(rows) + overhead
    for table in ("tpot_vs_concurrency", "tpot_vs_context"):
        for r in cal[table]:
            r["tpot_s_p50"] = next(rows)
    return cal


def test_the_line_through_exact_rows_is_recovered():
    spec = _spec()
    coef = (5e-4, 6e-4, 9e-4, 5e-4, 3e-10, 4e-11)
    model = step_model_from_calibration(_synthetic(spec, coef), spec)
    assert model.coefficients == pytest.approx(coef, rel=1e-6)
    assert "rms error 0.0%" in model.source_detail


def test_a_real_calibration_is_reproduced_closely_and_prices_mixed_iterations_between_its_parts():
    spec = _spec()
    model = step_model_from_calibration(read_calibration(MEASURED), spec)
    assert model.source == "measured"
    rms = float(model.fit_report.split("rms error ")[1].split("%")[0])
    assert rms < 15.0                                   # the line reproduces the measured rows
    decode = IterationLoad(decode_seqs=4.0, prefill_tokens=0.0, kv_read_bytes=4 * 4096 * 400.0,
                           attention_flops=4 * 8 * 64 * 2 * 2 * 4 * 400.0)
    mixed = IterationLoad(decode_seqs=4.0, prefill_tokens=500.0, kv_read_bytes=4 * 4096 * 400.0,
                          attention_flops=4 * 8 * 64 * 2 * 2 * 4 * 400.0)
    # a whole prompt in the iteration stalls the decodes in it for its prefill
    assert float(model.iteration_time_s(mixed)) > 10 * float(model.iteration_time_s(decode))


def test_a_batch_that_costs_more_per_sequence_than_a_lone_sequence_is_priced_as_measured():
    spec = _spec()
    cal = read_calibration(BATCH_STEP)
    model = step_model_from_calibration(cal, spec)
    _, loads, times = _points(cal, spec)
    batched = [(ld, t) for ld, t in zip(loads, times) if ld.decode_seqs >= 2]
    assert len(batched) == 3
    for ld, t in batched:       # a line through zero or more sequences alone priced four at 22 % under
        assert float(model.iteration_time_s(ld)) == pytest.approx(t, rel=0.10)
    assert model.coefficients[TERMS.index("per_added_sequence_s")] > 0
    # where a batch costs what its sequences cost alone (the older fixture), the term stays out
    linear = step_model_from_calibration(read_calibration(MEASURED), spec)
    assert linear.coefficients[TERMS.index("per_added_sequence_s")] == 0


def test_concurrency_beyond_the_batch_limit_is_read_as_the_limit():
    cal = read_calibration(MEASURED)
    _, loads4, _ = _points(cal, _spec(max_batch=4))
    _, loads8, _ = _points(cal, _spec(max_batch=8))
    rows = len(cal["ttft_vs_prompt_tokens"]) + [r["concurrency"] for r in cal["tpot_vs_concurrency"]].index(8)
    assert loads4[rows].decode_seqs == 4.0 and loads8[rows].decode_seqs == 8.0


def test_files_without_the_context_table_still_calibrate():
    cal = read_calibration(MEASURED)
    del cal["tpot_vs_context"]
    model = step_model_from_calibration(cal, _spec())
    assert model.source_detail.startswith("measured on") and " 9 rows" in model.source_detail


def test_a_ttft_below_the_engines_request_overhead_is_refused():
    cal = read_calibration(MEASURED)
    cal["ttft_vs_prompt_tokens"][0]["ttft_s_p50"] = 0.004      # under llama.cpp's 6 ms
    with pytest.raises(BenchError, match="request overhead"):
        step_model_from_calibration(cal, _spec())


def test_too_few_rows_are_refused():
    spec = _spec()
    cal = read_calibration(MEASURED)
    step, loads, times = _points(cal, spec)
    with pytest.raises(ApmwError, match="at least 6 rows"):
        MeasuredStepModel.fit(step, loads[:3], times[:3], origin="")


def test_the_fixture_is_the_format_apmw_writes():
    d = json.loads(MEASURED.read_text())
    assert d["format"] == "apmw-calibration/1" and d["tpot_vs_context"]
