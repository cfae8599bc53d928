"""A design space: spec fields by dotted path, the values to try, and the points of their product.

A space document names the axes::

    axes:
      hardware.gpu: [H100, H200]
      hardware.gpus_per_replica: [1, 2, 4, 8]

Point ``i`` is the ``i``-th combination in row-major order over the axes as written (the last axis
varies fastest), so a point's index names it in a results file and across a resumed run.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import re
import typing
from collections import Counter
from pathlib import Path
from typing import Iterator

from pydantic import BaseModel

from apmw.catalog.gpus import get_gpu
from apmw.errors import ApmwError, UnknownNameError
from apmw.spec.load import path_beside
from apmw.spec.spellings import dtype_key, engine_key

# Points one search evaluates. Each is about one plan (70-140 ms on the bundled examples, per core),
# so the largest space is about an hour on 8 cores; a larger one is a sign of an axis with too many values.
MAX_POINTS = 100_000


def read_space(data: object, where: str, lines: dict[tuple, int] | None = None) -> dict[str, list]:
    """The axes of a space document, checked: a mapping ``axes: {dotted.path: [values]}``. ``lines``: each key
    path's line in the file (:func:`apmw.spec.load.load_yaml_lines`), so that an axis' error names its line."""
    lines = lines or {}

    def at(*key) -> str:
        line = lines.get(key)
        return f"{where}: line {line}" if line else where

    axes = data.get("axes") if isinstance(data, dict) else None
    if isinstance(data, dict) and axes is None and ("workload" in data or "workloads" in data):
        what = "a fleet file" if "workloads" in data else "a spec"
        raise ApmwError(f"{where}: {what}, not a search space: --space takes a file of 'axes': {{spec.field: "
                        "[values, ...]} (docs/search.md), and the spec comes first: apmw search SPEC --space SPACE")
    if not isinstance(axes, dict) or not axes:
        raise ApmwError(f"{where}: a space is a mapping with 'axes': {{spec.field: [values, ...]}}, e.g. "
                        "axes: {hardware.gpus_per_replica: [1, 2, 4, 8]}")
    assert isinstance(data, dict)
    unknown = [str(k) for k in data if k != "axes"]
    if unknown:
        raise ApmwError(f"{at(unknown[0])}: unknown key(s) {', '.join(unknown)}: a space holds 'axes' only")
    for path, values in axes.items():
        if not isinstance(path, str) or path.count(".") < 1:
            raise ApmwError(f"{at('axes', path)}: axis {path!r} is not a dotted spec path such as serving.engine")
        _check_spec_path(path, at("axes", path))
        if not isinstance(values, list) or not values:
            raise ApmwError(f"{at('axes', path)}: axis {path} needs a non-empty list of values, e.g. [1, 2]")
    size = space_size(axes)
    if size > MAX_POINTS:
        raise ApmwError(f"{where}: the space has {size:,} points; at most {MAX_POINTS:,} are evaluated "
                        "(about a plan each): drop values or axes")
    for path, values in axes.items():
        spelled = [_spelling(path, v) for v in values]      # vLLM and vllm, H100 and h100_sxm, FP8 and fp8 alike
        seen = Counter(json.dumps(_canonical(v), sort_keys=True, default=str) for v in spelled)
        twice = sorted(t for t, n in seen.items() if n > 1)
        if twice:
            raise ApmwError(f"{at('axes', path)}: axis {path} lists {', '.join(twice)} more than once; each value is one point "
                            "of the space: list it once")
    paths = sorted(axes)
    for outer, inner in zip(paths, paths[1:]):
        if inner.startswith(outer + "."):
            raise ApmwError(f"{at('axes', inner)}: axes {outer} and {inner} overlap: each value of {outer} sets the whole of what "
                            f"{inner} sets a part of, so one would undo or ignore the other; vary {inner} inside "
                            f"{outer}'s values, or drop one axis")
    for path, values in axes.items():
        odd = next((v for v in values if not _finite(v)), None)
        if odd is not None:
            raise ApmwError(f"{at('axes', path)}: axis {path}: {odd!r} holds a number that is not finite (nan or inf); give "
                            "finite values")
    return axes


# Axes whose values have one spelling apmw reads them as: a value in two spellings plans one point twice.
_SPELLINGS = {"serving.engine": engine_key, "model.weight_dtype": dtype_key, "model.kv_dtype": dtype_key,
              "model.moe_dtype": dtype_key}


def _spelling(path: str, value: object) -> object:
    """``value`` as the spec reads it on axis ``path``: an engine or dtype in apmw's spelling, a catalogue GPU by
    its catalogue name (a name the catalogue does not hold is left for the spec to refuse)."""
    if path in _SPELLINGS:
        return _SPELLINGS[path](value)
    if path == "hardware.gpu" and isinstance(value, str):
        try:
            return get_gpu(value).name
        except UnknownNameError:
            return value
    return value


def _finite(value: object) -> bool:
    """Whether every number in ``value`` (a list's or mapping's, keys too) is finite."""
    if isinstance(value, dict):
        return all(_finite(k) and _finite(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return not isinstance(value, float) or math.isfinite(value)


def _text_keys(value: object) -> object:
    """``value`` with every mapping key as text, so that one keyed by numbers and text alike sorts."""
    if isinstance(value, dict):
        return {str(k): _text_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_text_keys(v) for v in value]
    return value


def _canonical(value: object) -> object:
    """``value`` as the spec reads it, to find a value listed twice in two spellings (1 and 1.0, 2e11 and
    200000000000 inside a GPU's figures, 64 and "64"): a whole float as the integer, text that is a number as it. Keys become text, so that a mapping
    keyed by numbers and by text alike (quantiles 0.5 and '0.5') can be compared at all; the spec's own check
    refuses such a key given twice."""
    if isinstance(value, dict):
        return {str(_canonical(k)): _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):     # "64": the spec reads it as 64
        value = float(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


# Sections a search holds fixed, and why: its points are compared for one workload and SLO, and the fleet's day
# sizes replicas (apmw fleet), not one.
FIXED_SECTIONS = {
    "workload": "the workload is what a search compares deployments for: search each workload's spec on its own",
    "slo": "the SLO is what each point must meet, so points under two SLOs do not compare: search each SLO's spec",
    "fleet": "fleet.* sizes a fleet over a day (apmw fleet), not a replica: every point would be the same",
}


def _check_spec_path(path: str, where: str) -> None:
    """Refuse an axis whose path names no field of the spec (``apmw.spec.Spec``), naming the first part that
    is not one and the fields that are there, or one in a section the search holds fixed (FIXED_SECTIONS); a path
    may go on inside a field holding a mapping."""
    from apmw.spec import Spec

    section = path.split(".")[0]
    if section in FIXED_SECTIONS:
        raise ApmwError(f"{where}: axis {path}: {FIXED_SECTIONS[section]}")

    models: list[type[BaseModel]] = [Spec]
    walked: list[str] = []
    parts = path.split(".")
    for i, part in enumerate(parts):
        if not models:
            return                      # inside a free-form mapping: its keys are the spec loader's to check
        fields = {name: f for m in models for name, f in m.model_fields.items()}
        fields |= {f.alias: f for m in models for f in m.model_fields.values() if f.alias}
        if part not in fields:
            inside = ".".join(walked) or "the spec's top level"
            raise ApmwError(f"{where}: axis {path!r}: {part!r} is not a field of {inside} (fields: "
                            f"{', '.join(sorted(n for m in models for n in m.model_fields))})")
        walked.append(part)
        models = _models_in(fields[part].annotation)
        if not models and _is_plain(fields[part].annotation) and i < len(parts) - 1:
            raise ApmwError(f"{where}: axis {path!r}: {'.'.join(walked)} is a value, not a section; the axis "
                            f"ends there ({'.'.join(walked)}: [values])")


def _models_in(annotation: object) -> list[type[BaseModel]]:
    """The pydantic models a field's type may hold (a section, or one of a union's sections)."""
    args = typing.get_args(annotation) or (annotation,)
    return [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]


def _is_plain(annotation: object) -> bool:
    """Whether a field holds a value with no fields inside (a number, a name, a list), not a mapping."""
    args = typing.get_args(annotation) or (annotation,)
    return not any(a is dict or typing.get_origin(a) is dict or a is typing.Any for a in args)


def default_space(base: dict, moe: bool = False) -> dict[str, list]:
    """The axes every spec has, each holding the spec's own value (so the spec is one of the points,
    ``as_specified``): GPUs per replica 1-8, the engines, weight and KV dtype, batch cap. A
    llama.cpp spec keeps its engine and GPUs: a GGUF server has no other engine to compare. A spec that lays its
    replica out (``serving.parallelism``) keeps its GPU count, which the layout's sizes multiply to. A mixture
    of experts (``moe``) also tries attention data parallel over the replica's GPUs
    (``serving.attention_data_parallel``: one attention rank per GPU, the layout 2026's MoE deployments
    run and ``apmw levers`` tries), unless the spec lays its replica out itself (``serving.parallelism``)."""
    def axis(path: str, values: list) -> list:
        section, field = path.split(".")
        own = base.get(section, {}).get(field)
        return list(dict.fromkeys([own, *values]))

    ours = base.get("serving", {}).get("engine", "vllm")
    llamacpp = ours == "llamacpp"
    laid_out = base.get("serving", {}).get("parallelism") is not None    # its layout fixes its GPU count
    axes = {
        "hardware.gpus_per_replica": sorted(axis("hardware.gpus_per_replica",
                                                 [] if llamacpp or laid_out else [1, 2, 4, 8])),
        "serving.engine": axis("serving.engine", [] if llamacpp else ["vllm", "sglang", "trtllm"]),
        "model.weight_dtype": axis("model.weight_dtype", ["fp8", "bf16"]),
        "model.kv_dtype": axis("model.kv_dtype", ["fp8", "bf16"]),
        "serving.max_batch": axis("serving.max_batch", [64, 128, 256, 512]),
    }
    if moe and not llamacpp and not laid_out:
        axes["serving.attention_data_parallel"] = axis("serving.attention_data_parallel", [False, True])
    return axes


def spec_point(base: dict, axes: dict[str, list]) -> int | None:
    """The index of the point that is the spec itself, when every axis holds the spec's value."""
    index = 0
    for path, values in axes.items():
        node: object = base
        for key in path.split("."):
            node = node.get(key) if isinstance(node, dict) else None
        spelled, own = [_spelling(path, v) for v in values], _spelling(path, node)   # the spec's fp8, the axis's FP8
        if own not in spelled:
            return None
        index = index * len(values) + spelled.index(own)
    return index


def configs_beside(axes: dict[str, list], folder: Path) -> dict[str, list]:
    """``axes`` with each relative ``model.config`` path written in a space file in ``folder`` read beside that file,
    as a spec's is read beside the spec (:func:`apmw.spec.load.path_beside`): read from the current folder, it would
    name a file that is not there, or silently another model's."""
    def beside(value: object) -> object:
        return path_beside(value, folder) if isinstance(value, str) else value

    out = dict(axes)
    if "model.config" in out:
        out["model.config"] = [beside(v) for v in out["model.config"]]
    if "model" in out:
        out["model"] = [{**v, "config": beside(v["config"])} if isinstance(v, dict) and "config" in v else v
                        for v in out["model"]]
    return out


def space_size(axes: dict[str, list]) -> int:
    size = 1
    for values in axes.values():
        size *= len(values)
    return size


def points(axes: dict[str, list]) -> Iterator[tuple[int, dict]]:
    """Every point of the space as ``(index, {path: value})``, in index order."""
    names = list(axes)
    for i, values in enumerate(itertools.product(*(axes[n] for n in names))):
        yield i, dict(zip(names, values))


def check_paths(base: dict, axes: dict[str, list]) -> None:
    """Every axis runs through sections of the spec (a section the spec leaves out is fine) to a field the spec
    has: a misspelt axis is refused here, not found as every point pruned."""
    from apmw.spec import SpecError, spec_from_dict

    for path, values in axes.items():
        node: object = base
        walked: list[str] = []
        for key in path.split(".")[:-1]:
            node = node.get(key, {}) if isinstance(node, dict) else None
            walked.append(key)
            if not isinstance(node, dict):
                at = ".".join(walked)
                named = (f"write it as a mapping in the spec ({at}: {{name: {node}}}, a catalogue entry whose fields "
                         f"an axis may then vary) or " if isinstance(node, str) else "")
                raise ApmwError(f"the space's axis {path}: the spec gives {at} as {node!r}, a value with nothing under "
                                f"it; {named}vary {at} itself")
        try:       # a value, not null (a null leaves the field out, where an unknown field would go unseen); an axis
            #          of nulls alone is probed with a 0: only the unknown-field verdict is read
            probe = next((v for v in values if v is not None), 0)
            spec_from_dict(with_settings(base, {path: probe}), path="search space")
        except SpecError as exc:
            unknown = [line.strip() for line in str(exc).splitlines() if line.strip().startswith(f"{path}: unknown field")]
            if unknown:
                raise ApmwError(f"axis {unknown[0]}") from None


def with_settings(base: dict, settings: dict) -> dict:
    """The spec document ``base`` with each dotted path of ``settings`` set (sections created); a path set to None
    is left out, so that the field takes its default (``null`` on an axis: "leave the field out")."""
    d = copy.deepcopy(base)
    for path, value in settings.items():
        node = d
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return d


def settings_text(settings: dict) -> str:
    """A point's settings in words, each field by its last name: "gpus_per_replica=4, engine=vllm"."""
    return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in settings.items())


def search_key(base: dict, axes: dict[str, list]) -> str:
    """A digest of the spec and the space: a results file from another spec or space is not resumed."""
    text = json.dumps(_text_keys({"spec": base, "axes": axes}), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
