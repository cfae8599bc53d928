"""The iteration load the step-model tests price: decoders at a context, and a prefill chunk after it."""

from __future__ import annotations

import numpy as np

from apmw.perf import IterationLoad, StepModel


def iteration_load(step: StepModel, decode, prefill, context) -> IterationLoad:
    """``decode`` sequences at ``context`` tokens of KV each, plus a ``prefill`` chunk after ``context``
    tokens of its own prompt."""
    a = step.arch
    decode, prefill, context = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (decode, prefill, context)))
    return IterationLoad(decode_seqs=decode, prefill_tokens=prefill,
                         kv_read_bytes=decode * context * step.kv_bytes_per_token,
                         attention_flops=decode * a.attention_flops_per_token(context)
                         + prefill * a.attention_flops_per_token(context / 2 + prefill / 2))


def assert_never_faster(step: StepModel, max_context: float = 300_000) -> None:
    """More decoding sequences, more context or a longer prefill chunk never makes an iteration faster."""
    for ctx in (1.0, 4000.0, 100_000.0):
        t = step.iteration_time_s(iteration_load(step, np.arange(1, 1025, dtype=float), 0.0, ctx))
        assert np.all(np.diff(t) >= -1e-12 * t[1:]), ctx
    ctx = np.geomspace(1, max_context, 400)
    for d in (1.0, 64.0, 700.0):
        assert np.all(np.diff(step.iteration_time_s(iteration_load(step, d, 0.0, ctx))) >= 0), d
    prefill = np.arange(0, 40_000, 97, dtype=float)
    assert np.all(np.diff(step.iteration_time_s(iteration_load(step, 8.0, prefill, 2000.0))) >= 0)
