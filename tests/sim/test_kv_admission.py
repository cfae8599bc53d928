"""How many requests run at the KV limit: engines that admit by need (vLLM) against the simulator,
which admits the same way, and TensorRT-LLM's reservation to the last token."""

from __future__ import annotations

import re

import pytest

from apmw.perf import replica_with_step
from apmw.spec import Serving
from apmw.perf import replica_from_spec
from apmw.perf.serving_policy import kv_tokens_per_running_request
from apmw.capacity.benchmark import kv_fit_requests, predict_with
from apmw.sim import simulate
from apmw.errors import ApmwError
from apmw.spec import spec_from_dict


def test_what_a_running_request_holds_by_engine():
    assert kv_tokens_per_running_request(1000, 400, "vllm") == 1200        # its context so far, on average
    assert kv_tokens_per_running_request(1000, 400, "trtllm") == 1400      # reserved to its last token
    # plus SGLang's new_token_ratio as retractions at the limit reset it: half the output and 20 steps
    assert kv_tokens_per_running_request(1000, 400, "sglang") == pytest.approx(1000 + 200 * (1 + 0.5 + 20 / 400))


def _benchmark(isl: int, osl: int):
    """Llama-3.1-70B fp8 on one H200 (about 55 GB of KV), lengths spread +-10 %."""
    q = lambda mean: {"quantiles": {str(x): mean * (0.9 + 0.2 * x) for x in (0.0, 0.25, 0.5, 0.75, 1.0)}}  # noqa: E731
    return spec_from_dict({
        "workload": {"steps_per_task": 1, "system_prompt_tokens": 0, "new_input_tokens_per_call": q(isl),
                     "output_tokens_per_call": q(osl), "tool_wait_s": 0.0},
        "model": {"config": "meta-llama/Meta-Llama-3.1-70B", "weight_dtype": "fp8", "kv_dtype": "fp8"},
        "hardware": {"gpu": "H200", "gpus_per_replica": 1},
        "serving": {"max_batch": 1024, "max_batched_tokens": 8192, "prefix_caching": False, "engine": "vllm"},
        "slo": {"task_latency_p95_s": 1e6},
        "cost": {"electricity_usd_per_kwh": 0.1, "gpu_hour_usd": 2.0},
    })


@pytest.mark.slow
def test_vllm_runs_as_many_requests_as_fit_on_average_not_at_full_length():
    # 4096/512 tokens: about 79 requests fit at full length, 83 at their mean context; at
    # concurrency 128 the rest queue. Reserving full lengths put the queue 5 % too long here and
    # many times too long where outputs are long (1024/1024 at concurrency 256: 37 s for 8 s).
    spec = _benchmark(4096, 512)
    step = replica_from_spec(spec).step
    assert kv_fit_requests(replica_with_step(step, Serving(engine="vllm")), 4096, 512, full_length=True) < kv_fit_requests(replica_with_step(step, Serving(engine="vllm")), 4096, 512)
    p = predict_with(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=1024)), 4096, 512, 128, requests_per_client=10**9, length_spread=0.2)
    sim = simulate(spec, 128, duration_s=30 * p.e2e_latency_s * 128 / p.running_requests, seed=1,
                   start_together=True).to_dict()
    assert sim["decode_batch_mean"] == pytest.approx(p.running_requests, rel=0.05)
    assert sim["ttft_s"]["mean"] == pytest.approx(p.ttft_s, rel=0.1)
    assert sim["tpot_s"]["mean"] == pytest.approx(p.tpot_s, rel=0.1)


def test_between_the_two_fits_vllm_runs_everyone_and_tensorrt_llm_queues():
    # (TensorRT-LLM's pool is a share of the free memory, so larger: its full-length fit is the bar)
    step = replica_from_spec(_benchmark(1024, 1024)).step
    c = kv_fit_requests(replica_with_step(step, Serving(engine="trtllm")), 1024, 1024) + 10
    assert c <= kv_fit_requests(replica_with_step(step, Serving(engine="vllm")), 1024, 1024)
    vllm = predict_with(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=1024, engine="vllm")), 1024, 1024, c)
    trt = predict_with(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=2048, engine="trtllm")), 1024, 1024, c)
    assert vllm.queued_requests == 0 and vllm.running_requests == c
    assert trt.queued_requests > 0


@pytest.mark.slow
def test_tensorrt_llm_reserves_to_the_last_token_in_the_simulator_too():
    # between the two fits: vLLM's engine runs everyone, TensorRT-LLM's runs its full-length fit,
    # queues the rest and never preempts; apmw predict agrees on both
    base = _benchmark(1024, 1024)
    spec = base.model_copy(update={"serving": base.serving.model_copy(update={"engine": "trtllm",
                                                                             "kv_memory_fraction": 0.9})})
    step = replica_from_spec(spec).step
    c = kv_fit_requests(replica_with_step(step, Serving(engine="vllm")), 1024, 1024) - 5
    p = predict_with(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=1024, engine="trtllm")), 1024, 1024, c, requests_per_client=10**9, length_spread=0.2)
    sims = {}
    for engine in ("trtllm", "vllm"):
        s = spec.model_copy(update={"serving": spec.serving.model_copy(update={"engine": engine})})
        sims[engine] = simulate(s, c, duration_s=20 * p.e2e_latency_s, seed=1, start_together=True).to_dict()
    assert sims["trtllm"]["preemptions"] == 0 and sims["vllm"]["preemptions"] > 0
    # vLLM runs more at once (218.8 against 198.9 before session 9 rebuilt the decode-attention
    # tables' long-context extension, 218.4 against 198.9 after: 1.10x and 1.098x)
    assert sims["vllm"]["decode_batch_mean"] > 1.05 * sims["trtllm"]["decode_batch_mean"]
    assert p.queued_requests > 0
    assert sims["trtllm"]["decode_batch_mean"] == pytest.approx(p.running_requests, rel=0.05)
    assert sims["trtllm"]["ttft_s"]["mean"] == pytest.approx(p.ttft_s, rel=0.15)


@pytest.mark.slow
def test_sglang_keeps_back_what_its_retractions_reset_new_token_ratio_to(monkeypatch):
    # past the KV limit the simulated SGLang engine (its new_token_ratio adapting as SGLang's does)
    # runs about as many requests as apmw predict counts, with few retractions: 4096/512 tokens
    import numpy as np

    import apmw.sim.engine as engine_module
    import apmw.sim.run as run_module

    base = _benchmark(4096, 512)
    spec = base.model_copy(update={"serving": base.serving.model_copy(update={"engine": "sglang"})})
    step = replica_from_spec(spec).step
    c = kv_fit_requests(replica_with_step(step, Serving(engine="sglang")), 4096, 512) + 40
    p = predict_with(replica_with_step(step, Serving(max_batched_tokens=8192, max_batch=1024, engine="sglang")), 4096, 512, c, requests_per_client=10**9, length_spread=0.2)
    running = []

    class Counting(engine_module.Engine):
        def step_once(self):
            done = super().step_once()
            running.append((self.now, len(self.running)))
            return done

    monkeypatch.setattr(run_module, "Engine", Counting)
    duration_s = 30 * p.e2e_latency_s * c / p.running_requests
    sim = simulate(spec, c, duration_s=duration_s, seed=1, start_together=True).to_dict()
    late = np.array([n for t, n in running if t > duration_s / 5])
    assert late.mean() == pytest.approx(p.running_requests, rel=0.05)
    assert sim["ttft_s"]["mean"] == pytest.approx(p.ttft_s, rel=0.1)
    assert sim["preemptions"] < 0.1 * sim["completed_tasks"]


def _first_call_of(tokens: int, kv_tokens: int):
    """The simulator's small spec, its first call ``tokens`` long, with KV memory for about ``kv_tokens``."""
    from tests.sim.helpers import kv_fraction_for, spec_with

    return spec_with(workload={"first_call_input_tokens": tokens}, kv_memory_fraction=kv_fraction_for(kv_tokens))


def test_calls_that_never_fit_the_pool_are_refused_not_looped_on():
    """Every task's first call needs more KV than the whole pool: each is rejected and the agent's next task
    follows at once, so the simulated clock would stand still forever. The simulator stops and says why."""
    with pytest.raises(ApmwError, match=r"no call fits: 1,000 calls in a row were rejected.*more than the "
                                        r"replica's whole KV pool") as caught:
        simulate(_first_call_of(6000, 4000), agents=2, duration_s=600)
    tokens = int(re.search(r"the last needs the KV of ([\d,]+) tokens by its last one", str(caught.value))[1]
                 .replace(",", ""))
    assert tokens > 6600        # the system prompt's 600, the call's 6,000 and its output


def test_a_workload_whose_long_tasks_outgrow_the_pool_still_runs():
    """First calls that fit, later calls of long tasks that outgrow the pool: those tasks are rejected and
    counted, the others end, and the run goes on."""
    r = simulate(_first_call_of(3000, 4000), agents=2, duration_s=600)
    assert 0 < r.tasks_rejected < r.tasks_ended


def test_a_replayed_call_the_pool_can_never_hold_is_rejected_at_arrival():
    """A call whose prompt and output need more KV than the whole pool (a trace's outlier): its first chunk
    would be admitted, grow, be preempted and computed again without end. It is rejected as it arrives, its
    task counted as rejected, and the other tasks run; where every call is such, the run stops with the reason."""
    from apmw.sim import TaskShape
    from tests.sim.helpers import kv_fraction_for, spec

    s = spec(kv_memory_fraction=kv_fraction_for(4000))
    fine, huge = TaskShape([300, 200], [100, 100], [2.0, 0.0]), TaskShape([3000], [2000], [1.0])
    r = simulate(s, agents=2, duration_s=600, tasks=[fine, huge, fine])
    assert r.tasks_rejected > 0 and r.tasks_ended > r.tasks_rejected and r.rejected_calls == r.tasks_rejected
    with pytest.raises(ApmwError, match="5,599 tokens by its last one"):
        simulate(s, agents=2, duration_s=600, tasks=[huge])


def test_a_replayed_task_with_a_wait_that_is_not_a_number_is_refused():
    from apmw.sim import TaskShape
    from tests.sim.helpers import spec

    with pytest.raises(ApmwError, match="finite"):
        simulate(spec(), agents=2, duration_s=60, tasks=[TaskShape([5], [10], [float("nan")])])
