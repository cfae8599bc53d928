"""The plain roofline (apmw.perf.roofline.RooflineStepModel): each FLOP at its kernel's rate, and the served MoE ceiling."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from apmw.arch import load_architecture
from apmw.catalog.gpus import get_gpu
from apmw.perf import DEFAULT_EFFICIENCY, IterationLoad, RooflineStepModel, served_moe
from apmw.perf.tables import load_tables


def _plain(model: str, gpu: str, gpus: int, weights: str, kv: str, **eff) -> RooflineStepModel:
    return RooflineStepModel(arch=load_architecture(model), gpu=get_gpu(gpu), gpus=gpus, weight_dtype=weights, kv_dtype=kv,
                     efficiency=replace(DEFAULT_EFFICIENCY, **eff))


def _prefill(tokens: float, attention_flops: float = 0.0) -> IterationLoad:
    return IterationLoad(decode_seqs=0.0, prefill_tokens=tokens, kv_read_bytes=0.0, attention_flops=attention_flops)


def test_attention_runs_at_the_bf16_rate_whatever_the_weight_format():
    step = _plain("meta-llama/Llama-3.1-8B-Instruct", "H200", 1, "fp8", "fp8")
    _, gemms = step.roofline_terms(_prefill(4096.0))
    _, both = step.roofline_terms(_prefill(4096.0, attention_flops=1e14))
    bf16 = 989e12 * DEFAULT_EFFICIENCY.flops_for("bf16")
    assert float(both - gemms) == pytest.approx(1e14 / bf16, rel=1e-9)
    fp8 = 1978e12 * DEFAULT_EFFICIENCY.flops_for("fp8")
    assert float(gemms) == pytest.approx(step.arch.flops_per_token() * 4096 / fp8, rel=1e-9)


def test_a_4bit_moe_computes_only_its_experts_at_the_4bit_rate():
    # gpt-oss quantises its experts to MXFP4 and keeps attention, router and LM head in bf16; on a
    # B200 the experts run at the native fp4 peak and the rest at the bf16 peak
    step = _plain("openai/gpt-oss-120b", "B200", 1, "fp4", "bf16")
    a = step.arch
    # counted from the config: every layer routes each token to 4 experts of 3 matrices each
    expert_flops = 2 * a.moe_layers * a.experts_per_token * 3 * a.hidden_size * a.expert_intermediate_size * 8192
    dense_flops = a.flops_per_token() * 8192 - expert_flops
    _, compute = step.roofline_terms(_prefill(8192.0))
    expected = (expert_flops / (9000e12 * DEFAULT_EFFICIENCY.flops_for("fp4"))
                + dense_flops / (2250e12 * DEFAULT_EFFICIENCY.flops_for("bf16")))
    # (the config count leaves out the experts' biases: 0.03 % of their parameters)
    assert float(compute) == pytest.approx(expected, rel=1e-3)


def test_served_moe_ceiling_caps_routed_expert_gemms_at_the_hopper_fit_and_at_blackwells_kernel():
    # Hopper: the fitted 150 TFLOP/s per GPU; Blackwell: the measured fused-MoE kernel of the replica's own
    # expert shape, dtype and expert TP (vLLM's table on B200: DeepSeek's 256 x 2048 experts, fp8 block, TP 8)
    b200 = load_tables(get_gpu("B200").name)
    kernel = 8192 * 6 * 7168 * 2048 * 8 / 8 / float(
        np.interp(8192, b200["moe_tokens"], b200["moe_fp8block_7168_2048_8_256_tp8"]))
    for gpu, bf16, ceiling in (("H200", 989e12, 150e12), ("B200", 2250e12, served_moe.BLACKWELL_SHARE * kernel)):
        capped = _plain("deepseek-ai/DeepSeek-V3", gpu, 8, "fp8", "fp8")
        table = _plain("deepseek-ai/DeepSeek-V3", gpu, 8, "fp8", "fp8", served_moe_flops_per_s=None)
        assert capped.served_moe.flops_per_s == pytest.approx(ceiling, rel=1e-12)
        a = capped.arch
        expert_params = (a.params - a.active_params) / (a.num_experts - a.experts_per_token)
        expert_flops = 2 * a.experts_per_token * expert_params * 16384 / 8
        rate = bf16 * 2 * DEFAULT_EFFICIENCY.flops_for("fp8")          # the fp8 peak is twice the bf16 one
        load = _prefill(16384.0)
        extra = float(capped.served_compute_s(load) - table.served_compute_s(load))
        assert extra == pytest.approx(expert_flops * (1 / ceiling - 1 / rate), rel=1e-9)
        # a long prefill is compute-bound, so the iteration pays it in full
        assert float(capped.iteration_time_s(load) - table.iteration_time_s(load)) == pytest.approx(extra, rel=1e-9)
    # a decode step is bandwidth-bound: the ceiling does not move it
    capped = _plain("deepseek-ai/DeepSeek-V3", "H200", 8, "fp8", "fp8")
    table = _plain("deepseek-ai/DeepSeek-V3", "H200", 8, "fp8", "fp8", served_moe_flops_per_s=None)
    decode = IterationLoad(decode_seqs=np.array([1.0, 32.0]), prefill_tokens=0.0,
                           kv_read_bytes=np.array([1.0, 32.0]) * 4096 * capped.kv_bytes_per_token,
                           attention_flops=0.0)
    np.testing.assert_allclose(capped.iteration_time_s(decode), table.iteration_time_s(decode), rtol=1e-12)
    # dense models have no routed experts
    llama = _plain("meta-llama/Llama-3.1-8B-Instruct", "H200", 1, "fp8", "fp8")
    load = _prefill(8192.0)
    assert float(llama.served_compute_s(load)) == float(llama.roofline_terms(load)[1])


def _decode(seqs: float) -> IterationLoad:
    return IterationLoad(decode_seqs=seqs, prefill_tokens=0.0, kv_read_bytes=0.0, attention_flops=0.0)


@pytest.mark.parametrize("model, launches", [
    # 32 layers x (fused qkv, o, gate/up, down) + lm_head
    ("meta-llama/Llama-3.1-8B-Instruct", 32 * 4 + 1),
    # 61 MLA layers x 5 projections; 3 dense MLPs x 2; 58 MoE layers x (router, routed pair, shared pair); lm_head
    ("deepseek-ai/DeepSeek-V3", 61 * 5 + 3 * 2 + 58 * 5 + 1),
])
def test_the_roofline_charges_each_gemm_launch_once_per_step(model, launches):
    step = _plain(model, "H200", 8, "bf16", "bf16")
    assert step.gemm_launches == launches
    without = _plain(model, "H200", 8, "bf16", "bf16", gemm_launch_s=0.0)
    for seqs in (1.0, 64.0):
        extra = float(step.iteration_time_s(_decode(seqs)) - without.iteration_time_s(_decode(seqs)))
        assert extra == pytest.approx(launches * DEFAULT_EFFICIENCY.gemm_launch_s, rel=1e-9)


def test_the_roofline_gemm_cost_matches_one_token_gemms_measured_on_an_h200():
    """Per GEMM the roofline charges its launch plus its weights at the streaming bandwidth. At the per-rank
    shapes measured on an H200 (bench/data/h200_kernels.json; docs/accuracy.md, "Measured on an H200") that
    is within 10 % of a layer's measured one-token bf16 GEMMs for Llama-3.1-8B TP1, Llama-3.1-70B TP8 and
    DeepSeek-V3 TP8; bytes alone at the bandwidth with launches left in (before session 33) were 2-33 % short."""
    import json
    from pathlib import Path

    runs = json.loads((Path(__file__).resolve().parents[2] / "bench" / "data" / "h200_kernels.json").read_text())
    rows = [r for r in runs["sections"]["gemm"]["rows"]
            if r["dtype"] == "bf16" and r["m"] == 1 and r["layer"] != "lm_head"]
    bw = get_gpu("H200").hbm_bandwidth_bytes_per_s * DEFAULT_EFFICIENCY.bandwidth_for("bf16")
    for model in {r["model"] for r in rows}:
        layer = [r for r in rows if r["model"] == model]
        measured = sum(r["time_s"] for r in layer)
        charged = sum(DEFAULT_EFFICIENCY.gemm_launch_s + 2 * r["n"] * r["k"] / bw for r in layer)
        assert charged / measured == pytest.approx(1.0, abs=0.10), model


@pytest.mark.parametrize("model,gpu,gpus,weights,layout", [
    ("deepseek-ai/DeepSeek-V3", "H200", 8, "fp8", {"tp": 1, "dp_attention": 8, "ep": 8}),   # plain roofline, DP x EP
    ("meta-llama/Meta-Llama-3.1-8B", "H100", 1, "bf16", None),                            # calibrated
    ("meta-llama/Meta-Llama-3.1-8B", "H100-PCIe-80GB", 1, "bf16", None),                  # scaled
])
def test_time_and_compute_share_price_what_the_two_calls_price(model, gpu, gpus, weights, layout):
    """Engine curves ask for both at once (the plain roofline prices its terms once); the answer is the two
    separate calls', to the bit, on every estimator."""
    from apmw.perf import build_step_model
    from apmw.perf.parallelism import layout_of
    from apmw.spec import Serving

    lay = layout_of(Serving(parallelism=layout), gpus) if layout else None
    step = build_step_model(load_architecture(model), get_gpu(gpu), gpus, weights, "bf16", layout=lay,
                            engine="sglang" if layout else "vllm")
    b = np.arange(1.0, 65.0)[:, None]
    load = IterationLoad(b, np.array([[0.0, 512.0, 4096.0]]), b * 2e8, b * 1e9)
    assert step.source == ("roofline" if layout else "scaled" if "PCIe" in gpu else "calibrated")
    t, share = step.time_and_compute_share(load)
    assert np.array_equal(t, step.iteration_time_s(load)) and np.array_equal(share, step.compute_share(load))
