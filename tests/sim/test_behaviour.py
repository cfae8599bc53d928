"""Determinism, conservation, KV policies, preemption, open loop."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from apmw.errors import ApmwError
from apmw.sim import simulate, simulate_open_loop
from tests.sim.helpers import kv_fraction_for, spec

DATA = Path(__file__).parent / "data"


def _strip(d: dict) -> dict:
    d = dict(d)
    d.pop("wall_s")
    return d


def test_same_seed_same_output_and_seed_matters():
    s = spec(tool_wait_kv_policy="evict", kv_memory_fraction=kv_fraction_for(15000))
    a = simulate(s, 8, duration_s=200, seed=11).to_dict(timeseries=True)
    b = simulate(s, 8, duration_s=200, seed=11).to_dict(timeseries=True)
    c = simulate(s, 8, duration_s=200, seed=12).to_dict(timeseries=True)
    assert _strip(a) == _strip(b)
    assert a["task_latency_s"] != c["task_latency_s"]


@pytest.mark.parametrize("policy", ["retain", "evict", "ttl", "offload"])
def test_conservation(policy):
    """Every generated token is accounted for, blocks stay within [0, capacity] (checked before every step by
    Engine.check_invariants), every started task has ended or is the agent's open one."""
    extra = {"ttl_s": 2.0} if policy == "ttl" else {}
    s = spec(tool_wait_kv_policy=policy, kv_memory_fraction=kv_fraction_for(10000), **extra)
    r = simulate(s, 10, duration_s=150, seed=5, check=True)
    assert r.generated_tokens == r.output_tokens_completed + r.output_tokens_in_flight
    assert r.tasks_started == r.tasks_ended + r.agents            # one open task per agent at the end
    assert 0 < r.kv_blocks_used_max <= r.kv_blocks_capacity
    assert r.completed_tasks > 0 and r.tasks_running >= 0
    # each call's first token comes out of a prefill iteration, the others out of decode iterations
    assert r.decode_tokens < r.generated_tokens
    assert r.prefill_tokens > 0


def test_policy_ordering_on_a_memory_bound_workload():
    """retain holds more KV-token-seconds than evict; evict prefills more tokens than retain.

    Memory is tight enough that the LRU cache loses histories under evict and retain must spill some pins.
    With an LRU prefix cache the prefill gap is modest (evict only misses what was evicted): the analytic
    plan's always-miss assumption is far more pessimistic (docs/simulate.md)."""
    kv = kv_fraction_for(30000)
    runs = {p: simulate(spec(tool_wait_kv_policy=p, kv_memory_fraction=kv), 12, duration_s=300, seed=2)
            for p in ("retain", "evict")}
    retain, evict = runs["retain"], runs["evict"]
    assert retain.kv_tokens_resident_mean > 2 * evict.kv_tokens_resident_mean
    assert evict.prefill_tokens > 1.05 * retain.prefill_tokens
    assert retain.spills > 0            # memory-bound: retain had to give up some pins
    assert evict.prefix_hit_rate > retain.prefix_hit_rate   # evict looks up every history, retain only spilled ones


def test_evict_hits_the_prefix_cache_when_memory_is_ample_and_misses_when_tight():
    """The analytic plan assumes evict always misses; with room the freed history survives and hits."""
    ample = simulate(spec(tool_wait_kv_policy="evict"), 8, duration_s=200, seed=4)
    tight = simulate(spec(tool_wait_kv_policy="evict", kv_memory_fraction=kv_fraction_for(8000)), 8,
                     duration_s=200, seed=4)
    retain = simulate(spec(), 8, duration_s=200, seed=4)
    # with room, evict recomputes only the partial last block of each history on top of what retain prefills
    assert ample.prefill_tokens < 1.15 * retain.prefill_tokens
    assert tight.prefix_hit_rate < ample.prefix_hit_rate - 0.2


def test_preemption_appears_only_when_memory_is_forced_small():
    roomy = simulate(spec(), 12, duration_s=200, seed=1)
    small = simulate(spec(kv_memory_fraction=kv_fraction_for(6000)), 12, duration_s=200, seed=1)
    assert roomy.preemptions == 0
    assert small.preemptions > 0
    assert small.task_latency["mean"] > roomy.task_latency["mean"]


def test_gpu_override_with_small_hbm_preempts():
    from apmw.spec import spec_from_dict
    from tests.sim.helpers import BASE
    import copy

    d = copy.deepcopy(BASE)
    d["hardware"]["gpu"] = {"name": "H100", "hbm_bytes": 23.5e9}
    r = simulate(spec_from_dict(d), 12, duration_s=150, seed=1)
    assert r.kv_tokens_capacity < 20000 and r.preemptions > 0


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ApmwError, match="agents"):
        simulate(spec(), 0)
    with pytest.raises(ApmwError, match="warmup_s"):
        simulate(spec(), 2, duration_s=10, warmup_s=20)


def _azure_subset() -> tuple[np.ndarray, np.ndarray]:
    with open(DATA / "azure_conv_2023_head200.csv") as f:
        rows = list(csv.DictReader(f))
    return (np.array([int(r["ContextTokens"]) for r in rows]), np.array([int(r["GeneratedTokens"]) for r in rows]))


def test_open_loop_runs_every_request_and_fast_equals_plain():
    prompt, out = _azure_subset()
    s = spec(max_batch=128)
    fast = simulate_open_loop(s, prompt, out, rate_per_s=4.0, seed=0)
    plain = simulate_open_loop(s, prompt, out, rate_per_s=4.0, seed=0, fast=False)
    assert fast.completed_tasks == len(prompt) == plain.completed_tasks
    assert fast.generated_tokens == int(out.sum())
    assert fast.iterations == plain.iterations
    assert fast.task_latency["mean"] == pytest.approx(plain.task_latency["mean"], rel=1e-9)
    # a request takes at least its own prefill and decode iterations
    assert fast.ttft["p50"] > 0 and fast.task_latency["p50"] > fast.ttft["p50"]


def test_meets_slo_checks_ttft_and_tpot_when_the_spec_sets_them():
    import copy

    from apmw.spec import spec_from_dict
    from tests.sim.helpers import BASE

    d = copy.deepcopy(BASE)
    loose = simulate(spec_from_dict(d), 4, duration_s=120, seed=1)
    d["slo"]["ttft_p95_s"] = 1e-4                       # no prefill is that fast
    tight = simulate(spec_from_dict(d), 4, duration_s=120, seed=1)
    assert loose.meets_slo and not tight.meets_slo
    assert tight.task_latency == loose.task_latency


def test_replayed_tasks_match_the_same_constant_workload():
    """Replaying a task equals sampling it from constant distributions (which draw no random numbers)."""
    from apmw.sim import TaskShape
    from tests.sim.helpers import spec_with

    s = spec_with(workload={"steps_per_task": 3, "calls_per_step": 2, "new_input_tokens_per_call": 200,
                            "output_tokens_per_call": 50, "tool_wait_s": 1.5})
    task = TaskShape(new_input_tokens=[200] * 6, output_tokens=[50] * 6, wait_after_s=[0, 1.5] * 3)
    sampled = simulate(s, 6, duration_s=120, seed=9).to_dict()
    replayed = simulate(s, 6, duration_s=120, seed=9, tasks=[task]).to_dict()
    sampled.pop("wall_s"), replayed.pop("wall_s")
    assert sampled == replayed
    assert sampled["task_output_tokens_mean"] == 300
    with pytest.raises(ApmwError, match="same length"):
        simulate(s, 2, duration_s=60, tasks=[TaskShape([1, 2], [3], [0.0])])
