"""The simulator's iteration pricing (apmw.sim.pricing) gives the step model's own times, only cheaper."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from apmw.perf import IterationLoad, replica_from_spec
from apmw.sim import simulate
from apmw.sim.pricing import CHUNK, Pricer, pricer_for
from apmw.sim.stats import Meter
from apmw.spec import load_spec, spec_from_dict
from tests.e2e.test_cli import EXAMPLES
from tests.sim.helpers import spec, spec_with



def _attention_dp() -> dict:
    """The coding agent's DeepSeek-V3 on 8 x H200 as eight attention-DP ranks with its experts over eight."""
    d = yaml.safe_load((EXAMPLES / "coding-agent.yaml").read_text())
    d["serving"]["parallelism"] = {"tp": 1, "dp_attention": 8, "ep": 8}
    return d


# one replica per step-model kind the bundled examples and tests use: roofline (DeepSeek-V3 on 8 x H200, as
# one tensor-parallel group and as attention-DP ranks), calibrated with a sliding window (gpt-oss-120b),
# calibrated dense (Llama-3.1-70B), and the small test spec
REPLICAS = {
    "coding-agent": lambda: replica_from_spec(load_spec(EXAMPLES / "coding-agent.yaml")),
    "attention DP": lambda: replica_from_spec(spec_from_dict(_attention_dp())),
    "deep-research": lambda: replica_from_spec(load_spec(EXAMPLES / "deep-research.yaml")),
    "support-chat": lambda: replica_from_spec(load_spec(EXAMPLES / "support-chat.yaml")),
    "test spec": lambda: replica_from_spec(spec()),
    "sliding window": lambda: replica_from_spec(spec_with(model="openai/gpt-oss-20b")),
}


def _pricer(replica) -> Pricer:
    p = replica.policy
    return pricer_for(replica.step, p.token_budget + p.max_batch, p.max_batch)


@pytest.fixture(scope="module", params=list(REPLICAS))
def replica(request):
    return REPLICAS[request.param]()


def test_decode_segments_are_the_step_models_times_at_the_mean_context(replica):
    pricer, step, arch = _pricer(replica), replica.step, replica.step.arch
    rng = np.random.default_rng(1)
    for _ in range(40):
        b = int(rng.integers(1, replica.policy.max_batch + 1))
        ctx = pricer.linear_from + int(rng.integers(1, 60_000))
        total = b * ctx + int(rng.integers(0, b))
        k = int(rng.integers(1, 300))
        for _visit in range(3):          # priced directly on a first visit, from a built chunk after
            got = pricer.decode(b, total, k)
            mean = (total + b * np.arange(k)) / b
            want = step.iteration_time_s(IterationLoad(float(b), 0.0, b * arch.kv_read_bytes_for_context(
                mean, step.kv_dtype), b * arch.attention_flops_per_token(mean)))
            np.testing.assert_allclose(got, np.broadcast_to(want, (k,)), rtol=1e-12)


def test_a_mixed_iterations_load_is_the_architectures_sums(replica):
    pricer, step, arch = _pricer(replica), replica.step, replica.step.arch
    rng = np.random.default_rng(2)
    for _ in range(40):
        m = int(rng.integers(1, 40))
        kv = pricer.linear_from + rng.integers(0, 50_000, m)
        prefill = rng.random(m) < 0.2
        n = np.where(prefill, rng.integers(1, 4000, m), 1)
        kv_bytes, attn = pricer.loads(kv, n, prefill)
        want_kv = float(np.sum(arch.kv_read_bytes_for_context(kv, step.kv_dtype)))
        want_attn = float(np.sum(n * arch.attention_flops_per_token(kv + np.where(prefill, n / 2.0, 0.0))))
        assert kv_bytes == pytest.approx(want_kv, rel=1e-12)
        assert attn == pytest.approx(want_attn, rel=1e-12)
        load = IterationLoad(int(m - prefill.sum()), int(n[prefill].sum()), kv_bytes, attn)
        assert pricer.time_s(load) == pytest.approx(float(step.iteration_time_s(load)), rel=1e-12)


def test_the_roofline_is_priced_from_its_parts_and_other_models_by_asking():
    assert _pricer(REPLICAS["coding-agent"]()).parts is not None
    assert _pricer(REPLICAS["attention DP"]()).parts is not None
    assert _pricer(REPLICAS["deep-research"]()).parts is None


def test_chunks_are_shared_by_the_runs_of_one_replica_and_do_not_change_results():
    replica = REPLICAS["test spec"]()
    s = spec()
    runs, sizes = [], []
    for _ in range(3):
        r = simulate(s, 6, duration_s=60, seed=1, replica=replica).to_dict()
        r.pop("wall_s")
        runs.append(r)
        sizes.append(len(_pricer(replica)._chunks))
    # a chunk is built on its second visit (the second run), after which the same run finds them all
    assert 0 < sizes[1] == sizes[2]
    assert all(len(t) == CHUNK for t in _pricer(replica)._chunks.values())
    assert runs[0] == runs[1] == runs[2]         # priced directly or from a chunk: the same times


def test_the_compute_bound_share_priced_together_is_the_sum_of_each_iterations():
    step = REPLICAS["test spec"]().step
    pricer = Pricer(step)
    meter = Meter(step.compute_share, (0.0, 100.0), 1e9, pricer.decode_shares)
    rng = np.random.default_rng(3)
    want = 0.0
    for i in range(50):
        t = float(rng.uniform(0.01, 0.05))
        load = IterationLoad(int(rng.integers(0, 30)), int(rng.integers(0, 2000)), float(rng.uniform(1e6, 1e10)),
                             float(rng.uniform(1e9, 1e13)))
        meter.iteration(float(i), t, 0, 1, 0.0, 0, load)
        want += float(step.compute_share(load)) * t
        b, total, k = int(rng.integers(1, 30)), int(rng.integers(40_000, 90_000)), int(rng.integers(1, 50))
        times = pricer.decode(b, total, k)
        meter.segment(float(i), times, None, None, b, 0, 0, total)
        sums = total + b * np.arange(k)
        shares = step.compute_share(pricer.decode_load(b, sums.astype(float)))
        want += float(np.sum(np.broadcast_to(shares, (k,)) * times))
    meter.flush()
    assert meter.stats.compute_bound_s == pytest.approx(want, rel=1e-12)
