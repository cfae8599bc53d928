"""Power drawn by a replica as a function of how busy its engine is (MODEL.md section 6).

    P_gpu = P_idle + (P_busy - P_idle) * utilisation

``utilisation`` is the fraction of wall-clock time the engine is running
iterations. P_idle and P_busy come from the GPU catalogue (each with its cited
source) or the spec's ``power`` section. The calibration issue refines "busy" by
phase (decode draws well below TDP on H200, prefill closer to it).
"""

from __future__ import annotations


def gpu_power_w(idle_w: float, busy_w: float, utilisation: float) -> float:
    u = min(max(utilisation, 0.0), 1.0)
    return idle_w + (busy_w - idle_w) * u
