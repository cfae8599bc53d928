from __future__ import annotations

import math

import numpy as np
import pytest

from apmw.spec import Constant, Empirical, Lognormal, SpecError, load_spec, parse_distribution, spec_from_dict
from tests.conftest import EXAMPLES, small_spec_dict


def test_lognormal_from_mean_and_p95_reproduces_both():
    d = Lognormal.model_validate({"mean": 226, "p95": 780})
    assert d.mean == pytest.approx(226, rel=1e-9)
    assert d.quantile(0.95) == pytest.approx(780, rel=1e-9)
    x = d.sample(np.random.default_rng(1), 400_000)
    assert x.mean() == pytest.approx(226, rel=0.02)
    assert np.quantile(x, 0.95) == pytest.approx(780, rel=0.02)


def test_lognormal_from_p50_and_p95():
    d = Lognormal.model_validate({"p50": 0.3, "p95": 1.0})
    assert d.quantile(0.5) == pytest.approx(0.3)
    assert d.quantile(0.95) == pytest.approx(1.0)
    assert d.mean == pytest.approx(0.3 * math.exp(d.sigma**2 / 2))


def test_empirical_interpolates_quantiles():
    d = Empirical.model_validate({"quantiles": {0.0: 0, 0.5: 10, 1.0: 30}})
    assert d.quantile(0.25) == pytest.approx(5)
    assert d.quantile(0.75) == pytest.approx(20)
    assert d.mean == pytest.approx(12.5, rel=1e-3)


@pytest.mark.parametrize("bad, words", [
    (-3, "must be >= 0"),
    ({"mean": 100, "p95": 50}, "below the mean"),
    ({"mean": 10, "p95": 100}, "largest ratio"),
    ({"p95": 100}, "exactly one of"),
    ({"quantiles": {0.5: 10}}, "at least two"),
    ({"quantiles": {0.5: 10, 0.9: 5}}, "must not decrease"),
    (True, "got True"),
])
def test_bad_distributions_say_what_is_wrong(bad, words):
    with pytest.raises(ValueError, match=words):
        parse_distribution(bad)


def test_number_is_a_constant():
    assert parse_distribution(5) == Constant(value=5)


def test_examples_load():
    for path in EXAMPLES.glob("*.yaml"):
        spec = load_spec(path)
        assert spec.slo.task_latency_p95_s > 0


def _problems(data: dict) -> str:
    with pytest.raises(SpecError) as info:
        spec_from_dict(data, "x.yaml")
    return str(info.value)


def test_missing_section_is_named():
    data = small_spec_dict()
    del data["slo"]
    assert "slo: missing (required)" in _problems(data)


def test_unknown_key_is_rejected_with_path():
    data = small_spec_dict()
    data["serving"]["max_btach"] = 3
    assert "serving.max_btach: unknown field" in _problems(data)


def test_a_quantile_table_s_mean_counts_a_narrow_top_step():
    # the table's quantile function integrated exactly; averaged at 2,001 points it read 50.97 and 2,499
    assert Empirical.model_validate({"quantiles": {0: 1, 0.999999: 1, 1.0: 100_000}}).mean == pytest.approx(1.0499995)
    assert Empirical.model_validate({"quantiles": {0: 0, 0.999999: 0, 1.0: 5e6}}).mean == pytest.approx(2.5)
    # held flat below the first quantile and above the last, as the quantile function is
    assert Empirical.model_validate({"quantiles": {0.5: 10, 0.9: 20}}).mean == pytest.approx(13.0)


def test_a_first_call_with_an_empty_prompt_is_refused():
    data = small_spec_dict()
    data["workload"].update(system_prompt_tokens=0, first_call_input_tokens=0)
    assert "workload.first_call_input_tokens: is 0 tokens in every call" in _problems(data)
    data["workload"].pop("first_call_input_tokens")
    data["workload"]["new_input_tokens_per_call"] = 0
    assert "workload.new_input_tokens_per_call: is 0 tokens in every call" in _problems(data)
    data["workload"]["system_prompt_tokens"] = 1       # one token of system prompt is a prompt
    assert spec_from_dict(data).workload.system_prompt_tokens == 1


def test_zero_output_tokens_rejected():
    data = small_spec_dict()
    data["workload"]["output_tokens_per_call"] = 0
    assert "workload.output_tokens_per_call: averages 0; it must average at least 1" in _problems(data)


@pytest.mark.parametrize("field,value", [("output_tokens_per_call", 0.4), ("steps_per_task", 0.5),
                                         ("calls_per_step", {"mean": 0.8, "p95": 2})])
def test_a_count_averaging_under_one_is_refused_not_rounded_up(field, value):
    data = small_spec_dict()
    data["workload"][field] = value
    assert f"workload.{field}: averages" in _problems(data) and "must average at least 1" in _problems(data)


def test_a_fixed_count_between_two_whole_numbers_keeps_its_mean():
    from apmw.spec.distribution import sample_whole

    rng = np.random.default_rng(0)
    draws = sample_whole(Constant(value=2.5), rng, 100_000, 1)
    assert set(draws.tolist()) == {2, 3} and draws.mean() == pytest.approx(2.5, abs=0.01)
    # whole values and distributions round each draw, as before (no draw consumed for the split)
    lognormal = Lognormal.model_validate({"mean": 300, "p95": 900})
    a, b = np.random.default_rng(1), np.random.default_rng(1)
    assert (sample_whole(lognormal, a, 1000) == np.rint(lognormal.sample(b, 1000)).astype(np.int64)).all()
    assert (sample_whole(Constant(value=3.0), a, 5, 1) == 3).all() and a.random() == b.random()


def test_a_task_of_two_and_a_half_steps_is_planned_as_one():
    from apmw.capacity import plan

    data = small_spec_dict()
    data["workload"]["steps_per_task"] = 2.5
    calls = plan(spec_from_dict(data), agents=4).to_dict()["calls_per_session"]
    assert calls == pytest.approx(2.5, abs=0.05)      # 2.0 while each task's 2.5 steps were rounded to even


def test_negative_tokens_rejected_with_field_path():
    data = small_spec_dict()
    data["workload"]["new_input_tokens_per_call"] = -5
    assert "workload.new_input_tokens_per_call: must be >= 0" in _problems(data)


def test_ttl_policy_needs_ttl():
    data = small_spec_dict()
    data["serving"]["tool_wait_kv_policy"] = "ttl"
    assert "needs ttl_s" in _problems(data)


@pytest.mark.parametrize("policy, extra", [("offload", {}), ("ttl", {"ttl_s": 60})])
def test_a_kept_context_policy_needs_prefix_caching(policy, extra):
    """Without prefix caching no call reads an earlier call's KV: offload and ttl changed nothing, silently."""
    data = small_spec_dict()
    data["serving"].update(prefix_caching=False, tool_wait_kv_policy=policy, **extra)
    problems = _problems(data)
    assert "serving.tool_wait_kv_policy" in problems and "prefix_caching" in problems
    data["serving"]["prefix_caching"] = True
    assert spec_from_dict(data, "x.yaml").serving.tool_wait_kv_policy == policy


def test_yaml_errors_give_line_and_column(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("workload:\n  steps_per_task: [1, 2\nmodel: {}\n")
    with pytest.raises(SpecError) as info:
        load_spec(p)
    assert "line 3, column 6" in str(info.value) and "YAML syntax error" in str(info.value)


def test_validation_errors_carry_the_file_line(tmp_path):
    p = tmp_path / "s.yaml"
    text = (EXAMPLES / "coding-agent.yaml").read_text().replace("max_batch: 256", "max_batch: -1")
    p.write_text(text)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "max_batch: -1" in t)
    with pytest.raises(SpecError) as info:
        load_spec(p)
    assert f"line {line}: serving.max_batch" in str(info.value)
    assert str(p) in str(info.value)


def test_dtype_and_engine_spellings_of_hf_and_the_engines_are_accepted():
    d = small_spec_dict()
    d["model"].update(weight_dtype="bfloat16", kv_dtype="fp8_e4m3")
    d["serving"]["engine"] = "TensorRT-LLM"
    spec = spec_from_dict(d)
    assert (spec.model.weight_dtype, spec.model.kv_dtype, spec.serving.engine) == ("bf16", "fp8", "trtllm")


@pytest.mark.parametrize("section, key, value, why", [("serving", "engine", "tgi", "should be 'vllm'"),
                                                      ("model", "kv_dtype", "auto", "'auto' depends on the checkpoint")])
def test_unknown_dtype_or_engine_is_still_an_error(section, key, value, why):
    d = small_spec_dict()
    d[section][key] = value
    with pytest.raises(SpecError, match=key) as err:
        spec_from_dict(d)
    assert why in str(err.value)


def test_a_dumped_spec_loads_back_as_itself():
    # the report embeds this dump as its inputs: a reader must be able to run it
    from apmw.spec import load_spec

    for path in sorted(EXAMPLES.glob("*.yaml")):
        spec = load_spec(path)
        assert spec_from_dict(spec.model_dump(mode="json", by_alias=True, exclude_none=True)) == spec, path.name


@pytest.mark.parametrize("tokens, words", [
    ({"quantiles": {0.0: 0, 0.5: 100, 0.99: 200, 1.0: 1.0e30}}, "reaches 1.00e.30 tokens in a call .its top quantile."),
    ({"p50": 1000, "p95": 200_000}, "reaches 4,463,681,131 tokens in a call .one call in a million, its lognormal tail."),
])
def test_a_call_no_context_window_holds_is_refused_wherever_in_the_tail(tokens, words):
    d = small_spec_dict()
    d["workload"]["new_input_tokens_per_call"] = tokens
    with pytest.raises(SpecError, match=f"new_input_tokens_per_call: {words}"):
        spec_from_dict(d)
    d["workload"]["new_input_tokens_per_call"] = {"quantiles": {0.0: 0, 0.5: 100, 0.99: 200, 1.0: 1.0e6}}
    spec_from_dict(d)               # a million tokens in the longest call is a long context, not an error


@pytest.mark.parametrize("added, field, words", [
    ("  ttl_s: 30\n", "serving.ttl_s", "only applies to tool_wait_kv_policy 'ttl', not 'retain'"),
    ("  parallelism: {tp: 3}\n", "serving.parallelism", "tp 3 x pp 1 x dp_attention 1 = 3 GPUs, but "
     "hardware.gpus_per_replica is 8"),
    ("  scheduler_recv_interval: 10\n", "serving.scheduler_recv_interval", "10 is SGLang's"),
    ("  speculative: {draft: mtp, draft_model: meta-llama/Llama-3.2-1B}\n", "serving.speculative.draft_model",
     "names a separate draft model"),
])
def test_a_sections_own_check_names_the_field_and_its_line(tmp_path, added, field, words):
    """A rule a section checks across its fields (a model validator) names the field at fault and the line it is
    on, not the section's line (or none, for a rule across sections)."""
    text = (EXAMPLES / "coding-agent.yaml").read_text().replace("  prefix_caching: true\n",
                                                                "  prefix_caching: true\n" + added)
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    line = text.splitlines().index(added.splitlines()[0]) + 1
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert f"line {line}: {field}: {words}" in str(err.value)


def test_a_relative_model_config_is_read_beside_the_spec_file(tmp_path, monkeypatch):
    """`model.config: cfg.json` beside the spec was 'no file cfg.json exists' when run from another folder, and
    with another cfg.json in that folder the other model was planned without a word (fuzzing, session 45).
    It is read beside the spec, as a fleet file's spec paths are; an empty name is refused, not read as '.'."""
    import json
    import yaml
    from apmw.arch import load_architecture
    from apmw.catalog.models import load_config

    small, _ = load_config("meta-llama/Meta-Llama-3.1-8B")
    large, _ = load_config("meta-llama/Meta-Llama-3.1-70B")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "cfg.json").write_text(json.dumps(small))
    (tmp_path / "cfg.json").write_text(json.dumps(large))          # another one where apmw is run from
    d = small_spec_dict()
    d["model"]["config"] = "cfg.json"
    (tmp_path / "sub" / "spec.yaml").write_text(yaml.safe_dump(d))
    monkeypatch.chdir(tmp_path)
    spec = load_spec("sub/spec.yaml")
    assert spec.model.config == str(tmp_path.joinpath("sub", "cfg.json").relative_to(tmp_path))
    assert load_architecture(spec.model.config).hidden_size == small["hidden_size"]
    monkeypatch.chdir(tmp_path / "sub")
    assert load_spec("spec.yaml").model.config == "cfg.json"        # beside it already
    d["model"]["config"] = "meta-llama/Meta-Llama-3.1-8B"             # a bundled name is not a path
    (tmp_path / "sub" / "named.yaml").write_text(yaml.safe_dump(d))
    monkeypatch.chdir(tmp_path)
    assert load_spec("sub/named.yaml").model.config == "meta-llama/Meta-Llama-3.1-8B"
    d["model"]["config"] = " "
    with pytest.raises(SpecError, match="model.config: is empty"):
        spec_from_dict(d)
    from apmw.errors import UnknownNameError
    with pytest.raises(UnknownNameError, match="an empty name"):
        load_config("")


def test_stratified_uniforms_put_one_draw_in_each_stratum():
    from apmw.spec.distribution import stratified_uniforms

    u = stratified_uniforms(np.random.default_rng(3), 1000)
    assert ((u >= 0) & (u < 1)).all()
    assert sorted(np.floor(u * 1000).astype(int).tolist()) == list(range(1000))
    # in random order, not sorted: neighbours in a sample are not neighbours in the distribution
    assert not (np.diff(u) > 0).all()


@pytest.mark.parametrize("d", [
    Lognormal.model_validate({"mean": 300, "p95": 900}),
    Empirical.model_validate({"quantiles": {0.0: 1, 0.5: 10, 0.99: 400, 1.0: 5000}}),
    Constant(value=7.0),
])
def test_a_distribution_s_quantile_function_at_uniforms_is_its_quantile(d):
    u = np.array([0.01, 0.25, 0.5, 0.95, 0.999])
    assert d.at(u) == pytest.approx([d.quantile(q) for q in u], rel=1e-12)


def test_whole_counts_at_uniforms_follow_the_same_rounding_as_draws():
    from apmw.spec.distribution import whole_at

    u = (np.arange(1000) + 0.5) / 1000
    assert whole_at(Constant(value=2.5), u, 1).mean() == 2.5
    lognormal = Lognormal.model_validate({"mean": 300, "p95": 900})
    assert (whole_at(lognormal, u) == np.rint(lognormal.at(u))).all()
    assert (whole_at(Constant(value=0.0), u, 1) == 1).all()
