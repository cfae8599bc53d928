"""What every reader produces, and how bad lines are counted or stopped on.

A reader turns one file format into a stream of :data:`Call` tuples, one per
model call. Plain tuples (not objects) keep the per-line cost low: the readers
aim at >= 200k lines/s (bench/fit_speed.py). ``nan`` marks a field the format
does not carry; the fitter uses what is there and says what was missing.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Iterator, NamedTuple

from apmw.errors import ApmwError
from apmw.spec.model import MAX_TOKENS_PER_CALL

NAN = math.nan

# How many example locations to keep per skip reason (the count is always exact).
EXAMPLES_PER_REASON = 3
# The value a skip reason quotes at its end ("could not convert string to float: 'n/a7'"), left out where reasons
# are counted; a field's name quoted there ("missing field 'delay'") is what the reason says, and is kept.
QUOTED = re.compile(r"(?<!field )'[^']*'$")


class TraceError(ApmwError):
    """A trace that cannot be read: unknown format, empty file, or (with --strict) a bad line."""


class Call(NamedTuple):
    """One model call as a trace records it.

    ``session``: the session (agent task) key, or None when the format has none
    (each call is then its own one-call session). ``order``: sorts calls within a
    session (a call index or a start time). ``input_tokens`` is the whole prompt
    the model saw (cached or not). ``tool_wait_after_s`` is the non-LLM time after
    this call; ``gap_before_s`` the time the caller waited before sending it
    (AIPerf's ``delay``); ``start_s``/``end_s`` wall-clock times, used for the gap
    between calls when neither wait is recorded.
    """

    session: object
    order: float
    input_tokens: float
    output_tokens: float
    cached_tokens: float = NAN
    start_s: float = NAN
    end_s: float = NAN
    tool_wait_after_s: float = NAN
    gap_before_s: float = NAN


@dataclass
class LineErrors:
    """Counts malformed lines by reason; with ``strict`` the first one raises.

    Reported as ``file:line: reason`` so a user can open the line and fix it.
    """

    path: str
    strict: bool = False
    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)
    lines_read: int = 0

    def skip(self, line: int, reason: str) -> None:
        """Count line ``line`` as skipped for ``reason``. Reasons that differ only in the value they quote
        (``could not convert string to float: 'n/a7'``) are counted as one, the value left out (the examples
        say where to look)."""
        where = f"{self.path}:{line}"
        if self.strict:
            raise TraceError(f"{where}: {reason} (--strict stops at the first bad line; "
                             "drop --strict to skip such lines and count them)")
        kind = QUOTED.sub("'...'", reason)
        self.counts[kind] = self.counts.get(kind, 0) + 1
        kept = self.examples.setdefault(kind, [])
        if len(kept) < EXAMPLES_PER_REASON:
            kept.append(where)

    @property
    def skipped(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict:
        return {reason: {"count": n, "examples": self.examples[reason]} for reason, n in self.counts.items()}


CallStream = Iterator[Call]


def number(value: object) -> float:
    """A token count or time from JSON/CSV; raises ValueError with the bad value."""
    if type(value) is int:  # the common case in JSON, first (this runs for every field of every line)
        return float(value)
    if value is None or value == "":
        return NAN
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    if not isinstance(value, (int, float, str)):
        raise ValueError(f"expected a number, got a {type(value).__name__}: {quoted(value)}")
    try:
        x = float(value)
    except ValueError:
        raise ValueError(f"not a number: {quoted(value)}") from None
    if math.isnan(x) or math.isinf(x):
        raise ValueError(f"expected a finite number, got {value!r}")
    return x


def field_number(obj: dict, name: str, required: bool = False, where: str = "") -> float:
    """:func:`number` of field ``name`` of a JSON record (a KeyError where ``required`` and absent), a bad value
    named by its field (``where`` before it: the turn it is in)."""
    value = obj[name] if required else obj.get(name)
    try:
        return number(value)
    except ValueError as exc:
        raise ValueError(f"{where}{name}: {exc}") from None


def quoted(value: object, limit: int = 60) -> str:
    """``value`` as JSON text in single quotes, cut to ``limit`` characters: the end of a skip reason, which
    :class:`LineErrors` counts as one reason whatever the value."""
    text = json.dumps(value, default=str).replace("'", "\u2019")
    return "'" + (text if len(text) <= limit else text[:limit] + "...") + "'"


def cell(text: str) -> float:
    """A CSV cell as a number (empty -> nan); the fast path of :func:`number` for strings."""
    if not text:
        return NAN
    x = float(text)
    if x - x:  # nan or inf (finite x gives 0.0)
        raise ValueError(f"expected a finite number, got {text!r}")
    return x


def session_key(value: object, field: str) -> object:
    """A session id as the trace gives it (a string or a number, as text: 1, 1.0 and "1" are one session), None when
    absent; anything else (a list, an object, a boolean, a number that is not finite) raises ValueError, so that its
    line is skipped and counted."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return str(int(value)) if value.is_integer() else repr(value)
    raise ValueError(f"{field} must be a string or a number, got {type(value).__name__} {str(value)[:40]}")


# The last second int64 nanoseconds reach (2262-04-11): a later time in seconds is a time in ms, us or ns read as s.
LATEST_UNIX_S = (2**63 - 1) / 1e9
# Task start times at or after this (2001-09-09 UTC, 1e9 s since the epoch) are read as wall-clock
# times; smaller ones are offsets from the trace's start, which say nothing of the hour of day.
WALL_CLOCK_FROM_S = 1e9
# No model call lasts this long (a day): one that does has a wrong start or end time (a clock reset, a unit slip).
MAX_CALL_S = 86400.0
PAST_2262 = ("a time past the year 2262 as Unix seconds: a time in ms, us or ns read as seconds? (map it with its "
             "unit, e.g. start_ms, start_us)")


def inconsistent(inp: float, cached: float, start: float, end: float) -> str | None:
    """Why a call's cached prompt tokens or its times contradict the rest of it, or None (``nan``: not recorded)."""
    if cached > inp:
        return f"more cached prompt tokens than prompt tokens (cached, prompt: '{cached:g}, {inp:g}')"
    if cached < 0:
        return "negative cached token count"
    if end < start:
        return f"ends before it starts (start, end: '{start!r} s, {end!r} s')"
    if end - start > MAX_CALL_S:
        return f"lasts more than a day, so its start or end time is wrong (start, end: '{start!r} s, {end!r} s')"
    if start > LATEST_UNIX_S or end > LATEST_UNIX_S:
        return PAST_2262
    return None


def require_counts(inp: float, out: float) -> str | None:
    """Why a call's token counts are unusable, or None when they are fine."""
    if math.isnan(inp):
        return "no input token count"
    if math.isnan(out):
        return "no output token count"
    if inp < 0 or out < 0:
        return "negative token count"
    if max(inp, out) > MAX_TOKENS_PER_CALL:
        return f"more than {MAX_TOKENS_PER_CALL:,} tokens in one call (past any model's context window)"
    if inp % 1 or out % 1:
        return "a token count that is not a whole number"
    return None
