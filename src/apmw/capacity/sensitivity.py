"""How far N* moves with the SLO: N* searched again with every SLO the spec sets tightened and loosened.

A number defended to finance comes with how much it depends on the promise behind it. N* is the most
agents whose p95s all sit within their SLOs; here the same closed loop (the same replica and the same
sampled sessions) is searched again with each SLO's limit multiplied by a scale. At 0.9 every task p95,
TTFT p95 and time per output token may take 10 % less (an output-speed SLO asks 10 % more tokens per
second); at 1.1, 10 % more. Where the KV memory stops N*, loosening the SLO does not move it: the
answer says which of the two stopped it at each scale.

The figures are the analytic model's (MODEL.md section 9) whichever way the plan's own N* was
settled: a checked plan (``apmw.sim.checked``) simulates only around its answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from apmw.capacity.closed_loop import closed_loop_model
from apmw.capacity.evaluate import Evaluation, prefill_keeps_up
from apmw.capacity.plan import Plan
from apmw.capacity.search import binding_constraint, largest_near
from apmw.capacity.slo import slo_slack

SLO_SCALES = (0.9, 1.0, 1.1)


@dataclass(frozen=True)
class ScaledSlo:
    """N* with every SLO limit multiplied by ``slo_scale``."""

    slo_scale: float
    agents_per_replica: int
    stopped_by: str        # what one more agent breaks: "slo" or "kv_memory"; "agent_limit" at the search's ceiling

    def to_dict(self) -> dict:
        return {"slo_scale": self.slo_scale, "agents_per_replica": self.agents_per_replica,
                "stopped_by": self.stopped_by}


def slo_sensitivity(plan: Plan, scales: tuple[float, ...] = SLO_SCALES) -> list[ScaledSlo]:
    """N* of ``plan``'s replica and sessions at each SLO scale, searched outwards from its analytic N*."""
    model = closed_loop_model(plan.spec, plan.replica)     # the plan's own sessions (a process keeps them)
    slo = plan.spec.slo
    cache: dict[int, Evaluation] = {}

    def at(n: int) -> Evaluation:
        if n not in cache:
            cache[n] = model.evaluate(n)
        return cache[n]

    def within(n: int, scale: float) -> bool:
        ev = at(n)
        return (prefill_keeps_up(ev.prefill_utilisation)
                and slo_slack(slo, ev.task_latency_p95_s, ev.ttft_p95_s, ev.tpot_p95_s) <= scale)

    answers = []
    for scale in scales:
        n = largest_near(lambda k: within(k, scale) and at(k).fits_memory, max(plan.search.agents, 1))
        answers.append(ScaledSlo(slo_scale=scale, agents_per_replica=n,
                                 stopped_by=binding_constraint(n, within(n + 1, scale))))
    return answers

