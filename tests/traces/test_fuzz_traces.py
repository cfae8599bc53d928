"""Property-based fuzzing of every trace format (Hypothesis): a bundled fixture with some of its
lines broken (bytes replaced or inserted, a line cut short, a field set to a hostile value, lines
duplicated, dropped or blanked; the whole file gzipped or its gzip cut short), read by
:func:`apmw.traces.fit_trace` with its format given or detected. The promises:

- a clean :class:`TraceError` or a fit, never another exception;
- nothing dropped silently: every non-blank line is read (``lines_read``), and in a format with one
  call per line every line read is a call or a counted skip;
- ``--strict`` either stops with the line or has skipped nothing;
- the summary's numbers are finite and non-negative, p50 <= p95 <= p99;
- the fitted workload plans: a clean error or a plan whose numbers are finite and ordered.

CI runs 4 examples per format; ``make fuzz`` APMW_FUZZ_EXAMPLES / 10 (500) per format.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from apmw.capacity import plan
from apmw.errors import ApmwError
from apmw.spec import load_spec
from apmw.traces import fit_trace
from apmw.traces.records import TraceError
from tests.conftest import EXAMPLES, ROOT

TRACES = ROOT / "tests" / "fixtures" / "traces"
EXAMPLES_PER_FORMAT = max(int(os.environ.get("APMW_FUZZ_EXAMPLES", "40")) // 10, 4)
SPEC = load_spec(EXAMPLES / "support-chat.yaml")

# fixture, its format, the --map of a generic format, whether each line is one call
CASES = {
    "otel": ("otel_genai.jsonl", "otel", None, False),
    "otel-openinference": ("openinference.jsonl", "otel", None, False),
    "otel-steps": ("otel_steps.jsonl", "otel", None, False),
    "mini-swe-agent": ("mini_swe_calls_3sessions.csv", "mini-swe-agent", None, True),
    "mooncake": ("mooncake_conversation_head200.jsonl", "mooncake", None, True),
    "aiperf-multi-turn": ("aiperf_multi_turn.jsonl", "aiperf-multi-turn", None, False),
    "agentperf": ("agentperf_two_tasks.jsonl", "agentperf", None, True),
    "azure": ("azure_code_head100.csv", "azure", None, True),
    "csv": ("mini_swe_calls_3sessions.csv", "csv",
            "session=instance_id,order=call_index,input_tokens=prompt_tokens,output_tokens=completion_tokens,"
            "cached_tokens=cached_prompt_tokens,start_s=t_request_s,end_s=t_response_s,tool_wait_s=tool_phase_s", True),
    "jsonl": ("mooncake_conversation_head200.jsonl", "jsonl",
              "input_tokens=input_length,output_tokens=output_length,start_ms=timestamp", True),
}

JSON_VALUES = [None, True, -1, 0, 2**70, 1e308, -1e-300, "", "x", "1e400", [], {}, [[[[[[[[1]]]]]]]],
               {"a": {"b": None}}, "\u0000", "é" * 50]
RAW_TOKENS = [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-0", b"00012", b"\xe9", b"\xff\xfe", b"\x00"]
CELLS = ["", "nan", "inf", "-1", "1e400", "x", "9" * 400, "0x10", "1,5", " 3 ", "\x00", "-0", "1e-320"]


def _leaves(node, path=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, path + (i,))
    yield path


def _set(node, path, value):
    if not path:
        return value
    node[path[0]] = _set(node[path[0]], path[1:], value)
    return node


@st.composite
def _line_mutation(draw, line: bytes, is_csv: bool):
    kind = draw(st.sampled_from(["bytes", "cut", "value", "token", "insert"]))
    safe = st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b"").replace(b'"', b""))
    if kind == "bytes":
        return draw(safe)
    if kind == "cut":
        return line[: draw(st.integers(0, max(len(line) - 1, 0)))]
    if kind == "insert":
        at = draw(st.integers(0, len(line)))
        return line[:at] + draw(safe) + line[at:]
    if is_csv:
        cells = line.split(b",")
        i = draw(st.integers(0, len(cells) - 1))
        cells[i] = draw(st.sampled_from(CELLS)).encode() if kind == "value" else draw(st.sampled_from(RAW_TOKENS))
        return b",".join(cells)
    try:
        obj = json.loads(line)
    except ValueError:
        return line
    path = draw(st.sampled_from(list(_leaves(obj))))
    if kind == "value":
        return json.dumps(_set(obj, path, draw(st.sampled_from(JSON_VALUES)))).encode()
    marker = "\u0001MARK\u0001"
    text = json.dumps(_set(obj, path, marker)).encode()
    return text.replace(json.dumps(marker).encode(), draw(st.sampled_from(RAW_TOKENS)))


@st.composite
def _trace(draw, name: str, is_csv: bool) -> tuple[bytes, bool]:
    lines = (TRACES / name).read_bytes().split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    first = 1 if is_csv else 0          # the CSV header is kept: a broken header is its own case below
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["mutate", "mutate", "duplicate", "drop", "blank"]))
        i = draw(st.integers(first, max(len(lines) - 1, first)))
        if i >= len(lines):
            break
        if op == "mutate":
            lines[i] = draw(_line_mutation(lines[i], is_csv))
        elif op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "drop" and len(lines) > first + 1:
            del lines[i]
        elif op == "blank":
            lines.insert(i, draw(st.sampled_from([b"", b"   ", b"\t"])))
    if is_csv and draw(st.integers(0, 9)) == 0:
        lines[0] = draw(_line_mutation(lines[0], is_csv))
    return b"\n".join(lines) + b"\n", draw(st.booleans()) and draw(st.booleans())


def _nonblank(data: bytes, is_csv: bool) -> int:
    lines = [ln for ln in data.split(b"\n") if ln.strip()]
    return len(lines) - (1 if is_csv and lines else 0)


def _sound(node, path="") -> None:
    if isinstance(node, dict):
        if {"p50", "p95", "p99"} <= node.keys() and all(isinstance(node[k], (int, float)) for k in ("p50", "p95", "p99")):
            assert node["p50"] <= node["p95"] <= node["p99"], (path, node)
        for key, value in node.items():
            _sound(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _sound(value, f"{path}[{i}]")
    elif isinstance(node, float | int) and not isinstance(node, bool):
        assert math.isfinite(node) and node >= 0, (path, node)


def _planned(workload) -> None:
    try:
        result = plan(SPEC.model_copy(update={"workload": workload})).to_dict()
    except ApmwError:
        return
    lat = result["task_latency_s"]
    assert lat["p50"] <= lat["p95"] <= lat["p99"]
    for key in ("agents_per_mw", "ttft_p95_s", "tpot_p95_s", "kv_tokens_resident_p95", "energy_per_session_j"):
        assert math.isfinite(result[key]) and result[key] >= 0, key


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_broken_trace_is_fitted_with_every_line_accounted_for_or_refused_cleanly(case):
    name, fmt, mapping, one_call_per_line = CASES[case]
    is_csv = name.endswith(".csv")

    @settings(max_examples=EXAMPLES_PER_FORMAT, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(trace=_trace(name, is_csv), given_format=st.booleans(), strict=st.booleans(), cut_gzip=st.booleans())
    def check(trace, given_format, strict, cut_gzip):
        data, gzipped = trace
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / (name + (".gz" if gzipped else ""))
            packed = gzip.compress(data) if gzipped else data
            path.write_bytes(packed[: len(packed) // 2] if gzipped and cut_gzip else packed)
            try:
                result = fit_trace(path, fmt if given_format or mapping else None, mapping=mapping, strict=strict)
            except TraceError:
                event("refused")
                return
        s = result.summary
        event("fitted, lines skipped" if s["skipped_lines"] else "fitted whole")
        if strict:
            assert s["skipped_lines"] == 0, s["skipped"]
        if not is_csv or not gzipped:   # no line is lost unread (a CSV's quoted field may span lines)
            assert s["lines_read"] <= _nonblank(data, is_csv) + (1 if is_csv else 0)
        if not is_csv:
            assert s["lines_read"] == _nonblank(data, False), (s["lines_read"], _nonblank(data, False))
        if one_call_per_line:
            assert s["calls"] + s["skipped_lines"] == s["lines_read"], (s["calls"], s["skipped"], s["lines_read"])
        assert s["skipped_lines"] <= s["lines_read"]
        _sound({k: v for k, v in s.items() if k != "workload"})
        _planned(result.workload)

    check()
