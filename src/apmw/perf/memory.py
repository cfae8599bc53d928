"""How much KV cache a replica can hold (MODEL.md section 3).

    M_kv = g * HBM * kv_memory_fraction - weight_bytes - g * workspace_bytes

``kv_memory_fraction`` is vLLM's ``gpu_memory_utilization``: the share of HBM the
engine may use for weights, activations and KV together. TensorRT-LLM instead gives the
KV pool a share of the memory left after weights and activations
(``KvCacheConfig.free_gpu_memory_fraction``, TensorRT-LLM docs "How to Change KV Cache
Behavior"): ``fraction_of_free=True``,

    M_kv = kv_memory_fraction * (g * HBM - weight_bytes - g * workspace_bytes)

Drafting with the model's own multi-token-prediction modules adds their weights to ``weight_bytes``
and gives their KV cache a share of the pool: the engines size the draft's cache in as many tokens
as the target's (SGLang's draft runner gets the target's ``max_total_num_tokens`` as its
``draft_runner_cache_size``; vLLM sizes one block table over every attention layer, the draft's
included), so a token costs ``kv_bytes_per_token + draft_kv_bytes_per_token`` of the pool and the
target's share is ``kv_bytes_per_token`` of that.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MemoryBudget:
    hbm_bytes: float
    usable_bytes: float
    weight_bytes: float
    workspace_bytes: float
    kv_capacity_bytes: float          # the target model's KV pool (the draft's share taken out)
    draft_weight_bytes: float = 0.0   # the MTP modules' weights, held beside weight_bytes
    draft_kv_bytes: float = 0.0       # the MTP modules' share of the KV pool

    @property
    def fits(self) -> bool:
        return self.kv_capacity_bytes > 0


def memory_budget(hbm_bytes_per_gpu: float, gpus: int, kv_memory_fraction: float, weight_bytes: float,
                  workspace_bytes_per_gpu: float, fraction_of_free: bool = False, draft_weight_bytes: float = 0.0,
                  draft_kv_bytes_per_token: float = 0.0, kv_bytes_per_token: float = 1.0) -> MemoryBudget:
    """The budget (module docstring); a draft's figures split the pool by the bytes a token costs each."""
    hbm = gpus * hbm_bytes_per_gpu
    workspace = gpus * workspace_bytes_per_gpu
    held = weight_bytes + draft_weight_bytes
    if fraction_of_free:
        pool = kv_memory_fraction * (hbm - held - workspace)
        usable = pool + held + workspace
    else:
        usable = hbm * kv_memory_fraction
        pool = usable - held - workspace
    draft_kv = pool * draft_kv_bytes_per_token / (kv_bytes_per_token + draft_kv_bytes_per_token)
    return MemoryBudget(hbm_bytes=hbm, usable_bytes=usable, weight_bytes=weight_bytes,
                        workspace_bytes=workspace, kv_capacity_bytes=pool - draft_kv,
                        draft_weight_bytes=draft_weight_bytes, draft_kv_bytes=draft_kv)
