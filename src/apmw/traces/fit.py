"""From a stream of calls to a summary and a validated ``workload`` section.

Definitions (MODEL.md section 2; the spec's Workload grows context call by call):

* a **session** is one agent task; each call is one step (``calls_per_step: 1``):
  traces do not mark several model calls between two tool runs;
* **new input** of call i > 0 = prompt_i - prompt_{i-1} - output_{i-1} (what the
  tools and the user added); negative values (the agent trimmed its context) are
  counted and clipped to 0;
* **system prompt** = the smallest first-call prompt over sessions (the template
  every task starts with cannot be longer), capped by the blocks all first calls
  share where the trace has block hashes; the **first call's new input** is the
  rest of each first prompt;
* **tool wait** after a call = its recorded tool time, else the caller's recorded
  delay before the next call, else next start - this end;
* **cached prompt share** = cached / prompt tokens over calls that report a cache
  count (provider usage, or ``hash_ids`` prefix hits); **reusable prefix share** =
  the share of prompt tokens that the session had already sent (history and
  system prompt), what a prefix cache that never evicts could serve.

Percentiles are numpy's default (linear interpolation between order statistics).
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np
from pydantic import ValidationError

from apmw.spec import Workload
from apmw.spec.section import named_field
from apmw.spec.distribution import MAX_LOG_SPREAD, Z95, Lognormal
from apmw.traces.records import WALL_CLOCK_FROM_S, Call, TraceError

# Quantile points of the empirical form: dense in the tail, where task latency is decided.
QUANTILES = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0)
# 'auto' keeps the lognormal {mean, p95} only if its p99 is within this factor of the measured p99.
TAIL_TOLERANCE = 1.5
FORMS = ("auto", "lognormal", "empirical")
# z-score of the 99th percentile of a standard normal (scipy.stats.norm.ppf(0.99)).
Z99 = 2.3263478740408408


@dataclass
class Columns:
    """All calls as flat arrays, sorted by (session, order)."""

    session: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    cached_tokens: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray
    tool_wait_after_s: np.ndarray
    gap_before_s: np.ndarray
    session_keys: list = field(default_factory=list)
    repeats: int = 0                    # calls whose session and order equal the call's before them
    first_repeat: tuple | None = None   # (session key, order) of the first such call

    def __len__(self) -> int:
        return len(self.session)

    def relabel(self, alias) -> "Columns":
        """Merge sessions whose keys ``alias`` maps to one key; calls re-sorted by start time."""
        labels = [alias(k) for k in self.session_keys]
        ids: dict[object, int] = {}
        new_id = np.array([ids.setdefault(label, len(ids)) for label in labels], dtype=np.int64)
        session = new_id[self.session] if len(self.session) else self.session
        idx = np.lexsort((self.start_s, session))
        return Columns(session[idx], *(getattr(self, f)[idx] for f in (
            "input_tokens", "output_tokens", "cached_tokens", "start_s", "end_s", "tool_wait_after_s",
            "gap_before_s")), session_keys=list(ids))


def collect(stream: Iterable[Call]) -> Columns:
    """Append each call to typed arrays (8 doubles and one int per call), then sort once."""
    keys: dict[object, int] = {}
    sess = array("q")
    cols = [array("d") for _ in range(8)]
    a_sess = sess.append
    a_order, a_in, a_out, a_cached, a_start, a_end, a_tool, a_gap = (c.append for c in cols)
    get = keys.get
    for key, order, inp, out, cached, start, end, tool, gap in stream:  # Call fields, unpacked (fast)
        if key is None:  # no session in the format: a one-call session of its own
            key = ("call", len(sess))
        k = get(key)
        if k is None:
            k = keys[key] = len(keys)
        a_sess(k)
        a_order(order)
        a_in(inp)
        a_out(out)
        a_cached(cached)
        a_start(start)
        a_end(end)
        a_tool(tool)
        a_gap(gap)
    del a_sess, a_order, a_in, a_out, a_cached, a_start, a_end, a_tool, a_gap  # they hold the buffers
    session = np.array(sess, dtype=np.int64)
    del sess
    order = np.frombuffer(cols[0], dtype=np.float64) if len(cols[0]) else np.zeros(0)
    idx = np.lexsort((order, session))
    session, order = session[idx], order[idx]
    cols[0] = None
    repeat = np.flatnonzero((session[1:] == session[:-1]) & (order[1:] == order[:-1])) + 1
    key_of = list(keys)
    first = (key_of[session[repeat[0]]], float(order[repeat[0]])) if len(repeat) else None
    del order
    ordered = []
    for i in range(1, len(cols)):  # sort one column at a time and free its buffer: peak ~ one copy + one column
        ordered.append(np.frombuffer(cols[i], dtype=np.float64)[idx] if len(idx) else np.zeros(0))
        cols[i] = None
    return Columns(session, *ordered, session_keys=key_of, repeats=len(repeat), first_repeat=first)


def step_ends(c: Columns, tools: list[tuple[object, float]]) -> np.ndarray | None:
    """Per call: does a tool span of its session start after it and before the next call?

    None when there are no tool spans (then every call is its own step). The session's
    last call always ends a step, and so does every call of a session without tool spans
    (its tools are not traced, which says nothing about where its steps end).
    """
    ids = {key: i for i, key in enumerate(c.session_keys)}
    pairs = [(ids[k], t) for k, t in tools if k in ids]
    if not pairs:
        return None
    n = len(c)
    t_sess = np.array([p[0] for p in pairs], dtype=np.int64)
    t_time = np.array([p[1] for p in pairs])
    # one time axis per session: shift session k by k * span so a single sorted search serves all
    lo = np.nanmin(np.concatenate([c.start_s, t_time]))
    span = np.nanmax(np.concatenate([c.end_s, c.start_s, t_time])) - lo + 1.0
    tool_axis = np.sort(t_time - lo + t_sess * span)
    after = np.where(np.isfinite(c.end_s), c.end_s, c.start_s) - lo + c.session * span
    nxt = np.full(n, np.inf)
    same = c.session[1:] == c.session[:-1]
    nxt[:-1] = np.where(same, c.start_s[1:] - lo + c.session[1:] * span, np.inf)
    found = np.searchsorted(tool_axis, nxt, side="left") > np.searchsorted(tool_axis, after, side="left")
    last = np.ones(n, dtype=bool)
    last[:-1] = ~same
    traced = np.zeros(len(c.session_keys), dtype=bool)
    traced[t_sess] = True
    return found | last | ~traced[c.session]


def sessions_without_tool_spans(c: Columns, tools: list[tuple[object, float]]) -> int:
    """Sessions of ``c`` with no tool span of ``tools`` (session key, start): each call of theirs is a step."""
    return len(set(c.session_keys) - {k for k, _ in tools})


def stats(x: np.ndarray) -> dict:
    """count, mean, p50, p95, p99, max of the finite values (None when there are none)."""
    x = x[np.isfinite(x)]
    if not len(x):
        return {"count": 0, "mean": None, "p50": None, "p95": None, "p99": None, "max": None}
    p50, p95, p99 = np.percentile(x, [50, 95, 99])
    return {"count": int(len(x)), "mean": float(x.mean()), "p50": float(p50), "p95": float(p95),
            "p99": float(p99), "max": float(x.max())}


def _round(x: float, seconds: bool) -> float:
    """Tokens and counts to 0.1, seconds to 4 significant digits: readable, and far below the spread."""
    if seconds:
        return float(f"{x:.4g}")
    return round(float(x), 1)


def fit_distribution(values: np.ndarray, form: str = "auto", seconds: bool = False) -> object:
    """A value the spec accepts: a number, {mean, p95}, {p50, p95} or {quantiles: {...}}."""
    x = values[np.isfinite(values)]
    if not len(x):
        return 0
    lo, hi = float(x.min()), float(x.max())
    if hi - lo <= 1e-12 * max(abs(hi), 1.0):
        return _round(hi, seconds)
    # round first, so that the checks below hold for the numbers actually written
    mean = _round(float(x.mean()), seconds)
    p50, p95, p99 = (_round(float(v), seconds) for v in np.percentile(x, [50, 95, 99]))
    empirical = {"quantiles": _monotone({q: _round(v, seconds) for q, v in zip(QUANTILES, np.quantile(x, QUANTILES))})}
    by_mean_ok = mean > 0 and p95 >= mean and math.log(p95 / mean) <= Z95**2 / 2
    if form == "empirical":
        return empirical
    if form == "lognormal":
        if by_mean_ok:
            return {"mean": mean, "p95": p95}
        if p50 > 0 and p95 >= p50 and math.log(p95 / p50) <= MAX_LOG_SPREAD * Z95:
            return {"p50": p50, "p95": p95}
        return empirical
    if by_mean_ok:
        ln = Lognormal.model_validate({"mean": mean, "p95": p95})
        ln_p99 = math.exp(ln.mu + ln.sigma * Z99)  # = ln.quantile(0.99), without importing scipy.stats (~0.5 s)
        if p99 > 0 and 1 / TAIL_TOLERANCE <= ln_p99 / p99 <= TAIL_TOLERANCE:
            return {"mean": mean, "p95": p95}
    return empirical


def _monotone(points: dict[float, float]) -> dict[float, float]:
    out, last = {}, -math.inf
    for q, v in points.items():
        last = max(last, v)
        out[q] = last
    return out


@dataclass
class Shape:
    """Per-call and per-session quantities derived from sorted columns."""

    first: np.ndarray              # bool per call: first of its session
    calls_per_session: np.ndarray
    new_input: np.ndarray          # per call i > 0 in its session (clipped at 0)
    shrank: int                    # calls whose prompt was smaller than the history before them
    system_prompt_tokens: int
    first_new_input: np.ndarray    # per session
    tool_wait_s: np.ndarray
    llm_latency_s: np.ndarray
    peak_context: np.ndarray       # per session
    session_duration_s: np.ndarray
    negative_waits: int = 0        # tool times below 0 in the trace (clock skew), counted as 0
    steps_per_session: np.ndarray | None = None   # only when the trace marks steps (tool spans)
    calls_per_step: np.ndarray | None = None
    overlapping_calls: int = 0     # calls that start before the one before them in their session ended (no wait)


def shape(c: Columns, has_sessions: bool, step_end: np.ndarray | None = None,
          shared_prefix_tokens: float | None = None) -> Shape:
    n = len(c)
    first = np.ones(n, dtype=bool)
    first[1:] = c.session[1:] != c.session[:-1]
    last = np.ones(n, dtype=bool)
    last[:-1] = first[1:]
    starts = np.flatnonzero(first)
    counts = np.diff(np.append(starts, n))
    prompt, out = c.input_tokens, c.output_tokens
    raw_new = prompt[1:] - prompt[:-1] - out[:-1]
    raw_new = raw_new[~first[1:]]
    shrank = int((raw_new < 0).sum())
    first_prompt = prompt[first]
    system = int(first_prompt.min()) if has_sessions and len(starts) >= 2 else 0
    if shared_prefix_tokens is not None:  # block hashes show how much of it is really shared
        system = min(system, int(shared_prefix_tokens))
    # tool wait after call i: recorded, else the next call's recorded delay, else the wall-clock gap
    wait = c.tool_wait_after_s.copy()
    nxt_gap = np.full(n, np.nan)
    nxt_gap[:-1] = np.where(last[:-1], np.nan, c.gap_before_s[1:])
    wall = np.full(n, np.nan)
    wall[:-1] = np.where(last[:-1], np.nan, c.start_s[1:] - c.end_s[:-1])
    with np.errstate(invalid="ignore"):
        negative_gap = wall < 0     # parallel calls, or start and end stamps on two clocks or in two units
    wall[negative_gap] = np.nan
    overlapping = negative_gap & ~np.isfinite(wait) & ~np.isfinite(nxt_gap)    # where the gap was to be the wait
    wait = np.where(np.isfinite(wait), wait, np.where(np.isfinite(nxt_gap), nxt_gap, wall))
    with np.errstate(invalid="ignore"):
        negative_waits = int((wait < 0).sum())   # clock skew between the agent's and the tools' stamps
    wait = np.where(wait < 0, 0.0, wait)
    steps_per_session = calls_per_step = None
    if step_end is not None:
        # inside a step there is no tool wait: the gap to the next call of the same step is dropped
        wait = np.where(step_end, wait, np.nan)
        ends = np.flatnonzero(step_end)
        calls_per_step = np.diff(np.concatenate(([-1], ends))).astype(float)
        steps_per_session = np.add.reduceat(step_end.astype(float), starts) if n else np.zeros(0)
    latency = c.end_s - c.start_s
    latency[latency < 0] = np.nan
    with np.errstate(invalid="ignore"):
        duration = np.fmax.reduceat(c.end_s, starts) - np.fmin.reduceat(c.start_s, starts) if n else np.zeros(0)
    return Shape(first, counts.astype(float), np.maximum(raw_new, 0.0), shrank, system,
                 first_prompt - system, wait, latency, np.maximum.reduceat(prompt + out, starts) if n else prompt,
                 duration, negative_waits, steps_per_session, calls_per_step, int(overlapping.sum()))


def cache_shares(c: Columns, s: Shape) -> tuple[float | None, float]:
    """(cached share over calls with a cache count or None, reusable prefix share)."""
    known = np.isfinite(c.cached_tokens)
    cached = None
    if known.any() and c.input_tokens[known].sum() > 0:
        cached = float(c.cached_tokens[known].sum() / c.input_tokens[known].sum())
    total = c.input_tokens.sum()
    fresh = s.new_input.sum() + s.first_new_input.sum()
    reusable = float(max(total - fresh, 0.0) / total) if total > 0 else 0.0
    return cached, reusable


def workload_dict(c: Columns, s: Shape, form: str, name: str, source: str) -> dict:
    new = s.new_input if len(s.new_input) else s.first_new_input
    return {
        "name": name,
        "source": source,
        "steps_per_task": fit_distribution(s.calls_per_session if s.steps_per_session is None
                                           else s.steps_per_session, form),
        "calls_per_step": 1 if s.calls_per_step is None else fit_distribution(s.calls_per_step, form),
        "system_prompt_tokens": int(s.system_prompt_tokens),
        "first_call_input_tokens": fit_distribution(s.first_new_input, form),
        "new_input_tokens_per_call": fit_distribution(new, form),
        "output_tokens_per_call": fit_distribution(c.output_tokens, form),
        "tool_wait_s": fit_distribution(s.tool_wait_s, form, seconds=True),
    }


def validate(d: dict, where: str) -> Workload:
    try:
        return Workload.model_validate(d)
    except ValidationError as exc:
        first = exc.errors()[0]
        field_ = ".".join(str(p) for p in tuple(first["loc"]) + named_field(first))
        what = f"{field_}: " if field_ else ""
        raise TraceError(f"{where}: the fitted workload is not valid ({what}{first['msg'].removeprefix('Value error, ')}): "
                         "look in the trace for a few values far past the others (a session idle for days, a call "
                         "with a runaway token count), or too few usable calls") from None


SECONDS_PER_DAY = 86400.0
# The Unix epoch, 1970-01-01, was a Thursday: hours since the epoch plus this many fall on Monday 00:00 UTC.
EPOCH_HOURS_AFTER_MONDAY = 3 * 24


def seconds_covered(lo: float, hi: float, period_h: int) -> np.ndarray:
    """Seconds of the span ``lo..hi`` (Unix seconds) that fall on each hour of the period (hour 0 first: 00:00 UTC,
    or Monday 00:00 UTC for a week), in closed form, since a trace's starts may be years apart."""
    first_h, last_h = int(lo // 3600), int(hi // 3600)
    k = np.arange(period_h)
    shift = EPOCH_HOURS_AFTER_MONDAY - k      # hour h falls on k when (h + EPOCH_HOURS_AFTER_MONDAY - k) % period_h == 0
    whole_hours = np.floor_divide(last_h + shift, period_h) - np.floor_divide(first_h - 1 + shift, period_h)
    seconds = whole_hours * 3600.0
    # the first and last hours are covered only from the first start and up to the last
    seconds[(first_h + EPOCH_HOURS_AFTER_MONDAY) % period_h] -= lo - first_h * 3600.0
    seconds[(last_h + EPOCH_HOURS_AFTER_MONDAY) % period_h] -= (last_h + 1) * 3600.0 - hi
    return seconds


def tasks_per_hour(c: Columns, s: Shape, weekly: bool = False) -> tuple[list[float] | None, str | None]:
    """Tasks started per hour of the day (UTC, hour 0 first), or with ``weekly`` per hour of the week
    (Monday 00:00 UTC first), from the sessions' first calls (every call, where the trace has no sessions: each
    is then its own task); or (None, why not). Each hour's rate is its starts over the time the trace covers
    that hour, so a trace of a day and a half counts its doubled hours once."""
    starts = c.start_s[s.first]
    starts = starts[np.isfinite(starts)]
    if len(starts) < 2 or float(starts.min()) < WALL_CLOCK_FROM_S:
        return None, "no wall-clock task start times: fleet.tasks_per_hour cannot be fitted"
    lo, hi = float(starts.min()), float(starts.max())
    period_h = 24 * (7 if weekly else 1)
    if hi - lo < period_h * 3600.0:
        return None, (f"task starts cover {(hi - lo) / 3600:.1f} h: a {'week' if weekly else 'day'} of demand "
                      f"(fleet.tasks_per_hour) needs a trace of at least {period_h} h")
    hour_of = lambda h: (h + EPOCH_HOURS_AFTER_MONDAY) % period_h  # noqa: E731  (hours since the epoch)
    counts = np.bincount(hour_of((starts // 3600).astype(int)), minlength=period_h)[:period_h]
    # the first and last starts bound the window, so each sits on its edge: the window reaches half the gap next
    # to it past both (a start every hour from 00:30 then reads 1 an hour, not 1.33 in the first and last hours)
    ordered = np.sort(starts)
    exposure = seconds_covered(lo - (ordered[1] - lo) / 2, hi + (hi - ordered[-2]) / 2, period_h)
    rates = np.where(exposure > 0, counts / np.maximum(exposure, 1e-9) * 3600.0, 0.0)
    return [_rate(float(x)) for x in rates], None


def _rate(x: float) -> float:
    """Tasks an hour to two decimals; a rate under 0.005 (a trace of a few tasks over months) to two significant
    figures, so that it does not read as no demand at all."""
    return round(x, 2) if round(x, 2) or not x else float(f"{x:.2g}")

