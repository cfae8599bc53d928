"""How much memory does an engine curve take to build at a large batch limit?

Run: .venv/bin/python bench/curve_memory.py [--max-batch 65536]

The coding agent's replica (examples/coding-agent.yaml) with its batch limit raised to ``--max-batch``. Every
batch size's row prices 34 counts of prompt chunks by 7 strata of their drawn sizes
(``apmw.capacity.engine_curve``), so the arrays of one build grow with the rows. ``engine_curve`` builds
``CURVE_BLOCK_ROWS`` rows at a time; the baseline, in the same process, builds all rows at once
(``build_engine_curve``). Prints each one's peak traced memory (tracemalloc: numpy's arrays), wall time and
the ratios, and checks that both give the same rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import numpy as np  # noqa: E402
import yaml  # noqa: E402

from apmw.capacity import engine_curve as curves  # noqa: E402
from apmw.capacity.sessions import sample_sessions  # noqa: E402
from apmw.perf import replica_from_spec  # noqa: E402
from apmw.spec import spec_from_dict  # noqa: E402


def _measured(build) -> tuple[curves.EngineCurve, float, float]:
    """(the curve, peak traced MiB, wall s) of ``build()``."""
    tracemalloc.start()
    t = time.perf_counter()
    curve = build()
    wall = time.perf_counter() - t
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return curve, peak, wall


def coding_agent_at(argv: list[str] | None = None, description: str = __doc__):
    """``--max-batch`` from the command line, and the coding agent's spec and replica at that batch limit."""
    ap = argparse.ArgumentParser(description=description.splitlines()[0])
    ap.add_argument("--max-batch", type=int, default=65536)
    args = ap.parse_args(argv)
    d = yaml.safe_load((ROOT / "examples" / "coding-agent.yaml").read_text())
    d["serving"]["max_batch"] = args.max_batch
    spec = spec_from_dict(d)
    return args, spec, replica_from_spec(spec)


def main() -> None:
    args, spec, replica = coding_agent_at()
    s = sample_sessions(spec, replica)
    curves.chunks_on_ranks(replica.step, s)          # the draws, kept per sample: made once, before either
    at_once, peak_once, wall_once = _measured(lambda: curves.build_engine_curve(replica.step, s, args.max_batch))
    curves._CURVES.clear()
    blocks, peak_blocks, wall_blocks = _measured(lambda: curves.engine_curve(replica.step, s, args.max_batch))
    same = all(np.array_equal(getattr(at_once, f.name), getattr(blocks, f.name))
               if isinstance(getattr(at_once, f.name), np.ndarray) else getattr(at_once, f.name) == getattr(blocks, f.name)
               for f in dataclasses.fields(at_once))
    print(f"coding-agent, {args.max_batch:,} batch sizes, blocks of {curves.CURVE_BLOCK_ROWS:,}")
    print(f"  all at once (baseline): peak {peak_once:8.1f} MiB  {wall_once:6.2f} s")
    print(f"  in blocks:              peak {peak_blocks:8.1f} MiB  {wall_blocks:6.2f} s")
    print(f"  memory {peak_once / peak_blocks:.1f}x less, time {wall_blocks / wall_once:.2f}x; same rows: {same}")


if __name__ == "__main__":
    main()
