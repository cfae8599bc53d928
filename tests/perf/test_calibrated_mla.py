"""MLA (DeepSeek-V3/R1, Kimi-K2) composed from SGLang's measured MLA kernels on Blackwell (issue 22 item 1;
apmw.perf.calibrated._mla_curves, scripts/build_calibration.py mla_tables)."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np
import pytest

from apmw.arch import load_architecture
from apmw.catalog.gpus import get_gpu
from apmw.perf import CalibratedStepModel, build_step_model
from apmw.perf.calibrated import calibration_gap
from apmw.perf.tables import bilinear_log2, interp_extrapolate, load_tables
from tests.perf.loads import assert_never_faster, iteration_load

ROOT = Path(__file__).resolve().parents[2]
BLACKWELL = ["B200-SXM-180GB", "B300-SXM-288GB", "GB200 (per GPU)", "GB300 (per GPU)"]
R1 = "deepseek-ai/DeepSeek-R1"


def test_the_config_gives_mla_its_projection_widths():
    mla = load_architecture(R1).mla       # DeepSeek-R1's config.json
    assert (mla.q_lora_rank, mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim) == (
        1536, 512, 128, 64, 128)
    assert load_architecture("meta-llama/Llama-3.1-8B-Instruct").mla is None


@pytest.mark.parametrize("gpu", BLACKWELL)
def test_the_mla_tables_are_exact_at_their_measured_points_and_monotone(gpu):
    t = load_tables(gpu, "sglang")
    decode = t.keys("mladec_")
    assert {"mladec_fp8_16", "mladec_bf16_16", "mladec_fp8_8"} <= set(decode)
    b, s = np.meshgrid(t["mla_dec_batch"], t["mla_dec_step"], indexing="ij")
    for key in decode:
        np.testing.assert_allclose(bilinear_log2(t[key], t["mla_dec_batch"], t["mla_dec_step"], b.ravel(), s.ravel()),
                                   t[key].ravel(), rtol=1e-12)
        assert np.all(np.diff(t[key], axis=0) >= 0) and np.all(np.diff(t[key], axis=1) >= 0), key
    for key in t.keys("mlactx_"):
        np.testing.assert_array_equal(np.interp(t["mla_ctx_isl"], t["mla_ctx_isl"], t[key]), t[key])
        assert np.all(np.diff(t[key]) >= 0), key
    for key in t.keys("mlabmm_"):
        np.testing.assert_array_equal(interp_extrapolate(t["mla_bmm_tokens"], t["mla_bmm_tokens"], t[key]), t[key])
        assert np.all(np.diff(t[key]) >= 0), key


def test_deepseek_on_blackwell_sglang_is_calibrated_and_elsewhere_says_why_not():
    arch = load_architecture(R1)
    step = build_step_model(arch, get_gpu("B200"), 8, "fp8", "fp8", engine="sglang")
    assert isinstance(step, CalibratedStepModel)
    assert "sglang's own kernel tables" in step.source_detail and "MLA from its measured" in step.source_detail
    hopper = calibration_gap(arch, get_gpu("H200"), 8, "fp8", "fp8", engine="sglang")
    assert "MLA attention with 16 query heads per rank and fp8 KV was not measured" in hopper
    assert "SGLang on Blackwell" in hopper
    assert not isinstance(build_step_model(arch, get_gpu("B200"), 8, "fp8", "fp8", engine="trtllm"),
                          CalibratedStepModel)
    glm5 = calibration_gap(load_architecture("zai-org/GLM-5"), get_gpu("B200"), 8, "fp8", "fp8", engine="sglang")
    assert "sparse attention" in glm5


def test_the_decode_attention_is_the_measured_latent_kernel_at_every_layer():
    """Between two measured contexts only the attention kernel changes: by the layers times the table's step."""
    arch = load_architecture(R1)
    step = build_step_model(arch, get_gpu("B200"), 8, "fp8", "fp8", engine="sglang")
    t = load_tables("B200-SXM-180GB", "sglang")
    table = t["mladec_fp8_16"]
    batches, steps = list(t["mla_dec_batch"]), list(t["mla_dec_step"])
    for batch, (lo, hi) in ((8, (1023, 4095)), (64, (255, 2047))):
        grow = np.diff(step.iteration_time_s(iteration_load(step, float(batch), 0.0, np.array([lo, hi], float))))
        expected = arch.num_layers * (table[batches.index(batch), steps.index(hi)]
                                      - table[batches.index(batch), steps.index(lo)])
        np.testing.assert_allclose(grow, expected, rtol=1e-9)


def test_prompt_tokens_and_decoding_tokens_take_their_own_mla_gemms():
    """kv_b's up-projection runs on prompt tokens only, the absorbed form's batched GEMMs on decoding tokens
    only: each iteration's kernels are the shared GEMMs plus its own kind's, with no cross term."""
    step = build_step_model(load_architecture(R1), get_gpu("B200"), 8, "fp8", "fp8", engine="sglang")
    c = step.curves
    at = lambda curve, m: float(np.interp(m, c.m, curve))        # noqa: E731

    def gemms(decode: float, prefill: float) -> float:
        load = iteration_load(step, decode, prefill, 1000.0)
        rest = (float(np.asarray(step._attention_s(load, np.asarray(decode), np.asarray(prefill))))
                + at(c.lm_head_s, max(decode + (prefill > 0), 1.0)) + c.elementwise_s_per_token * (decode + prefill))
        return float(step.iteration_parts_s(load)[2]) - rest

    assert gemms(8.0, 0.0) == pytest.approx(at(c.layers_gemm_s, 8) + at(c.decode_gemm_s, 8), rel=1e-9)
    assert gemms(0.0, 1024.0) == pytest.approx(at(c.layers_gemm_s, 1024) + at(c.prefill_gemm_s, 1024), rel=1e-9)
    assert at(c.decode_gemm_s, 8) > 0 and at(c.prefill_gemm_s, 1024) > 0


@pytest.mark.parametrize("tp", [4, 8])
def test_more_tokens_or_more_context_is_never_faster(tp):
    step = build_step_model(load_architecture(R1), get_gpu("B200"), tp, "fp8", "fp8", engine="sglang")
    assert isinstance(step, CalibratedStepModel)
    assert_never_faster(step, 150_000)


DATA = ROOT.parent / "shared" / "data" / "benchmarks"


def _median_tpot_error_pct(rows) -> float:
    accuracy = _accuracy()
    errors = []
    for r in rows:
        accuracy.predict_row(r)
        assert r.path == "calibrated", r.note
        errors.append(abs(r.predicted["tpot_s"] / r.measured["tpot_s"] - 1) * 100)
    return statistics.median(errors)


def _accuracy():
    pytest.importorskip("pandas")
    sys.path.insert(0, str(ROOT / "bench"))
    import accuracy
    return accuracy


def test_nvidias_b200_deepseek_v3_sglang_runs_meet_the_tpot_target_once_mla_is_measured():
    """docs/accuracy.md, "What changed in session 24": NVIDIA's 36 B200 DeepSeek-V3 SGLang silicon points
    (version not given), median |TPOT error| 32.6 % on the roofline, 8.4 % calibrated."""
    rows = [r for r in _accuracy().silicon_rows() if r.gpu == "B200" and r.engine == "sglang"
            and "DeepSeek" in r.model and "version not given" in r.scenario and not r.note.startswith("not modelled")]
    assert len(rows) == 36
    assert _median_tpot_error_pct(rows) <= 10.0


@pytest.mark.skipif(not (DATA / "inferencemax").is_dir(), reason="needs ../shared/data (the InferenceMAX CSV)")
def test_inferencemax_deepseek_r1_on_b200_sglang_meets_the_tpot_target_once_mla_is_measured():
    """The 19 B200 FP8 DeepSeek-R1 TP8 points: median |TPOT error| 29.3 % on the roofline, 9.4 % calibrated."""
    rows = [r for r in _accuracy().imax_rows(DATA) if r.gpu == "B200" and r.engine == "sglang"
            and r.model == R1 and r.precision == "fp8" and not r.layout]
    assert len(rows) == 19
    assert _median_tpot_error_pct(rows) <= 11.0
