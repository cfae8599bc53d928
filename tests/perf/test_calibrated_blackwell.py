"""Issue 22: B200, B300, GB200 and GB300 composed from their own measured vLLM 0.24.0 tables
(catalog/data/calibration/<system>.npz, scripts/build_calibration.py); engines' own tables where present."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from apmw.arch import load_architecture
from apmw.catalog.gpus import get_gpu
from apmw.perf import CalibratedStepModel, build_step_model
from apmw.perf import tables as tables_module
from apmw.perf.efficiency import efficiency_for_gpu
from apmw.perf.scaled import ScaledStepModel
from apmw.perf.tables import bilinear_log2, gemm_latency_s, interp_extrapolate, load_tables
from tests.perf.loads import assert_never_faster, iteration_load

BLACKWELL = ["B200-SXM-180GB", "B300-SXM-288GB", "GB200 (per GPU)", "GB300 (per GPU)"]
LLAMA8 = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA70 = "meta-llama/Llama-3.1-70B-Instruct"




@pytest.mark.parametrize("gpu", BLACKWELL)
def test_each_new_table_family_is_exact_at_its_measured_points(gpu):
    t = load_tables(gpu)
    assert t is not None and t.engine == "vllm" and t.engine_version == "0.24.0"
    ns, ks = t["gemm_n"], t["gemm_k"]
    for dt in ("bf16", "fp8", "nvfp4"):                       # NVFP4 GEMMs: Blackwell only
        cube = t[f"gemm_{dt}"]
        for i, j in ((3, 5), (12, 12), (16, 8)):
            assert np.array_equal(gemm_latency_s(t, dt, ns[i], ks[j]), cube[:, i, j]), (dt, i, j)
    dec = t.keys("dec_fp8_")[0]
    b, s = np.meshgrid(t["dec_batch"], t["dec_step"], indexing="ij")
    np.testing.assert_allclose(bilinear_log2(t[dec], t["dec_batch"], t["dec_step"], b.ravel(), s.ravel()),
                               t[dec].ravel(), rtol=1e-12)
    moe = t.keys("moe_nvfp4_")
    assert moe, "the NVFP4 fused-MoE kernels were measured on every Blackwell system"
    np.testing.assert_array_equal(interp_extrapolate(t["moe_tokens"], t["moe_tokens"], t[moe[0]]), t[moe[0]])
    ctx = t.keys("ctx_bf16_")[0]
    np.testing.assert_array_equal(np.interp(t["ctx_isl"], t["ctx_isl"], t[ctx]), t[ctx])
    for ar in t.keys("ar_"):
        if ar != "ar_size":
            np.testing.assert_array_equal(np.interp(t["ar_size"], t["ar_size"], t[ar]), t[ar])
    # every stored table is monotone along its axes (the builder's isotonic fit)
    nvfp4 = np.diff(t["gemm_nvfp4"], axis=0)                 # GEMMs: along the token axis
    assert np.all(nvfp4[~np.isnan(nvfp4)] >= 0)
    for key in t.keys("moe_") + t.keys("dec_") + t.keys("ar_"):
        a = t[key]
        for axis in range(a.ndim):
            assert np.all(np.diff(a, axis=axis) >= 0), (key, axis)


def test_blackwell_replicas_are_calibrated_from_their_own_tables():
    arch = load_architecture(LLAMA8)
    for gpu in BLACKWELL:
        step = build_step_model(arch, get_gpu(gpu), 1, "fp4", "fp8")
        assert isinstance(step, CalibratedStepModel), gpu     # NVFP4 weights from the measured NVFP4 GEMMs
        assert load_tables(gpu).source in step.source_detail and "vllm's own kernel tables" in step.source_detail


@pytest.mark.parametrize("gpu, tp, w, kv", [("B200-SXM-180GB", 1, "fp4", "fp8"), ("GB300 (per GPU)", 4, "fp8", "fp8"),
                                            ("B300-SXM-288GB", 2, "bf16", "bf16")])
def test_more_tokens_or_more_context_is_never_faster(gpu, tp, w, kv):
    step = build_step_model(load_architecture(LLAMA70), get_gpu(gpu), tp, w, kv)
    assert isinstance(step, CalibratedStepModel)
    assert_never_faster(step)


def _h200_scaled_to(arch, gpu: str, tp: int, w: str, kv: str) -> ScaledStepModel:
    ref = CalibratedStepModel(arch=arch, gpu=get_gpu("H200"), gpus=tp, weight_dtype=w, kv_dtype=kv,
                              efficiency=efficiency_for_gpu("H200-SXM-141GB"))
    return ScaledStepModel(arch=arch, gpu=get_gpu(gpu), gpus=tp, weight_dtype=w, kv_dtype=kv,
                           efficiency=efficiency_for_gpu(get_gpu(gpu).name), reference=ref)


LOADS = ((1, 0, 1000), (8, 0, 2000), (32, 0, 2000), (64, 0, 8000), (256, 0, 2000), (0, 1024, 0), (0, 8192, 0),
         (16, 2048, 1000))


@pytest.mark.parametrize("gpu", BLACKWELL)
def test_own_bf16_tables_agree_with_h200s_scaled_by_the_spec_sheets(gpu):
    """bf16 weights and KV, Llama-3.1-8B at TP 1. Decode (bandwidth-bound): both are measured vLLM
    kernels of the same kind, and B200 streams bf16 weights at 76 % of its HBM peak where H200 does
    at 81 % (8192 x 8192 GEMM at m = 1), so the spec-sheet ratio carries them within about 10 %
    (measured: 0-12 % on these loads); the band is +-15 % for the attention kernels (FA3 on H200,
    FlashInfer's TensorRT-LLM decode on Blackwell). Prefill (compute-bound): within 0.9-1.4x. The
    wide side is GB200: its measured bf16 GEMM at 8192^3 runs at 1.08 PFLOP/s, 43 % of the 2.5
    PFLOP/s spec sheet, where B200's reaches 1.69 (75 % of 2.25) and GB300's 2.11, so H200 scaled by
    the spec sheets prices a GB200 8k-token prefill 1.36x too fast; the others are within 11 %."""
    arch = load_architecture(LLAMA8)
    own = build_step_model(arch, get_gpu(gpu), 1, "bf16", "bf16")
    scaled = _h200_scaled_to(arch, gpu, 1, "bf16", "bf16")
    for d, p, ctx in LOADS:
        r = float(own.iteration_time_s(iteration_load(own, d, p, ctx))) / float(scaled.iteration_time_s(iteration_load(scaled, d, p, ctx)))
        lo, hi = (0.85, 1.15) if p == 0 else (0.9, 1.4)
        assert lo <= r <= hi, (d, p, ctx, r)


def test_own_fp8_tables_are_slower_than_h200s_scaled_where_the_measured_fp8_gemm_is():
    """Where they disagree, the tables measured why: vLLM 0.24's per-tensor fp8 GEMM streams weights
    at 3.2 TB/s on B200 (41 % of its peak) against 3.0 TB/s on H200 (63 %), so spec-sheet scaling,
    which keeps H200's share, underprices fp8 decode on B200; B200's measured TP-4 all-reduce is
    also slower than H200's scaled by NVLink bandwidth. Llama-3.1-70B fp8 at TP 4: B200's own
    tables are 1.15-1.40x the scaled time, never faster than 0.95x."""
    arch = load_architecture(LLAMA70)
    own = build_step_model(arch, get_gpu("B200"), 4, "fp8", "fp8")
    scaled = _h200_scaled_to(arch, "B200-SXM-180GB", 4, "fp8", "fp8")
    ratios = [float(own.iteration_time_s(iteration_load(own, d, p, c))) / float(scaled.iteration_time_s(iteration_load(scaled, d, p, c)))
              for d, p, c in LOADS]
    assert 0.95 <= min(ratios) and max(ratios) <= 1.45 and np.median(ratios) > 1.1, ratios


def test_an_engines_own_tables_are_used_when_present(tmp_path, monkeypatch):
    shutil.copy(tables_module._DIR / "b200_sxm.npz", tmp_path / "b200_sxm.npz")      # vLLM's only
    # an "sglang" table set for B200: vLLM's tables with every GEMM twice as slow
    with np.load(tmp_path / "b200_sxm.npz") as z:
        data = {k: z[k] for k in z.files}
    data["meta"] = np.array(str(data["meta"]).replace('"engine": "vllm 0.24.0"', '"engine": "sglang 0.5.14"'))
    for k in [k for k in data if k in ("gemm_bf16", "gemm_fp8", "gemm_nvfp4")]:
        data[k] = data[k] * 2
    np.savez_compressed(tmp_path / "b200_sxm__sglang.npz", **data)
    monkeypatch.setattr(tables_module, "_DIR", tmp_path)
    tables_module.load_tables.cache_clear()
    tables_module._load.cache_clear()
    try:
        arch = load_architecture(LLAMA8)
        assert load_tables("B200-SXM-180GB", "sglang").engine == "sglang"
        assert load_tables("B200-SXM-180GB", "trtllm").engine == "vllm"          # none built: vLLM's
        sgl = build_step_model(arch, get_gpu("B200"), 1, "bf16", "bf16", engine="sglang")
        trt = build_step_model(arch, get_gpu("B200"), 1, "bf16", "bf16", engine="trtllm")
        assert "sglang's own kernel tables" in sgl.source_detail
        assert "vllm's kernel tables standing in for trtllm's" in trt.source_detail
        load = iteration_load(sgl, 1.0, 0.0, 100.0)
        assert float(sgl.iteration_parts_s(load)[2]) > 1.6 * float(trt.iteration_parts_s(load)[2])
        gemm_sgl = sgl.curves.layers_gemm_s[0]
        assert gemm_sgl == pytest.approx(2 * trt.curves.layers_gemm_s[0], rel=1e-6)
    finally:
        tables_module.load_tables.cache_clear()
        tables_module._load.cache_clear()
