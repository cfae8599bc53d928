"""Several workloads on one replica: their sampled sessions pooled into one sample, and each workload's
own SLO read off its own tasks and calls (a shared pool of :mod:`apmw.capacity.fleet_mix`).

**A shared pool** serves its workloads' tasks on the same replicas, so a replica's closed loop runs a
mix of sessions. Hour ``h`` starts ``lambda_i(h)`` tasks of workload ``i``; by Little's law the pool
holds ``N = sum_i lambda_i R_i`` agents, and the mean task time over the tasks started is
``R = sum_i (lambda_i / lambda) R_i``: the sessions are sampled **in proportion to the tasks each
workload starts in the hour** (an agent slot that finishes a task takes the next from the mix), so
that each workload's share of concurrent agents comes out as ``lambda_i R_i / N`` on its own. Each
workload's sessions are sampled as its spec says (its own seed plus its place in the pool), and
the samples are pooled (:func:`mix_samples`): per-task arrays side by side, per-call means weighted
by calls, the tail calls drawn in proportion to calls, each system prompt cached once (workloads
with the same ``workload`` section share one). The pooled sample is an ordinary
:class:`apmw.capacity.sessions.SessionSample`, so the closed loop, the KV and prefix-cache models
and the N* search are the ones ``apmw plan`` uses: every call shares the engine's batch, queue and
KV memory, and each task's latency is its own calls' work at the mix's iteration times and queue
waits. ASSUMPTIONS: an hour's sessions are at least ``MIN_MIX_SESSIONS`` of the rarest workload unless the
mix would pass ``MAX_MIX_CALLS`` calls (a workload with a small share then has its p95 read off fewer
tasks, and N* moves by an agent or so from hour to hour with the sample); the agent timeline that
the KV-overflow model reads (under ``retain``) interleaves the workloads in ``TIMELINE_CHUNKS`` pieces.

**The SLO rule.** Every workload keeps its own SLO on its own tasks: at a load, each workload's
task p95 is read off its own sessions' latencies and its TTFT p95 off its own calls; the time per
output token is one engine's, so every workload's TPOT (or output speed) limit applies to it, the
strictest binding. N* of the hour is the most agents at which every workload meets every SLO its
spec sets and the KV fits. An hour whose mix no number of agents serves refuses the pool, naming
the workload and SLO that fail at one agent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import numpy as np

from apmw.capacity.closed_loop import ClosedLoopModel, spills_retained
from apmw.capacity.evaluate import Evaluation, prefill_keeps_up
from apmw.capacity.prefix_cache import frees_contexts
from apmw.capacity.quantiles import quantile
from apmw.capacity.sessions import (TAIL_CALLS, TARGET_CALLS, SessionSample, default_session_count,
                                    sample_retained_pair, sample_session_pair, sample_sessions)
from apmw.capacity.slo import SLO_LABELS, SloVerdict, check_slo
from apmw.errors import ApmwError
from apmw.perf import Replica
from apmw.spec import Slo, Spec

# Sessions of an hour's mix: at least the most any of its workloads samples alone, and enough that the
# workload with the smallest share has MIN_MIX_SESSIONS of them, as long as the mix stays within
# MAX_MIX_CALLS calls (past that the smallest share gets fewer, its p95 read off fewer tasks).
MIN_MIX_SESSIONS = 400
MAX_MIX_CALLS = 2 * TARGET_CALLS
# Each workload's calls laid end to end (one agent's timeline, for the KV demand's autocorrelation under
# retain) are cut into this many pieces and interleaved, so that the timeline read mixes the workloads.
TIMELINE_CHUNKS = 64

# How each field of a SessionSample pools (tests/capacity/test_fleet_mix.py checks that every field is named).
PER_TASK = ("calls", "prefill_iters", "decode_iters", "tool_s", "kv_transfer_s", "input_tokens", "output_tokens",
            "prefill_tokens", "api_prefill_tokens", "kv_q", "kv_prefill", "kv_decode", "kv_tool", "kv2_q", "kv2_prefill", "kv2_decode",
            "kv2_tool", "queue_gamma", "exposure_uniform")
PER_CONTEXT = ("freed_s", "freed_kv_bytes", "final_kv_bytes")
TAIL = ("call_prefill_iters_sample", "call_prefill_tokens_sample", "call_prefill_attn_flops_sample",
        "call_prefill_kv_bytes_sample", "call_decode_iters_sample", "call_queue_exp")
# Priced on a replica by the model that evaluates the pooled sample (apmw.capacity.prefill_queue.priced_on), not pooled.
ON_REPLICA = ("call_prefill_alone_s_sample", "call_prefill_attention_s_sample")
TIMELINE = ("timeline_kv_bytes", "timeline_prefill_iters", "timeline_decode_iters", "timeline_wait_s")
PER_CALL_MEAN = ("call_prefill_iters", "call_decode_iters", "call_prefill_tokens", "call_prefill_kv_bytes",
                 "call_prefill_attn_flops", "call_past_window_share")
PER_DECODE_MEAN = ("call_decode_kv_bytes", "call_decode_attn_flops", "call_decode_kv_bytes_sq",
                   "call_decode_attn_flops_sq")
SAME = ("decode_tokens_per_iteration", "draft_cost_fraction", "accepted_tokens_per_iteration")
SUMMED = ("sessions", "shared_prefix_kv_bytes")


@dataclass(frozen=True)
class MixedSample:
    sample: SessionSample
    tasks: tuple[slice, ...]        # each workload's sessions in the pooled sample
    calls: tuple[slice, ...]        # ... and its tail calls (the TTFT samples)


def _interleaved(parts: list[np.ndarray]) -> np.ndarray:
    """Arrays cut into TIMELINE_CHUNKS pieces each, the pieces taken in turn."""
    pieces = [np.array_split(p, TIMELINE_CHUNKS) for p in parts]
    return np.concatenate([piece[k] for k in range(TIMELINE_CHUNKS) for piece in pieces])


def mix_samples(samples: list[SessionSample], own_prefix: list[bool]) -> MixedSample:
    """Pool several workloads' sampled sessions into one sample (module docstring). ``own_prefix[i]``: whether
    workload ``i``'s system prompt is one of its own (False: the same prompt as an earlier workload's)."""
    named = set(PER_TASK + PER_CONTEXT + TAIL + TIMELINE + PER_CALL_MEAN + PER_DECODE_MEAN + SAME + SUMMED + ON_REPLICA)
    missing = {f.name for f in fields(SessionSample)} - named
    if missing:
        raise AssertionError(f"apmw.capacity.session_mix does not know how to pool SessionSample.{sorted(missing)}")
    first = samples[0]
    for name in SAME:
        if any(getattr(s, name) != getattr(first, name) for s in samples):
            raise ApmwError(f"workloads sharing a replica decode differently ({name}); they cannot share it")
    rows = np.array([float(s.calls.sum()) for s in samples])
    decode = np.array([float(s.decode_iters.sum()) for s in samples])
    tail_total = min(TAIL_CALLS, int(rows.sum()))
    take = [min(len(s.call_queue_exp), max(1, round(tail_total * r / rows.sum()))) for s, r in zip(samples, rows)]
    out: dict = {}
    for name in PER_TASK + PER_CONTEXT:
        out[name] = np.concatenate([getattr(s, name) for s in samples])
    for name in TAIL:
        out[name] = np.concatenate([getattr(s, name)[:k] for s, k in zip(samples, take)])
    for name in TIMELINE:
        out[name] = _interleaved([getattr(s, name) for s in samples])
    for name in PER_CALL_MEAN:
        out[name] = float(np.dot(rows, [getattr(s, name) for s in samples]) / rows.sum())
    for name in PER_DECODE_MEAN:
        w = decode if decode.sum() > 0 else rows
        out[name] = float(np.dot(w, [getattr(s, name) for s in samples]) / w.sum())
    for name in SAME:
        out[name] = getattr(first, name)
    out["sessions"] = sum(s.sessions for s in samples)
    out["shared_prefix_kv_bytes"] = float(sum(s.shared_prefix_kv_bytes for s, own in zip(samples, own_prefix) if own))
    tasks, calls, t0, c0 = [], [], 0, 0
    for s, k in zip(samples, take):
        tasks.append(slice(t0, t0 + s.sessions))
        calls.append(slice(c0, c0 + k))
        t0, c0 = t0 + s.sessions, c0 + k
    return MixedSample(SessionSample(**out), tuple(tasks), tuple(calls))


def mix_counts(tasks: list[float], specs: list[Spec]) -> tuple[int, ...]:
    """Sessions of each workload in an hour's mix: in proportion to the tasks each starts (module docstring)."""
    total = sum(tasks)
    shares = [t / total for t in tasks]
    present = [i for i, p in enumerate(shares) if p > 0]
    base = max(default_session_count(specs[i]) for i in present)
    calls = [s.workload.steps_per_task.mean * s.workload.calls_per_step.mean for s in specs]
    per_task = sum(shares[i] * calls[i] for i in present)
    wanted = math.ceil(MIN_MIX_SESSIONS / min(shares[i] for i in present))
    m = max(base, min(wanted, int(MAX_MIX_CALLS / per_task)))
    return tuple(max(1, round(p * m)) if p > 0 else 0 for p in shares)


def priced_variants(spec: Spec, replica: Replica, sessions: int, seed: int
              ) -> tuple[SessionSample, SessionSample | None, SessionSample | None]:
    """(as the policy prices them, every freed context found, every retained context lost): the samples the
    closed loop blends (:func:`apmw.capacity.closed_loop.closed_loop_model`), the last two where it does."""
    if frees_contexts(spec):
        miss, hit = sample_session_pair(spec, replica, sessions, seed)
        return miss, hit, None
    if spills_retained(spec, replica):
        kept, lost = sample_retained_pair(spec, replica, sessions, seed)
        return kept, None, lost
    return sample_sessions(spec, replica, sessions, seed), None, None


def workload_figures(ev: Evaluation, names: list[str], slos: list[Slo], tasks: tuple[slice, ...],
                     calls: tuple[slice, ...], alike: tuple[int, ...] | None = None) -> list[dict]:
    """Each workload's own p95s at ``ev`` (its tasks' latency, its calls' TTFT; the engine's time per output
    token), its SLO and whether each holds. ``alike[i]``: the first workload with the same workload and SLO as
    workload ``i`` (default: each its own). Alike workloads are one population, so their p95s are read off
    their tasks and calls together: read apart, off a share each, the worst of several noisy p95s would bind,
    and many copies of one workload pooled would size far below one copy alone."""
    alike = tuple(range(len(names))) if alike is None else alike
    p95s: dict[int, tuple[float | None, float | None]] = {}     # each population's, read once
    for group in dict.fromkeys(alike):
        members = [j for j, a in enumerate(alike) if a == group]
        task = np.concatenate([ev.task_latency_samples_s[tasks[j]] for j in members])
        ttft = np.concatenate([ev.ttft_samples_s[calls[j]] for j in members])
        p95s[group] = (quantile(task, 0.95) if len(task) else None, quantile(ttft, 0.95) if len(ttft) else None)
    rows = []
    for name, slo, group in zip(names, slos, alike):
        task_p95, ttft_p95 = p95s[group]
        verdict = check_slo(slo, task_p95, ttft_p95, ev.tpot_p95_s)
        rows.append({"workload": name, "task_latency_p95_s": task_p95, "ttft_p95_s": ttft_p95,
                     "tpot_p95_s": ev.tpot_p95_s,
                     "slo": {"task_latency_p95_s": slo.task_latency_p95_s, "ttft_p95_s": slo.ttft_p95_s,
                             "tpot_p95_s": slo.tpot_p95_s, "output_speed_tokens_per_s": slo.output_speed_tokens_per_s},
                     "slo_failed": list(verdict.failed), "meets_slo": verdict.meets})
    return rows


class JointSlo:
    """A closed-loop model whose SLO verdict is every workload's own (module docstring, 'The SLO rule'):
    what :func:`apmw.capacity.search.search` asks of a model, for a pooled sample. ``alike``: as
    :func:`workload_figures` takes it."""

    def __init__(self, model: ClosedLoopModel, names: list[str], slos: list[Slo], mixed: MixedSample,
                 alike: tuple[int, ...] | None = None):
        self.model, self.names, self.slos, self.mixed, self.alike = model, names, slos, mixed, alike
        self._cache: dict[int, Evaluation] = {}

    def with_max_batch(self, max_batch: int) -> "JointSlo":
        return JointSlo(self.model.with_max_batch(max_batch), self.names, self.slos, self.mixed, self.alike)

    def figures(self, ev: Evaluation) -> list[dict]:
        return workload_figures(ev, self.names, self.slos, self.mixed.tasks, self.mixed.calls, self.alike)

    def evaluate(self, agents: int) -> Evaluation:
        if agents not in self._cache:
            ev = self.model.evaluate(agents)
            failed = tuple(f"{r['workload']} {SLO_LABELS[f]}" for r in self.figures(ev) for f in r["slo_failed"])
            meets = not failed and prefill_keeps_up(ev.prefill_utilisation)
            self._cache[agents] = replace(ev, meets_latency=meets, slo=SloVerdict(failed=failed, unmeasured=()))
        return self._cache[agents]


def mixed_variant(samples: list[SessionSample | None], own: list[bool]) -> SessionSample | None:
    """The pooled sample of one priced variant, where the closed loop uses that variant."""
    present = [s for s in samples if s is not None]
    return mix_samples(present, own).sample if len(present) == len(samples) else None
