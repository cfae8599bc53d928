"""The installed `apmw` command, run as a user runs it: exit codes, JSON, errors without tracebacks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, ROOT

APMW = shutil.which("apmw") or str(Path(sys.executable).parent / "apmw")

PLAN_FIELDS = {
    "agents_per_replica", "binding_constraint", "task_latency_s", "residence_breakdown_s", "decode_batch_mean",
    "kv_tokens_resident_mean", "kv_tokens_capacity", "kv_bytes_per_token", "tokens_per_s", "replica",
    "agents_per_mw", "agents_per_mw_provisioned", "energy_per_session_j", "cost_per_session_usd", "fleet",
}


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([APMW, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_plan_json_on_every_example(example):
    r = run("plan", str(EXAMPLES / example), "--json", "--analytic")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert PLAN_FIELDS <= d.keys()
    assert d["binding_constraint"] in {"slo", "kv_memory", "batch_limit"}
    assert set(d["task_latency_s"]) == {"mean", "p50", "p95", "p99"}
    assert {"queue", "prefill", "decode", "tool"} <= d["residence_breakdown_s"].keys()
    assert {"input", "output"} <= d["tokens_per_s"].keys()
    assert {"gpus", "power_w", "provisioned_power_w"} <= d["replica"].keys()
    assert {"agents", "replicas", "gpus", "facility_power_w"} <= d["fleet"].keys()
    assert d["task_latency_s"]["p95"] <= d["slo"]["task_latency_p95_s"]
    assert d["agents_per_replica"] >= 1
    scales = {q["slo_scale"]: q for q in d["slo_sensitivity"]}
    assert set(scales) == {0.9, 1.0, 1.1} and scales[1.0]["agents_per_replica"] == d["agents_per_replica"]
    assert scales[0.9]["agents_per_replica"] <= d["agents_per_replica"] <= scales[1.1]["agents_per_replica"]


def test_plan_table_for_people():
    r = run("plan", str(EXAMPLES / "coding-agent.yaml"), "--analytic")
    assert r.returncode == 0, r.stderr
    assert "agents per MW" in r.stdout and "binding" in r.stdout
    assert "N* as the SLO moves" in r.stdout and "0.9x: 26, 1.0x: 26, 1.1x: 26" in r.stdout


def test_plan_at_fixed_agents():
    d = json.loads(run("plan", str(EXAMPLES / "coding-agent.yaml"), "--json", "--agents", "5").stdout)
    assert d["agents_per_replica"] == 5 and d["meets_slo"]


def test_model_json():
    r = run("model", "meta-llama/Meta-Llama-3.1-70B", "--json")
    d = json.loads(r.stdout)
    assert d["kv_bytes_per_token"]["bf16"] == 327_680
    assert {"params", "active_params", "weight_bytes"} <= d.keys()


def _no_traceback(r: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in r.stderr + r.stdout


def _spec_with(tmp_path: Path, old: str, new: str) -> Path:
    p = tmp_path / "spec.yaml"
    text = (EXAMPLES / "coding-agent.yaml").read_text()
    assert old in text
    p.write_text(text.replace(old, new))
    return p


def test_unknown_gpu_suggests_names(tmp_path):
    r = run("plan", str(_spec_with(tmp_path, "gpu: H200", "gpu: H20O")))
    _no_traceback(r)
    assert r.returncode == 1 and "hardware.gpu: unknown GPU 'H20O'" in r.stderr and "H200" in r.stderr


def test_unknown_model_suggests_names(tmp_path):
    r = run("plan", str(_spec_with(tmp_path, "config: deepseek-ai/DeepSeek-V3", "config: deepseek-ai/DeepSeek-V9")))
    _no_traceback(r)
    assert r.returncode == 1 and "model.config: unknown model 'deepseek-ai/DeepSeek-V9'" in r.stderr
    assert "DeepSeek-V3" in r.stderr


def test_yaml_syntax_error_line_and_column(tmp_path):
    r = run("plan", str(_spec_with(tmp_path, "max_batch: 256", "max_batch: [256")))
    _no_traceback(r)
    assert r.returncode == 1 and "YAML syntax error" in r.stderr and "line" in r.stderr


def test_missing_file():
    r = run("plan", "no-such-spec.yaml")
    _no_traceback(r)
    assert r.returncode == 1 and "file not found" in r.stderr


def test_a_directory_given_as_the_spec_is_named_as_one_with_the_specs_in_it():
    r = run("plan", "examples")
    _no_traceback(r)
    text = " ".join(r.stderr.split())
    assert r.returncode == 1 and "is a directory, not a file" in text and "examples/coding-agent.yaml" in text


def test_infeasible_slo_exits_2_with_best_p95(tmp_path):
    r = run("plan", str(_spec_with(tmp_path, "task_latency_p95_s: 1800", "task_latency_p95_s: 60")))
    _no_traceback(r)
    assert r.returncode == 2
    assert "even one agent alone has p95 task latency" in r.stderr and "dominates" in r.stderr


def test_model_that_does_not_fit(tmp_path):
    r = run("plan", str(_spec_with(tmp_path, "gpus_per_replica: 8", "gpus_per_replica: 2")))
    _no_traceback(r)
    assert r.returncode == 1 and "does not fit" in r.stderr and "at least" in r.stderr


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"


def test_plan_workload_from_trace_replaces_the_workload():
    base = json.loads(run("plan", str(EXAMPLES / "coding-agent.yaml"), "--json", "--analytic").stdout)
    r = run("plan", str(EXAMPLES / "coding-agent.yaml"), "--json", "--analytic", "--workload-from",
            str(FIXTURES / "mini_swe_calls_3sessions.csv"))
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    # the 3 fixture sessions have 252 calls: 84 per session, against the example's 80.3 mean
    assert d["calls_per_session"] == pytest.approx(84, rel=0.15)
    assert d["calls_per_session"] != base["calls_per_session"]
    assert d["workload_from"].endswith("mini_swe_calls_3sessions.csv")


def test_plan_workload_from_unreadable_trace(tmp_path):
    bad = tmp_path / "empty.jsonl"
    bad.write_text("")
    r = run("plan", str(EXAMPLES / "coding-agent.yaml"), "--workload-from", str(bad))
    _no_traceback(r)
    assert r.returncode == 1 and "format" in r.stderr


@pytest.mark.slow
def test_plan_verify_puts_simulation_beside_the_plan():
    r = run("plan", str(EXAMPLES / "deep-research.yaml"), "--json", "--analytic", "--verify")
    v = json.loads(r.stdout)["verify"]
    assert r.returncode == (0 if v["simulated_meets_slo"] else 3), r.stderr
    assert v["completed_tasks"] > 100
    assert v["simulated_over_analytic"]["mean"] == pytest.approx(1.0, abs=0.1)


def test_plan_reads_a_served_checkpoint_id_and_notes_a_dtype_slip(tmp_path):
    """The hub id a user serves reads its base config; an -NVFP4 id priced at fp8 gets a note on
    stderr, and stdout stays one JSON document."""
    r = run("plan", str(_spec_with(tmp_path, "config: deepseek-ai/DeepSeek-V3",
                                   "config: nvidia/DeepSeek-V3-NVFP4")), "--json", "--analytic")
    _no_traceback(r)
    assert r.returncode == 0 and json.loads(r.stdout)["agents_per_replica"] >= 1
    assert "names fp4 weights, but fp8 weights are priced" in " ".join(r.stderr.split())


@pytest.mark.slow
def test_plan_verify_exits_3_when_the_simulator_misses_the_slo():
    """The flagship example's analytic N* (--analytic) sits at its KV limit, where the simulator preempts
    and misses the SLO: --verify says so with a documented exit code, and stdout stays one JSON document."""
    r = run("plan", str(EXAMPLES / "coding-agent.yaml"), "--json", "--analytic", "--verify")
    _no_traceback(r)
    assert r.returncode == 3, r.stderr
    d = json.loads(r.stdout)
    v, n = d["verify"], d["agents_per_replica"]
    assert v["simulated_meets_slo"] is False
    # which SLO, its simulated figure and its limit, in the JSON and on stderr
    missed = [name for name, x in v["simulated_slo_verdict"].items() if not x["met"]]
    assert missed == ["task_latency_p95"]
    x = v["simulated_slo_verdict"]["task_latency_p95"]
    assert x["limit_s"] == 1800 and x["value_s"] == v["task_latency_s"]["simulated"]["p95"] > 1800
    assert f"misses the SLO at {n} agents (task_latency_p95 {x['value_s']:,.0f} s > 1,800 s; exit 3)" in r.stderr
    # one run of a few hundred tasks where the pool ran short: its p95 may read low (or high), and it says so
    assert v["preemptions"] > 0 and len(v["warnings"]) == 1 and f"ran short at {n} agents" in v["warnings"][0]


def test_plan_table_names_the_missed_slo_and_the_invalid_operating_point():
    r = run("plan", str(EXAMPLES / "support-chat.yaml"), "--agents", "40")
    _no_traceback(r)
    text = " ".join(r.stdout.split())
    assert r.returncode == 0
    assert "binding: slo (TTFT p95)" in text
    assert "TTFT p95" in text and "MISSED" in text
    n_star = json.loads(run("plan", str(EXAMPLES / "support-chat.yaml"), "--analytic", "--json").stdout)[
        "agents_per_replica"]
    assert n_star < 40
    assert f"not a valid operating point: at 40 agents the replica misses the SLO; N* is {n_star}" in text
    ok = " ".join(run("plan", str(EXAMPLES / "support-chat.yaml"), "--analytic").stdout.split())
    assert "MISSED" not in ok and "not a valid operating point" not in ok and "fits" in ok


def test_a_trace_with_huge_prompts_is_flagged_when_the_spec_sets_no_per_call_slo():
    trace = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "azure_code_head100.csv"
    r = run("plan", str(EXAMPLES / "coding-agent.yaml"), "--analytic", "--workload-from", str(trace))
    _no_traceback(r)
    text = " ".join(r.stdout.split())
    assert r.returncode == 0
    assert "workload fitted from" in text and "azure_code_head100.csv" in text
    assert "warning: TTFT p95 is" in text and "MLPerf's Server scenario" in text
    assert "warning: time per output token p95" in text


def test_workload_from_keeps_what_the_fit_noted():
    trace = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "azure_code_head100.csv"
    r = run("plan", str(EXAMPLES / "coding-agent.yaml"), "--analytic", "--workload-from", str(trace), "--json")
    _no_traceback(r)
    d = json.loads(r.stdout)
    assert any("the trace has no sessions" in n for n in d["workload_fit_notes"])
    assert "note: " in r.stderr and "the trace has no sessions" in " ".join(r.stderr.split())


def test_plan_prints_energy_in_the_unit_its_size_reads_best_in():
    from apmw.capacity.economics import energy_text

    assert [energy_text(j) for j in (1422.0, 112_727.6, 4.5e6, 7.2e9)] == ["395 mWh", "31.3 Wh", "1.25 kWh", "2.00 MWh"]
    r = run("plan", str(ROOT / "bench" / "data" / "aiconfigurator-default.yaml"), "--analytic")
    assert r.returncode == 0, r.stderr
    assert "mWh IT energy" in r.stdout and "0.000 kWh" not in r.stdout


@pytest.mark.parametrize("gpus", [4, 8])
def test_plan_notes_an_moe_exchange_priced_past_the_measured_ep_sizes(tmp_path, gpus):
    """DeepEP was measured among the 4 GPUs of one GB200 tray: SGLang's EP 8 is an estimate floored by it, and
    `apmw plan` says so on stderr (EP 4 is measured: no note); the JSON's step-time source names the tables."""
    import yaml
    d = yaml.safe_load((EXAMPLES / "support-chat.yaml").read_text())
    d["model"] = {"config": "nvidia/DeepSeek-R1-0528-FP4-v2", "weight_dtype": "fp4", "kv_dtype": "fp8"}
    d["hardware"] = {"gpu": "GB200", "gpus_per_replica": gpus}
    d["serving"] = {**d["serving"], "engine": "sglang", "parallelism": {"dp_attention": gpus, "ep": gpus}}
    spec = tmp_path / "dep.yaml"
    spec.write_text(yaml.safe_dump(d))
    r = run("plan", str(spec), "--json", "--analytic")
    assert r.returncode == 0, r.stderr
    source = json.loads(r.stdout)["sources"]["step_time"]
    said = " ".join(r.stderr.split())
    if gpus == 4:
        assert "past the EP sizes measured" not in said
        assert "MoE dispatch/combine at EP 4: measured" in source
    else:
        assert "note: the MoE dispatch/combine at EP 8 on GB200 (per GPU) is past the EP sizes measured there (up to 4)" in said
        assert "no faster than the measured EP 4 (an estimate, not a measurement)" in source


def test_a_4_bit_kv_cache_is_refused_on_a_gpu_without_fp4_tensor_cores():
    """NVFP4 KV is a Blackwell feature: H200 refuses it with the reason and the fix, in the verb's own terms;
    B200 prices it."""
    args = ["predict", "--model", "meta-llama/Meta-Llama-3.1-8B", "--tp", "1", "--weight-dtype", "fp8",
            "--kv-dtype", "fp4", "--isl", "1024", "--osl", "256", "--concurrency", "4", "--json"]
    r = run(*args, "--gpu", "H200")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    said = " ".join(r.stderr.split())
    assert "--kv-dtype fp4 needs a GPU with FP4 tensor cores" in said and "Use --kv-dtype fp8" in said
    r = run(*args, "--gpu", "B200")
    assert r.returncode == 0, r.stderr
    r = run(*args, "--gpu", "MI355X", "--engine", "sglang")      # FP4 rates, but the FP4 KV kernels are NVIDIA's
    said = " ".join(r.stderr.split())
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "NVIDIA Blackwell kernels" in said and "MI355X" in said and "Use --kv-dtype fp8" in said


def test_deepseek_v4s_fp4_experts_beside_fp8_layers_are_named_when_priced_otherwise():
    """V4-Flash's checkpoint keeps its layers in fp8 and its routed experts in fp4: pricing both at one dtype
    draws a note naming both flags; pricing them as stored draws none."""
    args = ["predict", "--model", "deepseek-ai/DeepSeek-V4-Flash", "--gpu", "B200", "--tp", "4", "--isl", "1024",
            "--osl", "256", "--concurrency", "8", "--json"]
    for dtypes in (["--weight-dtype", "fp8"], ["--weight-dtype", "fp4"]):
        r = run(*args, *dtypes)
        assert r.returncode == 0, r.stderr
        assert "give --weight-dtype fp8 --moe-dtype fp4" in " ".join(r.stderr.split())
    r = run(*args, "--weight-dtype", "fp8", "--moe-dtype", "fp4")
    assert r.returncode == 0 and "note:" not in r.stderr, r.stderr


def test_predict_refuses_what_it_would_otherwise_ignore_or_misprice():
    """TensorRT-LLM on an AMD GPU, and per-side worker flags without --disagg, are refused with the fix (a custom
    GPU's vendor is the user's to know)."""
    from apmw.perf.replica import engine_refusal, resolve_gpu
    from apmw.spec.model import GpuOverride
    base = ["predict", "--model", "meta-llama/Meta-Llama-3.1-8B", "--weight-dtype", "fp8", "--isl", "128",
            "--osl", "128", "--concurrency", "1"]
    r = run(*base, "--gpu", "MI355X", "--engine", "trtllm")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "engine trtllm (TensorRT-LLM) runs on NVIDIA GPUs only" in " ".join(r.stderr.split())
    custom = GpuOverride(hbm_bytes=80e9, hbm_bandwidth_bytes_per_s=3e12, bf16_flops=1e15, tdp_w=700,
                         idle_power_w=100, busy_power_w=600, scaleup_bw_bytes_per_s=450e9)
    assert engine_refusal(resolve_gpu(custom), "trtllm") is None and resolve_gpu(custom).vendor == "custom"
    r = run(*base, "--gpu", "H200", "--prefill-tp", "2", "--decode-workers", "2")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "--prefill-tp, --decode-workers describe disaggregated workers: add --disagg" in " ".join(r.stderr.split())


def test_search_notes_a_gpu_the_space_holds_whose_step_times_are_least_checked(tmp_path):
    """A space that puts the replica on an MI355X carries the caveat plan and predict print for it."""
    space = tmp_path / "space.yaml"
    space.write_text("axes:\n  hardware.gpu: [H100, MI355X]\n")
    r = run("search", str(EXAMPLES / "support-chat.yaml"), "--space", str(space), "--json")
    assert r.returncode == 0, r.stderr
    assert "note: MI355X: step times come from the plain roofline" in " ".join(r.stderr.split())
    assert json.loads(r.stdout)["evaluated"] == 2
    # a custom GPU among the axis values is a spec's GPU entry, not a name: no note, no crash
    space.write_text("axes:\n  hardware.gpu: [H100, {name: H100, hbm_bytes: 100.0e9}]\n")
    r = run("search", str(EXAMPLES / "support-chat.yaml"), "--space", str(space), "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


def test_a_rate_sweep_answers_the_rates_within_capacity_and_says_why_not_the_others():
    base = ["predict", "--model", "meta-llama/Meta-Llama-3.1-8B", "--gpu", "H100", "--weight-dtype", "fp8",
            "--isl", "1024", "--osl", "256"]
    r = run(*base, "--request-rate", "1,1000", "--json")
    assert r.returncode == 0, r.stderr
    low, high = json.loads(r.stdout)
    assert low["request_rate_per_s"] == 1 and low["ttft_s"] > 0 and "error" not in low
    assert high == {"request_rate_per_s": 1000, "error": high["error"]}
    assert "exceeds the replica's capacity" in high["error"]
    r = run(*base, "--request-rate", "1000")
    assert r.returncode != 0 and "exceeds the replica's capacity" in r.stderr and "Traceback" not in r.stderr


def test_fleet_refuses_a_replicas_scale_past_a_billion_tasks_an_hour():
    r = run("fleet", str(EXAMPLES / "coding-agent.yaml"), "--replicas-scale", "1e9")
    assert r.returncode == 1
    assert "--replicas-scale 1e+09 makes the busiest hour" in r.stderr and "use a scale of at most" in r.stderr
    assert "Traceback" not in r.stderr


def test_contrast_says_its_agents_are_the_analytic_models():
    # support-chat's analytic N* (20) is twice its checked one (10, README): contrast must not pass it off as plan's
    args = [str(EXAMPLES / "coding-agent.yaml"), str(EXAMPLES / "support-chat.yaml")]
    d = json.loads(run("contrast", *args, "--json").stdout)
    assert {w["agents_per_replica_source"] for w in d["workloads"]} == {"analytic"}
    text = run("contrast", *args).stdout
    assert "analytic N*" in " ".join(text.split())


def test_contrast_prints_every_figure_whole_at_80_columns():
    """Piped, at the default 80 columns, the table cut its figures to '1,232…' and '134,1…' (fuzzing, session 44)."""
    args = [str(EXAMPLES / name) for name in ("support-chat.yaml", "coding-agent.yaml", "deep-research.yaml")]
    d = json.loads(run("contrast", *args, "--json").stdout)
    r = subprocess.run([APMW, "contrast", *args], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "COLUMNS": "80"})
    assert r.returncode == 0 and "…" not in r.stdout
    for w, ratio in zip(d["workloads"], d["ratios_to_first"]):
        for figure in (f"{w['agents_per_mw']:,.0f}", f"{w['output_tokens_per_s_per_mw']:,.0f}",
                       f"({ratio['output_tokens_per_s_per_mw']:.2f}x)", f"{w['kv_tokens_per_agent']:,.0f}",
                       w["binding_constraint"]):
            assert figure in r.stdout, figure


def test_contrast_refuses_one_spec_given_twice():
    # it dropped the second silently and printed a one-row contrast (fuzzing, session 40)
    spec = EXAMPLES / "support-chat.yaml"
    r = run("contrast", str(spec), str(spec.parent / "." / spec.name))
    assert r.returncode == 1 and f"{spec} is given twice" in " ".join(r.stderr.split())


def test_contrast_tells_apart_two_specs_of_one_file_name(tmp_path):
    """a/coding-agent.yaml and b/coding-agent.yaml were both labelled 'coding-agent' (fuzz round 5)."""
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        shutil.copy(EXAMPLES / "coding-agent.yaml", tmp_path / folder / "coding-agent.yaml")
    r = subprocess.run([APMW, "contrast", "a/coding-agent.yaml", "b/coding-agent.yaml"], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "a/coding-agent.yaml" in r.stdout and "b/coding-agent.yaml" in r.stdout


def test_contrast_names_the_spec_no_agent_count_serves(tmp_path):
    text = (EXAMPLES / "support-chat.yaml").read_text()
    strict = tmp_path / "strict-chat.yaml"
    strict.write_text(text.replace("ttft_p95_s:", "ttft_p95_s: 0.001  # was", 1))
    r = run("contrast", str(EXAMPLES / "deep-research.yaml"), str(strict))
    assert r.returncode == 2, r.stderr
    assert r.stderr.lstrip().startswith(f"error: {strict}: no number of agents meets the SLO")


@pytest.mark.parametrize("flag,value,words", [
    ("--slo-p95-s", "-5", "--slo-p95-s -5.0: give the task-latency p95 SLO as a positive number of seconds"),
    ("--slo-p95-s", "nan", "--slo-p95-s nan: give the task-latency p95 SLO as a positive number of seconds"),
    ("--compare-plan", "no-such-spec.yaml", "no-such-spec.yaml"),
])
def test_bench_checks_its_slo_and_comparison_before_any_load(tmp_path, flag, value, words):
    # port 9 (discard) has no server: an error about the flag, not about the connection, shows it was checked first
    r = run("bench", str(EXAMPLES / "support-chat.yaml"), "--endpoint", "http://127.0.0.1:9", "--model", "m",
            "--out", str(tmp_path / "r.jsonl"), "--no-live", flag, value)
    _no_traceback(r)
    assert r.returncode == 1 and words in r.stderr, r.stderr
    assert not (tmp_path / "r.jsonl").exists()


def test_check_tasks_with_analytic_is_said_to_do_nothing():
    r = run("plan", str(EXAMPLES / "support-chat.yaml"), "--analytic", "--check-tasks", "50", "--json")
    _no_traceback(r)
    assert r.returncode == 0 and "--check-tasks has no effect with --analytic" in " ".join(r.stderr.split())
    quiet = run("plan", str(EXAMPLES / "support-chat.yaml"), "--analytic", "--json")
    assert "--check-tasks" not in quiet.stderr


def test_a_checked_n_star_whose_interval_reaches_past_the_counts_says_how_to_narrow_it():
    # support-chat's TTFT p95 barely rises with the agents: 150 tasks a count leave the interval open at both ends
    r = run("plan", str(EXAMPLES / "support-chat.yaml"), "--check-tasks", "150", "--json")
    _no_traceback(r)
    assert r.returncode == 0 and json.loads(r.stdout)["agents_per_replica_interval"] == [None, None]
    said = " ".join(r.stderr.split())
    assert "reaches past the agent counts simulated" in said and "a larger --check-tasks (now 150)" in said
    # coding-agent's interval closes at its KV limit (26-26, README): nothing to say
    closed = run("plan", str(EXAMPLES / "coding-agent.yaml"), "--json")
    assert None not in json.loads(closed.stdout)["agents_per_replica_interval"]
    assert "--check-tasks" not in closed.stderr


def test_a_generic_trace_given_to_plan_says_to_fit_it_with_apmw_fit(tmp_path):
    trace = tmp_path / "calls.csv"
    trace.write_text("conv,in,out\na,1000,100\na,1300,120\n")
    r = run("plan", str(EXAMPLES / "support-chat.yaml"), "--analytic", "--workload-from", str(trace),
            "--trace-format", "csv")
    _no_traceback(r)
    assert r.returncode == 1
    said = " ".join(r.stderr.split())
    assert "apmw plan --workload-from and apmw simulate --trace do not" in said
    assert "apmw fit TRACE --format csv|jsonl --map ... -o workload.yaml" in said


def test_a_switch_given_both_ways_is_refused():
    """`--mixed-prefill --prefill-first` was settled by the last flag without a word."""
    args = ["predict", "--model", "meta-llama/Meta-Llama-3.1-8B", "--gpu", "H200", "--tp", "1", "--isl", "100",
            "--osl", "10", "--concurrency", "1"]
    r = run(*args, "--mixed-prefill", "--prefill-first")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "--mixed-prefill and --prefill-first are the two sides of one switch" in " ".join(r.stderr.split())
    r = run(*args, "--no-overlap-scheduling", "--overlap-scheduling")
    assert r.returncode == 1 and "--overlap-scheduling and --no-overlap-scheduling" in " ".join(r.stderr.split())
    assert run(*args, "--prefill-first").returncode == 0


def test_an_option_given_twice_is_refused():
    """`predict --gpu H100 ... --gpu B200` ran on B200 and `plan --agents 3 --agents 5` at 5, the last value
    silently (fuzzing, session 45), while a switch given both ways was refused. An option's value that looks
    like an option (`--model --gpu`) is its value, not a second use."""
    args = ["predict", "--model", "meta-llama/Meta-Llama-3.1-8B", "--gpu", "H200", "--tp", "1", "--isl", "100",
            "--osl", "10", "--concurrency", "1"]
    r = run(*args, "--gpu", "B200")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "--gpu is given more than once" in " ".join(r.stderr.split())
    r = run("plan", str(EXAMPLES / "support-chat.yaml"), "--analytic", "--agents", "3", "--agents=5")
    assert r.returncode == 1 and "--agents is given more than once" in " ".join(r.stderr.split())
    from apmw.cli import _given_twice, _register_verbs, _verb_command
    _register_verbs()
    plan = _verb_command(["plan"])
    assert _given_twice(["plan", "spec.yaml", "--workload-from", "--agents", "--agents", "3"], plan) is None
    assert _given_twice(["plan", "spec.yaml", "--json", "--json"], plan) == "--json"


def test_a_held_ctrl_c_is_raised_where_stopping_is_safe_and_never_lost():
    """A Ctrl-C that landed in a finalizer during `apmw search` was printed as 'Exception ignored' and lost: the
    search ran on and exited 0 (CI under load, session 44). Held, it surfaces at the next check, even from a
    finalizer, and at the end of the block at the latest; a second one is not held."""
    import gc
    import os
    import signal

    from apmw.cli.common import SafeInterrupt

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)      # the signal lands while a finalizer runs

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with SafeInterrupt() as held:
            Finalized()
            gc.collect()
            assert held.pending                       # held, not raised inside __del__ (where it would be lost)
            held.check()
    assert signal.getsignal(signal.SIGINT) is before
    with pytest.raises(KeyboardInterrupt):
        with SafeInterrupt():
            os.kill(os.getpid(), signal.SIGINT)       # not checked: raised at the end of the block
    with pytest.raises(KeyboardInterrupt):
        with SafeInterrupt():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)       # the second is the default handler's: at once
            import time
            time.sleep(1)


def test_a_terminal_too_narrow_for_a_table_gets_its_rows_as_records_never_cut_figures(monkeypatch):
    """On an 80-column terminal `apmw fleet`'s placements table cut '$287,262' to '$287…' and folded pool names
    a few letters a line, and `apmw levers` cut 'summarise_history' to 'summaris…' (session 45): a table that
    cannot fit without cutting a word is printed one row after another, every figure whole; one that fits
    is still a table."""
    import io

    from rich.console import Console

    from apmw.cli import common

    def printed(width: int, table) -> str:
        buf = io.StringIO()
        monkeypatch.setattr(common, "out", Console(file=buf, width=width, force_terminal=True, color_system=None))
        common.print_table(table)
        return buf.getvalue()

    def placements():
        t = common.plain_table("placements (* cheapest)")
        for col in ("placement", "pools", "peak GPUs", "$/day", "$/month", "$/task", "secured $/mo", "MWh"):
            t.add_column(col)
        common.plain_row(t, "split:H200x8", "coding-emea@H200x8\ncoding-apac@H200x8", "336", "$9,438", "$287,262",
                         "$0.1475", "$613,620", "2.22")
        common.plain_row(t, "shared", "refused: pool a+b@any", *["-"] * 6)
        return t

    narrow = printed(80, placements())
    assert "…" not in narrow and "┃" not in narrow
    assert "split:H200x8\n  pools         coding-emea@H200x8, coding-apac@H200x8\n" in narrow
    for figure in ("336", "$9,438", "$287,262", "$0.1475", "$613,620", "2.22"):
        assert f"  {figure}\n" in narrow
    assert "shared\n  pools         refused: pool a+b@any\n" in narrow and "  MWh           -" not in narrow
    wide = printed(200, placements())
    assert "┃" in wide and "$287,262" in wide and "…" not in wide


def test_a_plan_whose_check_will_take_long_says_so_before_it_starts(tmp_path):
    """A spec with N* in the thousands ran its simulated check for many minutes with nothing said into a pipe
    (fuzzing, session 45): plan says so before the check starts, and how to answer at once."""
    import yaml

    d = yaml.safe_load((EXAMPLES / "support-chat.yaml").read_text())
    d["model"]["config"] = "meta-llama/Meta-Llama-3.1-8B"
    d["hardware"].update(gpu="B200", gpus_per_replica=8)
    d["slo"] = {"task_latency_p95_s": d["slo"]["task_latency_p95_s"]}
    d["serving"].pop("max_batch", None)
    spec = tmp_path / "big.yaml"
    spec.write_text(yaml.safe_dump(d))
    import selectors

    proc = subprocess.Popen([APMW, "plan", str(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stderr, selectors.EVENT_READ)
            ready = sel.select(timeout=120)     # the note comes before the simulator's first run, in seconds
        first = proc.stderr.readline() if ready else ""
    finally:
        proc.kill()
        proc.communicate()
    assert "settling N* (" in first and "--analytic answers at once" in first


@pytest.mark.parametrize("listing", ["--gpus", "--systems"])
@pytest.mark.parametrize("columns", [None, "80"])
def test_a_catalogue_piped_to_a_file_prints_every_cell_whole(listing, columns):
    """Into a pipe a table is printed at the width it needs (common.print_table): `apmw model --gpus | less` cut the
    catalogues' cells to 'scale…' at 80 columns."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR")}
    env |= {"COLUMNS": columns} if columns else {}
    r = subprocess.run([APMW, "model", listing], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout and ("scale-out GB/s" if listing == "--systems" else "BF16 TFLOPS") in r.stdout


def test_simulate_and_bench_read_one_sweep_syntax():
    # simulate refused 10:20 (step required) where bench took a:b[:step]; one parser now (session 55's audit)
    from apmw.cli.common import parse_sweep
    from apmw.errors import ApmwError

    assert parse_sweep("1:7:3") == [1, 4, 7] and parse_sweep("2:4") == [2, 3, 4]
    for bad in ("7:1", "0:4", "a:b", "1:4:0", "5", "1:2:3:4"):
        with pytest.raises(ApmwError, match=r"give a:b\[:step\] with whole numbers"):
            parse_sweep(bad)
    with pytest.raises(ApmwError, match="at most 100 are simulated"):
        parse_sweep("1:1000", most_points=100)
    r = subprocess.run([sys.executable, "-c", "from apmw.cli import main; main()", "simulate", str(EXAMPLES / "support-chat.yaml"),
                        "--agents-sweep", "10:11", "--duration-s", "200", "--json"], capture_output=True, text=True)
    assert r.returncode == 0 and [p["agents"] for p in json.loads(r.stdout)["curve"]] == [10, 11]


def test_output_piped_to_a_file_starts_with_the_answer_not_a_progress_bars_blank_line():
    """A progress bar is drawn only on a terminal: piped, rich ended its transient bar with a blank line, at the
    top of `apmw plan`'s table and before simulate's `error:` (fuzz round 7)."""
    plan = run("plan", str(EXAMPLES / "deep-research.yaml"), "--check-tasks", "100")
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.startswith("apmw plan: "), plan.stdout[:80]
    bad = run("simulate", str(EXAMPLES / "coding-agent.yaml"), "--agents", "5", "--duration-s", "-3")
    assert bad.returncode == 1 and bad.stderr.startswith("error: duration_s must be > 0"), bad.stderr[:80]
