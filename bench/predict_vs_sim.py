"""Does `apmw predict`'s analytic fixed-concurrency model reproduce apmw's iteration-level simulator?

Run: .venv/bin/python bench/predict_vs_sim.py [--duration-s 300] [--engine vllm|sglang|trtllm] [--client-gap]
     [--inferencemax] [--open-loop] [--kv-limit]

A fixed-concurrency benchmark is a closed loop of single-call tasks with no think time. We
simulate one (``apmw.sim.simulate``, every client starting at once as a benchmark client does,
statistics after the warm-up) and predict it (``apmw.capacity.benchmark.predict_with``, no request
overhead, first wave excluded) for Llama-3.1-8B bf16 on one H200: 1024/512 tokens at length
spreads 0-0.2 (lengths uniform over +-spread/2 of the mean) and concurrency 8-128, and
8192/1024 and 200/200 tokens at spreads 0 and 0.2, concurrency 4-64. This is
where ``apmw.capacity.benchmark_waves.LOCKSTEP_DECAY`` comes from; both sides use the same step model, so the
comparison checks the queueing and batching dynamics, not the kernel times.

A second table checks the first wave: a whole benchmark of about ten prompts per client
(InferenceMAX's ``--num-prompts $((CONC * 10))``), every client starting at once and every
request counted (simulated for ten predicted request lifetimes, no warm-up), against
``predict_with(..., requests_per_client=10)``.

In both the simulated client sends its next prompt the instant the last one ends, so the
prompt reaches the engine exactly at an iteration boundary; ``apmw predict`` charges half an
iteration of arrival wait, as a real client's round trip puts arrivals anywhere in an
iteration. That is most of the gap on short prompts (200/200).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import numpy as np  # noqa: E402

from apmw.capacity.benchmark import predict_with  # noqa: E402
from apmw.perf import replica_from_spec, replica_with_step  # noqa: E402
from apmw.sim import simulate  # noqa: E402
from apmw.spec import Serving, spec_from_dict  # noqa: E402

MODEL, GPU, ISL, OSL = "meta-llama/Meta-Llama-3.1-8B", "H200", 1024, 512


def benchmark_spec(spread: float, isl: int | None = None, osl: int | None = None, *, model: str = MODEL,
                   gpu: str = GPU, tp: int = 1, dtype: str = "bf16", engine: str = "vllm", client_gap_s: float = 0.0,
                   overlap_scheduling: bool | None = None):
    """A fixed-concurrency benchmark as single-call tasks: lengths uniform over +-spread/2 of the mean,
    ``client_gap_s`` between a request's end and its client's next prompt (a tool wait), and the
    engine's ``overlap_scheduling`` (None: its default)."""
    isl, osl = ISL if isl is None else isl, OSL if osl is None else osl
    def lengths(mean: int):
        if spread == 0:
            return mean
        return {"quantiles": {str(q): mean * (1 - spread / 2 + spread * q) for q in (0.0, 0.25, 0.5, 0.75, 1.0)}}
    return spec_from_dict({
        "workload": {"steps_per_task": 1, "system_prompt_tokens": 0, "new_input_tokens_per_call": lengths(isl),
                     "output_tokens_per_call": lengths(osl), "tool_wait_s": client_gap_s},
        "model": {"config": model, "weight_dtype": dtype, "kv_dtype": dtype},
        "hardware": {"gpu": gpu, "gpus_per_replica": tp},
        "serving": {"max_batch": 1024, "max_batched_tokens": 8192, "prefix_caching": False, "engine": engine,
                    "overlap_scheduling": overlap_scheduling},
        "slo": {"task_latency_p95_s": 1e6},
        "cost": {"electricity_usd_per_kwh": 0.1, "gpu_hour_usd": 2.0},
    })


def client_gap() -> None:
    """How a client's round trip (end of one request to its next prompt) moves simulated TTFT.

    Llama-3.1-8B fp8 on one H100 with the TensorRT-LLM rules, 1000/1000 tokens: equal lengths
    (lock-step groups) and spread 0.2; statistics over the second half of 40 request lifetimes.
    """
    print("\nclient round trip: simulated steady-state TTFT (ms) by gap between a request's end and the next prompt")
    gaps = (0.0, 0.002, 0.01, 0.02)
    print(f"{'spread':>6} {'conc':>5} " + " ".join(f"{f'gap {g * 1e3:g} ms':>12}" for g in gaps))
    for spread in (0.0, 0.2):
        for c in (25, 100, 250):
            cells = []
            for gap in gaps:
                spec = benchmark_spec(spread, 1000, 1000, model=MODEL, gpu="H100", dtype="fp8", engine="trtllm",
                                      client_gap_s=gap)
                step = replica_from_spec(spec).step
                life = predict_with(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=1024, engine="trtllm")), 1000, 1000, c, length_spread=spread).e2e_latency_s
                sim = simulate(spec, c, duration_s=40 * life, warmup_s=20 * life, seed=1, start_together=True)
                cells.append(sim.to_dict()["ttft_s"]["mean"] * 1e3)
            print(f"{spread:>6} {c:>5} " + " ".join(f"{x:>12.1f}" for x in cells))


WHOLE_RUN_PROMPTS_PER_CLIENT = 10


def compare(name: str, cases, requests_per_client: int, run_s, engine: str = "vllm") -> None:
    """Predict and simulate each (isl, osl, spread, concurrency levels) case; print a table and the medians.

    ``run_s(prediction)`` gives ``(duration_s, warmup_s)`` of the simulated run.
    """
    print(f"\n{name}")
    print(f"{'isl/osl':>10} {'spread':>6} {'conc':>5} {'sim TTFT ms':>12} {'pred TTFT ms':>13} {'sim TPOT ms':>12}"
          f" {'pred TPOT ms':>13} {'lock-step':>10}")
    ttft_err, tpot_err = [], []
    for isl, osl, spread, levels in cases:
        spec = benchmark_spec(spread, isl, osl, engine=engine)
        step = replica_from_spec(spec).step
        for c in levels:
            p = predict_with(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=1024, engine=engine)), isl, osl, c, requests_per_client=requests_per_client, length_spread=spread)
            duration_s, warmup_s = run_s(p)
            sim = simulate(spec, c, duration_s=duration_s, warmup_s=warmup_s, seed=1, start_together=True).to_dict()
            s_ttft, s_tpot = sim["ttft_s"]["mean"], sim["tpot_s"]["mean"]
            ttft_err.append(abs(p.ttft_s / s_ttft - 1) * 100)
            tpot_err.append(abs(p.tpot_s / s_tpot - 1) * 100)
            print(f"{f'{isl}/{osl}':>10} {spread:>6} {c:>5} {s_ttft * 1e3:>12.1f} {p.ttft_s * 1e3:>13.1f}"
                  f" {s_tpot * 1e3:>12.2f} {p.tpot_s * 1e3:>13.2f} {p.lockstep_share:>10.2f}")
    print(f"{name}: median |predict / simulate - 1|: TTFT {statistics.median(ttft_err):.1f} %, "
          f"TPOT {statistics.median(tpot_err):.1f} % ({len(ttft_err)} points)")


def inferencemax_whole_runs() -> None:
    """gpt-oss-120b (MXFP4) on two H100s, vLLM, InferenceMAX's setting: lengths uniform in [0.8 L, L],
    ten prompts per client from a simultaneous start, every request counted; no request overhead."""
    print("\nInferenceMAX whole runs, gpt-oss-120b TP2 on H100 (TTFT ms, no request overhead)")
    print(f"{'isl/osl':>10} {'conc':>5} {'sim TTFT ms':>12} {'pred TTFT ms':>13}")
    for isl, osl in ((1024, 1024), (8192, 1024)):
        mi, mo = round(0.9 * isl), round(0.9 * osl)
        spec = benchmark_spec(0.2 / 0.9, mi, mo, model="openai/gpt-oss-120b", gpu="H100", tp=2, dtype="fp4")
        spec = spec.model_copy(update={"model": spec.model.model_copy(update={"kv_dtype": "bf16"})})
        step = replica_from_spec(spec).step
        for c in (4, 16, 64):
            p = predict_with(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=1024)), mi, mo, c, requests_per_client=WHOLE_RUN_PROMPTS_PER_CLIENT, length_spread=0.2 / 0.9)
            sim = simulate(spec, c, duration_s=WHOLE_RUN_PROMPTS_PER_CLIENT * p.e2e_latency_s, warmup_s=0.0, seed=1,
                           start_together=True).to_dict()
            print(f"{f'{isl}/{osl}':>10} {c:>5} {sim['ttft_s']['mean'] * 1e3:>12.1f} {p.ttft_s * 1e3:>13.1f}")


def open_loop(engine: str = "vllm") -> None:
    """Poisson arrivals (vLLM bench serve --request-rate, MLPerf Server): ``apmw predict --request-rate``
    (apmw.capacity.open_loop.predict_open_loop, no request overhead) against the simulator's open loop, 3,000
    requests at 20-90 % of the predicted capacity (Llama-3.1-8B bf16 on one H200)."""
    from apmw.capacity.benchmark import kv_fit_requests
    from apmw.capacity.open_loop import predict_open_loop
    from apmw.sim import simulate_open_loop

    print("\nopen loop (Poisson arrivals): TTFT and TPOT, ms")
    print(f"{'isl/osl':>10} {'load':>5} {'req/s':>6} {'sim TTFT':>9} {'pred TTFT':>10} {'sim TPOT':>9} {'pred TPOT':>10}")
    ttft_err, tpot_err = [], []
    for isl, osl in ((1024, 512), (300, 300)):
        spec = benchmark_spec(0.0, isl, osl, engine=engine)
        step = replica_from_spec(spec).step
        cap = min(1024, kv_fit_requests(replica_with_step(step), isl, osl))
        max_rate = cap / predict_with(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=1024, engine=engine)), isl, osl, cap, requests_per_client=10**9, length_spread=1.0).e2e_latency_s
        n = 3000
        prompt, out = np.full(n, isl), np.full(n, osl)
        for load in (0.2, 0.5, 0.8, 0.9):
            rate = load * max_rate
            p = predict_open_loop(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=1024, engine=engine)), isl, osl, rate)
            sim = simulate_open_loop(spec, prompt, out, rate, seed=1).to_dict()
            s_ttft, s_tpot = sim["ttft_s"]["mean"], sim["tpot_s"]["mean"]
            ttft_err.append(p.ttft_s / s_ttft - 1)
            tpot_err.append(p.tpot_s / s_tpot - 1)
            print(f"{f'{isl}/{osl}':>10} {load:>5} {rate:>6.1f} {s_ttft * 1e3:>9.1f} {p.ttft_s * 1e3:>10.1f}"
                  f" {s_tpot * 1e3:>9.2f} {p.tpot_s * 1e3:>10.2f}")
    print(f"open loop: predict / simulate - 1: TTFT {min(ttft_err):+.0%} to {max(ttft_err):+.0%}, "
          f"TPOT {min(tpot_err):+.0%} to {max(tpot_err):+.0%}")


def scheduled_ahead() -> None:
    """The extra wait of scheduling one iteration ahead (apmw.perf.serving_policy): steady-state TTFT with
    overlap scheduling less TTFT without it, predicted (one mean iteration) and simulated, Llama-3.1-8B
    bf16 on one H200, lengths spread 0.2, 64 clients starting together. Simulated twice: soon after the
    start (60 s, the first 15 s left out), while the clients' phases are still bunched from the
    simultaneous start, and long after it (1,200 s, the first 600 s left out)."""
    print("\nscheduling one iteration ahead: extra steady-state TTFT (ms), overlap on less off, 64 clients")
    print(f"{'engine':>7} {'isl/osl':>10} {'pred extra':>11} {'sim, 15-60 s':>13} {'sim, 600-1200 s':>16}")
    for engine in ("vllm", "sglang", "trtllm"):
        for isl, osl in ((1024, 512), (4096, 256)):
            cells = []
            for duration_s, warmup_s in ((60, 15), (1200, 600)):
                ttft = {}
                for overlap in (True, False):
                    s = benchmark_spec(0.2, isl, osl, engine=engine, overlap_scheduling=overlap)
                    p = predict_with(replica_with_step(replica_from_spec(s).step, Serving(max_batched_tokens=8192, max_batch=1024, engine=engine, overlap_scheduling=overlap)), isl, osl, 64, requests_per_client=10**9, length_spread=0.2)
                    sim = simulate(s, 64, duration_s=duration_s, warmup_s=warmup_s, seed=1, start_together=True)
                    ttft[overlap] = (p.ttft_s, sim.to_dict()["ttft_s"]["mean"])
                pred = ttft[True][0] - ttft[False][0]
                cells.append(ttft[True][1] - ttft[False][1])
            print(f"{engine:>7} {f'{isl}/{osl}':>10} {pred * 1e3:>11.1f} {cells[0] * 1e3:>13.1f} {cells[1] * 1e3:>16.1f}")


def kv_limit() -> None:
    """Concurrency beyond the KV limit, vLLM's admission by need on both sides: Llama-3.1-70B fp8 on one
    H200 (and 8B with 8k prompts; 70B on two H200s at 1k/8k), lengths spread 0.2, steady state over the last 24 of 30 predicted
    request cycles. ``full fit``: requests that fit at full length (isl + osl), what apmw assumed
    before session 5; ``pred R``: the running requests predicted (mean context isl + osl/2)."""
    from apmw.capacity.benchmark import kv_fit_requests

    print("\nbeyond the KV limit (vLLM): TTFT s, TPOT ms, running requests, preemptions per completed request")
    print(f"{'model':>7} {'isl/osl':>10} {'conc':>5} {'full fit':>8} {'pred R':>6} {'sim R':>6} {'sim TTFT':>9}"
          f" {'pred TTFT':>10} {'sim TPOT':>9} {'pred TPOT':>10} {'preempt':>8}")
    # (model size, GPUs, isl, osl, concurrency levels); the last is InferenceMAX's 1k/8k setting
    cases = [("70B", 1, 1024, 1024, (128, 192, 256, 384)), ("8B", 1, 8192, 1024, (128, 256, 512)),
             ("70B", 1, 200, 2000, (128, 256, 512)), ("70B", 1, 4096, 512, (64, 128, 256)),
             ("70B", 2, 1024, 8192, (128, 256, 384))]
    for size, tp, isl, osl, levels in cases:
        spec = benchmark_spec(0.2, isl, osl, model=f"meta-llama/Meta-Llama-3.1-{size}", gpu="H200", tp=tp,
                              dtype="fp8")
        step = replica_from_spec(spec).step
        full = kv_fit_requests(replica_with_step(step, Serving(engine="vllm")), isl, osl, full_length=True)
        for c in levels:
            p = predict_with(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=1024)), isl, osl, c, requests_per_client=10**9, length_spread=0.2)
            sim = simulate(spec, c, duration_s=30 * p.e2e_latency_s * c / p.running_requests, seed=1,
                           start_together=True).to_dict()
            preempt = sim["preemptions"] / max(sim["completed_tasks"], 1)
            print(f"{f'{size} x{tp}':>7} {f'{isl}/{osl}':>10} {c:>5} {full:>8} {p.running_requests:>6} {sim['decode_batch_mean']:>6.0f}"
                  f" {sim['ttft_s']['mean']:>9.2f} {p.ttft_s:>10.2f} {sim['tpot_s']['mean'] * 1e3:>9.1f}"
                  f" {p.tpot_s * 1e3:>10.1f} {preempt:>8.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration-s", type=float, default=300.0, help="simulated seconds per steady-state point")
    ap.add_argument("--client-gap", action="store_true",
                    help="also simulate the effect of a client's round trip on TTFT (about 2 minutes)")
    ap.add_argument("--open-loop", action="store_true",
                    help="also compare apmw predict --request-rate with the simulator's open loop (about 1 minute)")
    ap.add_argument("--inferencemax", action="store_true",
                    help="also simulate whole InferenceMAX runs of gpt-oss-120b on H100 (docs/accuracy.md)")
    ap.add_argument("--engine", default="vllm", choices=("vllm", "sglang", "trtllm"),
                    help="the engine's scheduling rules on both sides (sglang: prefill first, apmw.perf.serving_policy)")
    ap.add_argument("--scheduled-ahead", action="store_true",
                    help="also compare the extra wait of scheduling one iteration ahead, predicted and simulated "
                         "(about 2 minutes)")
    ap.add_argument("--kv-limit", action="store_true",
                    help="also compare concurrency beyond the KV limit, vLLM's admission by need (about 1 minute)")
    args = ap.parse_args()
    # steady state: statistics after the default warm-up (a fifth of the run), first wave excluded
    steady = [(ISL, OSL, spread, (8, 32, 64, 128)) for spread in (0.0, 0.01, 0.02, 0.05, 0.2)]
    steady += [(isl, osl, spread, (4, 16, 64)) for isl, osl in ((8192, 1024), (200, 200)) for spread in (0.0, 0.2)]
    compare("steady state", steady, 10**9, lambda p: (args.duration_s, 0.2 * args.duration_s), args.engine)
    # whole runs: ten request lifetimes from a simultaneous start, every request counted
    whole = [(ISL, OSL, 0.2, (8, 32, 64, 128, 256)), (ISL, OSL, 0.0, (8, 32, 128)),
             (8192, 1024, 0.2, (4, 16, 64)), (200, 200, 0.2, (16, 64, 256))]
    compare(f"whole runs ({WHOLE_RUN_PROMPTS_PER_CLIENT} prompts per client, first wave included)", whole,
            WHOLE_RUN_PROMPTS_PER_CLIENT, lambda p: (WHOLE_RUN_PROMPTS_PER_CLIENT * p.e2e_latency_s, 0.0),
            args.engine)
    if args.client_gap:
        client_gap()
    if args.inferencemax:
        inferencemax_whole_runs()
    if args.open_loop:
        open_loop(args.engine)
    if args.scheduled_ahead:
        scheduled_ahead()
    if args.kv_limit:
        kv_limit()


if __name__ == "__main__":
    main()
