"""The scaled roofline (apmw.perf.scaled): a spec-sheet GPU borrows a measured GPU's calibrated
iteration, scaled by the two spec sheets' roofline ratio."""

from __future__ import annotations

import csv
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from apmw.arch import load_architecture
from apmw.catalog.gpus import get_gpu
from apmw.perf import RooflineStepModel, build_step_model
from apmw.perf.calibrated import CalibratedStepModel
from apmw.perf.calibrated import calibration_gap
from apmw.perf.efficiency import efficiency_for_gpu
from apmw.perf.scaled import _STAND_IN_DTYPE, ScaledStepModel, reference_gpu, step_time_basis
from apmw.capacity.benchmark import predict
from tests.perf.loads import iteration_load

LLAMA8 = "meta-llama/Llama-3.1-8B-Instruct"
ROOT = Path(__file__).resolve().parents[2]
SILICON = ROOT / "bench" / "data" / "aiconfigurator_silicon_sample.csv"


def _from_h200(arch, gpu: str, gpus: int, w: str, kv: str, engine: str = "vllm") -> ScaledStepModel:
    """H200's calibrated iteration scaled to ``gpu``: what every Blackwell part got before it had
    tables of its own, and still gets for a shape its own tables lack (SCALED_FROM_WHERE_UNCOVERED)."""
    h200 = get_gpu("H200")
    for rw in dict.fromkeys((w, _STAND_IN_DTYPE.get(w, w))):
        for rkv in dict.fromkeys((kv, _STAND_IN_DTYPE.get(kv, kv))):
            if calibration_gap(arch, h200, gpus, rw, rkv) is None:
                ref = CalibratedStepModel(arch=arch, gpu=h200, gpus=gpus, weight_dtype=rw, kv_dtype=rkv,
                                          efficiency=efficiency_for_gpu(h200.name), engine=engine)
                g = get_gpu(gpu)
                return ScaledStepModel(arch=arch, gpu=g, gpus=gpus, weight_dtype=w, kv_dtype=kv,
                                       efficiency=efficiency_for_gpu(g.name), reference=ref)
    raise AssertionError("H200's tables do not cover this replica")




def test_scaling_a_measured_gpu_onto_itself_changes_nothing():
    arch = load_architecture(LLAMA8)
    for gpus, engine in ((1, "vllm"), (2, "trtllm")):
        cal = build_step_model(arch, get_gpu("H200"), gpus, "fp8", "fp8", engine=engine)
        assert isinstance(cal, CalibratedStepModel)
        same = ScaledStepModel(arch=arch, gpu=cal.gpu, gpus=gpus, weight_dtype="fp8", kv_dtype="fp8", reference=cal)
        for decode, prefill, ctx in ((1, 0, 1000), (64, 0, 4000), (32, 2048, 2000), (0, 8192, 0)):
            load = iteration_load(cal, decode, prefill, ctx)
            assert float(same.iteration_time_s(load)) == pytest.approx(float(cal.iteration_time_s(load)), rel=1e-12)


def test_spec_sheet_gpus_scale_from_their_measured_relative_and_others_stay_on_the_plain_roofline():
    arch = load_architecture(LLAMA8)
    for gpu, ref in (("H100-PCIe", "H100-SXM5-80GB"), ("H800", "H100-SXM5-80GB")):
        step = build_step_model(arch, get_gpu(gpu), 1, "bf16", "bf16")
        assert isinstance(step, ScaledStepModel), gpu
        assert step.source == "scaled"              # nothing was measured on this GPU: a relative was
        assert step.reference.gpu.name == ref and ref in step.source_detail
    for gpu in ("A100", "MI300X", "L40S", "H20"):
        step = build_step_model(arch, get_gpu(gpu), 1, "bf16", "bf16")
        assert type(step) is RooflineStepModel, gpu
    # Blackwell parts have their own tables now
    for gpu in ("B200", "B300", "GB200", "GB300"):
        assert isinstance(build_step_model(arch, get_gpu(gpu), 1, "bf16", "bf16"), CalibratedStepModel), gpu
    # a catalogue GPU with an overridden figure scales from its own stock part
    faster = replace(get_gpu("H200"), hbm_bandwidth_bytes_per_s=2 * get_gpu("H200").hbm_bandwidth_bytes_per_s)
    assert reference_gpu(faster) == get_gpu("H200")
    assert reference_gpu(replace(get_gpu("H200"), name="custom")) is None
    # --roofline (calibrated=False) keeps the plain spec-sheet model
    assert type(build_step_model(arch, get_gpu("B200"), 1, "bf16", "bf16", calibrated=False)) is RooflineStepModel


def test_h800_runs_h100s_kernels_and_only_its_all_reduces_slow_down():
    # the same GH100 silicon with NVLink cut from 450 to 200 GB/s per direction
    arch = load_architecture("meta-llama/Llama-3.1-70B-Instruct")
    h800 = build_step_model(arch, get_gpu("H800"), 4, "fp8", "fp8")
    load = iteration_load(h800, 0.0, 8192.0, 0.0)
    ref = h800.reference.iteration_parts_s(h800.reference_load(load))
    own = h800.iteration_parts_s(load)
    assert float(own[2]) == pytest.approx(float(ref[2]), rel=1e-9)
    assert float(own[1]) / float(ref[1]) == pytest.approx(450 / 200, rel=0.05)


def test_a_shape_blackwell_tables_lack_is_scaled_from_h200():
    # GB200's all-reduce rows stop at 4 GPUs (a compute tray); at TP 8 it scales from H200 as before
    arch = load_architecture("meta-llama/Llama-3.1-70B-Instruct")
    step = build_step_model(arch, get_gpu("GB200"), 8, "fp8", "fp8")
    assert isinstance(step, ScaledStepModel) and step.reference.gpu.name == "H200-SXM-141GB"
    assert isinstance(build_step_model(arch, get_gpu("GB200"), 4, "fp8", "fp8"), CalibratedStepModel)
    assert step_time_basis("GB200 (per GPU)") == "calibrated"


def test_decode_scales_by_the_bandwidth_ratio_and_prefill_by_the_peak_ratio():
    arch = load_architecture(LLAMA8)
    h200 = build_step_model(arch, get_gpu("H200"), 1, "bf16", "bf16")
    b200 = _from_h200(arch, "B200", 1, "bf16", "bf16")
    overhead = h200.iteration_parts_s(iteration_load(h200, 1, 0, 0))[0]     # host work, not scaled

    def kernels(step, decode, prefill, ctx):
        return float(step.iteration_time_s(iteration_load(step, decode, prefill, ctx))) - overhead

    # batch-1 decode streams the weights: B200 / H200 HBM bandwidth, 4.8 / 7.7 TB/s
    assert kernels(b200, 1, 0, 1000) / kernels(h200, 1, 0, 1000) == pytest.approx(4.8 / 7.7, rel=0.03)
    # a long prefill is compute-bound: the dense bf16 peaks, 989 / 2250 TFLOP/s
    assert kernels(b200, 0, 8192, 0) / kernels(h200, 0, 8192, 0) == pytest.approx(989 / 2250, rel=0.03)


def test_formats_the_tables_lack_read_the_fp8_tables_and_move_fewer_bytes():
    arch = load_architecture(LLAMA8)
    fp8 = _from_h200(arch, "B200", 1, "fp8", "fp8")
    fp4 = _from_h200(arch, "B200", 1, "fp4", "fp4")
    assert isinstance(fp4, ScaledStepModel)
    assert (fp4.reference.weight_dtype, fp4.reference.kv_dtype) == ("fp8", "fp8")
    # batch-1 decode at a long context streams the active weights and KV: fp4 (NVFP4 with its block scales,
    # 16-bit lm_head; the input embedding only looked up) over fp8 is their bytes ratio, about 0.59 for
    # Llama-3.1-8B
    t8 = float(fp8.iteration_time_s(iteration_load(fp8, 1, 0, 32000)))
    t4 = float(fp4.iteration_time_s(iteration_load(fp4, 1, 0, 32000)))
    overhead = fp8.reference.iteration_parts_s(iteration_load(fp8, 1, 0, 0))[0]
    bytes4 = arch.active_weight_bytes("fp4") + 32000 * fp4.kv_bytes_per_token
    bytes8 = arch.active_weight_bytes("fp8") + 32000 * fp8.kv_bytes_per_token
    assert (t4 - overhead) / (t8 - overhead) == pytest.approx(bytes4 / bytes8, rel=0.05)


def test_tp_all_reduces_scale_by_the_scale_up_bandwidth():
    # a long prefill's all-reduces are bandwidth-bound: GB200's NVLink 5 (900 GB/s) against
    # the H200's NVLink 4 (450 GB/s)
    arch = load_architecture("meta-llama/Llama-3.1-70B-Instruct")
    step = _from_h200(arch, "GB200", 4, "fp8", "fp8", engine="trtllm")
    load = iteration_load(step, 0.0, 8192.0, 0.0)
    comm = float(step.iteration_parts_s(load)[1])
    ref_comm = float(step.reference.iteration_parts_s(step.reference_load(load))[1])
    assert ref_comm > 0
    assert comm / ref_comm == pytest.approx(450 / 900, rel=0.05)


def test_the_reference_reads_the_same_kv_tokens_in_its_own_format():
    arch = load_architecture(LLAMA8)
    step = build_step_model(arch, get_gpu("B200"), 1, "fp8", "fp4")     # B200's own fp8-KV tables
    assert step.reference.gpu.name == "B200-SXM-180GB"
    assert step.reference.kv_dtype == "fp8" and step.kv_bytes_per_token < step.reference.kv_bytes_per_token
    load = iteration_load(step, 64.0, 0.0, 30000.0)
    seen = step.reference_load(load)
    assert seen.kv_read_bytes / step.reference.kv_bytes_per_token == pytest.approx(64 * 30000)


def test_the_ratio_is_taken_over_the_rows_a_cuda_graph_computes():
    # decode batches 33 and 40 both run the 40-row CUDA graph: the same GEMMs, the same ratio
    arch = load_architecture(LLAMA8)
    step = _from_h200(arch, "B300", 1, "fp4", "fp4")
    def ratio(batch):
        load = iteration_load(step, batch, 0.0, 1.0)
        return float(step.iteration_parts_s(load)[2] / step.reference.iteration_parts_s(step.reference_load(load))[2])

    assert ratio(33.0) == pytest.approx(ratio(40.0), rel=1e-4)
    assert ratio(33.0) != pytest.approx(ratio(41.0), rel=1e-3)     # 41 runs the 48-row graph


def test_a_4bit_moe_runs_its_attention_and_dense_gemms_at_the_bf16_rate():
    # gpt-oss-120b quantises only its experts (MXFP4); Hopper runs them as W4A16 at the bf16 rate,
    # Blackwell natively at fp4. Priced wholly at fp4, an 8192-token prefill would run 5.8x faster
    # on a B200 than on an H200; with attention and the dense GEMMs at bf16 it is 3.9x.
    arch = load_architecture("openai/gpt-oss-120b")
    step = _from_h200(arch, "B200", 1, "fp4", "bf16")
    load = iteration_load(step, 0.0, 8192.0, 0.0)
    ratio = float(step.iteration_parts_s(load)[2] / step.reference.iteration_parts_s(load)[2])
    assert 1 / ratio == pytest.approx(3.87, rel=0.03)


def test_a_scaled_model_needs_its_reference():
    with pytest.raises(TypeError, match="reference"):
        ScaledStepModel(arch=load_architecture(LLAMA8), gpu=get_gpu("B200"), gpus=1, weight_dtype="bf16",
                        kv_dtype="bf16")


@pytest.mark.parametrize("model, gpu, tp, w, kv, engine", [
    ("meta-llama/Llama-3.1-70B-Instruct", "B200", 1, "fp8", "fp8", "trtllm"),
    ("meta-llama/Llama-3.1-70B-Instruct", "GB200", 4, "fp8", "fp8", "trtllm"),
    (LLAMA8, "B200", 1, "bf16", "bf16", "vllm"),
    (LLAMA8, "B300", 1, "fp4", "fp4", "vllm"),
    (LLAMA8, "H100-PCIe", 1, "fp8", "fp8", "vllm"),
    ("openai/gpt-oss-120b", "B200", 2, "fp4", "bf16", "vllm"),
    ("Qwen/Qwen3-32B", "B300", 2, "fp8", "bf16", "sglang")])
def test_more_tokens_or_more_kv_is_never_faster_beyond_a_small_dip(model, gpu, tp, w, kv, engine):
    """The grids of tests/perf/test_calibrated.py. The scaled time can dip slightly where the padded
    batch grows and the ratio shifts towards the compute ratio faster than the measured time rises:
    at most 1.04 % on these grids (Llama-3.1-8B fp4 on B300, decode batch 32 -> 33, whose CUDA-graph
    size jumps to 40 rows; the 14 PFLOP/s fp4 peak makes the compute ratio 0.14); the bound is 1.5 %."""
    arch = load_architecture(model)
    step = (build_step_model(arch, get_gpu(gpu), tp, w, kv, engine=engine) if gpu == "H100-PCIe"
            else _from_h200(arch, gpu, tp, w, kv, engine=engine))
    assert isinstance(step, ScaledStepModel)

    def rises(t):
        return np.all(np.diff(t) >= -0.015 * t[1:])

    decode = np.arange(1, 1025, dtype=float)
    for ctx in (1.0, 500.0, 8000.0, 100_000.0):
        assert rises(step.iteration_time_s(iteration_load(step, decode, 0.0, ctx))), f"decode batch, ctx {ctx}"
    prefill = np.arange(0, 40_000, 97, dtype=float)
    for d in (0.0, 8.0, 200.0):
        assert rises(step.iteration_time_s(iteration_load(step, d, prefill, 2000.0))), f"prefill tokens, decode {d}"
    ctx = np.geomspace(1, 300_000, 400)
    for d in (1.0, 64.0, 700.0):
        assert rises(step.iteration_time_s(iteration_load(step, d, 0.0, ctx))), f"context, decode {d}"


def _silicon_errors(plain: bool) -> tuple[list[float], list[float]]:
    """|TPOT| and |TTFT| errors (%) on NVIDIA's MiniMax-M2.5 runs on B200 and B300 (vLLM 0.19), held out.

    The rows the scaled roofline covered: aggregated serving with plain tensor parallelism at TP 1,
    2 or 4 (aiconfigurator measured no fused-MoE kernel for MiniMax at TP 8 on the H200), fp8 or
    fp4 weights, bf16 KV assumed (bench/data/SOURCES.md).
    """
    tpot, ttft = [], []
    for r in csv.DictReader(SILICON.open()):
        if not (r["system"] in ("b200_sxm", "b300_sxm") and r["model_path"] == "MiniMaxAI/MiniMax-M2.5"
                and r["mode"] == "agg" and r["attention_dp_size"] == "1" and r["moe_ep_size"] in ("", "1")
                and r["tp_size"] in ("1", "2", "4")):
            continue
        conc = int(r["silicon_data_source"].split("silicon_concurrency=")[1].split(";")[0])
        p = predict(r["model_path"], r["system"].split("_")[0], int(r["tp_size"]), r["precision"], "bf16",
                    int(r["isl"]), int(r["osl"]), conc, engine="vllm", calibrated=not plain)
        assert p.source == ("roofline" if plain else "calibrated")     # B200 and B300 have their own tables
        assert ("b200_sxm" in p.source_detail or "b300_sxm" in p.source_detail) is not plain
        tpot.append(abs(p.tpot_s * 1e3 / float(r["silicon_tpot_ms"]) - 1) * 100)
        ttft.append(abs(p.ttft_s * 1e3 / float(r["silicon_ttft_ms"]) - 1) * 100)
    return tpot, ttft


def test_held_out_blackwell_runs_stay_within_the_documented_errors():
    """On these 138 rows B200's and B300's own tables (issue 22) give median |TPOT error| 9.8 % and
    |TTFT error| 26.0 %; H200's iteration scaled to them gave 16.9 % and 19.1 % (docs/accuracy.md,
    before issue 22), the plain roofline 23.2 % and 20.2 %. The bounds leave a little room. (The
    TTFT rise is prefill: the tables' fused-MoE and GEMM times under the served MoE ceiling, scaled
    from Hopper by the bf16 peak, where the scaling took fp4 experts at the fp4 peak ratio.)"""
    tpot, ttft = _silicon_errors(plain=False)
    assert len(ttft) == 138
    assert statistics.median(tpot) <= 11.0
    assert statistics.median(ttft) <= 27.5
    plain_tpot, _ = _silicon_errors(plain=True)
    assert statistics.median(plain_tpot) > statistics.median(tpot) + 3


def test_the_gpu_catalogue_says_how_each_gpu_is_priced():
    import json

    from typer.testing import CliRunner

    import apmw.cli
    from apmw.cli import app

    apmw.cli._register_verbs()   # every verb, as the `apmw` entry point does
    r = CliRunner().invoke(app, ["model", "--gpus", "--json"])
    assert r.exit_code == 0, r.output
    basis = {g["name"]: g["step_times"] for g in json.loads(r.output)["gpus"]}
    assert basis["H200-SXM-141GB"] == basis["H100-SXM5-80GB"] == "calibrated"
    assert basis["B200-SXM-180GB"] == basis["GB300 (per GPU)"] == "calibrated"
    assert basis["H100-PCIe-80GB"] == basis["H800-SXM5-80GB"] == "scaled from H100-SXM5-80GB"
    assert basis["H20-96GB"] == "plain roofline"
    assert basis["MI300X"] == basis["A100-SXM4-80GB"] == "plain roofline"
