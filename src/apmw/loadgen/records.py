"""What each record of a results file holds, checked as the file is read back.

``apmw bench`` writes the file (:mod:`apmw.loadgen.results` lists the record types); ``--resume``, ``apmw bench
--calibrate`` and the summary read it back, and a file edited by hand, cut short or damaged otherwise must be
refused at its line and field, not met as a traceback (or a wrong sum) halfway through a summary. The models
name every field a reader uses, with its type and range; other fields are kept as they are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from apmw.loadgen.client import MAX_TOKEN_COUNT, BenchError
from apmw.spec import Slo

# The longest time a record may hold: about 32 years, far past any run, and small enough that the summary's sums
# of a million such times stay finite.
MAX_RECORD_S = 1e9
Seconds = Annotated[float, Field(ge=0, le=MAX_RECORD_S, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=MAX_TOKEN_COUNT)]


class _Record(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    segment: Count = 0


class RunConfigRecord(BaseModel):
    """The ``config`` of a ``run`` record (:class:`apmw.loadgen.runner.RunConfig`)."""

    model_config = ConfigDict(strict=True, extra="allow")

    endpoint: str
    model: str
    agents: Annotated[int, Field(ge=1)]
    duration_s: Seconds
    warmup_s: Seconds
    seed: int
    workload: dict | None
    slo: dict[str, Annotated[float, Field(gt=0, allow_inf_nan=False)] | None]
    api: Literal["completions", "chat"] = "completions"
    timeout_s: Seconds = 60.0
    drain_s: Seconds = 30.0
    fault_backoff_s: Seconds = 1.0
    stagger_s: Seconds = 1.0
    levels: list[Annotated[int, Field(ge=1)]] | None = None
    history: Literal["echo", "synthetic"] = "echo"


class RunRecord(_Record):
    type: Literal["run"]
    config: RunConfigRecord


class CallRecord(_Record):
    type: Literal["call"]
    ok: bool
    fault: str | None = None
    warmup: bool = False
    start_s: Seconds
    latency_s: Seconds
    ttft_s: Seconds | None = None
    tpot_s: Seconds | None = None
    prompt_tokens: Count | None = None
    output_tokens: Count | None = None
    cached_tokens: Count | None = None
    target_prompt_tokens: Count = 0
    target_output_tokens: Count = 0
    token_times_s: list[Seconds] = []


class TaskRecord(_Record):
    type: Literal["task"]
    status: Literal["completed", "failed", "cancelled"]
    warmup: bool = False
    start_s: Seconds
    end_s: Seconds
    latency_s: Seconds
    calls: Count = 0


class ServerRecord(_Record):
    type: Literal["server"]
    t_s: Seconds
    metrics: dict[str, Annotated[float, Field(allow_inf_nan=False)]]


class EndRecord(_Record):
    type: Literal["end"]
    measure_end_s: Seconds


_MODELS: dict[str, type[_Record]] = {"run": RunRecord, "call": CallRecord, "task": TaskRecord,
                                     "server": ServerRecord, "end": EndRecord}
RECORD_TYPES = tuple(_MODELS)


def check_record(rec: dict, path: Path, line: int, segments: set[int]) -> dict:
    """``rec`` (line ``line`` of ``path``) with the fields a writer may leave out at their defaults; refused where a
    field a reader uses is missing, of the wrong type or out of range, or where it belongs to a segment no earlier
    ``run`` record opened (``segments``: those opened)."""
    model = _MODELS.get(rec["type"]) if isinstance(rec["type"], str) else None
    if model is None:
        raise BenchError(_where(path, line, f"a record of type {str(rec['type'])[:40]!r}; apmw bench writes "
                                 f"{', '.join(RECORD_TYPES)}"))
    try:
        checked = model.model_validate(rec)
        if isinstance(checked, RunRecord):
            recorded_slo(checked.config.slo)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(part) for part in err["loc"]) or "the record"
        shown = repr(err.get("input"))[:60] if err["type"] != "missing" else "missing"
        raise BenchError(_where(path, line, f"the {rec['type']} record's {field} is {shown} "
                                 f"({err['msg'].lower()})")) from None
    if isinstance(checked, RunRecord):
        segments.add(checked.segment)
    elif checked.segment not in segments:
        raise BenchError(_where(path, line, f"a {rec['type']} record of segment {checked.segment}, which no "
                                 "earlier 'run' record opened"))
    if isinstance(checked, CallRecord) and checked.ok and checked.ttft_s is None:
        raise BenchError(_where(path, line, "an ok call record without its ttft_s: apmw bench writes one for every "
                                 "call that streamed text (a call that streamed none is not ok)"))
    return checked.model_dump()


def recorded_slo(slo: dict) -> Slo:
    """The SLO a run record's config holds, as the spec's :class:`apmw.spec.Slo` (its unset fields left out;
    a value the spec would refuse raises pydantic's ValidationError)."""
    return Slo(**{k: slo[k] for k in Slo.model_fields if slo.get(k)})


def _where(path: Path, line: int, what: str) -> str:
    return (f"{path}:{line}: {what} -- the file is not as apmw bench wrote it: restore it, remove the line, or "
            "start a new --out")
