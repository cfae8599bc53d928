"""`apmw predict`: fixed-concurrency benchmark prediction, its CLI and its speed."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import apmw.cli
from apmw.perf import replica_with_step
from apmw.spec import Serving
from apmw.cli import app
from apmw.capacity.benchmark import PredictError, predict

LLAMA8 = "meta-llama/Meta-Llama-3.1-8B"
apmw.cli._register_verbs()   # every verb, as the `apmw` entry point does


def test_more_concurrency_means_slower_tokens_and_more_throughput():
    ps = [predict(LLAMA8, "H200", 1, "bf16", "bf16", 1024, 1024, c) for c in (1, 4, 16, 64, 256)]
    tpot = [p.tpot_s for p in ps]
    tput = [p.output_tokens_per_s_per_gpu for p in ps]
    assert tpot == sorted(tpot) and tput == sorted(tput)


def test_longer_prompts_raise_ttft():
    a, b = (predict(LLAMA8, "H100", 1, "fp8", "fp8", isl, 256, 8).ttft_s for isl in (512, 8192))
    assert b > 3 * a


def test_a_lone_client_finds_the_engine_idle():
    # concurrency 1: the previous request has ended, so the prompt starts at once; TTFT is the
    # request overhead plus the prompt's own prefill iteration, with no wait for another's
    import numpy as np

    from apmw.arch import load_architecture
    from apmw.perf import IterationLoad, build_step_model, resolve_gpu

    arch = load_architecture(LLAMA8)
    step = build_step_model(arch, resolve_gpu("H100"), 1, "fp8", "fp8", engine="vllm")
    isl = 2000
    load = IterationLoad(decode_seqs=np.array([0.0]), prefill_tokens=np.array([float(isl)]),
                         kv_read_bytes=np.array([0.0]),
                         attention_flops=np.array([isl * float(arch.attention_flops_per_token(isl / 2))]))
    prefill_s = float(step.iteration_time_s(load)[0])
    p = predict(LLAMA8, "H100", 1, "fp8", "fp8", isl, 100, 1, request_overhead_s=0.01)
    assert p.ttft_s == pytest.approx(0.01 + prefill_s, rel=1e-9)


def test_concurrency_beyond_the_batch_limit_queues():
    p = predict(LLAMA8, "H200", 1, "bf16", "bf16", 1000, 100, 64, max_batch=16)
    assert p.running_requests == 16 and p.queued_requests == 48
    assert p.ttft_s > 2 * (p.e2e_latency_s - p.ttft_s)      # waits ~3 lifetimes of others


def test_repeated_predictions_reuse_the_loaded_tables():
    # speed itself is measured in bench/predict_speed.py; here: the kernel tables and the
    # per-replica curves are loaded once per GPU, not once per prediction
    from apmw.perf.tables import load_tables

    predict(LLAMA8, "H200", 1, "bf16", "bf16", 1024, 1024, 32)
    tables = load_tables("H200-SXM-141GB")
    misses = load_tables.cache_info().misses
    a = predict(LLAMA8, "H200", 1, "bf16", "bf16", 1024, 1024, 32)
    b = predict(LLAMA8, "H200", 1, "bf16", "bf16", 1024, 1024, 32)
    assert load_tables.cache_info().misses == misses and load_tables("H200-SXM-141GB") is tables
    assert a == b


def test_model_that_does_not_fit_is_a_clear_error():
    """The library names its own parameter (tp); the CLI names the flag (--tp). Three H100s would hold the
    weights, but tensor parallelism shards the 64 heads evenly: the hint is the least count that divides them."""
    from apmw.perf import DoesNotFitError

    with pytest.raises(DoesNotFitError, match=r"does not fit.*\(tp of at least 4, a count that divides the 64 attention heads\)"):
        predict("meta-llama/Meta-Llama-3.1-70B", "H100", 1, "bf16", "bf16", 1024, 1024, 4)
    r = CliRunner().invoke(app, ["predict", "--model", "meta-llama/Meta-Llama-3.1-70B", "--gpu", "H100", "--isl",
                                 "1024", "--osl", "1024", "--concurrency", "4"])
    assert r.exit_code == 1 and "(--tp of at least 4, a count that divides the 64 attention heads)" in " ".join(r.output.split()) and "weight_dtype" not in r.output


def test_cli_json_fields():
    r = CliRunner().invoke(app, ["predict", "--model", LLAMA8, "--gpu", "H100", "--tp", "1", "--weight-dtype", "fp8",
                                 "--kv-dtype", "fp8", "--isl", "1000", "--osl", "200", "--concurrency", "8",
                                 "--engine", "trtllm", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert {"ttft_s", "tpot_s", "output_tokens_per_s_per_gpu", "source"} <= d.keys()
    assert d["source"] == "calibrated" and 0 < d["tpot_s"] < d["ttft_s"] * 10


def test_cli_bad_input_is_an_error_not_a_traceback():
    r = CliRunner().invoke(app, ["predict", "--model", LLAMA8, "--gpu", "H100", "--isl", "0", "--osl", "10",
                                 "--concurrency", "1", "--engine", "tgi"])
    assert r.exit_code == 1 and "Traceback" not in r.output


def test_open_loop_obeys_littles_law():
    from apmw.arch import load_architecture
    from apmw.catalog.gpus import get_gpu
    from apmw.perf import build_step_model
    from apmw.capacity.open_loop import predict_open_loop

    step = build_step_model(load_architecture(LLAMA8), get_gpu("H200"), 1, "fp8", "fp8", engine="trtllm")
    rates = (5.0, 20.0, 40.0)
    ps = [predict_open_loop(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=2048)), 800, 128, lam) for lam in rates]
    for lam, p in zip(rates, ps):
        # in-flight requests = arrival rate x time in system (within one request of rounding)
        assert abs(lam * p.e2e_latency_s - p.running_requests) <= max(1.0, 0.05 * p.running_requests)
    assert [p.tpot_s for p in ps] == sorted(p.tpot_s for p in ps)
    with pytest.raises(PredictError, match="exceeds"):
        predict_open_loop(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=2048)), 800, 128, 1e5)


def test_equal_lengths_move_in_lock_step_groups():
    # With every request the same length the first wave's groups (as many whole prompts as the
    # budget takes) stay one packed iteration apart: each prompt waits half a decode iteration
    # and its group's packed iteration, and decodes through every other group's. Varied lengths
    # dissolve the groups (apmw's simulator agrees: bench/predict_vs_sim.py).
    from apmw.arch import load_architecture
    from apmw.catalog.gpus import get_gpu
    from apmw.perf import build_step_model
    from apmw.capacity.benchmark import predict_with

    step = build_step_model(load_architecture(LLAMA8), get_gpu("H100"), 1, "fp8", "fp8", engine="trtllm")
    # 96 clients, 8 whole 1000-token prompts per packed iteration: 12 groups
    lock = predict_with(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=2048)), 1000, 1000, 96, requests_per_client=10**9, length_spread=0.0)
    spread = predict_with(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=2048)), 1000, 1000, 96, requests_per_client=10**9, length_spread=1.0)
    assert lock.prompts_arrive == "in lock-step groups" and lock.lockstep_share == 1.0
    assert spread.prompts_arrive == "spread out" and spread.lockstep_share < 1e-6
    t_dec, t_group = lock.decode_iteration_s, lock.mixed_iteration_s
    # the engine schedules one iteration ahead (apmw.perf.serving_policy), so a returning group also
    # waits for the iteration already scheduled: a decode iteration for the first of the 12 groups,
    # the packed iteration of the group before for the other 11
    assert lock.iterations_scheduled_ahead == 1
    assert lock.ttft_s == pytest.approx(0.5 * t_dec + (8 * t_dec + 88 * t_group) / 96 + t_group, rel=1e-6)
    plain = predict_with(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=2048, overlap_scheduling=False)), 1000, 1000, 96, requests_per_client=10**9, length_spread=0.0)
    assert plain.iterations_scheduled_ahead == 0
    assert plain.ttft_s == pytest.approx(0.5 * t_dec + t_group, rel=1e-6)
    assert lock.ttft_s > 3 * spread.ttft_s
    # the other 11 groups' packed iterations raise the time per output token
    expected = lock.decode_iteration_s + 11 * (lock.mixed_iteration_s - lock.decode_iteration_s) / 999
    assert lock.tpot_s == pytest.approx(expected, rel=1e-9)
    # a little spread dissolves the groups smoothly
    ttft = [predict_with(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=2048)), 1000, 1000, 100, requests_per_client=10**9, length_spread=f).ttft_s
            for f in (0.0, 0.005, 0.01, 0.02, 0.05)]
    assert ttft == sorted(ttft, reverse=True)
    # one request alone never groups, whatever the spread
    single = predict_with(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=2048)), 1000, 1000, 1, length_spread=0.0)
    assert single.prompts_arrive == "spread out"


def test_a_prefill_bound_wave_packs_every_iteration():
    # 2048 requests of 800 prompt tokens need 200 full-budget iterations per wave but
    # decode only 128 tokens each: the cycle is the packed prefill, whatever the spread.
    from apmw.arch import load_architecture
    from apmw.catalog.gpus import get_gpu
    from apmw.perf import build_step_model
    from apmw.capacity.benchmark import predict_with

    step = build_step_model(load_architecture(LLAMA8), get_gpu("H200"), 1, "fp8", "fp8", engine="trtllm")
    a = predict_with(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=2048)), 800, 128, 2048, requests_per_client=10**9, length_spread=0.0)
    b = predict_with(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=2048)), 800, 128, 2048, requests_per_client=10**9, length_spread=1.0)
    assert a.output_tokens_per_s_per_gpu == pytest.approx(b.output_tokens_per_s_per_gpu)
    cycle_iters = 2048 * 800 / (8192 - 2047)
    assert a.e2e_latency_s == pytest.approx(cycle_iters * a.mixed_iteration_s, rel=0.05)


def test_cli_length_spread_and_request_overhead():
    base = ["predict", "--model", LLAMA8, "--gpu", "H200", "--weight-dtype", "fp8", "--kv-dtype", "fp8",
            "--isl", "1000", "--osl", "1000", "--concurrency", "64", "--json"]
    runs = {}
    for extra in ([], ["--length-spread", "0"], ["--request-overhead-ms", "0"]):
        r = CliRunner().invoke(app, base + extra)
        assert r.exit_code == 0, r.output
        runs[" ".join(extra)] = json.loads(r.output)
    assert runs["--length-spread 0"]["prompts_arrive"] == "in lock-step groups"
    assert runs[""]["prompts_arrive"] == "spread out"
    from apmw.perf.serving_policy import REQUEST_OVERHEAD_S
    assert runs[""]["ttft_s"] - runs["--request-overhead-ms 0"]["ttft_s"] == pytest.approx(REQUEST_OVERHEAD_S["vllm"])
    r = CliRunner().invoke(app, base + ["--length-spread", "-1"])
    assert r.exit_code == 1 and "--length-spread" in r.output and "Traceback" not in r.output


def test_tensorrt_llm_sizes_its_kv_pool_from_free_memory():
    # vLLM: 0.9 of the whole HBM minus weights and workspace; TensorRT-LLM: 0.9 of what is
    # free after weights and workspace (KvCacheConfig.free_gpu_memory_fraction), so more.
    from apmw.arch import load_architecture
    from apmw.catalog.gpus import get_gpu
    from apmw.perf import build_step_model
    from apmw.capacity.benchmark import kv_fit_requests

    KV_MEMORY_FRACTION, WORKSPACE_BYTES_PER_GPU = Serving().kv_memory_fraction, Serving().workspace_bytes_per_gpu

    step = build_step_model(load_architecture("meta-llama/Meta-Llama-3.1-70B"), get_gpu("H100"), 2, "fp8", "fp8")
    vllm, trt = kv_fit_requests(replica_with_step(step, Serving(engine="vllm")), 5000, 500), kv_fit_requests(replica_with_step(step, Serving(engine="trtllm")), 5000, 500)
    free = 2 * (step.gpu.hbm_bytes - WORKSPACE_BYTES_PER_GPU) - step.weight_bytes
    assert trt == int(KV_MEMORY_FRACTION * free // (step.kv_bytes_per_token * 5500 * step.kv_replication))
    assert trt > vllm


def test_power_and_tokens_per_joule():
    from apmw.catalog.gpus import get_gpu
    from apmw.spec import Power

    gpu = get_gpu("H200")
    low = predict(LLAMA8, "H200", 1, "fp8", "fp8", 1024, 256, 1, engine="trtllm")
    high = predict(LLAMA8, "H200", 1, "fp8", "fp8", 1024, 256, 128, engine="trtllm")
    host = Power().host_power_w_per_gpu
    for p in (low, high):
        assert gpu.idle_power_w + host < p.replica_power_w <= gpu.busy_power_w + host
        assert p.output_tokens_per_j == pytest.approx(p.output_tokens_per_s_per_gpu / p.replica_power_w)
    # batching raises draw far less than it raises throughput
    assert high.replica_power_w > low.replica_power_w
    assert high.output_tokens_per_j > 10 * low.output_tokens_per_j


@pytest.mark.parametrize("args, words", [
    (["--model", "Qwen/Qwen3-32B", "--tp", "3", "--isl", "100"], ["--tp 3", "64 attention heads"]),
    (["--model", LLAMA8, "--isl", "200000"], ["200,100", "131,072", "max_position_embeddings"]),
    # 0 is a user error, not a request for the default budget
    (["--model", LLAMA8, "--isl", "1000", "--token-budget", "0"], ["--token-budget must be at least 1", "got 0"]),
])
def test_what_engines_refuse_is_a_clear_error(args, words):
    r = CliRunner().invoke(app, ["predict", "--gpu", "H200", "--osl", "100", "--concurrency", "4", *args])
    assert r.exit_code == 1 and "Traceback" not in r.output
    for w in words:
        assert w in r.output


def test_the_first_wave_weighs_less_the_more_requests_each_client_sends():
    ttft = [predict(LLAMA8, "H200", 1, "bf16", "bf16", 1024, 1024, 128, requests_per_client=n).ttft_s
            for n in (1, 10, 100)]
    assert ttft[0] > ttft[1] > ttft[2]
    with pytest.raises(PredictError, match="requests_per_client"):
        predict(LLAMA8, "H200", 1, "bf16", "bf16", 1024, 1024, 128, requests_per_client=0)


def test_cli_sweeps_a_comma_list_of_concurrencies():
    base = ["predict", "--model", LLAMA8, "--gpu", "H200", "--isl", "1024", "--osl", "256"]
    r = CliRunner().invoke(app, base + ["--concurrency", "1,8,64", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert [d["concurrency"] for d in rows] == [1, 8, 64]
    single = json.loads(CliRunner().invoke(app, base + ["--concurrency", "8", "--json"]).output)
    assert rows[1]["tpot_s"] == single["tpot_s"] and rows[1]["ttft_s"] == single["ttft_s"]
    assert rows[0]["tpot_s"] < rows[2]["tpot_s"]
    r = CliRunner().invoke(app, base + ["--concurrency", "4,many"])
    assert r.exit_code == 1 and "comma list" in r.output and "Traceback" not in r.output


def test_request_rate_predicts_an_open_loop_point():
    r = CliRunner().invoke(app, ["predict", "--model", LLAMA8, "--gpu", "H200", "--isl", "1024", "--osl", "512",
                                 "--request-rate", "8", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["request_rate_per_s"] == 8.0
    # open loop: every offered request is served, so output throughput is the offered load
    assert d["output_tokens_per_s_per_gpu"] == pytest.approx(8 * 512)
    # Little's law: requests in the engine = rate x time in the engine (less the client-side overhead)
    assert d["running_requests"] == pytest.approx(8 * (d["e2e_latency_s"] - 0.025), rel=0.05)


def test_higher_request_rate_means_slower_tokens_and_a_busier_engine():
    from apmw.capacity.open_loop import predict_rate

    ps = [predict_rate(LLAMA8, "H200", 1, "bf16", "bf16", 1024, 512, r) for r in (0.05, 2, 8, 14)]
    assert [p.tpot_s for p in ps] == sorted(p.tpot_s for p in ps)
    assert [p.running_requests for p in ps] == sorted(p.running_requests for p in ps)
    # at 0.05 requests/s the engine idles most of the time and draws near idle power; one closed-loop
    # client keeps it busy all the time
    one_client = predict(LLAMA8, "H200", 1, "bf16", "bf16", 1024, 512, 1).replica_power_w
    assert ps[0].replica_power_w < 0.8 * one_client


def test_request_rate_beyond_capacity_or_with_concurrency_is_a_clear_error():
    base = ["predict", "--model", LLAMA8, "--gpu", "H200", "--isl", "1024", "--osl", "512"]
    r = CliRunner().invoke(app, base + ["--request-rate", "500"])
    assert r.exit_code == 1 and "exceeds the replica's capacity" in r.output and "lower the rate" in r.output
    r = CliRunner().invoke(app, base + ["--request-rate", "5", "--concurrency", "4"])
    assert r.exit_code == 1 and "not both" in r.output
    r = CliRunner().invoke(app, base)
    assert r.exit_code == 1 and "not neither" in r.output
    r = CliRunner().invoke(app, base + ["--request-rate", "fast"])
    assert r.exit_code == 1 and "is not a number" in r.output


def test_power_follows_the_token_budget_of_the_prediction():
    """A small budget splits prompts into small chunks, which are far less compute-bound than
    a whole 4k prompt: the replica's power must price the chunks the prediction ran."""
    from apmw.capacity.benchmark import replica_for_benchmark, replica_power_w

    kw = dict(engine="trtllm")
    small = predict(LLAMA8, "H200", 1, "fp8", "fp8", 4096, 256, 32, token_budget=256, **kw)
    replica = replica_for_benchmark(LLAMA8, "H200", 1, "fp8", "fp8", 4096, 256, "trtllm", token_budget=8192)
    whole_prompt_w = replica_power_w(replica, small, 4096, 256)
    assert small.mixed_iteration_share == 1.0          # every iteration carries a chunk
    assert small.replica_power_w < 0.9 * whole_prompt_w


def test_names_as_nvidia_smi_hf_and_the_engines_write_them():
    """What a user copies from nvidia-smi, a config.json and an engine's docs predicts the same point."""
    canonical = predict(LLAMA8, "H100", 1, "bf16", "fp8", 1024, 256, 16, engine="trtllm")
    spelled = predict("meta-llama/Llama-3.1-8B-Instruct", "NVIDIA H100 80GB HBM3", 1, "bfloat16", "fp8_e4m3",
                      1024, 256, 16, engine="TensorRT-LLM")
    assert spelled == canonical
    r = CliRunner().invoke(app, ["predict", "--model", LLAMA8, "--gpu", "H200", "--isl", "100", "--osl", "10",
                                 "--concurrency", "1", "--kv-dtype", "auto"])
    assert r.exit_code == 1 and "'auto' depends on the checkpoint" in r.output


def test_a_checkpoint_named_for_other_weights_gets_a_note_and_the_model_source():
    args = ["predict", "--gpu", "H100", "--isl", "1000", "--osl", "100", "--concurrency", "8",
            "--model", "nvidia/Llama-3.1-8B-Instruct-FP8"]
    slip = CliRunner().invoke(app, [*args, "--weight-dtype", "bf16"])
    assert slip.exit_code == 0
    assert "names fp8 weights, but bf16 weights are priced" in slip.output
    assert "read for 'nvidia/Llama-3.1-8B-Instruct-FP8'" in " ".join(slip.output.split())
    meant = CliRunner().invoke(app, [*args, "--weight-dtype", "fp8"])
    assert meant.exit_code == 0 and "weights are priced" not in meant.output
    # left out, the weights are what the checkpoint stores, and a note says so
    stored = CliRunner().invoke(app, args)
    assert stored.exit_code == 0 and "weights are priced" not in stored.output
    assert "weights fp8, as nvidia/Llama-3.1-8B-Instruct-FP8 stores them" in " ".join(stored.output.split())
    assert json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout) == \
        json.loads(CliRunner().invoke(app, [*args, "--json", "--weight-dtype", "fp8"]).stdout)
    # experts a user gives at another dtype are said to be the user's, not the checkpoint's (fuzzing, session 38)
    given = " ".join(CliRunner().invoke(app, ["predict", "--model", "deepseek-ai/DeepSeek-V3", "--gpu", "B200", "--tp",
                                              "8", "--isl", "1024", "--osl", "128", "--concurrency", "4",
                                              "--moe-dtype", "nvfp4"]).output.split())
    assert "routed experts at nvfp4, as --moe-dtype gives" in given and "experts in nvfp4, as" not in given
    # its KV cache is read off the base model's config, which a note says (the checkpoint may name fp8 KV)
    assert "published checkpoint's own quantization config is not bundled" in " ".join(meant.output.split())


def test_a_config_file_that_stores_fp8_is_noted_when_bf16_is_priced(tmp_path):
    from apmw.catalog import load_config
    from apmw.catalog.models import config_weight_dtype

    path = tmp_path / "config.json"
    path.write_text(json.dumps(load_config("deepseek-ai/DeepSeek-V3")[0]))
    assert config_weight_dtype(str(path)) == "fp8"
    args = ["predict", "--gpu", "H200", "--tp", "16", "--isl", "1000", "--osl", "100", "--concurrency", "8"]
    slip = CliRunner().invoke(app, [*args, "--model", "deepseek-ai/DeepSeek-R1", "--weight-dtype", "bf16"])
    assert slip.exit_code == 0, slip.output
    assert ("'deepseek-ai/DeepSeek-R1' stores fp8 weights (its config.json's quantization_config), but bf16 "
            "weights are priced") in " ".join(slip.output.split())
    meant = CliRunner().invoke(app, [*args, "--model", str(path), "--weight-dtype", "fp8"])
    assert meant.exit_code == 0 and "weights are priced" not in meant.output


def test_the_cli_default_prompts_per_client_is_the_library_default():
    """Left out, --requests-per-client is the library's default (a first wave of 1/N), as if given."""
    from apmw.capacity.benchmark import DEFAULT_REQUESTS_PER_CLIENT

    base = ["predict", "--model", LLAMA8, "--gpu", "H100", "--isl", "1024", "--osl", "128", "--concurrency", "64",
            "--json"]

    def run(*extra: str) -> dict:
        r = CliRunner().invoke(app, base + list(extra))
        assert r.exit_code == 0, r.output
        return json.loads(r.output)

    unset = run()
    assert unset == run("--requests-per-client", str(DEFAULT_REQUESTS_PER_CLIENT))
    assert unset["ttft_s"] != run("--requests-per-client", "1")["ttft_s"]


def test_sglang_prefills_alone_and_first_and_stalls_its_decoders():
    # SGLang runs a prefill batch instead of the decode batch whenever prompts wait
    # (apmw.perf.serving_policy): a prompt waits only for the iteration in progress, and each
    # decoder sits through the other clients' prefill iterations.
    from apmw.arch import load_architecture
    from apmw.catalog.gpus import get_gpu
    from apmw.perf import build_step_model
    from apmw.capacity.benchmark import predict_with

    step = build_step_model(load_architecture(LLAMA8), get_gpu("H200"), 1, "bf16", "bf16", engine="sglang")
    sglang = Serving(engine="sglang", max_batched_tokens=8192, max_batch=2048)
    args = (replica_with_step(step, sglang), 200, 200, 256)
    first = predict_with(*args, requests_per_client=10**9, length_spread=1.0)
    mixed = predict_with(replica_with_step(step, sglang.model_copy(update={"mixed_prefill": True})), *args[1:],
                         requests_per_client=10**9, length_spread=1.0)
    assert not first.prefill_mixed_with_decode and mixed.prefill_mixed_with_decode
    t_pre, t_dec = first.mixed_iteration_s, first.decode_iteration_s      # a 200-token prefill iteration alone
    assert first.lockstep_share < 0.002             # widely varied lengths: spread out
    assert first.tpot_s == pytest.approx(t_dec + 255 * t_pre / 199, rel=0.005)
    assert first.tpot_s > 1.2 * mixed.tpot_s          # 255 stalls of a whole forward pass
    share = 256 / (256 + 199)
    t_bar = share * t_pre + (1 - share) * t_dec
    # half the iteration in progress and the one SGLang's overlap scheduler has already formed
    assert first.ttft_s == pytest.approx(1.5 * t_bar + t_pre, rel=0.005)
    plain = predict_with(replica_with_step(step, sglang.model_copy(update={"overlap_scheduling": False})),
                         *args[1:], requests_per_client=10**9, length_spread=1.0)
    assert plain.ttft_s == pytest.approx(0.5 * t_bar + t_pre, rel=0.005)
    assert first.ttft_s < mixed.ttft_s                # no decoders ride in its prefill iteration


def test_the_first_wave_counts_its_partial_last_iteration():
    from apmw.capacity.benchmark_waves import wave_mean_ttft_s

    # ten 1024-token prompts, 8192-token budget: eight land in the first iteration, two in a second
    # that holds only their 2048 tokens
    assert wave_mean_ttft_s(10, 1024, 8192, 1.0, 0.25) == pytest.approx((8 * 1.0 + 2 * 1.25) / 10)
    assert wave_mean_ttft_s(16, 1024, 8192, 1.0, 0.25) == pytest.approx(1.5)     # two full iterations
    assert wave_mean_ttft_s(3, 1024, 8192, 1.0, 0.4) == pytest.approx(0.4)       # one partial iteration


def test_cli_prefill_first_and_mixed_prefill_override_the_engine():
    base = ["predict", "--model", LLAMA8, "--gpu", "H200", "--isl", "1000", "--osl", "1000",
            "--concurrency", "64", "--json"]
    got = {}
    for extra in (["--engine", "sglang"], ["--engine", "sglang", "--mixed-prefill"], ["--prefill-first"], []):
        r = CliRunner().invoke(app, base + extra)
        assert r.exit_code == 0, r.output
        got[" ".join(extra)] = json.loads(r.output)["prefill_mixed_with_decode"]
    assert got == {"--engine sglang": False, "--engine sglang --mixed-prefill": True, "--prefill-first": False,
                   "": True}


def test_the_prediction_says_what_caps_the_running_requests():
    base = ["predict", "--model", "meta-llama/Meta-Llama-3.1-70B", "--gpu", "H200", "--weight-dtype", "fp8",
            "--kv-dtype", "fp8", "--isl", "1024", "--osl", "1024"]
    caps = {}
    for extra in (["--concurrency", "8"], ["--concurrency", "64", "--max-batch", "32"], ["--concurrency", "400"],
                  ["--concurrency", "400", "--engine", "trtllm"]):
        r = CliRunner().invoke(app, base + extra + ["--json"])
        assert r.exit_code == 0, r.output
        d = json.loads(r.output)
        caps[" ".join(extra)] = (d["running_limited_by"], d["kv_tokens_per_running_request"])
    assert caps["--concurrency 8"][0] == "concurrency"
    assert caps["--concurrency 64 --max-batch 32"][0] == "max_batch"
    assert caps["--concurrency 400"] == ("kv_memory", 1536.0)
    assert caps["--concurrency 400 --engine trtllm"] == ("kv_memory", 2048.0)
    r = CliRunner().invoke(app, base + ["--concurrency", "400"])
    assert "KV memory" in r.output and "preemptions not priced" in r.output



def test_the_engines_memory_setting_sizes_the_kv_pool_as_the_engine_reads_it():
    # vLLM --gpu-memory-utilization: a share of all HBM, so each +0.01 adds 1.41 GB of KV on an H200;
    # TensorRT-LLM free_gpu_memory_fraction: a share of what is left after weights and workspace
    from apmw.arch import load_architecture
    from apmw.catalog.gpus import get_gpu
    from apmw.perf import build_step_model
    WORKSPACE_BYTES_PER_GPU = Serving().workspace_bytes_per_gpu

    step = build_step_model(load_architecture("meta-llama/Meta-Llama-3.1-70B"), get_gpu("H200"), 1, "fp8", "fp8")
    hbm = step.gpu.hbm_bytes
    assert replica_with_step(step, Serving(engine="vllm", kv_memory_fraction=0.92)).memory.kv_capacity_bytes - replica_with_step(step, Serving(engine="vllm", kv_memory_fraction=0.90)).memory.kv_capacity_bytes == pytest.approx(0.02 * hbm)
    free = hbm - WORKSPACE_BYTES_PER_GPU - step.weight_bytes
    assert replica_with_step(step, Serving(engine="trtllm", kv_memory_fraction=0.5)).memory.kv_capacity_bytes == pytest.approx(0.5 * free)
    # more memory for KV: more requests run at once, fewer queue, and the mean TTFT falls
    base = ["predict", "--model", "meta-llama/Meta-Llama-3.1-70B", "--gpu", "H200", "--weight-dtype", "fp8",
            "--kv-dtype", "fp8", "--isl", "4096", "--osl", "1024", "--concurrency", "256", "--json"]
    runs = {}
    for fraction in (None, "0.9", "0.95"):
        r = CliRunner().invoke(app, base + ([] if fraction is None else ["--kv-memory-fraction", fraction]))
        assert r.exit_code == 0, r.output
        runs[fraction] = json.loads(r.output)
    assert runs[None] == runs["0.9"]                     # 0.9 is the default
    assert runs["0.95"]["running_requests"] > runs["0.9"]["running_requests"]
    assert runs["0.95"]["ttft_s"] < runs["0.9"]["ttft_s"]
    for bad, words in (("1.5", "must be in (0, 1]"), ("0.45", "larger --kv-memory-fraction")):
        r = CliRunner().invoke(app, base + ["--kv-memory-fraction", bad])
        assert r.exit_code != 0 and words in r.output and "Traceback" not in r.output, r.output
    # bf16 weights (141 GB) outgrow a whole H100: no share of its memory helps, so none is offered
    r = CliRunner().invoke(app, [*base[:4], "H100", "--weight-dtype", "bf16", *base[7:]])
    assert r.exit_code != 0 and "more GPUs per replica (--tp" in r.output and "--kv-memory-fraction" not in r.output, r.output

def test_the_wait_for_the_iteration_scheduled_ahead_fades_into_the_prefill_queue():
    # Past the prefill-bound point prompts queue for the budget, and the queue, not the arrival's
    # phase, sets the wait: the iteration scheduled ahead becomes part of it. TTFT never drops as
    # clients are added (it used to fall by a third where the queue appeared).
    from apmw.arch import load_architecture
    from apmw.catalog.gpus import get_gpu
    from apmw.perf import build_step_model
    from apmw.capacity.benchmark import predict_with

    step = build_step_model(load_architecture(LLAMA8), get_gpu("H200"), 1, "bf16", "bf16")
    ttft = [predict_with(replica_with_step(step, Serving(max_batched_tokens=2048, max_batch=1024)), 1024, 16, c, requests_per_client=10**9, length_spread=0.2).ttft_s
            for c in range(28, 42)]
    assert all(b >= a * (1 - 1e-9) for a, b in zip(ttft, ttft[1:]))
    deep = [predict_with(replica_with_step(step, Serving(max_batched_tokens=2048, max_batch=1024, overlap_scheduling=o)), 1024, 16, 40, requests_per_client=10**9, length_spread=0.2).ttft_s for o in (True, False)]
    assert deep[0] == pytest.approx(deep[1])     # a queue iterations deep: the phase no longer matters


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_poisson_prompts_wait_one_more_mean_iteration_and_share_only_the_one_they_land_in(engine):
    # Open loop: the prompts that share a prompt's first iteration are those that arrived during the
    # iteration it landed in, so scheduling ahead adds exactly one mean iteration (the time per
    # output token when spread out) and no extra sharing.
    from apmw.arch import load_architecture
    from apmw.catalog.gpus import get_gpu
    from apmw.perf import build_step_model
    from apmw.capacity.benchmark import predict_with

    step = build_step_model(load_architecture(LLAMA8), get_gpu("H200"), 1, "bf16", "bf16", engine=engine)
    on, off = (predict_with(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=2048, engine=engine, overlap_scheduling=o)), 300, 300, 96, requests_per_client=10**9, length_spread=1.0, poisson_arrivals=True) for o in (True, False))
    assert on.tpot_s == off.tpot_s
    share = on.mixed_iteration_share      # iterations that carry prompts (prefill-only ones for SGLang)
    mean_iteration = share * on.mixed_iteration_s + (1 - share) * on.decode_iteration_s
    assert on.ttft_s - off.ttft_s == pytest.approx(mean_iteration, rel=1e-4)   # (a trace of lock step)


def test_cli_and_rate_predictions_take_the_overlap_setting():
    base = ["predict", "--model", LLAMA8, "--gpu", "H200", "--isl", "1000", "--osl", "200", "--json"]
    got = {}
    for load in (["--concurrency", "64"], ["--request-rate", "20"]):
        for flag in ([], ["--no-overlap-scheduling"]):
            r = CliRunner().invoke(app, base + load + flag)
            assert r.exit_code == 0, r.output
            d = json.loads(r.output)
            got[(load[0], bool(flag))] = (d["iterations_scheduled_ahead"], d["ttft_s"])
    for load in ("--concurrency", "--request-rate"):
        (on_ahead, on_ttft), (off_ahead, off_ttft) = got[(load, False)], got[(load, True)]
        assert (on_ahead, off_ahead) == (1, 0)
        assert on_ttft > off_ttft


def test_the_ttft_parts_add_up_and_name_where_the_time_goes():
    from apmw.capacity.benchmark import predict
    from apmw.capacity.open_loop import predict_rate

    # within the limits: the engine's steady state, the first wave's share and the overhead
    p = predict(LLAMA8, "H200", 1, "bf16", "bf16", 1024, 1024, 64, request_overhead_s=0.02)
    parts = p.ttft_parts_s
    assert sum(parts.values()) == pytest.approx(p.ttft_s, rel=1e-12)
    assert parts["request_overhead"] == 0.02 and parts["slot_queue"] == 0.0 and parts["first_wave"] > 0
    steady = predict(LLAMA8, "H200", 1, "bf16", "bf16", 1024, 1024, 64, request_overhead_s=0.02,
                     requests_per_client=10**9)
    assert steady.ttft_parts_s["steady_state"] == pytest.approx(parts["steady_state"])
    assert steady.ttft_parts_s["first_wave"] < 1e-6
    # past the KV limit most of TTFT is the wait for a running slot
    q = predict("meta-llama/Meta-Llama-3.1-70B", "H200", 1, "fp8", "fp8", 1024, 1024, 400)
    assert q.queued_requests > 0 and q.ttft_parts_s["slot_queue"] > 0.5 * q.ttft_s
    assert sum(q.ttft_parts_s.values()) == pytest.approx(q.ttft_s, rel=1e-12)
    # open loop: the overhead is added outside the engine
    r = predict_rate(LLAMA8, "H200", 1, "bf16", "bf16", 1024, 1024, 5.0, request_overhead_s=0.03)
    assert r.ttft_parts_s["request_overhead"] == 0.03
    assert sum(r.ttft_parts_s.values()) == pytest.approx(r.ttft_s, rel=1e-12)


def test_a_batch_the_token_budget_lowers_is_blamed_on_the_token_budget():
    """vLLM lowers its default batch limit to --token-budget: the queue said --max-batch capped it (fuzz round 8)."""
    base = ["predict", "--model", LLAMA8, "--gpu", "H100", "--isl", "1000", "--osl", "100", "--concurrency", "8"]
    r = CliRunner().invoke(app, base + ["--engine", "vllm", "--token-budget", "4"], terminal_width=400)
    assert r.exit_code == 0, r.output
    row = next(line for line in r.stdout.splitlines() if "running capped by" in line)
    assert "--token-budget: vllm runs no more requests than its tokens per iteration, 4 here" in row, row
    r = CliRunner().invoke(app, base + ["--engine", "vllm", "--token-budget", "8192", "--max-batch", "4"],
                           terminal_width=400)
    row = next(line for line in r.stdout.splitlines() if "running capped by" in line)
    assert row.split("│")[2].strip() == "--max-batch", row


def test_a_long_queue_reads_with_thousands_separators():
    """"TTFT, mean 14057381.5 ms" and "concurrency 20000" in one prediction's table (fuzz round 9)."""
    r = CliRunner().invoke(app, ["predict", "--model", LLAMA8, "--gpu", "H100", "--isl", "8000", "--osl", "1024",
                                 "--concurrency", "20000"], terminal_width=400)
    assert r.exit_code == 0, r.output
    assert "8,000/1,024 tokens, concurrency 20,000" in r.stdout
    ttft = next(line for line in r.stdout.splitlines() if "TTFT, mean" in line).split("│")[2].strip()
    assert ttft.endswith(" ms") and ttft.count(",") >= 2, ttft
