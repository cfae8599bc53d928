"""Reproduce the roofline efficiencies quoted in ``apmw/perf/efficiency.py``.

Run:  python bench/derive_efficiencies.py [--profiles ../shared/data/profiles]
(needs the ``dev`` extra: pandas + pyarrow).

From aiconfigurator's measured vLLM 0.24.0 GEMM tables for H100-SXM and H200-SXM:

* bandwidth efficiency: achieved HBM bandwidth of weight-streaming GEMMs (m <= 8,
  n*k >= 4096^2; bytes = n*k*dtype + activations) over the spec-sheet bandwidth, median;
* compute efficiency: achieved rate of large GEMMs (m, n, k >= 4096; 2*m*n*k FLOPs) over
  the dense spec peak, median, per dtype;
* decode attention bandwidth: KV bytes read per decode-attention call over latency
  (batch x context >= 64k tokens), median, per KV dtype -- for reference.
Spec numbers come from the GPU catalogue (apmw.catalog.gpus).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from apmw.catalog.gpus import get_gpu  # noqa: E402

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
        out[f"bandwidth_{name}"] = float((bytes_ / (stream.latency * 1e-3)).median() / gpu.hbm_bandwidth_bytes_per_s)
        big = d[(d.m >= 4096) & (d.n >= 4096) & (d.k >= 4096)]
        flops = 2.0 * big.m * big.n * big.k / (big.latency * 1e-3)
        out[f"flops_{name}"] = float(flops.median() / gpu.flops_for(name))
        del s
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", type=Path, default=ROOT.parent / "shared" / "data" / "profiles")
    args = ap.parse_args()
    for stem, name in GPUS.items():
        gpu = get_gpu(name)
        base = args.profiles / "aiconfigurator" / stem
        eff = gemm_efficiencies(base / "gemm/vllm/0.24.0/gemm_perf.parquet", gpu)
        eff |= decode_attention_bandwidth(base / "attention/vllm/0.24.0/generation_attention_perf.parquet", gpu)
        print(f"{gpu.name}: " + ", ".join(f"{k} {v:.2f}" for k, v in eff.items()))


if __name__ == "__main__":
    main()
