"""Disaggregated prefill and decode: prefill workers in front of the decode workers ("xPyD").

With ``serving.disaggregation`` every call is prefilled on one of ``prefill_workers`` workers of
``prefill_gpus`` GPUs each (laid out as ``prefill_parallelism``), its new KV is sent to its decode
worker over a ``kv_transfer_bandwidth_bytes_per_s`` link per prefill GPU, and the decode workers run
decode-only iterations (no prefill chunk ever stalls their decoders). The agents spread evenly over
``decode_workers`` decode workers, so the closed loop is solved for one decode worker and its share of
the prefill workers: ``prefill_workers / decode_workers`` of them, and that share of their GPUs, count
against each decode worker (its agents, power and cost).

For the closed loop the prefill workers are one more station each call passes through: an M/M/c
queue with ``c = prefill_workers`` servers fed by every decode worker's calls (offered load
``a = decode_workers x calls/s x service``; Erlang C gives the chance a call waits, and it waits
``service / (c - a)`` on average when it does; with one worker this is M/M/1's ``rho / (1 - rho) x
service``), plus the transfer, which the decode engine sees as extra time away from it. The wait
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
from apmw.perf.parallelism import check_layout, layout_of
from apmw.perf.replica import replica_memory
from apmw.spec import Spec


@dataclass(frozen=True)
class PrefillStage:
    gpus: float                    # prefill GPUs per decode worker (its share of the prefill workers')
    call_service_s: float          # mean busy time of a prefill worker per call
    per_iteration_s: float         # fixed part of one prefill iteration
    per_token_s: float             # marginal seconds per prefilled token
    transfer_per_token_s: float    # KV hand-off per prefilled token
    compute_share: float           # compute-bound share of its busy time (power)
    workers: int = 1               # prefill workers (servers of the queue)
    decode_workers: int = 1        # decode workers whose calls share them
    layout_text: str = ""          # one prefill worker's layout, for the answer

    def wait_s(self, calls_per_s_per_decode_worker: float) -> tuple[float, float]:
        """(mean wait for a free prefill worker, their utilisation) at a decode worker's call rate."""
        offered_load = self.decode_workers * calls_per_s_per_decode_worker * self.call_service_s
        return erlang_c_wait_s(self.workers, offered_load, self.call_service_s)

    def call_time_s(self, prefill_iters, prefill_tokens):
        """Prefill plus hand-off for calls of given iterations and tokens (vectorised)."""
        return prefill_iters * self.per_iteration_s + prefill_tokens * (self.per_token_s + self.transfer_per_token_s)


def erlang_c_wait_s(servers: int, offered_load: float, service_s: float) -> tuple[float, float]:
    """(mean wait in queue, utilisation) of an M/M/c queue with ``servers`` servers and offered load
    ``a = arrival rate x service`` (Erlang C); ``inf`` wait and utilisation 1 at or past saturation."""
    c, a = servers, offered_load
    if a >= c:
        return float("inf"), 1.0
    if a <= 0:
        return 0.0, 0.0
    term, below = 1.0, 1.0                       # a^k / k!, summed for k < c
    for k in range(1, c):
        term *= a / k
        below += term
    top = term * a / c / (1.0 - a / c)           # a^c / c! / (1 - rho)
    waits = top / (below + top)
    return waits * service_s / (c - a), a / c


def prefill_stage(spec: Spec, replica: Replica, s: SessionSample) -> PrefillStage | None:
    d = spec.serving.disaggregation
    if d is None:
        return None
    g = d.prefill_gpus_per_worker
    layout = layout_of(spec.serving.model_copy(update={"parallelism": d.prefill_parallelism}), g)
    check_layout(layout, replica.arch, spec.serving.engine, field="serving.disaggregation.prefill_parallelism")
    step = build_step_model(replica.arch, replica.gpu, g, spec.model.weight_dtype, spec.model.kv_dtype,
                            replica.step.efficiency, engine=spec.serving.engine,
                            # the decode replica's form: a plain roofline (a fitted efficiency) stays plain
                            calibrated=not isinstance(replica.step, RooflineStepModel), layout=layout)
    mem = replica_memory(step, replica.policy)
    if not mem.fits:
        raise ApmwError(f"serving.disaggregation.prefill_gpus: {replica.arch.name} does not fit on "
                        f"{g} x {replica.gpu.name}; give each prefill worker more GPUs")
    chunk = max(s.call_prefill_tokens / s.call_prefill_iters, 1.0)
    attn = s.call_prefill_attn_flops / s.call_prefill_iters
    full = IterationLoad(decode_seqs=0.0, prefill_tokens=chunk, kv_read_bytes=s.call_prefill_kv_bytes,
                         attention_flops=attn)
    t_chunk = float(step.iteration_time_s(full))
    t_one = float(step.iteration_time_s(IterationLoad(decode_seqs=0.0, prefill_tokens=1.0, kv_read_bytes=0.0,
                                                      attention_flops=0.0)))
    per_token = max(t_chunk - t_one, 0.0) / max(chunk - 1.0, 1.0)
    # the KV computed for the new tokens crosses to the decode replica, spread over the instance's links
    transfer = step.kv_bytes_per_token / (d.kv_transfer_bandwidth_bytes_per_s * g)
    share = d.prefill_workers / d.decode_workers
    return PrefillStage(gpus=g * share, call_service_s=s.call_prefill_iters * t_chunk,
                        per_iteration_s=t_one, per_token_s=per_token, transfer_per_token_s=transfer,
                        compute_share=float(np.asarray(step.compute_share(full))), workers=d.prefill_workers,
                        decode_workers=d.decode_workers, layout_text=layout.describe())
