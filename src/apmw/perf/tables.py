"""Measured kernel tables shipped with apmw, and exact interpolation in them.

The tables are built by ``scripts/build_calibration.py`` from aiconfigurator's kernel
database (``catalog/data/calibration/*.npz``, sources in ``SOURCES.md`` there and in each
file's ``meta`` with the build report): vLLM 0.24.0's kernels on H100-SXM, H200-SXM, B200,
B300, GB200 and GB300 (``<system>.npz``), and an engine's own kernels where they differ
materially from vLLM's (``<system>__<engine>.npz``: TensorRT-LLM on the four Blackwell systems,
SGLang on all six). :func:`load_tables` gives an engine its
own tables where they exist, else vLLM's (``KernelTables.engine`` says whose). Interpolation is
piecewise linear on each table axis, so it returns the stored value at every measured
grid point and is monotone wherever the table is (the builder makes every table
monotone in tokens, batch and context).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np

from typing import TYPE_CHECKING

from apmw.errors import ApmwError

if TYPE_CHECKING:
    from apmw.arch import Architecture

_DIR = Path(__file__).resolve().parent.parent / "catalog" / "data" / "calibration"

# Catalogue GPU name -> table file stem. Only GPUs with measured tables are here.
CALIBRATED_GPUS = {"H100-SXM5-80GB": "h100_sxm", "H200-SXM-141GB": "h200_sxm", "B200-SXM-180GB": "b200_sxm",
                   "B300-SXM-288GB": "b300_sxm", "GB200 (per GPU)": "gb200", "GB300 (per GPU)": "gb300"}
# Whose kernels the plain ``<system>.npz`` holds; other engines' files are ``<system>__<engine>.npz``.
BASE_ENGINE = "vllm"


class KernelTables:
    """One GPU's measured tables (seconds), read lazily from its ``.npz``.

    Only the arrays a replica needs are decompressed (the file holds every head layout),
    which keeps a cold ``apmw predict`` fast.
    """

    def __init__(self, gpu: str, path: Path):
        self.gpu = gpu
        self._npz = np.load(path)
        self._names = set(self._npz.files)
        self._cache: dict[str, np.ndarray] = {}
        meta = json.loads(str(self._npz["meta"]))
        self.source: str = meta["source"]
        # whose kernels these are, and the release measured: "vllm", "0.24.0"
        self.engine, _, self.engine_version = meta.get("engine", f"{BASE_ENGINE} ").partition(" ")
        # the kernel sources measured, per aiconfigurator table ("generation_attention_perf", ...)
        self.kernels: dict[str, list[str]] = meta.get("kernels", {})

    def has(self, key: str) -> bool:
        return key in self._names

    def keys(self, prefix: str = "") -> list[str]:
        """The stored table names starting with ``prefix``, sorted."""
        return sorted(k for k in self._names if k.startswith(prefix))

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self._cache:
            self._cache[key] = self._npz[key].astype(float)
        return self._cache[key]


# Routed-expert kernels measured per weight dtype, in order of preference: fp8 MoE
# checkpoints (DeepSeek, Qwen3 FP8) are block-scaled; MXFP4 is gpt-oss's format.
# apmw's "fp4" is either; MXFP4 (gpt-oss) first, then NVFP4 (Blackwell tables only).
MOE_DTYPES = {"bf16": ("bf16",), "fp16": ("bf16",), "fp8": ("fp8block", "fp8"),
               "fp4": ("mxfp4", "nvfp4"), "mxfp4": ("mxfp4",), "nvfp4": ("nvfp4",)}


@lru_cache(maxsize=None)
def load_tables(gpu_name: str, engine: str = BASE_ENGINE) -> KernelTables | None:
    """The tables for a catalogue GPU, or None when it has none (roofline only).

    ``engine``'s own tables where they were built for this GPU, else vLLM's (read
    ``.engine`` on the result).
    """
    stem = CALIBRATED_GPUS.get(gpu_name)
    if stem is None:
        return None
    if engine != BASE_ENGINE and (_DIR / f"{stem}__{engine}.npz").exists():
        return _load(gpu_name, f"{stem}__{engine}")
    return _load(gpu_name, stem)


def has_engine_tables(gpu_name: str, engine: str) -> bool:
    """Whether ``engine``'s own kernels were measured on this GPU (not vLLM's standing in)."""
    stem = CALIBRATED_GPUS.get(gpu_name)
    return stem is not None and (engine == BASE_ENGINE or (_DIR / f"{stem}__{engine}.npz").exists())


class EngineVersionError(ApmwError):
    """A pinned engine release whose tables apmw does not bundle, or that cannot price the replica; the
    message starts with ``engine_version``, for the caller to name its own field or flag."""


def check_engine_version(gpu_name: str, engine: str, version: str) -> None:
    """Refuse ``version`` unless ``engine``'s own tables of that release were measured on this GPU and
    are bundled: pinning a release means its kernels, never another release's or another engine's
    standing in (``serving.engine_version``, ``apmw predict --engine-version``)."""
    held = {name: tables.engine_version for name in CALIBRATED_GPUS
            if has_engine_tables(name, engine) and (tables := load_tables(name, engine)) is not None}
    if gpu_name in held and _release(held[gpu_name]) == _release(version):
        return
    releases = sorted(set(held.values()))
    bundled = (f"apmw bundles {engine} {', '.join(releases)} tables (for {', '.join(sorted(held))})" if held
               else f"apmw bundles no tables measured with {engine}")
    here = (f"{gpu_name} has {engine} {held[gpu_name]}" if gpu_name in held
            else f"{gpu_name} has no {engine} tables of its own")
    raise EngineVersionError(f"engine_version '{version}' ({engine}): no bundled kernel tables for {gpu_name}: {here}; "
                    f"{bundled}. Leave the version out to price {gpu_name} with what apmw holds for it "
                    "(the calibrated path says whose tables in its source), or pick a bundled release")


def _release(version: str) -> tuple[str, ...]:
    """A release as engines tag and users write it alike: 'v0.24.0', 'V0.24' and '0.24.0' are one release."""
    parts = version.strip().lower().removeprefix("v").split(".")
    while len(parts) > 1 and parts[-1] == "0":
        parts.pop()
    return tuple(parts)


@lru_cache(maxsize=None)
def _load(gpu_name: str, stem: str) -> KernelTables:
    return KernelTables(gpu_name, _DIR / f"{stem}.npz")


def interp_extrapolate(x: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Piecewise-linear in ``x``; beyond the last point, proportional to ``x`` (work scales).

    Below the first point the first value holds (a kernel never gets faster than
    its smallest measured launch).
    """
    x = np.asarray(x, dtype=float)
    y = np.interp(x, xs, ys)
    beyond = x > xs[-1]
    if np.any(beyond):
        y = np.where(beyond, ys[-1] * x / xs[-1], y)
    return y


def gemm_latency_s(tables: KernelTables, dtype: str, n: float, k: float) -> np.ndarray:
    """Latency over the table's m grid of one GEMM of shape (n, k), bilinear in (n, k).

    Bilinear interpolation reproduces latencies of the form a + b*n + c*k + d*n*k
    exactly, which is what a GEMM costs away from tile edges (work ~ m*n*k, bytes
    ~ n*k + m*(n+k)). Beyond the table's largest n or k the cost scales in proportion.
    """
    cube = tables[f"gemm_{dtype}"]
    ns, ks = tables["gemm_n"], tables["gemm_k"]
    col = _interp_axis(cube, ns, n, axis=1)        # (M, K)
    return _interp_axis(col, ks, k, axis=1)        # (M,)


def _interp_axis(a: np.ndarray, grid: np.ndarray, x: float, axis: int) -> np.ndarray:
    """Linear interpolation of an array along one axis at scalar ``x``; proportional beyond the end."""
    a = np.moveaxis(a, axis, 0)
    if x >= grid[-1]:
        return a[-1] * (x / grid[-1])
    if x <= grid[0]:
        return a[0]
    i = int(np.searchsorted(grid, x)) - 1
    w = (x - grid[i]) / (grid[i + 1] - grid[i])
    return a[i] * (1 - w) + a[i + 1] * w


def bilinear_log2(table: np.ndarray, xs: np.ndarray, ys: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Vectorised bilinear interpolation on a (batch x context) grid spaced in powers of two.

    Used for decode attention: within a cell it is linear in each axis (attention time
    is close to affine in batch and in context, so linear rather than log-linear
    interpolation keeps averages of the function close to the function of averages),
    exact at grid points and monotone where the table is.
    Beyond the last batch or context it scales in proportion (more sequences or more
    context means proportionally more KV to read).
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    fx = np.interp(x, xs, np.arange(len(xs), dtype=float))
    fy = np.interp(y, ys, np.arange(len(ys), dtype=float))
    i = np.minimum(fx.astype(int), len(xs) - 2)
    j = np.minimum(fy.astype(int), len(ys) - 2)
    wx, wy = fx - i, fy - j
    flat = table.ravel()
    base = i * table.shape[1] + j
    lo = flat[base] + (flat[base + table.shape[1]] - flat[base]) * wx
    hi = flat[base + 1] + (flat[base + table.shape[1] + 1] - flat[base + 1]) * wx
    v = lo + (hi - lo) * wy
    return v * (np.maximum(x / xs[-1], 1.0) * np.maximum(y / ys[-1], 1.0))


def moe_key(arch: "Architecture", tables: KernelTables, gpus: int, weight_dtype: str,
            mxfp4_activations: str = "bf16") -> str | None:
    """The measured MoE table for this model shape, expert dtype and TP, if any.

    MXFP4 experts fed MXFP8 activations (``mxfp4_activations="mxfp8"``) run the W4A8 kernel: its table, and
    none where only the W4A16 kernel was measured for the shape; 4-bit experts not measured as MXFP4 (NVFP4)
    are not affected."""
    shape = f"{arch.hidden_size}_{arch.expert_intermediate_size}_{arch.experts_per_token}_{arch.num_experts}"
    dtypes = MOE_DTYPES.get(weight_dtype.lower(), ())
    if mxfp4_activations == "mxfp8" and "mxfp4" in dtypes:
        if tables.has(f"moe_mxfp4mxfp8_{shape}_tp{gpus}"):
            return f"moe_mxfp4mxfp8_{shape}_tp{gpus}"
        if tables.has(f"moe_mxfp4_{shape}_tp{gpus}"):
            return None
        dtypes = tuple(d for d in dtypes if d != "mxfp4")
    for dt in dtypes:
        key = f"moe_{dt}_{shape}_tp{gpus}"
        if tables.has(key):
            return key
    return None
