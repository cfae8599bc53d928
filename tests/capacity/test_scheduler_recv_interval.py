"""SGLang's --scheduler-recv-interval (serving.scheduler_recv_interval): a busy scheduler takes new calls in
every N decode iterations, so an arriving prompt waits half of them (apmw.perf.serving_policy)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from apmw.capacity.benchmark import predict
from apmw.errors import ApmwError
from apmw.perf.serving_policy import busy_arrival_wait_s
from apmw.sim import simulate
from tests.sim.helpers import spec

B200_R1 = dict(model="deepseek-ai/DeepSeek-R1", gpu="B200", tp=8, weight_dtype="fp8", kv_dtype="fp8", isl=1024,
               osl=1024, engine="sglang")


def test_a_call_waits_half_the_span_between_polls():
    assert busy_arrival_wait_s(0.01, 0) == pytest.approx(0.005)
    assert busy_arrival_wait_s(0.01, 1, recv_interval=30) == pytest.approx(0.16)


def test_the_benchmark_ttft_grows_by_the_extra_poll_wait_and_tpot_stays():
    base = predict(**B200_R1, concurrency=64)
    polled = predict(**B200_R1, concurrency=64, scheduler_recv_interval=30)
    assert polled.tpot_s == base.tpot_s
    # in the steady state, 14.5 more of the mean iteration (decodes and the prefills between them) than
    # polling every iteration; the first wave finds the engine idle and is taken in at once
    extra = polled.ttft_parts_s["steady_state"] - base.ttft_parts_s["steady_state"]
    assert 14.5 * base.decode_iteration_s < extra < 14.5 * base.tpot_s
    assert polled.ttft_s > base.ttft_s + 0.85 * extra    # the first wave is a tenth of the prompts
    assert polled.serving_policy["recv_interval"] == 30
    lone = [predict(**B200_R1, concurrency=1, scheduler_recv_interval=k).ttft_s for k in (1, 30)]
    assert lone[0] == lone[1]          # a lone client's prompt finds the engine idle: polled at once


def test_the_simulator_holds_arrivals_until_the_next_poll():
    ttft = {k: simulate(spec(engine="sglang", scheduler_recv_interval=k), 10, duration_s=200, seed=3,
                        warmup_s=20).to_dict()["ttft_s"]["mean"] for k in (1, 10, 30)}
    assert ttft[1] < ttft[10] < ttft[30]
    assert ttft[30] - ttft[1] > 2.5 * (ttft[10] - ttft[1])      # about (30 - 1) / (10 - 1) times the extra wait


def test_other_engines_and_disaggregation_refuse_it_naming_the_field_and_the_flag():
    from apmw.spec.load import SpecError

    for serving, why in (({"engine": "vllm", "scheduler_recv_interval": 10},
                          "scheduler_recv_interval: 10 is SGLang's --scheduler-recv-interval; engine vllm takes new "
                          "requests before every iteration"),
                         ({"engine": "sglang", "scheduler_recv_interval": 10, "disaggregation": {"prefill_gpus": 1}},
                          "scheduler_recv_interval: 10 is not modelled with disaggregation")):
        with pytest.raises((SpecError, ApmwError), match=why):
            spec(**serving)
    from apmw.cli import _register_verbs, app

    _register_verbs()
    base = ["predict", "--model", "deepseek-ai/DeepSeek-R1", "--gpu", "B200", "--tp", "8", "--weight-dtype", "fp8",
            "--kv-dtype", "fp8", "--isl", "1024", "--osl", "1024", "--concurrency", "64"]
    r = CliRunner().invoke(app, [*base, "--engine", "vllm", "--scheduler-recv-interval", "10"])
    assert r.exit_code == 1 and "--scheduler-recv-interval: 10 is SGLang's" in r.output
    r = CliRunner().invoke(app, [*base, "--engine", "sglang", "--scheduler-recv-interval", "30", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["serving_policy"]["recv_interval"] == 30
