"""How much KV cache a replica can hold (MODEL.md section 3).

    M_kv = g * HBM * kv_memory_fraction - weight_bytes - g * workspace_bytes

``kv_memory_fraction`` is vLLM's ``gpu_memory_utilization``: the share of HBM the
engine may use for weights, activations and KV together. TensorRT-LLM instead gives the
KV pool a share of the memory left after weights and activations
(``KvCacheConfig.free_gpu_memory_fraction``, TensorRT-LLM docs "How to Change KV Cache
Behavior"): ``fraction_of_free=True``,

    M_kv = kv_memory_fraction * (g * HBM - weight_bytes - g * workspace_bytes)
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
                  workspace_bytes_per_gpu: float, fraction_of_free: bool = False) -> MemoryBudget:
    hbm = gpus * hbm_bytes_per_gpu
    workspace = gpus * workspace_bytes_per_gpu
    if fraction_of_free:
        kv = kv_memory_fraction * (hbm - weight_bytes - workspace)
        usable = kv + weight_bytes + workspace
    else:
        usable = hbm * kv_memory_fraction
        kv = usable - weight_bytes - workspace
    return MemoryBudget(hbm_bytes=hbm, usable_bytes=usable, weight_bytes=weight_bytes,
                        workspace_bytes=workspace, kv_capacity_bytes=kv)
