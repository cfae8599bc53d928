"""OpenTelemetry spans as OTLP JSON: the SDK's file exporter or the Collector's ``file`` exporter.

Each line is one ``ExportTraceServiceRequest``
(``resourceSpans[].scopeSpans[].spans[]``); a file holding a single such
document spread over several lines is read whole. A span is a model call when
it carries token usage and is not an agent/chain/tool span. Attribute names
understood, newest first (OpenTelemetry GenAI semantic conventions, and
OpenInference as written by Arize Phoenix instrumentations):

==============  ==============================================================
input tokens    ``gen_ai.usage.input_tokens``, ``gen_ai.usage.prompt_tokens``
                (older GenAI name), ``llm.token_count.prompt`` (OpenInference)
output tokens   ``gen_ai.usage.output_tokens``, ``gen_ai.usage.completion_tokens``,
                ``llm.token_count.completion``
cached tokens   ``gen_ai.usage.cache_read.input_tokens``,
                ``llm.token_count.prompt_details.cache_read``
session         ``gen_ai.conversation.id``, ``session.id`` on the span, or on any
                other span of its trace (agent spans often carry it alone);
                else the trace id
kind            ``gen_ai.operation.name`` (``chat``, ``text_completion``,
                ``generate_content`` are calls; ``invoke_agent``, ``create_agent``
                and ``execute_tool`` are not), ``openinference.span.kind``
                (``LLM`` is a call)
==============  ==============================================================

Spans of one session may arrive in any order and across lines: calls are
ordered by start time. When the trace has tool spans, a step is the run of model
calls up to the next tool span (``calls_per_step`` is fitted from that); without
any, each call is a step. The tool wait is the gap between a step's last call's
end and the next call's start (tool spans and agent overhead both fall in it).
"""

from __future__ import annotations

from pathlib import Path

from apmw.traces.records import (LATEST_UNIX_S, NAN, Call, CallStream, LineErrors, TraceError, inconsistent, number,
                                 quoted, require_counts, session_key)
from apmw.traces.textio import JSONDecodeError, loads, not_json, open_binary

NAME = "otel"
ALIASES = ("otlp", "openinference")
DESCRIPTION = ("OpenTelemetry OTLP JSON spans (GenAI conventions, older gen_ai.usage.prompt_tokens names, "
               "OpenInference llm.token_count.*)")

INPUT_KEYS = ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt")
OUTPUT_KEYS = ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens", "llm.token_count.completion")
CACHED_KEYS = ("gen_ai.usage.cache_read.input_tokens", "llm.token_count.prompt_details.cache_read")
SESSION_KEYS = ("gen_ai.conversation.id", "session.id")
NOT_CALLS = {"invoke_agent", "create_agent", "execute_tool", "embeddings"}
CALLS = {"chat", "text_completion", "generate_content"}
# A span's times are Unix epoch nanoseconds (OTLP fixed64; 0 means unset). Traces of LLM calls postdate 2000, and
# int64 nanoseconds end in 2262: anything outside is not a time this span could have been recorded at.
EARLIEST_UNIX_S = 946_684_800.0            # 2000-01-01T00:00:00Z
OPENINFERENCE_NOT_CALLS = {"AGENT", "CHAIN", "TOOL", "RETRIEVER", "EMBEDDING", "RERANKER", "GUARDRAIL", "EVALUATOR"}
# The attributes a call is read from: one given twice with two values is a span apmw cannot read one way.
READ_KEYS = frozenset(INPUT_KEYS + OUTPUT_KEYS + CACHED_KEYS + SESSION_KEYS
                      + ("gen_ai.operation.name", "openinference.span.kind"))


def matches_record(obj: dict) -> bool:
    return "resourceSpans" in obj


def _value(v: dict) -> object:
    """An OTLP AnyValue: intValue is a JSON string in OTLP/JSON (64-bit ints), the rest are plain; an array or a
    key-value list as it is (a list or an object), which no attribute apmw reads takes."""
    for key in ("intValue", "doubleValue", "stringValue", "boolValue", "arrayValue", "kvlistValue"):
        if key in v:
            if key == "intValue":
                if isinstance(v[key], bool):
                    raise ValueError(f"intValue {v[key]!r} is not an integer")
                return int(v[key])
            return v[key]
    return None


def _decoded(attrs: dict, keys: tuple[str, ...]) -> object:
    """The value of the first of ``keys`` present, decoded from its AnyValue."""
    for k in keys:
        v = attrs.get(k)
        if v is not None:
            value = _value(v)
            if value not in (None, ""):     # an empty value does not hide the next key (session.id after an empty
                return value                # gen_ai.conversation.id)
    return None


def _count(attrs: dict, keys: tuple[str, ...]) -> float:
    """A token count read under any of its names (``keys``, newest first); the same count under two names with two
    values raises ValueError (which one the span meant cannot be told)."""
    given = {k: _attribute_count(attrs, k) for k in keys if attrs.get(k) is not None}
    values = {v for v in given.values() if v == v}
    if len(values) > 1:
        raise ValueError("one token count under two names with two values (" + ", ".join(
            f"{k} {v:g}" for k, v in given.items() if v == v) + "): keep one")
    return next(iter(values), NAN)


# How float() and int() say that a text is no number.
PYTHON_CONVERSION_ERRORS = ("could not convert string to float", "invalid literal for int()")


def _attribute_count(attrs: dict, key: str) -> float:
    """The token count of attribute ``key``; a value that is no count raises ValueError naming the attribute."""
    try:
        return _as_float(_decoded(attrs, (key,)))
    except (TypeError, ValueError) as exc:
        said = str(exc)
        if isinstance(exc, TypeError) or said.startswith(PYTHON_CONVERSION_ERRORS):   # Python's words: say ours
            raw = attrs.get(key)
            said = "not a number: " + quoted(next(iter(raw.values()), raw) if isinstance(raw, dict) and len(raw) == 1
                                             else raw)
        raise ValueError(f"attribute {key}: {said}") from None


def _as_float(x: object) -> float:
    """A token count from a decoded AnyValue: a boolean, an array, a key-value list or a non-finite number raises
    ValueError, so the span is skipped and counted (:func:`apmw.traces.records.number`)."""
    if isinstance(x, (list, dict)):
        raise ValueError("a token count given as an array or a key-value list")
    return number(x)


class Reader:
    def __init__(self) -> None:
        self.spans = 0
        self.tool_spans = 0
        # trace id -> conversation id, from any span of the trace that carries one (often only the agent span)
        self.trace_conversation: dict[str, object] = {}
        # (session key, start s) of each tool span: model calls with no tool span between them form one step
        self.tool_starts: list[tuple[object, float]] = []
        # (trace id, span id) of each span read: one exported twice is counted once
        self.seen_spans: set[tuple[object, object]] = set()

    def session_alias(self, key: object) -> object:
        """After reading: a call keyed by its trace joins the conversation some span of that trace named."""
        if isinstance(key, tuple) and key[:1] == ("trace",):
            return self.trace_conversation.get(key[1], key)
        return key

    def read(self, path: str | Path, errors: LineErrors) -> CallStream:
        for line, doc in self._documents(path, errors):
            spans = _spans_of(doc)
            if spans is None:
                errors.skip(line, "not an OTLP ExportTraceServiceRequest: resourceSpans must be a list of objects "
                                  "whose scopeSpans are lists of objects holding a list of spans")
                continue
            for span in spans:
                if not isinstance(span, dict):
                    errors.skip(line, f"a span that is not a JSON object: {quoted(span)}")
                    continue
                try:
                    self._once(span)
                    call = self._call(span)
                except (KeyError, TypeError, ValueError, AttributeError) as exc:
                    name = span.get("name") if isinstance(span, dict) else None
                    said = str(exc) if type(exc) is ValueError else f"{type(exc).__name__}: {exc}"
                    errors.skip(line, f"span {name!r}: {said}")
                    continue
                if call is not None:
                    yield call

    def _documents(self, path: str | Path, errors: LineErrors):
        """Each OTLP JSON object of the file: one per line (JSON lines), or the whole file as one pretty-printed
        document when its first non-blank line is not JSON on its own. Where the whole file is not JSON either,
        that first line is skipped as a bad line and the rest read as JSON lines (a truncated first record); a
        file with no good line then is refused as neither form."""
        whole_error = None
        with open_binary(path) as f:
            first = None
            for line, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                errors.lines_read += 1
                try:
                    obj = loads(raw)
                except JSONDecodeError as exc:
                    if first is None and errors.lines_read == 1 and raw.lstrip().startswith(b"{"):
                        whole_error = self._whole_document_error(path)
                        if whole_error is None:
                            yield from self._whole_document(path, errors)
                            return
                    errors.skip(line, not_json(raw, exc))
                    continue
                first = first or obj
                if not isinstance(obj, dict) or "resourceSpans" not in obj:
                    errors.skip(line, "not an OTLP JSON object (no 'resourceSpans')")
                    continue
                yield line, obj
        if first is None and whole_error is not None:
            raise TraceError(f"{path}: neither JSON lines nor one JSON document ({whole_error})")

    @staticmethod
    def _whole_document_error(path: str | Path) -> JSONDecodeError | None:
        """Why the whole file is not one JSON document (None where it is)."""
        with open_binary(path) as f:
            try:
                loads(f.read())
            except JSONDecodeError as exc:
                return exc
        return None

    def _whole_document(self, path: str | Path, errors: LineErrors):
        with open_binary(path) as f:
            obj = loads(f.read())
        if not isinstance(obj, dict) or "resourceSpans" not in obj:
            raise TraceError(f"{path}: not an OTLP JSON document (no 'resourceSpans')")
        yield 1, obj

    def _once(self, span: dict) -> None:
        """ValueError where the span (its trace and span ids) was read before."""
        key = (span.get("traceId"), span.get("spanId"))
        if not all(isinstance(k, str) and k for k in key):
            return
        if key in self.seen_spans:
            raise ValueError("its trace and span ids were given before: a span exported twice (a collector's retry, "
                             "files concatenated) is counted once")
        self.seen_spans.add(key)

    def _call(self, span: dict) -> Call | None:
        self.spans += 1
        # key -> raw OTLP AnyValue; only the few attributes used below are decoded
        attrs: dict[str, object] = {}
        listed = span.get("attributes", ())
        if not isinstance(listed, list) or not all(isinstance(a, dict) and "key" in a for a in listed):
            raise ValueError("attributes is not a list of {\"key\": ..., \"value\": ...} objects (OTLP JSON)")
        for a in listed:
            k, v = a["key"], a.get("value")
            if k in attrs and attrs[k] != v and k in READ_KEYS:
                raise ValueError(f"attribute {k} is given twice, with two values: keep one")
            attrs[k] = v
        conversation = session_key(_decoded(attrs, SESSION_KEYS), "the conversation id")
        trace_id = session_key(span.get("traceId"), "traceId")
        if conversation:
            self.trace_conversation[trace_id] = conversation
        op = _decoded(attrs, ("gen_ai.operation.name",))
        kind = _decoded(attrs, ("openinference.span.kind",))
        if op == "execute_tool" or kind == "TOOL":
            self.tool_spans += 1
            self.tool_starts.append((conversation or ("trace", trace_id), _unix_s(span, "startTimeUnixNano")))
            return None
        if op in NOT_CALLS or kind in OPENINFERENCE_NOT_CALLS:
            return None
        inp, out = _count(attrs, INPUT_KEYS), _count(attrs, OUTPUT_KEYS)
        if inp != inp and out != out:
            # a model call that recorded no usage (streamed calls often do not); GenAI spans are named
            # '{operation} {model}', so the name tells one whose operation attribute is missing too
            name = span.get("name")
            named = isinstance(name, str) and name.split(" ", 1)[0] in CALLS
            if op in CALLS or kind == "LLM" or named:
                what = (f"gen_ai.operation.name {op!r}" if op in CALLS else "LLM span" if kind == "LLM"
                        else f"span name {name[:60]!r}")
                raise ValueError(f"a model call ({what}) without token usage: skipped, so its time falls into the "
                                 "tool wait around it; record usage on streamed calls (stream_options include_usage)")
            return None  # not a model call (no usage): HTTP, DB, framework spans
        unusable = require_counts(inp, out)
        if unusable:
            raise ValueError(f"token usage: {unusable}")
        if not conversation and not trace_id:
            raise ValueError("no traceId and no conversation id: the conversation this call belongs to is unknown")
        session = conversation or ("trace", trace_id)
        start = _unix_s(span, "startTimeUnixNano")
        end = _unix_s(span, "endTimeUnixNano") if str(span.get("endTimeUnixNano", 0)) != "0" else NAN   # 0: unset
        cached = _count(attrs, CACHED_KEYS)
        bad = inconsistent(inp, cached, start, end)
        if bad:
            raise ValueError(bad)
        return Call(session, start, inp, out, cached, start, end)


def _spans_of(doc: dict) -> list | None:
    """The spans of an OTLP JSON document (resourceSpans -> scopeSpans -> spans), or None where it is not shaped so."""
    spans: list = []
    resource_spans = doc["resourceSpans"]
    for rs in resource_spans if isinstance(resource_spans, list) else [None]:
        scopes = rs.get("scopeSpans", []) if isinstance(rs, dict) else None
        for ss in scopes if isinstance(scopes, list) else [None]:
            listed = ss.get("spans", []) if isinstance(ss, dict) else None
            if not isinstance(listed, list):
                return None
            spans += listed
    return spans


def _unix_s(span: dict, key: str) -> float:
    """``span[key]`` (Unix epoch nanoseconds) in seconds; ValueError where it is no time a span was recorded at."""
    if key not in span:
        raise ValueError(f"no {key} (OTLP spans record their start and end in Unix epoch nanoseconds)")
    try:
        t = int(span[key]) / 1e9
    except (TypeError, ValueError):
        raise ValueError(f"{key} is not a whole number of Unix epoch nanoseconds: {quoted(span[key])}") from None
    if not EARLIEST_UNIX_S <= t <= LATEST_UNIX_S:
        raise ValueError(f"{key} is not a Unix time in nanoseconds from 2000 to 2262 (OTLP's epoch nanoseconds; 0 "
                         f"means unset): '{span[key]}'")
    return t
