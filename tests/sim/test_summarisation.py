"""History summarisation in the simulator: the extra call, the restarted context, and agreement with the plan."""

from __future__ import annotations

import pytest

from apmw.capacity import plan
from apmw.sim import simulate, unsupported
from apmw.sim.engine import Engine
from apmw.spec import spec_from_dict
from tests.conftest import small_spec_dict

AT, SUMMARY = 5000, 400


def summarising_spec():
    d = small_spec_dict()
    d["workload"] |= {"summarize_at_tokens": AT, "summary_tokens": SUMMARY}
    return spec_from_dict(d)


@pytest.fixture()
def submitted(monkeypatch):
    """(agent, prompt, output tokens) of every call the agents hand the (real) engine, in order."""
    calls = []
    real = Engine.submit

    def spy(self, seq, t):
        calls.append((seq.agent, seq.total, seq.out))
        return real(self, seq, t)

    monkeypatch.setattr(Engine, "submit", spy)
    return calls


def test_a_session_past_the_cap_writes_a_summary_and_restarts_from_it(submitted):
    spec = summarising_spec()
    assert unsupported(spec) is None
    result = simulate(spec, 4, duration_s=1800, seed=3)
    assert result.completed_tasks > 0
    system = spec.workload.system_prompt_tokens
    summary = [i for i, (_, p, o) in enumerate(submitted) if p > AT and o == SUMMARY]
    assert summary, "no session reached the cap"
    # the summary call reads the whole context (at least the cap) plus one instruction token
    assert min(submitted[i][1] for i in summary) >= AT + 1
    # the agent's next call starts from system prompt + summary and its own new tokens
    after = [p for p in (next((p for a, p, _ in submitted[i + 1:] if a == submitted[i][0]), None) for i in summary)
             if p is not None]
    assert after and min(after) > system + SUMMARY and max(after) < system + SUMMARY + 3000
    # no other call's context before its own new tokens reached the cap
    assert all(p < AT + 3000 for i, (_, p, _) in enumerate(submitted) if i not in summary)


def test_without_the_cap_the_same_sessions_grow_past_it(submitted):
    d = small_spec_dict()
    simulate(spec_from_dict(d), 4, duration_s=1800, seed=3)
    assert max(p for _, p, _ in submitted) > AT + 2000


def test_the_simulated_kv_and_throughput_agree_with_the_plan():
    spec = summarising_spec()
    agents = 40
    analytic = plan(spec, agents=agents).to_dict()
    sim = simulate(spec, agents, duration_s=6000, seed=1)
    # measured: 86,242 against 87,209 KV tokens, 0.885 against 0.879 sessions/s (106,908 and 0.836 while the
    # plan counted the system prompt twice in a summarising session's history)
    assert sim.kv_tokens_resident_mean == pytest.approx(analytic["kv_tokens_resident_mean"], rel=0.05)
    assert sim.sessions_per_s == pytest.approx(analytic["sessions_per_s"], rel=0.03)


def test_a_cap_no_session_reaches_changes_nothing_in_the_plan():
    d = small_spec_dict()
    plain = plan(spec_from_dict(d), agents=40).to_dict()
    d["workload"]["summarize_at_tokens"] = 200_000
    capped = plan(spec_from_dict(d), agents=40).to_dict()
    for field in ("kv_tokens_resident_mean", "sessions_per_s", "ttft_p95_s", "energy_per_session_j"):
        assert capped[field] == pytest.approx(plain[field], rel=1e-12), field
