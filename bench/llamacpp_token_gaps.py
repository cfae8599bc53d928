"""Where does a llama.cpp server's time per output token go under closed-loop agents? (issue 20, item 5)

Run: .venv/bin/python bench/llamacpp_token_gaps.py [--agents 6 10] [--duration-s 40] [--spec SPEC] [--out DIR]

Starts the tiny test model's server (tests/loadgen/serve_tiny.py, 4 slots, one thread) on CPU 0 and
keeps this process (the load generator) on CPU 1, calibrates it (``apmw bench --calibrate``), runs each
level of closed-loop agents (the knee workload by default) recording the arrival time of every streamed
token, and calibrates again. Printed per level:

- every call's gaps between consecutive tokens, as a distribution, and the share of the decode time in
  gaps over 20 / 50 / 100 ms: iterations that carried another call's prompt (llama.cpp prefills a whole
  prompt in one iteration, stalling every decode in it);
- the gaps under 20 ms by how many calls were decoding at the time: the plain decode step;
- the same figures predicted from the calibration taken after the levels, analytically (``apmw plan
  --agents N``) and simulated (900 s, seed 1): task p95, TTFT p95, TPOT mean and p95.

The token times are the calls' own ``token_times_s`` in the results files (one per level, kept in
``--out``); ``apmw bench --calibrate --loop-results`` reads the same gaps (``apmw.loadgen.loop_steps``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))       # tests.loadgen: the tiny model and its server

from apmw import load_spec, plan  # noqa: E402
from apmw.loadgen.bench import run_bench  # noqa: E402
from apmw.loadgen.calibrate import measure_calibration, read_calibration, step_model_from_calibration  # noqa: E402
from apmw.loadgen.results import read_records, summarise  # noqa: E402
from apmw.loadgen.runner import RunConfig  # noqa: E402
from apmw.perf import replica_from_spec  # noqa: E402
from apmw.sim import simulate  # noqa: E402
from tests.loadgen.conftest import CLIENT_CPUS, SERVER_CPUS, start_server  # noqa: E402
from tests.loadgen.tiny_model import write_tiny_llama  # noqa: E402

STALL_THRESHOLDS_S = (0.02, 0.05, 0.1)


def token_times(records: list[dict]) -> list[list[float]]:
    """Each ok call's token arrival times on its segment's clock."""
    return [[r["start_s"] + t for t in r["token_times_s"]] for r in records
            if r.get("type") == "call" and r.get("ok") and r.get("token_times_s")]


def gap_figures(calls: list[list[float]]) -> str:
    """The distribution of inter-token gaps, their stall share, and the plain step by decoding calls."""
    spans = [(t[0], t[-1]) for t in calls if len(t) > 1]
    starts, ends = np.array([a for a, _ in spans]), np.array([b for _, b in spans])
    gaps, decoding = [], []
    for t in calls:
        t = np.asarray(t)
        if len(t) < 3:
            continue
        mid = (t[1:] + t[:-1]) / 2
        gaps.append(np.diff(t))
        decoding.append(((starts[None, :] <= mid[:, None]) & (mid[:, None] <= ends[None, :])).sum(axis=1))
    g, d = np.concatenate(gaps), np.concatenate(decoding)
    lines = [f"  {len(g)} gaps: mean {g.mean() * 1e3:.2f} ms, p50 {np.median(g) * 1e3:.2f}, "
             f"p90 {np.percentile(g, 90) * 1e3:.2f}, p99 {np.percentile(g, 99) * 1e3:.1f}"]
    lines += [f"  gaps over {s * 1e3:.0f} ms: {(g > s).mean():.1%} of gaps, {g[g > s].sum() / g.sum():.1%} of decode time"
              for s in STALL_THRESHOLDS_S]
    plain = g < STALL_THRESHOLDS_S[0]
    lines += [f"  {b} decoding: {(plain & (d == b)).sum()} gaps under 20 ms, median {np.median(g[plain & (d == b)]) * 1e3:.2f} ms"
              for b in range(1, int(d.max()) + 1) if (plain & (d == b)).sum() >= 20]
    return "\n".join(lines)


def predicted_figures(spec, step, agents: int) -> str:
    p = plan(spec, agents=agents, step=step).to_dict()
    s = simulate(spec, agents, duration_s=900, seed=1, replica=replica_from_spec(spec, step=step)).to_dict()
    return (f"  analytic:  task p95 {p['task_latency_s']['p95']:.2f} s, TTFT p95 {p['ttft_p95_s']:.3f} s, "
            f"TPOT mean {p['time_per_output_token_s'] * 1e3:.1f} ms, p95 {p['tpot_p95_s'] * 1e3:.1f} ms\n"
            f"  simulated: task p95 {s['task_latency_s']['p95']:.2f} s, TTFT p95 {s['ttft_s']['p95']:.3f} s, "
            f"TPOT mean {s['tpot_s']['mean'] * 1e3:.1f} ms, p95 {s['tpot_s']['p95'] * 1e3:.1f} ms "
            f"({s['completed_tasks']} tasks)")


def measured_figures(level: dict) -> str:
    return (f"  measured:  task p95 {level['task_latency_s']['p95']:.2f} s, TTFT p95 {level['ttft_p95_s']:.3f} s, "
            f"TPOT mean {level['time_per_output_token_s'] * 1e3:.1f} ms, p95 {level['tpot_p95_s'] * 1e3:.1f} ms "
            f"({level['completed_tasks']} tasks)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, nargs="+", default=[6, 10])
    ap.add_argument("--duration-s", type=float, default=40.0)
    ap.add_argument("--spec", type=Path, default=ROOT / "tests/loadgen/llamacpp-knee-4slots.yaml")
    ap.add_argument("--out", type=Path, default=Path("/tmp/apmw-token-gaps"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2:
        os.sched_setaffinity(0, CLIENT_CPUS)
    model, config = write_tiny_llama(args.out / "tiny")
    doc = yaml.safe_load(args.spec.read_text())
    doc["model"]["config"] = str(config)
    spec_path = args.out / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(doc))
    spec = load_spec(spec_path)
    server = start_server(model, config, slots=doc["serving"]["max_batch"], cpus=SERVER_CPUS)
    try:
        asyncio.run(measure_calibration(server.url, "tiny", args.out / "cal-before.json"))
        levels = {}
        for n in args.agents:
            out = args.out / f"level-{n}.jsonl"
            out.unlink(missing_ok=True)
            asyncio.run(run_bench(RunConfig(endpoint=server.url, model="tiny", agents=n, duration_s=args.duration_s,
                                            warmup_s=5, seed=2, workload=doc["workload"], slo=doc["slo"]), [n], out))
            records = read_records(out)
            levels[n] = (token_times(records), summarise(records)["levels"][0])
        asyncio.run(measure_calibration(server.url, "tiny", args.out / "cal-after.json"))
    finally:
        server.kill()
    step = step_model_from_calibration(read_calibration(args.out / "cal-after.json"), spec)
    print(f"calibration after the levels: {step.fit_report}")
    for n, (calls, level) in levels.items():
        print(f"{n} agents, {len(calls)} calls")
        print(gap_figures(calls))
        print(measured_figures(level))
        print(predicted_figures(spec, step, n))


if __name__ == "__main__":
    main()
