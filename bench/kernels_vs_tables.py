"""Compare kernels measured on a real H200 (``bench/h200_kernels.py``) with the tables apmw ships.

Run:  python bench/kernels_vs_tables.py [RUN.json ...] [--write-docs]

(default: the two runs of 2026-12-04 in bench/data, ``h200_kernels.json`` with every section and
``h200_power.json``, a second run of the power holds and the whole-decode-step holds).

For each measured GEMM, decode-attention and routed-expert point it reads the value apmw's
calibrated path would use (``apmw.perf.tables``: the same interpolation, on the shipped
``h200_sxm.npz``, vLLM 0.24.0's kernels) and prints measured / table; for each power hold it prints
the board power NVML read beside ``apmw.perf.power.activity_power_w`` for the same phase (memory-
bound or compute-bound, at full utilisation). ``--write-docs`` rewrites the tables between the
``<!-- h200-kernels -->`` markers of docs/accuracy.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from apmw.capacity.benchmark import decode_load  # noqa: E402
from apmw.catalog.gpus import get_gpu  # noqa: E402
from apmw.perf.replica import benchmark_replica  # noqa: E402
from apmw.perf.power import activity_power_w  # noqa: E402
from apmw.perf.tables import bilinear_log2, gemm_latency_s, interp_extrapolate, load_tables  # noqa: E402

GPU = "H200-SXM-141GB"
DEFAULT_RUNS = [ROOT / "bench" / "data" / "h200_kernels.json", ROOT / "bench" / "data" / "h200_power.json"]
DOCS = ROOT / "docs" / "accuracy.md"
MARK = ("<!-- h200-kernels -->", "<!-- /h200-kernels -->")
SHOWN_M = (1, 16, 64, 256, 1024, 4096)
# the MoE table (dtype, tp) each measured routed-expert shape is compared with
MOE_TABLE_TP = {"qwen3-30b-a3b tp1": 1, "qwen3-235b-a22b tp8": 8, "gpt-oss-120b tp1": 1}


def table_gemm_s(tables, row: dict) -> float | None:
    grid = list(tables["gemm_m"])
    if row["m"] not in grid:
        return None
    return float(gemm_latency_s(tables, row["dtype"], row["n"], row["k"])[grid.index(row["m"])])


def table_decode_s(tables, row: dict) -> float | None:
    key = f"dec_bf16_{row['heads']}_{row['kv_heads']}_{row['head_dim']}"
    if not tables.has(key):
        return None
    return float(bilinear_log2(tables[key], tables["dec_batch"], tables["dec_step"],
                               np.array([row["batch"]]), np.array([row["step"]]))[0])


def table_moe_s(tables, row: dict) -> tuple[float | None, str]:
    tp = MOE_TABLE_TP[row["model"]]
    inter = row["inter"] * tp
    key = f"moe_bf16_{row['hidden']}_{inter}_{row['topk']}_{row['experts']}_tp{tp}"
    if not tables.has(key):
        return None, key
    return float(interp_extrapolate(np.array([row["tokens"]]), tables["moe_tokens"], tables[key])[0]), key


def us(s: float | None) -> str:
    return "—" if s is None else f"{s * 1e6:,.1f}"


def ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def gemm_lines(tables, rows: list[dict]) -> list[str]:
    timed = [r for r in rows if "time_s" in r]
    lines = ["Measured / table time of one GEMM (`gemm_bf16`, `gemm_fp8` of `h200_sxm.npz`), by tokens m; "
             "in brackets the measured µs.", "",
             "| model, layer (n × k per rank) | dtype | " + " | ".join(f"m={m}" for m in SHOWN_M) + " |",
             "|---|---|" + "---|" * len(SHOWN_M)]
    keys = sorted({(r["model"], r["layer"], r["n"], r["k"], r["dtype"]) for r in timed},
                  key=lambda t: (t[0], t[1], t[4]))
    for model, layer, n, k, dtype in keys:
        cells = []
        for m in SHOWN_M:
            r = next((r for r in timed if (r["model"], r["layer"], r["dtype"], r["m"]) == (model, layer, dtype, m)), None)
            cells.append("—" if r is None else f"{ratio(r['time_s'], table_gemm_s(tables, r))} ({us(r['time_s'])})")
        lines.append(f"| {model} {layer} ({n} × {k}) | {dtype} | " + " | ".join(cells) + " |")
    lines += ["", "Median measured / table over every shape, by m (all 14 m from 1 to 8192 are measured):", "",
              "| dtype | m ≤ 16 | 32 ≤ m ≤ 256 | 512 ≤ m ≤ 8192 | smallest measured launch (µs) |", "|---|---|---|---|---|"]
    for dtype in ("bf16", "fp8"):
        def med(lo: int, hi: int, dtype: str = dtype) -> str:
            rs = [r["time_s"] / t for r in timed if r["dtype"] == dtype and lo <= r["m"] <= hi
                  and (t := table_gemm_s(tables, r))]
            return f"{statistics.median(rs):.2f} (n={len(rs)})" if rs else "—"
        floor = min((r["time_s"] for r in timed if r["dtype"] == dtype), default=None)
        lines.append(f"| {dtype} | {med(1, 16)} | {med(32, 256)} | {med(512, 8192)} | {us(floor)} |")
    hbm = get_gpu(GPU).hbm_bandwidth_bytes_per_s
    lines += ["", "One layer's GEMMs at one token (m = 1, the lm_head left out) against the time to read their weights "
              f"at the catalogue's {hbm / 1e12:.1f} TB/s, which is all the plain roofline charges:", "",
              "| model | dtype | measured (µs) | table (µs) | weight bytes / bandwidth (µs) | measured / bandwidth |",
              "|---|---|---|---|---|---|"]
    for model in sorted({r["model"] for r in timed}):
        for dtype in ("bf16", "fp8"):
            one = [r for r in timed if r["model"] == model and r["dtype"] == dtype and r["m"] == 1
                   and r["layer"] != "lm_head"]
            if not one:
                continue
            measured = sum(r["time_s"] for r in one)
            table = sum(table_gemm_s(tables, r) or 0.0 for r in one)
            floor = sum(r["n"] * r["k"] * (2 if dtype == "bf16" else 1) for r in one) / hbm
            lines.append(f"| {model} | {dtype} | {us(measured)} | {us(table)} | {us(floor)} | {measured / floor:.2f} |")
    errors = [r for r in rows if "error" in r]
    if errors:
        lines += ["", f"{len(errors)} GEMM points failed to run, e.g. {errors[0]['dtype']} m={errors[0]['m']}: "
                  f"`{errors[0]['error'][:160]}`"]
    return lines


def decode_lines(tables, section: dict) -> list[str]:
    rows = [r for r in section["rows"] if "time_s" in r]
    steps = sorted({r["step"] for r in section["rows"]})
    lines = [f"Measured / table time of one layer's decode attention (`dec_bf16_<heads>_<kv heads>_<head dim>`), "
             f"by batch and context (past tokens); in brackets the measured µs. Kernel: {section['kernel']} "
             f"({', '.join(section.get('backends', []))}).", "",
             "| heads / KV heads / head dim | batch | " + " | ".join(f"{s + 1:,}" for s in steps) + " |",
             "|---|---|" + "---|" * len(steps)]
    for key in sorted({(r["model"], r["heads"], r["kv_heads"], r["head_dim"]) for r in rows}):
        for b in sorted({r["batch"] for r in rows if r["model"] == key[0]}):
            cells = []
            for s in steps:
                r = next((r for r in rows if r["model"] == key[0] and r["batch"] == b and r["step"] == s), None)
                cells.append("—" if r is None else f"{ratio(r['time_s'], table_decode_s(tables, r))} ({us(r['time_s'])})")
            lines.append(f"| {key[0]} {key[1]}/{key[2]}/{key[3]} | {b} | " + " | ".join(cells) + " |")
    ratios = [r["time_s"] / t for r in rows if (t := table_decode_s(tables, r))]
    if ratios:
        lines += ["", f"Median measured / table over {len(ratios)} points: {statistics.median(ratios):.2f} "
                  f"(range {min(ratios):.2f}–{max(ratios):.2f}). Best KV read rate measured: "
                  f"{max(r['kv_gb_per_s'] for r in rows):,.0f} GB/s."]
    return lines


def moe_lines(tables, section: dict) -> list[str]:
    rows = [r for r in section["rows"] if "time_s" in r]
    lines = [f"Routed experts of one layer, measured ({section['kernel']}) against the fused-MoE table "
             "(vLLM's Triton fused MoE, bf16); µs.", "",
             "| model (hidden, expert inter per rank, top-k, experts) | tokens | measured | table | measured / table | active experts |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        t, _ = table_moe_s(tables, r)
        lines.append(f"| {r['model']} ({r['hidden']}, {r['inter']}, {r['topk']}, {r['experts']}) | {r['tokens']} | "
                     f"{us(r['time_s'])} | {us(t)} | {ratio(r['time_s'], t)} | {r['active_experts']} |")
    errors = [r for r in section["rows"] if "error" in r]
    if errors:
        lines += ["", f"{len(errors)} points failed: `{errors[0]['error'][:160]}`"]
    return lines


def power_lines(runs: list[dict]) -> list[str]:
    gpu = get_gpu(GPU)
    limit = runs[0].get("enforced_power_limit_w", 0)
    lines = [f"Board power (NVML energy counter over the second half of a 2.5 s hold; the instantaneous reading's "
             f"median agrees within 5 %) while one kernel replays back to back, in {len(runs)} runs, against "
             f"`activity_power_w` (idle {gpu.idle_power_w:.0f} W, busy {gpu.busy_power_w:.0f} W from the catalogue) "
             f"at full utilisation with the phase the roofline would call it. Enforced power limit read: {limit:.0f} W.",
             "", "| point | launch (µs) | measured W, each run | SM clock (MHz) | apmw W | apmw / measured |",
             "|---|---|---|---|---|---|"]
    for r in runs[0]["rows"]:
        same = [next((x for x in run["rows"] if x.get("point") == r["point"]), {}) for run in runs]
        watts = [_watts(x) for x in same if _watts(x) is not None]
        if not watts:
            lines.append(f"| {r['point']} | — | {r.get('error', r.get('skipped', ''))[:80]} | | | |")
            continue
        point = r["point"]
        if point.startswith("idle"):
            model = gpu.idle_power_w
        else:
            compute = "compute-bound" in point or _gemm_m(point) >= 512
            model = float(activity_power_w(gpu.idle_power_w, gpu.busy_power_w, 1.0, 1.0 if compute else 0.0))
        lines.append(f"| {point} | {us(r.get('launch_s'))} | {'; '.join(f'{w:.0f}' for w in watts)} | "
                     f"{r['sm_clock_mhz']:.0f} | {model:.0f} | {model / statistics.fmean(watts):.2f} |")
    return lines


def _watts(row: dict) -> float | None:
    """A hold's mean power: the energy counter's where the run read it, else the instantaneous median."""
    return row.get("energy_power_w") or row.get("power_w")


def decode_step_lines(section: dict) -> list[str]:
    """The whole Llama-3.1-8B decode step: measured time and power against apmw's step model and power formula."""
    replica = benchmark_replica("meta-llama/Meta-Llama-3.1-8B", GPU, 1, "bf16", "bf16")
    lines = [f"{section['model']}: one decode step as a CUDA graph (32 layers of qkv, attention over 2,048 cached "
             "tokens per sequence, o, gate/up, SiLU-and-mul, down; then the lm_head), replayed back to back (duty 1) "
             "or with host-side gaps between steps. apmw's columns: `benchmark_replica('meta-llama/Meta-Llama-3.1-8B', "
             "'H200', 1, 'bf16', 'bf16')`, its calibrated step time and `gpu_power_w(utilisation, compute_share)` "
             "with utilisation = the duty.", "",
             "| batch | duty | measured step (ms) | apmw step (ms) | measured W | SM clock (MHz) | apmw W | apmw / measured |",
             "|---|---|---|---|---|---|---|---|"]
    for r in section["rows"]:
        if "step_s" not in r:
            if r.get("point"):
                lines.append(f"| idle after | — | — | — | {_watts(r):.0f} | {r['sm_clock_mhz']:.0f} | "
                             f"{replica.power.gpu_idle_w:.0f} | {replica.power.gpu_idle_w / _watts(r):.2f} |")
            continue
        load = decode_load(replica, float(r["batch"]), float(r["context"]))
        model_w = float(replica.power.gpu_power_w(r["duty"], float(replica.step.compute_share(load))))
        lines.append(f"| {r['batch']} | {r['duty']:.2f} | {r['step_s'] * 1e3:.2f} | "
                     f"{float(replica.step.iteration_time_s(load)) * 1e3:.2f} | {_watts(r):.0f} | {r['sm_clock_mhz']:.0f} | "
                     f"{model_w:.0f} | {model_w / _watts(r):.2f} |")
    return lines


def _gemm_m(point: str) -> int:
    for word in point.split():
        if word.startswith("m="):
            return int(word[2:])
    return 0


def report(runs: list[dict]) -> list[str]:
    tables = load_tables(GPU)
    data = runs[0]
    dev, s = data["device"], data["sections"]
    ceil = s.get("ceilings", {})
    lines = [f"Measured on {dev['name']} ({dev['sms']} SMs), PyTorch {dev['torch']}, CUDA {dev['cuda']}, "
             f"{dev['date_utc'][:10]}, by `bench/h200_kernels.py`; compared by `python bench/kernels_vs_tables.py`. "
             f"Ceilings measured first: bf16 matmul {ceil.get('bf16_matmul_flops_per_s', 0) / 1e12:.0f} TFLOP/s, "
             f"fp8 matmul {ceil.get('fp8_matmul_flops_per_s', 0) / 1e12:.0f} TFLOP/s (8192³); a 2 GiB `copy_` "
             f"moved {ceil.get('copy_bytes_per_s', 0) / 1e12:.2f} TB/s read + write (decode attention below reads "
             "faster, so the copy kernel, not the memory, sets that figure).", ""]
    if "rows" in s.get("gemm", {}):
        lines += ["#### GEMMs", "", *gemm_lines(tables, s["gemm"]["rows"]), ""]
    if "rows" in s.get("decode_attention", {}):
        lines += ["#### Decode attention", "", *decode_lines(tables, s["decode_attention"]), ""]
    if "rows" in s.get("moe", {}):
        lines += ["#### Routed experts", "", *moe_lines(tables, s["moe"]), ""]
    power_runs = [run["sections"]["power"] for run in runs if "rows" in run["sections"].get("power", {})]
    if power_runs:
        lines += ["#### Power of single kernels", "", *power_lines(power_runs), ""]
    step = next((run["sections"]["decode_step_power"] for run in runs
                 if "rows" in run["sections"].get("decode_step_power", {})), None)
    if step:
        lines += ["#### Power of a whole decode step", "", *decode_step_lines(step), ""]
    broken = [f"{name}: {sec['error']}" for run in runs for name, sec in run["sections"].items() if "error" in sec]
    if broken:
        lines += ["Sections that failed on the device: " + "; ".join(broken), ""]
    return lines


def write_docs(lines: list[str], path: Path = DOCS) -> None:
    text = path.read_text()
    start, end = MARK
    if start not in text or end not in text:
        raise SystemExit(f"{path}: markers {start} ... {end} are missing; add them where the tables belong")
    head, rest = text.split(start, 1)
    path.write_text(head + start + "\n" + "\n".join(lines) + "\n" + end + rest.split(end, 1)[1])
    print(f"wrote the H200 kernel tables in {path.relative_to(ROOT)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path, default=DEFAULT_RUNS, help="device runs' JSON files")
    ap.add_argument("--write-docs", action="store_true", help="rewrite the tables in docs/accuracy.md")
    args = ap.parse_args()
    lines = report([json.loads(p.read_text()) for p in args.runs])
    print("\n".join(lines))
    if args.write_docs:
        write_docs(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
