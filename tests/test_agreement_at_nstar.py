"""At the analytic N*, the analytic task p95 agrees with the simulator's within 10 % (issue 20, item 1).

One spec per binding constraint the simulator settles quickly: the bundled deep-research (task SLO)
and support-chat (TTFT), and the constructed specs of tests/fixtures/specs/binding/ where the task
SLO (support-chat without per-call SLOs), TTFT and TPOT (deep-research with a per-call SLO) bind.
Each seed draws its own sessions in both models, and the p95 of the seeds' tasks pooled is compared.
The two specs whose N* sits at the KV limit (coding-agent and tests/fixtures/specs/binding/kv-memory.yaml)
are left to bench/agreement_at_nstar.py: there the engine thrashes every few hours of simulated time,
so the simulated p95 settles only over about 10,000 tasks a seed (5-6 minutes a spec on this machine),
where both agree within 6 % (bench/README.md, section agreement_at_nstar).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from apmw import load_spec, plan
from apmw.sim import simulate
from apmw.sim.result import quantile_interval

ROOT = Path(__file__).resolve().parent.parent
SEEDS = (1, 2)
TASKS_PER_SEED = 700
WARMUP_SHARE = 0.2          # apmw.sim.run's default warm-up: the first fifth of a run is discarded
TOLERANCE = 0.10

CASES = [("examples/deep-research.yaml", "slo", ("task_latency_p95",)),
         ("examples/support-chat.yaml", "slo", ("ttft_p95",)),
         ("tests/fixtures/specs/binding/task-slo.yaml", "slo", ("task_latency_p95",)),
         ("tests/fixtures/specs/binding/ttft.yaml", "slo", ("ttft_p95",)),
         ("tests/fixtures/specs/binding/tpot.yaml", "slo", ("tpot_p95",))]


@pytest.mark.slow
@pytest.mark.parametrize("path, binding, binding_slo", CASES, ids=[Path(c[0]).stem for c in CASES])
def test_analytic_task_p95_agrees_with_the_simulator_at_nstar(path, binding, binding_slo):
    spec = load_spec(ROOT / path)
    answer = plan(spec)
    d = answer.to_dict()
    assert (d["binding_constraint"], tuple(d["binding_slo"] or ())) == (binding, binding_slo)
    n = answer.search.agents
    analytic, simulated = [], []
    for seed in SEEDS:
        at = plan(spec.model_copy(update={"seed": seed}), agents=n).at
        analytic.append(at.task_latency_samples_s)
        duration_s = TASKS_PER_SEED * at.task_latency_mean_s / n / (1 - WARMUP_SHARE)
        simulated.append(simulate(spec, n, duration_s=duration_s, seed=seed).samples["task_latency_s"])
    pooled = np.concatenate(simulated)
    sim_p95 = float(np.quantile(pooled, 0.95))
    lo, hi = quantile_interval(pooled)
    # the simulator's own 95 % interval is tighter than the tolerance, so a miss is the model's
    assert (hi - lo) / 2 < TOLERANCE * sim_p95, (lo, sim_p95, hi, len(pooled))
    analytic_p95 = float(np.quantile(np.concatenate(analytic), 0.95))
    assert abs(analytic_p95 / sim_p95 - 1) <= TOLERANCE, (n, analytic_p95, sim_p95, (lo, hi), len(pooled))
