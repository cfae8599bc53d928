"""Write the OpenTelemetry fixtures in tests/fixtures/traces/ with the real opentelemetry-sdk.

Run once (needs opentelemetry-sdk and opentelemetry-exporter-otlp-json-file, the
OTLP JSON file exporter published by the OpenTelemetry project on PyPI):

    pip install opentelemetry-sdk==1.45.2 opentelemetry-exporter-otlp-json-file==0.66b1
    python scripts/make_otel_fixtures.py

The exporter writes one OTLP ``ExportTraceServiceRequest`` as JSON per line, the
same layout as the OpenTelemetry Collector's ``file`` exporter. Tests read the
files and do not need the SDK.

Three agent runs with fixed token counts and times (so tests can check exact figures):

* ``otel_genai.jsonl`` -- current GenAI semantic conventions: ``gen_ai.operation.name``
  (``invoke_agent`` > ``chat`` / ``execute_tool``), ``gen_ai.usage.input_tokens``,
  ``gen_ai.usage.output_tokens``, ``gen_ai.usage.cache_read.input_tokens``,
  ``gen_ai.conversation.id``;
* ``otel_legacy.jsonl`` -- the older names ``gen_ai.usage.prompt_tokens`` /
  ``gen_ai.usage.completion_tokens``, no conversation id (grouped by trace);
* ``otel_conversation_on_agent.jsonl`` -- each session split over two traces, with
  ``gen_ai.conversation.id`` only on the ``invoke_agent`` root spans;
* ``otel_steps.jsonl`` -- agent steps of several model calls between tool runs
  (``STEP_SESSIONS``);
* ``openinference.jsonl`` -- OpenInference attributes ``llm.token_count.prompt``,
  ``llm.token_count.completion``, ``llm.token_count.prompt_details.cache_read``,
  ``session.id``, ``openinference.span.kind``.
"""

from __future__ import annotations

from pathlib import Path

from opentelemetry.exporter.otlp.json.file import FileSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "traces"
T0_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z, a fixed epoch so the files are reproducible

# Per session: a list of calls (prompt tokens, output tokens, cached tokens, LLM seconds, tool seconds after).
SESSIONS = {
    "sess-a": [(1200, 80, 0, 2.0, 1.5), (1500, 120, 1200, 3.0, 0.5), (1900, 60, 1500, 1.0, 4.0),
               (2100, 200, 1900, 5.0, 0.0)],
    "sess-b": [(1200, 50, 1024, 1.0, 2.0), (1400, 90, 1200, 2.0, 1.0)],
    "sess-c": [(1300, 300, 1024, 6.0, 3.0), (1800, 100, 1300, 2.5, 0.5), (2000, 150, 1800, 3.5, 0.0)],
}
SESSION_GAP_S = 100  # sessions start 100 s apart
# Agent steps of several model calls: a call with 0 tool seconds is followed at once by the next call
# of the same step (no execute_tool span between them). Steps: sess-m [2, 2, 1] calls, sess-n [1, 2].
STEP_SESSIONS = {
    "sess-m": [(1000, 50, 0, 1.0, 0.0), (1100, 60, 1000, 1.0, 2.0), (1300, 40, 1100, 1.0, 0.0),
               (1400, 70, 1300, 1.0, 3.0), (1600, 20, 1400, 1.0, 0.0)],
    "sess-n": [(1000, 30, 0, 1.0, 1.0), (1200, 30, 1000, 1.0, 0.0), (1300, 30, 1200, 1.0, 0.0)],
}


def _tracer(path: Path, service: str):
    provider = TracerProvider(resource=Resource.create({"service.name": service}), sampler=ALWAYS_ON)
    provider.add_span_processor(SimpleSpanProcessor(FileSpanExporter(path)))
    return provider, provider.get_tracer("apmw-fixtures", "1.0")


def _ns(seconds: float) -> int:
    return T0_NS + int(round(seconds * 1e9))


def _write(path: Path, service: str, llm_attrs, tool_attrs, agent_attrs, sessions: dict = SESSIONS) -> None:
    path.unlink(missing_ok=True)
    provider, tracer = _tracer(path, service)
    for s, (session, calls) in enumerate(sessions.items()):
        t = s * SESSION_GAP_S
        total = sum(c[3] + c[4] for c in calls)
        root = tracer.start_span("invoke_agent coder", start_time=_ns(t), attributes=agent_attrs(session))
        from opentelemetry import trace

        ctx = trace.set_span_in_context(root)
        for prompt, out, cached, llm_s, tool_s in calls:
            span = tracer.start_span("chat deepseek-chat", context=ctx, start_time=_ns(t),
                                     attributes=llm_attrs(session, prompt, out, cached))
            span.end(end_time=_ns(t + llm_s))
            t += llm_s
            if tool_s:
                tool = tracer.start_span("execute_tool bash", context=ctx, start_time=_ns(t),
                                         attributes=tool_attrs(session))
                tool.end(end_time=_ns(t + tool_s))
                t += tool_s
        root.end(end_time=_ns(s * SESSION_GAP_S + total))
    provider.shutdown()


def _write_turns(path: Path) -> None:
    """Each session as two traces (two user turns), the conversation id only on their invoke_agent roots.

    Many instrumentations put ``gen_ai.conversation.id`` on the agent span alone; a reader must
    carry it to the chat spans of the same trace, and join the traces of one conversation.
    """
    from opentelemetry import trace

    path.unlink(missing_ok=True)
    provider, tracer = _tracer(path, "agent-turns")
    for s, (session, calls) in enumerate(SESSIONS.items()):
        t = s * SESSION_GAP_S
        half = (len(calls) + 1) // 2
        for turn in (calls[:half], calls[half:]):
            begin = t
            root = tracer.start_span("invoke_agent coder", start_time=_ns(t),
                                     attributes={"gen_ai.operation.name": "invoke_agent",
                                                 "gen_ai.conversation.id": session})
            ctx = trace.set_span_in_context(root)
            for prompt, out, cached, llm_s, tool_s in turn:
                span = tracer.start_span("chat deepseek-chat", context=ctx, start_time=_ns(t),
                                         attributes={"gen_ai.operation.name": "chat",
                                                     "gen_ai.usage.input_tokens": prompt,
                                                     "gen_ai.usage.output_tokens": out})
                span.end(end_time=_ns(t + llm_s))
                t += llm_s + tool_s
            root.end(end_time=_ns(max(t, begin)))
    provider.shutdown()


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    _write(
        OUT / "otel_genai.jsonl", "agent-genai",
        lambda sess, p, o, c: {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "deepseek",
                               "gen_ai.request.model": "deepseek-chat", "gen_ai.conversation.id": sess,
                               "gen_ai.usage.input_tokens": p, "gen_ai.usage.output_tokens": o,
                               "gen_ai.usage.cache_read.input_tokens": c},
        lambda sess: {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "bash",
                      "gen_ai.conversation.id": sess},
        # an agent span may carry the session's total usage: a reader must not count it as a call
        lambda sess: {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "coder",
                      "gen_ai.conversation.id": sess,
                      "gen_ai.usage.input_tokens": sum(c[0] for c in SESSIONS[sess]),
                      "gen_ai.usage.output_tokens": sum(c[1] for c in SESSIONS[sess])},
    )
    _write(
        OUT / "otel_legacy.jsonl", "agent-legacy",
        lambda sess, p, o, c: {"gen_ai.system": "openai", "gen_ai.request.model": "gpt-4o",
                               "gen_ai.usage.prompt_tokens": p, "gen_ai.usage.completion_tokens": o},
        lambda sess: {"gen_ai.operation.name": "execute_tool"},
        lambda sess: {},
    )
    _write(
        OUT / "openinference.jsonl", "agent-openinference",
        lambda sess, p, o, c: {"openinference.span.kind": "LLM", "session.id": sess,
                               "llm.model_name": "deepseek-chat", "llm.token_count.prompt": p,
                               "llm.token_count.completion": o, "llm.token_count.total": p + o,
                               "llm.token_count.prompt_details.cache_read": c},
        lambda sess: {"openinference.span.kind": "TOOL", "session.id": sess, "tool.name": "bash"},
        lambda sess: {"openinference.span.kind": "AGENT", "session.id": sess},
    )
    _write_turns(OUT / "otel_conversation_on_agent.jsonl")
    _write(
        OUT / "otel_steps.jsonl", "agent-steps",
        lambda sess, p, o, c: {"gen_ai.operation.name": "chat", "gen_ai.conversation.id": sess,
                               "gen_ai.usage.input_tokens": p, "gen_ai.usage.output_tokens": o},
        lambda sess: {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "bash",
                      "gen_ai.conversation.id": sess},
        lambda sess: {"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": sess},
        sessions=STEP_SESSIONS,
    )
    for name in ("otel_genai.jsonl", "otel_legacy.jsonl", "openinference.jsonl", "otel_conversation_on_agent.jsonl",
                 "otel_steps.jsonl"):
        print(OUT / name, (OUT / name).stat().st_size, "bytes")


if __name__ == "__main__":
    main()
