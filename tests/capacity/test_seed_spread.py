"""A plan's answer rests on one seeded session sample: it should not move much with the seed.

Support-chat's TTFT p95 is set by the prefill queue its longest prompts build, and drawn
independently the top of its prompt table is met by some samples and missed by others: its
analytic N* ran from 12 to 20 agents over seeds 0-7. Stratified draws (the midpoint of each stratum of
every quantity, ``apmw.spec.distribution.stratified_uniforms``) keep it within three agents.
"""

import numpy as np

from apmw.capacity import plan
from apmw.capacity.sessions import sample_sessions
from apmw.perf import replica_from_spec
from apmw.spec import load_spec
from tests.conftest import EXAMPLES


def _seeded(seed: int):
    spec = load_spec(EXAMPLES / "support-chat.yaml")
    return spec.model_copy(update={"seed": seed})


def test_support_chat_s_n_star_moves_little_with_the_seed():
    answers = [plan(_seeded(seed)).agents_per_replica for seed in range(8)]
    assert max(answers) - min(answers) <= 3, answers


def test_a_sample_s_per_call_means_are_the_distribution_s_whatever_its_seed():
    # independent draws put 30,000 calls' mean output 0.3 % (one token) from 343 at one standard deviation
    spec = _seeded(0)
    for seed in range(4):
        s = _seeded(seed)
        sample = sample_sessions(s, replica_from_spec(s))
        mean_out = sample.output_tokens.sum() / sample.calls.sum()
        assert abs(mean_out / spec.workload.output_tokens_per_call.mean - 1) < 5e-4, (seed, mean_out)


def test_the_share_of_calls_that_find_a_prefill_queue_is_its_utilisation():
    from apmw.capacity.prefill_queue import _log_uniforms

    calls = 10_000
    for seed in range(3):
        log_u = _log_uniforms(seed, calls)
        for rho in (0.05, 0.3, 0.7, 0.95):
            share = float(np.mean(np.floor(log_u / np.log(rho)) >= 1))
            assert abs(share - rho) <= 1.5 / calls, (seed, rho, share)


def test_the_queue_draws_follow_their_distributions_whatever_the_seed():
    # independent draws put 20,000 unit exponentials' mean 0.1-1.2 % from 1 over these seeds, and the
    # sessions' Gamma(calls, 1) sums 0.1-1.1 % from the mean calls; stratified, 0.002 % and 0.001 %
    for name in ("coding-agent", "support-chat"):
        for seed in range(4):
            s = load_spec(EXAMPLES / f"{name}.yaml").model_copy(update={"seed": seed})
            sample = sample_sessions(s, replica_from_spec(s))
            waits = sample.call_queue_exp
            assert abs(waits.mean() - 1) < 1e-4, (name, seed, waits.mean())
            assert abs(np.quantile(waits, 0.95) / -np.log(0.05) - 1) < 1e-3, (name, seed)
            assert abs(sample.queue_gamma.mean() / sample.calls.mean() - 1) < 1e-4, (name, seed)
