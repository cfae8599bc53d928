"""The module formats of quantised checkpoints: a 4-bit MoE checkpoint keeps its attention projections in
16 bits (apmw.arch.dtypes.FOUR_BIT_MOE_ATTENTION_DTYPE), NVIDIA's v2 NVFP4 DeepSeek-R1 puts the output
projection in NVFP4 as well (apmw.catalog.models.PUBLISHED_FORMATS), and the step model streams each at its
own bytes and bandwidth."""

from __future__ import annotations

import pytest

from apmw.arch import load_architecture, weight_storage_bytes
from apmw.catalog.gpus import get_gpu
from apmw.catalog.models import checkpoint_weight_dtype
from apmw.perf.parallelism import Layout
from apmw.perf.roofline import RooflineStepModel

FP4, BF16 = weight_storage_bytes("fp4"), weight_storage_bytes("bf16")


def test_deepseek_r1s_output_projections_are_counted_from_its_mla_shape():
    a = load_architecture("deepseek-ai/DeepSeek-R1")
    # wo: 128 heads x v_head_dim 128 -> hidden 7,168, in each of 61 layers
    assert a.attention_output_params == 128 * 128 * 7168 * 61
    llama = load_architecture("meta-llama/Meta-Llama-3.1-8B")
    assert llama.attention_output_params == 32 * 128 * 4096 * 32     # o_proj: 32 heads x 128 -> 4,096, 32 layers


def test_a_4_bit_moe_checkpoint_keeps_its_attention_in_16_bits_and_nothing_else_does():
    r1, oss = load_architecture("deepseek-ai/DeepSeek-R1"), load_architecture("openai/gpt-oss-120b")
    assert r1.attention_dtypes("fp4") == ("bf16", "bf16")
    assert oss.attention_dtypes("fp4") == ("bf16", "bf16")        # gpt-oss's modules_to_not_convert: self_attn
    assert r1.attention_dtypes("fp8") == ("fp8", "fp8")
    assert r1.attention_dtypes("fp8", "fp4") == ("fp8", "fp8")     # experts of their own: the rest's dtype
    assert load_architecture("meta-llama/Meta-Llama-3.1-70B").attention_dtypes("fp4") == ("fp4", "fp4")   # dense
    assert load_architecture("deepseek-ai/DeepSeek-V4-Flash").attention_dtypes("fp4") == ("fp4", "fp4")
    # bytes, by hand: the attention projections at 2 bytes instead of 4.25 bits
    flat = (r1.params - r1.unquantized_params) * FP4 + r1.unquantized_params * BF16
    assert r1.weight_bytes("fp4") == pytest.approx(flat + r1.attention_params * (BF16 - FP4), rel=1e-12)
    assert r1.weight_bytes("fp8") == pytest.approx((r1.params - r1.unquantized_params) * 1.0
                                                   + r1.unquantized_params * BF16, rel=1e-12)


def test_nvidias_v2_nvfp4_deepseek_r1_resolves_with_its_output_projection_in_fp4():
    v2 = load_architecture("nvidia/DeepSeek-R1-0528-FP4-v2")
    assert v2.name == "deepseek-ai/DeepSeek-R1" and checkpoint_weight_dtype("nvidia/DeepSeek-R1-0528-FP4-V2") == "fp4"
    assert v2.attention_dtypes("fp4") == ("bf16", "fp4")
    v1 = load_architecture("nvidia/DeepSeek-R1-0528-FP4")
    assert v1.attention_dtypes("fp4") == ("bf16", "bf16")
    saved = v2.attention_output_params * (BF16 - FP4)                    # wo in NVFP4 instead of BF16
    assert v1.weight_bytes("fp4") - v2.weight_bytes("fp4") == pytest.approx(saved, rel=1e-12)
    assert any("output projection fp4" in n for n in v2.notes)
    # the checkpoint's formats describe it in its own dtype: priced at another, it is the base model there
    assert v2.weight_bytes("bf16") == load_architecture("deepseek-ai/DeepSeek-R1").weight_bytes("bf16")


def _dep8(model: str) -> RooflineStepModel:
    return RooflineStepModel(arch=load_architecture(model), gpu=get_gpu("GB200"), gpus=8, weight_dtype="fp4",
                             kv_dtype="fp8", layout=Layout(tp=1, dp=8, moe_tp=1, ep=8, dense_tp=8), engine="trtllm")


def test_attention_data_parallel_ranks_each_stream_the_16_bit_attention_at_its_bandwidth():
    """Under attention DP every rank reads the whole attention: for a 4-bit MoE its 16-bit projections, at the
    bf16 weight-streaming efficiency; the rest at the 4-bit efficiency."""
    v1, v2 = _dep8("nvidia/DeepSeek-R1-0528-FP4"), _dep8("nvidia/DeepSeek-R1-0528-FP4-v2")
    a, eff, bw = v1.arch, v1.efficiency, v1.gpu.hbm_bandwidth_bytes_per_s
    assert v1.weight_read_bytes_per_gpu(1.0) - v2.weight_read_bytes_per_gpu(1.0) == pytest.approx(
        a.attention_output_params * (BF16 - FP4), rel=1e-9)
    other = v1.weight_read_bytes_per_gpu(1.0) - a.attention_params * BF16
    assert v1.weight_read_s(1.0) == pytest.approx(
        a.attention_params * BF16 / (bw * eff.bandwidth_for("bf16")) + other / (bw * eff.bandwidth_for("fp4")),
        rel=1e-9)
    # held: every one of the eight ranks its own copy of the attention
    assert v1.held_weight_bytes - v2.held_weight_bytes == pytest.approx(
        8 * a.attention_output_params * (BF16 - FP4), rel=1e-9)


def test_a_checkpoint_without_attention_apart_streams_exactly_as_one_average():
    step = RooflineStepModel(arch=load_architecture("deepseek-ai/DeepSeek-R1"), gpu=get_gpu("H200"), gpus=8,
                             weight_dtype="fp8", kv_dtype="fp8")
    assert step.weight_read_s(64.0) == step.weight_read_bytes_per_gpu(64.0) / step._rates.weight_bw
