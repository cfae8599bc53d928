"""Summarisation and speculative decoding in the closed-loop model."""

from __future__ import annotations

import pytest

from apmw.arch import load_architecture

from apmw.capacity import plan
from apmw.errors import ApmwError
from apmw.spec import SpecError, spec_from_dict
from tests.conftest import small_spec_dict


def _deterministic(**workload) -> dict:
    d = small_spec_dict()
    d["workload"] = {"steps_per_task": 20, "system_prompt_tokens": 0, "new_input_tokens_per_call": 1000,
                     "output_tokens_per_call": 100, "tool_wait_s": 5.0, **workload}
    d["slo"]["task_latency_p95_s"] = 10_000
    return d


def test_summaries_are_extra_calls_at_the_cap():
    """History before call i is 1100 (i - 1); with a cap of 8000 and 1000-token summaries it resets every
    7000 tokens, so a 20-call task (history 20,900 at its last call) writes floor(19,900 / 7000) = 2 summaries."""
    p = plan(spec_from_dict(_deterministic(summarize_at_tokens=8000, summary_tokens=1000)), agents=4)
    assert p.to_dict()["calls_per_session"] == pytest.approx(22)
    assert p.sample.output_tokens.mean() == pytest.approx(20 * 100 + 2 * 1000)


def test_summarisation_lowers_kv_per_agent():
    free = plan(spec_from_dict(_deterministic()), agents=4).to_dict()
    capped = plan(spec_from_dict(_deterministic(summarize_at_tokens=8000, summary_tokens=1000)), agents=4).to_dict()
    assert capped["kv_tokens_resident_mean"] < 0.7 * free["kv_tokens_resident_mean"]


def test_speculative_decoding_divides_time_per_token_by_accepted_tokens():
    base = _deterministic()
    spec = _deterministic()
    spec_dict = spec
    spec_dict.setdefault("serving", {})["speculative"] = {"draft_tokens": 4, "acceptance_rate": 0.7,
                                                          "draft_cost_fraction": 0.1}
    a = plan(spec_from_dict(base), agents=1).to_dict()["time_per_output_token_s"]
    b = plan(spec_from_dict(spec_dict), agents=1).to_dict()["time_per_output_token_s"]
    accepted = (1 - 0.7**5) / (1 - 0.7)
    # at batch 1 the iteration is weight-bandwidth bound: verifying 5 tokens costs about as much as 1
    assert b / a == pytest.approx(1.1 / accepted, rel=0.15)


def _deepseek(dp_attention: bool) -> dict:
    d = _deterministic()
    d["model"] = {"config": "deepseek-ai/DeepSeek-V3", "weight_dtype": "fp8", "kv_dtype": "bf16"}
    d["hardware"] = {"gpu": "H200", "gpus_per_replica": 8}
    d["serving"] = {"attention_data_parallel": dp_attention}
    return d


def test_mla_kv_is_replicated_under_tp_unless_attention_is_data_parallel():
    """Under TP every GPU keeps the whole MLA latent; under attention DP (vLLM) each rank keeps its own
    requests' latent once, but also its own copy of the attention and dense weights."""
    tp = plan(spec_from_dict(_deepseek(False)), agents=4).to_dict()
    dp = plan(spec_from_dict(_deepseek(True)), agents=4).to_dict()
    assert tp["kv_replication"] == 8 and dp["kv_replication"] == 1
    a = load_architecture("deepseek-ai/DeepSeek-V3")
    routed = a.params - a.active_params + a.experts_per_token * (a.params - a.active_params) / (
        a.num_experts - a.experts_per_token)
    experts = routed * 1.0                                           # fp8: one byte a weight
    held_dp = 8 * (a.weight_bytes("fp8") - experts) + experts       # everything but the experts on every rank
    pool_tp = tp["kv_tokens_capacity"] * 8 * a.kv_bytes_per_token("bf16")
    pool_dp = pool_tp + a.weight_bytes("fp8") - held_dp
    assert dp["kv_tokens_capacity"] == pytest.approx(pool_dp / a.kv_bytes_per_token("bf16"), rel=1e-9)
    assert 4 * tp["kv_tokens_capacity"] < dp["kv_tokens_capacity"] < 8 * tp["kv_tokens_capacity"]


def test_decode_draws_less_than_provisioned_power():
    """Memory-bound decode draws a third of the idle-to-busy range (perf/power.py), far below nameplate."""
    d = plan(spec_from_dict(_deterministic()), agents=4).to_dict()
    assert d["compute_bound_share"] < 0.5
    assert d["replica"]["power_w"] < 0.6 * d["replica"]["provisioned_power_w"] / 1.3


def _prefill_heavy(disaggregation: dict | None = None, policy: str = "retain") -> dict:
    d = _deterministic(steps_per_task=10, new_input_tokens_per_call=3000, output_tokens_per_call=200, tool_wait_s=2.0)
    d["serving"] = {"tool_wait_kv_policy": policy}
    if disaggregation:
        d["serving"]["disaggregation"] = disaggregation
    return d


def test_disaggregated_prefill_takes_prefill_off_the_decode_iterations():
    from apmw.capacity.disaggregation import prefill_stage

    colocated = plan(spec_from_dict(_prefill_heavy()), agents=8)
    split = plan(spec_from_dict(_prefill_heavy({"prefill_gpus": 1})), agents=8)
    a, b = colocated.to_dict(), split.to_dict()
    assert b["time_per_output_token_s"] < a["time_per_output_token_s"]
    assert b["replica"]["gpus"] == 2 and b["replica"]["prefill_gpus"] == 1 and b["replica"]["decode_gpus"] == 1
    # the prefill instance is busy calls/s x its service time per call (Little's law)
    service = prefill_stage(split.spec, split.replica, split.sample).call_service_s
    calls_per_s = b["sessions_per_s"] * b["calls_per_session"]
    assert b["prefill_utilisation"] == pytest.approx(calls_per_s * service, rel=0.02)
    # GPU time is billed for both instances
    assert b["cost_breakdown_usd"]["gpu_time"] == pytest.approx(
        2 * 2.0 * b["task_latency_s"]["mean"] / 8 / 3600)


def test_disaggregation_with_evict_is_refused_not_guessed():
    from apmw.errors import ApmwError

    with pytest.raises(ApmwError, match="not modelled yet"):
        plan(spec_from_dict(_prefill_heavy({"prefill_gpus": 1}, policy="evict")))


def test_mtp_draft_takes_the_model_own_head_with_a_cited_acceptance():
    from apmw.arch import load_architecture
    from apmw.perf.speculative import MTP_ACCEPTANCE_RATE, speculative_decoding
    from apmw.spec.serving import Speculative

    v3 = load_architecture("deepseek-ai/DeepSeek-V3")
    mtp = speculative_decoding(Speculative(draft="mtp"), v3)
    assert (mtp.draft_tokens, mtp.acceptance_rate) == (1, MTP_ACCEPTANCE_RATE) == (v3.mtp_modules, 0.85)
    # one of 61 layers plus the 0.93 B-parameter output head, of 37.6 B active
    assert mtp.draft_cost_fraction == pytest.approx((1 / 61 + 0.025), rel=0.1)
    given = speculative_decoding(Speculative(draft="mtp", draft_tokens=2, acceptance_rate=0.6), v3)
    assert (given.draft_tokens, given.acceptance_rate) == (2, 0.6)
    assert given.draft_cost_fraction == pytest.approx(2 * mtp.draft_cost_fraction)


def test_mtp_draft_on_a_model_without_a_head_is_refused():
    d = _deterministic()
    d.setdefault("serving", {})["speculative"] = {"draft": "mtp"}
    with pytest.raises(ApmwError, match="has none .num_nextn_predict_layers is 0."):
        plan(spec_from_dict(d), agents=1)


def test_a_separate_draft_needs_its_figures():
    d = _deterministic()
    d.setdefault("serving", {})["speculative"] = {"draft_tokens": 4}
    with pytest.raises(SpecError, match="a separate draft model needs acceptance_rate"):
        spec_from_dict(d)


def test_mtp_speeds_up_deepseek_decode_by_its_accepted_tokens():
    base = plan(spec_from_dict(_deepseek(False)), agents=4).to_dict()["time_per_output_token_s"]
    d = _deepseek(False)
    d["serving"]["speculative"] = {"draft": "mtp"}
    mtp = plan(spec_from_dict(d), agents=4).to_dict()["time_per_output_token_s"]
    # 1.85 tokens per iteration, at most; verifying 2 tokens per sequence at batch 4 routes 8 tokens
    # to the experts instead of 4, so the iteration reads more expert weights and costs more
    assert 1.2 < base / mtp < 1.85 / 1.04


@pytest.mark.parametrize("engine,scale", [("vllm", 8), ("sglang", 1), ("trtllm", 8)])
def test_batch_limit_and_token_budget_under_attention_dp_follow_the_engine(engine, scale):
    from apmw.perf import replica_from_spec

    d = _deepseek(True)
    d["serving"].update(engine=engine, max_batch=64, max_batched_tokens=4096)
    policy = replica_from_spec(spec_from_dict(d)).policy
    # vLLM: one engine core per DP rank, each with its own limits; TensorRT-LLM: a scheduler per rank;
    # SGLang: the server's totals
    assert (policy.max_batch, policy.token_budget) == (64 * scale, 4096 * scale)



def test_a_rack_with_attention_dp_does_not_queue_behind_one_rank_limit():
    # 72 GB300 ranks of DeepSeek-V3 under vLLM: 256 sequences per rank, not 256 for the rack
    d = _deepseek(True)
    d["hardware"] = {"gpu": "GB300", "gpus_per_replica": 72}
    d["serving"]["max_batch"] = 256
    result = plan(spec_from_dict(d), agents=2000).to_dict()
    assert result["serving_policy"]["max_batch"] == 72 * 256
    assert result["residence_breakdown_s"]["queue"] < 0.05 * result["task_latency_s"]["mean"]
