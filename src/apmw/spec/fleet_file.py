"""A fleet file: several workloads for one fleet, and the replica hardware to compare (``apmw fleet``).

A fleet file lists workloads, each a spec file (a path relative to the fleet file) with optional
``overrides`` merged into it, and optionally the candidate hardware every pool is tried on::

    workloads:
      - name: coding-emea
        spec: ../coding-agent.yaml
      - name: coding-apac
        spec: ../coding-agent.yaml
        overrides: {fleet: {tasks_per_hour: [...]}}     # any spec section, merged key by key
    hardware:                                           # optional; default: each workload's own
      - {gpu: H200, gpus_per_replica: 8, gpu_hour_usd: 2.50}
      - {gpu: B200, gpus_per_replica: 8, gpu_hour_usd: 3.80, name: B200x8}
    power_cap_mw: 5                                     # optional: the hall's power

A file with a top-level ``workloads`` list is a fleet file; one with ``workload`` is a spec. Errors
name the file, line and field where the value sits: the fleet file for its own keys and for
``overrides``, the workload's spec file for the rest. What the placements are and how a shared pool
is sized is :mod:`apmw.capacity.fleet_mix`'s.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator

from apmw.spec.load import (SpecError, _describe, config_beside, _key_lines, _line_for, _read_yaml, error_location,
                             without_union_noise)
from apmw.spec.economics import MAX_GPU_HOUR_USD
from apmw.spec.model import MAX_GPUS_PER_REPLICA, GpuOverride, Spec
from apmw.spec.section import FieldError, Section

# Workloads and hardware candidates a fleet file may list: every pool is planned on every candidate.
MAX_FLEET_WORKLOADS = 16
MAX_FLEET_HARDWARE = 16


class FleetFileError(SpecError):
    """A fleet file that cannot be used, with every problem found and where it is."""

    def __init__(self, path: str, problems: list[str]):
        super().__init__(path, problems, "fleet file")


class FleetWorkload(Section):
    name: str = Field(min_length=1, max_length=64, description="the workload's name in the tables and JSON")
    spec: str = Field(min_length=1, description="its spec file, relative to the fleet file")
    overrides: dict[str, Any] | None = Field(
        default=None, description="spec sections merged into the spec file's, key by key (a list or a value "
        "replaces the spec's)")

    @field_validator("name")
    @classmethod
    def _plain(cls, v: str) -> str:
        return plain_name(v, "a workload's")


def plain_name(v: str, whose: str) -> str:
    """``v`` as a name in tables, pool names (``a+b@H200x8``) and the --csv: refused where it would be misread."""
    if any(c in v for c in "+@,\n\r\t") or v != v.strip():
        raise ValueError(f"{v!r}: {whose} name may not contain '+', '@', ',', a tab, a line break or outer spaces "
                         "(tables and pool names join names with them)")
    if v[0] in "=-":
        raise ValueError(f"{v!r}: {whose} name may not start with '=' or '-': a spreadsheet opening the --csv would "
                         "read it as a formula")
    return v


class FleetHardware(Section):
    """A replica hardware candidate: a catalogue GPU (``apmw model --systems``), the GPUs of one replica, and
    the price of a GPU-hour on it (prices differ by GPU, so each candidate states its own)."""

    name: str | None = Field(default=None, min_length=1, max_length=64,
                             description="label in the tables (default: GPU x GPUs per replica, e.g. H200x8)")
    gpu: str | GpuOverride
    gpus_per_replica: int = Field(ge=1, le=MAX_GPUS_PER_REPLICA)
    gpu_hour_usd: float = Field(ge=0, le=MAX_GPU_HOUR_USD, description="all-in price of one GPU-hour of this GPU")

    @field_validator("name")
    @classmethod
    def _plain(cls, v: str | None) -> str | None:
        return None if v is None else plain_name(v, "a hardware candidate's")

    @property
    def label(self) -> str:
        if self.name is not None:
            return self.name
        gpu = self.gpu if isinstance(self.gpu, str) else (self.gpu.name or "custom")
        return f"{gpu}x{self.gpus_per_replica}"


class FleetFile(Section):
    workloads: list[FleetWorkload] = Field(min_length=1, max_length=MAX_FLEET_WORKLOADS)
    hardware: list[FleetHardware] | None = Field(default=None, min_length=1, max_length=MAX_FLEET_HARDWARE)
    power_cap_mw: float | None = Field(default=None, gt=0, le=1e4, description="the hall's power: a placement "
                                       "whose provisioned facility power exceeds it in some hour does not fit")

    @model_validator(mode="after")
    def _unique(self) -> "FleetFile":
        names = [w.name for w in self.workloads]
        again = next((i for i, n in enumerate(names) if n in names[:i]), None)
        if again is not None:        # named at its second entry's line
            raise FieldError(("workloads", again, "name"), f"workload name {names[again]} is given twice (entries "
                             f"{names.index(names[again]) + 1} and {again + 1}); each workload needs its own name")
        labels = [h.label for h in self.hardware or []]
        again = next((i for i, n in enumerate(labels) if n in labels[:i]), None)
        if again is not None:
            raise FieldError(("hardware", again), f"hardware {labels[again]} is listed twice (entries "
                             f"{labels.index(labels[again]) + 1} and {again + 1}); give each candidate its own name")
        return self


@dataclass(frozen=True)
class LoadedFleet:
    """A validated fleet file and its workloads' specs (overrides merged)."""

    path: str
    fleet: FleetFile
    specs: tuple[Spec, ...]              # in the file's order
    spec_paths: tuple[str, ...]
    data: tuple[dict, ...]               # each spec as merged data, to apply a hardware candidate to
    lines: dict[tuple, int]              # the fleet file's key -> line

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(w.name for w in self.fleet.workloads)

    def where(self, *loc: str | int) -> str:
        """``line N: a.b.c`` for a key of the fleet file (the deepest that exists)."""
        line = _line_for(loc, self.lines)
        return (f"line {line}: " if line else "") + ".".join(str(p) for p in loc)

    def with_hardware(self, i: int, hw: FleetHardware) -> Spec:
        """Workload ``i``'s spec on ``hw``: its hardware section replaced, its GPU-hour priced at ``hw``'s.
        A spec the hardware does not suit (a layout of another GPU count) raises :class:`SpecError`."""
        data = copy.deepcopy(self.data[i])
        gpu = hw.gpu if isinstance(hw.gpu, str) else hw.gpu.model_dump(exclude_none=True)
        data["hardware"] = {"gpu": gpu, "gpus_per_replica": hw.gpus_per_replica}
        data["cost"] = {**data["cost"], "gpu_hour_usd": hw.gpu_hour_usd}
        try:
            return Spec.model_validate(data)
        except ValidationError as exc:
            problems = [f"{'.'.join(str(p) for p in error_location(e)) or '(top level)'}: {_describe(e)}"
                        for e in exc.errors()]
            raise SpecError(f"{self.names[i]} on {hw.label}", problems) from None


def is_fleet_file(data: Any) -> bool:
    """Whether a parsed YAML document is a fleet file (a top-level ``workloads`` list) rather than a spec."""
    return isinstance(data, dict) and "workloads" in data and "workload" not in data


def merged(base: Any, over: Any) -> Any:
    """``over`` merged into ``base``: mappings key by key, anything else replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = merged(base[k], v) if k in base else v
        return out
    return over


def _in(data: Any, loc: tuple) -> int:
    """How many leading keys of ``loc`` exist as a path in ``data``."""
    n = 0
    for k in loc:
        if isinstance(data, dict) and k in data:
            data, n = data[k], n + 1
        elif isinstance(data, list) and isinstance(k, int) and 0 <= k < len(data):
            data, n = data[k], n + 1
        else:
            break
    return n


def _replaced_overrides(fleet: FleetFile, lines: dict[tuple, int]) -> list[str]:
    """Overrides that hardware candidates would replace unread: each candidate sets a workload's whole
    hardware section and its GPU-hour price (:meth:`LoadedFleet.with_hardware`)."""
    if fleet.hardware is None:
        return []
    problems = []
    for i, w in enumerate(fleet.workloads):
        over = w.overrides or {}
        cost = over.get("cost")
        for loc in [("hardware",)] * ("hardware" in over) + [("cost", "gpu_hour_usd")] * (
                isinstance(cost, dict) and "gpu_hour_usd" in cost):
            line = _line_for(("workloads", i, "overrides") + loc, lines)
            problems.append(f"{f'line {line}: ' if line else ''}workloads.{i}.overrides.{'.'.join(loc)}: the fleet "
                            "file's hardware list replaces every workload's hardware and GPU-hour price, so this "
                            "would be ignored; put it in a hardware candidate, or drop the hardware list to plan "
                            "each workload on its own")
    return problems


def _unread_in_fleet_file(spec: Spec) -> tuple[str, str] | None:
    """(field, why) of a workload's setting a fleet file would not read: the hall's power cap is the file's own,
    and the owned-GPU month (cost.capex) is priced for one spec only. A silently dropped cap let a placement over it
    be named the cheapest."""
    if spec.fleet.power_cap_mw is not None:
        return ("fleet.power_cap_mw", "a fleet file's workloads share one hall, whose power the file's own top-level "
                "power_cap_mw gives; move the cap there (apmw fleet on this spec alone reads it)")
    if spec.cost.capex is not None:
        return ("cost.capex", "the owned-GPU month is priced for one spec only (apmw fleet on this spec alone), not "
                "across a fleet file's placements; remove it from this workload")
    return None


def load_fleet_file(path: str | Path) -> LoadedFleet:
    """Read and validate a fleet file and every spec it refers to (raising :class:`FleetFileError`)."""
    data, node = _read_yaml(path, "fleet file; see examples/fleets/")
    lines = _key_lines(node) if node is not None else {}
    where = str(path)
    if not is_fleet_file(data):
        raise FleetFileError(where, ["a fleet file is a YAML mapping with a 'workloads' list (and optionally "
                                     "'hardware' and 'power_cap_mw'); see docs/fleet.md, 'Mixed fleets'"])
    try:
        fleet = FleetFile.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in without_union_noise(exc.errors()):
            loc = error_location(err)
            line = _line_for(loc, lines)
            problems.append(f"{f'line {line}: ' if line else ''}{'.'.join(str(p) for p in loc) or '(top level)'}: "
                            f"{_describe(err, loc)}")
        raise FleetFileError(where, problems) from None
    base = Path(path).parent
    specs, paths, datas, problems = [], [], [], _replaced_overrides(fleet, lines)
    for i, w in enumerate(fleet.workloads):
        spec_path = Path(os.path.normpath(w.spec if Path(w.spec).is_absolute() else base / w.spec))
        at = f"line {_line_for(('workloads', i, 'spec'), lines)}: workloads.{i}.spec"
        if not spec_path.exists():     # a folder or a device is refused by the reader, saying what it is
            problems.append(f"{at}: {spec_path}: file not found (a spec file, relative to the fleet file)")
            continue
        if spec_path.resolve() == Path(path).resolve():
            problems.append(f"{at}: {w.spec} is this fleet file itself; name a spec file (one workload's spec, such "
                            "as examples/coding-agent.yaml)")
            continue
        try:
            spec_data, spec_node = _read_yaml(spec_path, "spec")
        except SpecError as exc:
            problems += [f"{at}: {exc.path}: {p}" for p in exc.problems]
            continue
        if not isinstance(spec_data, dict) or is_fleet_file(spec_data):
            what = "a fleet file, " if isinstance(spec_data, dict) else ""
            problems.append(f"{at}: {spec_path}: {what}not a spec (a YAML mapping with workload, model, hardware, slo, "
                            "cost)")
            continue
        spec_lines = _key_lines(spec_node) if spec_node is not None else {}
        full = merged(spec_data, w.overrides or {})
        try:
            spec = Spec.model_validate(full)
        except ValidationError as exc:
            for err in without_union_noise(exc.errors()):
                loc = error_location(err)
                field, text = ".".join(str(p) for p in loc) or "(top level)", _describe(err, loc)
                k = _in(w.overrides or {}, loc)
                if k:       # the value sits in the fleet file's overrides
                    line = _line_for(("workloads", i, "overrides") + loc[:k], lines)
                    problems.append(f"{f'line {line}: ' if line else ''}workloads.{i}.overrides.{field}: {text}")
                else:
                    line = _line_for(loc, spec_lines)
                    problems.append(f"workloads.{i} ({spec_path}{f', line {line}' if line else ''}): {field}: {text}")
            continue
        unread = _unread_in_fleet_file(spec)
        if unread:
            field, why = unread
            loc = tuple(field.split("."))
            if _in(w.overrides or {}, loc) == len(loc):
                line = _line_for(("workloads", i, "overrides") + loc, lines)
                problems.append(f"{f'line {line}: ' if line else ''}workloads.{i}.overrides.{field}: {why}")
            else:
                line = _line_for(loc, spec_lines)
                problems.append(f"workloads.{i} ({spec_path}{f', line {line}' if line else ''}): {field}: {why}")
            continue
        # a relative model.config is read beside the file that gives it: the spec, or the fleet file's overrides
        spec = config_beside(spec, Path(path) if _in(w.overrides or {}, ("model", "config")) == 2 else spec_path)
        full = merged(full, {"model": {"config": spec.model.config}})
        if spec.fleet.tasks_per_hour is None:
            problems.append(f"workloads.{i} ({spec_path}): fleet.tasks_per_hour: missing; a mixed fleet needs each "
                            "workload's day of demand (24 values), in its spec or in the workload's overrides")
            continue
        if len(spec.fleet.tasks_per_hour) != 24:
            problems.append(f"workloads.{i} ({spec_path}): fleet.tasks_per_hour: a week (168 values); a mixed fleet "
                            "compares days of 24 hours (apmw fleet sizes one spec's week on its own)")
            continue
        specs.append(spec)
        paths.append(str(spec_path))
        datas.append(full)
    if problems:
        raise FleetFileError(where, problems)
    return LoadedFleet(path=where, fleet=fleet, specs=tuple(specs), spec_paths=tuple(paths), data=tuple(datas),
                       lines=lines)
