"""How fast is `apmw simulate`? (issue 7, item 5; results recorded in bench/README.md, section sim_speed)

1. Open loop, the setting the best-known open simulator was timed on (about 105 simulated requests per
   wall-second on this machine class, as issue 7 states): Llama-2-7B on one H100 (TP1), vLLM-style
   scheduler with a batch cap of 128, Poisson arrivals at 2 req/s, 10,000 requests whose prompt and
   output lengths are the first 10,000 rows of the Azure LLM inference trace 2023 (conversation),
   read from ../shared/data/traces/azure_llm_2023/ (or, if that is absent, the 200-row fixture in
   tests/sim/data cycled to 10,000 rows).
2. Closed loop: one simulated hour of 1,000 agents on the coding-agent example replica (far past its
   N* of about 28: the engine thrashes, every iteration carries a prefill chunk), and one hour of 28
   agents (decode-bound, where skipping iterations pays off), with and without speculative decoding
   (3 draft tokens at 70 % acceptance, whose fast path works out each sequence's kept tokens in advance:
   ``apmw.sim.fast_forward._speculative_segment``).

Each is also run with the plain iteration-by-iteration loop (``fast=False``) on a shorter slice in
the same process, and the script prints ratios (fast vs plain, and vs 105 req/s), not assertions.
Wall and CPU (process) seconds are both printed: on a shared machine the CPU figure is the stable one.

    python bench/sim_speed.py [--requests 10000] [--plain-requests 1000] [--agents 1000]
"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from apmw.sim import simulate, simulate_open_loop
from apmw.spec import load_spec, spec_from_dict

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "data" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
FIXTURE = ROOT / "tests" / "sim" / "data" / "azure_conv_2023_head200.csv"
# Requests per wall-second of the reference simulator on this setting, as stated in issue 7.
BASELINE_REQ_PER_S = 105.0

# meta-llama/Llama-2-7b-hf config.json (HF hub, the fields apmw reads).
LLAMA2_7B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000,
    "max_position_embeddings": 4096, "tie_word_embeddings": False, "torch_dtype": "float16",
    "hidden_act": "silu", "rms_norm_eps": 1e-05,
}


def open_loop_spec(config_path: Path):
    return spec_from_dict({
        "workload": {"steps_per_task": 1, "system_prompt_tokens": 0, "new_input_tokens_per_call": 1000,
                     "output_tokens_per_call": 200, "tool_wait_s": 0},
        "model": {"config": str(config_path), "weight_dtype": "fp16", "kv_dtype": "fp16"},
        "hardware": {"gpu": "H100", "gpus_per_replica": 1},
        # batch cap 128 (issue 7); 4096 tokens per iteration is Vidur's vLLM scheduler default
        # (vidur/config/config.py, VllmSchedulerConfig.max_tokens_in_batch)
        "serving": {"max_batch": 128, "max_batched_tokens": 4096, "prefix_caching": False},
        "slo": {"task_latency_p95_s": 1e6},
        "cost": {"electricity_usd_per_kwh": 0.0, "gpu_hour_usd": 0.0},
    })


def lengths(n: int) -> tuple[np.ndarray, np.ndarray, str]:
    path, note = (TRACE, str(TRACE)) if TRACE.exists() else (FIXTURE, f"{FIXTURE} (cycled)")
    with open(path) as f:
        rows = list(csv.DictReader(f))
    rows = [rows[i % len(rows)] for i in range(n)]
    return (np.array([int(r["ContextTokens"]) for r in rows]), np.array([int(r["GeneratedTokens"]) for r in rows]),
            note)


def bench_open_loop(requests: int, plain_requests: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "Llama-2-7b-hf" / "config.json"
        cfg.parent.mkdir()
        cfg.write_text(json.dumps(LLAMA2_7B))
        spec = open_loop_spec(cfg)
        prompt, out, source = lengths(requests)
        t0, c0 = time.perf_counter(), time.process_time()
        fast = simulate_open_loop(spec, prompt, out, rate_per_s=2.0, seed=0)
        fast_s, fast_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        t0 = time.perf_counter()
        sub = simulate_open_loop(spec, prompt[:plain_requests], out[:plain_requests], rate_per_s=2.0, seed=0)
        sub_fast_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        plain = simulate_open_loop(spec, prompt[:plain_requests], out[:plain_requests], rate_per_s=2.0, seed=0,
                                   fast=False)
        plain_s = time.perf_counter() - t0
    assert plain.iterations == sub.iterations
    rate = requests / fast_s
    return {
        "trace": source, "requests": requests, "simulated_s": fast.simulated_s, "wall_s": fast_s,
        "cpu_s": fast_cpu_s, "requests_per_wall_s": rate, "requests_per_cpu_s": requests / fast_cpu_s,
        "x_baseline_105": rate / BASELINE_REQ_PER_S, "x_baseline_105_cpu": requests / fast_cpu_s / BASELINE_REQ_PER_S,
        "iterations": fast.iterations, "latency_p50_s": fast.task_latency["p50"],
        "plain_slice": {"requests": plain_requests, "fast_wall_s": sub_fast_s, "plain_wall_s": plain_s,
                        "fast_vs_plain": plain_s / sub_fast_s},
    }


# The speculative-decoding case: a separate draft's figures, as apmw levers assumes them.
SPECULATIVE = {"draft": "model", "draft_tokens": 3, "acceptance_rate": 0.7}


def bench_closed_loop(agents: int, duration_s: float, plain_duration_s: float, speculative: bool = False) -> dict:
    spec = load_spec(ROOT / "examples" / "coding-agent.yaml")
    if speculative:
        d = yaml.safe_load((ROOT / "examples" / "coding-agent.yaml").read_text())
        d["serving"]["speculative"] = SPECULATIVE
        spec = spec_from_dict(d)
    t0, c0 = time.perf_counter(), time.process_time()
    r = simulate(spec, agents, duration_s=duration_s, seed=0, drain_limit_s=0.0)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    short = {}
    for fast in (True, False):
        t0 = time.perf_counter()
        simulate(spec, agents, duration_s=plain_duration_s, seed=0, drain_limit_s=0.0, fast=fast)
        short[fast] = time.perf_counter() - t0
    return {
        "agents": agents, "simulated_s": r.simulated_s, "wall_s": wall, "cpu_s": cpu, "iterations": r.iterations,
        "preemptions": r.preemptions, "decode_batch_mean": r.decode_batch_mean,
        "plain_slice": {"simulated_s": plain_duration_s, "fast_wall_s": short[True], "plain_wall_s": short[False],
                        "fast_vs_plain": short[False] / short[True]},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--plain-requests", type=int, default=1_000)
    ap.add_argument("--agents", type=int, default=1_000)
    ap.add_argument("--duration-s", type=float, default=3600.0)
    ap.add_argument("--plain-duration-s", type=float, default=300.0)
    a = ap.parse_args()
    res = {"open_loop": bench_open_loop(a.requests, a.plain_requests),
           "closed_loop": bench_closed_loop(a.agents, a.duration_s, a.plain_duration_s),
           # near the plan's N* (27) the engine is decode-bound, where the fast path pays off
           "closed_loop_near_n_star": bench_closed_loop(28, a.duration_s, a.plain_duration_s),
           "closed_loop_near_n_star_speculative": bench_closed_loop(28, a.duration_s, a.plain_duration_s, True)}
    o, c = res["open_loop"], res["closed_loop"]
    print(yaml.safe_dump(res, sort_keys=False))
    print(f"open loop: {o['requests_per_wall_s']:,.0f} simulated requests per wall-second = "
          f"{o['x_baseline_105']:.1f}x the 105 req/s baseline ({o['x_baseline_105_cpu']:.1f}x per CPU-second); fast path {o['plain_slice']['fast_vs_plain']:.1f}x "
          f"the plain loop on the first {o['plain_slice']['requests']} requests")
    print(f"closed loop: {c['agents']} coding agents, {c['simulated_s']:,.0f} simulated s in {c['wall_s']:.1f} wall s "
          f"({c['cpu_s']:.1f} CPU s); "
          f"fast path {c['plain_slice']['fast_vs_plain']:.1f}x the plain loop over {c['plain_slice']['simulated_s']:g} s")
    for key in ("closed_loop_near_n_star", "closed_loop_near_n_star_speculative"):
        c = res[key]
        print(f"closed loop{' (speculative decoding)' if 'speculative' in key else ''}: {c['agents']} coding agents, "
              f"{c['simulated_s']:,.0f} simulated s in {c['wall_s']:.1f} wall s ({c['cpu_s']:.1f} CPU s); fast path "
              f"{c['plain_slice']['fast_vs_plain']:.1f}x the plain loop over {c['plain_slice']['simulated_s']:g} s")
    plain, spec = res["closed_loop_near_n_star"], res["closed_loop_near_n_star_speculative"]
    print(f"speculative decoding costs the simulator {spec['cpu_s'] / plain['cpu_s']:.2f}x the CPU seconds of the "
          f"same hour without it")


if __name__ == "__main__":
    main()
