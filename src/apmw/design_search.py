"""Which deployment to run: the spec's workload and SLO planned on every point of a design space.

A space names spec fields by their dotted path and lists the values to try::

    axes:
      hardware.gpu: [H100, H200]
      hardware.gpus_per_replica: [1, 2, 4, 8]
      model.weight_dtype: [bf16, fp8]
      serving.engine: [vllm, sglang]

Each point of the product is the spec with those fields set, solved by ``apmw plan``. A point
that is not a valid spec, does not fit its memory or meets the SLO at no N is pruned, with the
reason. The answer is the Pareto front of agents per MW against per-agent output speed (tokens/s
at the p95 time per output token, the way interactivity curves are read), the best point per
objective, and for each front point the engine flags that deploy it.

Points are evaluated one after another (about a plan each, 30-70 ms on the bundled examples) with
the analytic model; :func:`check_front` then settles N* in the simulator for the best front points,
as ``apmw plan`` does (tens of seconds each). The vectorised evaluation and the Ray executor of the
issue are not built yet.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field, replace
from typing import Callable

from apmw.capacity import InfeasibleError, plan
from apmw.errors import ApmwError
from apmw.sim import unsupported
from apmw.sim.checked import CHECK_TASKS_PER_POINT, check_plan
from apmw.spec import Spec, SpecError, spec_from_dict

# Points one search evaluates: one after another, a larger space would run for hours.
MAX_POINTS = 5000
# What each objective reads from a point, and whether more is better.
OBJECTIVES = {"agents_per_mw": True, "agents_per_mw_provisioned": True, "cost_per_session_usd": False,
              "agents_per_gpu": True, "task_latency_p95_s": False, "output_speed_tokens_per_s": True}


@dataclass(frozen=True)
class Point:
    settings: dict                      # dotted path -> value
    figures: dict                       # the objectives, and N* and its binding constraint
    launch: str                         # the engine's command line for this replica
    checked: dict | None = None         # N* settled in the simulator (check_front), or why it was not


@dataclass
class SearchAnswer:
    points: list[Point]
    pruned: list[tuple[dict, str, str]] = field(default_factory=list)      # settings, reason, full message

    def front(self) -> list[Point]:
        """Points no other beats on both agents per MW and per-agent output speed, best agents per MW first."""
        front, fastest = [], -1.0
        for p in sorted(self.points, key=lambda p: (-p.figures["agents_per_mw"],
                                                    -p.figures["output_speed_tokens_per_s"])):
            if p.figures["output_speed_tokens_per_s"] > fastest:
                front.append(p)
                fastest = p.figures["output_speed_tokens_per_s"]
        return front

    def best(self) -> dict[str, Point]:
        return {name: (max if more else min)(self.points, key=lambda p: p.figures[name])
                for name, more in OBJECTIVES.items()} if self.points else {}

    def to_dict(self, explain: bool = False) -> dict:
        reasons: dict[str, int] = {}
        for _, why, _ in self.pruned:
            reasons[why] = reasons.get(why, 0) + 1
        out = {
            "evaluated": len(self.points) + len(self.pruned),
            "feasible": len(self.points),
            "pruned": len(self.pruned),
            "pruned_by_reason": reasons,
            "front": [_point_dict(p) for p in self.front()],
            "best": {name: _point_dict(p) for name, p in self.best().items()},
        }
        if explain:
            out["pruned_points"] = [{"settings": s, "reason": why, "message": msg} for s, why, msg in self.pruned]
        return out


def _point_dict(p: Point) -> dict:
    d = {"settings": p.settings, **p.figures, "launch": p.launch}
    if p.checked is not None:
        d["checked"] = p.checked
    return d


def read_space(data: object, where: str) -> dict[str, list]:
    """The axes of a space document, checked: a mapping ``axes: {dotted.path: [values]}``."""
    axes = data.get("axes") if isinstance(data, dict) else None
    if not isinstance(axes, dict) or not axes:
        raise ApmwError(f"{where}: a space is a mapping with 'axes': {{spec.field: [values, ...]}}, e.g. "
                        "axes: {hardware.gpus_per_replica: [1, 2, 4, 8]}")
    for path, values in axes.items():
        if not isinstance(path, str) or path.count(".") < 1:
            raise ApmwError(f"{where}: axis {path!r} is not a dotted spec path such as serving.engine")
        if not isinstance(values, list) or not values:
            raise ApmwError(f"{where}: axis {path} needs a non-empty list of values, e.g. [1, 2]")
    size = 1
    for values in axes.values():
        size *= len(values)
    if size > MAX_POINTS:
        raise ApmwError(f"{where}: the space has {size:,} points; at most {MAX_POINTS:,} are evaluated one after "
                        "another: drop values or axes")
    return axes


def default_space() -> dict[str, list]:
    """GPUs per replica (1 to 8), weight dtype and engine: the axes every spec has."""
    return {"hardware.gpus_per_replica": [1, 2, 4, 8], "model.weight_dtype": ["bf16", "fp8"],
            "serving.engine": ["vllm", "sglang"]}


def _check_paths(base: dict, axes: dict[str, list]) -> None:
    """Every axis runs through sections of the spec (a section the spec leaves out is fine)."""
    for path in axes:
        node: object = base
        for key in path.split(".")[:-1]:
            node = node.get(key, {}) if isinstance(node, dict) else None
            if not isinstance(node, dict):
                raise ApmwError(f"axis {path}: {key} is not a section of the spec, so nothing lies under it")


def _with(base: dict, settings: dict) -> dict:
    d = copy.deepcopy(base)
    for path, value in settings.items():
        node = d
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return d


def launch_flags(result) -> str:
    """The engine's command line for the replica ``result`` plans (vLLM, SGLang or TensorRT-LLM serve)."""
    spec, policy = result.spec, result.replica.policy
    model, tp = spec.model.config, spec.hardware.gpus_per_replica
    kv_fp8 = spec.model.kv_dtype == "fp8"
    caching = spec.serving.prefix_caching
    if policy.engine == "sglang":
        return (f"python -m sglang.launch_server --model-path {model} --tp {tp} --max-running-requests "
                f"{policy.max_batch} --chunked-prefill-size {policy.token_budget} --mem-fraction-static "
                f"{policy.kv_memory_fraction:g}" + (" --kv-cache-dtype fp8_e4m3" if kv_fp8 else "")
                + ("" if caching else " --disable-radix-cache"))
    if policy.engine == "trtllm":
        return (f"trtllm-serve {model} --tp_size {tp} --max_batch_size {policy.max_batch} --max_num_tokens "
                f"{policy.token_budget} --kv_cache_free_gpu_memory_fraction {policy.kv_memory_fraction:g}")
    return (f"vllm serve {model} --tensor-parallel-size {tp} --max-num-seqs {policy.max_batch} "
            f"--max-num-batched-tokens {policy.token_budget} --gpu-memory-utilization {policy.kv_memory_fraction:g}"
            + (" --kv-cache-dtype fp8" if kv_fp8 else "")
            + (" --enable-prefix-caching" if caching else " --no-enable-prefix-caching"))


def search(spec: Spec, axes: dict[str, list], progress: Callable[[int, int], None] | None = None) -> SearchAnswer:
    """Plan ``spec`` at every point of ``axes`` (dotted path -> values)."""
    base = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    _check_paths(base, axes)
    names = list(axes)
    combos = list(itertools.product(*(axes[n] for n in names)))
    answer = SearchAnswer(points=[])
    for i, values in enumerate(combos):
        settings = dict(zip(names, values))
        try:
            point_spec = spec_from_dict(_with(base, settings), path="search point")
            result = plan(point_spec)
        except InfeasibleError as exc:
            answer.pruned.append((settings, "no number of agents meets the SLO", str(exc)))
        except (SpecError, ApmwError) as exc:
            answer.pruned.append((settings, _reason(str(exc)), str(exc)))
        else:
            d = result.to_dict()
            gpus = result.replica.gpus + result.prefill_gpus
            answer.points.append(Point(settings=settings, figures={
                "agents_per_replica": d["agents_per_replica"], "binding_constraint": d["binding_constraint"],
                "agents_per_mw": d["agents_per_mw"], "agents_per_mw_provisioned": d["agents_per_mw_provisioned"],
                "cost_per_session_usd": d["cost_per_session_usd"], "agents_per_gpu": d["agents_per_replica"] / gpus,
                "task_latency_p95_s": d["task_latency_s"]["p95"],
                "output_speed_tokens_per_s": 1.0 / d["tpot_p95_s"]}, launch=launch_flags(result)))
        if progress is not None:
            progress(i + 1, len(combos))
    return answer


def check_front(spec: Spec, answer: SearchAnswer, top: int, tasks_per_point: int = CHECK_TASKS_PER_POINT,
                progress: Callable[[str], None] | None = None) -> SearchAnswer:
    """The ``top`` front points (best agents per MW first) with N* settled in the simulator, as
    ``apmw plan`` does (:func:`apmw.sim.checked.check_plan`); each gets ``checked``: the simulated N*,
    its interval, agents per MW and task p95 there, or the reason it could not be checked."""
    base = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    chosen = {id(p) for p in answer.front()[:top]}
    points = []
    for p in answer.points:
        if id(p) in chosen:
            if progress is not None:
                progress(f"checking {_settings_text(p.settings)}")
            p = replace(p, checked=_checked(spec_from_dict(_with(base, p.settings), path="search point"),
                                            tasks_per_point))
        points.append(p)
    return SearchAnswer(points=points, pruned=answer.pruned)


def _checked(point_spec: Spec, tasks_per_point: int) -> dict:
    gap = unsupported(point_spec)
    if gap:
        return {"not_checked": f"the simulator does not model {gap}"}
    try:
        d = check_plan(plan(point_spec), tasks_per_point=tasks_per_point).to_dict()
    except ApmwError as exc:
        return {"not_checked": str(exc)}
    return {"agents_per_replica": d["agents_per_replica"], "agents_per_replica_interval": d["agents_per_replica_interval"],
            "agents_simulated": [p["agents"] for p in d["check"]["points"]],
            "binding_constraint": d["binding_constraint"], "agents_per_mw": d["agents_per_mw"],
            "cost_per_session_usd": d["cost_per_session_usd"], "task_latency_p95_s": d["task_latency_s"]["p95"],
            "task_latency_p95_interval_s": d["task_latency_p95_interval_s"], "completed_tasks": d["completed_tasks"]}


def _settings_text(settings: dict) -> str:
    return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in settings.items())


def _reason(message: str) -> str:
    """The class of a pruned point's message, to count points by (the message itself is kept for --explain)."""
    if "does not fit" in message:
        return "does not fit: the weights and workspace leave no KV memory"
    if "invalid spec" in message:
        detail = message.split("\n")[-1].strip()
        return f"not a valid spec ({detail.split(':')[0]})"
    return message.split(";")[0].split(":")[0][:120]
