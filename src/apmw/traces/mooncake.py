"""Mooncake JSONL, and NVIDIA AIPerf's ``mooncake_trace`` (a superset of it).

One request per line. Mooncake FAST'25 fields: ``timestamp`` (arrival, ms),
``input_length``, ``output_length``, ``hash_ids`` (one id per 512-token block of
the prompt). AIPerf adds ``session_id``, ``delay`` (ms to wait before sending
this turn, after the previous one finished), and ``messages`` or ``text_input``
in place of ``input_length`` (token counts then estimated, see
:mod:`apmw.traces.tokens`).

Sessions: from ``session_id`` when present; otherwise inferred from
``hash_ids`` (a request continues the session of the latest earlier request
whose blocks it extends, :meth:`PrefixCache.parent_session`) -- a heuristic,
since Mooncake traces carry no session ids; without ``hash_ids`` every request
is its own session. The cached share is what an infinite prefix cache over
``hash_ids`` would serve.

**Turns of an AIPerf session are deltas.** With ``session_id``, AIPerf replays a
session as a multi-turn chat in its default ``deltas_without_responses`` context
mode: each line's ``input_length`` / ``text_input`` (and its ``hash_ids``) is the
turn's *new* content, and the request carries the whole history before it
(aiperf 0.13 ``BaseTraceDatasetLoader._infer_context_mode`` and
``ConversationContextMode``). So a turn's prompt is the session's history (earlier
prompts and outputs) plus its delta, and the history counts as cached. A session
given as ``messages`` is self-contained instead (each line is the whole prompt).
Calls of a session keep file order.
"""

from __future__ import annotations

from pathlib import Path

from apmw.traces.prefix import MOONCAKE_BLOCK_TOKENS, PrefixCache
from apmw.spec.model import MAX_TOKENS_PER_CALL
from apmw.traces.records import (LATEST_UNIX_S, NAN, Call, CallStream, LineErrors, field_number, require_counts,
                                 session_key)
from apmw.traces.textio import JSONDecodeError, loads, not_json, open_binary, REPEATED_KEY, repeated_key
from apmw.traces.tokens import estimate_text_tokens

NAME = "mooncake"
ALIASES = ("aiperf-mooncake",)
# A request that continues a session (by its hash_ids) but arrives before the request it continues: sessions
# are inferred in file order, which a Mooncake trace keeps in time order, so its place in the session is unknown.
BEFORE_ITS_PARENT = ("its timestamp is earlier than that of the request whose blocks it extends: the trace is not in "
                     "time order, and its sessions are inferred in file order (sort it by timestamp)")
LATEST_UNIX_MS = LATEST_UNIX_S * 1e3
DESCRIPTION = ("Mooncake / AIPerf mooncake_trace JSONL (timestamp, input_length or messages, output_length, "
               "hash_ids, session_id, delay)")


def matches_record(obj: dict) -> bool:
    return "output_length" in obj and ("input_length" in obj or "messages" in obj or "text_input" in obj
                                       or "hash_ids" in obj) and "turns" not in obj


class Reader:
    """Streams calls; remembers what it had to infer or estimate (for the summary's notes)."""

    def __init__(self, block_tokens: int = MOONCAKE_BLOCK_TOKENS):
        self.cache = PrefixCache(block_tokens)
        self.estimated_lines = 0
        # lines without session ids stamped earlier than a line before them: sessions are inferred in file order
        self.out_of_order = 0
        self.latest_ms = float("-inf")
        self.inferred_sessions = False
        self.saw_session_ids = False
        self.context: dict[object, float] = {}  # AIPerf session -> tokens of its history so far
        # block ids every session's first request starts with (None: no first request seen yet)
        self.first_common: list | None = None
        self.first_without_hashes = False

    def _first_request(self, hash_ids: list | None) -> None:
        """Narrow the block prefix shared by all sessions' first requests (the system prompt's blocks)."""
        if not hash_ids:
            self.first_without_hashes = True
            return
        common = self.first_common
        if common is None:
            self.first_common = list(hash_ids)
            return
        k = 0
        for a, b in zip(common, hash_ids):
            if a != b:
                break
            k += 1
        del common[k:]

    @property
    def shared_prefix_tokens(self) -> float | None:
        """Tokens of the blocks all first requests share; None when unknown."""
        if self.first_common is None or self.first_without_hashes:
            return None
        return float(len(self.first_common) * self.cache.block_tokens)

    def read(self, path: str | Path, errors: LineErrors) -> CallStream:
        """One pass; the common Mooncake line (ints, a hash_ids list) takes the inlined fast path."""
        cache = self.cache
        observe = cache.observe
        last_arrival: dict[object, float] = {}
        with open_binary(path) as f:
            for line, raw in enumerate(f, start=1):
                try:
                    obj = loads(raw)
                except JSONDecodeError as exc:
                    if not raw.strip():
                        continue
                    errors.lines_read += 1
                    errors.skip(line, not_json(raw, exc))
                    continue
                errors.lines_read += 1
                if type(obj) is not dict:
                    errors.skip(line, "not a JSON object")
                    continue
                twice = repeated_key(raw, obj)
                if twice is not None:
                    errors.skip(line, REPEATED_KEY.format(twice))
                    continue
                inp, out, t_ms = obj.get("input_length"), obj.get("output_length"), obj.get("timestamp")
                hash_ids = obj.get("hash_ids")
                if (type(inp) is int and type(out) is int and type(t_ms) in (int, float) and type(hash_ids) is list
                        and -LATEST_UNIX_MS <= t_ms <= LATEST_UNIX_MS
                        and 0 <= inp <= MAX_TOKENS_PER_CALL and 0 <= out <= MAX_TOKENS_PER_CALL and "session_id" not in obj and "delay" not in obj):
                    if hash_ids:
                        try:
                            # integers only (C speed): a nested list or a string raises here, a float sums to one
                            whole = type(sum(hash_ids)) is int
                        except TypeError:
                            whole = False
                        if not whole:
                            errors.skip(line, "hash_ids must be a list of block ids (integers)")
                            continue
                        session, cached = observe(hash_ids, inp, line)
                        self.inferred_sessions = True
                    else:
                        session, cached = line, 0.0
                    if session == line:
                        self._first_request(hash_ids)
                    if t_ms < self.latest_ms:
                        self.out_of_order += 1
                    else:
                        self.latest_ms = t_ms
                    start_s = t_ms / 1e3
                    prev = last_arrival.get(session)
                    if prev is not None and start_s < prev:
                        errors.skip(line, BEFORE_ITS_PARENT)
                        continue
                    last_arrival[session] = start_s
                    # a Call as a plain tuple (same field order)
                    yield (session, start_s, float(inp), float(out), cached, start_s, NAN, NAN,
                           NAN if prev is None else start_s - prev)
                    continue
                try:
                    call = self._call(obj, line, cache, last_arrival)
                except (ValueError, TypeError) as exc:
                    errors.skip(line, f"bad value: {exc}")
                    continue
                bad = require_counts(call.input_tokens, call.output_tokens)
                if bad:
                    errors.skip(line, bad + (" (need input_length or messages, and output_length)"
                                             if bad.startswith("no ") else ""))
                    continue
                yield call

    def _call(self, obj: dict, line: int, cache: PrefixCache, last_arrival: dict) -> Call:
        inp = field_number(obj, "input_length")
        whole = obj.get("messages") is not None  # a self-contained prompt, not a delta
        if inp != inp:  # nan: estimate from text
            text = obj.get("messages", obj.get("text_input"))
            if whole and not (isinstance(text, list) and text and all(isinstance(m, dict) for m in text)):
                raise ValueError(f"messages is {str(text)[:40]!r}; it is a list of chat turns ({{role, content}})")
            if text is not None:
                inp = estimate_text_tokens(text)
                if inp == 0:
                    raise ValueError("the prompt holds no text to count its tokens from (give input_length)")
                self.estimated_lines += 1
        out = field_number(obj, "output_length")
        t_ms = field_number(obj, "timestamp")
        delay_ms = field_number(obj, "delay")
        hash_ids = obj.get("hash_ids")
        if hash_ids is not None and not (isinstance(hash_ids, list)
                                         and all(type(h) is int for h in hash_ids)):
            raise ValueError("hash_ids must be a list of block ids (integers)")
        session = session_key(obj.get("session_id"), "session_id")
        if session is not None:
            return self._session_turn(session, line, inp, out, hash_ids, whole, t_ms, delay_ms, cache)
        cached = NAN
        if hash_ids:
            if inp == inp:
                session = cache.parent_session(hash_ids, inp, line)
                self.inferred_sessions = True
            cached = cache.hit_tokens(hash_ids, inp)
        elif hash_ids is not None:
            cached = 0.0
        if session is None:
            session = line
        if session == line:
            self._first_request(hash_ids)
        if t_ms == t_ms:
            if t_ms < self.latest_ms:
                self.out_of_order += 1
            else:
                self.latest_ms = t_ms
        start_s = t_ms / 1e3
        if start_s > LATEST_UNIX_S:
            raise ValueError("timestamp past the year 2262 as Unix milliseconds (Mooncake's unit): a time in us or "
                             "ns? (convert it to ms)")
        if start_s < -LATEST_UNIX_S:
            raise ValueError("timestamp more than 292 years before its zero (Unix milliseconds, Mooncake's unit, or "
                             "milliseconds from the trace's start): a time in us or ns? (convert it to ms)")
        gap = delay_ms / 1e3
        if start_s == start_s and start_s < last_arrival.get(session, start_s):
            raise ValueError(BEFORE_ITS_PARENT)
        if gap != gap and start_s == start_s and session in last_arrival:
            # arrival-to-arrival gap; it includes the previous call's own latency (no response times)
            gap = start_s - last_arrival[session]
        if start_s == start_s:
            last_arrival[session] = start_s
        return Call(session, start_s if start_s == start_s else float(line), inp, out, cached, start_s, NAN, NAN, gap)

    def _session_turn(self, session: object, line: int, inp: float, out: float, hash_ids: list | None,
                      whole: bool, t_ms: float, delay_ms: float, cache: PrefixCache) -> Call:
        """One turn of an AIPerf session: history + delta, unless it is a whole ``messages`` prompt."""
        self.saw_session_ids = True
        if session not in self.context:
            self._first_request(hash_ids)
        history = self.context.get(session, 0.0)
        prompt = inp if whole else history + inp
        cached = NAN
        if hash_ids is not None:
            cached = (0.0 if whole else history) + cache.hit_tokens(hash_ids, inp)
        if require_counts(prompt, out) is None:     # a turn the reader skips leaves the history as it was
            self.context[session] = prompt + out
        start_s = t_ms / 1e3
        return Call(session, float(line), prompt, out, cached, start_s, NAN, NAN, delay_ms / 1e3)

