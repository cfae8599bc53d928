"""One seeded draw of a workload's sessions, call by call (apmw.capacity.session_draw), checked call by call
against a plain loop over the sessions."""

import numpy as np
import pytest

from apmw import load_spec
from apmw.capacity.session_draw import draw_calls
from apmw.examples import __path__ as examples

EXAMPLES = ("coding-agent", "deep-research", "support-chat")


def _draw(name: str, sessions: int = 300, seed: int = 3):
    w = load_spec(f"{examples[0]}/{name}.yaml").workload
    return w, draw_calls(w, np.random.default_rng(seed), sessions)


@pytest.mark.parametrize("name", EXAMPLES)
def test_each_call_sends_the_system_prompt_its_history_and_its_new_input(name):
    w, c = _draw(name)
    assert c.calls == int(c.calls_per_session.sum()) and len(c.session_of_call) == c.calls
    assert np.array_equal(c.prompt, c.history + c.new)
    for s in range(c.sessions):
        idx = np.flatnonzero(c.session_of_call == s)
        assert idx[0] == c.session_start[s] and idx[-1] == c.last_call[s]
        written = 0.0
        for i in idx:
            if w.summarize_at_tokens is None:
                assert c.history[i] == w.system_prompt_tokens + written
            else:       # a summarised history stays under the cap and restarts from the summary
                assert c.history[i] < w.summarize_at_tokens
            written += c.new[i] + c.out[i]


@pytest.mark.parametrize("name", EXAMPLES)
def test_a_tool_wait_sits_between_steps_never_inside_one_or_before_a_task(name):
    _, c = _draw(name)
    assert not c.after_wait[c.first_in_session].any()
    assert np.all(c.wait_before[~c.after_wait] == 0)
    # the wait before a step's first call is the one after the step before it, the same seconds
    after = np.flatnonzero(c.after_wait)
    assert np.array_equal(c.wait_before[after], c.wait_after[after - 1])
    assert np.isclose(c.wait_after.sum(), c.wait_after_step.sum())
    assert len(c.wait_after_step) == int(c.steps.sum())


def test_the_same_seed_draws_the_same_sessions_another_draws_others():
    _, a = _draw("coding-agent", seed=5)
    _, b = _draw("coding-agent", seed=5)
    _, other = _draw("coding-agent", seed=6)
    assert np.array_equal(a.prompt, b.prompt) and np.array_equal(a.wait_after, b.wait_after)
    assert not np.array_equal(a.new[:50], other.new[:50])


def test_summaries_reset_the_history_at_the_cap():
    w, c = _draw("deep-research", sessions=400)
    assert w.summarize_at_tokens is not None
    assert c.resets.max() > 0, "deep-research's long sessions should reach the cap"
    assert np.all(np.diff(c.resets)[~c.first_in_session[1:]] >= 0)       # resets only accumulate in a session
    assert np.all(c.new_resets[c.first_in_session] == 0)
