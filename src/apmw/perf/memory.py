"""How much KV cache a replica can hold (MODEL.md section 3).

    M_kv = g * HBM * kv_memory_fraction - weight_bytes - g * workspace_bytes

``kv_memory_fraction`` is vLLM's ``gpu_memory_utilization``: the share of HBM the
engine may use for weights, activations and KV together.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MemoryBudget:
    hbm_bytes: float
    usable_bytes: float
    weight_bytes: float
    workspace_bytes: float
    kv_capacity_bytes: float

    @property
    def fits(self) -> bool:
        return self.kv_capacity_bytes > 0


def memory_budget(hbm_bytes_per_gpu: float, gpus: int, kv_memory_fraction: float, weight_bytes: float,
                  workspace_bytes_per_gpu: float) -> MemoryBudget:
    usable = gpus * hbm_bytes_per_gpu * kv_memory_fraction
    workspace = gpus * workspace_bytes_per_gpu
    return MemoryBudget(
        hbm_bytes=gpus * hbm_bytes_per_gpu,
        usable_bytes=usable,
        weight_bytes=weight_bytes,
        workspace_bytes=workspace,
        kv_capacity_bytes=usable - weight_bytes - workspace,
    )
