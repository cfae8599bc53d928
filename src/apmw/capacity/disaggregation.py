"""Disaggregated prefill and decode: prefill workers in front of the decode workers ("xPyD").

With ``serving.disaggregation`` every call is prefilled on one of ``prefill_workers`` workers of
``prefill_gpus`` GPUs each (laid out as ``prefill_parallelism``), its new KV is sent to its decode
worker over a ``kv_transfer_bandwidth_bytes_per_s`` link per prefill GPU, and the decode workers run
decode-only iterations (no prefill chunk ever stalls their decoders). The agents spread evenly over
``decode_workers`` decode workers, so the closed loop is solved for one decode worker and its share of
the prefill workers: ``prefill_workers / decode_workers`` of them, and that share of their GPUs, count
against each decode worker (its agents, power and cost).

For the closed loop the prefill workers are one more station each call passes through, fed by every
decode worker's calls. A worker packs the prompts waiting for it into one iteration, up to its token
budget (``per_batch = budget // prompt`` of them, each DP rank its own), and serves the batch in the
time of one iteration carrying them all (:func:`batched_prefill_wait_s`): an M/M/c queue with
``c = prefill_workers x per_batch`` servers of that batch's service (Erlang C gives the chance a call
waits, and it waits ``service / (c - a)`` on average when it does; with one worker and one prompt per
batch this is M/M/1's ``rho / (1 - rho) x service``), while a prompt's own service grows from its time
alone towards the full batch's as the batches fill. Then the transfer, which the decode engine sees
as extra time away from it. The wait
depends on the call rate, which depends on the wait: :func:`apmw.capacity.evaluate` iterates to the
fixed point. Sources: DistServe (Zhong et al., OSDI 2024) and Splitwise (Patel et al., ISCA 2024) for
the architecture, Erlang C (Kleinrock, Queueing Systems vol. 1, section 3.5) for the queue.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from apmw.capacity.sessions import SessionSample
from apmw.errors import ApmwError
from apmw.perf import IterationLoad, Replica, RooflineStepModel, build_step_model
from apmw.perf.parallelism import check_layout, prefill_layout
from apmw.perf.replica import replica_memory
from apmw.perf.serving_policy import resolve_policy
from apmw.spec import Spec


@dataclass(frozen=True)
class PrefillStage:
    gpus: float                    # prefill GPUs per decode worker (its share of the prefill workers')
    call_service_s: float          # mean busy time of a prefill worker per call
    per_iteration_s: float         # fixed part of one prefill iteration
    per_token_s: float             # marginal seconds per prefilled token
    transfer_per_token_s: float    # KV hand-off per prefilled token
    compute_share: float           # compute-bound share of its busy time (power)
    workers: int = 1               # prefill workers
    decode_workers: int = 1        # decode workers whose calls share them
    layout_text: str = ""          # one prefill worker's layout, for the answer
    per_batch: int = 1             # calls a worker packs into one batch (its token budget over a call's prompt)
    batch_service_s: float = 0.0   # a full batch's busy time (0: call_service_s)

    def wait_s(self, calls_per_s_per_decode_worker: float) -> tuple[float, float]:
        """(mean wait for a prefill worker, and the service a batch adds beyond the call's own; their
        utilisation) at a decode worker's call rate."""
        return batched_prefill_wait_s(self.workers, self.per_batch, self.call_service_s,
                                      self.batch_service_s or self.call_service_s,
                                      self.decode_workers * calls_per_s_per_decode_worker)

    def call_time_s(self, prefill_iters, prefill_tokens):
        """Prefill plus hand-off for calls of given iterations and tokens (vectorised)."""
        return prefill_iters * self.per_iteration_s + prefill_tokens * (self.per_token_s + self.transfer_per_token_s)


def erlang_c_wait_s(servers: int, offered_load: float, service_s: float) -> tuple[float, float]:
    """(mean wait in queue, utilisation) of an M/M/c queue with ``servers`` servers and offered load
    ``a = arrival rate x service`` (Erlang C); ``inf`` wait and utilisation 1 at or past saturation.
    Erlang C from Erlang B's recurrence ``B_k = a B_(k-1) / (k + a B_(k-1))``, which stays finite for
    hundreds of servers: ``C = c B / (c - a (1 - B))``."""
    c, a = servers, offered_load
    if a >= c:
        return float("inf"), 1.0
    if a <= 0:
        return 0.0, 0.0
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    waits = c * b / (c - a * (1.0 - b))
    return waits * service_s / (c - a), a / c


def batched_prefill_wait_s(workers: int, per_batch: int, alone_s: float, batch_s: float,
                           rate_per_s: float) -> tuple[float, float]:
    """(mean time a prompt spends beyond its own prefill alone: the wait for a worker, plus what sharing its
    iteration adds; the share of time the workers are busy) at ``rate_per_s`` prompts a second.

    Each of ``workers`` serves up to ``per_batch`` prompts together in ``batch_s``: ``workers x per_batch``
    servers of service ``batch_s`` (Erlang C) for the wait. A prompt alone takes ``alone_s``; each other
    prompt in its iteration adds ``d = (batch_s - alone_s) / (per_batch - 1)``. The others are those that
    arrive at its worker while the iteration forms, ``m = lambda_w x (alone_s + m d)`` for a worker's rate
    ``lambda_w``, so ``m = lambda_w alone_s / (1 - lambda_w d)``, at most ``per_batch - 1``. A worker is
    then busy ``lambda_w (alone_s + m d) / (1 + m)`` of the time: each iteration serves ``1 + m`` prompts.
    """
    wait, util = erlang_c_wait_s(workers * per_batch, rate_per_s * batch_s, batch_s)
    if per_batch <= 1 or util >= 1:
        return wait, util
    d = max(batch_s - alone_s, 0.0) / (per_batch - 1)
    lam = rate_per_s / workers
    others = per_batch - 1.0 if lam * d >= 1 else min(lam * alone_s / (1 - lam * d), per_batch - 1.0)
    return wait + others * d, min(lam * (alone_s + others * d) / (1 + others), 1.0)


def prefill_stage(spec: Spec, replica: Replica, s: SessionSample) -> PrefillStage | None:
    d = spec.serving.disaggregation
    if d is None:
        return None
    g = d.prefill_gpus_per_worker
    layout = prefill_layout(spec.serving)
    field = "serving.disaggregation.prefill_parallelism"
    try:
        check_layout(layout, replica.arch, spec.serving.engine, field=field)
    except ApmwError as exc:
        raise ApmwError(f"{spec.where(field)}{exc}") from None
    step = build_step_model(replica.arch, replica.gpu, g, spec.model.weight_dtype, spec.model.kv_dtype,
                            replica.step.efficiency, engine=spec.serving.engine,
                            # the decode replica's form: a plain roofline (a fitted efficiency) stays plain
                            calibrated=not isinstance(replica.step, RooflineStepModel), layout=layout,
                            engine_version=spec.serving.engine_version, moe_dtype=spec.model.moe_dtype,
                            mxfp4_moe_activations=spec.serving.mxfp4_moe_activations)
    mem = replica_memory(step, replica.policy, replica.speculative)     # the draft runs here too
    if not mem.fits:
        raise ApmwError(f"serving.disaggregation.prefill_gpus: {replica.arch.name} does not fit on "
                        f"{g} x {replica.gpu.label}: weights {mem.weight_bytes / 1e9:,.1f} GB against "
                        f"{mem.usable_bytes / 1e9:,.1f} GB usable; give each prefill worker more GPUs")
    chunk = max(s.call_prefill_tokens / s.call_prefill_iters, 1.0)
    attn = s.call_prefill_attn_flops / s.call_prefill_iters
    full = IterationLoad(decode_seqs=0.0, prefill_tokens=chunk, kv_read_bytes=s.call_prefill_kv_bytes,
                         attention_flops=attn)
    t_chunk = float(step.iteration_time_s(full))
    # calls a worker packs into one iteration: its token budget (each DP rank's) over a call's prompt
    worker = resolve_policy(spec.serving, replica.gpu.name, replica.gpu.hbm_bytes, attention_dp_ranks=layout.dp)
    per_batch = (max(min(int(worker.token_budget // s.call_prefill_tokens), worker.max_batch), 1)
                 if s.call_prefill_iters <= 1 else 1)
    batch = IterationLoad(decode_seqs=0.0, prefill_tokens=per_batch * chunk,
                          kv_read_bytes=per_batch * s.call_prefill_kv_bytes, attention_flops=per_batch * attn)
    t_batch = float(step.iteration_time_s(batch)) * s.call_prefill_iters
    t_one = float(step.iteration_time_s(IterationLoad(decode_seqs=0.0, prefill_tokens=1.0, kv_read_bytes=0.0,
                                                      attention_flops=0.0)))
    per_token = max(t_chunk - t_one, 0.0) / max(chunk - 1.0, 1.0)
    # the KV computed for the new tokens crosses to the decode replica, spread over the instance's links
    transfer = step.kv_bytes_per_token / (d.kv_transfer_bandwidth_bytes_per_s * g)
    share = d.prefill_workers / d.decode_workers
    return PrefillStage(gpus=g * share, call_service_s=s.call_prefill_iters * t_chunk,
                        per_iteration_s=t_one, per_token_s=per_token, transfer_per_token_s=transfer,
                        compute_share=float(np.asarray(step.compute_share(full))), workers=d.prefill_workers,
                        decode_workers=d.decode_workers, layout_text=layout.describe(), per_batch=per_batch,
                        batch_service_s=t_batch)
