"""Architecture numbers checked against published figures, so a wrong model shows up."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from apmw.arch import (Architecture, architecture_from_config, load_architecture,
                       summary)
from apmw.catalog import load_config, model_names
from apmw.errors import ApmwError, ConfigError, UnknownNameError
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def arch():
    cache: dict[str, Architecture] = {}

    def get(name: str) -> Architecture:
        if name not in cache:
            cache[name] = load_architecture(name)
        return cache[name]
    return get


# --------------------------------------------------------------------- KV cache size

def test_kv_bytes_per_token_gqa(arch):
    # Llama-3.1-70B: 80 layers * 2 (K,V) * 8 kv heads * 128 dims * 2 bytes
    assert arch("Llama-3.1-70B").kv_bytes_per_token("bf16") == 327_680
    # Llama-3.1-8B: 32 * 2 * 8 * 128 * 2
    assert arch("Llama-3.1-8B").kv_bytes_per_token("bf16") == 131_072


def test_kv_bytes_per_token_mla(arch):
    # DeepSeek-V3 MLA caches the 512-dim latent plus the 64-dim rope key per layer
    assert arch("DeepSeek-V3").kv_bytes_per_token("bf16") == 61 * (512 + 64) * 2 == 70_272
    assert arch("DeepSeek-V3").num_kv_heads == 1
    assert arch("DeepSeek-V3").attention == "mla"


@pytest.mark.parametrize("name", ["Llama-3.1-70B", "Llama-3.1-8B", "DeepSeek-V3", "gpt-oss-120b"])
def test_fp8_kv_halves_bf16(arch, name):
    a = arch(name)
    assert a.kv_bytes_per_token("fp8") == a.kv_bytes_per_token("bf16") / 2
    assert a.kv_bytes_for_context(5000, "fp8") == a.kv_bytes_for_context(5000, "bf16") / 2


# ------------------------------------------------------------------ parameter counts

# (model, published total, published active, active convention[, active tolerance])
# Publishers count "active" differently: OpenAI, DeepSeek and Moonshot leave the input
# embedding out (it is a lookup); Meta, Mistral and Qwen include it. The convention
# column says which one reproduces the figure.
PUBLISHED = [
    ("Llama-3.1-8B", 8.03e9, None, None),            # Meta model card
    ("Llama-3.1-70B", 70.6e9, None, None),
    ("Llama-3.1-405B", 405.9e9, None, None),
    ("Qwen3-8B", 8.19e9, None, None),                # HF safetensors count
    ("Qwen3-32B", 32.8e9, None, None),
    # Qwen3 card: 30.5B total, 29.9B non-embedding, "3.3B activated"; the count is
    # 3.353B, so the card truncates rather than rounds (hence 2 %).
    ("Qwen3-30B-A3B", 30.5e9, 3.3e9, "with_embedding", 0.02),
    ("Qwen3-235B-A22B", 235e9, 22e9, "with_embedding"),
    ("Qwen3-Coder-480B-A35B-Instruct", 480e9, 35e9, "with_embedding"),
    ("Qwen3.5-397B-A17B", 397e9, 17e9, "with_embedding"),
    ("DeepSeek-V3", 671e9, 37e9, "without_embedding"),      # DeepSeek-V3 report, excl. 14B MTP
    ("DeepSeek-R1", 671e9, 37e9, "without_embedding"),
    ("Mixtral-8x7B-v0.1", 46.7e9, 12.9e9, "with_embedding"),  # Mistral blog
    ("Mixtral-8x22B-v0.1", 141e9, 39e9, "with_embedding"),
    ("gpt-oss-120b", 116.83e9, 5.13e9, "without_embedding"),  # gpt-oss model card
    ("gpt-oss-20b", 20.91e9, 3.61e9, "without_embedding"),
    ("Llama-4-Maverick-17B-128E-Instruct", 400e9, 17e9, "with_embedding"),
    # GLM-5 technical report: 744B / 40B. The count gives 40.8B without the input
    # embedding (41.8B with); the report does not say how it counts (hence 2.5 %).
    ("GLM-5", 744e9, 40e9, "without_embedding", 0.025),
    ("MiniMax-M2.5", 229e9, 10e9, "without_embedding"),     # HF model card (230B / 10B)
]


def _tolerance(published: float) -> float:
    """1 %, or half a unit of the last published digit when that is coarser (37B means
    36.5-37.5B)."""
    digits = f"{published / 1e9:g}"
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    half_unit = 0.5 * 10 ** -decimals * 1e9
    return max(0.01, half_unit / published)


@pytest.mark.parametrize("name,total,active,convention,active_tol",
                         [(row + (None,))[:5] for row in PUBLISHED])
def test_parameter_counts_match_published(arch, name, total, active, convention, active_tol):
    a = arch(name)
    assert a.params == pytest.approx(total, rel=_tolerance(total))
    if active is None:
        assert a.active_params == a.params  # dense
        return
    counted = a.active_params - (a.embedding_params if convention == "without_embedding" else 0)
    assert counted == pytest.approx(active, rel=active_tol or _tolerance(active))


def test_llama4_scout_text_model_under_published_total(arch):
    """Meta's 109B includes the ~0.9B vision encoder, which apmw ignores."""
    a = arch("Llama-4-Scout-17B-16E-Instruct")
    assert 107.5e9 < a.params < 109e9
    assert a.active_params == pytest.approx(17e9, rel=_tolerance(17e9))


def test_kimi_k2_counts(arch):
    """Model card: 1T total / 32B active. The K2 report's 1.04T is 1.3 % above this count,
    which uses the same code that reproduces DeepSeek-V3's 671B to 0.01 %."""
    a = arch("Kimi-K2-Instruct")
    assert a.params == pytest.approx(1.04e12, rel=0.015)
    assert a.active_params - a.embedding_params == pytest.approx(32e9, rel=_tolerance(32e9))


# ----------------------------------------------------------------- weights and FLOPs

@pytest.mark.parametrize("name", model_names())
def test_bf16_weights_are_two_bytes_per_param(arch, name):
    a = arch(name)
    # plus the non-parameter tables stored with the weights (V4's hash-routing token table, int32)
    assert a.weight_bytes("bf16") == 2 * a.params + a.lookup_table_bytes
    assert a.active_weight_bytes("bf16") == 2 * (a.active_params - a.embedding_params)


def test_quantised_weights_keep_embeddings_in_bf16(arch):
    a = arch("Llama-3.1-8B")
    linear = a.params - a.unquantized_params
    assert a.weight_bytes("fp8") == linear * 1.0 + a.unquantized_params * 2.0
    # MXFP4: one 8-bit scale per 32 values -> 4.25 bits
    assert a.weight_bytes("fp4") == pytest.approx(linear * 4.25 / 8 + a.unquantized_params * 2)
    assert a.weight_bytes("fp4") < a.weight_bytes("fp8") < a.weight_bytes("bf16")


def test_moe_active_bytes_much_smaller_than_total(arch):
    a = arch("DeepSeek-V3")
    assert a.active_weight_bytes("fp8") < 0.07 * a.weight_bytes("fp8")


def test_flops_per_token_is_two_per_matmul_param(arch):
    a = arch("Llama-3.1-8B")
    assert a.flops_per_token() == 2 * (a.active_params - 128_256 * 4096)


def test_attention_flops_gqa(arch):
    a = arch("Llama-3.1-70B")
    assert a.attention_flops_per_token(1000) == 4 * 80 * 64 * 128 * 1000


def test_unknown_dtype_is_named(arch):
    with pytest.raises(UnknownNameError, match="fp6"):
        arch("Llama-3.1-8B").weight_bytes("fp6")
    with pytest.raises(ApmwError, match="KV-cache"):
        arch("Llama-3.1-8B").kv_bytes_per_token("fp6")


# ------------------------------------------------- sliding, chunked and linear layers

def test_gpt_oss_sliding_layers_cap_kv(arch):
    a = arch("gpt-oss-120b")
    assert (a.full_attention_layers, a.sliding_window_layers, a.sliding_window) == (18, 18, 128)
    ctx = 10_000
    full_only = a.num_layers * a.kv_elements_per_token_per_layer * 2 * ctx
    kv = a.kv_bytes_for_context(ctx, "bf16")
    assert kv < full_only
    per_layer_token = 2 * 8 * 64 * 2
    assert kv == 18 * ctx * per_layer_token + 18 * 128 * per_layer_token


def test_llama4_chunked_attention_layers(arch):
    a = arch("Llama-4-Scout-17B-16E-Instruct")
    assert (a.full_attention_layers, a.sliding_window_layers, a.sliding_window) == (12, 36, 8192)
    per = 2 * 8 * 128 * 2
    assert a.kv_bytes_for_context(100_000, "bf16") == 12 * 100_000 * per + 36 * 8192 * per


def test_maverick_interleaves_dense_and_moe(arch):
    scout = arch("Llama-4-Scout-17B-16E-Instruct")
    maverick = arch("Llama-4-Maverick-17B-128E-Instruct")
    # Same shape per token: Maverick alternates dense and MoE layers, Scout is all MoE.
    assert maverick.active_params == pytest.approx(scout.active_params, rel=0.01)


def test_qwen35_hybrid_linear_state(arch):
    a = arch("Qwen3.5-397B-A17B")
    assert a.attention == "hybrid"
    assert (a.full_attention_layers, a.linear_attention_layers) == (15, 45)
    # per linear layer: 64 value heads * 128 * 128 recurrent state at float32
    # (mamba_ssm_dtype) + conv window (2*16*128 + 64*128 channels) * 3 at bf16
    state = 45 * (64 * 128 * 128 * 4 + (2 * 16 * 128 + 64 * 128) * 3 * 2)
    assert a.linear_state_bytes_per_sequence == state
    assert a.kv_bytes_for_context(0, "bf16") == state
    assert a.kv_bytes_per_token("bf16") == 15 * 2 * 2 * 256 * 2


def test_glm5_sparse_attention_caps_core_attention(arch):
    a = arch("GLM-5")
    assert a.attention == "mla" and a.attention_topk == 2048
    assert a.kv_elements_per_token_per_layer == 512 + 64 + 128   # latent + rope + indexer key
    short, long = a.attention_flops_per_token(2048), a.attention_flops_per_token(200_000)
    # beyond top-k only the cheap indexer grows with context
    assert long < short * 200_000 / 2048 / 5


@pytest.mark.parametrize("name", ["gpt-oss-120b", "Qwen3.5-397B-A17B",
                                  "Llama-4-Scout-17B-16E-Instruct", "GLM-5", "Llama-3.1-70B",
                                  "DeepSeek-V4-Pro", "DeepSeek-V4-Flash"])
def test_vectorised_equals_scalar(arch, name):
    a = arch(name)
    ctx = np.array([0.0, 1.0, 127.0, 128.0, 129.0, 5000.0, 8192.0, 1e5, 1.3e5])
    kv = a.kv_bytes_for_context(ctx, "fp8")
    flops = a.attention_flops_per_token(ctx)
    assert isinstance(kv, np.ndarray) and kv.shape == ctx.shape
    np.testing.assert_allclose(kv, [a.kv_bytes_for_context(float(c), "fp8") for c in ctx])
    np.testing.assert_allclose(flops, [a.attention_flops_per_token(float(c)) for c in ctx])
    reads = a.kv_read_bytes_for_context(ctx, "fp8")
    np.testing.assert_allclose(reads, [a.kv_read_bytes_for_context(float(c), "fp8") for c in ctx])
    assert isinstance(a.kv_bytes_for_context(10.0, "bf16"), float)
    assert isinstance(a.kv_read_bytes_for_context(10.0, "bf16"), float)
    assert np.all(np.diff(kv) >= 0)


# --------------------------------------------------------------------- config errors

@pytest.mark.parametrize("model,field", [
    ("Llama-3.1-8B", "hidden_size"),
    ("Llama-3.1-8B", "intermediate_size"),
    ("DeepSeek-V3", "qk_rope_head_dim"),
    ("Qwen3.5-397B-A17B", "linear_key_head_dim"),
    ("GLM-5", "index_head_dim"),
])
def test_missing_field_names_it(model, field):
    cfg, _ = load_config(model)
    cfg = copy.deepcopy(cfg)
    cfg.get("text_config", cfg).pop(field)
    with pytest.raises(ConfigError, match=f"'{field}'") as err:
        architecture_from_config(cfg, name=model)
    assert model in str(err.value)


@pytest.mark.parametrize("value", ["4096", 40.5, 0, -8])
def test_bad_field_value_is_named(value):
    cfg, _ = load_config("Llama-3.1-8B")
    with pytest.raises(ConfigError, match="'hidden_size'"):
        architecture_from_config({**cfg, "hidden_size": value}, name="bad")


@pytest.mark.parametrize("model,change,message", [
    ("Llama-3.1-8B", {"num_key_value_heads": 0}, "'num_key_value_heads' is 0; it must be positive"),
    ("Llama-3.1-8B", {"head_dim": 0}, "'head_dim' is 0; it must be positive"),
    ("Llama-3.1-8B", {"num_key_value_heads": 64}, "num_key_value_heads 64 does not divide num_attention_heads 32"),
    ("Llama-3.1-8B", {"num_key_value_heads": 5}, "num_key_value_heads 5 does not divide num_attention_heads 32"),
    ("Qwen3-30B-A3B", {"moe_intermediate_size": 0}, "'moe_intermediate_size' is 0; it must be positive"),
    ("Qwen3-30B-A3B", {"moe_intermediate_size": None}, "no 'moe_intermediate_size', which qwen3_moe reads"),
    ("DeepSeek-V3", {"num_experts_per_tok": 300}, "num_experts_per_tok 300 is more than the 256 routed experts"),
    ("DeepSeek-V3", {"kv_lora_rank": None}, "config has no 'kv_lora_rank', needed for MLA attention"),
    ("DeepSeek-V3", {"kv_lora_rank": 0}, "'kv_lora_rank' is 0; it must be positive"),
    ("DeepSeek-V3", {"num_nextn_predict_layers": -1}, "'num_nextn_predict_layers' is -1; it cannot be negative"),
    ("gpt-oss-20b", {"sliding_window": -5}, "'sliding_window' is -5; it cannot be negative"),
    ("Qwen3-8B", {"sliding_window": -5, "use_sliding_window": True}, "'sliding_window' is -5; it cannot be negative"),
    ("DeepSeek-V3", {"first_k_dense_replace": 61}, "declares 256 routed experts, but no layer of its 61 routes to them "
     "(first_k_dense_replace 61, moe_layer_freq 1)"),
    ("Qwen3-30B-A3B", {"decoder_sparse_step": 100}, "declares 128 routed experts, but no layer of its 48 routes"),
])
def test_a_value_no_model_has_is_refused_by_name(model, change, message):
    """Sizes that would give a division by zero, a negative count or another family's arithmetic (MLA read as
    128-head MHA, every Qwen3 expert the dense MLP's width) are refused, naming the field."""
    cfg, _ = load_config(model)
    cfg = copy.deepcopy(cfg)
    text = cfg.get("text_config", cfg)
    for key, value in change.items():
        if value is None:
            text.pop(key)
        else:
            text[key] = value
    with pytest.raises(ConfigError) as err:
        architecture_from_config(cfg, name=model)
    assert message in str(err.value) and model in str(err.value)


def test_a_disabled_window_is_not_read_whatever_its_value():
    """Qwen's configs carry a sliding_window beside use_sliding_window: false; a placeholder there is not a
    window and is not checked."""
    cfg, _ = load_config("Qwen3-8B")
    a = architecture_from_config({**cfg, "sliding_window": -1, "use_sliding_window": False}, name="q")
    assert a.sliding_window_layers == 0


def test_layer_types_length_mismatch():
    cfg, _ = load_config("gpt-oss-20b")
    cfg = {**cfg, "layer_types": cfg["layer_types"][:-1]}
    with pytest.raises(ConfigError, match="layer_types"):
        architecture_from_config(cfg, name="bad")


def test_load_from_path(tmp_path):
    cfg, _ = load_config("Llama-3.1-8B")
    path = tmp_path / "my-llama" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    a = load_architecture(str(path))
    assert a.name == "my-llama"
    assert a.params == load_architecture("Llama-3.1-8B").params
    assert str(path) in a.source


@pytest.mark.parametrize("name", model_names())
def test_summary_is_json_ready(arch, name):
    s = summary(arch(name))
    text = json.dumps(s)
    form = arch(name).checkpoint_format       # and the checkpoint's own dtype where its config states it
    own = {form.weight_dtype} if form is not None else set()
    assert s["name"] == name and set(s["weight_bytes"]) == {"bf16", "fp8", "fp4"} | own
    assert set(s["kv_bytes_per_token"]) == {"bf16", "fp8", "fp4"}
    assert "source" in text


# --------------------------------------------------------------------- configs apmw cannot read exactly

CONFIGS = ROOT / "tests" / "fixtures" / "configs"


def test_an_unknown_field_in_a_known_family_is_refused_by_name():
    cfg, _ = load_config("Llama-3.1-8B")
    with pytest.raises(ConfigError, match="does not understand for model_type 'llama': compress_ratios, o_groups"):
        architecture_from_config({**cfg, "compress_ratios": [4] * 32, "o_groups": 8}, name="odd-llama")


def test_an_unknown_family_is_refused_not_read_as_a_look_alike():
    cfg, _ = load_config("Llama-3.1-8B")
    with pytest.raises(ConfigError, match="model_type 'falcon' .* is not a family apmw reads exactly"):
        architecture_from_config({**cfg, "model_type": "falcon"}, name="falcon")


def test_a_non_gated_activation_is_refused():
    cfg, _ = load_config("Llama-3.1-8B")
    with pytest.raises(ConfigError, match="'hidden_act' is 'gelu'"):
        architecture_from_config({**cfg, "hidden_act": "gelu"}, name="gelu-llama")


@pytest.mark.parametrize("name", model_names())
def test_every_bundled_config_is_read_exactly(name):
    cfg, _ = load_config(name)
    architecture_from_config(cfg, name=name)     # no refusal: every field is read or known not to cost


def test_deepseek_v4_fields_are_still_refused_in_another_family():
    """compress_ratios and o_groups are read for deepseek_v4 only: in a Llama they are not understood."""
    cfg, _ = load_config("Llama-3.1-8B")
    with pytest.raises(ConfigError, match="does not understand for model_type 'llama': compress_ratios, o_groups"):
        architecture_from_config({**cfg, "compress_ratios": [4] * 32, "o_groups": 8}, name="odd-llama")


@pytest.mark.parametrize("change, message", [
    ({"compress_mode": "overlap"}, "does not understand for model_type 'deepseek_v4': compress_mode"),
    ({"model_type": "deepseek_v5"}, "model_type 'deepseek_v5' .* is not a family apmw reads exactly"),
])
def test_a_v4_config_with_what_apmw_does_not_know_is_refused_by_name(change, message):
    cfg, _ = load_config("DeepSeek-V4-Flash")
    with pytest.raises(ConfigError, match=message):
        architecture_from_config({**cfg, **change}, name="v4-variant")


@pytest.mark.parametrize("change, message", [
    ({"compress_ratios": [16] * 44}, r"compress_ratios has \[16\]"),
    ({"compress_ratios": [[4]] + [4] * 43}, r"compress_ratios has \[\[4\]\]"),     # a TypeError before
    ({"compress_ratios": [{"r": 4}, False] + [4] * 42}, r"compress_ratios has \[False, \{'r': 4\}\]"),
    ({"compress_ratios": [4] * 43}, "one ratio per layer and per MTP module"),
    ({"attention_bias": True}, "attention_bias"),
    ({"o_groups": 7}, "o_groups 7 does not divide"),
])
def test_a_v4_config_apmw_cannot_count_exactly_is_refused(change, message):
    cfg, _ = load_config("DeepSeek-V4-Flash")
    with pytest.raises(ConfigError, match=message):
        architecture_from_config({**cfg, **change}, name="v4-variant")


# --------------------------------------------------------------------- DeepSeek-V4 (docs/models.md)

# (model, layers at ratio 4, at ratio 128, at ratio 0, index_topk): counted by hand from compress_ratios
V4_LAYERS = [("DeepSeek-V4-Pro", 30, 31, 0, 1024), ("DeepSeek-V4-Flash", 21, 20, 2, 512)]


@pytest.mark.parametrize("name, total, active", [
    ("DeepSeek-V4-Pro", 1.6e12, 49e9),       # model card: 1.6T total, 49B active
    ("DeepSeek-V4-Flash", 284e9, 13e9),      # model card: 284B total, 13B active
])
def test_deepseek_v4_parameters_match_the_model_cards(arch, name, total, active):
    """Within 5 %: '1.6T' is rounded to two digits; active counts leave the input embedding out, as
    DeepSeek's cards for V3 do (with it, Flash would be 13.8B)."""
    a = arch(name)
    assert a.params == pytest.approx(total, rel=0.05)
    assert a.active_params - a.embedding_params == pytest.approx(active, rel=0.05)
    assert a.attention == "csa" and a.num_kv_heads == 1 and a.head_dim == 512


@pytest.mark.parametrize("name, csa, hca, window_only, topk", V4_LAYERS)
def test_deepseek_v4_kv_per_token_and_state_are_the_hand_derivation(arch, name, csa, hca, window_only, topk):
    """Per token: a 512-wide entry per 4 tokens and a 128-wide index key per 4 on CSA layers, a 512-wide
    entry per 128 tokens on HCA layers. Per sequence: every layer's 128-token window of 512-wide entries,
    and the compressors' fp32 tail (kv and score: 2 x 8 x 1024 + 2 x 8 x 256 at ratio 4, 2 x 128 x 512 at 128)."""
    a = arch(name)
    layers = csa + hca + window_only
    assert layers == a.num_layers
    assert dict(a.compressed.layers_by_ratio) == {r: n for r, n in ((4, csa), (128, hca), (0, window_only)) if n}
    assert a.compressed.index_topk == topk
    per_token = csa * (512 + 128) / 4 + hca * 512 / 128
    assert a.kv_bytes_per_token("fp8") == per_token
    assert a.kv_bytes_per_token("bf16") == 2 * per_token
    compressor = csa * 4 * (2 * 8 * 1024 + 2 * 8 * 256) + hca * 4 * 2 * 128 * 512
    assert a.compressed.compressor_state_bytes == compressor
    assert a.sequence_state_bytes("fp8") == layers * 128 * 512 + compressor
    ctx = 50_000
    assert a.kv_bytes_for_context(ctx, "fp8") == pytest.approx(per_token * ctx + layers * 128 * 512 + compressor)


@pytest.mark.parametrize("name, csa, hca, window_only, topk", V4_LAYERS)
def test_deepseek_v4_decode_reads_are_capped_at_top_k(arch, name, csa, hca, window_only, topk):
    """Beyond 4 x index_topk tokens a step reads no more CSA entries, only the indexer's keys (and
    HCA's entries) grow: reads grow far slower than storage."""
    a = arch(name)
    layers = csa + hca + window_only
    far = 4 * topk + 10_000
    slope = (a.kv_read_bytes_for_context(far + 1000, "fp8") - a.kv_read_bytes_for_context(far, "fp8")) / 1000
    assert slope == pytest.approx(csa * 128 / 4 + hca * 512 / 128)
    at = a.kv_read_bytes_for_context(far, "fp8")
    assert at == pytest.approx(layers * 128 * 512 + csa * (topk * 512 + far / 4 * 128) + hca * far / 128 * 512)
    assert a.kv_reads_linear_from_tokens == 4 * topk
    assert at < a.kv_bytes_for_context(far, "fp8") - a.compressed.compressor_state_bytes


@pytest.mark.parametrize("name", model_names())
def test_more_context_never_reads_fewer_bytes_nor_costs_fewer_flops(arch, name):
    a = arch(name)
    ctx = np.array([0.0, 1, 100, 127, 128, 129, 2047, 2048, 2049, 4095, 4096, 4097, 1e4, 1e5, 1e6])
    assert np.all(np.diff(a.kv_read_bytes_for_context(ctx, "fp8")) >= 0)
    assert np.all(np.diff(a.attention_flops_per_token(ctx)) >= 0)
    assert np.all(a.kv_read_bytes_for_context(ctx, "fp8") <= a.kv_bytes_for_context(ctx, "fp8"))


@pytest.mark.parametrize("name", ["Llama-3.1-70B", "DeepSeek-V3", "gpt-oss-120b", "Qwen3.5-397B-A17B"])
def test_dense_attention_reads_what_it_stores(arch, name):
    a = arch(name)
    ctx = np.array([10.0, 5000.0, 200_000.0])
    np.testing.assert_array_equal(a.kv_read_bytes_for_context(ctx, "bf16"), a.kv_bytes_for_context(ctx, "bf16"))


def test_dsa_reads_top_k_latents_and_every_index_key(arch):
    """GLM-5 stores latent + rope + index key per token; a step reads 2,048 latents and all index keys."""
    a = arch("GLM-5")
    n = a.full_attention_layers
    assert a.kv_read_bytes_for_context(1000, "bf16") == a.kv_bytes_for_context(1000, "bf16")
    assert a.kv_read_bytes_for_context(100_000, "bf16") == n * (2048 * (512 + 64) + 100_000 * 128) * 2


def test_checkpoint_expert_dtype_and_pricing_experts_apart(arch):
    assert arch("DeepSeek-V4-Flash").expert_dtype_in_checkpoint == "fp4"    # config: expert_dtype fp4
    pro = arch("DeepSeek-V4-Pro")          # its config names none: V4's published checkpoints' fp4, said in a note
    assert pro.expert_dtype_in_checkpoint == "fp4"
    assert any("does not state expert_dtype: taken as fp4" in n for n in pro.notes)
    assert not any("expert_dtype" in n for n in arch("DeepSeek-V4-Flash").notes)
    assert arch("DeepSeek-V3").expert_dtype_in_checkpoint == "fp8"
    assert arch("gpt-oss-120b").expert_dtype_in_checkpoint == "fp4"         # mxfp4
    assert arch("Llama-3.1-8B").expert_dtype_in_checkpoint is None          # dense
    a = arch("DeepSeek-V4-Flash")
    saved = a.weight_bytes("fp8") - a.weight_bytes("fp8", expert_dtype="fp4")
    assert saved == pytest.approx(a.routed_expert_params * (1 - 4.25 / 8))
    assert a.routed_expert_params == 43 * 256 * 3 * 4096 * 2048
    assert a.active_routed_expert_params == 43 * 6 * 3 * 4096 * 2048


def test_v4_attention_params_count_compressors_and_indexers(arch):
    """Flash layer 0 (ratio 0): wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b, sinks (reference model.py)."""
    a = arch("DeepSeek-V4-Flash")
    d, q, h, hd, g, o = 4096, 1024, 64, 512, 8, 1024
    window_only = d * q + q + q * h * hd + d * hd + hd + (h * hd // g) * g * o + g * o * d + h
    hca = window_only + 128 * hd + 2 * d * hd + hd                        # + Compressor (ape, wkv, wgate, norm)
    csa = (window_only + 4 * 2 * hd + 2 * d * 2 * hd + hd                 # overlapping Compressor
           + q * 64 * 128 + d * 64 + 4 * 2 * 128 + 2 * d * 2 * 128 + 128)  # Indexer: wq_b, weights_proj, Compressor
    assert a.attention_params == 2 * window_only + 21 * csa + 20 * hca


def test_the_cli_prints_deepseek_v4s_figures():
    import subprocess

    from tests.e2e.test_cli import APMW

    r = subprocess.run([APMW, "model", "deepseek-ai/DeepSeek-V4-Pro", "--json"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["attention"] == "csa" and info["layers_by_compress_ratio"] == {"4": 30, "128": 31}
    assert info["kv_bytes_per_token"]["fp8"] == 4924
    assert "at most 1024 compressed entries" in info["decode_reads"]
    r = subprocess.run([APMW, "model", str(CONFIGS / "deepseek-ai--DeepSeek-V4-Flash.json")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "sequence_state_bytes" in r.stdout and "csa" in r.stdout


def test_the_summary_prices_the_experts_as_the_checkpoint_ships_them():
    # `apmw model` showed V4-Pro at 1,580 GB (all fp8) and never the 854.7 GB plan prices (fp4 experts)
    v4 = summary(load_architecture("deepseek-ai/DeepSeek-V4-Pro"))
    assert v4["weight_bytes"]["fp8"] == pytest.approx(1580.0e9, rel=1e-3)
    assert v4["weight_bytes_with_checkpoint_experts"]["fp8"] == pytest.approx(854.7e9, rel=1e-3)
    assert "weight_bytes_with_checkpoint_experts" not in summary(load_architecture("meta-llama/Llama-3.1-8B"))
