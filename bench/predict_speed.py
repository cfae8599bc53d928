"""How fast is one `apmw predict`? (the issue asks for <= 20 ms in-process)

"rate warm ms" is one `--request-rate` prediction (open loop: a bisection over the running
requests, about a dozen fixed-concurrency solves) at half the replica's capacity.

Run: .venv/bin/python bench/predict_speed.py

Each case runs in a fresh interpreter, so "cold" includes reading the model config and
decompressing the kernel tables the replica needs; "warm" is the best of 20 repeats.
The baseline in the same process is building the model's Architecture from its
config.json (pure Python parsing, no tables), so warm / baseline is comparable across
machines.
"""

from __future__ import annotations

import json
import subprocess
import sys

CASES = [
    ("meta-llama/Meta-Llama-3.1-8B", "H200", 1, "bf16", "bf16", "vllm"),
    ("meta-llama/Meta-Llama-3.1-70B", "H200", 4, "fp8", "fp8", "trtllm"),
    ("openai/gpt-oss-120b", "H200", 2, "fp4", "bf16", "vllm"),
    ("deepseek-ai/DeepSeek-R1", "H200", 8, "fp8", "fp8", "sglang"),
    # the scaled roofline (apmw.perf.scaled): H200's calibrated iteration scaled to the B200
    ("meta-llama/Meta-Llama-3.1-70B", "B200", 2, "fp8", "fp8", "trtllm"),
]

CHILD = """
import json, sys, time
from apmw.arch import architecture_from_config, load_config
from apmw.capacity.benchmark import predict
from apmw.capacity.open_loop import predict_rate
model, gpu, tp, w, kv, engine = json.loads(sys.argv[1])
t = time.perf_counter()
p = predict(model, gpu, tp, w, kv, 1024, 1024, 64, engine=engine)
cold = time.perf_counter() - t
def best(fn, n=20):
    out = []
    for _ in range(n):
        t = time.perf_counter(); fn(); out.append(time.perf_counter() - t)
    return min(out)
warm = best(lambda: predict(model, gpu, tp, w, kv, 1024, 1024, 64, engine=engine))
# --request-rate (a bisection over the running requests) at half the replica's capacity in requests/s
saturated = predict(model, gpu, tp, w, kv, 1024, 1024, 10**5, engine=engine)
rate = 0.5 * saturated.output_tokens_per_s_per_gpu * tp / 1024
warm_rate = best(lambda: predict_rate(model, gpu, tp, w, kv, 1024, 1024, rate, engine=engine))
cfg, src = load_config(model)
base = best(lambda: architecture_from_config(cfg, model, src))
print(json.dumps({"cold_ms": cold * 1e3, "warm_ms": warm * 1e3, "warm_rate_ms": warm_rate * 1e3,
                  "baseline_ms": base * 1e3, "source": p.source}))
"""


def main() -> None:
    print(f"{'model':<32}{'tp':>3} {'engine':<7}{'source':<11}{'cold ms':>9}{'warm ms':>9}{'warm/baseline':>15}"
          f"{'rate warm ms':>14}")
    for case in CASES:
        out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(case)], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout)
        print(f"{case[0]:<32}{case[2]:>3} {case[5]:<7}{r['source']:<11}{r['cold_ms']:>9.1f}{r['warm_ms']:>9.2f}"
              f"{r['warm_ms'] / r['baseline_ms']:>15.1f}{r['warm_rate_ms']:>14.2f}")


if __name__ == "__main__":
    main()
