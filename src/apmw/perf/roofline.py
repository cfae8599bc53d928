"""The plain roofline estimator: one iteration's time from spec sheets and fitted efficiencies.

    t = fixed + comm + max(memory_s, compute_s as served) + GEMM launches x gemm_launch_s

(:class:`apmw.perf.step.RooflineFigures` gives the terms). The fixed cost, bandwidth and FLOP
efficiencies are :class:`apmw.perf.efficiency.Efficiency`'s, each with its provenance; the
served MoE ceiling holds routed-expert GEMMs to what served engines reach. Used where no
measured table covers the replica and no measured relative scales to it
(:func:`apmw.perf.replica.build_step_model`), or when asked for (``calibrated=False``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from apmw.perf.step import IterationLoad, RooflineFigures


@dataclass(frozen=True)
class RooflineStepModel(RooflineFigures):
    """One iteration at the roofline: the larger of its memory and compute terms, plus fixed costs."""

    @property
    def source(self) -> str:
        return "roofline"

    @property
    def source_detail(self) -> str:
        served = f"; {self.served_moe.source}" if self.served_moe is not None else ""
        exchange = f"; {self.moe_exchange_source}" if self.moe_exchange_source else ""
        return f"roofline: {self.efficiency.source}{served}{exchange}"

    @property
    def launch_s(self) -> float:
        """Seconds of GEMM launches in one step (:attr:`gemm_launches` x ``Efficiency.gemm_launch_s``)."""
        return self.gemm_launches * self.efficiency.gemm_launch_s

    def iteration_time_s(self, load: IterationLoad) -> np.ndarray:
        """Seconds for one engine iteration carrying ``load``."""
        return self._iteration_time_of(load, self._terms(load))

    def time_and_compute_share(self, load: IterationLoad) -> tuple[np.ndarray, np.ndarray]:
        """(:meth:`iteration_time_s`, :meth:`compute_share`), the roofline's terms priced once for both."""
        terms = self._terms(load)
        return self._iteration_time_of(load, terms), self._compute_share_of(terms)

    def _iteration_time_of(self, load: IterationLoad, terms: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
        tokens = np.asarray(load.decode_seqs, dtype=float) + np.asarray(load.prefill_tokens, dtype=float)
        memory_s, compute_s, served_extra = terms
        kernels = np.maximum(memory_s, compute_s + served_extra) + self.launch_s
        return self.efficiency.fixed_s + self.comm_time_s(tokens) + np.maximum(kernels, self.overlapped_comm_s(tokens))
