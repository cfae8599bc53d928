"""Does the analytic TTFT p95 follow the simulator's, from one agent to a busy engine?

Run: .venv/bin/python bench/ttft_vs_sim.py [--seeds 3] [--calls 10000] [--only NAME]

For each case (a bundled example, or one with a changed axis) and agent count: the analytic TTFT p95
(``apmw plan SPEC --agents N``) and the simulator's in ``--seeds`` seeded runs (``apmw simulate SPEC
--agents N --duration-s T --seed K``, K = 100, 101, ...), each long enough for about ``--calls`` calls
after its warm-up, with the runs' median, range and the analytic figure over the median. The cases:

* support-chat as bundled (Llama-3.1-70B FP8 on 2 x H100: long, heavy-tailed prompts, 1.5 calls a task);
* support-chat without prefix caching (every call prefills its whole context);
* support-chat on 4 x H100 with TensorRT-LLM (a busy engine: 86-97 % utilisation at 75-115 agents);
* deep-research and coding-agent as bundled (short follow-up prompts on a long cached context).

Fitted on nothing: it reads both models as they are.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import numpy as np  # noqa: E402

from apmw import load_spec, plan  # noqa: E402
from apmw.sim import simulate  # noqa: E402
from apmw.sim.run import MAX_DURATION_S  # noqa: E402


def _changed(spec, **sections):
    return spec.model_copy(update={name: getattr(spec, name).model_copy(update=values)
                                   for name, values in sections.items()})


def cases():
    chat = load_spec(ROOT / "examples" / "support-chat.yaml")
    return [
        ("support-chat", chat, (1, 5, 11, 15, 20, 25)),
        ("support-chat, no prefix caching", _changed(chat, serving={"prefix_caching": False}), (1, 2, 3, 4, 5)),
        ("support-chat, 4 x H100, TensorRT-LLM",
         _changed(chat, hardware={"gpus_per_replica": 4}, serving={"engine": "trtllm"}), (50, 75, 95, 115)),
        ("deep-research", load_spec(ROOT / "examples" / "deep-research.yaml"), (5, 12, 17)),
        ("coding-agent", load_spec(ROOT / "examples" / "coding-agent.yaml"), (10, 20, 27)),
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=10_000, help="calls per simulated run, about (after the warm-up)")
    ap.add_argument("--only", default=None, help="run the cases whose name starts with this")
    args = ap.parse_args()
    print(f"{'case':<38}{'agents':>7}{'analytic s':>11}{'sim median s':>13}{'sim range s':>15}{'ratio':>7}"
          f"{'runs s':>9}")
    for name, spec, counts in cases():
        if args.only and not name.startswith(args.only):
            continue
        for n in counts:
            p = plan(spec, agents=n)
            calls_per_s = p.to_dict()["sessions_per_s"] * p.sample.mean_calls
            duration = min(args.calls / calls_per_s / 0.8, MAX_DURATION_S)
            t = time.perf_counter()
            sims = sorted(float(np.quantile(simulate(spec, n, duration_s=duration, seed=100 + k).samples["ttft_s"], 0.95))
                          for k in range(args.seeds))
            wall = time.perf_counter() - t
            mid = statistics.median(sims)
            print(f"{name:<38}{n:>7}{p.at.ttft_p95_s:>11.3f}{mid:>13.3f}{f'{sims[0]:.3f}-{sims[-1]:.3f}':>15}"
                  f"{p.at.ttft_p95_s / mid:>7.2f}{wall:>9.1f}", flush=True)


if __name__ == "__main__":
    main()
