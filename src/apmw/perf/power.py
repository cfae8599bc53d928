"""Power drawn by a replica as a function of how busy its engine is (MODEL.md section 6).

    P_gpu = P_idle + (P_busy - P_idle) * utilisation
    (phase-aware: utilisation * (0.33 + 0.67 * compute-bound share), see activity_power_w)

``utilisation`` is the fraction of wall-clock time the engine is running
iterations. P_idle and P_busy come from the GPU catalogue (each with its cited
source) or the spec's ``power`` section. The calibration issue refines "busy" by
phase (decode draws well below TDP on H200, prefill closer to it).
"""

from __future__ import annotations

import numpy as np

# Share of the idle-to-busy range a GPU draws when it is busy but memory-bound (decode at
# small batch): ML.ENERGY v3 measures an H100 at ~300 W decoding at batch 1 and ~600 W at
# batch 128 (catalog gpus.csv power_source); with idle 105 W and TDP 700 W,
# (300 - 105) / (700 - 105) = 0.33. Fully compute-bound work (prefill) is taken to draw
# the busy figure. Between the two, draw rises with the compute-bound share of the time.
MEMORY_BOUND_ACTIVITY = 0.33
# Host share of a node's wall power (CPUs, DRAM, NICs, fans, PSU loss) per 8-GPU node.
# ASSUMPTION: 1.0 kW; validated only against MLPerf node power (docs/accuracy.md).
HOST_W_PER_8_GPU_NODE = 1000.0


def gpu_power_w(idle_w: float, busy_w: float, utilisation: float) -> float:
    u = min(max(utilisation, 0.0), 1.0)
    return idle_w + (busy_w - idle_w) * u


def activity_power_w(idle_w: float, busy_w: float, utilisation, compute_share):
    """GPU power by phase: memory-bound work draws 33% of the idle-to-busy range, compute-bound all of it.

    ``compute_share`` is the fraction of busy time the roofline calls compute-bound
    (0 for small-batch decode, 1 for large prefill chunks); vectorised.
    """
    u = np.clip(np.asarray(utilisation, dtype=float), 0.0, 1.0)
    c = np.clip(np.asarray(compute_share, dtype=float), 0.0, 1.0)
    return idle_w + (busy_w - idle_w) * u * (MEMORY_BOUND_ACTIVITY + (1 - MEMORY_BOUND_ACTIVITY) * c)


def node_power_w(gpus: int, gpu_w, host_w_per_8_gpus: float = HOST_W_PER_8_GPU_NODE):
    """Wall power of the nodes holding ``gpus`` GPUs: the GPUs plus the host share."""
    return gpus * np.asarray(gpu_w, dtype=float) + host_w_per_8_gpus * gpus / 8
