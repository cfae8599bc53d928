"""llama.cpp's per-slot prompt cache (apmw.sim.slots) and the llamacpp engine around it."""

from __future__ import annotations

import copy

import pytest

from apmw.capacity.closed_loop import closed_loop_model
from apmw.perf import replica_from_spec
from apmw.sim.run import simulate
from apmw.sim.slots import SlotPromptCache
from apmw.spec import SpecError, spec_from_dict
from tests.sim.helpers import BASE, spec_with

SHARED = 200


def _cache(slots: int = 4, shared: int = SHARED) -> SlotPromptCache:
    return SlotPromptCache(slots, shared)


def test_empty_slots_go_by_lru_and_the_last_slot_wins_a_tie():
    c = _cache()
    assert c.choose(ctx=1, prompt_tokens=300) == (3, 0)     # llama.cpp's log: "selected slot by LRU" id 3 first
    c.take(1, 300)
    assert c.choose(ctx=2, prompt_tokens=300) == (2, 0)


def test_a_returning_call_finds_its_own_slot_and_all_of_its_context():
    c = _cache()
    slot, _ = c.take(1, 300)
    other, _ = c.take(2, 250)                       # another context in another slot
    c.release(slot, ctx=1, tokens=340)
    c.release(other, ctx=2, tokens=280)
    assert c.choose(ctx=1, prompt_tokens=420) == (slot, 340)
    assert c.choose(ctx=2, prompt_tokens=300) == (other, 280)
    # at least the prompt's last token is computed
    assert c.choose(ctx=1, prompt_tokens=340)[1] == 339


def test_a_call_without_its_context_takes_the_first_idle_slot_holding_the_shared_prompt():
    c = _cache()
    held = [c.take(ctx, 300)[0] for ctx in (10, 11, 12)]
    assert held == [3, 2, 1]                        # empty slots by LRU, the last first
    for slot, ctx in zip(held, (10, 11, 12)):
        c.release(slot, ctx, 350)
    # equally similar (the shared prompt) to slots 1-3: the first wins, even over the empty slot 0
    assert c.choose(ctx=99, prompt_tokens=400) == (1, SHARED)
    c.take(10, 400)                                 # context 10 returns to its own slot 3
    assert c.busy[3]
    assert c.choose(ctx=99, prompt_tokens=400) == (1, SHARED)


def test_below_the_similarity_threshold_the_least_recently_used_idle_slot_is_taken():
    c = _cache(slots=3, shared=0)                   # nothing shared between contexts
    for ctx in (1, 2, 3):
        slot, _ = c.take(ctx, 100)
        c.release(slot, ctx, 120)                   # slots 2, 1, 0 released in that order
    assert c.choose(ctx=9, prompt_tokens=100) == (2, 0)
    c.take(9, 100)
    assert c.choose(ctx=8, prompt_tokens=100) == (1, 0)


def test_busy_slots_are_never_chosen_and_overfilling_is_an_error():
    c = _cache(slots=2)
    c.take(1, 300)
    c.take(2, 300)
    with pytest.raises(RuntimeError, match="no idle llama.cpp slot"):
        c.choose(3, 300)


def _llamacpp(**serving):
    return spec_with(engine="llamacpp", **{"max_batch": 4, "max_batched_tokens": 2048, **serving})


def test_engine_spelling_defaults_and_refusals():
    s = _llamacpp()
    assert s.serving.engine == "llamacpp" and s.serving.tool_wait_kv_policy == "evict"
    assert spec_with(engine="llama.cpp", max_batch=2).serving.engine == "llamacpp"
    r = replica_from_spec(s)
    assert r.policy.slot_prompt_cache and r.policy.iterations_ahead == 0 and r.policy.mixed_prefill
    assert r.step.source == "roofline"              # the measured tables are other engines' kernels
    for serving, words in (({"max_batch": None}, "--parallel"), ({"tool_wait_kv_policy": "retain"}, "evict")):
        d = copy.deepcopy(BASE)
        d["serving"] = {k: v for k, v in {"engine": "llamacpp", "max_batch": 4, **serving}.items() if v is not None}
        with pytest.raises(SpecError, match=words):
            spec_from_dict(d)


def test_more_agents_than_slots_lose_their_contexts_in_the_simulator_and_the_analytic_model():
    s = _llamacpp()
    few, many = simulate(s, 3, duration_s=900, seed=1), simulate(s, 16, duration_s=900, seed=1)
    assert few.prefix_hit_rate > many.prefix_hit_rate + 0.2
    vllm = simulate(spec_with(max_batch=4, max_batched_tokens=2048, tool_wait_kv_policy="evict"), 16,
                    duration_s=900, seed=1)
    assert vllm.prefix_hit_rate > many.prefix_hit_rate + 0.2      # one LRU cache over the pool keeps them
    model = closed_loop_model(s, replica_from_spec(s))
    hits = [model.evaluate(n).freed_context_hit_rate for n in (2, 4, 8, 16)]
    assert hits == sorted(hits, reverse=True) and hits[0] > 0.5 > hits[-1]


def test_slot_engine_keeps_its_books_and_is_deterministic():
    s = _llamacpp()
    a = simulate(s, 6, duration_s=600, seed=3, check=True)
    b = simulate(s, 6, duration_s=600, seed=3)
    da, db = a.to_dict(), b.to_dict()
    da.pop("wall_s"), db.pop("wall_s")
    assert da == db
