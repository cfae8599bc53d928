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
    assert a.weight_bytes("bf16") == 2 * a.params
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
                                  "Llama-4-Scout-17B-16E-Instruct", "GLM-5", "Llama-3.1-70B"])
def test_vectorised_equals_scalar(arch, name):
    a = arch(name)
    ctx = np.array([0.0, 1.0, 127.0, 128.0, 129.0, 5000.0, 8192.0, 1e5, 1.3e5])
    kv = a.kv_bytes_for_context(ctx, "fp8")
    flops = a.attention_flops_per_token(ctx)
    assert isinstance(kv, np.ndarray) and kv.shape == ctx.shape
    np.testing.assert_allclose(kv, [a.kv_bytes_for_context(float(c), "fp8") for c in ctx])
    np.testing.assert_allclose(flops, [a.attention_flops_per_token(float(c)) for c in ctx])
    assert isinstance(a.kv_bytes_for_context(10.0, "bf16"), float)
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
    assert s["name"] == name and set(s["weight_bytes"]) == {"bf16", "fp8", "fp4"}
    assert set(s["kv_bytes_per_token"]) == {"bf16", "fp8", "fp4"}
    assert "source" in text


# --------------------------------------------------------------------- configs apmw cannot read exactly

CONFIGS = ROOT / "tests" / "fixtures" / "configs"


@pytest.mark.parametrize("name", ["DeepSeek-V4-Pro", "DeepSeek-V4-Flash"])
def test_deepseek_v4_is_refused_with_what_is_missing_not_read_as_gqa(name):
    with pytest.raises(ConfigError) as err:
        load_architecture(str(CONFIGS / f"deepseek-ai--{name}.json"))
    text = str(err.value)
    assert "model_type 'deepseek_v4'" in text and "not modelled yet" in text
    assert "compressed attention" in text and "compress_ratios" in text and "hc_mult" in text


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


def test_the_cli_refuses_deepseek_v4_with_exit_1():
    import subprocess

    from tests.e2e.test_cli import APMW

    r = subprocess.run([APMW, "model", str(CONFIGS / "deepseek-ai--DeepSeek-V4-Flash.json")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "not modelled yet" in " ".join(r.stderr.split())
