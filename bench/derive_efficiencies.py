"""Reproduce the roofline efficiencies quoted in ``apmw/perf/efficiency.py``.

Run:  python bench/derive_efficiencies.py [--profiles ../shared/data/profiles]
(needs the ``dev`` extra: pandas + pyarrow).

From aiconfigurator's measured vLLM 0.24.0 GEMM tables for H100-SXM and H200-SXM:

* bandwidth efficiency: achieved HBM bandwidth of weight-streaming GEMMs (m <= 8,
  n*k >= 4096^2; bytes = n*k*dtype + activations) over the spec-sheet bandwidth, median, with each
  GEMM's launch latency (``Efficiency.gemm_launch_s``, which the roofline charges per GEMM) taken off
  its time first; ``--launch-intercept`` fits that latency instead (the affine form's intercept);
* compute efficiency: achieved rate of large GEMMs (m, n, k >= 4096; 2*m*n*k FLOPs) over
  the dense spec peak, median, per dtype;
* decode attention bandwidth: KV bytes read per decode-attention call over latency
  (batch x context >= 64k tokens), median, per KV dtype -- for reference.
From Vidur's measured linear-layer tables (``profiles/vidur/compute/<gpu>/<model>/mlp.csv``,
microsoft/vidur@7d47513, MIT; bf16/fp16 Llama 2 and 3 shapes on A100-SXM4 and H100, TP 1-8),
the same two figures over the four projections of each layer (QKV, O, gate-up, down):
weight-streaming bandwidth at <= 8 tokens and compute rate at >= 4096 tokens. A100 has
no aiconfigurator table, so these are its roofline efficiencies (``apmw.perf.efficiency``);
on H100 they cross-check aiconfigurator's.
Spec numbers come from the GPU catalogue (apmw.catalog.gpus).
``--by-size`` prints the weight-streaming efficiency by GEMM size on H200 and Blackwell instead (a lead:
the roofline takes one figure per dtype, and small per-rank matrices stream slower).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from apmw.catalog.gpus import get_gpu  # noqa: E402
from apmw.perf.efficiency import DEFAULT_EFFICIENCY  # noqa: E402

LAUNCH_S = DEFAULT_EFFICIENCY.gemm_launch_s

GPUS = {"h100_sxm": "H100", "h200_sxm": "H200"}
DTYPE = {"bfloat16": ("bf16", 2.0), "fp8": ("fp8", 1.0)}


def gemm_efficiencies(path: Path, gpu) -> dict[str, float]:
    g = pd.read_parquet(path)
    out = {}
    for src, (name, size) in DTYPE.items():
        d = g[g.gemm_dtype == src]
        s = d.latency * 1e-3
        stream = d[(d.m <= 8) & (d.n * d.k >= 4096 ** 2)]
        bytes_ = stream.n * stream.k * size + 2 * stream.m * (stream.n + stream.k)
        out[f"bandwidth_{name}"] = float((bytes_ / (stream.latency * 1e-3 - LAUNCH_S)).median()
                                         / gpu.hbm_bandwidth_bytes_per_s)
        big = d[(d.m >= 4096) & (d.n >= 4096) & (d.k >= 4096)]
        flops = 2.0 * big.m * big.n * big.k / (big.latency * 1e-3)
        out[f"flops_{name}"] = float(flops.median() / gpu.flops_for(name))
        del s
    return out


def launch_intercept(path: Path, gpu) -> dict[str, float]:
    """The affine fit ``latency = launch + bytes / (efficiency x bandwidth)`` over weight-streaming GEMMs
    (m <= 8, n*k >= 1024^2): its intercept (us) and efficiency, per dtype."""
    g = pd.read_parquet(path)
    out = {}
    for src, (name, size) in DTYPE.items():
        d = g[(g.gemm_dtype == src) & (g.m <= 8) & (g.n * g.k >= 1024 ** 2)]
        bytes_ = d.n * d.k * size + 2 * d.m * (d.n + d.k)
        slope, intercept = np.polyfit(bytes_.to_numpy(float), d.latency.to_numpy(float) * 1e-3, 1)
        out[f"launch_us_{name}"] = intercept * 1e6
        out[f"bandwidth_{name}"] = 1.0 / slope / gpu.hbm_bandwidth_bytes_per_s
    return out


def decode_attention_bandwidth(path: Path, gpu) -> dict[str, float]:
    a = pd.read_parquet(path)
    a = a[(a.window_size == 0) & (a.batch_size * a.step >= 65536)]
    out = {}
    for src, (name, size) in DTYPE.items():
        d = a[a.kv_cache_dtype == src]
        bytes_ = d.batch_size * d.step * d.num_key_value_heads * d.head_dim * 2 * size
        out[f"decode_attention_bandwidth_{name}"] = float((bytes_ / (d.latency * 1e-3)).median()
                                                          / gpu.hbm_bandwidth_bytes_per_s)
    return out


# Vidur op name -> (n, k) of that projection on one rank, from a row's model shape.
VIDUR_PROJECTIONS = {
    "attn_pre_proj": lambda r: ((r.n_head + 2 * r.n_kv_head) * r.n_embd / r.n_head, r.n_embd),
    "attn_post_proj": lambda r: (r.n_embd, r.n_embd),
    "mlp_up_proj": lambda r: (2 * r.n_expanded_embd, r.n_embd),
    "mlp_down_proj": lambda r: (r.n_embd, r.n_expanded_embd),
}


def vidur_linear_efficiencies(gpu_dir: Path, gpu) -> dict[str, float]:
    """bf16 weight-streaming bandwidth and large-GEMM compute efficiency from Vidur's mlp.csv tables."""
    bw, fl = [], []
    for path in sorted(gpu_dir.glob("*/*/mlp.csv")):
        d = pd.read_csv(path)
        for op, shape in VIDUR_PROJECTIONS.items():
            t = d[f"time_stats.{op}.median"] * 1e-3          # ms -> s
            n, k = shape(d)
            n, k = n / d.num_tensor_parallel_workers if op in ("attn_pre_proj", "mlp_up_proj") else n, \
                k / d.num_tensor_parallel_workers if op in ("attn_post_proj", "mlp_down_proj") else k
            small = d.num_tokens <= 8
            bytes_ = 2.0 * n * k + 2.0 * d.num_tokens * (n + k)
            bw += list((bytes_ / (t - LAUNCH_S))[small & (n * k >= 4096 ** 2 / 8)] / gpu.hbm_bandwidth_bytes_per_s)
            big = d.num_tokens >= 4096
            fl += list((2.0 * d.num_tokens * n * k / t)[big & (n * k >= 4096 ** 2 / 8)] / gpu.flops_for("bf16"))
    return {"bandwidth_bf16": float(pd.Series(bw).median()), "flops_bf16": float(pd.Series(fl).median()),
            "rows": len(bw) + len(fl)}


# Stored bytes per weight of each GEMM table dtype (NVFP4: 4 bits and one FP8 scale per 16 values).
STREAM_BYTES = {"bfloat16": 2.0, "fp8": 1.0, "nvfp4": 0.5625}
BY_SIZE_GPUS = {"h200_sxm": "H200", "b200_sxm": "B200", "gb200": "GB200", "b300_sxm": "B300", "gb300": "GB300"}


def streaming_by_size(path: Path, gpu) -> dict[str, float]:
    """Weight-streaming efficiency (m <= 8) of GEMMs whose weight matrix is at least 4096^2, 8192^2 and
    16384^2 elements, median, per dtype: how much a replica's small per-rank matrices lose."""
    g = pd.read_parquet(path)
    out = {}
    for src, size in STREAM_BYTES.items():
        d = g[g.gemm_dtype == src]
        for side in (4096, 8192, 16384):
            st = d[(d.m <= 8) & (d.n * d.k >= side ** 2)]
            if len(st):
                bytes_ = st.n * st.k * size + 2 * st.m * (st.n + st.k)
                out[f"{src}>={side}^2"] = float((bytes_ / (st.latency * 1e-3)).median() / gpu.hbm_bandwidth_bytes_per_s)
    return out


def print_gemm_figures(figures, gpus: dict[str, str], profiles: Path) -> None:
    """One line per GPU of what ``figures(gemm table, gpu)`` derives from its vLLM 0.24.0 GEMM table."""
    for stem, name in gpus.items():
        eff = figures(profiles / "aiconfigurator" / stem / "gemm/vllm/0.24.0/gemm_perf.parquet", get_gpu(name))
        print(f"{name}: " + ", ".join(f"{k} {v:.2f}" for k, v in eff.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", type=Path, default=ROOT.parent / "shared" / "data" / "profiles")
    ap.add_argument("--by-size", action="store_true",
                    help="weight-streaming efficiency by GEMM size on Hopper and Blackwell (vLLM 0.24.0 tables)")
    ap.add_argument("--launch-intercept", action="store_true",
                    help="fit each GEMM's launch latency on Hopper (the affine form's intercept) instead")
    args = ap.parse_args()
    if args.launch_intercept:
        print_gemm_figures(launch_intercept, GPUS, args.profiles)
        return
    if args.by_size:
        print_gemm_figures(streaming_by_size, BY_SIZE_GPUS, args.profiles)
        return
    for stem, name in GPUS.items():
        gpu = get_gpu(name)
        base = args.profiles / "aiconfigurator" / stem
        eff = gemm_efficiencies(base / "gemm/vllm/0.24.0/gemm_perf.parquet", gpu)
        eff |= decode_attention_bandwidth(base / "attention/vllm/0.24.0/generation_attention_perf.parquet", gpu)
        print(f"{gpu.name}: " + ", ".join(f"{k} {v:.2f}" for k, v in eff.items()))
    for stem, name in {"a100": "A100", "h100": "H100"}.items():
        gpu = get_gpu(name)
        eff = vidur_linear_efficiencies(args.profiles / "vidur" / "compute" / stem, gpu)
        print(f"{gpu.name} (Vidur linear layers, bf16, {eff.pop('rows')} points): "
              + ", ".join(f"{k} {v:.2f}" for k, v in eff.items()))


if __name__ == "__main__":
    main()
