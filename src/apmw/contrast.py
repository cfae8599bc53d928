"""Why tokens per second misled: workloads side by side (MODEL.md section 7).

At N* a replica serves ``N`` agents, each finishing a task every ``R`` seconds
and generating ``D`` output tokens per task, so it emits ``N * D / R`` tokens/s.
Turned around, for power ``P``:

    agents/MW = (output tokens/s per MW) x (R / D)

exactly, for the analytic closed loop (the plans are ``apmw plan --analytic``'s; ``apmw plan``
settles N* in the simulator, and can answer fewer agents). ``R / D`` -- seconds of task residence per output token -- is what
tokens/s leaves out: tool waits, long contexts (slower tokens, more KV held) and
many calls per task all stretch it. :func:`contrast` reports both factors for
each workload and the ratio of each to the first workload, so the gap in
agents/MW splits into a throughput part and a residence part; the residence
part is then broken into its phases.
"""

from __future__ import annotations

from dataclasses import dataclass

from apmw.capacity import Plan


@dataclass(frozen=True)
class ContrastRow:
    name: str
    agents_per_replica: int
    agents_per_replica_source: str      # "analytic": the identity holds for the analytic closed loop
    agents_per_mw: float
    output_tokens_per_s: float
    output_tokens_per_s_per_mw: float
    output_tokens_per_task: float
    residence_s: float
    residence_s_per_output_token: float
    calls_per_task: float
    mean_prompt_tokens: float
    kv_tokens_per_agent: float
    tool_share: float
    binding_constraint: str
    residence_breakdown_s: dict[str, float]

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def contrast_row(name: str, p: Plan) -> ContrastRow:
    d = p.to_dict()
    mw = d["replica"]["facility_power_w"] / 1e6
    out_tok = float(p.sample.output_tokens.mean())
    r = d["task_latency_s"]["mean"]
    return ContrastRow(
        name=name, agents_per_replica=d["agents_per_replica"],
        agents_per_replica_source=d["agents_per_replica_source"], agents_per_mw=d["agents_per_mw"],
        output_tokens_per_s=d["tokens_per_s"]["output"], output_tokens_per_s_per_mw=d["tokens_per_s"]["output"] / mw,
        output_tokens_per_task=out_tok, residence_s=r, residence_s_per_output_token=r / out_tok,
        calls_per_task=d["calls_per_session"],
        mean_prompt_tokens=float(p.sample.input_tokens.sum() / p.sample.calls.sum()),
        kv_tokens_per_agent=d["kv_tokens_resident_mean"] / max(d["agents_per_replica"], 1),
        tool_share=d["residence_breakdown_s"]["tool"] / r, binding_constraint=d["binding_constraint"],
        residence_breakdown_s=d["residence_breakdown_s"],
    )


def contrast(plans: dict[str, Plan]) -> dict:
    """Rows per workload plus, for each, its ratio to the first: agents/MW = throughput x residence."""
    rows = [contrast_row(name, p) for name, p in plans.items()]
    ref = rows[0]
    ratios = [{
        "name": r.name,
        "agents_per_mw": r.agents_per_mw / ref.agents_per_mw,
        "output_tokens_per_s_per_mw": r.output_tokens_per_s_per_mw / ref.output_tokens_per_s_per_mw,
        "residence_s_per_output_token": r.residence_s_per_output_token / ref.residence_s_per_output_token,
    } for r in rows]
    return {"workloads": [r.to_dict() for r in rows], "ratios_to_first": ratios,
            "identity": "agents_per_mw = output_tokens_per_s_per_mw * residence_s_per_output_token"}
