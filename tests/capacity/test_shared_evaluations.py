"""Closed-loop models that differ in their batch limit alone share their evaluations below it
(``ClosedLoopModel.evaluate``): the loop never reaches the limit there, so the answer is the one a model of its
own gives, and a design-space search over batch limits evaluates each agent count once."""

from __future__ import annotations

import pytest
import yaml

from apmw.capacity import closed_loop
from apmw.capacity.closed_loop import closed_loop_model
from apmw.examples import bundled_examples
from apmw.perf import replica_from_spec
from apmw.spec.load import spec_from_dict


def _model(name: str, **serving):
    doc = yaml.safe_load(bundled_examples()[name].read_text())
    doc["serving"].update(serving)
    spec = spec_from_dict(doc)
    return closed_loop_model(spec, replica_from_spec(spec))


def _figures(ev):
    return (ev.agents, ev.task_latency_mean_s, ev.task_latency_p95_s, ev.ttft_p95_s, ev.tpot_p95_s,
            ev.kv_bytes_resident_p95, ev.meets_latency, ev.fits_memory, ev.freed_context_hit_rate,
            ev.kv_overflow_share, ev.loop.batch_full_share, ev.loop.call_throughput_per_s)


@pytest.mark.parametrize("name", ["support-chat", "coding-agent"])   # contexts freed to the cache; spilled
def test_below_both_limits_an_evaluation_is_shared_and_is_what_a_model_of_its_own_gives(name):
    small, large = _model(name, max_batch=24), _model(name, max_batch=512)
    shared = small.evaluate(20)
    assert large.evaluate(20) is shared
    closed_loop._EVALUATIONS.clear()
    own = _model(name, max_batch=512).evaluate(20)
    assert own is not shared
    assert _figures(own) == _figures(shared)


def test_at_the_limit_and_with_other_settings_nothing_is_shared():
    small, large = _model("support-chat", max_batch=24), _model("support-chat", max_batch=512)
    at_limit = small.evaluate(24)
    assert at_limit.loop.batch_full_share > 0          # the small engine is full at times; the large never
    assert large.evaluate(24) is not at_limit and large.evaluate(24).loop.batch_full_share == 0
    other_budget = _model("support-chat", max_batch=512, max_batched_tokens=4096)
    assert other_budget.evaluate(20) is not large.evaluate(20)
