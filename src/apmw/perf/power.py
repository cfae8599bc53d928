"""Power drawn by a replica at an operating point (MODEL.md section 6): the one power formula.

    P_gpu       = P_idle + (P_busy - P_idle) * utilisation * (0.33 + 0.67 * compute-bound share)
    P_replica   = sum over the replica's GPU groups of g * P_gpu  +  g_all * P_host   (modelled IT)
    P_facility  = P_replica * PUE
    provisioned = g_all * provisioned_kw_per_gpu                       (all-in, if given)
                = g_all * (TDP + P_host_nameplate) * PUE               (otherwise)

where the host nameplate per GPU is the spec's ``power.host_nameplate_w_per_gpu`` if set, else the
all-in power of the system the GPU ships in over its GPUs, less the GPU's TDP
(:mod:`apmw.catalog.systems`: a DGX H200's 10.2 kW, a GB300 NVL72 rack's 142 kW), else the spec's
default (the DGX H100's share).

``utilisation`` is the fraction of wall-clock time the engine is running iterations and
the compute-bound share the part of that time the roofline calls compute-bound. P_idle,
P_busy and TDP come from the GPU catalogue (each with its cited source) or the spec's
``power`` section; the host figures are ``apmw.spec.Power``'s. ``apmw plan`` (economics),
``apmw simulate`` and ``apmw predict`` all call :meth:`PowerModel.it_power_w`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from apmw.catalog.gpus import GpuSpec
from apmw.catalog.systems import system_for_gpu
from apmw.errors import FieldRefusal, UnknownNameError
from apmw.spec import Power

# Share of the idle-to-busy range a GPU draws when it is busy but memory-bound (decode at
# small batch): ML.ENERGY v3 measures an H100 at ~300 W decoding at batch 1 and ~600 W at
# batch 128 (catalog gpus.csv power_source); with idle 105 W and TDP 700 W,
# (300 - 105) / (700 - 105) = 0.33. Fully compute-bound work (prefill) is taken to draw
# the busy figure. Between the two, draw rises with the compute-bound share of the time.
MEMORY_BOUND_ACTIVITY = 0.33


def activity_power_w(idle_w: float, busy_w: float, utilisation, compute_share):
    """GPU power by phase: memory-bound work draws 33% of the idle-to-busy range, compute-bound all of it.

    ``compute_share`` is the fraction of busy time the roofline calls compute-bound
    (0 for small-batch decode, 1 for large prefill chunks); vectorised.
    """
    u = np.clip(np.asarray(utilisation, dtype=float), 0.0, 1.0)
    c = np.clip(np.asarray(compute_share, dtype=float), 0.0, 1.0)
    return idle_w + (busy_w - idle_w) * u * (MEMORY_BOUND_ACTIVITY + (1 - MEMORY_BOUND_ACTIVITY) * c)


@dataclass(frozen=True)
class GpuGroup:
    """GPUs of one replica that share an operating point (the decode replica, a prefill instance)."""

    gpus: float
    utilisation: float        # share of wall-clock time busy
    compute_share: float      # compute-bound share of the busy time


@dataclass(frozen=True)
class PowerModel:
    """Per-GPU power figures of a replica and the facility's; watts."""

    gpu_idle_w: float
    gpu_busy_w: float
    gpu_tdp_w: float
    host_w_per_gpu: float
    host_nameplate_w_per_gpu: float
    pue: float
    provisioned_kw_per_gpu: float | None
    nameplate_source: str = "apmw.spec.Power.host_nameplate_w_per_gpu"

    @classmethod
    def of(cls, gpu: GpuSpec, power: Power | None = None) -> "PowerModel":
        """The GPU's catalogue figures with the spec's ``power`` section over them (defaults: ``Power()``)."""
        p = Power() if power is None else power
        nameplate, source = p.host_nameplate_w_per_gpu, "spec power.host_nameplate_w_per_gpu"
        if "host_nameplate_w_per_gpu" not in p.model_fields_set:
            nameplate, source = _system_host_nameplate(gpu, nameplate)
        idle = gpu.idle_power_w if p.gpu_idle_power_w is None else p.gpu_idle_power_w
        busy = gpu.busy_power_w if p.gpu_busy_power_w is None else p.gpu_busy_power_w
        if idle > busy:
            said = lambda field: "power." + field if getattr(p, field) is not None else f"{gpu.name}'s"  # noqa: E731
            given = "power.gpu_idle_power_w" if p.gpu_idle_power_w is not None else "power.gpu_busy_power_w"
            raise FieldRefusal(f"the GPU's idle draw ({idle:g} W, {said('gpu_idle_power_w')}) exceeds its busy draw "
                               f"({busy:g} W, {said('gpu_busy_power_w')}); a GPU draws at least as much busy as "
                               "idle, so give an idle figure at most the busy one", given)
        model = cls(gpu_idle_w=idle, gpu_busy_w=busy,
                    gpu_tdp_w=gpu.tdp_w, host_w_per_gpu=p.host_power_w_per_gpu,
                    host_nameplate_w_per_gpu=nameplate, pue=p.pue,
                    provisioned_kw_per_gpu=p.provisioned_kw_per_gpu, nameplate_source=source)
        model._check_budget_holds_the_draw(p)
        return model

    def _check_budget_holds_the_draw(self, p: Power) -> None:
        """Refuse a provisioned budget below what the model lets one GPU draw at full load (busy GPU and host, at
        the PUE): a facility provisions at least what it may draw, so such figures contradict each other and
        would price agents per provisioned MW above the modelled ones."""
        most_w = (self.gpu_busy_w + self.host_w_per_gpu) * self.pue
        budget_w = self.provisioned_power_w(1)
        if budget_w >= most_w:
            return
        how = (f"power.provisioned_kw_per_gpu {p.provisioned_kw_per_gpu:g} kW" if self.provisioned_kw_per_gpu is not None
               else f"(TDP {self.gpu_tdp_w:g} W + host nameplate {self.host_nameplate_w_per_gpu:g} W, "
                    f"{self.nameplate_source}) x PUE {self.pue:g}")
        raise FieldRefusal(f"power: the provisioned budget per GPU, {budget_w:,.0f} W ({how}), is below the most the "
                           f"model lets a GPU draw, {most_w:,.0f} W ((busy {self.gpu_busy_w:g} W + "
                           f"power.host_power_w_per_gpu {self.host_w_per_gpu:g} W) x PUE {self.pue:g}); a facility "
                           "provisions at least what it may draw: raise the budget "
                           + ("(power.provisioned_kw_per_gpu)" if self.provisioned_kw_per_gpu is not None
                              else "(power.host_nameplate_w_per_gpu)") + " or lower power.host_power_w_per_gpu",
                           "power.provisioned_kw_per_gpu" if self.provisioned_kw_per_gpu is not None else "power")

    def gpu_power_w(self, utilisation, compute_share):
        """One GPU's draw at an operating point (vectorised)."""
        return activity_power_w(self.gpu_idle_w, self.gpu_busy_w, utilisation, compute_share)

    def it_power_w(self, *groups: GpuGroup) -> float:
        """Modelled IT power of the replica's GPU groups plus their host share."""
        gpus = sum(g.gpus for g in groups)
        return float(sum(g.gpus * self.gpu_power_w(g.utilisation, g.compute_share) for g in groups)
                     + gpus * self.host_w_per_gpu)

    def facility_power_w(self, it_power_w: float) -> float:
        return it_power_w * self.pue

    def provisioned_power_w(self, gpus: float) -> float:
        """Nameplate facility power budgeted for ``gpus`` GPUs."""
        if self.provisioned_kw_per_gpu is not None:
            return gpus * self.provisioned_kw_per_gpu * 1000.0
        return gpus * (self.gpu_tdp_w + self.host_nameplate_w_per_gpu) * self.pue


def _system_host_nameplate(gpu: GpuSpec, default_w: float) -> tuple[float, str]:
    """(host nameplate W per GPU, its source): the system's all-in power per GPU less the GPU's TDP,
    where the GPU is a catalogue part that ships in a catalogued system; else ``default_w``."""
    try:
        system = system_for_gpu(gpu.name)
    except UnknownNameError:
        system = None
    if system is None or gpu.name == "custom":
        return default_w, "apmw.spec.Power.host_nameplate_w_per_gpu default (DGX H100)"
    per_gpu = system.power_w / system.gpus_per_system
    return max(per_gpu - gpu.tdp_w, 0.0), (f"{system.name}: {system.power_w / 1e3:,.1f} kW all-in / "
                                           f"{system.gpus_per_system} GPUs - {gpu.tdp_w:.0f} W TDP "
                                           f"({system.power_source})")
