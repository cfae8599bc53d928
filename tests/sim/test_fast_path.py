"""The event-skipping fast path gives the plain iteration-by-iteration loop's results."""

from __future__ import annotations

import math

import pytest

from apmw.sim import simulate
from tests.sim.helpers import kv_fraction_for, spec, spec_with

CASES = {
    "retain, ample memory": (spec(), 8),
    "evict, tight memory (preemption, LRU hits)": (spec(tool_wait_kv_policy="evict",
                                                        kv_memory_fraction=kv_fraction_for(12000)), 10),
    "retain, tight memory (spills)": (spec(kv_memory_fraction=kv_fraction_for(8000)), 10),
    "ttl": (spec(tool_wait_kv_policy="ttl", ttl_s=3.0, kv_memory_fraction=kv_fraction_for(20000)), 10),
    "offload": (spec(tool_wait_kv_policy="offload", offload_bandwidth_bytes_per_s=2e9), 6),
    "no prefix caching, small batch": (spec(prefix_caching=False, max_batch=4, max_batched_tokens=512), 8),
    "sliding-window model": (spec_with(model="openai/gpt-oss-20b"), 6),
    "SGLang: prefill first, tight memory": (spec(engine="sglang", tool_wait_kv_policy="evict",
                                                 kv_memory_fraction=kv_fraction_for(12000)), 10),
    "TensorRT-LLM: reserved to the end, tight memory": (
        spec(engine="trtllm", kv_memory_fraction=kv_fraction_for(8000, "trtllm")), 10),
    "SGLang: more running than the token budget": (spec(engine="sglang", max_batched_tokens=16), 40),
    # the engines schedule one iteration ahead by default; the plain next-iteration rule is its own path
    "no overlap scheduling, ample memory": (spec(overlap_scheduling=False), 8),
    "no overlap scheduling, evict, tight memory": (spec(overlap_scheduling=False, tool_wait_kv_policy="evict",
                                                        kv_memory_fraction=kv_fraction_for(12000)), 10),
    "SGLang without its overlap scheduler, tight memory": (
        spec(engine="sglang", overlap_scheduling=False, tool_wait_kv_policy="evict",
             kv_memory_fraction=kv_fraction_for(12000)), 10),
    # arrivals wait for the scheduler's next poll, which the fast path finds by counting iterations
    "SGLang polling every 10 decode iterations": (spec(engine="sglang", scheduler_recv_interval=10), 10),
    # speculative decoding: each sequence keeps its own number of tokens an iteration (positions worked out
    # in advance), drafts' blocks taken for the iteration and the rejected ones' freed
    "speculative decoding, ample memory": (spec(speculative={"draft_tokens": 3, "acceptance_rate": 0.7}), 8),
    "speculative decoding, one draft at 80 % (whole cuts every fifth iteration)": (
        spec(speculative={"draft_tokens": 1, "acceptance_rate": 0.8}), 8),
    "speculative decoding, evict, tight memory": (
        spec(speculative={"draft_tokens": 2, "acceptance_rate": 0.8, "draft_cost_fraction": 0.05},
             tool_wait_kv_policy="evict", kv_memory_fraction=kv_fraction_for(12000)), 10),
    "SGLang polling every 7, no overlap scheduler, tight memory": (
        spec(engine="sglang", scheduler_recv_interval=7, overlap_scheduling=False, tool_wait_kv_policy="evict",
             kv_memory_fraction=kv_fraction_for(12000)), 10),
}


def _same(fast: dict, plain: dict) -> list[str]:
    diffs = []
    for key, a in fast.items():
        b = plain[key]
        if key == "wall_s":
            continue
        if isinstance(a, dict):
            diffs += [f"{key}.{k}" for k in a if not _close(a[k], b[k])]
        elif not _close(a, b):
            diffs.append(f"{key}: {a} != {b}")
    return diffs


def _close(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_fast_path_equals_plain_loop(name):
    s, agents = CASES[name]
    fast = simulate(s, agents, duration_s=100, seed=3, warmup_s=20)
    plain = simulate(s, agents, duration_s=100, seed=3, warmup_s=20, fast=False)
    assert plain.completed_tasks > 0
    assert fast.iterations == plain.iterations
    assert not _same(fast.to_dict(), plain.to_dict())


def test_fast_path_skips_iterations():
    """The point of the fast path: far fewer Python steps than iterations (measured via wall time ratio in
    bench/sim_speed.py; here through the engine's own counters)."""
    from apmw.perf import replica_from_spec
    from apmw.sim.agents import ClosedLoopAgents
    from apmw.sim.engine import Engine
    import numpy as np

    s = spec()
    calls = {"n": 0}
    driver = ClosedLoopAgents(s, 8, np.random.default_rng(0), 20.0, 200.0, 200.0)
    eng = Engine(replica_from_spec(s), s.serving, s.workload.system_prompt_tokens, driver, window=(20.0, 200.0))
    original = eng.step_once

    def counted():
        calls["n"] += 1
        return original()

    eng.step_once = counted
    driver.attach(eng)
    eng.run()
    assert eng.stats.iterations > 5 * calls["n"]
