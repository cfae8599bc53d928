"""Step time read off one server's own measurements (``measured``): a line through its tables.

``apmw bench --calibrate`` (:mod:`apmw.loadgen.calibrate`) times three kinds of iteration on an
idle server: a whole prompt's prefill by prompt length, a decode step by batch size, and a
decode step after a longer prompt. Each measured row is an iteration load
(:class:`apmw.perf.step.IterationLoad`) and its seconds. :class:`MeasuredStepModel` prices any
iteration, mixed ones included, by the line through those rows in the things an iteration
does:

    t = fixed_s + per_sequence_s * decode_seqs + per_added_sequence_s * max(decode_seqs - 1, 0)
        + per_prefill_token_s * prefill_tokens + per_kv_byte_s * kv_read_bytes
        + per_attention_flop_s * attention_flops

fitted by non-negative least squares on relative error, so every row weighs alike whatever its
length. The kinds of cost are the ones the tables separate: decode rows at batch 1 and more give
the cost per running sequence (on top of ``fixed_s``), prefill rows the cost per prompt token and,
through their attention's quadratic growth, per attention FLOP, and decode rows after longer
prompts the cost of reading more KV.

``per_added_sequence_s`` is what each decode sequence beyond the first adds on top of
``per_sequence_s``. A lone sequence multiplies the weights by a vector; two or more multiply
them by a matrix, which is a different kernel and need not cost the same per row. On the tiny
test model's llama.cpp server (one CPU thread) a second sequence added 2.3 ms to a 1.2 ms step
and each further one about 2 ms, a line whose intercept is negative: without this term the fit
split the difference and priced a step of four sequences 34 % under its measured row (bench/README.md,
"The llama.cpp loop", 2026-12-02). Where the batch costs grow linearly from the first sequence
the fit leaves it at zero. A prompt that joins an iteration whole
(llama.cpp takes up to ``--batch-size`` tokens of it at once) adds its full prefill to that
iteration, stalling every decode in it; the schedulers of :mod:`apmw.sim` and
:mod:`apmw.capacity` decide what an iteration carries, this only prices it.

Nothing here is a spec-sheet figure: weight and KV bytes and the compute-bound share (for power)
are the replica's :class:`~apmw.perf.step.RooflineFigures`, the seconds are the server's.
``fit_report`` says how closely the line reproduces each measured row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from apmw.errors import ApmwError
from apmw.perf.step import IterationLoad, RooflineFigures

# The coefficients, in the order of the module docstring's formula.
TERMS = ("fixed_s", "per_sequence_s", "per_added_sequence_s", "per_prefill_token_s", "per_kv_byte_s",
         "per_attention_flop_s")


def _features(load: IterationLoad) -> list[np.ndarray]:
    """The load's terms in TERMS order, broadcast to one shape (1 for the fixed cost)."""
    seqs, prefill, kv, attention = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (
        load.decode_seqs, load.prefill_tokens, load.kv_read_bytes, load.attention_flops)))
    return [np.ones_like(seqs), seqs, np.maximum(seqs - 1.0, 0.0), prefill, kv, attention]


@dataclass(frozen=True)
class MeasuredStepModel(RooflineFigures):
    """One iteration priced by the line through a server's measured rows (module docstring)."""

    coefficients: tuple[float, ...] = (0.0,) * len(TERMS)
    origin: str = ""                 # where the rows were measured (endpoint, time)
    fit_report: str = ""             # how closely the line reproduces them

    @classmethod
    def fit(cls, figures: RooflineFigures, loads: list[IterationLoad], times_s: np.ndarray, origin: str
            ) -> "MeasuredStepModel":
        """The non-negative least-squares line through ``loads`` and their measured ``times_s``."""
        from scipy.optimize import nnls

        times = np.asarray(times_s, dtype=float)
        if len(loads) != len(times) or len(times) < len(TERMS) or not (times > 0).all():
            raise ApmwError(f"a measured step model needs at least {len(TERMS)} rows with positive times "
                            f"(got {len(times)}); measure again with apmw bench --calibrate")
        a = np.array([[float(f) for f in _features(ld)] for ld in loads])
        scale = a.max(axis=0)
        scale[scale == 0] = 1.0
        x, _ = nnls(a / scale / times[:, None], np.ones(len(times)))
        coef = tuple(float(v) for v in x / scale)
        predicted = a @ np.array(coef)
        err = predicted / times - 1.0
        report = (f"{len(times)} rows, rms error {np.sqrt(np.mean(err ** 2)):.1%}, worst {np.max(np.abs(err)):.1%}; "
                  + ", ".join(f"{n} {v:.3g}" for n, v in zip(TERMS, coef)))
        return cls(arch=figures.arch, gpu=figures.gpu, gpus=figures.gpus, weight_dtype=figures.weight_dtype,
                   kv_dtype=figures.kv_dtype, efficiency=figures.efficiency,
                   layout=figures.layout, coefficients=coef, origin=origin,
                   fit_report=report)

    @property
    def source(self) -> str:
        return "measured"

    @property
    def source_detail(self) -> str:
        return f"measured on {self.origin}: {self.fit_report}"

    def iteration_time_s(self, load: IterationLoad) -> np.ndarray:
        """Seconds for one engine iteration carrying ``load``."""
        return sum(c * f for c, f in zip(self.coefficients, _features(load)))
