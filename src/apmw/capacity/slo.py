"""The SLO check (MODEL.md section 9): one rule for ``apmw plan`` and ``apmw simulate``.

A spec sets a task-latency p95 and, optionally, a p95 time to first token and a p95 time
per output token. An operating point meets the SLO when every one the spec sets holds. A
figure that was not measured (a simulation that completed no task, or no call with a second
output token) cannot show that its SLO holds, so it fails, and the verdict says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from apmw.capacity.quantiles import Tail
from apmw.spec import Slo

# Per-call service levels that published serving benchmarks call served, used to warn when a spec
# sets none: MLPerf Inference v5.1's Server scenario, the loosest of its per-call constraints
# (TTFT 6 s for llama3.1-405b's long prompts; TPOT 200 ms, 5 tokens/s per user, for llama2-70b;
# ../shared/data/benchmarks/mlperf_inference, ttft_constraint_ns and tpot_constraint_ns; its
# Interactive scenario asks 0.45-4.5 s and 30-80 ms). A plan past them is not interactive by any
# published measure, whatever its task p95.
INTERACTIVE_TTFT_P95_S = 6.0
INTERACTIVE_TPOT_P95_S = 0.2

# A single agent's figure (task p95, TTFT p95, time per output token p95) above this share of its SLO
# leaves N* hypersensitive to that SLO.
FLOOR_WARNING_SHARE = 0.8

# The SLOs a spec can set: (name, field of apmw.spec.Slo). An output speed is checked on the time
# per output token: x tokens/s per agent holds when the p95 time per output token is <= 1/x.
SLO_FIELDS = (("task_latency_p95", "task_latency_p95_s"), ("ttft_p95", "ttft_p95_s"), ("tpot_p95", "tpot_p95_s"),
              ("output_speed", "output_speed_tokens_per_s"))


def _limits_s(slo: Slo) -> dict[str, float]:
    """Each SLO the spec sets, as the most seconds its figure may take."""
    limits = {"task_latency_p95": slo.task_latency_p95_s, "ttft_p95": slo.ttft_p95_s, "tpot_p95": slo.tpot_p95_s,
              "output_speed": 1.0 / slo.output_speed_tokens_per_s if slo.output_speed_tokens_per_s else None}
    return {name: limit for name, limit in limits.items() if limit is not None}


def _figures(task_latency_p95_s: float | Tail | None, ttft_p95_s: float | Tail | None,
             tpot_p95_s: float | None) -> dict[str, Any]:
    """Each SLO's figure by name (numbers, or :class:`Tail` samples where :func:`check_slo` counts them)."""
    return {"task_latency_p95": task_latency_p95_s, "ttft_p95": ttft_p95_s, "tpot_p95": tpot_p95_s,
            "output_speed": tpot_p95_s}


@dataclass(frozen=True)
class SloVerdict:
    """Whether an operating point meets each SLO the spec sets."""

    failed: tuple[str, ...]          # names (SLO_FIELDS) of the SLOs the point misses
    unmeasured: tuple[str, ...]      # ... of which the figure was missing

    @property
    def meets(self) -> bool:
        return not self.failed


def check_slo(slo: Slo, task_latency_p95_s: float | Tail | None, ttft_p95_s: float | Tail | None,
              tpot_p95_s: float | None) -> SloVerdict:
    """Check the measured or modelled p95s against every SLO ``slo`` sets (a :class:`Tail` is checked by
    counting its sample, without computing its quantile)."""
    figures = _figures(task_latency_p95_s, ttft_p95_s, tpot_p95_s)
    failed, unmeasured = [], []
    for name, limit in _limits_s(slo).items():
        value = figures[name]
        if value is None:
            unmeasured.append(name)
            failed.append(name)
        elif not value <= limit:
            failed.append(name)
    return SloVerdict(failed=tuple(failed), unmeasured=tuple(unmeasured))


def slo_slack(slo: Slo, task_latency_p95_s: float | None, ttft_p95_s: float | None,
              tpot_p95_s: float | None) -> float:
    """How far the tightest SLO is used: the largest figure / limit over the SLOs ``slo`` sets
    (<= 1 exactly where :func:`check_slo` says the point meets; infinite for a figure not measured)."""
    figures = _figures(task_latency_p95_s, ttft_p95_s, tpot_p95_s)
    slack = 0.0
    for name, limit in _limits_s(slo).items():
        value = figures[name]
        slack = max(slack, float("inf") if value is None else value / limit)
    return slack


def slo_table(slo: Slo, task_latency_p95_s: float | None, ttft_p95_s: float | None,
              tpot_p95_s: float | None) -> dict[str, dict]:
    """Each SLO the spec sets: its limit and the figure at the operating point in seconds (an output
    speed as the time per output token it allows), and whether it holds."""
    figures = _figures(task_latency_p95_s, ttft_p95_s, tpot_p95_s)
    verdict = check_slo(slo, task_latency_p95_s, ttft_p95_s, tpot_p95_s)
    return {name: {"limit_s": limit, "value_s": figures[name], "met": name not in verdict.failed}
            for name, limit in _limits_s(slo).items()}


def warnings_for(slo: Slo, ttft_p95_s: float | None, tpot_p95_s: float | None,
                 single_agent: tuple[float | None, float | None, float | None] | None) -> list[str]:
    """What a planner should hear about an operating point beyond pass and fail: per-call latencies
    past the published interactive levels where the spec sets no per-call SLO (None: not measured), and
    any SLO so close to what one agent alone gets (``single_agent``: its task, TTFT and TPOT p95s) that
    N* hangs on it."""
    notes = []
    if slo.ttft_p95_s is None and ttft_p95_s is not None and ttft_p95_s > INTERACTIVE_TTFT_P95_S:
        notes.append(f"TTFT p95 is {ttft_p95_s:,.1f} s, past the {INTERACTIVE_TTFT_P95_S:g} s that MLPerf's Server "
                     "scenario allows; the spec sets no slo.ttft_p95_s, so nothing bounds it")
    if (slo.tpot_p95_s is None and slo.output_speed_tokens_per_s is None and tpot_p95_s is not None
            and tpot_p95_s > INTERACTIVE_TPOT_P95_S):
        notes.append(f"time per output token p95 is {tpot_p95_s * 1e3:,.0f} ms ({1 / tpot_p95_s:.1f} tokens/s per agent), "
                     f"past MLPerf Server's {INTERACTIVE_TPOT_P95_S * 1e3:.0f} ms; the spec sets no slo.tpot_p95_s")
    if single_agent is not None:
        floor = _figures(*single_agent)
        for name, limit in _limits_s(slo).items():
            value = floor[name]
            if value is not None and value > FLOOR_WARNING_SHARE * limit:
                notes.append(f"one agent alone already takes {seconds_text(value)} at {SLO_LABELS[name]} of the "
                             f"{seconds_text(limit)} SLO ({value / limit:.0%}): N* is hypersensitive to the SLO and "
                             "the workload")
    return notes


# How an SLO reads in tables and messages.
SLO_LABELS = {"task_latency_p95": "task p95", "ttft_p95": "TTFT p95", "tpot_p95": "time per output token p95",
              "output_speed": "output speed"}


def seconds_text(value: float | None, interval: tuple[float, float] | None = None) -> str:
    """Seconds as a person reads them: "1,073 s", "33.9 ms", or "not measured"; with ``interval``, its ends in
    the value's unit after it: "4.8 s (2.1-7.5)"."""
    if value is None:
        return "not measured"
    scale, digits, unit = (1e3, 1, "ms") if value < 1 else (1.0, 1 if value < 100 else 0, "s")
    text = f"{value * scale:,.{digits}f} {unit}"
    if interval is None:
        return text
    lo, hi = interval
    return f"{text} ({lo * scale:,.{digits}f}-{hi * scale:,.{digits}f})"


def task_s(seconds: float) -> str:
    """A task latency in seconds as the tables print it: whole seconds from 100 s, four significant digits under
    (so that a 5 s SLO met at 4.998 s and one missed at 5.003 s do not both read "5")."""
    if abs(seconds) >= 100 or seconds == 0:
        return f"{seconds:,.0f}"
    return f"{seconds:.{max(0, 3 - math.floor(math.log10(abs(seconds))))}f}"


def speed_text(tokens_per_s: float | None) -> str:
    """A per-agent output speed as the tables print it; "-" where no call outputs a second token."""
    return "-" if tokens_per_s is None else f"{tokens_per_s:,.1f}"


def slo_rows(verdict: dict) -> list[list[str]]:
    """Each SLO the spec sets as [SLO, limit, figure, verdict], plain text (for tables outside a terminal)."""
    rows = []
    for name, v in verdict.items():
        if name == "output_speed":
            figure = "not measured" if v["value_s"] is None else f"{1 / v['value_s']:,.1f} tokens/s"
            rows.append([SLO_LABELS[name], f">= {1 / v['limit_s']:,.1f} tokens/s", figure, "met" if v["met"] else "MISSED"])
            continue
        rows.append([SLO_LABELS[name], f"<= {seconds_text(v['limit_s'])}", seconds_text(v["value_s"]),
                     "met" if v["met"] else "MISSED"])
    return rows


# How a binding constraint with no short name reads in a table (the JSON keeps the name).
BINDING_WORDS = {"not_found": "not found: every count simulated met the SLO"}


def binding_text(p: dict) -> str:
    """The binding constraint, naming the SLO where one binds: "slo (TTFT p95)"."""
    if p.get("binding_slo"):
        return f"{p['binding_constraint']} ({', '.join(SLO_LABELS[n] for n in p['binding_slo'])})"
    return BINDING_WORDS.get(p["binding_constraint"], p["binding_constraint"])
