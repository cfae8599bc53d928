"""Plans in one process share step models and engine curves where nothing they read differs, and a shared or
extended curve is the one built afresh, to the last bit."""

from __future__ import annotations

import dataclasses
import gc

import numpy as np
import pytest

from apmw.capacity import engine_curve as curves
from apmw.capacity.sessions import sample_sessions
from apmw.perf import replica_from_spec
from apmw.perf.efficiency import efficiency_for_gpu
from apmw.spec import spec_from_dict
from tests.conftest import small_spec_dict


def _spec(**serving):
    d = small_spec_dict()
    d["serving"] = {**d.get("serving", {}), **serving}
    return spec_from_dict(d)


def _same(a: curves.EngineCurve, b: curves.EngineCurve) -> None:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert (np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y), f.name


def test_the_step_model_is_shared_across_batch_limits_not_across_what_it_reads():
    step = replica_from_spec(_spec()).step
    assert replica_from_spec(_spec(max_batch=17)).step is step
    assert replica_from_spec(_spec(engine="sglang")).step is not step
    assert replica_from_spec(spec_from_dict(small_spec_dict() | {"model": {**small_spec_dict()["model"],
                                                                           "kv_dtype": "fp8"}})).step is not step
    own = replica_from_spec(_spec(), efficiency=efficiency_for_gpu("H100"))
    assert own.step is not step


@pytest.mark.parametrize("engine", ["vllm", "sglang"])       # mixed prefill, and prefill first
@pytest.mark.parametrize("decode_only", [False, True])
def test_a_curve_cut_or_extended_equals_one_built_afresh(engine, decode_only):
    spec = _spec(engine=engine)
    replica = replica_from_spec(spec)
    s = sample_sessions(spec, replica)
    mixed = replica.policy.mixed_prefill
    curves._CURVES.clear()
    small = curves.engine_curve(replica.step, s, 24, decode_only, mixed)      # built
    large = curves.engine_curve(replica.step, s, 80, decode_only, mixed)      # extended: 25..80 built
    cut = curves.engine_curve(replica.step, s, 50, decode_only, mixed)        # cut from the 80
    assert len(curves._CURVES) == 1
    for got, n in ((small, 24), (large, 80), (cut, 50)):
        assert len(got.batch) == n
        _same(got, curves.build_engine_curve(replica.step, s, n, decode_only, mixed))


def test_a_curve_is_not_found_by_an_object_that_took_a_dead_ones_id():
    spec = _spec()
    replica = replica_from_spec(spec)
    s = sample_sessions(spec, replica)
    curves._CURVES.clear()
    curves.engine_curve(replica.step, s, 16)
    key = next(iter(curves._CURVES))
    step_ref, sample_ref, curve = curves._CURVES[key]
    other = dataclasses.replace(s, tool_s=s.tool_s * 2)       # another sample: its own curve
    assert curves.engine_curve(replica.step, other, 16) is not curve
    del s, other
    gc.collect()
    # the sample cache still holds the first sample; a dead entry's referents read None
    curves._CURVES[key] = (step_ref, lambda: None, curve)
    fresh = curves.engine_curve(replica.step, sample_sessions(spec, replica), 16)
    assert fresh is not curve
    _same(fresh, curve)


def test_shared_curves_are_read_only():
    spec = _spec()
    replica = replica_from_spec(spec)
    c = curves.engine_curve(replica.step, sample_sessions(spec, replica), 8)
    with pytest.raises(ValueError, match="read-only"):
        c.iteration_s[0] = 0.0


def test_a_curve_built_in_blocks_equals_one_built_at_once(monkeypatch):
    """A large batch limit is built CURVE_BLOCK_ROWS batch sizes at a time (a row's arrays are 34 chunk counts
    by 7 strata wide, so 65,536 at once took 2 GB): the same rows, to the last bit."""
    spec = _spec()
    replica = replica_from_spec(spec)
    s = sample_sessions(spec, replica)
    at_once = curves.build_engine_curve(replica.step, s, 100)
    curves._CURVES.clear()
    monkeypatch.setattr(curves, "CURVE_BLOCK_ROWS", 32)
    _same(curves.engine_curve(replica.step, s, 100), at_once)


@pytest.mark.parametrize("policy", ["retain", "evict"])       # one sample, and the found/lost blend
def test_a_loop_below_the_batch_limit_reads_the_curve_no_further_than_its_agents(policy, monkeypatch):
    """A batch limit of 6,000 (SGLang sizes its own from the KV pool: up to 4,096 per DP rank): the closed loop at
    N agents builds the curve's rows up to the power of two at or above N (at least FIRST_CURVE_ROWS), and answers
    what the whole curve gives: every figure of the evaluation, the loop's batch distribution included, and the
    batch-limit counterfactual's 'never full' below the limit."""
    from apmw.capacity import closed_loop as loops

    spec = _spec(max_batch=6000, tool_wait_kv_policy=policy)
    replica = replica_from_spec(spec)
    monkeypatch.setattr(loops, "SHARED_EVALUATIONS", 0)   # each model evaluates for itself: they are compared
    lazy = loops.closed_loop_model(spec, replica)
    assert len(lazy.curve.batch) == loops.FIRST_CURVE_ROWS and lazy.curve.batch_limit == 6000
    built = []
    monkeypatch.setattr(loops, "engine_curve",
                        lambda *a, **k: built.append(a[2]) or curves.build_engine_curve(*a, **{**k, "first": 1}))
    full = loops.ClosedLoopModel(spec, replica, lazy.sample, found_sample=lazy.found if lazy.frees else None,
                                 lost_sample=lazy.lost if lazy.spills else None)
    full._curves_to(6000)
    assert built[-1] == 6000 and len(full.curve.batch) == 6000 and full.curve.limit is None
    for n, rows in ((1, 32), (40, 64), (33, 64), (2048, 2048)):
        a, b = lazy.evaluate(n), full.evaluate(n)
        assert len(lazy.curve.batch) == rows, n                  # never shrinks: 33 after 40 reads the 64 built
        for f in dataclasses.fields(a):
            x, y = getattr(a, f.name), getattr(b, f.name)
            if f.name == "loop":
                assert x.batch_full_share == y.batch_full_share == 0.0
                assert np.array_equal(x.batch_distribution, y.batch_distribution), n
                x, y = dataclasses.replace(x, batch_distribution=None), dataclasses.replace(y, batch_distribution=None)
            if f.name == "ttft_draw":               # a function that draws them: compare what it draws
                x, y = a.ttft_samples_s, b.ttft_samples_s
            assert (np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y), (n, f.name)
    lazy.evaluate(2049)                                          # past 2,048: the next power of two
    assert len(lazy.curve.batch) == 4096
    with pytest.raises(ValueError, match="rows"):
        from apmw.capacity.closed_network import solve_at
        solve_at(dataclasses.replace(curves.engine_curve(replica.step, lazy.sample, 10), limit=20), 1.0, 11)
