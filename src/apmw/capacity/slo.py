"""The SLO check (MODEL.md section 9): one rule for ``apmw plan`` and ``apmw simulate``.

A spec sets a task-latency p95 and, optionally, a p95 time to first token and a p95 time
per output token. An operating point meets the SLO when every one the spec sets holds. A
figure that was not measured (a simulation that completed no task, or no call with a second
output token) cannot show that its SLO holds, so it fails, and the verdict says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from apmw.spec import Slo

# The SLOs a spec can set: (name, field of apmw.spec.Slo).
SLO_FIELDS = (("task_latency_p95", "task_latency_p95_s"), ("ttft_p95", "ttft_p95_s"), ("tpot_p95", "tpot_p95_s"))


@dataclass(frozen=True)
class SloVerdict:
    """Whether an operating point meets each SLO the spec sets."""

    failed: tuple[str, ...]          # names (SLO_FIELDS) of the SLOs the point misses
    unmeasured: tuple[str, ...]      # ... of which the figure was missing

    @property
    def meets(self) -> bool:
        return not self.failed


def check_slo(slo: Slo, task_latency_p95_s: float | None, ttft_p95_s: float | None,
              tpot_p95_s: float | None) -> SloVerdict:
    """Check the measured or modelled p95s against every SLO ``slo`` sets."""
    figures = {"task_latency_p95": task_latency_p95_s, "ttft_p95": ttft_p95_s, "tpot_p95": tpot_p95_s}
    failed, unmeasured = [], []
    for name, field in SLO_FIELDS:
        limit = getattr(slo, field)
        if limit is None:
            continue
        value = figures[name]
        if value is None:
            unmeasured.append(name)
            failed.append(name)
        elif not value <= limit:
            failed.append(name)
    return SloVerdict(failed=tuple(failed), unmeasured=tuple(unmeasured))
