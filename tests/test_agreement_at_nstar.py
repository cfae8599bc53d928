"""At the analytic N*, the analytic task p95 agrees with the simulator's within 10 % (issue 20, item 1).

One spec per binding constraint the simulator settles quickly: the bundled deep-research (task SLO)
and support-chat (TTFT), and the constructed specs of tests/fixtures/specs/binding/ where the task
SLO (support-chat without per-call SLOs), TTFT and TPOT (deep-research with a per-call SLO) bind.
Each seed draws its own sessions in both models, and the p95 of the seeds' tasks pooled is compared.
The two specs whose N* sits at the KV limit (coding-agent and tests/fixtures/specs/binding/kv-memory.yaml)
need longer runs: there the engine thrashes every few hours of simulated time, so the simulated p95
settles only over about 10,000 tasks (about 100 s a run here), and one seed's sample of 1,000-2,000
sessions moves the analytic p95 by up to 1.4x (the share of time the pool overflows is steep in the
sessions' context). So there the analytic p95 is read off three seeds' samples pooled and the
simulator runs one seed for 10,000 tasks (bench/README.md, section agreement_at_nstar, has every
seed of both models).
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
TASKS_PER_SEED = 1500      # the simulator's own 95 % interval of the pooled p95 well inside the tolerance
WARMUP_SHARE = 0.2          # apmw.sim.run's default warm-up: the first fifth of a run is discarded
TOLERANCE = 0.10

# At the KV limit: the analytic samples of these seeds pooled, one simulated run this long.
KV_ANALYTIC_SEEDS = (1, 2, 3)
KV_SIMULATED_SEED = 1
KV_TASKS = 10_000

CASES = [("examples/deep-research.yaml", "slo", ("task_latency_p95",)),
         ("examples/support-chat.yaml", "slo", ("ttft_p95",)),
         ("tests/fixtures/specs/binding/task-slo.yaml", "slo", ("task_latency_p95",)),
         ("tests/fixtures/specs/binding/ttft.yaml", "slo", ("ttft_p95",)),
         ("tests/fixtures/specs/binding/tpot.yaml", "slo", ("tpot_p95",))]


@pytest.mark.slow
@pytest.mark.parametrize("path, binding, binding_slo", CASES, ids=[Path(c[0]).stem for c in CASES])
def test_analytic_task_p95_agrees_with_the_simulator_at_nstar(path, binding, binding_slo):
    spec, n = _at_nstar(path, binding, binding_slo)
    analytic, simulated = [], []
    for seed in SEEDS:
        at = plan(spec.model_copy(update={"seed": seed}), agents=n).at
        analytic.append(at.task_latency_samples_s)
        duration_s = TASKS_PER_SEED * at.task_latency_mean_s / n / (1 - WARMUP_SHARE)
        simulated.append(simulate(spec, n, duration_s=duration_s, seed=seed).samples["task_latency_s"])
    _assert_agree(n, np.concatenate(analytic), np.concatenate(simulated))


KV_CASES = ["examples/coding-agent.yaml", "tests/fixtures/specs/binding/kv-memory.yaml"]


@pytest.mark.slow
@pytest.mark.parametrize("path", KV_CASES, ids=[Path(c).stem for c in KV_CASES])
def test_analytic_task_p95_agrees_with_the_simulator_at_the_kv_limit(path):
    spec, n = _at_nstar(path, "kv_memory", ())
    ats = [plan(spec.model_copy(update={"seed": seed}), agents=n).at for seed in KV_ANALYTIC_SEEDS]
    analytic = np.concatenate([at.task_latency_samples_s for at in ats])
    mean_s = float(np.mean([at.task_latency_mean_s for at in ats]))
    duration_s = KV_TASKS * mean_s / n / (1 - WARMUP_SHARE)
    simulated = simulate(spec, n, duration_s=duration_s, seed=KV_SIMULATED_SEED).samples["task_latency_s"]
    _assert_agree(n, analytic, simulated)


def _at_nstar(path: str, binding: str, binding_slo: tuple[str, ...]):
    """The spec at ``path`` and its analytic N*, whose binding constraint must be the one named."""
    spec = load_spec(ROOT / path)
    answer = plan(spec)
    d = answer.to_dict()
    assert (d["binding_constraint"], tuple(d["binding_slo"] or ())) == (binding, binding_slo)
    return spec, answer.search.agents


def _assert_agree(n: int, analytic: np.ndarray, simulated: np.ndarray) -> None:
    sim_p95 = float(np.quantile(simulated, 0.95))
    lo, hi = quantile_interval(simulated)
    # the simulator's own 95 % interval is tighter than the tolerance, so a miss is the model's
    assert (hi - lo) / 2 < TOLERANCE * sim_p95, (lo, sim_p95, hi, len(simulated))
    analytic_p95 = float(np.quantile(analytic, 0.95))
    assert abs(analytic_p95 / sim_p95 - 1) <= TOLERANCE, (n, analytic_p95, sim_p95, (lo, hi), len(simulated))
