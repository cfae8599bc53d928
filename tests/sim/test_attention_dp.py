"""Attention data-parallel ranks in the simulator: a scheduler, KV pool, batch limit and token budget per rank,
agents kept on their rank, and every rank's iteration priced together at the busiest rank's pace."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from apmw.errors import ApmwError
from apmw.perf import IterationLoad, replica_from_spec
from apmw.sim import simulate, unsupported
from apmw.sim.batch import Seq
from apmw.sim.engine import Engine
from apmw.sim.fleet import simulate_fleet
from apmw.spec import spec_from_dict
from tests.conftest import small_spec_dict


def _dp_spec(ranks: int = 2, max_batch: int = 256, policy: str = "retain", engine: str = "vllm"):
    d = small_spec_dict()
    d["hardware"]["gpus_per_replica"] = ranks
    d["serving"].update(max_batch=max_batch, tool_wait_kv_policy=policy, engine=engine,
                        parallelism={"tp": 1, "dp_attention": ranks})
    return spec_from_dict(d)


class _Quiet:
    stop_time_s = float("inf")


def _engine(spec) -> Engine:
    return Engine(replica_from_spec(spec), spec.serving, spec.workload.system_prompt_tokens, _Quiet())


def test_a_replica_of_ranks_is_simulated_not_refused():
    spec = _dp_spec()
    assert unsupported(spec) is None
    r = simulate(spec, 8, duration_s=300, seed=1, check=True)
    assert r.completed_tasks > 0 and r.generated_tokens > 0


def test_each_rank_has_its_share_of_the_pool_the_batch_limit_and_the_budget():
    spec = _dp_spec(ranks=4, max_batch=16)
    replica = replica_from_spec(spec)
    eng = _engine(spec)
    assert len(eng.ranks) == 4
    # vLLM: a scheduler per rank, each with the setting; the policy holds the replica's totals
    assert [s.max_batch for s in eng.ranks] == [16] * 4 and replica.policy.max_batch == 64
    assert [s.max_tokens for s in eng.ranks] == [replica.policy.token_budget // 4] * 4
    single = _engine(spec_from_dict({**small_spec_dict(), "hardware": {"gpu": "H100", "gpus_per_replica": 1}}))
    blocks = sum(s.ledger.pool.capacity for s in eng.ranks)
    # the replica's pool over four GPUs, split four ways (each rank holds its own copy of the shared prefix)
    assert blocks == pytest.approx(replica.kv_capacity_bytes / (replica.step.kv_bytes_per_token * 16), abs=4)
    assert len(single.ranks) == 1


def test_an_agents_calls_stay_on_its_rank_and_benchmark_requests_go_round():
    eng = _engine(_dp_spec(ranks=4))
    assert [eng.ranks.index(eng.scheduler_for(Seq(a, 1, 10, 1, 0.0))) for a in range(8)] == [0, 1, 2, 3] * 2
    assert [eng.ranks.index(eng.scheduler_for(Seq(-1, -(i + 1), 10, 1, 0.0))) for i in range(6)] == [0, 1, 2, 3, 0, 1]


def test_no_rank_runs_more_than_its_batch_limit_and_the_ranks_run_together(monkeypatch):
    spec = _dp_spec(ranks=2, max_batch=4, policy="evict")
    seen = []
    step_once = Engine.step_once

    def watched(self):
        seen.append([len(s.running) for s in self.ranks])
        return step_once(self)

    monkeypatch.setattr(Engine, "step_once", watched)
    simulate(spec, 24, duration_s=120, seed=2)
    per_rank = np.array(seen)
    assert per_rank.max() == 4                      # each rank fills its own limit ...
    assert (per_rank.sum(axis=1) > 4).any()         # ... so the replica runs more than one rank's worth


def test_ranks_are_priced_at_the_busiest_ranks_attention():
    eng = _engine(_dp_spec(ranks=4))
    step = eng.step
    # four equal ranks of 8 decoding sequences: what the step model prices for an even split
    kv, attn = eng._busiest_rank_loads(32, [1e9] * 4, [1e12] * 4)
    assert (kv, attn) == pytest.approx((4e9, 4e12))
    even = step.iteration_time_s(IterationLoad(32, 0, 4e9, 4e12))
    # the same total KV, all on one rank: that rank reads four times its even share, and every rank waits
    kv1, attn1 = eng._busiest_rank_loads(32, [4e9, 0, 0, 0], [1e12] * 4)
    skewed = step.iteration_time_s(IterationLoad(32, 0, kv1, attn1))
    assert kv1 == pytest.approx(16e9) and skewed > even
    # what the step model then charges is the busiest rank's bytes over each of its GPUs
    assert float(step.busiest_rank_share(np.asarray(32.0))) == 1.0


def test_a_skewed_workload_runs_slower_on_ranks_than_the_even_split_says(monkeypatch):
    """Agents' contexts differ widely, so some rank always reads more KV than the others; priced as an even
    split the same run's time per output token is shorter."""
    spec = _dp_spec(ranks=4, policy="retain")
    ranked = simulate(spec, 24, duration_s=600, seed=3)
    monkeypatch.setattr(Engine, "_busiest_rank_loads", lambda self, d, kv, attn: (sum(kv), sum(attn)))
    even = simulate(spec, 24, duration_s=600, seed=3)
    assert ranked.tpot["mean"] > even.tpot["mean"]


def test_the_fleet_simulation_still_refuses_ranks():
    with pytest.raises(ApmwError, match="attention data-parallel ranks in a multi-replica simulation"):
        simulate_fleet(_dp_spec(), 2, 4, duration_s=60)


@pytest.mark.slow
def test_plan_settles_a_replica_of_ranks_in_the_simulator(tmp_path):
    """`apmw plan` used to answer a spec with attention data-parallel ranks analytically, with a note; it now
    checks it in the simulator like any other."""
    import json

    import yaml

    from tests.e2e.test_cli import APMW

    d = small_spec_dict()
    d["hardware"]["gpus_per_replica"] = 2
    d["serving"]["parallelism"] = {"tp": 1, "dp_attention": 2}
    path = tmp_path / "dp2.yaml"
    path.write_text(yaml.safe_dump(d))
    r = subprocess.run([APMW, "plan", str(path), "--json", "--check-tasks", "60"], capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["agents_per_replica_source"] == "simulated"
    assert "not checked in the simulator" not in r.stderr


def test_the_analytic_model_prices_a_prompt_on_its_rank_as_the_simulator_does():
    """One chunk among eight ranks of 4 equal decoders each: the engine curve's load (the prompt's attention on
    one rank) and the simulator's (each rank's own load) give the step model the same busiest rank."""
    from types import SimpleNamespace

    from apmw.capacity.engine_curve import ChunksOnRanks, prompts_on_their_ranks

    eng = _engine(_dp_spec(ranks=8))
    step = eng.step
    dec_kv, dec_attn, chunk_kv, chunk_attn = 2e8, 3e10, 5e8, 4e12
    sample = SimpleNamespace(call_prefill_kv_bytes=chunk_kv, call_prefill_attn_flops=chunk_attn, call_prefill_iters=1.0,
                             call_prefill_tokens=500.0, decode_kv_bytes_cv=0.0, decode_attn_flops_cv=0.0)
    one_chunk = ChunksOnRanks(np.array([[0.0], [chunk_attn]]), np.array([[0.0], [chunk_kv]]), np.ones(1),
                              np.array([[0.0], [500.0]]))
    total = IterationLoad(np.asarray(32.0), 500, 32 * dec_kv + chunk_kv, 32 * dec_attn + chunk_attn)
    analytic = prompts_on_their_ranks(step, total, np.asarray(1.0), 0.0, one_chunk, sample)
    kv_by_rank = [4 * dec_kv + chunk_kv] + [4 * dec_kv] * 7
    attn_by_rank = [4 * dec_attn + chunk_attn] + [4 * dec_attn] * 7
    simulated = eng._busiest_rank_loads(32, kv_by_rank, attn_by_rank)
    assert (float(analytic.kv_read_bytes[0]), float(analytic.attention_flops[0])) == pytest.approx(simulated)
    assert step.iteration_time_s(analytic)[0] > step.iteration_time_s(total)
    # no prompt: the decoders' even split, the load as it was
    bare = IterationLoad(np.asarray(32.0), 0, 32 * dec_kv, 32 * dec_attn)
    same = prompts_on_their_ranks(step, bare, np.asarray(0.0), 0.0, one_chunk, sample)
    assert (float(same.kv_read_bytes[0]), float(same.attention_flops[0])) == pytest.approx((32 * dec_kv, 32 * dec_attn))


@pytest.mark.parametrize("engine,ranks,chunk", [("vllm", 1, 8192), ("vllm", 4, 8192), ("sglang", 4, 2048)])
def test_a_prompt_is_chunked_by_its_own_ranks_budget(engine, ranks, chunk):
    """vLLM's budget is per engine core (rank); SGLang divides the server's among its DP workers."""
    d = small_spec_dict()
    d["hardware"]["gpus_per_replica"] = ranks
    d["serving"].update(engine=engine, max_batched_tokens=8192, parallelism={"tp": 1, "dp_attention": ranks})
    assert replica_from_spec(spec_from_dict(d)).chunk_tokens == chunk


@pytest.mark.parametrize("contexts", [(5, 40, 300), (9000, 12000, 30000)])
def test_the_ranks_priced_in_one_pass_equal_each_rank_priced_alone(contexts):
    """Pricer.loads_by_rank (one pass over every rank's sequences) gives each rank what Pricer.loads gives it,
    below a sliding window (the architecture's functions) and past it (the linear path, exact integers)."""
    spec = _dp_spec(ranks=3)
    d = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    d["model"]["config"] = "openai/gpt-oss-20b"             # a 128-token sliding window: below it, non-linear
    eng = _engine(spec_from_dict(d))
    pricer = eng.pricer
    rng = np.random.default_rng(0)
    kv = [rng.integers(contexts[0], contexts[2], size=k) for k in (4, 1, 7)]
    n = [np.where(rng.random(len(k)) < 0.3, rng.integers(2, 500, size=len(k)), 1) for k in kv]
    pre = [m > 1 for m in n]
    kv_by_rank, attn_by_rank = pricer.loads_by_rank(kv, n, pre)
    alone = [pricer.loads(k, m, p) for k, m, p in zip(kv, n, pre)]
    assert kv_by_rank == pytest.approx([a for a, _ in alone], rel=1e-12)
    assert attn_by_rank == pytest.approx([b for _, b in alone], rel=1e-12)
