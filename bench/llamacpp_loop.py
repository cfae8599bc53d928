"""Does the plan from a llama.cpp server's calibration put its knee where the server has it? (issue 20, item 5)

Run: .venv/bin/python bench/llamacpp_loop.py [--runs 1] [--out DIR]

For each server shape and workload of bench/README.md "The llama.cpp loop" (the knee and loop workloads,
``tests/loadgen/llamacpp-{knee,loop}-{4,8}slots.yaml``, on a 4- and an 8-slot server), starts the tiny test
model's server on CPU 0 (this process and the load generator on CPU 1) and runs what
``tests/loadgen/test_llamacpp_loop.py`` runs on the first of them: 30 s of 8 agents to warm it up, a
calibration with the warm-up's steps under load, ``apmw plan --calibration``, the two 60 s levels that
bound the claim "the measured knee lies within 15 % (or one agent) of the planned N*", and a plan from a
calibration taken after them. Prints each level's task p95 with its 95 % interval and whether the claim
holds against the later plan (``claim_failures``: no level surely on the wrong side of the knees it admits).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))       # tests.loadgen: the tiny model, its server and the procedure

from tests.loadgen.conftest import CLIENT_CPUS, SERVER_CPUS, start_server  # noqa: E402
from tests.loadgen.test_llamacpp_loop import around_the_plan, claim_failures, level_text  # noqa: E402
from tests.loadgen.tiny_model import write_tiny_llama  # noqa: E402

CASES = (("llamacpp-knee-4slots.yaml", 4), ("llamacpp-knee-8slots.yaml", 8),
         ("llamacpp-loop-4slots.yaml", 4), ("llamacpp-loop-8slots.yaml", 8))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1, help="runs of each case, one after another")
    ap.add_argument("--out", type=Path, default=None, help="keep the runs' files here (default: a temporary folder)")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2:
        os.sched_setaffinity(0, CLIENT_CPUS)
    with tempfile.TemporaryDirectory() as scratch:
        out = args.out or Path(scratch)
        model, config = write_tiny_llama(out / "tiny")
        for name, slots in CASES:
            for r in range(args.runs):
                server = start_server(model, config, slots=slots, cpus=SERVER_CPUS)
                work = out / f"{Path(name).stem}-{r}"
                work.mkdir(parents=True, exist_ok=True)
                try:
                    run = around_the_plan(ROOT / "tests" / "loadgen" / name, server, work)
                finally:
                    server.kill()
                bracketed = all(lv["task_latency_p95_interval_s"] is not None for lv in run["levels"])
                failures = claim_failures(run) if bracketed else ["too few tasks to bracket a p95"]
                print(f"{name} run {r + 1}: {'FAILS: ' + '; '.join(failures) if failures else 'holds'}", flush=True)
                for level in run["levels"]:
                    print("  " + level_text(run, level), flush=True)


if __name__ == "__main__":
    main()
