"""Each reader on a real (or real-SDK-generated) fixture, against figures checked by hand.

The hand checks are in the comments: sums over the fixture rows or the generator's table
(scripts/make_otel_fixtures.py SESSIONS), not outputs of apmw.
"""

from __future__ import annotations

import pytest

from apmw.traces import fit_trace
from apmw.traces.formats import detect
from tests.traces.conftest import FIXTURES


@pytest.mark.parametrize("name, fmt", [
    ("mini_swe_calls_3sessions.csv", "mini-swe-agent"),
    ("azure_code_head100.csv", "azure"),
    ("mooncake_conversation_head200.jsonl", "mooncake"),
    ("aiperf_mooncake_sessions.jsonl", "mooncake"),
    ("aiperf_multi_turn.jsonl", "aiperf-multi-turn"),
    ("agentperf_two_tasks.jsonl", "agentperf"),
    ("otel_genai.jsonl", "otel"),
    ("otel_legacy.jsonl", "otel"),
    ("openinference.jsonl", "otel"),
    ("otel_conversation_on_agent.jsonl", "otel"),
    ("otel_steps.jsonl", "otel"),
])
def test_format_is_recognised(name, fmt):
    assert detect(FIXTURES / name) == fmt


def test_mini_swe_subset_hand_checked():
    s = fit_trace(FIXTURES / "mini_swe_calls_3sessions.csv").summary
    # 104 + 74 + 74 rows in three (run, instance_id) sessions
    assert (s["sessions"], s["calls"]) == (3, 252)
    assert s["calls_per_session"]["mean"] == pytest.approx(84.0)
    # sum(cached_prompt_tokens) / sum(prompt_tokens) over the 252 rows
    assert s["cached_prompt_share"] == pytest.approx(0.96871, abs=1e-5)
    assert s["output_tokens_per_call"]["mean"] == pytest.approx(155.0198, abs=1e-3)
    # first prompts 2036, 1893, 2182 -> shared prefix at most 1893; first new inputs 143, 0, 289
    assert s["system_prompt_tokens"] == 1893
    assert s["first_call_input_tokens"]["mean"] == pytest.approx((143 + 0 + 289) / 3)
    # prompt_i - prompt_{i-1} - completion_{i-1} summed over the 249 follow-up calls = 46,706
    assert s["new_input_tokens_per_call"]["count"] == 249
    assert s["new_input_tokens_per_call"]["mean"] == pytest.approx(46706 / 249)
    assert s["skipped_lines"] == 0 and s["has_sessions"]


OTEL_PROMPTS = [1200, 1500, 1900, 2100, 1200, 1400, 1300, 1800, 2000]
OTEL_OUTPUTS = [80, 120, 60, 200, 50, 90, 300, 100, 150]
OTEL_CACHED = [0, 1200, 1500, 1900, 1024, 1200, 1024, 1300, 1800]
OTEL_GAPS = [1.5, 0.5, 4.0, 2.0, 3.0, 0.5]   # tool time between consecutive calls of a session


@pytest.mark.parametrize("name, has_cache", [("otel_genai.jsonl", True), ("otel_legacy.jsonl", False),
                                             ("openinference.jsonl", True)])
def test_otel_fixtures_from_the_real_sdk(name, has_cache):
    s = fit_trace(FIXTURES / name).summary
    assert s["format"] == "otel"
    # invoke_agent / AGENT spans carry totals and execute_tool / TOOL spans no usage: neither is a call
    assert (s["sessions"], s["calls"]) == (3, 9)
    assert s["calls_per_session"]["count"] == 3 and s["calls_per_session"]["mean"] == pytest.approx(3.0)
    assert s["input_tokens_per_call"]["mean"] == pytest.approx(sum(OTEL_PROMPTS) / 9)
    assert s["output_tokens_per_call"]["mean"] == pytest.approx(sum(OTEL_OUTPUTS) / 9)
    assert s["tool_wait_s"]["mean"] == pytest.approx(sum(OTEL_GAPS) / len(OTEL_GAPS))
    assert s["llm_latency_s"]["max"] == pytest.approx(6.0)
    assert s["system_prompt_tokens"] == 1200
    if has_cache:
        assert s["cached_prompt_share"] == pytest.approx(sum(OTEL_CACHED) / sum(OTEL_PROMPTS))
    else:
        assert s["cached_prompt_share"] is None


def test_mooncake_prefix_reuse_and_inferred_sessions():
    s = fit_trace(FIXTURES / "mooncake_conversation_head200.jsonl").summary
    assert s["calls"] == 200
    assert s["cached_prompt_share_source"].startswith("hash_ids")
    assert 0 < s["cached_prompt_share"] < 1
    assert any("inferred from hash_ids" in n for n in s["notes"])
    assert s["sessions"] < 200   # some requests continue earlier ones
    # every request starts with block 0 (../shared/data/README.md): the shared prefix is that one block,
    # although the smallest first prompt is 893 tokens
    assert s["system_prompt_tokens"] == 512


def test_aiperf_mooncake_sessions_are_deltas():
    s = fit_trace(FIXTURES / "aiperf_mooncake_sessions.jsonl").summary
    assert (s["sessions"], s["calls"]) == (3, 6)
    # AIPerf replays a session's input_length turns as deltas on top of the history:
    # sess-1 prompts 1200 and 1200 + 52 + 300; sess-2 1100 and 1100 + 40 + 150;
    # chat-3 is 'messages' (whole prompts): 5 and 5 + 19 + 28 characters at 4 per token, a part-token a token
    prompts = [1200, 1552, 1100, 1290, 2, 13]
    assert s["input_tokens_per_call"]["mean"] == pytest.approx(sum(prompts) / 6)
    assert s["tool_wait_s"]["mean"] == pytest.approx(2.0)   # delays 2000, 3000, 1000 ms
    # cached: history (1252, 1140) + leading seen blocks ([0,4,5] finds block 0: 512); chat-3 has no hash_ids
    assert s["cached_prompt_share"] == pytest.approx((1252 + 512 + 1140) / (1200 + 1552 + 1100 + 1290))
    assert any("2 record(s) had text" in n for n in s["notes"])
    # the later calls' waits come from their delays: no note that start times are missing (there was one)
    assert s["calls_missing_time"] == {} and not any("no start time" in n for n in s["notes"])


def test_aiperf_multi_turn_accumulates_history():
    s = fit_trace(FIXTURES / "aiperf_multi_turn.jsonl").summary
    assert (s["sessions"], s["calls"]) == (2, 5)
    # chat-1 prompts 500, 700, 800; chat-2 500, 590 + 46 chars / 4 (a part-token a token)
    assert s["input_tokens_per_call"]["mean"] == pytest.approx((500 + 700 + 800 + 500 + 602) / 5)
    assert s["tool_wait_s"]["mean"] == pytest.approx((2 + 5 + 1) / 3)


def test_an_aiperf_turn_without_a_delay_waits_0_ms(tmp_path):
    """AIPerf sends a later turn without a delay at once: its wait was dropped, leaving the other's 2 s as the
    mean (fuzzing, session 44)."""
    path = tmp_path / "t.jsonl"
    path.write_text('{"session_id": "a", "turns": [{"input_length": 500, "output_length": 100}, '
                    '{"input_length": 80, "output_length": 60, "delay": 2000}]}\n'
                    '{"session_id": "f", "turns": [{"input_length": 500, "output_length": 100}, '
                    '{"input_length": 80, "output_length": 60}]}\n')
    s = fit_trace(path).summary
    assert s["tool_wait_s"]["count"] == 2 and s["tool_wait_s"]["mean"] == pytest.approx(1.0)
    assert any("1 later turn(s) have no delay: read as 0 ms" in n for n in s["notes"])


def test_agentperf_real_replay_traces():
    s = fit_trace(FIXTURES / "agentperf_two_tasks.jsonl").summary
    assert (s["sessions"], s["calls"]) == (2, 10)
    # recorded_prompt_tokens of the two first turns: 6888 (k8s) and 6345 (skill search)
    assert s["system_prompt_tokens"] == 6345
    assert s["tool_wait_s"]["count"] == 10    # simulated_tool_delay_ms_after on every turn


def test_azure_has_no_sessions_and_says_so():
    s = fit_trace(FIXTURES / "azure_code_head100.csv").summary
    assert (s["sessions"], s["calls"]) == (100, 100)
    assert not s["has_sessions"]
    assert any("no sessions" in n for n in s["notes"])
    r = fit_trace(FIXTURES / "azure_code_head100.csv")
    assert r.workload.steps_per_task.mean == 1


@pytest.mark.parametrize("stamp", ["9999-12-31 23:59:59.9999999", "0001-01-01 00:00:00"])
def test_an_azure_placeholder_date_is_a_bad_row(tmp_path, stamp):
    # '9999-12-31' stretched the day of demand to millennia (every hour near 0 tasks) and '0001-01-01' voided it
    # (fuzz round 6): such a row is skipped with its reason, the rest fitted as before
    text = (FIXTURES / "azure_code_head100.csv").read_text()
    p = tmp_path / "trace.csv"
    p.write_text(text + f"{stamp},5,10\n")
    s, ref = fit_trace(p).summary, fit_trace(FIXTURES / "azure_code_head100.csv").summary
    assert s["calls"] == ref["calls"] == 100 and s["skipped_lines"] == 1
    (reason,) = s["skipped"]
    assert "a placeholder date" in reason and s["skipped"][reason]["examples"] == [f"{p}:102"]


def test_generic_csv_with_mapping():
    r = fit_trace(FIXTURES / "mini_swe_calls_3sessions.csv", "csv",
                  mapping="session=instance_id,order=call_index,input_tokens=prompt_tokens,"
                          "output_tokens=completion_tokens,cached_tokens=cached_prompt_tokens,tool_wait_s=tool_phase_s")
    ref = fit_trace(FIXTURES / "mini_swe_calls_3sessions.csv")
    for key in ("sessions", "calls", "cached_prompt_share", "system_prompt_tokens"):
        assert r.summary[key] == ref.summary[key]
    assert r.summary["tool_wait_s"] == ref.summary["tool_wait_s"]


def test_generic_jsonl_with_dotted_paths(tmp_path):
    p = tmp_path / "calls.jsonl"
    p.write_text('{"conv": "a", "usage": {"in": 100, "out": 10}, "t_ms": 0}\n'
                 '{"conv": "a", "usage": {"in": 150, "out": 20}, "t_ms": 5000}\n'
                 '{"conv": "b", "usage": {"in": 100, "out": 30}, "t_ms": 0}\n')
    s = fit_trace(p, "jsonl", mapping="session=conv,input_tokens=usage.in,output_tokens=usage.out,"
                                      "start_ms=t_ms").summary
    assert (s["sessions"], s["calls"]) == (2, 3)
    assert s["new_input_tokens_per_call"]["mean"] == 40   # 150 - 100 - 10


def test_otlp_pretty_printed_document_and_bad_span(tmp_path):
    import json

    lines = (FIXTURES / "otel_genai.jsonl").read_text().splitlines()
    doc = json.loads(lines[0])                         # the first exported batch: sess-a's first chat span
    p = tmp_path / "one.json"
    p.write_text(json.dumps(doc, indent=2))
    s = fit_trace(p).summary
    assert (s["format"], s["calls"], s["input_tokens_per_call"]["mean"]) == ("otel", 1, 1200)
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    span["attributes"] = [a for a in span["attributes"] if a["key"] != "gen_ai.usage.output_tokens"]
    q = tmp_path / "bad.jsonl"
    chat = next(ln for ln in lines[1:] if '"chat deepseek-chat"' in ln)
    q.write_text(json.dumps(doc) + "\n" + chat + "\n")
    s = fit_trace(q).summary
    assert s["calls"] == 1 and s["skipped_lines"] == 1
    assert list(s["skipped"]) == ["span 'chat deepseek-chat': token usage: no output token count"]
    # a negative count is named as what it is (it was "without both input and output counts")
    span["attributes"].append({"key": "gen_ai.usage.output_tokens", "value": {"intValue": "-100"}})
    q.write_text(json.dumps(doc) + "\n" + chat + "\n")
    assert list(fit_trace(q).summary["skipped"]) == [
        "span 'chat deepseek-chat': token usage: negative token count"]


def test_otel_conversation_id_on_agent_spans_only():
    # scripts/make_otel_fixtures.py _write_turns: each of the 3 sessions is two traces whose chat spans
    # carry no conversation id; their invoke_agent roots do
    s = fit_trace(FIXTURES / "otel_conversation_on_agent.jsonl").summary
    assert (s["sessions"], s["calls"]) == (3, 9)
    assert s["input_tokens_per_call"]["mean"] == pytest.approx(sum(OTEL_PROMPTS) / 9)
    assert s["system_prompt_tokens"] == 1200
    assert s["new_input_tokens_per_call"]["count"] == 6


def test_otel_steps_of_several_calls():
    # scripts/make_otel_fixtures.py STEP_SESSIONS: sess-m steps of [2, 2, 1] calls with tool spans of 2 s and
    # 3 s after steps 1 and 2; sess-n steps [1, 2] with a 1 s tool span after step 1
    r = fit_trace(FIXTURES / "otel_steps.jsonl")
    s = r.summary
    assert (s["sessions"], s["calls"]) == (2, 8)
    assert s["steps_per_session"]["mean"] == pytest.approx(2.5)
    assert s["calls_per_step"]["count"] == 5 and s["calls_per_step"]["mean"] == pytest.approx(8 / 5)
    assert s["tool_wait_s"]["count"] == 3 and s["tool_wait_s"]["mean"] == pytest.approx(2.0)
    assert r.workload.steps_per_task.mean == pytest.approx(2.5)
    assert r.workload.calls_per_step.mean == pytest.approx(1.6, rel=0.05)
    assert any("steps split at tool spans" in n for n in s["notes"])


def test_a_mooncake_trace_out_of_time_order_says_its_sessions_may_be_split(tmp_path):
    """Sessions are inferred from hash_ids in file order: the same four lines gave 3 sessions out of order and 2 in
    order, without a word (fuzzing, session 44)."""
    lines = ['{"timestamp": 5000, "input_length": 1700, "output_length": 50, "hash_ids": [0, 1, 3, 4]}',
             '{"timestamp": 0, "input_length": 1100, "output_length": 50, "hash_ids": [0, 1]}',
             '{"timestamp": 10, "input_length": 1100, "output_length": 50, "hash_ids": [0, 2]}',
             '{"timestamp": 6000, "input_length": 1700, "output_length": 50, "hash_ids": [0, 2, 5, 6]}']
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    notes = fit_trace(path).summary["notes"]
    assert any("2 line(s) are stamped earlier than a line before them" in n and "sort the file by timestamp" in n
               for n in notes)
    path.write_text("\n".join(sorted(lines, key=lambda x: int(x.split(",")[0].split(":")[1]))) + "\n")
    s = fit_trace(path).summary
    assert s["sessions"] == 2 and not any("stamped earlier" in n for n in s["notes"])
