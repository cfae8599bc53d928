"""How fast does `apmw search` plan a space, here and on a process pool or a Ray cluster, against `plan`?

Run: .venv/bin/python bench/search_speed.py [--ray] [--profile]

The space is 96 points of the bundled support-chat example (GPUs per replica x batch cap x engine x
KV dtype). Prints, in one process so that the machine's speed cancels:
- ``plan``'s time per spec, each point's spec planned directly (the baseline);
- the search in this process, and its ratio to the baseline (what the search machinery adds);
- the search on a local process pool of 2 workers (start-up included), and its speed-up over this process;
- with ``--profile``: where one search's time goes in this process (cProfile, cumulative seconds per
  point of the planner's main steps), then stops;
- with ``--ray``: the search on a local Ray cluster (started here, ``ray start --head``) with one
  node of one CPU, then with a second one-CPU node joined, and the speed-up 1 -> 2.
"""

from __future__ import annotations

import cProfile
import pstats
import socket
import subprocess
import sys
import time
from pathlib import Path

from plan_speed import EXAMPLES     # this folder: run as python bench/search_speed.py

from apmw import load_spec, plan
from apmw.design_search import search, spec_document
from apmw.design_search.space import points, with_settings
from apmw.errors import ApmwError
from apmw.spec import spec_from_dict

AXES = {"hardware.gpus_per_replica": [2, 4, 8], "serving.max_batch": [32, 48, 64, 96, 128, 192, 256, 512],
        "serving.engine": ["vllm", "sglang"], "model.kv_dtype": ["fp8", "bf16"]}
RAY = str(Path(sys.executable).parent / "ray")
NODE = ["--num-cpus", "1", "--object-store-memory", str(100 * 2**20), "--disable-usage-stats"]


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _plan_every_point(spec) -> None:
    base = spec_document(spec)
    for _, settings in points(AXES):
        try:
            plan(spec_from_dict(with_settings(base, settings)))
        except ApmwError:
            pass


def _ray_runs(spec) -> tuple[float, float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"127.0.0.1:{port}"
    try:
        subprocess.run([RAY, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
                        "--include-dashboard=false", *NODE], check=True, capture_output=True)
        one = _timed(lambda: search(spec, AXES, ray_address=address))
        subprocess.run([RAY, "start", "--address", address, "--node-ip-address", "127.0.0.1", *NODE],
                       check=True, capture_output=True)
        two = _timed(lambda: search(spec, AXES, ray_address=address))
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True)
    return one, two


# The planner's main steps, as cProfile names them: (file suffix, function) -> label.
STEPS = {("capacity/plan.py", "plan"): "plan (one point, all of it)",
         ("perf/replica.py", "replica_from_spec"): "  resolve the replica (step model, memory, power)",
         ("capacity/closed_loop.py", "closed_loop_model"): "  build the closed-loop model (samples, engine curves)",
         ("capacity/engine_curve.py", "engine_curve"): "    of which engine curves",
         ("capacity/search.py", "search"): "  the N* search and the binding counterfactual",
         ("capacity/closed_loop.py", "evaluate"): "    closed-loop evaluations (count: per point)",
         ("capacity/closed_loop.py", "_fixed_point"): "      of which the context-loss fixed points",
         ("capacity/evaluate.py", "evaluate"): "      of which tails and memory off the samples"}


def _profile(spec, n: int) -> None:
    profiler = cProfile.Profile()
    profiler.runcall(search, spec, AXES)
    stats = pstats.Stats(profiler).stats       # (file, line, function) -> (calls, primitive, tottime, cumtime, callers)
    print(f"{n} points of support-chat, one search in this process under cProfile (which slows it)")
    print(f"{'step':<58}{'ms/point':>10}{'calls/point':>13}")
    for (suffix, function), label in STEPS.items():
        rows = [v for (file, _, fn), v in stats.items() if fn == function and file.endswith(suffix)]
        calls, cum = sum(r[0] for r in rows), sum(r[3] for r in rows)
        print(f"{label:<58}{cum / n * 1e3:>10.2f}{calls / n:>13.1f}")


def main() -> None:
    spec = load_spec(EXAMPLES / "support-chat.yaml")
    n = len(list(points(AXES)))
    plan(spec)                                        # warm caches
    if "--profile" in sys.argv:
        _profile(spec, n)
        return
    t_plan = _timed(lambda: _plan_every_point(spec))
    t_here = _timed(lambda: search(spec, AXES))
    t_pool2 = _timed(lambda: search(spec, AXES, workers=2))
    print(f"{n} points of support-chat")
    print(f"{'run':<34}{'s':>7}{'ms/point':>10}{'points/s':>10}{'vs plan':>9}")
    rows = [("plan, each point's spec", t_plan), ("search, this process", t_here),
            ("search, process pool of 2", t_pool2)]
    if "--ray" in sys.argv:
        one, two = _ray_runs(spec)
        rows += [("search, Ray: 1 node x 1 CPU", one), ("search, Ray: 2 nodes x 1 CPU", two)]
    for name, t in rows:
        print(f"{name:<34}{t:>7.2f}{t / n * 1e3:>10.1f}{n / t:>10.1f}{t / t_plan:>9.2f}")
    print(f"speed-up 1 -> 2 workers: process pool {t_here / t_pool2:.2f}x (against this process)"
          + (f", Ray {rows[-2][1] / rows[-1][1]:.2f}x" if "--ray" in sys.argv else ""))


if __name__ == "__main__":
    main()
