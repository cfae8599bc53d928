"""One resolved replica behind every verb: the same step time, the same power formula, the same
engine defaults, the same SLO check, whichever model (plan, predict, simulate) asks."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from apmw.capacity import plan
from apmw.capacity.benchmark import predict, replica_for_benchmark
from apmw.capacity.slo import check_slo
from apmw.cli import _register_verbs, app
from apmw.perf import IterationLoad, PowerModel, replica_from_spec
from apmw.perf.serving_policy import default_max_batch, default_token_budget
from apmw.sim import simulate
from apmw.spec import Slo, spec_from_dict
from tests.sim.helpers import BASE

MODEL = "meta-llama/Meta-Llama-3.1-8B"
# the simulator tests' small workload, on one H200 in fp8 with every engine setting at its default
SPEC = {key: value for key, value in copy.deepcopy(BASE).items() if key != "serving"}
SPEC["model"] = {"config": MODEL, "weight_dtype": "fp8", "kv_dtype": "fp8"}
SPEC["hardware"] = {"gpu": "H200", "gpus_per_replica": 1}


def _spec(**serving):
    data = copy.deepcopy(SPEC)
    data["serving"] = serving
    return spec_from_dict(data)


def test_plan_and_predict_use_the_identical_step_time_for_the_same_replica():
    for engine in ("vllm", "sglang", "trtllm"):
        from_spec = replica_from_spec(_spec(engine=engine))
        benchmark = replica_for_benchmark(MODEL, "H200", 1, "fp8", "fp8", 1024, 512, engine)
        assert from_spec.step.source == benchmark.step.source == "calibrated"
        load = IterationLoad(decode_seqs=np.array([1.0, 64.0, 63.0]), prefill_tokens=np.array([0.0, 0.0, 2048.0]),
                             kv_read_bytes=np.array([1e6, 6e8, 6e8]), attention_flops=np.array([1e9, 6e10, 4e12]))
        np.testing.assert_array_equal(from_spec.step.iteration_time_s(load), benchmark.step.iteration_time_s(load))
        assert from_spec.policy == benchmark.policy
        assert from_spec.memory == benchmark.memory


def _count_power_calls(monkeypatch) -> list:
    """Route every replica-power evaluation through a recorder that doubles the answer."""
    calls = []
    one_formula = PowerModel.it_power_w

    def doubled(self, *groups):
        calls.append(groups)
        return 2 * one_formula(self, *groups)

    monkeypatch.setattr(PowerModel, "it_power_w", doubled)
    return calls


def test_every_verb_prices_power_with_the_one_function(monkeypatch):
    """plan --agents N, simulate --agents N and predict each report the power of their own
    operating point from PowerModel.it_power_w, and from nowhere else."""
    spec = _spec()
    replica = replica_from_spec(spec)
    p = plan(spec, agents=8).to_dict()
    s = simulate(spec, 8, duration_s=300, seed=1).to_dict()
    b = predict(MODEL, "H200", 1, "fp8", "fp8", 1024, 256, 8)
    one = replica.power.it_power_w
    from apmw.perf import GpuGroup
    assert p["replica"]["power_w"] == pytest.approx(
        one(GpuGroup(1, p["engine_utilisation"], p["compute_bound_share"])), rel=1e-9)
    assert s["replica_power_w"] == pytest.approx(
        one(GpuGroup(1, s["engine_utilisation"], s["compute_bound_share"])), rel=1e-9)
    assert b.replica_power_w == pytest.approx(one(GpuGroup(1, b.engine_busy_share, b.compute_bound_share)), rel=1e-9)
    # at the same N the closed-loop plan and the simulator sit at nearly the same operating point
    assert s["replica_power_w"] == pytest.approx(p["replica"]["power_w"], rel=0.05)

    calls = _count_power_calls(monkeypatch)
    assert plan(spec, agents=8).to_dict()["replica"]["power_w"] == pytest.approx(2 * p["replica"]["power_w"])
    assert simulate(spec, 8, duration_s=300, seed=1).to_dict()["replica_power_w"] == pytest.approx(
        2 * s["replica_power_w"])
    assert predict(MODEL, "H200", 1, "fp8", "fp8", 1024, 256, 8).replica_power_w == pytest.approx(
        2 * b.replica_power_w)
    assert len(calls) >= 3


@pytest.mark.parametrize("gpu,engine", [("H200", "vllm"), ("A100", "vllm"), ("L40S", "vllm"), ("H100", "sglang"),
                                        ("H100", "trtllm")])
def test_every_verb_reports_the_engine_defaults_from_the_one_place(gpu, engine):
    from apmw.perf import resolve_gpu

    g = resolve_gpu(gpu)
    want_batch = default_max_batch(engine, g.name, g.hbm_bytes)
    want_budget = default_token_budget(engine, g.name, g.hbm_bytes)
    data = copy.deepcopy(SPEC)
    data["hardware"]["gpu"] = gpu
    data["model"] = {"config": MODEL, "weight_dtype": "bf16", "kv_dtype": "bf16"}
    data["serving"] = {"engine": engine}
    spec = spec_from_dict(data)
    reported = [plan(spec, agents=2).to_dict()["serving_policy"],
                simulate(spec, 2, duration_s=60, seed=0).to_dict()["serving_policy"],
                predict(MODEL, gpu, 1, "bf16", "bf16", 512, 64, 2, engine=engine).serving_policy]
    for policy in reported:
        assert (policy["engine"], policy["max_batch"], policy["token_budget"]) == (engine, want_batch, want_budget)
        assert policy == reported[0]


def test_vllm_defaults_follow_its_documented_rule():
    """vLLM's API server: 1024 sequences and 8192 tokens on >=70 GiB GPUs other than A100, else 256 and 2048
    (vllm/engine/arg_utils.py EngineArgs._set_default_args)."""
    assert (default_max_batch("vllm", "H100-SXM5-80GB", 80e9), default_token_budget("vllm", "H100-SXM5-80GB", 80e9)) \
        == (1024, 8192)
    assert (default_max_batch("vllm", "A100-SXM4-80GB", 80e9), default_token_budget("vllm", "A100-SXM4-80GB", 80e9)) \
        == (256, 2048)
    assert (default_max_batch("vllm", "L40S", 48e9), default_token_budget("vllm", "L40S", 48e9)) == (256, 2048)
    assert default_max_batch("trtllm", "H200", 141e9) == default_max_batch("sglang", "H200", 141e9) == 2048


def test_vllm_never_batches_more_sequences_than_its_token_budget():
    """vLLM lowers its default max_num_seqs to max_num_batched_tokens (EngineArgs._set_default_args) and refuses to
    start where both are given the other way round (SchedulerConfig._verify_args); other engines do neither."""
    from apmw.errors import ApmwError
    from apmw.perf.serving_policy import resolve_policy
    from apmw.spec import Serving

    h100 = ("H100-SXM5-80GB", 80e9)
    assert resolve_policy(Serving(engine="vllm", max_batched_tokens=512), *h100).max_batch == 512
    assert resolve_policy(Serving(engine="vllm", max_batched_tokens=512, max_batch=512), *h100).max_batch == 512
    assert resolve_policy(Serving(engine="sglang", max_batched_tokens=512, max_batch=1024), *h100).max_batch == 1024
    with pytest.raises(ApmwError, match=r"^max_batched_tokens 512 is below max_batch 1,024: vllm refuses to start"):
        resolve_policy(Serving(engine="vllm", max_batched_tokens=512, max_batch=1024), *h100)
    _register_verbs()   # every verb, as the `apmw` entry point does
    r = CliRunner().invoke(app, ["predict", "--model", MODEL, "--gpu", "H100", "--isl", "512", "--osl", "64",
                                 "--concurrency", "2", "--token-budget", "64", "--max-batch", "128"])
    assert r.exit_code == 1 and "--token-budget 64 is below --max-batch 128" in " ".join(r.output.split())


def test_sglang_chunked_prefill_follows_the_gpus_memory():
    """SGLang's chunked_prefill_size by the GPU's memory (ServerArgs._handle_gpu_memory_settings): 2048 below 35 GiB,
    4096 below 60 GiB, 8192 below 160 GiB, 16384 from there; TensorRT-LLM's 8192 on any GPU."""
    from apmw.perf import resolve_gpu

    gib = 2**30
    assert [default_token_budget("sglang", "x", m * gib) for m in (24, 34.9, 48, 59.9, 80, 141, 159.9, 160, 288)] \
        == [2048, 2048, 4096, 4096, 8192, 8192, 8192, 16384, 16384]
    for name, budget in (("H100", 8192), ("H200", 8192), ("L40S", 4096), ("B200", 16384), ("GB300", 16384),
                         ("MI355X", 16384)):
        g = resolve_gpu(name)
        assert default_token_budget("sglang", g.name, g.hbm_bytes) == budget, name
        assert default_token_budget("trtllm", g.name, g.hbm_bytes) == 8192


def test_the_cli_verbs_report_the_same_policy_in_json(tmp_path):
    _register_verbs()
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(SPEC))
    runner = CliRunner()
    p = json.loads(runner.invoke(app, ["plan", str(spec_path), "--agents", "4", "--json"]).stdout)
    s = json.loads(runner.invoke(app, ["simulate", str(spec_path), "--agents", "4", "--duration-s", "60",
                                       "--json"]).stdout)
    b = json.loads(runner.invoke(app, ["predict", "--model", MODEL, "--gpu", "H200", "--weight-dtype", "fp8",
                                       "--kv-dtype", "fp8", "--isl", "512", "--osl", "64", "--concurrency", "4",
                                       "--json"]).stdout)
    assert p["serving_policy"] == s["serving_policy"] == b["serving_policy"]
    assert p["serving_policy"]["max_batch"] == 1024


def test_one_slo_check_treats_every_slo_the_spec_sets():
    slo = Slo(task_latency_p95_s=100, ttft_p95_s=1.0, tpot_p95_s=0.05)
    assert check_slo(slo, 90, 0.5, 0.04).meets
    assert check_slo(slo, 110, 0.5, 0.04).failed == ("task_latency_p95",)
    assert check_slo(slo, 90, 2.0, 0.06).failed == ("ttft_p95", "tpot_p95")
    # a figure that was not measured cannot show its SLO holds (the simulator used to let TPOT pass)
    missing = check_slo(slo, 90, 0.5, None)
    assert not missing.meets and missing.unmeasured == ("tpot_p95",)
    # an SLO the spec does not set is not checked
    assert check_slo(Slo(task_latency_p95_s=100), 90, None, None).meets
    assert not check_slo(Slo(task_latency_p95_s=100), None, None, None).meets


def test_slo_table_and_warnings():
    from apmw.capacity.slo import INTERACTIVE_TTFT_P95_S, slo_table, warnings_for

    slo = Slo(task_latency_p95_s=600, ttft_p95_s=2.0)
    table = slo_table(slo, 500.0, 3.0, 0.05)
    assert table == {"task_latency_p95": {"limit_s": 600, "value_s": 500.0, "met": True},
                     "ttft_p95": {"limit_s": 2.0, "value_s": 3.0, "met": False}}
    # the spec bounds TTFT itself: no warning for it; none sets TPOT, which is within the published level
    assert warnings_for(slo, 30.0, 0.05, (100.0, 1.0, 0.05)) == []
    free = Slo(task_latency_p95_s=600)
    notes = warnings_for(free, INTERACTIVE_TTFT_P95_S + 1, 0.5, (533.0, 1.0, 0.5))
    assert len(notes) == 3 and "hypersensitive" in notes[2] and "533 s" in notes[2]
    # a per-call SLO close to what one agent alone gets is as fragile as a task SLO there
    notes = warnings_for(slo, 1.9, 0.05, (100.0, 1.7, 0.05))
    assert len(notes) == 1 and "1.7 s at TTFT p95 of the 2.0 s SLO (85%)" in notes[0]
    speed = Slo(task_latency_p95_s=600, output_speed_tokens_per_s=60)      # 16.7 ms per output token
    assert "at output speed of the 16.7 ms SLO" in warnings_for(speed, 1.0, 0.016, (100.0, 1.0, 0.015))[0]
    assert warnings_for(speed, 1.0, 0.016, (100.0, 1.0, 0.012)) == []


def test_plan_names_the_binding_slo_and_the_single_agent_floor():
    data = copy.deepcopy(SPEC)
    data["slo"] = {"task_latency_p95_s": 3000, "ttft_p95_s": 0.08}
    p = plan(spec_from_dict(data)).to_dict()
    assert p["binding_constraint"] == "slo" and p["binding_slo"] == ["ttft_p95"]
    assert p["slo_verdict"]["ttft_p95"]["met"] and p["slo_verdict"]["ttft_p95"]["value_s"] <= 0.08
    one = plan(spec_from_dict(data), agents=1).to_dict()
    assert p["single_agent_task_latency_p95_s"] == pytest.approx(one["task_latency_s"]["p95"])
    assert not any("hypersensitive" in w for w in p["warnings"])
    # a TTFT SLO 10 % above what one agent alone gets: the plan says N* hangs on it
    data["slo"]["ttft_p95_s"] = 1.1 * one["ttft_p95_s"]
    warned = [w for w in plan(spec_from_dict(data)).to_dict()["warnings"] if "hypersensitive" in w]
    assert len(warned) == 1 and "at TTFT p95 of the" in warned[0] and "(91%)" in warned[0]


def test_an_output_speed_slo_is_checked_on_the_time_per_output_token():
    """20 tokens/s per agent holds while the p95 time per output token is at most 50 ms."""
    slo = Slo(task_latency_p95_s=600, output_speed_tokens_per_s=20)
    assert check_slo(slo, 100, None, 0.049).meets
    assert check_slo(slo, 100, None, 0.051).failed == ("output_speed",)
    data = copy.deepcopy(SPEC)
    data["slo"] = {"task_latency_p95_s": 3000, "output_speed_tokens_per_s": 150}
    p = plan(spec_from_dict(data)).to_dict()
    assert p["binding_slo"] == ["output_speed"]
    assert 1 / p["tpot_p95_s"] >= 150
    assert 1 / plan(spec_from_dict(data), agents=p["agents_per_replica"] + 1).to_dict()["tpot_p95_s"] < 150
