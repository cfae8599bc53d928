"""Disaggregated serving as prefill and decode workers (xPyD): the prefill queue, each worker's layout,
and what a decode worker is charged for."""

from __future__ import annotations

import math

import pytest

from apmw.capacity import InfeasibleError, plan
from apmw.capacity.disaggregation import erlang_c_wait_s
from apmw.spec import SpecError, spec_from_dict
from tests.conftest import small_spec_dict


def _prefill_heavy(**disaggregation) -> dict:
    d = small_spec_dict()
    d["workload"] = {"steps_per_task": 10, "system_prompt_tokens": 0, "new_input_tokens_per_call": 3000,
                     "output_tokens_per_call": 200, "tool_wait_s": 2.0}
    d["slo"]["task_latency_p95_s"] = 10_000
    d["serving"] = {"tool_wait_kv_policy": "retain", "disaggregation": disaggregation}
    return d


def test_erlang_c_by_hand():
    """M/M/1 is rho / (1 - rho) x service; M/M/2 at offered load 1 waits with probability 1/3, for
    service / (2 - 1) on average when it does."""
    wait, util = erlang_c_wait_s(1, 0.6, 2.0)
    assert wait == pytest.approx(0.6 / 0.4 * 2.0) and util == pytest.approx(0.6)
    wait, util = erlang_c_wait_s(2, 1.0, 2.0)
    assert wait == pytest.approx(2.0 / 3.0) and util == pytest.approx(0.5)
    assert erlang_c_wait_s(3, 3.0, 1.0) == (math.inf, 1.0)
    assert erlang_c_wait_s(4, 0.0, 1.0) == (0.0, 0.0)


def test_a_decode_worker_is_charged_its_share_of_the_prefill_workers():
    one = plan(spec_from_dict(_prefill_heavy(prefill_gpus=1))).to_dict()
    three_for_two = plan(spec_from_dict(_prefill_heavy(prefill_gpus=1, prefill_workers=3, decode_workers=2))).to_dict()
    assert one["replica"]["prefill_gpus"] == 1 and three_for_two["replica"]["prefill_gpus"] == 1.5
    assert three_for_two["replica"]["gpus"] == 2.5
    assert three_for_two["replica"]["disaggregation"] == {"prefill_workers": 3, "prefill_gpus_per_worker": 1,
                                                          "decode_workers": 2, "prefill_layout": "TP1"}


def test_pooled_prefill_workers_never_wait_longer_than_a_worker_each():
    """Two decode workers sharing two prefill workers (M/M/2) wait less for prefill than one decode worker
    with its own (M/M/1) at the same agents per decode worker and the same GPUs per decode worker."""
    agents = 12
    own = plan(spec_from_dict(_prefill_heavy(prefill_gpus=1)), agents=agents).to_dict()
    pooled = plan(spec_from_dict(_prefill_heavy(prefill_gpus=1, prefill_workers=2, decode_workers=2)),
                  agents=agents).to_dict()
    assert pooled["replica"]["gpus"] == own["replica"]["gpus"]
    assert 0 < pooled["residence_breakdown_s"]["queue"] < own["residence_breakdown_s"]["queue"]
    assert plan(spec_from_dict(_prefill_heavy(prefill_gpus=1, prefill_workers=2, decode_workers=2))
                ).to_dict()["agents_per_replica"] >= plan(spec_from_dict(_prefill_heavy(prefill_gpus=1))
                                                          ).to_dict()["agents_per_replica"]


def test_more_prefill_workers_never_lengthen_the_prefill_wait():
    waits = [plan(spec_from_dict(_prefill_heavy(prefill_gpus=1, prefill_workers=w)), agents=12
                  ).to_dict()["residence_breakdown_s"]["queue"] for w in (1, 2, 4)]
    assert waits[0] > waits[1] > waits[2] >= 0


def test_a_prefill_worker_layout_is_checked_and_shown():
    d = _prefill_heavy(prefill_parallelism={"tp": 2, "pp": 2})
    d["model"]["config"] = "meta-llama/Meta-Llama-3.1-70B"
    d["model"]["weight_dtype"] = "fp8"
    d["hardware"]["gpus_per_replica"] = 2
    p = plan(spec_from_dict(d)).to_dict()
    assert p["replica"]["prefill_gpus"] == 4
    assert p["replica"]["disaggregation"]["prefill_layout"] == "TP2 x PP2"
    with pytest.raises(SpecError, match=r"prefill_parallelism: tp 2 x pp 2 x dp_attention 1 = 4 GPUs, but "
                                        r"prefill_gpus is 8"):
        spec_from_dict(_prefill_heavy(prefill_parallelism={"tp": 2, "pp": 2}, prefill_gpus=8))
    with pytest.raises(SpecError, match="give prefill_gpus"):
        spec_from_dict(_prefill_heavy(prefill_workers=2))


def test_a_prefill_worker_batches_the_prompts_waiting_for_it():
    """One prompt per batch is plain Erlang C; where a batch of eight costs little more than one prompt
    (memory-bound short prompts) the same load waits far less; the time sharing an iteration adds is at
    most the rest of a full batch."""
    from apmw.capacity.disaggregation import batched_prefill_wait_s
    alone, rate = 0.02, 40.0                                   # 80 % busy one prompt at a time
    single = batched_prefill_wait_s(1, 1, alone, alone, rate)
    assert single == erlang_c_wait_s(1, rate * alone, alone)
    cheap = batched_prefill_wait_s(1, 8, alone, 1.2 * alone, rate)
    assert cheap[0] < 0.2 * single[0] and cheap[1] < 0.6 * single[1]     # busy less: prompts share iterations
    costly = batched_prefill_wait_s(1, 8, alone, 8 * alone, rate)     # compute-bound: batching buys nothing
    assert costly[1] == pytest.approx(single[1])
    assert cheap[0] <= (1.2 * alone - alone) + erlang_c_wait_s(8, rate * 1.2 * alone, 1.2 * alone)[0] + 1e-12


def test_prefill_workers_are_tensor_parallel_unless_laid_out():
    """The decode side's attention DP (attention_data_parallel) is not inherited by the prefill workers."""
    d = _prefill_heavy(prefill_gpus=2)
    d["model"] = {"config": "Qwen/Qwen3-30B-A3B", "weight_dtype": "fp8", "kv_dtype": "fp8"}
    d["hardware"] = {"gpu": "H100", "gpus_per_replica": 2}
    d["serving"]["attention_data_parallel"] = True
    assert plan(spec_from_dict(d)).to_dict()["replica"]["disaggregation"]["prefill_layout"] == "TP2"


def test_the_routing_comparison_names_a_policy_it_cannot_price_instead_of_failing():
    from apmw.capacity.fleet_day import routing_comparison
    d = small_spec_dict()
    d["serving"]["tool_wait_kv_policy"] = "offload"
    rows = routing_comparison(plan(spec_from_dict(d)), 4)
    by = {r["policy"]: r for r in rows}
    assert by["affinity"]["agents_per_replica"] > 0
    assert by["random"]["agents_per_replica"] is None and "offload" in by["random"]["refused"]


def test_a_disaggregated_plan_warns_where_retained_contexts_would_spill_unpriced():
    """coding-agent keeps contexts over tool waits and its demand exceeds the pool 4.6 % of the time at N*: the
    aggregated plan prices their re-prefill; with disaggregated prefill that is not modelled, and the plan
    says so instead of reading as if nothing spilled."""
    import yaml

    from tests.conftest import EXAMPLES
    d = yaml.safe_load((EXAMPLES / "coding-agent.yaml").read_text())
    together = plan(spec_from_dict(d)).to_dict()
    assert together["kv_overflow_share"] > 1e-3
    assert not any("decode pool" in w for w in together["warnings"])
    d["serving"]["disaggregation"] = {"prefill_gpus": 8}
    apart = plan(spec_from_dict(d)).to_dict()
    assert apart["kv_overflow_share"] is None
    assert any("retained KV exceeds the decode pool" in w and "optimistic" in w for w in apart["warnings"])


@pytest.mark.parametrize("moe_dtype,gpus,prefill_gpus,fits", [("fp4", 4, 4, True), ("bf16", 16, 8, False)])
def test_prefill_workers_hold_the_experts_in_the_models_moe_dtype(moe_dtype, gpus, prefill_gpus, fits):
    """A prefill worker was built at weight_dtype for the experts: DeepSeek-V3 with FP4 experts was refused on the 4
    H200s its decode replica fits on, and with BF16 experts planned on 8 that cannot hold its 1,327 GB (fuzzing,
    session 43)."""
    import yaml

    from apmw.errors import ApmwError
    from tests.conftest import EXAMPLES

    d = yaml.safe_load((EXAMPLES / "coding-agent.yaml").read_text())
    d["model"]["moe_dtype"] = moe_dtype
    d["hardware"]["gpus_per_replica"] = gpus
    d["serving"]["disaggregation"] = {"prefill_gpus": prefill_gpus}
    if fits:
        assert plan(spec_from_dict(d)).to_dict()["replica"]["prefill_gpus"] == prefill_gpus
    else:
        with pytest.raises(ApmwError, match=r"does not fit on 8 x H200-SXM-141GB: weights 1,326\.9 GB against "):
            plan(spec_from_dict(d))


def test_the_kv_hand_off_is_a_transfer_in_the_breakdown_and_a_slow_link_is_named():
    """The prefill workers' hand-off to the decode worker was counted as prefill, and a hand-off that took the
    task past its SLO was told to find "a faster replica": the breakdown now shows it as kv_transfer (the
    prefill part what is left), the same total, and the advice names the link."""
    fast = plan(spec_from_dict(_prefill_heavy(prefill_gpus=1)), agents=4).to_dict()["residence_breakdown_s"]
    slow_link = _prefill_heavy(prefill_gpus=1, kv_transfer_bandwidth_bytes_per_s=2e7)
    slow = plan(spec_from_dict(slow_link), agents=4).to_dict()["residence_breakdown_s"]
    kv_bytes_per_token = 131072       # Llama-3.1-8B bf16: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes
    tokens = 10 * 3000                # a task's prefilled tokens (no cached prefix: each call's new input)
    assert slow["kv_transfer"] == pytest.approx(tokens * kv_bytes_per_token / 2e7, rel=0.02)
    assert fast["kv_transfer"] == pytest.approx(tokens * kv_bytes_per_token / 50e9, rel=0.02)
    assert slow["prefill"] == pytest.approx(fast["prefill"], rel=0.01)
    slow_link["slo"]["task_latency_p95_s"] = 60
    with pytest.raises(InfeasibleError) as err:
        plan(spec_from_dict(slow_link))
    said = str(err.value)
    assert "kv_transfer dominates" in said and "a faster replica" not in said
    assert "serving.disaggregation.kv_transfer_bandwidth_bytes_per_s, now 0.02 GB/s" in said
