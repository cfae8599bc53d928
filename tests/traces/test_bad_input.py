"""Bad input: file and line for malformed lines, skip-and-count by default, --strict stops, no tracebacks."""

from __future__ import annotations

import re
import shutil

import pytest

from apmw.errors import ApmwError
from apmw.traces import TraceError, fit_trace
from tests.traces.conftest import FIXTURES

GOOD = '{"timestamp": 0, "input_length": 1000, "output_length": 100, "hash_ids": [0, 1]}\n'


def _mooncake_with_bad_lines(tmp_path):
    p = tmp_path / "trace.jsonl"
    p.write_text(GOOD + '{"timestamp": 5, "input_length": 12\n'          # line 2: truncated JSON
                 + GOOD + '{"timestamp": 9, "output_length": 7}\n'      # line 4: no input
                 + '[1, 2]\n' + GOOD)                                   # line 5: not an object
    return p


def test_default_skips_and_counts_with_file_and_line(tmp_path):
    p = _mooncake_with_bad_lines(tmp_path)
    s = fit_trace(p, "mooncake").summary
    assert s["calls"] == 3 and s["skipped_lines"] == 3
    where = {ex for d in s["skipped"].values() for ex in d["examples"]}
    assert where == {f"{p}:2", f"{p}:4", f"{p}:5"}
    assert any("not valid JSON" in reason for reason in s["skipped"])


def test_strict_stops_at_the_first_bad_line(tmp_path):
    p = _mooncake_with_bad_lines(tmp_path)
    with pytest.raises(TraceError, match=rf"{p}:2: not valid JSON"):
        fit_trace(p, "mooncake", strict=True)


def test_csv_row_with_wrong_width(tmp_path):
    p = tmp_path / "calls.csv"
    text = (FIXTURES / "mini_swe_calls_3sessions.csv").read_text().splitlines()
    text[5] = text[5] + ",extra"                      # file line 6: one column too many
    cells = text[9].split(",")
    cells[7] = "abc"                                    # file line 10: prompt_tokens not a number
    text[9] = ",".join(cells)
    p.write_text("\n".join(text) + "\n")
    s = fit_trace(p).summary
    assert s["skipped_lines"] == 2 and s["calls"] == 250
    assert s["skipped"]["expected 14 columns, found 15"]["examples"] == [f"{p}:6"]
    assert [d["examples"] for r, d in s["skipped"].items() if r.startswith("not a number")] == [[f"{p}:10"]]


def test_empty_file_lists_the_formats(tmp_path):
    p = tmp_path / "empty.jsonl"
    p.write_text("\n\n")
    with pytest.raises(TraceError, match="empty.*accepted formats: otel") as e:
        fit_trace(p)
    assert isinstance(e.value, ApmwError)


def test_unrecognised_json_lists_the_formats(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"foo": 1, "bar": 2}\n')
    with pytest.raises(TraceError, match=r"keys foo, bar.*--format csv \(or jsonl\) --map.*apmw simulate --trace"):
        fit_trace(p)


def test_unrecognised_csv(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(TraceError, match="not recognised.*mini-swe-agent"):
        fit_trace(p)


def test_all_lines_bad_says_why(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"output_length": 5, "input_length": "many"}\n')
    with pytest.raises(TraceError, match=r"no model calls found.*bad value.*bad.jsonl:1"):
        fit_trace(p, "mooncake")


def test_generic_mapping_errors(tmp_path):
    src = FIXTURES / "mini_swe_calls_3sessions.csv"
    with pytest.raises(TraceError, match="need --map"):
        fit_trace(src, "csv")
    with pytest.raises(TraceError, match="unknown field 'start'.*unit suffix"):
        fit_trace(src, "csv", mapping="input_tokens=prompt_tokens,output_tokens=completion_tokens,start=t")
    with pytest.raises(TraceError, match="column.*nope.*not in the header"):
        fit_trace(src, "csv", mapping="input_tokens=nope,output_tokens=completion_tokens")
    # a field given twice kept the last one without a word (fuzzing, session 38)
    with pytest.raises(TraceError, match="names input_tokens twice .as 'prompt_tokens' and 'completion_tokens'."):
        fit_trace(src, "csv", mapping="input_tokens=prompt_tokens,output_tokens=completion_tokens,"
                                      "input_tokens=completion_tokens")
    with pytest.raises(TraceError, match="names start twice"):
        fit_trace(src, "csv", mapping="input_tokens=prompt_tokens,output_tokens=completion_tokens,start_s=a,start_ms=b")


def test_unknown_format_name():
    with pytest.raises(TraceError, match="unknown trace format 'parquet'"):
        fit_trace(FIXTURES / "otel_genai.jsonl", "parquet")


def test_gzip_is_read(tmp_path):
    import gzip

    p = tmp_path / "calls.csv.gz"
    with open(FIXTURES / "mini_swe_calls_3sessions.csv", "rb") as f, gzip.open(p, "wb") as g:
        shutil.copyfileobj(f, g)
    assert fit_trace(p).summary["calls"] == 252


@pytest.mark.parametrize("damage", ["early", "late"])
def test_a_gzip_stream_damaged_after_its_header_is_named_not_a_traceback(tmp_path, damage):
    """Bytes of the compressed data overwritten: right after the header (the first read, a peek at the format's
    first bytes, meets it) or later (a line read meets it)."""
    import gzip

    p = tmp_path / "calls.csv.gz"
    raw = bytearray(gzip.compress((FIXTURES / "mini_swe_calls_3sessions.csv").read_bytes()))
    at = 12 if damage == "early" else len(raw) // 2
    raw[at:at + 64] = b"\xff" * 64
    p.write_bytes(bytes(raw))
    with pytest.raises(TraceError, match="calls.csv.gz: the gzip stream cannot be read to its end"):
        fit_trace(p)


def test_reasons_that_differ_only_in_the_value_they_quote_are_counted_as_one(tmp_path):
    p = tmp_path / "calls.csv"
    text = (FIXTURES / "mini_swe_calls_3sessions.csv").read_text().splitlines()
    for line in range(1, 40, 2):                        # 20 lines, each with its own bad value
        cells = text[line].split(",")
        cells[7] = f"n/a{line}"
        text[line] = ",".join(cells)
    p.write_text("\n".join(text) + "\n")
    s = fit_trace(p).summary
    assert s["skipped_lines"] == 20
    (reason,) = s["skipped"]
    assert "'...'" in reason and "n/a" not in reason
    assert s["skipped"][reason]["count"] == 20 and s["skipped"][reason]["examples"] == [f"{p}:2", f"{p}:4", f"{p}:6"]


@pytest.mark.parametrize("value", ["1e30", "2e7"])
def test_a_call_past_any_context_window_is_skipped_not_fitted(tmp_path, value):
    p = tmp_path / "calls.csv"
    text = (FIXTURES / "mini_swe_calls_3sessions.csv").read_text().splitlines()
    cells = text[3].split(",")
    cells[7] = value                                    # file line 4: prompt_tokens
    text[3] = ",".join(cells)
    p.write_text("\n".join(text) + "\n")
    fitted = fit_trace(p)
    assert fitted.summary["skipped_lines"] == 1
    assert list(fitted.summary["skipped"]) == ["more than 10,000,000 tokens in one call (past any model's context window)"]
    assert fitted.workload.new_input_tokens_per_call.quantile(0.999) < 1e6


def _mini_swe_with(tmp_path, edit):
    """The 3-session mini-swe-agent fixture with ``edit(lines)`` applied (header at index 0)."""
    p = tmp_path / "calls.csv"
    lines = (FIXTURES / "mini_swe_calls_3sessions.csv").read_text().splitlines()
    edit(lines)
    p.write_text("\n".join(lines) + "\n")
    return p


def _set(lines, index: int, column: str, value: str) -> None:
    cells = lines[index].split(",")
    cells[lines[0].split(",").index(column)] = value
    lines[index] = ",".join(cells)


@pytest.mark.parametrize("column", ["run", "instance_id"])
def test_a_mini_swe_call_without_its_session_is_a_bad_line(tmp_path, column):
    # an empty run cell made the call a one-call task of its own, a fourth session, without a word (fuzz round 6)
    p = _mini_swe_with(tmp_path, lambda lines: _set(lines, 4, column, ""))
    s = fit_trace(p).summary
    assert s["sessions"] == 3 and s["skipped_lines"] == 1
    assert list(s["skipped"]) == [f"no session: an empty {column} (a call's session is its run and instance_id)"]


def test_a_call_with_more_cached_tokens_than_its_prompt_or_ending_before_it_starts_is_a_bad_line(tmp_path):
    def edit(lines):
        _set(lines, 3, "cached_prompt_tokens", "999999")          # file line 4
        _set(lines, 6, "t_response_s", "0.001")                    # file line 7: before its request
    p = _mini_swe_with(tmp_path, edit)
    s = fit_trace(p).summary
    assert s["skipped_lines"] == 2 and s["calls"] == 250
    reasons = {r: d["examples"] for r, d in s["skipped"].items()}
    assert [w for r, w in reasons.items() if r.startswith("more cached prompt tokens")] == [[f"{p}:4"]]
    assert [w for r, w in reasons.items() if r.startswith("ends before it starts")] == [[f"{p}:7"]]
    with pytest.raises(TraceError, match=rf"{p}:4: more cached prompt tokens than prompt tokens \(cached, prompt: "
                                         r"'999999, 2881'\)"):
        fit_trace(p, strict=True)


def test_a_call_listed_twice_is_refused(tmp_path):
    p = _mini_swe_with(tmp_path, lambda lines: lines.insert(5, lines[4]))
    with pytest.raises(TraceError, match=r"1 call\(s\) repeat another call's index in their session \(first: "
                                         r"session \('deepseek_chat_dev', 'marshmallow-code__marshmallow-1343'\), "
                                         r"call index 3\)"):
        fit_trace(p)


def test_a_generic_trace_call_index_listed_twice_is_refused_where_map_names_the_order(tmp_path):
    p = tmp_path / "calls.jsonl"
    p.write_text('{"s": "a", "n": 1, "i": 100, "o": 10}\n{"s": "a", "n": 1, "i": 120, "o": 10}\n'
                 '{"s": "a", "n": 2, "i": 130, "o": 10}\n')
    with pytest.raises(TraceError, match=r"1 call\(s\) repeat another call's index in their session \(first: "
                                         r"session 'a', call index 1\)"):
        fit_trace(p, "jsonl", mapping="session=s,order=n,input_tokens=i,output_tokens=o")
    assert fit_trace(p, "jsonl", mapping="session=s,input_tokens=i,output_tokens=o").summary["calls"] == 3


def test_inconsistent_spans_of_a_generic_jsonl_trace_are_bad_lines(tmp_path):
    p = tmp_path / "calls.jsonl"
    p.write_text('{"s": "a", "i": 1000, "o": 10, "c": 10, "t0": 1.0, "t1": 2.0}\n'
                 '{"s": "a", "i": 1000, "o": 10, "c": 2000, "t0": 3.0, "t1": 4.0}\n'
                 '{"s": "a", "i": 1000, "o": 10, "c": 10, "t0": 6.0, "t1": 5.0}\n'
                 '{"s": "a", "i": 1000, "o": 10, "c": 10, "t0": 7.0, "t1": 8.0}\n')
    s = fit_trace(p, "jsonl", mapping="session=s,input_tokens=i,output_tokens=o,cached_tokens=c,start_s=t0,end_s=t1").summary
    assert s["calls"] == 2 and s["skipped_lines"] == 2
    assert {ex for d in s["skipped"].values() for ex in d["examples"]} == {f"{p}:2", f"{p}:3"}


@pytest.mark.parametrize("value", ["0", "-1767225600000000000", "946684799000000000", "9300000000000000000"])
def test_an_otel_span_time_no_span_was_recorded_at_is_a_bad_line(tmp_path, value):
    # the fixture's first chat span starts at 1767225600000000000 ns (2026-01-01); 0 is OTLP's "unset"
    lines = (FIXTURES / "otel_genai.jsonl").read_text().splitlines()
    assert '"startTimeUnixNano":"1767225600000000000"' in lines[0]
    lines[0] = lines[0].replace('"startTimeUnixNano":"1767225600000000000"', f'"startTimeUnixNano":"{value}"', 1)
    p = tmp_path / "spans.jsonl"
    p.write_text("\n".join(lines) + "\n")
    s = fit_trace(p).summary
    assert s["skipped_lines"] == 1 and s["calls"] == fit_trace(FIXTURES / "otel_genai.jsonl").summary["calls"] - 1
    [(reason, d)] = s["skipped"].items()
    assert "is not a Unix time in nanoseconds from 2000 to 2262" in reason and d["examples"] == [f"{p}:1"]


def test_a_jsonl_map_key_no_record_has_is_refused(tmp_path):
    # a mistyped session key read as absent on every line, and every call became its own session
    p = tmp_path / "calls.jsonl"
    p.write_text('{"conv": "a", "in": 1000, "out": 100}\n{"conv": "a", "in": 1300, "out": 120}\n'
                 '{"conv": "b", "in": 900, "out": 80, "cached": 100}\n')
    with pytest.raises(TraceError, match=rf"{p}: --map names key\(s\) nope that no record has \(the first record's "
                                         r"keys: conv, in, out\); fix the --map spelling"):
        fit_trace(p, "jsonl", mapping="session=nope,input_tokens=in,output_tokens=out")
    # a key some records have and others not (cached tokens on one call) is read where it is
    s = fit_trace(p, "jsonl", mapping="session=conv,input_tokens=in,output_tokens=out,cached_tokens=cached").summary
    assert s["calls"] == 3 and s["sessions"] == 2


@pytest.mark.parametrize("value,said", [('{"boolValue":true}', "expected a number, got True"),
                                        ('{"doubleValue":"Infinity"}', "expected a finite number")])
def test_an_otel_token_count_that_is_not_a_number_is_a_bad_line(tmp_path, value, said):
    """A boolean AnyValue read as a count (True -> 1 token) was fitted silently (fuzzing, session 40)."""
    lines = (FIXTURES / "otel_genai.jsonl").read_text().splitlines()
    old = re.findall(r'"gen_ai\.usage\.input_tokens","value":\{[^}]*\}', lines[0])[0]
    lines[0] = lines[0].replace(old, f'"gen_ai.usage.input_tokens","value":{value}', 1)
    p = tmp_path / "spans.jsonl"
    p.write_text("\n".join(lines) + "\n")
    s = fit_trace(p).summary
    assert s["skipped_lines"] == 1 and s["calls"] == fit_trace(FIXTURES / "otel_genai.jsonl").summary["calls"] - 1
    [(reason, d)] = s["skipped"].items()
    assert said in reason and d["examples"] == [f"{p}:1"]


@pytest.mark.parametrize("messages,said", [('"str"', "messages is 'str'; it is a list of chat turns"),
                                           ("[1, 2]", "messages is '[1, 2]'; it is a list of chat turns"),
                                           ("[]", "messages is '[]'; it is a list of chat turns"),
                                           ('[{"content": null}]', "the prompt holds no text to count its tokens")])
def test_mooncake_messages_that_are_not_chat_turns_are_bad_lines(tmp_path, messages, said):
    """They were read as prompts of 0 tokens (fuzzing, session 40)."""
    p = tmp_path / "turns.jsonl"
    p.write_text('{"session_id": "s", "timestamp": 0, "messages": [{"role": "user", "content": "' + "hi " * 400
                 + '"}], "output_length": 10}\n'
                 '{"session_id": "s", "timestamp": 5, "messages": ' + messages + ', "output_length": 10}\n')
    s = fit_trace(p, "mooncake").summary
    assert s["calls"] == 1 and s["skipped_lines"] == 1
    [(reason, d)] = s["skipped"].items()
    assert said in reason and d["examples"] == [f"{p}:2"]


def test_a_quote_left_open_costs_every_line_it_swallows_counted(tmp_path):
    """A stray quote in a cell read the rest of the file as that cell: 247 of 252 calls vanished uncounted, even
    with --strict (fuzzing, session 42)."""
    p = _mini_swe_with(tmp_path, lambda lines: _set(lines, 5, "finish_reason", '"tool_calls'))
    s = fit_trace(p).summary
    assert s["calls"] == 4 and s["skipped_lines"] == 248 and s["lines_read"] == 252
    (reason, got), = s["skipped"].items()
    assert "a quote opened and not closed" in reason and got["examples"][0] == f"{p}:6"
    with pytest.raises(TraceError, match=rf"{p}:6: in a quoted cell that runs over several lines"):
        fit_trace(p, strict=True)


def test_a_quote_left_open_past_the_field_limit_counts_every_line_up_to_it(tmp_path):
    p = tmp_path / "calls.csv"
    rows = ["sid,idx,inp,out,note"] + [f"s{i // 50},{i % 50},{1000 + i % 50 * 10},20," + "x" * 40 for i in range(6000)]
    rows[3] = rows[3].replace(",xx", ',"xx', 1)
    p.write_text("\n".join(rows) + "\n")
    s = fit_trace(p, "csv", mapping="session=sid,order=idx,input_tokens=inp,output_tokens=out").summary
    assert s["calls"] + s["skipped_lines"] == 6000 and s["skipped_lines"] > 2000
    assert all("field larger than field limit" in r for r in s["skipped"])


def test_text_with_line_breaks_in_a_quoted_cell_is_read(tmp_path):
    p = tmp_path / "calls.csv"
    p.write_text('sid,inp,out,prompt\na,100,10,"first line\nsecond, with a comma"\na,200,10,plain\n')
    s = fit_trace(p, "csv", mapping="session=sid,input_tokens=inp,output_tokens=out").summary
    assert (s["calls"], s["skipped_lines"]) == (2, 0)


# Session 42's fuzzing of the trace readers: calls split, merged or read wrong without a word.
def _span(i: int, attrs: dict, trace: str | None = "t1", end: str | None = None) -> dict:
    span = {"spanId": f"s{i}", "name": "chat m", "startTimeUnixNano": str(1767225600 + 10 * i) + "000000000",
            "endTimeUnixNano": end if end is not None else str(1767225602 + 10 * i) + "000000000",
            "attributes": [{"key": k, "value": v} for k, v in attrs.items()]}
    if trace is not None:
        span["traceId"] = trace
    return span


def _otel(tmp_path, spans: list[dict]):
    import json

    p = tmp_path / "spans.jsonl"
    p.write_text("".join(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [s]}]}]}) + "\n" for s in spans))
    return p


USAGE = {"gen_ai.usage.input_tokens": {"intValue": "1000"}, "gen_ai.usage.output_tokens": {"intValue": "50"}}


@pytest.mark.parametrize("attrs,trace,reason", [
    ({**USAGE, "gen_ai.usage.input_tokens": {"intValue": True}}, "t1", "intValue True is not an integer"),
    ({"gen_ai.usage.input_tokens": {"arrayValue": {"values": []}},
      "gen_ai.usage.output_tokens": {"kvlistValue": {"values": []}}}, "t1", "given as an array or a key-value list"),
    (USAGE, None, "no traceId and no conversation id"),
    (USAGE, "", "no traceId and no conversation id"),
])
def test_an_otel_span_read_wrong_before_is_skipped_with_its_reason(tmp_path, attrs, trace, reason):
    """A boolean count was 1 token, two array counts made the span 'not a model call', and spans without a trace
    or a conversation were all one session."""
    p = _otel(tmp_path, [_span(0, USAGE), _span(1, attrs, trace), _span(2, attrs, trace)])
    s = fit_trace(p).summary
    assert s["calls"] == 1 and s["skipped_lines"] == 2 and any(reason in r for r in s["skipped"])


def test_otel_attributes_as_a_map_are_named_and_an_unset_end_is_kept(tmp_path):
    bad = _span(1, USAGE)
    bad["attributes"] = {"gen_ai.usage.input_tokens": 5}
    s = fit_trace(_otel(tmp_path, [_span(0, USAGE), bad, _span(2, USAGE, end="0")])).summary
    assert s["calls"] == 2 and any("attributes is not a list of" in r for r in s["skipped"])
    assert s["calls_missing_time"] == {"end": 1}


def test_an_empty_conversation_id_does_not_hide_the_session_id(tmp_path):
    spans = [_span(i, {**USAGE, "gen_ai.conversation.id": {}, "session.id": {"stringValue": "s"}}, trace=f"t{i}")
             for i in range(3)]
    assert fit_trace(_otel(tmp_path, spans)).summary["sessions"] == 1


def test_a_mapped_column_named_twice_in_the_header_is_refused(tmp_path):
    p = tmp_path / "calls.csv"
    p.write_text("conv,p,c,p\na,1000,50,9\na,1100,50,9\n")
    with pytest.raises(TraceError, match=r"calls.csv:1: column\(s\) 'p' head more than one column"):
        fit_trace(p, "csv", mapping="session=conv,input_tokens=p,output_tokens=c")


@pytest.mark.parametrize("name,text,flags,reason", [
    ("calls.csv", "run,instance_id,call_index,prompt_tokens,completion_tokens\nr,a,,1000,50\nr,a,0,1000,50\n"
     "r,a,1,1200,50\n", {}, "no call_index"),
    ("calls.csv", "sid,inp,out\na,1000,50\n,1000,50\na,1200,50\n",
     {"fmt": "csv", "mapping": "session=sid,input_tokens=inp,output_tokens=out"}, "no session: the --map session column"),
    ("calls.jsonl", '{"sid": "a", "inp": 1000, "out": 50}\n{"sid": null, "inp": 1000, "out": 50}\n'
     '{"sid": "a", "inp": 1200, "out": 50}\n',
     {"fmt": "jsonl", "mapping": "session=sid,input_tokens=inp,output_tokens=out"}, "no session: the --map session"),
    ("agentperf.jsonl", "".join(f'{{"conversation_id": {c}, "conversation_idx": {k}, "recorded_prompt_tokens": 1000, '
                                f'"recorded_completion_tokens": 50}}\n' for c, k in (('"a"', 0), ("null", 1), ('"a"', 1))),
     {}, "conversation_id is null"),
    ("multi.jsonl", '{"session_id": "a", "turns": [{"input_length": 100, "output_length": 5}]}\n'
     '{"session_id": "b", "turns": [{"text": "", "output_length": 5}]}\n'
     '{"session_id": "c", "turns": [{"input_length": 100, "output_length": 5}]}\n', {}, "holds no text"),
])
def test_a_call_whose_session_or_place_is_unknown_is_skipped_and_counted(tmp_path, name, text, flags, reason):
    """Each was read as a one-call session of its own, or (an empty call_index) put nowhere in its session."""
    p = tmp_path / name
    p.write_text(text)
    s = fit_trace(p, flags.get("fmt"), mapping=flags.get("mapping")).summary
    assert s["calls"] == 2 and s["skipped_lines"] == 1 and any(reason in r for r in s["skipped"])


def test_a_multi_turn_line_without_a_session_id_is_its_own_conversation(tmp_path):
    """A null session_id split its turns into sessions of one; a line without one clashed with session_id "2"."""
    p = tmp_path / "multi.jsonl"
    turns = '[{"input_length": 100, "output_length": 5}, {"input_length": 50, "output_length": 5, "delay": 1000}]'
    p.write_text(f'{{"session_id": "2", "turns": {turns}}}\n{{"turns": {turns}}}\n{{"session_id": null, "turns": {turns}}}\n')
    s = fit_trace(p).summary
    assert (s["sessions"], s["calls"], s["skipped_lines"]) == (3, 6, 0)


def test_a_skipped_mooncake_turn_leaves_its_session_history_alone(tmp_path):
    p = tmp_path / "sessions.jsonl"
    p.write_text('{"session_id": "a", "input_length": 1000, "output_length": 50}\n'
                 '{"session_id": "a", "input_length": 5000}\n'
                 '{"session_id": "a", "input_length": 100, "output_length": 50, "delay": 1000}\n')
    s = fit_trace(p).summary
    assert s["skipped_lines"] == 1 and s["input_tokens_per_call"]["max"] == 1150


def test_a_session_without_tool_spans_keeps_a_step_per_call(tmp_path):
    """One tool span anywhere made every session without one a single step of all its calls (fuzzing, session 42)."""
    conv = {k: {**USAGE, "gen_ai.conversation.id": {"stringValue": k}} for k in "ab"}
    spans = [_span(i, conv["a" if i < 3 else "b"], trace=f"t{i}") for i in range(6)]
    tool = _span(9, {"gen_ai.operation.name": {"stringValue": "execute_tool"}, "gen_ai.conversation.id":
                     {"stringValue": "a"}}, trace="t0")
    tool["startTimeUnixNano"] = str(1767225600 + 13) + "000000000"      # between a's second and third calls
    s = fit_trace(_otel(tmp_path, [*spans, tool])).summary
    # a: calls 0 and 1, the tool, call 2 (two steps); b: three calls, three steps
    assert (s["steps_per_session"]["mean"], s["steps_per_session"]["max"]) == (2.5, 3)
    assert (s["calls_per_step"]["count"], s["calls_per_step"]["max"]) == (5, 2)
    assert any("1 of 2 session(s) have no tool span" in n for n in s["notes"])


@pytest.mark.parametrize("header,said", [
    ("conv, p, c", "the header's names have spaces around them"),
    ("conv;p;c", "the file is not comma-separated"),
])
def test_a_header_that_misses_mapped_columns_says_what_it_has_instead(tmp_path, header, said):
    p = tmp_path / "calls.csv"
    p.write_text(header + "\na,1000,50\n")
    with pytest.raises(TraceError, match=said):
        fit_trace(p, "csv", mapping="session=conv,input_tokens=p,output_tokens=c")


@pytest.mark.parametrize("name,text", [
    ("calls.csv", "sid,inp,out,t\na,100,10,2024-01-01T00:00:00\na,200,10,5\nb,100,10,x\n"),
    ("calls.jsonl", '{"sid": "a", "inp": 100, "out": 10, "t": {"x": 1}}\n{"sid": "a", "inp": 200, "out": 10, "t": 5}\n'
                    '{"sid": "b", "inp": 100, "out": 10, "t": "1,5"}\n'),
])
def test_a_mapped_value_that_is_not_a_number_names_its_column_once(tmp_path, name, text):
    """The reason was "could not convert string to float: ..." without the column, one reason per value."""
    p = tmp_path / name
    p.write_text(text)
    s = fit_trace(p, name.split(".")[1], mapping="session=sid,input_tokens=inp,output_tokens=out,start_s=t").summary
    (reason, got), = s["skipped"].items()
    assert got["count"] == 2 and ("column 't'" in reason or "t (start)" in reason)
    assert "is not a number" in reason and "start_ms" in reason


def test_spans_stamped_in_microseconds_are_one_reason(tmp_path):
    """Each span's value was in the middle of its reason: 2,000 spans gave a 347 KB message (fuzzing, session 42)."""
    spans = [_span(i, USAGE) for i in range(4)]
    for s in spans[1:]:
        s["startTimeUnixNano"] = str(int(s["startTimeUnixNano"]) // 1000)
    got = fit_trace(_otel(tmp_path, spans)).summary["skipped"]
    assert [d["count"] for d in got.values()] == [3]


@pytest.mark.parametrize("name,times,said", [
    ("calls.csv", 1, "gzip-compressed, but its name does not end in .gz: rename it to calls.csv.gz"),
    ("calls.csv.gz", 2, "it is gzip again (compressed twice?)"),
])
def test_gzip_under_another_name_or_twice_says_so(tmp_path, name, times, said):
    import gzip

    data = (FIXTURES / "mini_swe_calls_3sessions.csv").read_bytes()
    for _ in range(times):
        data = gzip.compress(data)
    (tmp_path / name).write_bytes(data)
    with pytest.raises(TraceError, match=re.escape(said)):
        fit_trace(tmp_path / name)


def test_an_otel_document_after_blank_lines_and_a_cut_first_record(tmp_path):
    """A pretty-printed OTLP document is one document wherever its first line falls (it was read as broken JSON
    lines after a blank line); a JSON-lines file whose first record is cut short loses that line only (the whole
    file was refused); a pretty document cut short is refused as neither form."""
    import json

    lines = (FIXTURES / "otel_genai.jsonl").read_text().splitlines()
    doc = json.dumps(json.loads(lines[0]), indent=2)
    alone = tmp_path / "doc.json"
    alone.write_text(doc)
    blank = tmp_path / "blank.json"
    blank.write_text("\n\n" + doc)
    assert fit_trace(blank).summary == {**fit_trace(alone).summary, "path": str(blank)}
    cut = tmp_path / "cut.jsonl"
    cut.write_text(lines[0][:200] + "\n" + "\n".join(lines[1:]) + "\n")
    s = fit_trace(cut).summary
    assert s["skipped_lines"] == 1 and list(s["skipped"].values())[0]["examples"] == [f"{cut}:1"]
    broken = tmp_path / "broken.json"
    broken.write_text(doc[:-30])
    with pytest.raises(TraceError, match="neither JSON lines nor one JSON document"):
        fit_trace(broken)


def test_a_symbolic_link_to_nothing_says_so(tmp_path):
    """A link loop or a dangling link said "no such file" of a path that is there."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    (tmp_path / "gone").symlink_to(tmp_path / "missing.jsonl")
    for name in ("a", "gone"):
        with pytest.raises(TraceError, match="a symbolic link to nothing readable"):
            fit_trace(tmp_path / name)
    with pytest.raises(TraceError, match="no such file"):
        fit_trace(tmp_path / "absent.jsonl")


@pytest.mark.parametrize("kind", [{"gen_ai.operation.name": {"stringValue": "chat"}},
                                  {"openinference.span.kind": {"stringValue": "LLM"}},
                                  {}])     # only its name, 'chat m', says it is a call (fuzz round 6)
def test_a_model_call_span_without_usage_is_a_bad_line_not_ignored(tmp_path, kind):
    """A chat span with no token usage (a streamed call) vanished without a word and its time joined the tool wait
    around it (fuzzing, session 44); an HTTP or framework span without usage is still not a call."""
    http = {**_span(3, {"http.method": {"stringValue": "POST"}}), "name": "POST /v1/chat/completions"}
    s = fit_trace(_otel(tmp_path, [_span(0, USAGE), _span(1, kind), _span(2, USAGE), http])).summary
    assert s["calls"] == 2 and s["skipped_lines"] == 1
    (reason,) = s["skipped"]
    assert "without token usage" in reason and "tool wait" in reason


def test_one_token_count_under_two_names_with_two_values_is_a_bad_line(tmp_path):
    """gen_ai.usage.input_tokens 1000 beside the older gen_ai.usage.prompt_tokens 1234 was read as 1000 without a
    word (fuzzing, session 44); the same count under both names is fine."""
    both = {**USAGE, "gen_ai.usage.prompt_tokens": {"intValue": "1234"}}
    agree = {**USAGE, "gen_ai.usage.prompt_tokens": {"intValue": "1000"}}
    s = fit_trace(_otel(tmp_path, [_span(0, USAGE), _span(1, both), _span(2, agree)])).summary
    assert s["calls"] == 2 and s["skipped_lines"] == 1
    (reason,) = s["skipped"]
    assert "gen_ai.usage.input_tokens 1000, gen_ai.usage.prompt_tokens 1234" in reason and "keep one" in reason


def test_an_empty_csv_with_a_mapping_is_called_empty(tmp_path):
    """It was told its --map columns were 'not in the header ()' (fuzzing, session 44)."""
    p = tmp_path / "empty.csv"
    p.write_text("")
    with pytest.raises(TraceError, match="the file is empty"):
        fit_trace(p, "csv", mapping="session=conv,input_tokens=prompt,output_tokens=completion")


def test_skipped_lines_in_a_trace_of_sessions_say_what_they_leave(tmp_path):
    """Both sessions' first calls skipped: the second calls were fitted as first prompts (a 2,600-token 'system
    prompt') without a word beyond the skip count (fuzzing, session 44)."""
    p = _otel(tmp_path, [_span(0, USAGE), _span(1, {**USAGE, "gen_ai.usage.input_tokens": {"intValue": True}}),
                         _span(2, USAGE)])
    notes = fit_trace(p).summary["notes"]
    assert any("skipped line(s) leave their sessions shorter" in n for n in notes)
    assert not any("leave their sessions shorter" in n for n in fit_trace(_otel(tmp_path, [_span(0, USAGE)])).summary["notes"])


@pytest.mark.parametrize("ids", ["[0, 1.5]", '[0, "a"]', "[[0], 1]"])
def test_mooncake_block_ids_that_are_not_integers_are_a_bad_line(tmp_path, ids):
    """[0, 1.5] was accepted where [0, "a"] was refused (fuzzing, session 44); both reader paths."""
    p = tmp_path / "t.jsonl"
    p.write_text(f'{{"timestamp": 0, "input_length": 1100, "output_length": 50, "hash_ids": {ids}}}\n'
                 f'{{"timestamp": 5, "input_length": 1100, "output_length": 50, "hash_ids": [7, 8]}}\n'
                 f'{{"timestamp": 9, "input_length": 1100, "output_length": 50, "hash_ids": {ids}, "delay": 3}}\n')
    s = fit_trace(p, "mooncake").summary
    assert s["calls"] == 1 and s["skipped_lines"] == 2
    assert all("hash_ids must be a list of block ids (integers)" in r for r in s["skipped"])


def _set_attribute(doc: dict, key: str, value: dict) -> None:
    """The first span of the OTLP document ``doc`` with attribute ``key`` set to the AnyValue ``value``."""
    for a in doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"]:
        if a["key"] == key:
            a["value"] = value


@pytest.mark.parametrize("edit,said", [
    (lambda d: d["resourceSpans"][0]["scopeSpans"][0]["spans"][0].pop("startTimeUnixNano"),
     "span 'chat m': no startTimeUnixNano (OTLP spans record their start and end in Unix epoch nanoseconds)"),
    (lambda d: d["resourceSpans"][0]["scopeSpans"][0]["spans"][0].update(startTimeUnixNano="2026-01-01T00:00:00Z"),
     "span 'chat m': startTimeUnixNano is not a whole number of Unix epoch nanoseconds: '...'"),
    (lambda d: _set_attribute(d, "gen_ai.usage.output_tokens", {"stringValue": "lots"}),
     "span 'chat m': attribute gen_ai.usage.output_tokens: not a number: '...'"),
    (lambda d: d["resourceSpans"][0]["scopeSpans"][0]["spans"].__setitem__(0, 5), "a span that is not a JSON object: '...'"),
    (lambda d: d.__setitem__("resourceSpans", "x"), "not an OTLP ExportTraceServiceRequest: resourceSpans must be a list"),
])
def test_an_otel_span_skipped_says_which_field_and_why_in_its_own_words(tmp_path, edit, said):
    """Python's exception names and texts (KeyError: 'startTimeUnixNano', could not convert string to float) were
    the reasons given, without the attribute."""
    import json

    lines = (FIXTURES / "otel_genai.jsonl").read_text().splitlines()
    doc = json.loads(lines[0])
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["name"] = "chat m"
    edit(doc)
    lines[0] = json.dumps(doc)
    p = tmp_path / "spans.jsonl"
    p.write_text("\n".join(lines) + "\n")
    s = fit_trace(p).summary
    assert s["skipped_lines"] >= 1
    assert any(reason.startswith(said) for reason in s["skipped"]), s["skipped"]


def test_a_mini_swe_call_index_or_latency_that_cannot_be_is_a_bad_line(tmp_path):
    def edit(lines):
        _set(lines, 3, "call_index", "2.5")                  # file line 4
        _set(lines, 5, "call_index", "-1")                   # file line 6
        _set(lines, 6, "t_request_s", "-1e12")               # file line 7: a call of 31,700 years
    p = _mini_swe_with(tmp_path, edit)
    s = fit_trace(p).summary
    assert s["skipped_lines"] == 3 and s["calls"] == 249
    reasons = {r: d["examples"] for r, d in s["skipped"].items()}
    assert reasons["call_index is not a whole number from 0 up (the call's place in its session): '...'"] == [
        f"{p}:4", f"{p}:6"]
    assert [w for r, w in reasons.items() if r.startswith("lasts more than a day")] == [[f"{p}:7"]]


@pytest.mark.parametrize("fmt,line,mapping", [
    ("mooncake", '{"timestamp": 1, "input_length": 900000, "output_length": 10, "input_length": 1000, '
                 '"hash_ids": [0, 1]}\n', None),
    ("jsonl", '{"session": "a", "inp": 5, "out": 3, "t": 2, "inp": 50}\n',
     "session=session,input_tokens=inp,output_tokens=out,start_ms=t"),
])
def test_a_key_given_twice_in_a_line_is_a_bad_line_not_its_last_value(tmp_path, fmt, line, mapping):
    """A JSON reader keeps a repeated key's last value and drops the other silently (fuzzing found it): the line is
    skipped with the key named, and --strict stops there."""
    p = tmp_path / "trace.jsonl"
    good = GOOD if fmt == "mooncake" else '{"session": "b", "inp": 7, "out": 3, "t": 1}\n'
    p.write_text(good + line + good)
    s = fit_trace(p, fmt, mapping=mapping).summary
    assert s["calls"] == 2 and s["skipped_lines"] == 1
    (reason,) = s["skipped"]
    assert re.match(r"the key '(input_length|inp)' is given twice", reason) and s["skipped"][reason]["examples"] == [f"{p}:2"]
    with pytest.raises(TraceError, match=rf"{p}:2: the key '(input_length|inp)' is given twice in one object"):
        fit_trace(p, fmt, mapping=mapping, strict=True)


def test_a_key_given_twice_inside_a_turn_is_a_bad_line(tmp_path):
    # a multi-turn line's token counts sit inside its turns, where only the top level was looked at (fuzz round 6)
    p = tmp_path / "trace.jsonl"
    p.write_text('{"session_id": "x", "turns": [{"input_length": 500, "input_length": 900000, "output_length": 3}]}\n'
                 '{"session_id": "y", "turns": [{"input_length": 500, "output_length": 90}]}\n')
    s = fit_trace(p, "aiperf-multi-turn").summary
    assert s["calls"] == 1 and s["skipped_lines"] == 1
    assert list(s["skipped"]) == ["the key 'input_length' is given twice in one object: keep one (which value is "
                                  "meant is not apmw's to guess)"]


def test_a_key_that_only_looks_repeated_is_read():
    from apmw.traces.textio import repeated_key

    raw = b'{"input_length": 5, "note": "\\"input_length\\" twice", "nested": {"input_length": 1}}'
    assert repeated_key(raw, {"input_length": 5, "note": "", "nested": {}}) is None
    assert repeated_key(b'{"a": 1, "b": 2, "a": 3}', {"a": 3, "b": 2}) == "a"


@pytest.mark.parametrize("name, line, said", [
    ("mooncake", '{"timestamp": "abc", "input_length": 10, "output_length": 5}',
     "bad value: timestamp: not a number: '...'"),
    ("mooncake", '{"timestamp": -1e18, "input_length": 10, "output_length": 5}',
     "bad value: timestamp more than 292 years before its zero"),
    ("aiperf-multi-turn", '{"session_id": "a", "turns": [{"input_length": 100, "output_length": 10}, '
                          '{"input_length": 10, "output_length": 10, "delay": "2s"}]}',
     "bad value: turns[1].delay: not a number: '...'"),
    ("agentperf", '{"conversation_id": "c", "conversation_idx": 0, "recorded_prompt_tokens": [1], '
                  '"recorded_completion_tokens": 5}',
     "bad value: recorded_prompt_tokens: expected a number, got a list: '...'"),
    ("agentperf", '{"conversation_id": "c", "conversation_idx": 0, "recorded_prompt_tokens": 100}',
     "missing field 'recorded_completion_tokens'"),
])
def test_a_counted_reason_names_the_field_and_leaves_out_only_the_value(tmp_path, name, line, said):
    """Reasons are counted with the value they quote left out; the field they name stays in (it said
    "missing field '...'"), and a value that is no number names its field (it said "bad value: could not convert
    string to float: '...'", naming none)."""
    p = tmp_path / "trace.jsonl"
    p.write_text(line + "\n")
    with pytest.raises(TraceError) as caught:
        fit_trace(p, name)
    assert f"skipped 1 line(s): {said}" in str(caught.value)


def test_an_otel_token_count_of_null_is_said_in_our_words(tmp_path):
    lines = (FIXTURES / "otel_genai.jsonl").read_text().splitlines()
    old = re.findall(r'"gen_ai\.usage\.input_tokens","value":\{[^}]*\}', lines[0])[0]
    lines[0] = lines[0].replace(old, '"gen_ai.usage.input_tokens","value":{"intValue":null}', 1)
    p = tmp_path / "spans.jsonl"
    p.write_text("\n".join(lines) + "\n")
    [reason] = fit_trace(p).summary["skipped"]
    assert reason.endswith("attribute gen_ai.usage.input_tokens: not a number: '...'"), reason


@pytest.mark.parametrize("line, said", [
    (b'{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [0], "x": "\xff\xfe"}',
     "not valid JSON (bytes that are not UTF-8)"),
    (b'{"timestamp": 0, "input_length": 100, "output_length": 10, "x": ' + b"[" * 300_000 + b"]" * 300_000 + b"}",
     "not valid JSON (depth limit exceeded"),
    (b'{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [0]}\x00',
     "not valid JSON (unexpected content after document"),
])
def test_a_first_line_that_is_one_broken_json_object_says_what_is_wrong_with_its_json(tmp_path, line, said):
    """A first line of JSON that does not parse fell through to the CSV sniffer: a line of non-UTF-8 bytes or a
    trailing NUL read "format not recognised ... map its columns", one past 128 KiB "not readable as CSV (field
    larger than field limit); save it with \\n line endings" (fuzzing, session 53)."""
    p = tmp_path / "trace.jsonl"
    p.write_bytes(line + b"\n" + GOOD.encode())
    with pytest.raises(TraceError) as caught:
        fit_trace(p)
    message = str(caught.value)
    assert message.startswith(f"{p}:1: the first line is one JSON object that does not parse: {said}"), message
    assert "--format" in message
    s = fit_trace(p, "mooncake").summary                      # with its format given, the line is skipped and counted
    assert s["calls"] == 1 and [said in reason for reason in s["skipped"]] == [True]
