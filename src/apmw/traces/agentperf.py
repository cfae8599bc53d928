"""Artificial Analysis AgentPerf replay JSONL (the traces shipped in the ``agentperf-local`` wheel).

One model turn per line: ``conversation_id`` (the session), ``conversation_idx``
(its order), ``recorded_prompt_tokens``, ``recorded_completion_tokens``,
``simulated_tool_delay_ms_after`` (the tool time after the turn, ms) and
``recorded_model_duration_ms``. The ``messages`` payload is ignored. No cache
counts are recorded.
"""

from __future__ import annotations

from pathlib import Path

from apmw.traces.jsonl import convert_each
from apmw.traces.records import NAN, Call, CallStream, LineErrors, field_number, require_counts, session_key

NAME = "agentperf"
DESCRIPTION = ("AgentPerf replay JSONL (conversation_id, conversation_idx, recorded_prompt_tokens, "
               "recorded_completion_tokens, simulated_tool_delay_ms_after)")


def matches_record(obj: dict) -> bool:
    return "conversation_id" in obj and "recorded_prompt_tokens" in obj


def _convert(line: int, obj: dict):
    inp = field_number(obj, "recorded_prompt_tokens", required=True)
    out = field_number(obj, "recorded_completion_tokens", required=True)
    bad = require_counts(inp, out)
    if bad:
        raise ValueError(bad)
    tool_ms = field_number(obj, "simulated_tool_delay_ms_after")
    model_ms = field_number(obj, "recorded_model_duration_ms")
    idx = field_number(obj, "conversation_idx")
    # no wall-clock stamps in the format: start 0 and end = the recorded model time give the LLM latency;
    # the tool wait comes from simulated_tool_delay_ms_after, so the start/end gap is never used
    session = session_key(obj["conversation_id"], "conversation_id")
    if session is None:
        raise ValueError("conversation_id is null: the conversation this call belongs to is unknown")
    yield Call(session, idx if idx == idx else float(line), inp, out, NAN,
               0.0 if model_ms == model_ms else NAN, model_ms / 1e3, tool_ms / 1e3)


def read(path: str | Path, errors: LineErrors) -> CallStream:
    return convert_each(path, errors, _convert)
