"""The module formats of quantised checkpoints: a 4-bit MoE checkpoint keeps its attention projections in
16 bits (apmw.arch.dtypes.FOUR_BIT_MOE_ATTENTION_DTYPE), NVIDIA's v2 NVFP4 DeepSeek-R1 puts the output
projection in NVFP4 as well (apmw.catalog.models.PUBLISHED_FORMATS), and the step model streams each at its
own bytes and bandwidth."""

from __future__ import annotations

import pytest

from apmw.arch import load_architecture, summary, weight_storage_bytes
from apmw.catalog.gpus import get_gpu
from apmw.catalog.checkpoint_formats import compressed_tensors_format
from apmw.catalog.models import checkpoint_weight_dtype, config_weight_dtype
from apmw.errors import ConfigError
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


def test_kimi_k25s_config_keeps_attention_shared_experts_and_dense_mlps_in_16_bits():
    """Kimi-K2.5's compressed-tensors config: int4 in groups of 32 with a bf16 scale (4.5 bits) on every Linear
    layer its ignore list does not name (self_attn, shared_experts, the dense layer's mlp, lm_head)."""
    k = load_architecture("moonshotai/Kimi-K2.5")
    form = k.checkpoint_format
    assert (form.weight_dtype, form.attention_dtype, form.attention_output_dtype, form.dense_ffn_dtype) == (
        "int4", "bf16", "bf16", "bf16")
    assert form.bits_per_weight == 4 + 16 / 32
    assert config_weight_dtype("moonshotai/Kimi-K2.5") == "int4" and k.expert_dtype_in_checkpoint == "int4"
    # by hand: one shared expert (3 x 7,168 x 2,048) in each of 60 MoE layers, one dense MLP (3 x 7,168 x 18,432)
    assert k.dense_ffn_params == 60 * 3 * 7168 * 2048 + 3 * 7168 * 18432
    by_hand = (k.routed_expert_params * 4.5 / 8
               + (k.attention_params + k.dense_ffn_params + k.unquantized_params) * BF16)
    assert k.weight_bytes("int4") == pytest.approx(by_hand, rel=1e-12)
    assert k.weight_bytes("int4") / 1e9 == pytest.approx(594.2, abs=0.1)
    assert any("groups of 32" in n and "shared experts" in n for n in k.notes)
    assert summary(k)["weight_bytes"]["int4"] == k.weight_bytes("int4")          # apmw model shows its own dtype
    # priced at another dtype it is not this checkpoint: apmw's 4-bit MoE rule (only attention 16-bit)
    assert k.part_dtypes("fp4") == ("bf16", "bf16", "fp4")
    assert k.expert_bytes_per_param("fp4") == FP4


def test_the_step_model_streams_each_part_at_its_bytes_and_its_dtypes_bandwidth():
    """A decode step at batch 1 reads the attention, the dense FFN, lm_head, norms and routers, and the top-k
    experts: the active weights, never the input embedding; Kimi-K2.5's 16-bit dense FFN at the bf16 bandwidth."""
    k = load_architecture("moonshotai/Kimi-K2.5")
    step = RooflineStepModel(arch=k, gpu=get_gpu("B200"), gpus=8, weight_dtype="int4", kv_dtype="fp8")
    c, eff, bw = step._rates, step.efficiency, step.gpu.hbm_bandwidth_bytes_per_s
    experts = c.num_experts * (1 - c.expert_miss) * c.expert_params * c.expert_bytes_per_param
    assert 8 * step.weight_read_bytes_per_gpu(1.0) == pytest.approx(
        k.active_weight_bytes("int4") - k.active_routed_expert_params * 4.5 / 8 + experts, rel=1e-12)
    sixteen_bit = (k.attention_params + k.dense_ffn_params) * BF16
    lm_head_norms_routers = k.active_read_unquantised_params * BF16
    assert 8 * step.weight_read_s(1.0) == pytest.approx(
        sixteen_bit / (bw * eff.bandwidth_for("bf16"))
        + (lm_head_norms_routers + experts) / (bw * eff.bandwidth_for("int4")), rel=1e-9)
    dense = RooflineStepModel(arch=load_architecture("meta-llama/Meta-Llama-3.1-8B"), gpu=get_gpu("A100"), gpus=1,
                              weight_dtype="bf16", kv_dtype="bf16")
    assert dense.weight_read_bytes_per_gpu(1.0) == pytest.approx(dense.arch.active_weight_bytes("bf16"), rel=1e-12)
    assert dense.arch.active_weight_bytes("bf16") == pytest.approx(
        dense.arch.weight_bytes("bf16") - dense.arch.embedding_params * BF16, rel=1e-12)


KIMI_SCHEME = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
    "num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "symmetric": True}}},
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]}


@pytest.mark.parametrize("change, message", [
    ({"config_groups": {}}, "0 weight schemes"),
    ({"config_groups": {"a": KIMI_SCHEME["config_groups"]["group_0"], "b": KIMI_SCHEME["config_groups"]["group_0"]}},
     "2 weight schemes"),
    ({"config_groups": {"g": {"weights": {"num_bits": 3, "type": "int"}}}}, "3-bit int is not one apmw prices"),
    ({"ignore": ["re:.*experts.*"]}, "leaves the routed experts unquantised"),
    ({"ignore": ["re:.*shared_experts.*"]}, "only one of the shared experts and the dense MLPs"),
    ({"ignore": ["re:(unclosed"]}, "is not a valid pattern"),
    # shapes whose match can take exponential time in Python's backtracking engine (the first hung for minutes)
    ({"ignore": ["re:(.|.)*Z"]}, "can take exponential time"),
    ({"ignore": ["lm_head", "re:(a+)+$"]}, "can take exponential time"),
    # a counted repeat of an optional part (fuzz round 6: `apmw model` ran past 90 s)
    ({"ignore": ["re:(?:.?){40}Z"]}, "can take exponential time"),
    ({"ignore": ["re:(?:.?.?){30}Z"]}, "can take exponential time"),
    ({"ignore": ["re:.*.*.*.*.*Z"]}, "more than 4 times without bound"),
    ({"ignore": "lm_head"}, "is not a list"),
    ({"config_groups": {"g": {"weights": {**KIMI_SCHEME["config_groups"]["group_0"]["weights"], "num_bits": [4]}}}},
     "num_bits \\[4\\] is not a whole number"),
    ({"config_groups": {"g": {"weights": {**KIMI_SCHEME["config_groups"]["group_0"]["weights"], "symmetric": "no"}}}},
     "symmetric 'no' is not true or false"),
    ({"config_groups": {"g": {"targets": ["re:.*experts.*"], "weights": {"num_bits": 4, "type": "int"}}}},
     "targets every Linear layer"),
    ({"config_groups": ["group_0"]}, "is not a mapping of schemes"),
    ({"config_groups": {"g": {"weights": "w4a16"}}}, "is not a mapping"),
    ({"config_groups": {"g": {"weights": {**KIMI_SCHEME["config_groups"]["group_0"]["weights"], "group_size": -32}}}},
     "group_size -32 is not a positive whole number"),
    ({"config_groups": {"g": {"weights": {**KIMI_SCHEME["config_groups"]["group_0"]["weights"], "group_size": "32"}}}},
     "group_size '32' is not a positive whole number"),
])
def test_a_compressed_tensors_layout_apmw_cannot_price_is_refused_with_the_reason(change, message):
    with pytest.raises(ConfigError, match=message):
        compressed_tensors_format({**KIMI_SCHEME, **change}, "my/ckpt")


def test_ignore_patterns_real_checkpoints_write_are_read():
    """Repeats, groups and alternatives that do not nest: what published ignore lists hold."""
    for pattern in ["re:.*mlp\\.gate$", "re:model\\.layers\\.\\d+\\.mlp\\.(gate|router)$",
                    "re:(model\\.)?lm_head", "re:.*(q_proj|k_proj).*"]:
        assert compressed_tensors_format({**KIMI_SCHEME, "ignore": [*KIMI_SCHEME["ignore"], pattern]}, "x") is not None


def test_compressed_tensors_bits_count_the_scales_and_zero_points_a_scheme_stores():
    group = KIMI_SCHEME["config_groups"]["group_0"]["weights"]
    nvfp4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True}
    cases = [(group, 4.5), ({**group, "group_size": 128, "symmetric": False}, 4.25), (nvfp4, 4.5),
             ({"num_bits": 8, "type": "float", "strategy": "channel"}, 8.0),
             # compressed-tensors' defaults: symmetric, and a group strategy where a group size is given
             ({**group, "symmetric": None}, 4.5), ({**group, "strategy": None}, 4.5)]
    for weights, bits in cases:
        scheme = {**KIMI_SCHEME, "config_groups": {"g": {"weights": weights}}, "ignore": ["lm_head"]}
        form = compressed_tensors_format(scheme, "my/ckpt")
        assert form.bits_per_weight == bits
        assert (form.attention_dtype, form.dense_ffn_dtype) == (form.weight_dtype, form.weight_dtype)
    assert compressed_tensors_format({"quant_method": "fp8"}, "x") is None


def test_the_non_expert_gemms_of_a_4_bit_moe_run_each_at_its_parts_rate():
    """NVFP4 DeepSeek-R1 on B200: attention at the bf16 peak (the rule keeps it 16-bit), shared experts and dense
    MLPs at the FP4 peak (stored 4-bit), lm_head and routers at bf16; an FP8 checkpoint runs them all at FP8."""
    a = load_architecture("deepseek-ai/DeepSeek-R1")
    gpu = get_gpu("B200")
    step = RooflineStepModel(arch=a, gpu=gpu, gpus=8, weight_dtype="fp4", kv_dtype="fp8")
    eff = step.efficiency
    bf16, fp4 = gpu.flops_for("bf16") * eff.flops_for("bf16"), gpu.flops_for("fp4") * eff.flops_for("fp4")
    experts = a.experts_per_token * a.routed_expert_params // (a.moe_layers * a.num_experts) * a.moe_layers
    lm_head_and_routers = a.active_params - a.embedding_params - experts - a.dense_ffn_params - a.attention_params
    seconds_per_flop = (a.attention_params / bf16 + a.dense_ffn_params / fp4 + lm_head_and_routers / bf16)
    assert step._rates.dense_rate == pytest.approx(
        (a.attention_params + a.dense_ffn_params + lm_head_and_routers) / seconds_per_flop, rel=1e-9)
    assert fp4 > step._rates.dense_rate > bf16
    fp8 = RooflineStepModel(arch=a, gpu=gpu, gpus=8, weight_dtype="fp8", kv_dtype="fp8")
    assert fp8._rates.dense_rate == pytest.approx(gpu.flops_for("fp8") * eff.flops_for("fp8"), rel=1e-12)


def test_the_calibrated_path_times_each_part_with_its_dtypes_measured_gemm():
    """NVFP4 DeepSeek-R1: attention projections and lm_head from the bf16 GEMM table, shared experts and dense
    MLPs from the NVFP4 one on Blackwell, from bf16 where no FP4 table was measured (Hopper runs them W4A16)."""
    from apmw.perf.calibrated import _dense_gemm_dtype, _ffn_gemm_dtype, _lm_head_gemm_dtype
    from apmw.perf.tables import load_tables
    r1 = load_architecture("deepseek-ai/DeepSeek-R1")
    b200, h200 = load_tables(get_gpu("B200").name, "sglang"), load_tables(get_gpu("H200").name, "sglang")
    assert b200.has("gemm_nvfp4") and not h200.has("gemm_nvfp4")
    assert (_dense_gemm_dtype(r1, b200, "fp4"), _lm_head_gemm_dtype(r1, "fp4")) == ("bf16", "bf16")
    assert (_ffn_gemm_dtype(r1, b200, "fp4"), _ffn_gemm_dtype(r1, h200, "fp4")) == ("nvfp4", "bf16")
    assert (_dense_gemm_dtype(r1, b200, "fp8"), _ffn_gemm_dtype(r1, b200, "fp8"), _lm_head_gemm_dtype(r1, "fp8")) == (
        "fp8", "fp8", "fp8")


def _with_scheme(model: str, ignore: list, weights: dict | None = None) -> dict:
    """The bundled config of ``model`` with a compressed-tensors scheme (Kimi-K2.5's unless ``weights``)."""
    from apmw.catalog.models import load_config
    cfg, _ = load_config(model)
    scheme = {**KIMI_SCHEME, "ignore": ignore}
    if weights is not None:
        scheme["config_groups"] = {"g": {"targets": ["Linear"], "weights": weights}}
    return {**cfg, "quantization_config": scheme}


def test_an_ignore_list_is_read_by_the_names_each_family_gives_its_modules():
    """A GQA checkpoint's ignore list names q/k/v/o, a multimodal one prefixes its language model's layers,
    Llama 4 calls the MLP feed_forward; a dense model has no experts to refuse."""
    from apmw.arch import architecture_from_config
    gqa = architecture_from_config(_with_scheme("Qwen/Qwen3-30B-A3B", [
        "lm_head", "re:.*self_attn\\.(q|k|v|o)_proj$"]), "q")
    assert gqa.part_dtypes("int4") == ("bf16", "bf16", "int4")
    prefixed = architecture_from_config(_with_scheme("deepseek-ai/DeepSeek-R1", [
        "lm_head", "re:language_model\\.model\\.layers\\.\\d+\\.self_attn\\..*"]), "r")
    assert prefixed.part_dtypes("int4") == ("bf16", "bf16", "int4")
    llama4 = architecture_from_config(_with_scheme("meta-llama/Llama-4-Scout-17B-16E-Instruct", [
        "re:.*feed_forward\\.shared_expert.*", "re:.*feed_forward\\.(gate|up|down)_proj"]), "l")
    assert llama4.part_dtypes("int4")[2] == "bf16"
    dense = architecture_from_config(_with_scheme("meta-llama/Meta-Llama-3.1-8B", ["lm_head", "re:.*mlp.*"]), "d")
    assert dense.part_dtypes("int4") == ("int4", "int4", "bf16")
    with pytest.raises(ConfigError, match="linear-attention layers"):
        architecture_from_config(_with_scheme("Qwen/Qwen3.5-397B-A17B", ["lm_head"]), "hybrid")


def test_the_schemes_bits_price_every_part_stored_in_it():
    """An NVFP4 compressed-tensors checkpoint (groups of 16, FP8 scales: 4.5 bits) that quantises attention too
    stores attention, dense FFN and experts at 4.5 bits, not apmw's 4.25-bit table."""
    from apmw.arch import architecture_from_config
    nvfp4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True}
    a = architecture_from_config(_with_scheme("deepseek-ai/DeepSeek-R1", ["lm_head"], nvfp4), "r1-nvfp4")
    assert a.part_dtypes("fp4") == ("fp4", "fp4", "fp4")
    quantised = a.params - a.unquantized_params
    assert a.weight_bytes("fp4") == pytest.approx(quantised * 4.5 / 8 + a.unquantized_params * BF16, rel=1e-12)


def test_a_model_that_routes_to_every_expert_reads_them_all_every_step():
    """Mixtral with top-8 of 8 experts: every step reads every expert, as it does the dense weights."""
    from apmw.arch import architecture_from_config
    from apmw.catalog.models import load_config
    cfg, _ = load_config("mistralai/Mixtral-8x7B-v0.1")
    a = architecture_from_config({**cfg, "num_experts_per_tok": 8}, "mixtral-top8")
    step = RooflineStepModel(arch=a, gpu=get_gpu("H200"), gpus=2, weight_dtype="bf16", kv_dtype="bf16")
    assert 2 * step.weight_read_bytes_per_gpu(1.0) == pytest.approx(a.active_weight_bytes("bf16"), rel=1e-12)
    assert step.held_weight_bytes == pytest.approx(a.weight_bytes("bf16"), rel=1e-12)


def test_a_4_bit_attention_on_a_gpu_without_fp4_tables_reads_the_bf16_table():
    """gpt-oss with a compressed-tensors FP4 scheme on every Linear layer (attention included) on H200, which has
    no NVFP4 GEMM table: its GEMMs run W4A16, from the bf16 table, not a missing one."""
    from apmw.arch import architecture_from_config
    from apmw.perf.replica import build_step_model
    nvfp4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True}
    a = architecture_from_config(_with_scheme("openai/gpt-oss-120b", ["lm_head"], nvfp4), "oss-all-fp4")
    assert a.part_dtypes("fp4")[0] == "fp4"
    step = build_step_model(a, get_gpu("H200"), 1, "fp4", "bf16")
    assert float(step.iteration_time_s(_decode_load(step, 8))) > 0


def _decode_load(step, b: int):
    from apmw.perf.step import IterationLoad
    a = step.arch
    return IterationLoad(decode_seqs=float(b), prefill_tokens=0.0, kv_read_bytes=b * a.kv_read_bytes_for_context(2000.0,
                         "bf16"), attention_flops=b * a.attention_flops_per_token(2000.0))


def test_a_quantization_config_that_is_not_a_mapping_is_refused_by_every_reader(tmp_path):
    """`apmw model` and `apmw predict` read it through the architecture and the KV-dtype default: a string there
    was a traceback (AttributeError) in predict; now the same clear refusal from both."""
    import json
    from apmw.arch import architecture_from_config
    from apmw.catalog.models import checkpoint_kv_dtype, load_config
    cfg, _ = load_config("meta-llama/Meta-Llama-3.1-8B")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, "quantization_config": "fp8"}))
    with pytest.raises(ConfigError, match="quantization_config 'fp8' is not a mapping"):
        architecture_from_config({**cfg, "quantization_config": "fp8"}, "odd")
    with pytest.raises(ConfigError, match="is not a mapping"):
        checkpoint_kv_dtype(str(path))
    assert config_weight_dtype(str(path)) is None
