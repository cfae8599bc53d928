"""Build the compact calibration tables shipped in ``apmw/catalog/data/calibration/``.

Reads aiconfigurator's measured kernel tables (``../shared/data/profiles/aiconfigurator/<gpu>/...``,
Apache-2.0): vLLM 0.24.0's on H100-SXM and H200-SXM (commit 095f58a5) and on B200, B300, GB200 and
GB300 (aiconfigurator-core 0.12.0), TensorRT-LLM 1.3.0rc20's on the four Blackwell systems and
SGLang 0.5.14's on all six, with SGLang's default kernel per table (``BUILDS``;
per engine the newest version holding all five table families, ``pick_version``), and writes one
``<gpu>.npz`` (vLLM) or ``<gpu>__<engine>.npz`` per (system, engine) holding, in seconds (the kernel
sources and prefill math dtype kept per engine: ``KERNEL_SOURCES``, ``CONTEXT_ATTN_DTYPE``):

* ``gemm_<dtype>[m, n, k]``: GEMM latency (bf16, per-tensor fp8) on the table's own
  (n, k) grid and a subset of its m grid (the multiples of 16 plus 1..16; the odd
  ``m = 16j + 1`` rows measure tile padding, which a per-iteration mean blurs anyway).
  Missing cells are filled by linear interpolation along m; then the least-squares
  monotone fit along m (isotonic regression) makes the table monotone (more tokens never
  faster) -- the script prints how many cells that touched and by how much. Measured
  decode-sized GEMMs scatter by a few % from one m to the next, and some kernels really do
  run faster at a larger m (vLLM's fp8 CUTLASS GEMM from m = 160 to 256); the fit averages
  both. A running maximum (used before session 7) carried every upward blip forward and set
  decode-sized GEMMs of model size a median 1-4 % and a mean 4-6 % above the measurements;
  the isotonic fit leaves them within 0.2 % (both printed as ``decode_sized_stored_over_measured``
  and ``same_with_a_running_maximum``);
* ``dec_<kvdtype>_<h>_<kvh>_<hd>[batch, step]``: decode (generation) attention per layer,
  full attention (window 0), median over the kernel sources measured, for every head
  configuration with head_dim 64 or 128 (the dense GQA models); past each batch size's
  longest measured context the time grows linearly with the context at the last measured
  marginal cost per KV token, never below the HBM peak (``_extrapolate_kv_reads``); monotone in both axes (isotonic along the context, then along the batch:
  the second fit keeps the first's order, because isotonic regression of elementwise larger
  data is elementwise larger);
* ``ctx_<kvdtype>_<h>_<kvh>_<hd>[isl]``: prefill (context) attention per layer at batch 1;
* ``ar_<g>[size]``: the engine's custom all-reduce (vLLM: under CUDA graphs, backend ``vllm_graph``;
  TensorRT-LLM: its own kernel, ``implementation == "trtllm"``), message size in elements of bf16;
* ``moe_<dtype>_<hidden>_<inter>_<topk>_<experts>_tp<tp>[tokens]``: one MoE layer's routed
  experts (vLLM fused-MoE kernels) for the model shapes aiconfigurator measured, tensor
  parallel only, power-law (1.01) routing skew;
* ``mladec_*``, ``mlactx_*``, ``mlabmm_*``: MLA attention kernels (DeepSeek, Kimi) where shipped
  (``MLA_BUILDS``, :func:`mla_tables`).

Usage: ``python scripts/build_calibration.py [--profiles ../shared/data/profiles] [--engine sglang]``
(needs the ``dev`` extra: pandas, pyarrow and scipy >= 1.12).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
from packaging.version import Version
from scipy.optimize import isotonic_regression

from apmw.catalog.gpus import get_gpu

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "apmw" / "catalog" / "data" / "calibration"
# aiconfigurator system -> catalogue GPU (apmw.perf.tables.CALIBRATED_GPUS reads the files back)
GPUS = {"h100_sxm": "H100-SXM5-80GB", "h200_sxm": "H200-SXM-141GB", "b200_sxm": "B200-SXM-180GB",
        "b300_sxm": "B300-SXM-288GB", "gb200": "GB200 (per GPU)", "gb300": "GB300 (per GPU)"}
# The (system, engine) table sets shipped. vLLM on every system; SGLang and TensorRT-LLM only where
# their kernels differ materially from vLLM's (see ENGINE_BUILDS' comment and SOURCES.md).
# TensorRT-LLM 1.3.0rc20 on the four Blackwell systems only. Its H100/H200 tables were built and
# left out: with them the held-out Hopper TensorRT-LLM rows got clearly worse (bench/accuracy.py, NIM
# Llama-3.1-8B H100 TPOT median |error| 5.8 -> 13.8 %, MLPerf Llama-2-70b H200 Offline throughput 5.7 -> 12.2 %):
# there its measured bf16 prefill attention is 1.2-1.5x FlashAttention 3's and its fp8 GEMM 1.1-1.3x
# vLLM's at decode sizes, on top of the per-layer overhead assumed for TensorRT-LLM (SOURCES.md).
# SGLang 0.5.14 on all six systems (SGLANG_KERNELS below says which of its measured kernels are kept).
BUILDS: list[tuple[str, str]] = [(gpu, "vllm") for gpu in GPUS] + [
    (gpu, "trtllm") for gpu in ("b200_sxm", "b300_sxm", "gb200", "gb300")] + [(gpu, "sglang") for gpu in GPUS]
# Per engine: the custom all-reduce rows to keep (column, value): CUDA-graph captured where the
# engine records both.
ALLREDUCE_ROWS = {"vllm": ("backend", "vllm_graph"), "sglang": ("backend", "sglang_graph"),
                  "trtllm": ("implementation", "trtllm")}
# Per engine and table: the kernel sources kept, in order of preference (per configuration the first one
# measured is used); an engine not listed keeps the median over every source measured (vLLM: FA3 and FA4
# prefill, its GEMM and MoE kernels). TensorRT-LLM: its default attention backend ("TRTLLM": XQA decode,
# its own FMHA prefill; aiconfigurator's "torch_flow"), not the optional FlashInfer backend; its default
# MoE backend (CUTLASS, "moe_torch_flow_cutlass"), then the only kernel measured for a dtype (DeepGEMM for
# fp8_block, "moe_torch_flow" for MXFP4); not the Llama-4-only min-latency MoE, and not the non-gated MoE
# kernels (apmw prices gated experts).
# SGLang (0.5.14 rows; the rules below are SGLang's own, sgl-project/sglang):
# * attention, decode and prefill: SGLang's default backend for an MHA/GQA model
#   (python/sglang/srt/server_args.py ``_get_default_attn_backend``, in later releases
#   python/sglang/srt/arg_groups/attention_hook.py): ``fa3`` on Hopper ("is_hopper_with_cuda_12_3"),
#   ``trtllm_mha`` on SM100 Blackwell (B200, B300, GB200, GB300); FlashInfer only elsewhere (Ampere,
#   Ada), Triton only for attention sinks. So the rows of aiconfigurator's "fa3" source (Hopper) or
#   "trtllm_mha" (Blackwell) -- each system has only one of them -- not its "flashinfer" or "triton"
#   rows (gpt-oss takes the same two: arg_groups/model_overrides/gpt_oss.py).
# * fused MoE: ``--moe-runner-backend auto`` resolves to the Triton fused-MoE kernel for bf16 and fp8
#   experts without DeepEP (python/sglang/srt/layers/quantization/fp8.py and unquant.py,
#   ``create_moe_runner``: "if moe_runner_backend.is_auto(): ... MoeRunnerBackend.TRITON"), so
#   "sglang_fused_moe_triton" where measured; NVFP4 and MXFP4 experts on Blackwell are measured with
#   FlashInfer's TensorRT-LLM MoE only ("sglang_flashinfer_trtllm_moe"; gpt-oss on SM100 defaults to
#   ``flashinfer_mxfp4``, gpt_oss.py), taken where Triton was not measured. Not the FlashInfer CUTLASS
#   or Marlin rows (opt-in runners).
# * GEMM: one kernel per dtype is measured (bf16 "sglang_torch_linear", per-tensor fp8
#   "sglang_sgl_kernel_fp8_scaled_mm" -- SGLang's default per-tensor fp8 linear on CUDA, nvfp4
#   "sglang_flashinfer_cutedsl_nvfp4"); the DeepGEMM fp8-block rows are not read (GEMM_DTYPES).
# * all-reduce: SGLang's custom all-reduce under CUDA graphs (ALLREDUCE_ROWS).
KERNEL_SOURCES: dict[str, dict[str, tuple[str, ...]]] = {
    "trtllm": {"generation_attention_perf": ("torch_flow",), "context_attention_perf": ("torch_flow",),
               "moe_perf": ("moe_torch_flow_cutlass", "moe_torch_flow", "deepgemm")},
    "sglang": {"generation_attention_perf": ("fa3", "trtllm_mha"), "context_attention_perf": ("fa3", "trtllm_mha"),
               "moe_perf": ("sglang_fused_moe_triton", "sglang_flashinfer_trtllm_moe"),
               # GEMM and all-reduce rows are selected by dtype (GEMM_DTYPES) and ALLREDUCE_ROWS; listed
               # here so each file's meta "kernels" names only the kernels its tables hold
               "gemm_perf": ("sglang_torch_linear", "sglang_sgl_kernel_fp8_scaled_mm",
                             "sglang_flashinfer_cutedsl_nvfp4"),
               "custom_allreduce_perf": ("SGLang_CustomAllReduce_graph",)}}
# Per engine: the prefill-attention math dtype read for each KV dtype (None: every row, the vLLM tables
# measure bf16 math only). TensorRT-LLM runs its context FMHA in fp8 when the KV cache is fp8 and the
# context FMHA is paged (TensorRT-LLM cpp/tensorrt_llm/thop/attentionOp.cpp: mFP8ContextFMHA =
# is_fp8_out || is_fp4_out || (hasFp8KvCache() && use_paged_context_fmha); paged context FMHA comes with
# KV block reuse and chunked prefill, both on by default in its PyTorch backend).
# SGLang's fa3 and trtllm_mha prefill rows are measured only so (bf16 math for a bf16 KV cache, fp8 math
# for an fp8 one); the rule is written out so a later database with both cannot mix them.
CONTEXT_ATTN_DTYPE: dict[str, dict[str, str]] = {"trtllm": {"bfloat16": "bfloat16", "fp8": "fp8"},
                                                 "sglang": {"bfloat16": "bfloat16", "fp8": "fp8"}}
# The table files apmw composes; an engine version must hold all of them to be picked.
REQUIRED = ("gemm/{fw}/{v}/gemm_perf.parquet", "attention/{fw}/{v}/generation_attention_perf.parquet",
            "attention/{fw}/{v}/context_attention_perf.parquet", "moe/{fw}/{v}/moe_perf.parquet",
            "comm/{fw}/{v}/custom_allreduce_perf.parquet")
# nvfp4: NVFP4 weights and activations (W4A4, 16-element blocks with fp8 scales), Blackwell only
# (vLLM's FlashInferCuteDslNvFp4LinearKernel on B200)
GEMM_DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "nvfp4": "nvfp4"}
KV_DTYPES = {"bfloat16": "bf16", "fp8": "fp8"}
KV_BYTES = {"bf16": 2, "fp8": 1}
HEAD_DIMS = (64, 128)
MS = 1e-3
SOURCE = ("ai-dynamo/aiconfigurator@095f58a51c4ca8e61b66ec108d86f223f8d559ce "
          "aic-core/src/aiconfigurator_core/systems/data/<gpu>/ (vLLM 0.24.0), Apache-2.0")
# the Blackwell systems' tables came with the whole database of aiconfigurator-core 0.12.0
# (../shared/data/README.md, "profiles/aiconfigurator/")
SOURCE_012 = "aiconfigurator-core 0.12.0 (ai-dynamo/aiconfigurator) systems/data/<gpu>/ (<engine>), Apache-2.0"


def stem(gpu: str, engine: str) -> str:
    """The file name of a (system, engine) table set: ``b200_sxm`` for vLLM, ``b200_sxm__sglang``."""
    return gpu if engine == "vllm" else f"{gpu}__{engine}"


def pick_version(base: Path, engine: str) -> str:
    """The newest version of ``engine`` on this system whose directory holds every table apmw composes."""
    versions = {d.name for d in (base / "gemm" / engine).iterdir() if d.is_dir()}
    full = [v for v in versions if all((base / f.format(fw=engine, v=v)).exists() for f in REQUIRED)]
    if not full:
        raise FileNotFoundError(f"{base.name}/{engine}: no version holds {REQUIRED}")
    return max(full, key=Version)


def _filled(a: np.ndarray, axis: int) -> np.ndarray:
    """NaNs along ``axis`` filled by linear interpolation (edge: nearest); all-NaN rows stay NaN."""
    a = np.moveaxis(a.copy(), axis, -1)
    idx = np.arange(a.shape[-1])
    flat = a.reshape(-1, a.shape[-1])
    for row in flat:
        ok = ~np.isnan(row)
        if ok.any():
            row[~ok] = np.interp(idx[~ok], idx[ok], row[ok])
    return np.moveaxis(flat.reshape(a.shape), -1, axis)


def _fill_and_monotone(a: np.ndarray, axis: int) -> tuple[np.ndarray, int, float]:
    """Fill NaNs along ``axis`` (:func:`_filled`), then fit monotone along it.

    The fit is isotonic regression (pool adjacent violators): where the measurements
    already rise it keeps them exactly, and a run that dips is replaced by its mean, so
    measurement scatter moves the table neither up nor down. Returns the table, how many
    cells the fit changed and the largest relative change.
    """
    filled = np.moveaxis(_filled(a, axis), axis, -1)
    flat = filled.reshape(-1, filled.shape[-1])
    mono = flat.copy()
    for i, row in enumerate(flat):
        if not np.isnan(row).any():
            mono[i] = isotonic_regression(row).x
    moved = np.abs(mono / flat - 1.0)
    changed = int((moved > 1e-9).sum())
    worst = float(np.nanmax(moved)) if changed else 0.0
    return np.moveaxis(mono.reshape(filled.shape), -1, axis), changed, worst


def _running_max(a: np.ndarray, axis: int) -> np.ndarray:
    """Make ``a`` non-decreasing along ``axis`` (keeps it monotone along the other axes)."""
    return np.maximum.accumulate(a, axis=axis)


def gemm_tables(path: Path, report: dict) -> dict[str, np.ndarray]:
    g = pd.read_parquet(path)
    m_all = np.sort(g.m.unique())
    ms = np.array([m for m in m_all if m <= 16 or m % 16 == 0])
    ns, ks = _grid(g, "n"), _grid(g, "k")
    out = {"gemm_m": ms.astype(float), "gemm_n": ns.astype(float), "gemm_k": ks.astype(float)}
    for src, name in GEMM_DTYPES.items():
        if src not in set(g.gemm_dtype):
            continue            # nvfp4 is measured on Blackwell only
        d = g[(g.gemm_dtype == src) & g.m.isin(ms)].groupby(["m", "n", "k"]).latency.median()
        cube = d.reindex(pd.MultiIndex.from_product([ms, ns, ks])).to_numpy().reshape(len(ms), len(ns), len(ks))
        missing = np.isnan(cube)
        measured = cube.copy()
        cube, changed, worst = _fill_and_monotone(cube, axis=0)
        out[f"gemm_{name}"] = (cube * MS).astype(np.float32)
        # how far each way of making the table monotone leaves it from the measurements
        # (the running maximum is what the builder used before session 7)
        report[f"gemm_{name}"] = {"cells": int(cube.size),
                                  "missing_filled": int((missing & ~np.isnan(cube)).sum()),
                                  "unmeasured_left_empty": int(np.isnan(cube).sum()),
                                  "changed_by_monotone_fit": changed, "max_change": round(worst, 3),
                                  "decode_sized_stored_over_measured": _decode_bias(cube, measured, ms, ns, ks),
                                  "same_with_a_running_maximum": _decode_bias(
                                      _running_max(_filled(measured, axis=0), axis=0), measured, ms, ns, ks)}
    return out


def _grid(g: pd.DataFrame, axis: str) -> np.ndarray:
    """The GEMM table's n or k grid: the values of the regular (m, n, k) sweep, i.e. measured for bf16
    at least half as often as the most measured value. SGLang 0.5.14's B300 rows add spot checks at
    n = 1, 8 and 16 (74 bf16 rows each against 1628 for every grid value); as grid points they would
    leave whole (n, k) columns unmeasured, and bilinear interpolation at the next grid point multiplies
    that NaN by zero. No other table set has such values."""
    counts = g[g.gemm_dtype == "bfloat16"].groupby(axis).size()
    return np.sort(np.array([v for v, c in counts.items() if c >= 0.5 * counts.max()]))


def _decode_bias(table: np.ndarray, measured: np.ndarray, ms: np.ndarray, ns: np.ndarray,
                 ks: np.ndarray) -> dict[str, float]:
    """Median and mean of stored / measured over decode-sized rows (m <= 256) of model-sized
    GEMMs (n x k >= 4096^2): how far the monotone table sits from what was measured."""
    big = (ns[:, None] * ks[None, :]) >= 4096 ** 2
    ratio = (table / measured)[(ms <= 256)][:, big]
    ratio = ratio[np.isfinite(ratio)]
    return {"median": round(float(np.median(ratio)), 3), "mean": round(float(np.mean(ratio)), 3)}


def _preferred_source(d: pd.DataFrame, engine: str, table: str, by: list[str]) -> pd.DataFrame:
    """Only the rows of each configuration (``by``) measured with the engine's preferred kernel source
    (``KERNEL_SOURCES``); all rows for an engine without a preference."""
    prefs = KERNEL_SOURCES.get(engine, {}).get(table)
    if prefs is None:
        return d
    d = d[d.kernel_source.isin(prefs)]
    rank = d.kernel_source.map({k: i for i, k in enumerate(prefs)})
    best = rank.groupby([d[c] for c in by]).transform("min")
    return d[rank == best]


def attention_tables(gen_path: Path, ctx_path: Path, report: dict, hbm_bytes_per_s: float,
                     engine: str = "vllm") -> dict[str, np.ndarray]:
    gen = pd.read_parquet(gen_path)
    gen = gen[(gen.window_size == 0) & gen.head_dim.isin(HEAD_DIMS)]
    gen = _preferred_source(gen, engine, "generation_attention_perf",
                            ["num_heads", "num_key_value_heads", "head_dim", "kv_cache_dtype"])
    bs, steps = np.sort(gen.batch_size.unique()), np.sort(gen.step.unique())
    out = {"dec_batch": bs.astype(float), "dec_step": steps.astype(float)}
    fitted = extrapolated = 0
    measured = {}
    for (h, kvh, hd, kvd), grp in gen.groupby(["num_heads", "num_key_value_heads", "head_dim", "kv_cache_dtype"]):
        if kvd in KV_DTYPES:
            t = grp.groupby(["batch_size", "step"]).latency.median().unstack().reindex(index=bs, columns=steps)
            measured[(h, kvh, hd, kvd)] = t.to_numpy()
    # the marginal cost per KV token of each configuration measured past saturation; one that never
    # was (aiconfigurator stops 40-96-head configurations below it) takes that of its KV layout
    # (KV heads, head_dim, KV dtype): the KV read is the same whatever the query heads
    own = {key: _marginal_kv_read_ms(t, steps, bs.astype(float)) for key, t in measured.items()}
    by_layout: dict[tuple, list[float]] = {}
    for (h, kvh, hd, kvd), m in own.items():
        if m is not None:
            by_layout.setdefault((kvh, hd, kvd), []).append(m)
    for (h, kvh, hd, kvd), t in measured.items():
        if np.isnan(t).all(axis=1).any():
            t = _fill_rows(t)
        # K and V of every KV head, per token and layer
        kv_bytes = 2 * kvh * hd * KV_BYTES[KV_DTYPES[kvd]]
        layout = by_layout.get((kvh, hd, kvd))
        marginal = own[(h, kvh, hd, kvd)] or (float(np.median(layout)) if layout else None)
        t, n = _extrapolate_kv_reads(t, steps, bs.astype(float), marginal, kv_bytes, hbm_bytes_per_s * MS)
        extrapolated += n
        before = t.copy()
        t, _, _ = _fill_and_monotone(t, axis=1)
        t, _, _ = _fill_and_monotone(t, axis=0)
        # the batch-axis fit keeps the context-axis order (module docstring): check it
        assert (np.diff(t, axis=0) >= 0).all() and (np.diff(t, axis=1) >= 0).all()
        fitted += int((np.abs(t / before - 1.0) > 1e-9).sum())
        out[f"dec_{KV_DTYPES[kvd]}_{h}_{kvh}_{hd}"] = (t * MS).astype(np.float32)
    ctx = pd.read_parquet(ctx_path)
    ctx = ctx[(ctx.window_size == 0) & ctx.head_dim.isin(HEAD_DIMS) & (ctx.batch_size == 1)]
    ctx = _preferred_source(ctx, engine, "context_attention_perf",
                            ["num_heads", "num_key_value_heads", "head_dim", "kv_cache_dtype"])
    math_dtype = CONTEXT_ATTN_DTYPE.get(engine)
    if math_dtype is not None:
        ctx = ctx[ctx.attn_dtype == ctx.kv_cache_dtype.map(math_dtype)]
    isl = np.sort(ctx.isl.unique())
    out["ctx_isl"] = isl.astype(float)
    for (h, kvh, hd, kvd), grp in ctx.groupby(["num_heads", "num_key_value_heads", "head_dim", "kv_cache_dtype"]):
        if kvd not in KV_DTYPES:
            continue
        t = grp.groupby("isl").latency.median().reindex(isl).to_numpy()[None, :]
        t, _, _ = _fill_and_monotone(t, axis=1)
        out[f"ctx_{KV_DTYPES[kvd]}_{h}_{kvh}_{hd}"] = (t[0] * MS).astype(np.float32)
    report["attention"] = {"decode_configs": sum(k.startswith("dec_") for k in out) - 2,
                           "prefill_configs": sum(k.startswith("ctx_") for k in out) - 1,
                           "decode_cells_changed_by_monotone_fit": fitted,
                           "decode_cells_extrapolated_beyond_measured_context": extrapolated}
    return out


# KV tokens (batch x context) past which a decode-attention measurement saturates the GPU (the
# tables reach 2^19 - batch at most, so about 524k: batch 8 at context 65535 ... batch 128 at 4095); there
# the marginal cost per KV token is the same at every batch size (H200, fp8 KV, 32/8 heads:
# 0.613-0.646 ns a token at batch 8-128; bf16 0.834-0.858, the HBM peak), while slopes taken
# at shorter contexts scatter from 0.13 to 0.99 ns (generation_attention_perf.parquet).
SATURATED_KV_TOKENS = 500_000


def _marginal_kv_read_ms(t: np.ndarray, steps: np.ndarray, batches: np.ndarray) -> float | None:
    """Milliseconds per further KV token of one decode-attention configuration: the median of the
    slopes between the last two measured contexts of the batch sizes measured past
    ``SATURATED_KV_TOKENS``; None when no batch size was."""
    slopes = []
    for row, b in zip(t, batches):
        ok = np.flatnonzero(~np.isnan(row))
        if len(ok) > 1 and b * steps[ok[-1]] >= SATURATED_KV_TOKENS:
            slopes.append((row[ok[-1]] - row[ok[-2]]) / ((steps[ok[-1]] - steps[ok[-2]]) * b))
    return float(np.median(slopes)) if slopes else None


def _extrapolate_kv_reads(t: np.ndarray, steps: np.ndarray, batches: np.ndarray, marginal_ms: float | None,
                          kv_bytes_per_token: float, hbm_bytes_per_ms: float) -> tuple[np.ndarray, int]:
    """Cells past a batch size's longest measured context: each further KV token costs the
    measured marginal cost (``marginal_ms``, :func:`_marginal_kv_read_ms`), never less than
    reading its bytes at the HBM peak.

    aiconfigurator measures decode attention only up to about 2^18-2^19 KV tokens per batch
    (batch 256 stops at context 1023, batch 2048 at 127). The measured time is a fixed cost per
    sequence plus a cost per KV token: on H200, fp8 KV, 32/8 heads, batch 128 takes 0.94 ns a
    token at context 1023 and 0.71 at 4095, the tail of a per-sequence cost of about 0.3 us
    over a marginal 0.62 ns. So the extension is linear in the context at the marginal cost.
    Until session 9 the time scaled in proportion to the context, which carried the
    per-sequence cost along with every token: batch 256 at context 4095 then cost 0.89 ns a
    token, where batch 128 measures 0.71 and batch 64 at 8191 0.68. Copying the last value flat
    (``np.interp``'s edge rule) would read KV faster than HBM.
    """
    t = t.copy()
    marginal = max(marginal_ms or 0.0, kv_bytes_per_token / hbm_bytes_per_ms)
    n = 0
    for row, b in zip(t, batches):
        ok = np.flatnonzero(~np.isnan(row))
        if len(ok) == 0:
            continue
        last = ok[-1]
        beyond = np.arange(last + 1, len(row))
        row[beyond] = row[last] + (steps[beyond] - steps[last]) * b * marginal
        n += len(beyond)
    return t, n


def _fill_rows(t: np.ndarray) -> np.ndarray:
    """A batch size with no measurement at all copies the row below it scaled by the batch ratio."""
    for i in range(t.shape[0]):
        if np.isnan(t[i]).all() and i > 0:
            t[i] = t[i - 1] * 2
    return t


# aiconfigurator's MoE dtype names -> ours (apmw.perf.tables.MOE_DTYPES reads them back).
MOE_DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8block", "w4a16_mxfp4": "mxfp4",
              "w4a8_mxfp4_mxfp8": "mxfp4mxfp8", "nvfp4": "nvfp4"}
# MXFP4 experts with MXFP8 activations (W4A8) run FlashInfer's TensorRT-LLM-generated MoE kernel in vLLM
# (VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1), SGLang and TensorRT-LLM's TRTLLM backend alike. aiconfigurator measured
# it on Blackwell under SGLang for every gpt-oss shape and TP ("sglang_flashinfer_trtllm_moe"), under TensorRT-LLM
# at TP 1 and under vLLM for one other shape; each engine's file keeps its own rows and takes SGLang's for the
# configurations it lacks. The W4A16 variant, measured under vLLM and SGLang, agrees within 2.4 % (B200,
# gpt-oss-120b's experts, TP 1, 64 tokens: 0.294 ms in vLLM 0.24.0, 0.301 ms in SGLang 0.5.14).
MOE_BORROWED = {"vllm": ("sglang", "w4a8_mxfp4_mxfp8", "sglang_flashinfer_trtllm_moe"),
                "trtllm": ("sglang", "w4a8_mxfp4_mxfp8", "sglang_flashinfer_trtllm_moe")}
# Routed-token skew of the MoE measurements we keep: aiconfigurator measures "balanced",
# "power_law_1.01" and "power_law_1.2" routing; 1.01 is the one its own model configs and
# tests use for real traffic (ai-dynamo/aiconfigurator, MoE op workload_distribution).
MOE_DISTRIBUTION = "power_law_1.01"
# Per engine: MoE dtypes not kept. TensorRT-LLM's MXFP4 W4A16 rows (kernel "moe_torch_flow", backend not
# named) cannot be the kernel its gpt-oss deployments serve: at TP 1 on B200 that kernel alone takes
# 0.89 ms a layer at 64 tokens, 32 ms for gpt-oss-120b's 36 layers, where InferenceMAX's TensorRT-LLM runs
# measure 9.5 ms for the whole decode iteration at 64 concurrent requests; it is 3x vLLM's
# FlashInfer TensorRT-LLM-generated W4A16 kernel (the one TensorRT-LLM's TRTLLM MoE backend runs). Without
# it a gpt-oss replica takes vLLM's tables (apmw.perf.calibrated.covering_tables), that kernel included.
MOE_DTYPES_SKIPPED: dict[str, tuple[str, ...]] = {"trtllm": ("w4a16_mxfp4",)}


def moe_tables(path: Path, report: dict, engine: str = "vllm",
               borrowed: Path | None = None) -> dict[str, np.ndarray]:
    """One MoE layer's routed-expert time over the token grid, per model shape and TP.

    Tensor parallelism only (``moe_ep_size == 1``: vLLM shards every expert over the TP
    ranks unless expert parallelism is switched on); median over the kernels measured.
    Keys ``moe_<dtype>_<hidden>_<expert inter>_<topk>_<experts>_tp<tp>``. ``borrowed``: another
    engine's MoE file whose rows of one dtype and kernel this engine runs too (``MOE_BORROWED``).
    """
    cols = ["moe_dtype", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size"]
    d = _preferred_source(_moe_rows(pd.read_parquet(path), engine), engine, "moe_perf", cols)
    if borrowed is not None:
        _, dtype, kernel = MOE_BORROWED[engine]
        more = _moe_rows(pd.read_parquet(borrowed), engine)
        more = more[(more.moe_dtype == dtype) & (more.kernel_source == kernel)]
        # only the configurations this engine did not measure itself
        own = pd.MultiIndex.from_frame(d.loc[d.moe_dtype == dtype, cols].drop_duplicates())
        more = more[~pd.MultiIndex.from_frame(more[cols]).isin(own)]
        d = pd.concat([d, more])
        report["moe_borrowed"] = {"file": f"{borrowed.parent.parent.name}/{borrowed.parent.name}", "dtype": dtype,
                                  "kernel": kernel, "configs": int(more[cols].drop_duplicates().shape[0])}
    tokens = np.sort(d.num_tokens.unique())
    out = {"moe_tokens": tokens.astype(float)}
    for (dt, h, inter, k, e, tp), grp in d.groupby(cols):
        t = grp.groupby("num_tokens").latency.median().reindex(tokens).to_numpy()[None, :]
        t, _, _ = _fill_and_monotone(t, axis=1)
        out[f"moe_{MOE_DTYPES[dt]}_{h}_{inter}_{k}_{e}_tp{tp}"] = (t[0] * MS).astype(np.float32)
    report["moe"] = {"configs": len(out) - 1, "distribution": MOE_DISTRIBUTION}
    return out


def _moe_rows(d: pd.DataFrame, engine: str) -> pd.DataFrame:
    """The MoE rows kept: tensor parallel, power-law routing, the dtypes apmw reads and the engine keeps."""
    return d[(d.moe_ep_size == 1) & (d.distribution == MOE_DISTRIBUTION) & d.moe_dtype.isin(MOE_DTYPES)
             & ~d.moe_dtype.isin(MOE_DTYPES_SKIPPED.get(engine, ()))]


def allreduce_tables(path: Path, engine: str, report: dict) -> dict[str, np.ndarray]:
    """The engine's custom all-reduce per GPU count. A GPU count the chosen version did not measure
    comes from the newest other version of the same engine that did (GB300's vLLM 0.24.0 rows stop
    at 4 GPUs, its 0.27.0 rows reach 16); ``report["allreduce_versions"]`` says which."""
    col, value = ALLREDUCE_ROWS[engine]
    ar = pd.read_parquet(path)
    ar = ar[ar[col] == value]
    versions = {int(g): path.parent.name for g in ar.num_gpus.unique()}
    others = sorted((d for d in path.parent.parent.iterdir() if (d / path.name).exists() and d != path.parent),
                    key=lambda d: Version(d.name), reverse=True)
    for d in others:
        more = pd.read_parquet(d / path.name)
        more = more[(more[col] == value) & ~more.num_gpus.isin(list(versions))] if col in more else more[:0]
        for g in more.num_gpus.unique():
            versions[int(g)] = d.name
        ar = pd.concat([ar, more])
    report["allreduce_versions"] = {str(g): v for g, v in sorted(versions.items())}
    sizes = np.sort(ar.message_size.unique())
    out = {"ar_size": sizes.astype(float)}
    for g, grp in ar.groupby("num_gpus"):
        t = grp.groupby("message_size").latency.median().reindex(sizes).to_numpy()[None, :]
        t, _, _ = _fill_and_monotone(t, axis=1)
        out[f"ar_{g}"] = (t[0] * MS).astype(np.float32)
    return out


# MLA (DeepSeek-V2/V3/R1, Kimi-K2) attention kernels, per engine: aiconfigurator's kernel-level tables
# (generation_mla_perf, context_mla_perf: the attention alone, over query heads per rank; mla_bmm_perf: the
# absorbed decode's two batched GEMMs per head, q_nope x W_UK before and the output x W_UV after).
# Shipped for SGLang (its trtllm_mla backend, SGLang's default for DeepSeek on SM100) on the four Blackwell
# systems. Not shipped:
# * TensorRT-LLM: built and left out. With them its held-out DeepSeek-V3 silicon rows on B200 (NVIDIA's,
#   bench/accuracy.py) went from a median |TPOT error| of 23.1 % (1.2.0rc6.post2) and 24.2 % (version not
#   given) on the roofline to 63.9 % and 45.9 %, all too slow. Its only fp8-block MoE kernel measured on
#   Blackwell is DeepGEMM (the backend TensorRT-LLM's DeepSeek-R1 guide lists for FP8 on B200), 0.133 ms a
#   layer at 4 tokens (TP 8) against 0.050 ms for SGLang's FlashInfer TRTLLM-generated kernel; which of
#   them the served iteration follows is not established here.
# * vLLM: aiconfigurator measured only whole MLA modules there (mla_*_module_perf: projections and
#   attention together, for DeepSeek-V3's shapes), not the kernels apmw composes.
# * SGLang on H100/H200: its rows (kernel source "flash_attention") read the latent KV cache at about
#   0.3 TB/s, 6 % of H200's HBM peak (16 heads per rank, fp8 KV, 128 sequences x 16k context: 4.0 ms
#   a layer, where TensorRT-LLM's kernel on the same GPU takes 0.41 ms and SGLang's trtllm_mla on B200
#   0.20 ms); InferenceMAX's H200 DeepSeek-R1 script runs FlashInfer's MLA instead. Hopper MLA stays on
#   the roofline until a table of the kernel deployments run is held.
MLA_BUILDS = {("sglang", gpu) for gpu in ("b200_sxm", "b300_sxm", "gb200", "gb300")}
MLA_BMM_DTYPES = {"bfloat16": "bf16", "fp8": "fp8"}
# latent KV elements per token and layer of the MLA models measured (kv_lora_rank 512 + qk_rope 64)
MLA_KV_ELEMENTS = 576


def mla_tables(base: Path, engine: str, version: str, report: dict, hbm_bytes_per_s: float) -> dict[str, np.ndarray]:
    """MLA attention per layer (``MLA_BUILDS``), keyed by the query heads each rank holds:

    * ``mladec_<kvdtype>_<heads>[batch, step]`` on ``mla_dec_batch`` x ``mla_dec_step``: decode attention,
      extended past each batch size's longest measured context as the GQA tables are
      (``_extrapolate_kv_reads``) and made monotone along both axes;
    * ``mlactx_<kvdtype>_<heads>[isl]`` on ``mla_ctx_isl``: prefill attention of one sequence;
    * ``mlabmm_<pre|post>_<dtype>_<heads>[tokens]`` on ``mla_bmm_tokens``: the absorbed decode's batched GEMMs.
    """
    files = [base / "mla" / engine / version / "generation_mla_perf.parquet",
             base / "mla" / engine / version / "context_mla_perf.parquet",
             base / "mla_bmm" / engine / version / "mla_bmm_perf.parquet"]
    if (engine, base.name) not in MLA_BUILDS:
        return {}
    if not all(f.exists() for f in files):
        raise FileNotFoundError(f"{base.name}/{engine} {version}: MLA_BUILDS lists it, but not all of {files} exist")
    gen = pd.read_parquet(files[0])
    bs, steps = np.sort(gen.batch_size.unique()), np.sort(gen.step.unique())
    out = {"mla_dec_batch": bs.astype(float), "mla_dec_step": steps.astype(float)}
    for (heads, kvd), grp in gen.groupby(["num_heads", "kv_cache_dtype"]):
        if kvd not in KV_DTYPES:
            continue
        t = grp.groupby(["batch_size", "step"]).latency.median().unstack().reindex(index=bs, columns=steps).to_numpy()
        t = _fill_rows(t) if np.isnan(t).all(axis=1).any() else t
        kv_bytes = MLA_KV_ELEMENTS * KV_BYTES[KV_DTYPES[kvd]]
        t, _ = _extrapolate_kv_reads(t, steps, bs.astype(float), _marginal_kv_read_ms(t, steps, bs.astype(float)),
                                     kv_bytes, hbm_bytes_per_s * MS)
        t, _, _ = _fill_and_monotone(t, axis=1)
        t, _, _ = _fill_and_monotone(t, axis=0)
        out[f"mladec_{KV_DTYPES[kvd]}_{heads}"] = (t * MS).astype(np.float32)
    ctx = pd.read_parquet(files[1])
    ctx = ctx[ctx.batch_size == 1]
    isl = np.sort(ctx.isl.unique())
    out["mla_ctx_isl"] = isl.astype(float)
    for (heads, kvd), grp in ctx.groupby(["num_heads", "kv_cache_dtype"]):
        if kvd in KV_DTYPES:
            t, _, _ = _fill_and_monotone(grp.groupby("isl").latency.median().reindex(isl).to_numpy()[None, :], axis=1)
            out[f"mlactx_{KV_DTYPES[kvd]}_{heads}"] = (t[0] * MS).astype(np.float32)
    bmm = pd.read_parquet(files[2])
    tokens = np.sort(bmm.num_tokens.unique())
    out["mla_bmm_tokens"] = tokens.astype(float)
    for (op, dt, heads), grp in bmm.groupby(["op_name", "bmm_dtype", "num_heads"]):
        if dt in MLA_BMM_DTYPES:
            t, _, _ = _fill_and_monotone(grp.groupby("num_tokens").latency.median().reindex(tokens).to_numpy()[None, :],
                                         axis=1)
            out[f"mlabmm_{op.removeprefix('mla_gen_')}_{MLA_BMM_DTYPES[dt]}_{heads}"] = (t[0] * MS).astype(np.float32)
    report["mla"] = {"decode_configs": sum(k.startswith("mladec_") for k in out),
                     "prefill_configs": sum(k.startswith("mlactx_") for k in out),
                     "bmm_configs": sum(k.startswith("mlabmm_") for k in out),
                     "kernels": sorted(set(gen.kernel_source) | set(ctx.kernel_source) | set(bmm.kernel_source))}
    return out


ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}


def _borrowed_moe(base: Path, engine: str) -> Path | None:
    """The other engine's MoE file this engine borrows rows from on this system (``MOE_BORROWED``), if it
    measured that dtype there."""
    if engine not in MOE_BORROWED:
        return None
    other, dtype, kernel = MOE_BORROWED[engine]
    path = base / "moe" / other / pick_version(base, other) / "moe_perf.parquet"
    d = pd.read_parquet(path, columns=["moe_dtype", "kernel_source"])
    return path if ((d.moe_dtype == dtype) & (d.kernel_source == kernel)).any() else None


def build(profiles: Path, builds: list[tuple[str, str]] = BUILDS) -> dict:
    OUT.mkdir(parents=True, exist_ok=True)
    summary = {}
    for gpu, engine in builds:
        catalogue_name = GPUS[gpu]
        base = profiles / "aiconfigurator" / gpu
        v = pick_version(base, engine)
        path = {f.split("/")[-1].removesuffix(".parquet"): base / f.format(fw=engine, v=v) for f in REQUIRED}
        report: dict = {}
        tables = {}
        tables |= gemm_tables(path["gemm_perf"], report)
        tables |= attention_tables(path["generation_attention_perf"], path["context_attention_perf"], report,
                                   get_gpu(catalogue_name).hbm_bandwidth_bytes_per_s, engine)
        tables |= allreduce_tables(path["custom_allreduce_perf"], engine, report)
        tables |= moe_tables(path["moe_perf"], report, engine, _borrowed_moe(base, engine))
        tables |= mla_tables(base, engine, v, report, get_gpu(catalogue_name).hbm_bandwidth_bytes_per_s)
        # the kernels measured, per table (apmw.perf.calibrated reads "generation_attention_perf" to
        # know whether the fp8-KV decode kernel dequantises on read: FlashAttention 3)
        kernels = {k: sorted(map(str, pd.read_parquet(p, columns=["kernel_source"]).kernel_source.unique()))
                   for k, p in path.items()}
        # the sources kept where the engine prefers some (KERNEL_SOURCES): those are the kernels in the tables
        kernels = {k: [s for s in v if s in KERNEL_SOURCES.get(engine, {}).get(k, v)] for k, v in kernels.items()}
        label = f"{ENGINE_NAMES[engine]} {v}"
        source = (SOURCE.replace("<gpu>", gpu) if gpu in ("h100_sxm", "h200_sxm") and engine == "vllm"
                  else SOURCE_012.replace("<gpu>", gpu).replace("<engine>", label))
        meta = {"gpu": catalogue_name, "source": source, "engine": f"{engine} {v}",
                "built_by": "scripts/build_calibration.py",
                "files": {k: str(p.relative_to(profiles)) for k, p in path.items()}, "kernels": kernels,
                "selection": {"allreduce_rows": "=".join(ALLREDUCE_ROWS[engine]),
                              "context_attention_math_dtype_by_kv_dtype": CONTEXT_ATTN_DTYPE.get(engine, "all rows"),
                              "moe_distribution": MOE_DISTRIBUTION, "moe_ep_size": 1,
                              "moe_dtypes_skipped": list(MOE_DTYPES_SKIPPED.get(engine, ()))},
                "report": report}
        tables["meta"] = np.array(json.dumps(meta))
        np.savez_compressed(OUT / f"{stem(gpu, engine)}.npz", **tables)
        summary[stem(gpu, engine)] = report
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", type=Path, default=ROOT.parent / "shared" / "data" / "profiles")
    ap.add_argument("--engine", action="append", choices=sorted(ENGINE_NAMES),
                    help="build only this engine's table sets (repeatable; default: every set in BUILDS)")
    args = ap.parse_args()
    builds = [b for b in BUILDS if args.engine is None or b[1] in args.engine]
    print(json.dumps(build(args.profiles, builds), indent=1))
    for f in sorted(OUT.glob("*.npz")):
        print(f"{f.relative_to(ROOT)}: {f.stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
