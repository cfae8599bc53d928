"""The per-GPU link a group of GPUs communicates over: the scale-up domain's, or the scale-out network's.

A collective among GPUs that all sit in one scale-up domain (NVLink on an HGX node of 8, or an NVL72
rack of 72; Infinity Fabric on an MI platform of 8) runs at the GPU's scale-up bandwidth; a group
larger than the domain crosses the scale-out network (the NICs, one or more per GPU), whose per-GPU
bandwidth is far lower. A ring or an all-to-all is paced by its slowest hop, so the whole collective
runs at the scale-out figure. The domain size and NICs are the system's the GPU ships in
(:mod:`apmw.catalog.systems`); the scale-up figure is the GPU's own, so a spec that overrides it wins.
"""

from __future__ import annotations

from apmw.catalog.gpus import GpuSpec
from apmw.catalog.systems import SystemSpec, system_for_gpu
from apmw.errors import UnknownNameError

# A custom GPU, or one no catalogued system holds: an HGX-style board of 8 with one 400 Gb/s NIC per
# GPU (ConnectX-7 on HGX H100/H200; aiconfigurator systems/h200_sxm.yaml inter_node_bw 50 GB/s).
DEFAULT_SCALEUP_DOMAIN_GPUS = 8
DEFAULT_SCALEOUT_BW_BYTES_PER_S = 50e9


def _system(gpu: GpuSpec) -> SystemSpec | None:
    try:
        return system_for_gpu(gpu.name)
    except UnknownNameError:
        return None


def scaleup_domain_gpus(gpu: GpuSpec) -> int:
    """GPUs that share the scale-up fabric with ``gpu``: its system's domain (8, or 72 on NVL72)."""
    system = _system(gpu)
    return system.scaleup_domain_gpus if system else DEFAULT_SCALEUP_DOMAIN_GPUS


def link_bandwidth_bytes_per_s(gpu: GpuSpec, gpus: int) -> float:
    """Per-GPU, per-direction bandwidth a group of ``gpus`` GPUs communicates at."""
    if gpus <= scaleup_domain_gpus(gpu):
        return gpu.scaleup_bw_bytes_per_s
    system = _system(gpu)
    scaleout = system.scaleout_bw_bytes_per_s_per_gpu if system else DEFAULT_SCALEOUT_BW_BYTES_PER_S
    return min(scaleout, gpu.scaleup_bw_bytes_per_s)
