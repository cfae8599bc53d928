"""Hostile HuggingFace ``config.json`` files (from a fuzzing run): each is refused with a
:class:`apmw.errors.ConfigError` naming the field (or, for a file that cannot be read, the file),
and ``apmw model FILE`` exits 1 with that message, never 70 (a bug) with a traceback."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from unittest import mock

import pytest

from apmw.arch import load_architecture
from apmw.cli import USER_ERROR_EXIT, main
from apmw.errors import ConfigError
from tests.conftest import ROOT

MODELS = ROOT / "src" / "apmw" / "catalog" / "data" / "models"
LLAMA = "meta-llama--Meta-Llama-3.1-8B"
DEEPSEEK = "deepseek-ai--DeepSeek-V3"
V4 = "deepseek-ai--DeepSeek-V4-Pro"
QWEN_MOE = "Qwen--Qwen3-30B-A3B"
SCOUT = "meta-llama--Llama-4-Scout-17B-16E-Instruct"
GLM = "zai-org--GLM-5"

_RAW = "__raw__"    # replaced by JSON text json.dumps cannot write (Infinity, NaN)

# (bundled config, field, value written into its text model)
FIELDS = [
    pytest.param(LLAMA, "num_hidden_layers", 10 ** 12, id="num_hidden_layers-1e12"),
    pytest.param(DEEPSEEK, "moe_layer_freq", 0, id="moe_layer_freq-0"),
    pytest.param(QWEN_MOE, "decoder_sparse_step", 0, id="decoder_sparse_step-0"),
    pytest.param(SCOUT, "no_rope_layer_interval", 0, id="no_rope_layer_interval-0"),
    pytest.param(SCOUT, "interleave_moe_layer_step", 0, id="interleave_moe_layer_step-0"),
    pytest.param(DEEPSEEK, "first_k_dense_replace", "3", id="first_k_dense_replace-str"),
    pytest.param(DEEPSEEK, "n_shared_experts", "1", id="n_shared_experts-str"),
    pytest.param(QWEN_MOE, "mlp_only_layers", 5, id="mlp_only_layers-int"),
    pytest.param(QWEN_MOE, "mlp_only_layers", [48], id="mlp_only_layers-past-last-layer"),
    pytest.param(SCOUT, "moe_layers", 5, id="moe_layers-int"),
    pytest.param(SCOUT, "no_rope_layers", "x", id="no_rope_layers-str"),
    pytest.param(SCOUT, "no_rope_layers", [1, 0], id="no_rope_layers-too-short"),
    pytest.param(SCOUT, "attention_chunk_size", "8192", id="attention_chunk_size-str"),
    pytest.param(QWEN_MOE, "layer_types", 5, id="layer_types-int"),
    pytest.param(QWEN_MOE, "layer_types", [["x"]] * 48, id="layer_types-nested"),
    pytest.param(QWEN_MOE, "layer_types", "full_attention", id="layer_types-str"),
    pytest.param(LLAMA, "architectures", 5, id="architectures-int"),
    pytest.param(LLAMA, "vocab_size", 10 ** 400, id="vocab_size-1e400"),
    pytest.param(V4, "num_hash_layers", -1, id="num_hash_layers-negative"),
    pytest.param(DEEPSEEK, "n_routed_experts", 0, id="n_routed_experts-0"),
    pytest.param(SCOUT, "num_local_experts", 0, id="num_local_experts-0"),
    pytest.param(QWEN_MOE, "num_experts", 0, id="num_experts-0"),
    pytest.param(LLAMA, "tie_word_embeddings", "false", id="tie_word_embeddings-str"),
    pytest.param(LLAMA, "max_position_embeddings", "131072", id="max_position_embeddings-str"),
    pytest.param(DEEPSEEK, "q_lora_rank", "abc", id="q_lora_rank-str"),
    pytest.param(DEEPSEEK, "q_lora_rank", -5, id="q_lora_rank-negative"),
    pytest.param(LLAMA, "attention_bias", "false", id="attention_bias-str"),
    pytest.param(V4, "attention_bias", "false", id="v4-attention_bias-str"),
    pytest.param(LLAMA, "text_config", 5, id="text_config-int"),
    pytest.param(LLAMA, "text_config", [], id="text_config-list"),
    # read as "no indexer", "no chunking" or "no window" before session 34: the model changed without a word
    pytest.param(GLM, "index_topk", [], id="index_topk-empty-list"),
    pytest.param(GLM, "index_topk", 0, id="index_topk-0"),
    pytest.param(SCOUT, "attention_chunk_size", 0, id="attention_chunk_size-0"),
    pytest.param(QWEN_MOE, "use_sliding_window", "abc", id="use_sliding_window-str-window-off"),
    # read silently before session 38: the experts priced in the weights' dtype
    pytest.param("deepseek-ai--DeepSeek-V4-Flash", "expert_dtype", "fp3", id="expert_dtype-unknown"),
]
# JSON literals json.dumps does not write: (bundled config, field, literal)
LITERALS = [
    pytest.param(LLAMA, "num_hidden_layers", "Infinity", id="num_hidden_layers-Infinity"),
    pytest.param(LLAMA, "num_hidden_layers", "NaN", id="num_hidden_layers-NaN"),
    pytest.param(LLAMA, "vocab_size", "1e999", id="vocab_size-1e999"),
]


def _write(tmp_path: Path, model: str, field: str, value: object) -> Path:
    """A copy of a bundled config with ``field`` of its text model set to ``value``."""
    cfg = json.loads((MODELS / f"{model}.json").read_text())
    text = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) and field != "architectures" else cfg
    text[field] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def _literal(tmp_path: Path, model: str, field: str, literal: str) -> Path:
    path = _write(tmp_path, model, field, _RAW)
    path.write_text(path.read_text().replace(f'"{_RAW}"', literal))
    return path


def _whole_file(tmp_path: Path, text: str) -> Path:
    """A Llama config with ``text`` added as the object's last member."""
    body = (MODELS / f"{LLAMA}.json").read_text().rstrip().removesuffix("}")
    path = tmp_path / "config.json"
    path.write_text(f"{body}, {text}}}")
    return path


def _refused(path: Path) -> str:
    with pytest.raises(ConfigError) as err:
        load_architecture(str(path))
    return str(err.value)


@pytest.mark.parametrize("model,field,value", FIELDS)
def test_a_hostile_field_is_refused_by_name(tmp_path, model, field, value):
    path = _write(tmp_path, model, field, value)
    message = _refused(path)
    assert f"'{field}'" in message and message.startswith(f"{path}: ")      # the user's file, by its path


@pytest.mark.parametrize("model,field,literal", LITERALS)
def test_a_non_finite_number_is_refused_by_name(tmp_path, model, field, literal):
    message = _refused(_literal(tmp_path, model, field, literal))
    assert f"'{field}'" in message and "whole number" in message


@pytest.mark.parametrize("text,named", [
    pytest.param('"x": ' + "[" * 100_000 + "]" * 100_000, "nested too deeply", id="nested-100000"),
    pytest.param('"x": ' + "9" * 5_000, "too long", id="integer-5000-digits"),
    pytest.param('"vocab_size": 128256', "'vocab_size' appears twice", id="duplicate-key"),
])
def test_an_unreadable_file_is_refused_naming_it(tmp_path, text, named):
    path = _whole_file(tmp_path, text)
    message = _refused(path)
    assert str(path) in message and named in message


def test_a_duplicate_key_inside_a_nested_object_is_refused(tmp_path):
    path = _whole_file(tmp_path, '"rope_scaling": {"factor": 8.0, "factor": 4.0}')
    assert "'factor' appears twice" in _refused(path)


def _exit_code(path: Path, capsys) -> tuple[int, str]:
    with mock.patch.object(sys, "argv", ["apmw", "model", str(path)]), pytest.raises(SystemExit) as done:
        main()
    return int(done.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize("model,field,value", FIELDS)
def test_apmw_model_exits_as_a_user_error(tmp_path, capsys, model, field, value):
    code, err = _exit_code(_write(tmp_path, model, field, value), capsys)
    assert code == USER_ERROR_EXIT and "internal error" not in err and field in err


@pytest.mark.parametrize("model,field,value", [
    pytest.param(QWEN_MOE, "mlp_only_layers", [0, 47], id="mlp_only_layers"),
    pytest.param(SCOUT, "moe_layers", [1, 3], id="moe_layers"),
    pytest.param(SCOUT, "no_rope_layers", [1, 1, 1, 0] * 12, id="no_rope_layers"),
    pytest.param(LLAMA, "num_hidden_layers", 32.0, id="whole-float"),
])
def test_well_formed_values_are_still_read(tmp_path, model, field, value):
    arch = load_architecture(str(_write(tmp_path, model, field, value)))
    assert arch.params > 0


def test_a_quantisation_method_apmw_does_not_read_is_refused(tmp_path):
    """Fuzzing (session 38): quant_method 'banana' was priced as 16-bit weights with no word; now refused, naming
    the methods apmw reads."""
    path = _write(tmp_path, LLAMA, "quantization_config", {"quant_method": "banana"})
    message = _refused(path)
    assert "quant_method 'banana' is not one apmw reads" in message and "compressed-tensors" in message
    for method in ("fp8", "awq"):
        load_architecture(str(_write(tmp_path, LLAMA, "quantization_config", {"quant_method": method})))


@pytest.mark.parametrize("model,field,value,same_as,named", [
    ("openai--gpt-oss-20b", "experts_per_token", 2, "num_experts_per_tok",
     "'num_experts_per_tok' is 4 but 'experts_per_token'"),
    ("mistralai--Mixtral-8x7B-v0.1", "n_routed_experts", 64, "num_local_experts",
     "'n_routed_experts' is 64 but 'num_local_experts'"),
])
def test_one_field_under_two_names_that_disagree_is_refused(tmp_path, model, field, value, same_as, named):
    """gpt-oss-20b with experts_per_token 2 beside num_experts_per_tok 4 was read with the first name silently, and
    Mixtral with n_routed_experts 64 beside num_local_experts 8 as 64 experts, 362 B parameters (fuzzing,
    session 45); the same value under both names is still read."""
    assert named in _refused(_write(tmp_path, model, field, value))
    agreeing = json.loads((MODELS / f"{model}.json").read_text())[same_as]
    load_architecture(str(_write(tmp_path, model, field, agreeing)))


def test_what_is_not_a_config_file_is_named_for_what_it_is(tmp_path):
    """A FIFO read as 'no file exists', /dev/zero as 'not a bundled model', a 200 MB file read whole into 518 MB,
    `{}` as "model_type '(none)' (?)" and `sliding_window: 0` as 'missing' (fuzzing, session 45)."""
    import os

    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    assert "not a regular file (a device, a pipe or a socket)" in _refused(fifo)
    big = tmp_path / "config.json"
    big.write_text('{"pad": "' + "x" * (5 * 2**20) + '"}')
    assert "past the 4 MiB a config.json can be" in _refused(big)
    big.write_text("{}")
    assert "the config has no model_type: a HuggingFace config.json names its family there" in _refused(big)
    cfg = json.loads((MODELS / "openai--gpt-oss-20b.json").read_text())
    cfg["sliding_window"] = 0
    big.write_text(json.dumps(cfg))
    assert "'sliding_window' is 0" in _refused(big)


@pytest.mark.parametrize("field", ["hidden_size", "head_dim", "vocab_size",
                                   "intermediate_size"])
def test_a_size_past_any_model_s_is_refused_with_the_sizes_it_makes(tmp_path, field):
    """A size of 1e12 is a whole number under 2**53, so it was read: 1.2e19 parameters for a head_dim of 1e12,
    with no note (fuzzing, session 53). Past MAX_PARAMS the config is refused, with the sizes shown."""
    path = _write(tmp_path, LLAMA, field, 10 ** 12)
    message = _refused(path)
    assert message.startswith(f"{path}: ") and "parameters, over 2e+15" in message and "mistyped" in message


def test_every_bundled_config_is_far_under_the_parameter_bound():
    from apmw.arch.from_config import MAX_PARAMS

    largest = max(load_architecture(str(p)).params for p in MODELS.glob("*.json"))
    assert 1e11 < largest < MAX_PARAMS / 100


def _edited(tmp_path: Path, model: str, edit) -> Path:
    """A copy of a bundled config after ``edit(config)``."""
    cfg = json.loads((MODELS / f"{model}.json").read_text())
    edit(cfg)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


# fuzz round 6: each was read with a silently wrong count, or refused naming a field the file does not hold
@pytest.mark.parametrize("model,edit,named", [
    pytest.param(DEEPSEEK, lambda c: c.pop("intermediate_size"), "no 'intermediate_size', needed for the MLP of its 3 "
                 "dense layer(s)", id="dense-layers-without-intermediate_size"),
    pytest.param(DEEPSEEK, lambda c: c.update(intermediate_size=0), "'intermediate_size' is 0",
                 id="dense-layers-intermediate_size-0"),
    pytest.param("Qwen--Qwen3.5-397B-A17B", lambda c: c["text_config"].update(mamba_ssm_dtype="float4"),
                 "'mamba_ssm_dtype' is 'float4', not a dtype apmw knows", id="unknown-ssm-dtype"),
    pytest.param(LLAMA, lambda c: (c.pop("head_dim", None), c.update(hidden_size=16)),
                 "no 'head_dim', and 'hidden_size' 16 over 'num_attention_heads' 32", id="implied-head_dim-0"),
    pytest.param("openai--gpt-oss-20b", lambda c: (c.pop("num_experts_per_tok", None), c.update(experts_per_token=0)),
                 "'experts_per_token' is 0", id="experts_per_token-0"),
])
def test_a_config_is_refused_by_the_field_it_holds(tmp_path, model, edit, named):
    assert named in _refused(_edited(tmp_path, model, edit))


def test_a_text_config_without_a_family_is_the_wrapper_s(tmp_path):
    # Llama-4's text part without model_type was read as no family at all: no chunked attention, no shared expert
    path = _edited(tmp_path, SCOUT, lambda c: c["text_config"].pop("model_type"))
    arch, bundled = load_architecture(str(path)), load_architecture(str(MODELS / f"{SCOUT}.json"))
    assert (arch.params, arch.sliding_window_layers) == (bundled.params, bundled.sliding_window_layers)


def test_a_float64_ssm_state_is_eight_bytes(tmp_path):
    def ssm(dtype):
        return load_architecture(str(_edited(tmp_path, "Qwen--Qwen3.5-397B-A17B",
                                             lambda c: c["text_config"].update(mamba_ssm_dtype=dtype))))
    assert ssm("float64").linear_state_bytes_per_sequence > ssm("float32").linear_state_bytes_per_sequence


def test_a_config_without_a_context_window_is_said_to_leave_prompts_unchecked(tmp_path, capsys):
    """A config.json without max_position_embeddings reads (the window is not needed to price a step), but nothing
    then checks prompts against the window: `apmw model` lists that among its notes and `apmw predict` says it
    (fuzz round 7: a 500,000-token prompt on such a copy of Llama-3.1-8B was priced without a word)."""
    from apmw.arch.config import UNKNOWN_WINDOW

    cfg = json.loads((MODELS / f"{LLAMA}.json").read_text())
    del cfg["max_position_embeddings"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    arch = load_architecture(str(path))
    assert arch.max_context_tokens is None and UNKNOWN_WINDOW in arch.notes
    assert UNKNOWN_WINDOW not in load_architecture(str(MODELS / f"{LLAMA}.json")).notes
    with mock.patch.object(sys, "argv", ["apmw", "predict", "--model", str(path), "--gpu", "H200", "--tp", "8",
                                         "--kv-dtype", "bf16", "--isl", "500000", "--osl", "100",
                                         "--concurrency", "1", "--json"]):
        with pytest.raises(SystemExit) as ended:
            main()
    assert ended.value.code in (0, None)
    assert UNKNOWN_WINDOW in " ".join(capsys.readouterr().err.split())
