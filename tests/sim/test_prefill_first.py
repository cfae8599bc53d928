"""SGLang's scheduler (prefill first, never mixed with decode) in the simulator, against `apmw predict`."""

from __future__ import annotations

import pytest

from apmw.perf import replica_with_step
from apmw.spec import Serving
from apmw.perf import replica_from_spec
from apmw.perf.serving_policy import mixes_prefill_with_decode
from apmw.capacity.benchmark import predict_with
from apmw.sim import simulate
from apmw.sim.stats import Meter
from apmw.spec import spec_from_dict
from tests.sim.helpers import spec


def test_which_engines_mix_prefill_with_decode():
    assert mixes_prefill_with_decode("vllm") and mixes_prefill_with_decode("trtllm")
    assert not mixes_prefill_with_decode("sglang")
    assert mixes_prefill_with_decode("sglang", mixed=True)        # SGLang --enable-mixed-chunk
    assert not mixes_prefill_with_decode("vllm", mixed=False)
    # attention data parallel: each rank picks its own forward mode every step, so one rank's prompt runs
    # beside the other ranks' decodes (SGLang's MLPSyncBatchInfo.local_forward_mode)
    assert mixes_prefill_with_decode("sglang", attention_dp_ranks=8)
    assert not mixes_prefill_with_decode("sglang", mixed=False, attention_dp_ranks=8)


def test_attention_data_parallel_ranks_do_not_stall_each_other_for_a_prompt():
    """DeepSeek-V4-Pro on SGLang over 8 B300s as DP8 x EP8: the replica's iterations carry one rank's prompt
    beside the other ranks' decodes, so a decoder is not held up by another rank's prompt."""
    import yaml
    from pathlib import Path
    from apmw.capacity import plan

    d = yaml.safe_load((Path(__file__).resolve().parents[1] / "fixtures/specs/deepseek-v4-pro.yaml").read_text())
    d["hardware"] = {"gpu": "B300"}
    d["serving"].update(engine="sglang", parallelism={"dp_attention": 8, "ep": 8})
    d["serving"].pop("max_batch", None)
    rep = replica_from_spec(spec_from_dict(d))
    assert rep.policy.mixed_prefill
    d["serving"]["mixed_prefill"] = False          # as if one scheduler ran the whole replica prefill-first
    stalled = plan(spec_from_dict(d), agents=400).to_dict()
    del d["serving"]["mixed_prefill"]
    ranks = plan(spec_from_dict(d), agents=400).to_dict()
    assert ranks["time_per_output_token_s"] < 0.9 * stalled["time_per_output_token_s"]


def _iteration_kinds(monkeypatch, s) -> set[tuple[bool, bool]]:
    """(carries decodes, carries prompt tokens) of every simulated iteration: those the engine steps one
    at a time, and the all-decode segments it skips through (apmw.sim.stats.Meter sees both)."""
    kinds = set()
    iteration, segment = Meter.iteration, Meter.segment

    def one(self, now, t, decode, running, kv_tokens_s, used_blocks, load=None):
        kinds.add((bool(load.decode_seqs > 0), bool(load.prefill_tokens > 0)))
        return iteration(self, now, t, decode, running, kv_tokens_s, used_blocks, load)

    def many(self, now, t, *args, **kw):
        kinds.add((True, False))
        return segment(self, now, t, *args, **kw)

    monkeypatch.setattr(Meter, "iteration", one)
    monkeypatch.setattr(Meter, "segment", many)
    simulate(s, 8, duration_s=120, seed=3)
    return kinds


def test_sglang_iterations_carry_prompts_or_decodes_never_both(monkeypatch):
    assert (True, True) in _iteration_kinds(monkeypatch, spec(engine="vllm"))
    kinds = _iteration_kinds(monkeypatch, spec(engine="sglang"))
    assert (True, True) not in kinds and {(True, False), (False, True)} <= kinds
    assert (True, True) in _iteration_kinds(monkeypatch, spec(engine="sglang", mixed_prefill=True))


def _benchmark(engine: str, isl: int = 1024, osl: int = 512, spread: float = 0.0):
    """A fixed-concurrency benchmark on Llama-3.1-8B bf16, one H200: lengths uniform over +-spread/2
    of the mean (equal at 0)."""
    def lengths(mean: int):
        return mean if not spread else {"quantiles": {str(q): mean * (1 - spread / 2 + spread * q)
                                                      for q in (0.0, 0.25, 0.5, 0.75, 1.0)}}
    return spec_from_dict({
        "workload": {"steps_per_task": 1, "system_prompt_tokens": 0, "new_input_tokens_per_call": lengths(isl),
                     "output_tokens_per_call": lengths(osl), "tool_wait_s": 0.0},
        "model": {"config": "meta-llama/Meta-Llama-3.1-8B", "weight_dtype": "bf16", "kv_dtype": "bf16"},
        "hardware": {"gpu": "H200", "gpus_per_replica": 1},
        "serving": {"max_batch": 1024, "max_batched_tokens": 8192, "prefix_caching": False, "engine": engine},
        "slo": {"task_latency_p95_s": 1e6},
        "cost": {"electricity_usd_per_kwh": 0.1, "gpu_hour_usd": 2.0},
    })


def test_equal_lengths_under_prefill_first_repeat_the_whole_wave_every_cycle():
    # 32 clients x 1024 tokens = four full prefill iterations before anyone decodes; they then
    # finish together and come back together, so every cycle's TTFT is the first wave's.
    sims = {}
    for engine in ("sglang", "vllm"):
        s = _benchmark(engine)
        sims[engine] = simulate(s, 32, duration_s=60, warmup_s=20, seed=1, start_together=True).to_dict()
    step = replica_from_spec(_benchmark("sglang")).step
    p = predict_with(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=1024, engine="sglang")), 1024, 512, 32, requests_per_client=10**9, length_spread=0.0)
    assert p.lockstep_share == 1.0 and not p.prefill_mixed_with_decode
    assert sims["sglang"]["ttft_s"]["mean"] == pytest.approx(p.ttft_s, rel=0.01)
    assert sims["sglang"]["tpot_s"]["mean"] == pytest.approx(p.tpot_s, rel=0.01)
    # vLLM's mixed groups stay one packed iteration apart instead: a returning group waits for the
    # packed iteration already scheduled (the group before's) and its own, not for a whole wave
    vllm = predict_with(replica_with_step(replica_from_spec(_benchmark("vllm")).step, Serving(max_batched_tokens=8192, max_batch=1024, engine="vllm")), 1024, 512, 32, requests_per_client=10**9, length_spread=0.0)
    assert sims["vllm"]["ttft_s"]["mean"] == pytest.approx(vllm.ttft_s, rel=0.05)
    assert sims["vllm"]["ttft_s"]["mean"] < 0.7 * sims["sglang"]["ttft_s"]["mean"]


def test_spread_out_prompts_stall_every_decoder_as_predicted():
    # 200/200 tokens, lengths spread 0.2, 64 clients: each decoder sits through the others'
    # prefill iterations; the simulator's TPOT (not a formula) is the reference
    s = _benchmark("sglang", 200, 200, spread=0.2)
    step = replica_from_spec(s).step
    p = predict_with(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=1024, engine="sglang")), 200, 200, 64, requests_per_client=10**9, length_spread=0.2)
    mixed = predict_with(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=1024, engine="sglang", mixed_prefill=True)), 200, 200, 64, requests_per_client=10**9, length_spread=0.2)
    sim = simulate(s, 64, duration_s=120, warmup_s=30, seed=1, start_together=True).to_dict()
    assert sim["tpot_s"]["mean"] == pytest.approx(p.tpot_s, rel=0.05)
    assert p.tpot_s > 1.15 * mixed.tpot_s


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_one_output_token_queues_behind_every_other_prompt(engine):
    # no decode: a request comes back as soon as it is prefilled, so at 64 clients x 1024 tokens
    # (eight full iterations) every prompt waits for all the others
    s = _benchmark(engine, 1024, 1)
    step = replica_from_spec(s).step
    p = predict_with(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=1024, engine=engine)), 1024, 1, 64, requests_per_client=10**9, length_spread=0.2)
    sim = simulate(s, 64, duration_s=60, seed=1, start_together=True).to_dict()
    assert sim["ttft_s"]["mean"] == pytest.approx(p.ttft_s, rel=0.05)
