"""A call's own prefill and its wait behind other prompts' prefill (apmw.capacity.prefill_queue)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from apmw.capacity import plan
from apmw.capacity.prefill_queue import own_prefill_s, prefill_queue, queued_work_s
from apmw.spec import load_spec, spec_from_dict
from tests.e2e.test_cli import EXAMPLES


def _queue_sample(seed: int = 0, calls: int = 200_000) -> SimpleNamespace:
    tokens = np.random.default_rng(seed).lognormal(8.0, 1.5, calls)       # heavy-tailed prompts
    return SimpleNamespace(call_prefill_tokens_sample=tokens, call_prefill_attention_s_sample=np.zeros(calls))


def prefill_queue_wait(s, rate, per_token, base, budget, seed):
    q = prefill_queue(s, rate, per_token, base, budget, seed)
    return q.mean_s, q.waits_s(), q.utilisation


def _lindley_waits(service_s: np.ndarray, rate_per_s: float, seed: int) -> np.ndarray:
    """An M/G/1 FCFS queue run customer by customer: W' = max(0, W + S - A)."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate_per_s, len(service_s))
    waits, w = np.empty(len(service_s)), 0.0
    for i, (s, a) in enumerate(zip(service_s, gaps)):
        waits[i] = w
        w = max(0.0, w + s - a)
    return waits


def test_the_wait_has_the_mean_pollaczek_khinchine_gives():
    s = _queue_sample()
    per_token, base, budget, rate = 1e-4, 0.02, 8192, 0.5
    mean, waits, rho = prefill_queue_wait(s, rate, per_token, base, budget, seed=1)
    svc = s.call_prefill_tokens_sample * (per_token + base / budget)
    assert rho == pytest.approx(rate * svc.mean())
    assert mean == pytest.approx(rate * (svc**2).mean() / (2 * (1 - rho)))
    assert (waits > 0).mean() == pytest.approx(rho, abs=0.01)
    assert waits.mean() == pytest.approx(mean, rel=0.05)
    # busier engine, longer wait; no traffic, no wait
    assert prefill_queue_wait(s, 2 * rate, per_token, base, budget, seed=1)[0] > 2 * mean
    assert prefill_queue_wait(s, 0.0, per_token, base, budget, seed=1)[0] == 0.0


@pytest.mark.parametrize("rho_target", [0.3, 0.7])
def test_the_wait_has_the_tail_of_a_queue_run_customer_by_customer(rho_target):
    """The law of the wait is exact, not a mean-matched exponential: its p95 and p99 match a Lindley run of the
    same heavy-tailed services (an exponential tail of the same mean puts the p99 off by a third here)."""
    s = _queue_sample(calls=100_000)
    svc = s.call_prefill_tokens_sample * 1e-4
    rate = rho_target / svc.mean()
    mean, waits, rho = prefill_queue_wait(s, rate, 1e-4, 0.0, 8192, seed=3)
    run = _lindley_waits(np.random.default_rng(4).permutation(np.tile(svc, 4)), rate, seed=5)[20_000:]
    for q in (0.95, 0.99):
        assert np.quantile(waits, q) == pytest.approx(np.quantile(run, q), rel=0.1), q
    exponential = np.where(np.random.default_rng(6).random(len(waits)) < rho,
                           np.random.default_rng(7).exponential(mean / rho, len(waits)), 0.0)
    assert abs(np.quantile(exponential, 0.99) / np.quantile(run, 0.99) - 1) > 0.2


def test_the_same_seed_draws_the_same_waits():
    s = _queue_sample(calls=20_000)
    a = prefill_queue_wait(s, 0.4, 1e-4, 0.01, 8192, seed=9)[1]
    b = prefill_queue_wait(s, 0.4, 1e-4, 0.01, 8192, seed=9)[1]
    assert np.array_equal(a, b)
    assert not np.array_equal(a, prefill_queue_wait(s, 0.4, 1e-4, 0.01, 8192, seed=10)[1])


@pytest.fixture(scope="module")
def support_sample():
    return plan(load_spec(EXAMPLES / "support-chat.yaml")).sample


def test_a_call_s_own_prefill_grows_faster_than_its_tokens(support_sample):
    """The step model prices each call's chunks at its own attention: the longest prompts cost more per token
    than the common ones (attention grows with the square of the prompt), and the calls together cost what the
    curve's line gives."""
    s = support_sample
    base, per_token = 0.02, 4e-5
    own = own_prefill_s(s, base, per_token)
    line = s.call_prefill_iters_sample * base + s.call_prefill_tokens_sample * per_token
    assert own.sum() == pytest.approx(line.sum())
    per_tok = own / s.call_prefill_tokens_sample
    long = s.call_prefill_tokens_sample > np.quantile(s.call_prefill_tokens_sample, 0.999)
    mid = (s.call_prefill_tokens_sample > 5_000) & (s.call_prefill_tokens_sample < 20_000)
    assert per_tok[long].mean() > 2 * per_tok[mid].mean()
    assert own.max() > 1.5 * line.max()


def test_a_lone_agent_never_waits_behind_another_prompt():
    """One agent's call finds the engine idle (the arrival theorem: the loop at one agent fewer), however short
    its tool waits: its TTFT p95 is its own prefill's, the same at a 0.1 s wait as at support-chat's minutes."""
    spec = load_spec(EXAMPLES / "support-chat.yaml")
    quick = spec.model_copy(update={"workload": spec.workload.model_copy(
        update={"tool_wait_s": spec.workload.tool_wait_s.model_copy(update={"p50": 0.1, "p95": 0.5})})})
    slow_ttft = plan(spec, agents=1).at.ttft_p95_s
    quick_ttft = plan(quick, agents=1).at.ttft_p95_s
    assert quick_ttft == pytest.approx(slow_ttft, rel=0.02)
    assert plan(spec, agents=2).at.ttft_p95_s > slow_ttft


def test_a_prompt_queues_its_attention_and_its_tokens_share_of_the_rest():
    """Prompts share iterations: the work a call queues is its own attention plus the rest of the total by its
    tokens (a 26-token follow-up's share of an iteration's weights read is 26 tokens' worth, not the whole read)."""
    tokens = np.array([26.0, 1_000.0, 100_000.0])
    attention = np.array([0.0, 0.001, 20.0])
    work = queued_work_s(attention, tokens, 30.0)
    assert work.sum() == pytest.approx(30.0)
    per_token = (30.0 - 20.001) / tokens.sum()
    assert work == pytest.approx(attention + tokens * per_token)
    # attention past the total is scaled to it (the line's total is the curve's)
    assert queued_work_s(attention, tokens, 10.0).sum() == pytest.approx(10.0)


def test_a_call_s_attention_is_priced_on_its_replica(support_sample):
    s = support_sample
    alone, attention = s.call_prefill_alone_s_sample, s.call_prefill_attention_s_sample
    assert np.all(attention >= 0) and np.all(attention < alone)
    long = s.call_prefill_tokens_sample > 100_000
    short = s.call_prefill_tokens_sample < 5_000
    # attention grows with the square of the prompt: most of a long prompt's time, little of a short one's
    assert (attention[long] / alone[long]).mean() > 0.5 > 5 * (attention[short] / alone[short]).mean()


def test_the_waits_are_drawn_only_where_a_ttft_is_read(monkeypatch):
    """Drawing every call's wait costs more than the rest of an evaluation; a spec without a TTFT SLO reads the
    TTFT only at its answer, so its N* search draws none (coding-agent: 35 evaluations a plan)."""
    from apmw.capacity import closed_loop
    from apmw.capacity.prefill_queue import PrefillQueue

    draws = []
    waits_s = PrefillQueue.waits_s
    monkeypatch.setattr(PrefillQueue, "waits_s", lambda self: draws.append(1) or waits_s(self))
    coding = load_spec(EXAMPLES / "coding-agent.yaml")
    assert coding.slo.ttft_p95_s is None
    p = plan(coding)
    assert len(draws) <= 2
    p.to_dict()
    assert len(draws) <= 3
    draws.clear()
    closed_loop._EVALUATIONS.clear()      # the evaluations the coding agent's plan made are not made again
    plan(load_spec(EXAMPLES / "support-chat.yaml"))        # its TTFT SLO binds: every count searched reads it
    assert len(draws) > 5


def test_a_prompt_waits_behind_at_most_the_other_agents_prompts():
    """A closed population: with N agents a prompt finds at most N - 1 others queued, so its wait is at most N - 1
    of the longest services, and the mean is the cut geometric's; a queue past its utilisation cap (long prompts,
    nothing else keeping the engine busy) no longer puts two agents' calls behind dozens of prompts."""
    s = _queue_sample(calls=50_000)
    per_token, base, budget = 1e-4, 0.0, 8192
    svc = s.call_prefill_tokens_sample * per_token
    rate = 0.9 / svc.mean()
    uncut = prefill_queue(s, rate, per_token, base, budget, seed=2)
    for ahead in (0, 1, 3, 12):
        cut = prefill_queue(s, rate, per_token, base, budget, seed=2, most_ahead=ahead)
        waits = cut.waits_s()
        assert waits.max() <= ahead * svc.max() + 1e-12
        assert cut.mean_s == pytest.approx(uncut.mean_s * (1 - uncut.utilisation ** ahead))
        if ahead:
            assert waits.mean() == pytest.approx(cut.mean_s, rel=0.1)
            assert np.all(waits <= uncut.waits_s() + 1e-12)     # the same draws, cut: never longer
    # far more agents than the law ever queues: the cut changes nothing, to the bit
    many = prefill_queue(s, rate, per_token, base, budget, seed=2, most_ahead=1000)
    assert many.mean_s == uncut.mean_s and np.array_equal(many.waits_s(), uncut.waits_s())


def test_two_agents_sending_long_prompts_do_not_queue_behind_a_crowd():
    """8,000-token prompts, one output token, no tool wait (fuzz round 7): every call is one prefill of about
    0.2 s on one H100, so two agents' calls wait for at most the other's. The uncut queue sat at its
    utilisation cap and put the task p95 at 24 s at two agents (the simulator: 0.4 s)."""
    d = {"workload": {"name": "long prompts", "steps_per_task": 1, "calls_per_step": 1, "system_prompt_tokens": 0,
                      "first_call_input_tokens": 8000, "new_input_tokens_per_call": 0, "output_tokens_per_call": 1,
                      "tool_wait_s": 0},
         "model": {"config": "meta-llama/Meta-Llama-3.1-8B"}, "hardware": {"gpu": "H100", "gpus_per_replica": 1},
         "serving": {"max_batch": 64}, "slo": {"task_latency_p95_s": 1000},
         "cost": {"gpu_hour_usd": 2, "electricity_usd_per_kwh": 0.1}}
    s = spec_from_dict(d)
    alone = plan(s, agents=1).at
    two = plan(s, agents=2).at
    assert alone.task_latency_p95_s == pytest.approx(0.2, rel=0.1)
    assert two.task_latency_p95_s < 4.0          # was 24.4 s
    assert two.task_latency_mean_s < 1.5         # was 8.4 s
    # a call's own prefill rides on the decoders alone, not on the other prompts' chunks the queue already holds:
    # at 13 agents 14 s (the simulator: 2.6 s), where the base that carried them gave 434 s
    thirteen = plan(s, agents=13).at
    assert thirteen.task_latency_p95_s < 30.0 and thirteen.prefill_s < 2 * alone.prefill_s


def test_the_base_a_prefill_rides_on_leaves_the_other_prompts_out():
    """The curve's decode iteration without the other calls' chunks: never longer than the decode iteration that
    carries them, the same where no other call is running (one agent), and shorter once others prefill beside it."""
    from apmw.capacity.engine_curve import engine_curve
    from apmw.capacity.prefill_queue import priced_on

    result = plan(load_spec(EXAMPLES / "support-chat.yaml"))
    step = result.replica.step
    curve = engine_curve(step, priced_on(step, result.sample), 64)
    alone, carrying = curve.decode_alone_iteration_s, curve.decode_iteration_s
    assert alone is not None and np.all(alone <= carrying + 1e-15)
    assert alone[0] == pytest.approx(carrying[0]) and alone[-1] < carrying[-1]
