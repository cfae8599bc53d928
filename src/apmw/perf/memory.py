"""How much KV cache a replica can hold (MODEL.md section 3).

    M_kv = g * HBM * kv_memory_fraction - weight_bytes - g * workspace_bytes

``kv_memory_fraction`` is vLLM's ``gpu_memory_utilization``: the share of HBM the
engine may use for weights, activations and KV together. TensorRT-LLM instead gives the
KV pool a share of the memory left after weights and activations
(``KvCacheConfig.free_gpu_memory_fraction``, TensorRT-LLM docs "How to Change KV Cache
Behavior"): ``fraction_of_free=True``,

    M_kv = kv_memory_fraction * (g * HBM - weight_bytes - g * workspace_bytes)

Drafting (the model's own multi-token-prediction modules, or a named draft model) holds the draft's
weights, and its KV cache in as many tokens as the target's (SGLang gives its draft runner the target's
``max_total_num_tokens`` as its ``draft_runner_cache_size``; vLLM sizes one block table over every
attention layer, the draft's included). Where the draft's memory comes from depends on the engine
(:func:`apmw.perf.serving_policy.draft_outside_share`):

* vLLM and TensorRT-LLM size one pool after every weight, the draft's included, so the pool loses the
  draft's weights, and a token costs ``kv_bytes_per_token + draft_kv_bytes_per_token`` of it: the
  target's share is ``kv_bytes_per_token`` of that;
* SGLang sizes the target's pool alone, inside its share, and the draft's weights and cache take the
  memory outside it (``1 - kv_memory_fraction`` of the HBM), which must hold them
  (:attr:`MemoryBudget.draft_fits`).
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
    draft_weight_bytes: float = 0.0   # the draft's weights, held beside weight_bytes
    draft_kv_bytes: float = 0.0       # the draft's KV cache, in as many tokens as the target's pool
    draft_outside_share: bool = False  # both held outside the memory share (SGLang), not in the pool

    @property
    def fits(self) -> bool:
        return self.kv_capacity_bytes > 0

    @property
    def draft_fits(self) -> bool:
        """Whether a draft held outside the memory share fits in the memory left outside it."""
        return not self.draft_outside_share or self.draft_weight_bytes + self.draft_kv_bytes <= self.hbm_bytes - self.usable_bytes


def memory_budget(hbm_bytes_per_gpu: float, gpus: int, kv_memory_fraction: float, weight_bytes: float,
                  workspace_bytes_per_gpu: float, fraction_of_free: bool = False, draft_weight_bytes: float = 0.0,
                  draft_kv_bytes_per_token: float = 0.0, kv_bytes_per_token: float = 1.0,
                  draft_outside_share: bool = False) -> MemoryBudget:
    """The budget (module docstring): a draft's weights and KV (``draft_kv_bytes_per_token`` beside the target's
    ``kv_bytes_per_token``) in the pool, or outside the share where ``draft_outside_share``."""
    hbm = gpus * hbm_bytes_per_gpu
    workspace = gpus * workspace_bytes_per_gpu
    held = weight_bytes + (0.0 if draft_outside_share else draft_weight_bytes)
    if fraction_of_free:
        pool = kv_memory_fraction * (hbm - held - workspace)
        usable = pool + held + workspace
    else:
        usable = hbm * kv_memory_fraction
        pool = usable - held - workspace
    draft_kv = 0.0
    if draft_kv_bytes_per_token:
        tokens_cost = kv_bytes_per_token if draft_outside_share else kv_bytes_per_token + draft_kv_bytes_per_token
        draft_kv = pool * draft_kv_bytes_per_token / tokens_cost
    target = pool if draft_outside_share else pool - draft_kv
    return MemoryBudget(hbm_bytes=hbm, usable_bytes=usable, weight_bytes=weight_bytes, workspace_bytes=workspace,
                        kv_capacity_bytes=target, draft_weight_bytes=draft_weight_bytes, draft_kv_bytes=draft_kv,
                        draft_outside_share=draft_outside_share)
