"""Disaggregated prefill and decode: a prefill instance in front of the decode replica.

With ``serving.disaggregation`` every call is prefilled on a separate instance of
``prefill_gpus`` GPUs, its new KV is sent to the decode replica over a
``kv_transfer_bandwidth_bytes_per_s`` link, and the decode replica runs decode-only
iterations (no prefill chunk ever stalls its decoders). For the closed loop the
prefill stage is one more station each call passes through: an M/M/1 queue
(utilisation ``rho = calls/s x service``, wait ``rho / (1 - rho) x service``) plus
the transfer, which the decode engine sees as extra time away from it. The wait
depends on the call rate, which depends on the wait: :func:`apmw.capacity.evaluate`
iterates to the fixed point. Sources: DistServe (Zhong et al., OSDI 2024) and
Splitwise (Patel et al., ISCA 2024) for the architecture; the queue is our model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from apmw.capacity.sessions import SessionSample
from apmw.errors import ApmwError
from apmw.perf import IterationLoad, Replica, RooflineStepModel, build_step_model
from apmw.perf.replica import replica_memory
from apmw.spec import Spec


@dataclass(frozen=True)
class PrefillStage:
    gpus: int
    call_service_s: float          # mean busy time of the prefill instance per call
    per_iteration_s: float         # fixed part of one prefill iteration
    per_token_s: float             # marginal seconds per prefilled token
    transfer_per_token_s: float    # KV hand-off per prefilled token
    compute_share: float           # compute-bound share of its busy time (power)

    def call_time_s(self, prefill_iters, prefill_tokens):
        """Prefill plus hand-off for calls of given iterations and tokens (vectorised)."""
        return prefill_iters * self.per_iteration_s + prefill_tokens * (self.per_token_s + self.transfer_per_token_s)


def prefill_stage(spec: Spec, replica: Replica, s: SessionSample) -> PrefillStage | None:
    d = spec.serving.disaggregation
    if d is None:
        return None
    step = build_step_model(replica.arch, replica.gpu, d.prefill_gpus, spec.model.weight_dtype, spec.model.kv_dtype,
                            replica.step.efficiency, engine=spec.serving.engine,
                            # the decode replica's form: a plain roofline (a fitted efficiency) stays plain
                            calibrated=not isinstance(replica.step, RooflineStepModel))
    mem = replica_memory(step, replica.policy)
    if not mem.fits:
        raise ApmwError(f"serving.disaggregation.prefill_gpus: {replica.arch.name} does not fit on "
                        f"{d.prefill_gpus} x {replica.gpu.name}; give the prefill instance more GPUs")
    chunk = max(s.call_prefill_tokens / s.call_prefill_iters, 1.0)
    attn = s.call_prefill_attn_flops / s.call_prefill_iters
    full = IterationLoad(decode_seqs=0.0, prefill_tokens=chunk, kv_read_bytes=s.call_prefill_kv_bytes,
                         attention_flops=attn)
    t_chunk = float(step.iteration_time_s(full))
    t_one = float(step.iteration_time_s(IterationLoad(decode_seqs=0.0, prefill_tokens=1.0, kv_read_bytes=0.0,
                                                      attention_flops=0.0)))
    per_token = max(t_chunk - t_one, 0.0) / max(chunk - 1.0, 1.0)
    # the KV computed for the new tokens crosses to the decode replica, spread over the instance's links
    transfer = step.kv_bytes_per_token / (d.kv_transfer_bandwidth_bytes_per_s * d.prefill_gpus)
    return PrefillStage(gpus=d.prefill_gpus, call_service_s=s.call_prefill_iters * t_chunk,
                        per_iteration_s=t_one, per_token_s=per_token, transfer_per_token_s=transfer,
                        compute_share=float(np.asarray(step.compute_share(full))))
