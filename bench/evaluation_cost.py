"""What one closed-loop evaluation costs, and how much of it is array work over the session sample.

Run: .venv/bin/python bench/evaluation_cost.py

A plan's N* search evaluates the closed loop at a dozen agent counts (``capacity.search``), and a
search over a design space does so for every point: those evaluations are most of a point's time
(``bench/search_speed.py --profile``). Per bundled example this prints the agent counts the search
asks, the milliseconds one evaluation takes at the example's own sample (sessions and tail calls,
``capacity.sessions``), and at a sample ``1/SHRINK`` of that size, in the same process. Taking an
evaluation's time as a fixed part plus a part in proportion to the sample, the two give the part in
proportion (array work: what batching evaluations across points into larger arrays would still
do) and the fixed part (per-call overhead: what it could save). The last column is the most points
a second that batching could reach on one core, were the fixed part gone entirely:
``1 / (evaluations x proportional part)``. For scale, the last two columns give the whole analytic plan of the
example as a search's point pays it (its sample already drawn: points share one) and the evaluations' share of it.

The smaller sample is for timing only; plans use the full one (its size sets the tails' spread,
``bench/plan_speed.py``).
"""

from __future__ import annotations

import time
from pathlib import Path

from apmw import load_spec, plan
from apmw.capacity import sessions
from apmw.capacity.closed_loop import closed_loop_model
from apmw.capacity.search import search
from apmw.perf import replica_from_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SHRINK = 20
SIZES = ("SESSION_SAMPLES", "TARGET_CALLS", "MAX_SESSION_SAMPLES", "TAIL_CALLS")


def _sample_scaled(scale: float) -> None:
    """Every sample size of ``capacity.sessions`` at ``scale`` times its default (forgetting kept samples)."""
    for name in SIZES:
        setattr(sessions, name, max(1, int(DEFAULTS[name] * scale)))
    sessions._SAMPLES.clear()


DEFAULTS = {name: getattr(sessions, name) for name in SIZES}


def ms_per_evaluation(spec, scale: float, agents: list[int] | None = None,
                      repeats: int = 3) -> tuple[float, list[int], int, int]:
    """(ms per evaluation, the agent counts the N* search asks, sessions, tail calls) at ``scale``, the
    evaluations timed at ``agents`` (default: those counts)."""
    _sample_scaled(scale)
    replica = replica_from_spec(spec)
    model = closed_loop_model(spec, replica)
    asked: list[int] = []
    evaluate = model.evaluate

    def counted(n: int):
        asked.append(n)
        return evaluate(n)

    model.evaluate = counted                                       # type: ignore[method-assign]
    search(spec, replica, model.sample, model)
    model.evaluate = evaluate                                      # type: ignore[method-assign]
    timed = agents or asked
    for n in timed:                                                # build the curves as far as they are read
        evaluate(n)
    best = float("inf")
    for _ in range(repeats):                                       # the curves are built: time the evaluations
        t = time.perf_counter()
        for n in timed:
            evaluate(n)
        best = min(best, (time.perf_counter() - t) / len(timed))
    return best * 1e3, asked, model.sample.sessions, len(model.sample.call_queue_exp)


def _timed_ms(fn) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def main() -> None:
    print(f"{'example':<15}{'evals':>6}{'sessions':>9}{'tail calls':>11}{'ms/eval':>9}"
          f"{f'ms at 1/{SHRINK}':>12}{'ratio':>7}{'array ms':>10}{'fixed ms':>10}{'points/s bound':>16}"
          f"{'plan ms':>9}{'evals share':>13}")
    for path in sorted(EXAMPLES.glob("*.yaml")):
        spec = load_spec(path)
        full, asked, n_sessions, tail = ms_per_evaluation(spec, 1.0)
        small, _, _, _ = ms_per_evaluation(spec, 1.0 / SHRINK, asked)
        proportional = max(full - small, 0.0) / (1.0 - 1.0 / SHRINK)
        fixed = full - proportional
        bound = 1e3 / (len(asked) * proportional) if proportional > 0 else float("inf")
        _sample_scaled(1.0)
        plan(spec)                                                 # the sample drawn, as a search's points share it
        plan_ms = min(_timed_ms(lambda: plan(spec)) for _ in range(3))
        print(f"{path.stem:<15}{len(asked):>6}{n_sessions:>9,}{tail:>11,}{full:>9.2f}{small:>12.2f}"
              f"{small / full:>7.2f}{proportional:>10.2f}{fixed:>10.2f}{bound:>16,.0f}"
              f"{plan_ms:>9.1f}{len(asked) * full / plan_ms:>13.0%}")
    _sample_scaled(1.0)


if __name__ == "__main__":
    main()
