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
