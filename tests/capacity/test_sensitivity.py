"""N* as the SLO moves: the same closed loop searched again with every SLO limit scaled."""

from __future__ import annotations

import pytest

from apmw import load_spec, plan
from apmw.capacity.sensitivity import slo_sensitivity
from tests.conftest import EXAMPLES, ROOT

BINDING = ROOT / "tests" / "fixtures" / "specs" / "binding"


def _scaled(spec, scale: float):
    slo = spec.slo
    update = {"task_latency_p95_s": slo.task_latency_p95_s * scale}
    for name in ("ttft_p95_s", "tpot_p95_s"):
        if getattr(slo, name) is not None:
            update[name] = getattr(slo, name) * scale
    if slo.output_speed_tokens_per_s is not None:
        update["output_speed_tokens_per_s"] = slo.output_speed_tokens_per_s / scale
    return spec.model_copy(update={"slo": slo.model_copy(update=update)})


@pytest.mark.parametrize("path", [EXAMPLES / "support-chat.yaml", EXAMPLES / "coding-agent.yaml", BINDING / "ttft.yaml",
                                  BINDING / "tpot.yaml", BINDING / "kv-memory.yaml"])
def test_each_scale_is_the_plan_of_the_spec_with_its_slo_scaled(path):
    spec = load_spec(path)
    answers = slo_sensitivity(plan(spec, agents=None))
    assert [a.slo_scale for a in answers] == [0.9, 1.0, 1.1]
    for a in answers:
        scaled = plan(_scaled(spec, a.slo_scale))
        assert a.agents_per_replica == scaled.search.agents, a
        assert a.stopped_by == ("kv_memory" if scaled.search.binding_constraint == "kv_memory" else "slo")


def test_n_star_never_falls_as_the_slo_loosens_and_the_kv_limit_holds_it():
    support = [a.agents_per_replica for a in slo_sensitivity(plan(load_spec(EXAMPLES / "support-chat.yaml")))]
    assert support[0] < support[1] < support[2]          # the task p95 binds: every 10 % moves N*
    base = plan(load_spec(EXAMPLES / "coding-agent.yaml"))
    coding = slo_sensitivity(base)
    assert base.search.binding_constraint == "kv_memory"    # the KV pool holds N* whatever the SLO allows
    assert [a.agents_per_replica for a in coding] == [base.agents_per_replica] * 3
    assert [a.stopped_by for a in coding[1:]] == ["kv_memory", "kv_memory"]
