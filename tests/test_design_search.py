"""apmw search: every point of a space planned, infeasible ones pruned with a reason, the Pareto front."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from apmw.design_search import MAX_POINTS, read_space, search
from apmw.design_search.store import CHECK_FIELDS, check_saved_check
from apmw.errors import ApmwError
from apmw.spec import SpecError, load_spec, spec_from_dict
from tests.conftest import EXAMPLES, ROOT, small_spec_dict

APMW = shutil.which("apmw") or str(Path(sys.executable).parent / "apmw")

AXES = {"hardware.gpus_per_replica": [1, 2], "serving.max_batch": [32, 128, 256], "serving.engine": ["vllm", "sglang"]}


@pytest.fixture(scope="module")
def answer():
    return search(spec_from_dict(small_spec_dict()), AXES)


def _dominates(a, b) -> bool:
    fa, fb = a.figures, b.figures
    better_or_equal = (fa["agents_per_mw"] >= fb["agents_per_mw"]
                       and fa["output_speed_tokens_per_s"] >= fb["output_speed_tokens_per_s"])
    strictly = (fa["agents_per_mw"] > fb["agents_per_mw"]
                or fa["output_speed_tokens_per_s"] > fb["output_speed_tokens_per_s"])
    return better_or_equal and strictly


def test_every_point_is_planned_and_the_front_is_not_dominated(answer):
    assert len(answer.points) + len(answer.pruned) == 12
    front = answer.front()
    assert front
    for p in front:
        assert not any(_dominates(q, p) for q in answer.points)
    for p in answer.points:
        assert p in front or any(_dominates(q, p) for q in front) or any(
            q.figures["agents_per_mw"] == p.figures["agents_per_mw"]
            and q.figures["output_speed_tokens_per_s"] == p.figures["output_speed_tokens_per_s"] for q in front)


def test_the_best_point_per_objective(answer):
    best = answer.best()
    assert best["agents_per_mw"].figures["agents_per_mw"] == max(p.figures["agents_per_mw"] for p in answer.points)
    assert best["cost_per_session_usd"].figures["cost_per_session_usd"] == min(
        p.figures["cost_per_session_usd"] for p in answer.points)


def test_the_launch_line_carries_the_point_settings(answer):
    for p in answer.points:
        s = p.settings
        if s["serving.engine"] == "vllm":
            assert f"--tensor-parallel-size {s['hardware.gpus_per_replica']}" in p.launch
            assert f"--max-num-seqs {s['serving.max_batch']}" in p.launch
        else:
            assert f"--tp {s['hardware.gpus_per_replica']}" in p.launch
            assert f"--max-running-requests {s['serving.max_batch']}" in p.launch


def test_infeasible_points_are_pruned_and_counted_by_reason():
    spec = load_spec(EXAMPLES / "coding-agent.yaml")
    a = search(spec, {"hardware.gpus_per_replica": [1, 8], "serving.engine": ["vllm", "bogus"]})
    d = a.to_dict(explain=True)
    assert (d["feasible"], d["pruned"]) == (1, 3)
    assert d["pruned_by_reason"]["does not fit: the weights and workspace leave no KV memory"] == 1
    assert d["pruned_by_reason"]["not a valid spec (serving.engine)"] == 2
    assert len(d["pruned_points"]) == 3 and all(p["message"] for p in d["pruned_points"])


@pytest.mark.parametrize("space,words", [
    ([1, 2], "a space is a mapping with 'axes'"),
    ({"axes": {"engine": ["vllm"]}}, "not a dotted spec path"),
    ({"axes": {"serving.engine": []}}, "needs a non-empty list"),
    ({"axes": {"...": [1, 2]}}, "'' is not a field of the spec's top level"),
    ({"axes": {"hardware.gpu_count": [1]}}, "'gpu_count' is not a field of hardware .fields: gpu, gpus_per_replica"),
    ({"axes": {"serving.engine.name": ["vllm"]}}, "serving.engine is a value, not a section"),
    ({"axes": {"serving.max_batch": list(range(1, 1002)), "hardware.gpus_per_replica": list(range(1, 101))}},
     f"at most {MAX_POINTS:,} are evaluated"),
    # an axis inside another's field: an internal error, or the inner axis silently undone (fuzzing, session 43)
    ({"axes": {"serving.speculative": [None, {"draft": "model", "draft_tokens": 3, "acceptance_rate": 0.7}],
               "serving.speculative.draft_tokens": [2, 4]}},
     "axes serving.speculative and serving.speculative.draft_tokens overlap"),
    ({"axes": {"serving.speculative.draft_tokens": [2, 4], "serving.speculative": [None]}}, "overlap"),
    # a value JSON cannot hold: an internal error under --json --explain (fuzzing, session 43)
    ({"axes": {"serving.max_batch": [float("nan"), 64]}}, "axis serving.max_batch: nan holds a number that is not finite"),
    ({"axes": {"cost.gpu_hour_usd": [{"x": float("inf")}]}}, "not finite"),
])
def test_a_bad_space_is_refused(space, words):
    with pytest.raises(ApmwError, match=words):
        read_space(space, "space.yaml")


def test_a_space_too_large_is_refused_before_its_values_are_read(monkeypatch):
    """An axis of 100,001 values took 71 s to refuse: each value was compared with every other for a repeat before
    the size was checked (fuzz round 5). The size now comes first, and no value is read for it."""
    import apmw.design_search.space as space_module

    def read(path, value):
        raise AssertionError("a value was read before the space's size was checked")

    monkeypatch.setattr(space_module, "_spelling", read)
    with pytest.raises(ApmwError, match=f"100,001 points; at most {MAX_POINTS:,}"):
        read_space({"axes": {"serving.max_batch": list(range(1, 100_002))}}, "space.yaml")


def test_the_cli_prints_the_front_as_json(tmp_path):
    from tests.e2e.test_cli import APMW

    space = tmp_path / "space.yaml"
    space.write_text("axes:\n  serving.max_batch: [128, 256]\n  serving.engine: [vllm, sglang]\n")
    r = subprocess.run([APMW, "search", str(EXAMPLES / "support-chat.yaml"), "--space", str(space), "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["evaluated"] == 4 and d["front"] and set(d["best"]) >= {"agents_per_mw", "cost_per_session_usd"}
    space.write_text("axes: 3\n")
    r = subprocess.run([APMW, "search", str(EXAMPLES / "support-chat.yaml"), "--space", str(space)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "a space is a mapping with 'axes'" in r.stderr
    space.write_text("axes: {serving.max_batch: [128, 256\n")         # a YAML error is the space's, not a spec's
    r = subprocess.run([APMW, "search", str(EXAMPLES / "support-chat.yaml"), "--space", str(space)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and f"{space}: invalid search space" in r.stderr and "invalid spec" not in r.stderr
    space.write_text("axes: {serving.max_batch: [64]}\n" + "#" * (1 << 20) + "\n")
    r = subprocess.run([APMW, "search", str(EXAMPLES / "support-chat.yaml"), "--space", str(space)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "a search space is a few kB" in " ".join(r.stderr.split())
    r = subprocess.run([APMW, "search", str(EXAMPLES / "support-chat.yaml"), "--workers", "2", "--ray", "auto"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "--workers 2 and --ray auto both given" in " ".join(r.stderr.split())


def test_the_front_holds_the_best_of_each_of_its_two_objectives(answer):
    front, best = answer.front(), answer.best()
    assert best["agents_per_mw"] in front
    top_speed = max(p.figures["output_speed_tokens_per_s"] for p in answer.points)
    assert any(p.figures["output_speed_tokens_per_s"] == top_speed for p in front)


def test_a_one_point_space_is_the_plan():
    from apmw.capacity import plan

    spec = spec_from_dict(small_spec_dict())
    (point,) = search(spec, {"serving.max_batch": [256]}).points
    d = plan(spec).to_dict()
    f = point.figures       # the plan's own figures, to the last bit
    for name in ("agents_per_replica", "binding_constraint", "agents_per_mw", "agents_per_mw_provisioned",
                 "cost_per_session_usd"):
        assert f[name] == d[name], name
    assert f["agents_per_gpu"] == d["agents_per_replica"] / d["replica"]["gpus"]
    assert f["task_latency_p95_s"] == d["task_latency_s"]["p95"]
    assert f["output_speed_tokens_per_s"] == 1.0 / d["tpot_p95_s"]


def test_an_axis_through_a_field_that_is_not_a_section_is_refused():
    spec = spec_from_dict(small_spec_dict())
    with pytest.raises(ApmwError, match="axis 'seed.x': seed is a value, not a section; the axis ends there"):
        search(spec, {"seed.x": [1]})
    # a catalogue GPU by name: the way to vary its figures is said (fuzzing, session 43)
    with pytest.raises(ApmwError, match=r"hardware.gpu as 'H100', .* \(hardware.gpu: \{name: H100\}"):
        search(spec, {"hardware.gpu.hbm_bytes": [8e10]})
    # a section the spec leaves out is created
    (point,) = search(spec, {"serving.speculative.draft_tokens": [2], "serving.speculative.acceptance_rate": [0.5]}).points
    assert "serving.speculative.draft_tokens" in point.settings


def test_check_settles_the_best_front_points_in_the_simulator():
    from apmw.design_search import check_front
    from apmw.sim.checked import check_plan
    from apmw.capacity import plan

    spec = load_spec(EXAMPLES / "support-chat.yaml")
    found = search(spec, {"serving.engine": ["vllm", "sglang"]})
    checked = check_front(spec, found, 1, tasks_per_point=60)
    front = checked.front()
    assert front[0].checked is not None and all(p.checked is None for p in front[1:])
    # the same answer apmw plan gives for that point
    direct = check_plan(plan(spec_from_dict({**spec.model_dump(mode="json", by_alias=True, exclude_none=True),
                                             "serving": {**spec.serving.model_dump(mode="json", by_alias=True,
                                                                                   exclude_none=True),
                                                         **{"engine": front[0].settings["serving.engine"]}}})),
                        tasks_per_point=60).to_dict()
    c = front[0].checked
    assert c["agents_per_replica"] == direct["agents_per_replica"]
    assert c["agents_per_replica_interval"] == direct["agents_per_replica_interval"]
    assert c["agents_per_mw"] == pytest.approx(direct["agents_per_mw"])
    assert "checked" in checked.to_dict()["front"][0]
    # what a resumed search reads back from its results file (design_search.store.check_saved_check)
    assert set(c) == set(CHECK_FIELDS) and check_saved_check(Path("out.parquet"), 0, 0, json.dumps(c)) == c


# a simulator's answer as check_front writes one
CHECK = {"agents_per_replica": 11, "agents_per_replica_interval": [10, 12], "agents_simulated": [10, 11, 12],
         "binding_constraint": "slo", "agents_per_mw": 8100.5, "cost_per_session_usd": 0.004,
         "task_latency_p95_s": 830.0, "task_latency_p95_interval_s": [790.0, None], "completed_tasks": 150}


@pytest.mark.parametrize("cell, said", [
    ("{bad", "is not JSON"), ("5", "is not the simulator's answer"), ("null", "is not the simulator's answer"),
    ('{"not_checked": 5}', "is not the simulator's answer"),
    (json.dumps({**CHECK, "agents_per_replica": "x"}), "agents_per_replica is 'x'"),
    (json.dumps({**CHECK, "agents_per_mw": float("nan")}), "agents_per_mw is nan"),
    (json.dumps({**CHECK, "agents_simulated": 3}), "agents_simulated is 3"),
])
def test_a_saved_simulator_answer_that_is_not_one_is_refused_at_its_row(cell, said):
    """search --resume carries the earlier run's checked cells into the new file: a damaged one raised
    JSONDecodeError, and any JSON was carried as it stood (fuzzing, session 52)."""
    with pytest.raises(ApmwError, match="out.parquet: row 3 \\(point 7\\): its checked cell") as err:
        check_saved_check(Path("out.parquet"), 2, 7, cell)
    assert said in str(err.value) and "remove it to start afresh" in str(err.value)
    assert check_saved_check(Path("o"), 0, 0, '{"not_checked": "why"}') == {"not_checked": "why"}
    assert check_saved_check(Path("o"), 0, 0, json.dumps(CHECK)) == CHECK


def test_a_point_the_simulator_cannot_run_says_why_it_was_not_checked():
    from apmw.design_search import check_front

    spec = load_spec(EXAMPLES / "support-chat.yaml")
    found = search(spec, {"serving.disaggregation": [{"prefill_gpus": 2}], "serving.tool_wait_kv_policy": ["retain"]})
    assert found.points, found.pruned
    checked = check_front(spec, found, 1)
    why = checked.front()[0].checked["not_checked"]
    assert "disaggregated prefill" in why
    # the table and the page give the reason whole (the table cut it at 60 characters, the page at 80)
    from apmw.cli.search import _checked_cells
    from apmw.report.search_page import _checked

    long = f"{why}; and more, past eighty characters"
    assert _checked_cells({"not_checked": long}) == ("not checked", long)
    assert _checked({"checked": {"not_checked": long}}) == "not checked: " + long


@pytest.mark.parametrize("engine,worker", [("vllm", "dynamo.vllm --model"), ("sglang", "dynamo.sglang --model-path"),
                                           ("trtllm", "dynamo.trtllm --model-path")])
def test_a_disaggregated_point_launches_as_a_frontend_a_prefill_and_a_decode_worker(engine, worker):
    spec = spec_from_dict(small_spec_dict())
    a = search(spec, {"serving.engine": [engine], "serving.tool_wait_kv_policy": ["retain"],
                      "serving.disaggregation": [None, {"prefill_gpus": 2}]})
    assert len(a.points) == 2, a.pruned
    together, apart = a.points
    assert "\n" not in together.launch and "dynamo" not in together.launch
    frontend, prefill, decode = apart.launch.split("\n")
    assert frontend == "python3 -m dynamo.frontend --http-port 8000"
    assert worker in prefill and "--disaggregation-mode prefill" in prefill
    assert worker in decode and "--disaggregation-mode decode" in decode
    tp = {"vllm": "--tensor-parallel-size {}", "sglang": "--tp {}", "trtllm": "tensor_parallel_size: {}"}[engine]
    assert tp.format(2) in prefill and tp.format(1) in decode     # the prefill instance's GPUs, then the replica's
    assert ("NixlConnector" in prefill) == (engine == "vllm")


def test_the_default_space_holds_the_spec_itself_and_says_where_it_ranks():
    from apmw.capacity import plan
    from apmw.design_search import default_space, spec_document

    spec = load_spec(EXAMPLES / "deep-research.yaml")
    axes = default_space(spec_document(spec))
    assert axes["model.weight_dtype"][0] == spec.model.weight_dtype == "fp4"     # the checkpoint's own, first
    assert set(axes["serving.engine"]) == {"vllm", "sglang", "trtllm"} and axes["hardware.gpus_per_replica"] == [1, 2, 4, 8]
    small = {k: v[:1] for k, v in axes.items()} | {"serving.max_batch": axes["serving.max_batch"][:2]}
    d = search(spec, small).to_dict()
    own, direct = d["as_specified"], plan(spec).to_dict()
    assert own["settings"] == {k: v[0] for k, v in small.items()}
    assert own["agents_per_replica"] == direct["agents_per_replica"]
    assert own["agents_per_mw"] == pytest.approx(direct["agents_per_mw"])
    assert own["rank_by_agents_per_mw"] in (1, 2)
    # a space that leaves the spec's value out of an axis has no such point
    assert search(spec, {"serving.max_batch": [64]}).to_dict()["as_specified"] is None


def test_the_default_space_of_a_mixture_of_experts_tries_attention_data_parallel():
    from apmw.design_search import default_space, spec_document

    coding = spec_document(load_spec(EXAMPLES / "coding-agent.yaml"))
    assert default_space(coding, moe=True)["serving.attention_data_parallel"] == [False, True]
    assert "serving.attention_data_parallel" not in default_space(coding)          # a dense model: no such axis
    # a spec that lays its replica out itself keeps its layout
    laid_out = {**coding, "serving": {**coding["serving"], "parallelism": {"tp": 8}}}
    assert "serving.attention_data_parallel" not in default_space(laid_out, moe=True)
    # ... and the GPU count its layout multiplies to: 1, 2 and 4 GPUs were every one pruned as a refused layout
    assert default_space(laid_out, moe=True)["hardware.gpus_per_replica"] == [8]
    assert default_space(coding, moe=True)["hardware.gpus_per_replica"] == [1, 2, 4, 8]
    r = subprocess.run([APMW, "search", str(EXAMPLES / "coding-agent.yaml"), "--json", "--workers", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    best = json.loads(r.stdout)["best"]["agents_per_mw"]["settings"]
    assert best["serving.attention_data_parallel"] is True


def test_a_spec_pruned_as_specified_says_why():
    spec = load_spec(EXAMPLES / "coding-agent.yaml")
    d = search(spec, {"hardware.gpus_per_replica": [1, 8]}).to_dict()
    assert d["as_specified"]["settings"] == {"hardware.gpus_per_replica": 8} and "agents_per_mw" in d["as_specified"]
    one = spec_from_dict({**spec.model_dump(mode="json", by_alias=True, exclude_none=True),
                          "hardware": {"gpu": spec.hardware.gpu, "gpus_per_replica": 1}})
    d = search(one, {"hardware.gpus_per_replica": [1, 8]}).to_dict()
    assert d["as_specified"]["reason"].startswith("does not fit")


TP2_DP4 = {"tp": 2, "dp_attention": 4, "ep": 8, "redundant_experts": 32, "two_batch_overlap": True}


@pytest.mark.parametrize("engine,layout,expected", [
    ("vllm", TP2_DP4, ["--tensor-parallel-size 2", "--data-parallel-size 4", "--enable-expert-parallel",
                       "--max-num-seqs 64", "--max-num-batched-tokens 4096",
                       """--enable-eplb --eplb-config '{"num_redundant_experts":32}'""", "--enable-dbo"]),
    ("sglang", TP2_DP4, ["--tp 8", "--dp 4 --enable-dp-attention", "--ep-size 8", "--max-running-requests 64",
                         "--chunked-prefill-size 4096", "--ep-num-redundant-experts 32", "--enable-two-batch-overlap"]),
    # TensorRT-LLM's attention is TP or DP, not both: its DEP8 (tp 2 x dp 4 is refused, below)
    ("trtllm", {"tp": 1, "dp_attention": 8, "ep": 8, "redundant_experts": 32},
     ["--tp_size 8", "--ep_size 8", "--max_batch_size 64", "--max_num_tokens 4096", "enable_attention_dp: true",
      "moe_config: {load_balancer: {num_slots: 288}}"]),
])
def test_a_laid_out_point_launches_with_its_layout_and_per_rank_limits(engine, layout, expected):
    """Each engine's own flags for an expert-parallel layout, the batch cap and budget as the flag reads them (per
    DP rank for vLLM and TensorRT-LLM, the server's total for SGLang), and what it was priced with: redundant experts
    (vLLM's EPLB, SGLang's, TensorRT-LLM's load-balancer slots for DeepSeek-V3's 256 experts + 32) and the
    two-batch overlap. Fuzz round 8: vLLM's line had --num-redundant-experts without --enable-eplb and no overlap,
    and TensorRT-LLM's dropped the redundant experts."""
    import yaml

    from apmw.capacity import plan
    from apmw.design_search import launch_flags
    from apmw.spec import spec_from_dict
    d = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" / "coding-agent.yaml").read_text())
    d["hardware"].pop("gpus_per_replica")
    d["serving"].update(engine=engine, max_batch=64, max_batched_tokens=4096, parallelism=layout)
    line = launch_flags(plan(spec_from_dict(d)))
    for flag in expected:
        assert flag in line, (flag, line)


@pytest.mark.parametrize("engine,layout,said", [
    ("trtllm", {"tp": 2, "dp_attention": 4, "ep": 8}, "TensorRT-LLM runs attention either tensor parallel or data "
     "parallel"),
    ("trtllm", {"tp": 1, "dp_attention": 8, "ep": 8, "two_batch_overlap": True}, "TensorRT-LLM has no such setting"),
    ("vllm", {"tp": 8, "dp_attention": 1, "ep": 8, "two_batch_overlap": True},
     "runs only with data parallel attention and expert parallelism"),
])
def test_a_layout_the_engine_has_no_setting_for_is_pruned_with_the_reason(engine, layout, said):
    """Fuzz round 8: TensorRT-LLM tp 2 x dp_attention 4 was priced (84-130 agents) and launched as tp 1 x dp 8."""
    spec = load_spec(EXAMPLES / "coding-agent.yaml")
    d = search(spec, {"serving.engine": [engine], "serving.parallelism": [layout]}).to_dict(explain=True)
    assert d["feasible"] == 0 and d["pruned"] == 1
    assert said in d["pruned_points"][0]["message"], d["pruned_points"]


@pytest.mark.parametrize("engine,speculative,expected", [
    ("vllm", {"draft": "mtp", "draft_tokens": 2}, """--speculative-config '{"method":"mtp","num_speculative_tokens":2}'"""),
    ("sglang", {"draft": "mtp", "draft_tokens": 2},
     "--speculative-algorithm EAGLE --speculative-num-steps 2 --speculative-eagle-topk 1 --speculative-num-draft-tokens 3"),
    ("trtllm", {"draft": "mtp", "draft_tokens": 2},
     "# extra_llm_api_options: {kv_cache_config: {dtype: fp8}, speculative_config: {decoding_type: MTP, "
     "num_nextn_predict_layers: 2}}"),
    ("vllm", {"draft": "model", "draft_tokens": 4, "acceptance_rate": 0.7},
     """--speculative-config '{"model":"<your draft model>","num_speculative_tokens":4}'"""),
    ("sglang", {"draft": "model", "draft_tokens": 4, "acceptance_rate": 0.7, "draft_model": "meta-llama/Meta-Llama-3.1-8B"},
     "--speculative-algorithm STANDALONE --speculative-draft-model-path meta-llama/Meta-Llama-3.1-8B "
     "--speculative-num-steps 4"),
    ("trtllm", {"draft": "model", "draft_tokens": 4, "acceptance_rate": 0.7},
     "speculative_config: {decoding_type: DraftTarget, max_draft_len: 4, speculative_model_dir: <your draft model>}"),
    # the draft length left to the model: the one it was priced at (R1's one MTP module), said (fuzzing, session 38)
    ("sglang", {"draft": "mtp"},
     "--speculative-algorithm EAGLE --speculative-num-steps 1 --speculative-eagle-topk 1 --speculative-num-draft-tokens 2"),
    ("vllm", {"draft": "mtp"}, """--speculative-config '{"method":"mtp","num_speculative_tokens":1}'"""),
])
def test_a_speculative_point_launches_with_its_draft(engine, speculative, expected):
    """A point that drafts launches drafting as it was priced: the model's own MTP head or a separate model,
    with its draft length, in each engine's own terms."""
    import yaml

    from apmw.capacity import plan
    from apmw.design_search import launch_flags
    from apmw.spec import spec_from_dict
    d = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" / "coding-agent.yaml").read_text())
    d["model"] = {"config": "deepseek-ai/DeepSeek-R1" if speculative["draft"] == "mtp" else "meta-llama/Meta-Llama-3.1-70B",
                  "weight_dtype": "fp8", "kv_dtype": "fp8"}
    d["hardware"] = {"gpu": "H200", "gpus_per_replica": 8}
    # a draft model's cache beside a 70B's, as many tokens, is held outside SGLang's memory share: leave it room
    d["serving"].update(engine=engine, speculative=speculative, kv_memory_fraction=0.7)
    line = launch_flags(plan(spec_from_dict(d), agents=4))
    assert expected in line, line
    assert line.count("#") <= 1                      # TensorRT-LLM's options share one comment


@pytest.mark.parametrize("model,weights,kv,engine,gpu,expected,absent", [
    ("meta-llama/Meta-Llama-3.1-70B", "fp8", "fp8", "vllm", "H100",
     ["vllm serve meta-llama/Meta-Llama-3.1-70B --quantization fp8 ", "--kv-cache-dtype fp8 "], ["#"]),
    ("meta-llama/Meta-Llama-3.1-70B", "fp8", "fp4", "sglang", "B200",
     ["--model-path meta-llama/Meta-Llama-3.1-70B --quantization fp8 ", "--kv-cache-dtype fp4_e2m1"], ["#"]),
    ("openai/gpt-oss-120b", "fp8", "fp8", "vllm", "H100",
     ["--kv-cache-dtype fp8", "# priced at fp8 weights, but openai/gpt-oss-120b stores fp4: serve a checkpoint "
      "that matches"], ["--quantization"]),
    ("deepseek-ai/DeepSeek-V4-Flash", "fp8", "fp8", "sglang", "H200",
     ["# its routed experts priced at fp8, but stored in fp4: serve a checkpoint that matches"], ["--quantization"]),
    ("meta-llama/Meta-Llama-3.1-70B", "fp4", "fp4", "trtllm", "B200",
     ["# extra_llm_api_options: {kv_cache_config: {dtype: nvfp4}}; priced at fp4 weights, but "
      "meta-llama/Meta-Llama-3.1-70B is a 16-bit checkpoint"], ["--quantization"]),
    ("deepseek-ai/DeepSeek-R1", "fp8", "bf16", "sglang", "H200", ["--tp 8"], ["--kv-cache-dtype", "--quantization", "#"]),
])
def test_a_point_launches_with_the_dtypes_it_was_priced_at(model, weights, kv, engine, gpu, expected, absent):
    """The KV dtype in each engine's own name (vLLM fp8/nvfp4, SGLang fp8_e4m3/fp4_e2m1, TensorRT-LLM's
    kv_cache_config dtype); a 16-bit checkpoint priced at fp8 quantised as vLLM and SGLang load it; any other
    mismatch between the stored and the priced weights said in a comment, since the line would serve the stored."""
    import yaml

    from apmw.capacity import plan
    from apmw.design_search import launch_flags
    from apmw.spec import spec_from_dict
    d = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" / "support-chat.yaml").read_text())
    d["model"] = {"config": model, "weight_dtype": weights, "kv_dtype": kv}
    d["hardware"] = {"gpu": gpu, "gpus_per_replica": 8}
    d["serving"]["engine"] = engine
    line = launch_flags(plan(spec_from_dict(d), agents=2))
    for text in expected:
        assert text in line, (text, line)
    for text in absent:
        assert text not in line, (text, line)


def test_both_sides_of_a_disaggregated_point_serve_the_weights_it_was_priced_at():
    """The prefill worker is priced at the spec's weights as the decode worker is: a 16-bit checkpoint priced at
    fp8 is quantised on both lines."""
    import yaml

    from apmw.capacity import plan
    from apmw.design_search import launch_flags
    from apmw.spec import spec_from_dict
    d = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" / "support-chat.yaml").read_text())
    d["model"] = {"config": "meta-llama/Meta-Llama-3.1-70B", "weight_dtype": "fp8", "kv_dtype": "fp8"}
    d["hardware"] = {"gpu": "H100", "gpus_per_replica": 4}
    d["serving"].update(engine="vllm", tool_wait_kv_policy="retain", disaggregation={"prefill_gpus": 4})
    frontend, prefill, decode = launch_flags(plan(spec_from_dict(d), agents=2)).split("\n")
    for line in (prefill, decode):
        assert "--model meta-llama/Meta-Llama-3.1-70B --quantization fp8 " in line, line


def test_a_point_where_one_session_outgrows_the_kv_memory_is_pruned_for_that_not_the_slo():
    from apmw.capacity.plan import NO_KV_ROOM, NO_SLO

    d = small_spec_dict()
    d["workload"]["new_input_tokens_per_call"] = {"mean": 30000, "p95": 60000}
    d["workload"]["steps_per_task"] = 20
    d["slo"]["task_latency_p95_s"] = 1e-3                      # the SLO fails too: memory is said first
    answer = search(spec_from_dict(d), {"hardware.gpus_per_replica": [1, 2]})
    reasons = {settings["hardware.gpus_per_replica"]: reason for settings, reason, _ in answer.pruned}
    assert reasons == {1: NO_KV_ROOM, 2: NO_SLO}


@pytest.mark.parametrize("engine,kv,serving,expected,absent", [
    ("llamacpp", "int8", {"tool_wait_kv_policy": "evict"},
     ["llama-server -m <GGUF of meta-llama/Meta-Llama-3.1-8B> -ngl 999 --parallel ",
      "--cache-type-k q8_0 --cache-type-v q8_0 --flash-attn on"], ["vllm", "sglang"]),
    ("llamacpp", "fp16", {"tool_wait_kv_policy": "evict"}, ["llama-server "], ["--cache-type", "--flash-attn"]),
    ("sglang", "bf16", {"mixed_prefill": True, "overlap_scheduling": False, "scheduler_recv_interval": 8},
     ["--enable-mixed-chunk", "--disable-overlap-schedule", "--scheduler-recv-interval 8"], []),
    ("sglang", "bf16", {}, ["--tp 1"], ["--enable-mixed-chunk", "--disable-overlap-schedule", "--scheduler-recv"]),
    ("trtllm", "int8", {"prefix_caching": False},
     ["extra_llm_api_options: {kv_cache_config: {dtype: int8, enable_block_reuse: false}}"], []),
    ("vllm", "fp8", {"tool_wait_kv_policy": "offload"},
     ["--kv-cache-dtype fp8", "# priced with each tool wait's KV offloaded to host memory: vllm needs a KV offload "
      "connector"], []),
])
def test_a_point_launches_with_the_engine_and_scheduling_it_was_priced_at(engine, kv, serving, expected, absent):
    from apmw.capacity import plan
    from apmw.design_search import launch_flags

    d = small_spec_dict()
    d["model"]["kv_dtype"] = kv
    d["serving"] = {**d.get("serving", {}), "engine": engine, **serving}
    line = launch_flags(plan(spec_from_dict(d), agents=2))
    for text in expected:
        assert text in line, (text, line)
    for text in absent:
        assert text not in line, (text, line)


@pytest.mark.parametrize("engine,kv", [("vllm", "int8"), ("sglang", "int4"), ("llamacpp", "fp8")])
def test_a_kv_dtype_the_engine_cannot_store_is_refused_with_the_ones_it_can(engine, kv):
    from apmw.capacity import plan

    d = small_spec_dict()
    d["model"]["kv_dtype"] = kv
    d["serving"] = {**d.get("serving", {}), "engine": engine}
    if engine == "llamacpp":
        d["serving"]["tool_wait_kv_policy"] = "evict"
    with pytest.raises(ApmwError, match=f"kv_dtype {kv}: {engine} stores its KV cache in .* only"):
        plan(spec_from_dict(d))


@pytest.mark.parametrize("document,words", [
    ({"axes": {"serving.max_batch": [64]}, "foo": 1}, "unknown key.s. foo: a space holds 'axes' only"),
    ({"axes": {"serving.max_batch": [64, 64, 128]}}, "axis serving.max_batch lists 64 more than once"),
    ({"axes": {"serving.engine": [{"a": 1}, {"a": 1}]}}, "lists .* more than once"),
    # one value in two spellings planned the same point twice (fuzzing, session 38)
    ({"axes": {"serving.max_batch": [1, 1.0]}}, "axis serving.max_batch lists 1 more than once"),
    ({"axes": {"hardware.gpu": [{"name": "x", "hbm_bytes": 2e11}, {"name": "x", "hbm_bytes": 200000000000}]}},
     "axis hardware.gpu lists .* more than once"),
    # one engine in two spellings (fuzzing, session 40)
    ({"axes": {"serving.engine": ["vllm", "vLLM", "TensorRT-LLM", "trtllm"]}},
     'axis serving.engine lists "trtllm", "vllm" more than once'),
    # one GPU or dtype in two spellings planned the same point twice (fuzzing, session 43)
    ({"axes": {"hardware.gpu": ["H100", "h100_sxm"]}}, 'axis hardware.gpu lists "H100-SXM5-80GB" more than once'),
    ({"axes": {"model.kv_dtype": ["fp8", "FP8", "bfloat16", "bf16"]}}, 'lists "bf16", "fp8" more than once'),
    # a spec or a fleet file given as the space listed its sections as unknown keys (fuzzing, session 45)
    ({"workload": {}, "model": {}, "slo": {}}, "a spec, not a search space"),
    ({"workloads": [{"name": "a", "spec": "a.yaml"}]}, "a fleet file, not a search space"),
])
def test_a_space_with_stray_keys_or_repeated_values_is_refused(document, words):
    from apmw.design_search import read_space

    with pytest.raises(ApmwError, match=words):
        read_space(document, "space.yaml")


def test_a_space_given_as_the_spec_is_named_a_space():
    with pytest.raises(SpecError, match="a search space .* not a spec: give it with --space"):
        spec_from_dict({"axes": {"serving.engine": ["vllm"]}})


def test_a_misspelt_axis_is_refused_before_any_point_is_planned():
    spec = spec_from_dict(small_spec_dict())
    with pytest.raises(ApmwError, match="axis 'serving.max_batchx': 'max_batchx' is not a field of serving "
                                        r"\(fields: .*max_batch, max_batched_tokens"):
        search(spec, {"serving.max_batchx": [64]})


def test_a_yes_or_no_where_a_number_goes_is_refused_not_read_as_one():
    d = small_spec_dict()
    d["serving"] = {**d.get("serving", {}), "max_batch": True}
    with pytest.raises(SpecError, match="max_batch: true is a yes/no, not a number"):
        spec_from_dict(d)


def test_a_value_keyed_by_numbers_and_text_alike_has_a_results_key():
    """json.dumps(sort_keys=True) could not order 1 against 'name', an internal error with --parquet (fuzzing,
    session 43); the point itself is pruned by the spec's own check."""
    from apmw.design_search.space import search_key

    axes = {"hardware.gpu": ["H100", {"name": "H100", 1: 2}]}
    assert search_key(small_spec_dict(), axes) == search_key(small_spec_dict(), axes)


def test_the_spec_stands_at_its_point_whatever_the_axis_spelling():
    """An axis value FP8 beside the spec's fp8 lost the "where the spec stands" line (fuzzing, session 43)."""
    from apmw.design_search.space import spec_point

    base = {"model": {"kv_dtype": "fp8"}, "hardware": {"gpu": "H100"}}
    assert spec_point(base, {"model.kv_dtype": ["bf16", "FP8"], "hardware.gpu": ["h200", "H100-SXM5-80GB"]}) == 3


def test_points_pruned_for_one_cause_are_counted_together_whatever_their_values():
    """Reasons that quoted their values ("max_batched_tokens 1 is below max_batch 256", "16 is below ...") were
    counted apart (fuzzing, session 43); names keep their digits."""
    from apmw.design_search.point import prune_reason

    a = prune_reason("serving.max_batched_tokens 1 is below max_batch 256; raise it")
    b = prune_reason("serving.max_batched_tokens 16 is below max_batch 64; raise it")
    assert a == b == "serving.max_batched_tokens N is below max_batch N"
    assert prune_reason("no layout of Qwen3-32B on 8 x H100: why") == "no layout of Qwen3-32B on N x H100"


def test_points_that_tie_with_the_spec_share_its_rank():
    """A batch cap far above N* changes nothing: the spec's point tied with it, and ranked 2nd when it came
    second in the axis (ties went by index)."""
    spec = load_spec(EXAMPLES / "support-chat.yaml")
    own = spec.serving.max_batch
    d = search(spec, {"serving.max_batch": [4 * own, own]}).to_dict()
    assert d["as_specified"]["settings"] == {"serving.max_batch": own}
    assert d["as_specified"]["rank_by_agents_per_mw"] == 1


def test_search_plans_on_no_more_processes_than_cores_or_points(capsys):
    """`--workers 1024` on 2 cores started a process per batch and took three times one per core (fuzzing,
    session 45): the pool is held to the cores apmw may use (said in a note) and to the points."""
    import os

    from apmw.cli.search import _workers

    cores = len(os.sched_getaffinity(0))
    axes = {"serving.max_batch": list(range(1, 201))}
    assert _workers(1024, axes) == min(cores, 200)
    assert "--workers 1024: this machine gives apmw" in capsys.readouterr().err or cores >= 1024
    assert _workers(8, {"serving.max_batch": [1, 2]}) == min(2, cores)
    assert _workers(0, axes) == min(cores, 200) and _workers(0, {"serving.max_batch": [1]}) == 1


def test_a_space_file_error_names_the_axis_line(tmp_path):
    """Spec errors named their line, space errors only the file (fuzzing, session 45)."""
    import subprocess

    from tests.e2e.test_cli import APMW

    space = tmp_path / "space.yaml"
    space.write_text("axes:\n  serving.engine: [vllm]\n\n  serving.max_batchh: [64]\n")
    r = subprocess.run([APMW, "search", str(EXAMPLES / "support-chat.yaml"), "--space", str(space)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert f"{space}: line 4: axis 'serving.max_batchh'" in " ".join(r.stderr.split())


def test_a_relative_config_on_an_axis_is_read_beside_the_space_file(tmp_path):
    """A space's `model.config: [config.json]` was read from the current folder: the point was pruned, or silently
    planned another model where a file of that name lay there (fuzz round 5). It is read beside the space file, as
    a spec's is beside the spec."""
    import json
    import shutil
    import subprocess

    from tests.e2e.test_cli import APMW

    folder = tmp_path / "spaces"
    folder.mkdir()
    shutil.copy(ROOT / "src/apmw/catalog/data/models/meta-llama--Meta-Llama-3.1-8B.json", folder / "config.json")
    (folder / "space.yaml").write_text("axes:\n  model.config: [config.json]\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = subprocess.run([APMW, "search", str(EXAMPLES / "support-chat.yaml"), "--space", "../spaces/space.yaml",
                        "--json"], capture_output=True, text=True, timeout=300, cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["feasible"], d["pruned"]) == (1, 0)


def test_a_point_s_row_does_not_depend_on_the_point_planned_before_it():
    """Each point's N* search once started at the previous point's N*. The analytic TTFT p95 is not monotone in
    the agents everywhere (support-chat on 8 x H100, vLLM, batch cap 192: 5.013 s at 209 agents, 4.999 s at 210),
    so the row depended on which point its process planned before: a pool worker killed mid-search gave 210 where
    the same search in one process gave 208 (CI, session 48)."""
    from apmw.design_search.point import evaluate_point
    from apmw.spec.load import load_yaml

    base = load_yaml(EXAMPLES / "support-chat.yaml")
    point = {"hardware.gpus_per_replica": 8, "serving.max_batch": 192, "serving.engine": "vllm",
             "serving.kv_memory_fraction": 0.85}
    alone = evaluate_point(base, 84, point)
    assert alone["agents_per_replica"] == load_spec_plan_n(point)
    for before in ({**point, "serving.max_batch": 128, "serving.engine": "sglang", "serving.kv_memory_fraction": 0.9},
                   {**point, "hardware.gpus_per_replica": 4}, {**point, "serving.max_batch": 512}):
        evaluate_point(base, 83, before)
        assert evaluate_point(base, 84, point) == alone, before


def load_spec_plan_n(settings: dict) -> int:
    """N* of the bundled support-chat with ``settings`` applied, planned on its own (the search from one agent)."""
    from apmw.capacity.plan import plan
    from apmw.design_search.space import with_settings
    from apmw.spec.load import load_yaml

    return plan(spec_from_dict(with_settings(load_yaml(EXAMPLES / "support-chat.yaml"), settings))).at.agents


@pytest.mark.parametrize("engine,prefix", [("vllm", "vllm serve"), ("sglang", "--model-path"), ("trtllm", "trtllm-serve")])
def test_a_config_file_launches_as_its_checkpoint_folder(tmp_path, engine, prefix):
    """Engines load a checkpoint folder (or a hub id), not a config.json: a point whose model.config is the file
    launches its folder, shell-quoted (fuzz round 7 found `vllm serve .../cfgdir/config.json`)."""
    import shutil

    import yaml

    from apmw.capacity import plan
    from apmw.design_search import launch_flags
    from apmw.spec import spec_from_dict
    folder = tmp_path / "my checkpoint"
    folder.mkdir()
    shutil.copy(Path(__file__).resolve().parents[1] / "src" / "apmw" / "catalog" / "data" / "models"
                / "meta-llama--Meta-Llama-3.1-8B.json", folder / "config.json")
    d = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" / "support-chat.yaml").read_text())
    d["model"] = {"config": str(folder / "config.json"), "weight_dtype": "bf16", "kv_dtype": "bf16"}
    d["hardware"]["gpus_per_replica"] = 1
    d["serving"]["engine"] = engine
    line = launch_flags(plan(spec_from_dict(d)))
    assert f"{prefix} '{folder}' " in line, line
    assert "config.json" not in line.split("#")[0]


def test_null_on_an_axis_leaves_the_field_out():
    """`null` on an axis means "leave the field out" (docs/search.md), for any field: the point takes the field's
    default, as the spec without it would (fuzz round 7: `hardware.gpus_per_replica: [null]` and
    `serving.prefix_caching: [null]` were pruned as "Input should be a valid integer/boolean")."""
    from apmw.capacity import plan
    from apmw.design_search.space import check_paths

    d = small_spec_dict()
    d["hardware"]["gpus_per_replica"] = 2
    d["serving"] = {"prefix_caching": False}
    spec = spec_from_dict(d)
    answer = search(spec, {"hardware.gpus_per_replica": [None], "serving.prefix_caching": [None]})
    assert not answer.pruned, answer.pruned
    defaults = json.loads(json.dumps(d))
    del defaults["hardware"]["gpus_per_replica"]
    del defaults["serving"]["prefix_caching"]
    assert answer.points[0].figures["agents_per_replica"] == plan(spec_from_dict(defaults)).agents_per_replica
    # a misspelt field is still refused, whatever the axis holds
    for values in ([None], [None, 4]):
        with pytest.raises(ApmwError, match="max_batchx: unknown field"):
            check_paths(d, {"serving.max_batchx": values})


@pytest.mark.parametrize("axes,said", [
    ({"serving.engine": "vllm"}, "needs a non-empty list of values"),          # was searched as "v", "l", "l", "m"
    ({"serving.max_batch": [64, 64.0]}, "lists 64 more than once"),
    ({"workload.steps_per_task": [1, 2]}, "the workload is what a search compares deployments for"),
    ({"serving.max_batch": [float("nan")]}, "not finite"),
    ({"serving.max_batch": list(range(1, 400)), "serving.max_batched_tokens": list(range(1000, 1300))},
     "at most 100,000 are evaluated"),
])
def test_the_python_api_checks_a_space_as_the_cli_does(axes, said):
    """Fuzz round 8: apmw.design_search.search skipped the checks a --space file gets."""
    with pytest.raises(ApmwError, match=said):
        search(load_spec(EXAMPLES / "coding-agent.yaml"), axes)


def test_a_workload_with_no_second_token_ranks_on_agents_per_mw_alone(tmp_path):
    """Calls of one output token have no time per output token: each point's output speed was the analytic
    model's TPOT inverted, a figure nothing measures, and the front ranked points by it."""
    from apmw.design_search.answer import point_dict
    from apmw.report.search_page import render_search

    d = small_spec_dict()
    d["workload"]["output_tokens_per_call"] = {"mean": 1, "p95": 1}
    axes = {"hardware.gpus_per_replica": [1, 2], "serving.max_batch": [32, 256]}
    answer = search(spec_from_dict(d), axes)
    assert len(answer.points) == 4
    assert all(p.figures["output_speed_tokens_per_s"] is None for p in answer.points)
    most = max(p.figures["agents_per_mw"] for p in answer.points)
    assert [p.figures["agents_per_mw"] for p in answer.front()] == [most]
    best = answer.best()
    assert "output_speed_tokens_per_s" not in best and best["agents_per_mw"] is answer.front()[0]
    page = render_search("one token", answer.to_dict(explain=True), [point_dict(p) for p in answer.points], d, axes)
    assert "no point has a per-agent output speed" in page and page.count("<svg") == 1
    assert "tokens/s per agent" not in page.split("<h2>The front</h2>")[0].split("<h2>The chosen point</h2>")[1]
    (tmp_path / "spec.yaml").write_text(json.dumps(d))
    (tmp_path / "space.yaml").write_text(json.dumps({"axes": axes}))
    r = subprocess.run([APMW, "search", str(tmp_path / "spec.yaml"), "--space", str(tmp_path / "space.yaml")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if "gpus_per_replica=" in line and "│" in line)
    assert [cell.strip() for cell in row.split("│")][4] == "-"
    # its results file resumes: a feasible row without an output speed is one the search wrote
    saved = [APMW, "search", str(tmp_path / "spec.yaml"), "--space", str(tmp_path / "space.yaml"), "--json",
             "--parquet", str(tmp_path / "out.parquet")]
    assert subprocess.run(saved, capture_output=True, text=True, timeout=300).returncode == 0
    r = subprocess.run(saved + ["--resume"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["resumed_points"] == 4
