"""Does the open-loop prediction wait for a running slot as the simulator does, near the batch limit?

Run: .venv/bin/python bench/slot_wait_vs_sim.py [--requests 6000] [--seeds 2]

For each case (Llama-3.1-8B bf16 on one H200, vLLM's rules, equal request lengths, a batch cap) and Poisson
arrival rate: the predicted mean TTFT and end-to-end time (``apmw.capacity.open_loop.predict_open_loop``, the
model ``apmw predict --request-rate`` runs) beside the simulator's mean over ``--seeds`` runs of ``--requests``
requests (``apmw.sim.simulate_open_loop``, seeds 0, 1, ...). The rates run up to the slots' capacity, where
the wait for a slot grows. Results in docs/accuracy.md, "What changed in session 57". About 20 s here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402
from predict_vs_sim import benchmark_spec  # noqa: E402

from apmw.capacity.open_loop import predict_open_loop  # noqa: E402
from apmw.perf import replica_from_spec  # noqa: E402
from apmw.sim import simulate_open_loop  # noqa: E402

# (prompt tokens, output tokens, batch cap, arrival rates per second)
CASES = [(1024, 256, 64, (17.0, 18.5, 19.5)), (300, 300, 32, (13.0, 15.0, 16.0)), (2048, 128, 128, (14.0, 16.0, 17.0))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=6000)
    ap.add_argument("--seeds", type=int, default=2)
    args = ap.parse_args()
    print(f"{'isl/osl, slots':<18}{'rate/s':>8}{'running':>9}{'TTFT ms':>9}{'slot wait ms':>14}{'sim TTFT ms':>20}"
          f"{'E2E s':>8}{'sim E2E s':>16}")
    for isl, osl, slots, rates in CASES:
        spec = benchmark_spec(0.0, isl, osl)
        spec = spec.model_copy(update={"serving": spec.serving.model_copy(update={"max_batch": slots})})
        replica = replica_from_spec(spec)
        for rate in rates:
            p = predict_open_loop(replica, isl, osl, rate)
            sims = [simulate_open_loop(spec, np.full(args.requests, isl), np.full(args.requests, osl), rate,
                                       seed=k).to_dict() for k in range(args.seeds)]
            ttft = sorted(d["ttft_s"]["mean"] * 1e3 for d in sims)
            e2e = sorted(d["task_latency_s"]["mean"] for d in sims)
            print(f"{f'{isl}/{osl}, {slots}':<18}{rate:>8.1f}{p.running_requests:>9}{p.ttft_s * 1e3:>9.0f}"
                  f"{p.ttft_parts_s['slot_queue'] * 1e3:>14.0f}{f'{ttft[0]:.0f}-{ttft[-1]:.0f}':>20}"
                  f"{p.e2e_latency_s:>8.2f}{f'{e2e[0]:.2f}-{e2e[-1]:.2f}':>16}", flush=True)


if __name__ == "__main__":
    main()
