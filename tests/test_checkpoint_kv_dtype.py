"""`apmw predict` without --kv-dtype prices the KV cache the engines pick for the checkpoint ('auto')."""

from __future__ import annotations

import json

import re

import pytest
from typer.testing import CliRunner

import apmw.cli
from apmw.catalog.models import checkpoint_kv_dtype, load_config
from apmw.cli import app
from apmw.errors import ApmwError

apmw.cli._register_verbs()   # every verb, as the `apmw` entry point does
LLAMA8 = "meta-llama/Meta-Llama-3.1-8B"


def _checkpoint(tmp_path, quantization_config: dict):
    cfg, _ = load_config(LLAMA8)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "quantization_config": quantization_config}))
    return str(tmp_path)


@pytest.mark.parametrize("model", [LLAMA8, "deepseek-ai/DeepSeek-R1", "openai/gpt-oss-120b", "moonshotai/Kimi-K2.5"])
def test_a_checkpoint_that_names_no_kv_format_keeps_16_bit_kv(model):
    # FP8 (DeepSeek-R1), MXFP4 (gpt-oss) and compressed-tensors (Kimi-K2.5, kv_cache_scheme null) weights alike
    assert checkpoint_kv_dtype(model)[0] == "bf16"


@pytest.mark.parametrize("qc, dtype", [
    ({"quant_method": "compressed-tensors", "kv_cache_scheme": {"num_bits": 8, "type": "float"}}, "fp8"),
    ({"quant_method": "modelopt", "kv_cache_quant_algo": "FP8"}, "fp8"),
    ({"quant_method": "modelopt", "kv_cache_quant_algo": "NVFP4"}, "fp4"),
])
def test_the_kv_format_a_checkpoint_names_is_the_default(tmp_path, qc, dtype):
    assert checkpoint_kv_dtype(_checkpoint(tmp_path, qc))[0] == dtype


@pytest.mark.parametrize("bits", [6, [8], {"n": 8}, "8", True])      # a list or mapping: a TypeError before
def test_a_kv_format_apmw_cannot_model_is_refused(tmp_path, bits):
    with pytest.raises(ApmwError, match="kv_cache_scheme .* apmw does not model"):
        checkpoint_kv_dtype(_checkpoint(tmp_path, {"kv_cache_scheme": {"num_bits": bits, "type": "float"}}))


@pytest.mark.parametrize("qc,said", [({"kv_cache_scheme": "fp8"}, "kv_cache_scheme is 'fp8'; compressed-tensors writes"),
                                     ({"kv_cache_quant_algo": 8}, "kv_cache_quant_algo is '8'; ModelOpt writes")])
def test_a_kv_format_written_in_the_wrong_shape_is_refused_not_read_as_none(tmp_path, qc, said):
    """A string where compressed-tensors writes a mapping was read as no KV format (bf16), silently (fuzzing)."""
    with pytest.raises(ApmwError, match=said):
        checkpoint_kv_dtype(_checkpoint(tmp_path, qc))


def test_a_published_derivative_says_its_own_config_is_not_bundled():
    dtype, why, derived = checkpoint_kv_dtype("nvidia/DeepSeek-R1-NVFP4")
    assert dtype == "bf16" and derived and "base model's config" in why
    assert checkpoint_kv_dtype(LLAMA8)[2] is False


def test_predict_prices_the_default_it_names(tmp_path):
    base = ["predict", "--gpu", "H200", "--isl", "1000", "--osl", "100", "--concurrency", "8", "--json"]
    default = CliRunner().invoke(app, base + ["--model", LLAMA8])
    explicit = CliRunner().invoke(app, base + ["--model", LLAMA8, "--kv-dtype", "bf16"])
    assert default.exit_code == 0 and "KV cache" not in default.stderr      # the plain default goes unsaid
    assert json.loads(default.stdout) == json.loads(explicit.stdout)
    fp8_ckpt = _checkpoint(tmp_path, {"quant_method": "modelopt", "kv_cache_quant_algo": "FP8"})
    named = CliRunner().invoke(app, base + ["--model", fp8_ckpt])
    fp8 = CliRunner().invoke(app, base + ["--model", fp8_ckpt, "--kv-dtype", "fp8"])
    assert "KV cache fp8" in named.stderr and json.loads(named.stdout) == json.loads(fp8.stdout)


@pytest.mark.parametrize("qc, dtype", [
    ({"quant_method": "gptq", "bits": 8, "group_size": 128}, "int8"),
    ({"quant_method": "awq", "bits": 8}, "int8"),
    ({"quant_method": "gptq", "bits": 4}, "int4"),
    ({"quant_method": "awq"}, "int4"),
])
def test_a_gptq_or_awq_checkpoint_is_priced_at_its_bits(tmp_path, qc, dtype):
    """GPTQ-Int8 checkpoints were priced as int4 whatever their bits (fuzzing, session 42)."""
    from apmw.catalog.models import config_weight_dtype

    assert config_weight_dtype(_checkpoint(tmp_path, qc)) == dtype


@pytest.mark.parametrize("bits", [2, 3, True, "8", [4], {"bits": 4}])      # a list or mapping: a TypeError before
def test_gptq_bits_apmw_does_not_price_are_refused(tmp_path, bits):
    from apmw.arch import load_architecture

    with pytest.raises(ApmwError, match=re.escape(f"quantization_config gptq bits {bits!r} is not one apmw prices")):
        load_architecture(_checkpoint(tmp_path, {"quant_method": "gptq", "bits": bits}))


@pytest.mark.parametrize("name, dtype", [
    ("Qwen/Qwen3-8B-GPTQ-Int8", "int8"), ("Qwen/Qwen3-8B-Int8-GPTQ", "int8"),
    ("Qwen/Qwen3-8B-Instruct-Int8-AWQ", "int8"), ("Qwen/Qwen3-8B-Int4-GPTQ", "int4"),
    ("Qwen/Qwen3-8B-AWQ", "int4"), ("Qwen/Qwen3-8B-GPTQ", "int4"),
])
def test_a_bit_width_tag_outranks_the_method_tag_wherever_it_stands(name, dtype):
    """"-Int8-GPTQ" was read from its outer tag alone, GPTQ's 4-bit default, and priced an 8-bit checkpoint at
    half its weight bytes (fuzzing, session 42)."""
    from apmw.catalog.models import checkpoint_weight_dtype

    assert checkpoint_weight_dtype(name) == dtype


@pytest.mark.parametrize("side,text", [
    ("quantize_config.json", '{"bits": 4, "group_size": 128, "desc_act": false, "sym": true}'),     # AutoGPTQ
    ("quant_config.json", '{"zero_point": true, "q_group_size": 128, "w_bit": 4, "version": "GEMM"}'),  # AutoAWQ
])
def test_a_checkpoint_folder_quantised_in_a_side_file_is_read_as_it_stores_its_weights(tmp_path, side, text):
    """An AutoGPTQ folder whose 4 bits are stated in quantize_config.json, not config.json, was priced as bf16
    without a word (fuzzing, session 45); vLLM reads the side file, and so does apmw: int4."""
    from apmw.catalog.models import config_weight_dtype

    cfg, _ = load_config("meta-llama/Meta-Llama-3.1-8B")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert config_weight_dtype(str(tmp_path)) is None
    (tmp_path / side).write_text(text)
    assert config_weight_dtype(str(tmp_path)) == "int4"
    assert load_config(str(tmp_path))[0]["quantization_config"]["quant_method"] in ("gptq", "awq")
