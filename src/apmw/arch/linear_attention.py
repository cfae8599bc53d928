"""Gated DeltaNet linear attention (Qwen3-Next / Qwen3.5): per layer its parameters, fixed
per-sequence state and FLOPs per token."""

from __future__ import annotations

from dataclasses import dataclass

from apmw.arch.config import Cfg
from apmw.arch.dtypes import hf_dtype_bytes


@dataclass(frozen=True)
class _Linear:
    """Per-layer Gated DeltaNet (Qwen3-Next / Qwen3.5 linear attention)."""
    params: int
    state_bytes: float
    flops_per_token: int


NO_LINEAR = _Linear(params=0, state_bytes=0.0, flops_per_token=0)


def gated_deltanet(c: Cfg, hidden: int) -> _Linear:
    """Parameters and fixed per-sequence state of one Gated DeltaNet layer.

    State = recurrent matrix (value heads x key dim x value dim) at ``mamba_ssm_dtype``
    plus the causal-conv window ((kernel - 1) x conv channels) at the model dtype, as
    vLLM's mamba cache stores them. Per-token work is about 8 FLOPs per state element
    (decay, delta-rule rank-1 update, read-out).
    """
    why = "linear-attention (Gated DeltaNet) layers"
    nk = c.req("linear_num_key_heads", why)
    dk = c.req("linear_key_head_dim", why)
    nv = c.req("linear_num_value_heads", why)
    dv = c.req("linear_value_head_dim", why)
    kernel = c.req("linear_conv_kernel_dim", why)
    key_dim, value_dim = nk * dk, nv * dv
    conv_dim = 2 * key_dim + value_dim
    params = (hidden * (2 * key_dim + 2 * value_dim) + hidden * 2 * nv  # in_proj qkvz, ba
              + conv_dim * kernel + 2 * nv + dv + value_dim * hidden)    # conv, A/dt, norm, out
    dtype_field = "torch_dtype" if c.get("torch_dtype") is not None else "dtype"
    model_bytes = hf_dtype_bytes(c.get(dtype_field, "bfloat16"), dtype_field, c.name)
    ssm = c.get("mamba_ssm_dtype")
    ssm_bytes = model_bytes if ssm is None else hf_dtype_bytes(ssm, "mamba_ssm_dtype", c.name)
    state = nv * dk * dv * ssm_bytes + conv_dim * (kernel - 1) * model_bytes
    return _Linear(params=params, state_bytes=state, flops_per_token=8 * nv * dk * dv)
