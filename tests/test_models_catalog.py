"""Model ids as published resolve to the bundled config of their architecture (issue 21 item 1)."""

from __future__ import annotations

import pytest

from apmw.catalog import load_config
from apmw.catalog.models import checkpoint_weight_dtype, config_weight_dtype, resolve_model_name


@pytest.mark.parametrize("served, base", [
    ("nvidia/DeepSeek-R1-NVFP4", "deepseek-ai/DeepSeek-R1"),        # NVIDIA ModelOpt re-upload
    ("nvidia/DeepSeek-R1-0528-FP4", "deepseek-ai/DeepSeek-R1"),     # R1-0528 has R1's architecture
    ("deepseek-ai/DeepSeek-R1-0528", "deepseek-ai/DeepSeek-R1"),
    ("zhipuai/GLM-5", "zai-org/GLM-5"),                             # another organisation's copy
    ("zai-org/GLM-5-FP8", "zai-org/GLM-5"),
    ("Qwen/Qwen3-235B-A22B-FP8", "Qwen/Qwen3-235B-A22B"),
    ("deepseek-ai/DeepSeek-V4-Pro", "deepseek-ai/DeepSeek-V4-Pro"),
    ("deepseek-ai/DeepSeek-V4-Flash", "deepseek-ai/DeepSeek-V4-Flash"),
    ("openai/gpt-oss-120b", "openai/gpt-oss-120b"),
])
def test_published_ids_resolve_to_their_base_config(served, base):
    assert resolve_model_name(served) == base
    cfg, source = load_config(served)
    assert cfg == load_config(base)[0] and base in source


@pytest.mark.parametrize("served, dtype", [("nvidia/DeepSeek-R1-NVFP4", "fp4"), ("nvidia/DeepSeek-R1-0528-FP4", "fp4"),
                                           ("zai-org/GLM-5-FP8", "fp8"), ("deepseek-ai/DeepSeek-R1-0528", None)])
def test_the_dtype_the_name_states_is_reported_not_taken(served, dtype):
    assert checkpoint_weight_dtype(served) == dtype


@pytest.mark.parametrize("name, dtype", [("deepseek-ai/DeepSeek-R1", "fp8"), ("moonshotai/Kimi-K2-Instruct", "fp8"),
                                         ("openai/gpt-oss-120b", "fp4"), ("meta-llama/Meta-Llama-3.1-8B", None),
                                         # a derivative is read off its base's config, whose format it may not share
                                         ("deepseek-ai/DeepSeek-R1-0528", None), ("someone/DeepSeek-R1", None)])
def test_the_weight_dtype_a_checkpoint_config_stores(name, dtype):
    assert config_weight_dtype(name) == dtype


@pytest.mark.parametrize("name", ["deepseek-ai/DeepSeek-R1-0529", "deepseek-ai/DeepSeek-V4-Max", "DeepSeek-V4"])
def test_near_misses_are_not_guessed(name):
    assert resolve_model_name(name) is None


def test_v4_source_names_where_the_config_came_from():
    _, source = load_config("deepseek-ai/DeepSeek-V4-Pro")
    assert "Hugging Face page (MIT)" in source and "aiconfigurator" not in source
