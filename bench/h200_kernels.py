"""Measure on a real GPU what apmw's shipped kernel tables claim: GEMMs, decode attention, grouped
expert GEMMs, and the board power while each runs (issue 22 item 7).

Runs under the GPU machine's own PyTorch (it imports nothing from apmw, so it needs no install):

    python3 bench/h200_kernels.py OUT_DIR [--budget-s 420]

and writes ``OUT_DIR/h200_kernels.json`` after every section, so a run cut short keeps what it
measured. ``bench/kernels_vs_tables.py`` reads that file on any machine and compares it with the
interpolated tables (``docs/accuracy.md``, "Measured on an H200").

Method (the device tool's METHOD.md):
- every kernel is timed as a CUDA graph of R launches replayed 7 times after 2 warm-ups; the
  median replay over R is one launch's time, so launch gaps are those of a graph-captured engine;
- weights (and KV caches) rotate among enough copies to fill four times the 60 MB L2, because in a
  model every layer reads different weights: repeated reads of one copy would measure the cache;
- inputs are random normal, never zeros;
- power is NVML's instantaneous board power (``NVML_FI_DEV_POWER_INSTANT``, else the averaged
  reading), sampled every 20 ms while one kernel replays for ``POWER_HOLD_S`` seconds; the median
  of the second half of the samples is reported, with the SM clock and the temperature.

Kernels are PyTorch's (cuBLAS(Lt) for ``F.linear`` and ``torch._scaled_mm`` with per-tensor
scales, FlashAttention-2 through SDPA for decode attention on a contiguous cache,
``torch._grouped_mm`` for routed experts). The tables are vLLM 0.24.0's (FA3 on a paged cache,
CUTLASS fp8, fused MoE), so agreement bounds the tables' physics, not vLLM's exact kernels.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

L2_DEFEAT_BYTES = 256 * 2**20
GRAPH_TARGET_S = 3e-3            # one graph replay should last about this long
POWER_HOLD_S = 2.5

# Per-rank (n, k) of y = x @ W^T, W of shape (n, k): the layers apmw prices from gemm_* tables.
GEMM_SHAPES = {
    "llama3.1-8b tp1": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
                        "down": (4096, 14336), "lm_head": (128256, 4096)},
    "llama3.1-70b tp8": {"qkv": (1280, 8192), "o": (8192, 1024), "gate_up": (7168, 8192),
                         "down": (8192, 3584)},
    "deepseek-v3 tp8": {"q_a+kv_a": (2112, 7168), "q_b": (3072, 1536), "kv_b": (4096, 512),
                        "o": (7168, 2048), "dense gate_up": (4608, 7168), "dense down": (7168, 2304)},
}
GEMM_M = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]

# Decode attention per rank: (query heads, KV heads, head dim) as the dec_* tables name them.
ATTENTION_HEADS = {"llama3.1-8b tp1": (32, 8, 128), "llama3.1-70b tp8": (8, 1, 128),
                   "gpt-oss tp1": (64, 8, 64)}
ATTENTION_BATCH = [1, 4, 16, 64, 256]
ATTENTION_STEP = [1023, 4095, 16383, 65535]     # the tables' dec_step grid points (past tokens)
ATTENTION_MAX_BYTES = 24 * 2**30
ATTENTION_BACKENDS = [(SDPBackend.FLASH_ATTENTION, "flash"), (SDPBackend.CUDNN_ATTENTION, "cudnn"),
                      (SDPBackend.EFFICIENT_ATTENTION, "efficient")]

# Routed experts per rank: (hidden, expert intermediate, top-k, experts), as the moe_* tables name them.
MOE_SHAPES = {"qwen3-30b-a3b tp1": (2048, 768, 8, 128), "qwen3-235b-a22b tp8": (4096, 1536 // 8, 8, 128),
              "gpt-oss-120b tp1": (2880, 2880, 4, 128)}
MOE_TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting new points after this long")
    ap.add_argument("--only", default="", help="comma-separated sections to run (default: all)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this script measures a GPU and has nothing to do here", file=sys.stderr)
        return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out_path = args.out_dir / "h200_kernels.json"
    deadline = time.monotonic() + args.budget_s
    torch.manual_seed(0)
    result: dict = {"device": device_facts(), "method": __doc__.split("Method")[1].strip(), "sections": {}}
    sections = [("ceilings", ceilings), ("gemm", gemms), ("decode_attention", decode_attention),
                ("moe", grouped_experts), ("power", power_points), ("decode_step_power", decode_step_power)]
    only = {x for x in args.only.split(",") if x}
    for name, run in sections:
        if only and name not in only:
            continue
        t0 = time.monotonic()
        try:
            result["sections"][name] = run(deadline)
        except Exception as e:  # noqa: BLE001 - one broken section must not lose the others
            result["sections"][name] = {"error": f"{type(e).__name__}: {e}"}
        print(f"{name}: {time.monotonic() - t0:.1f} s", flush=True)
        out_path.write_text(json.dumps(result, indent=1))
    summarise(result)
    return 0


def device_facts() -> dict:
    p = torch.cuda.get_device_properties(0)
    return {"name": p.name, "sms": p.multi_processor_count, "memory_bytes": p.total_memory,
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


# ---- timing ---------------------------------------------------------------------------------------

def copies_for(nbytes: int) -> int:
    """How many copies of an operand make its reads miss a 60 MB L2."""
    return max(1, min(64, math.ceil(L2_DEFEAT_BYTES / max(nbytes, 1))))


def time_launch_s(calls: list) -> float:
    """Median time of one launch, cycling through ``calls`` (closures over different operand copies)."""
    for c in calls[:2]:
        c()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for c in calls:
        c()
    end.record()
    torch.cuda.synchronize()
    eager_s = start.elapsed_time(end) / 1e3 / len(calls)
    reps = max(len(calls), min(2000, int(GRAPH_TARGET_S / max(eager_s, 1e-6))))
    reps = math.ceil(reps / len(calls)) * len(calls)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        for i in range(reps):
            calls[i % len(calls)]()
    for _ in range(2):
        graph.replay()
    samples = []
    for _ in range(7):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / reps)
    del graph
    return statistics.median(samples)


def graph_of(calls: list, hold_s: float) -> torch.cuda.CUDAGraph:
    """A graph that replays ``calls`` for about ``hold_s / 50`` seconds (for the power hold)."""
    per = time_launch_s(calls)
    reps = max(len(calls), int(hold_s / 50 / per))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(reps):
            calls[i % len(calls)]()
    return graph


# ---- sections -------------------------------------------------------------------------------------

def ceilings(deadline: float) -> dict:
    n = 2**30                                   # 2 GiB of bf16 copied: bytes read + written
    a = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    b = torch.empty_like(a)
    copy_s = time_launch_s([lambda: b.copy_(a)])
    a = b = None
    out = {"copy_bytes_per_s": 2 * 2 * n / copy_s}
    m = 8192
    x = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    out["bf16_matmul_flops_per_s"] = 2 * m**3 / time_launch_s([lambda: x @ w])
    xf, wf = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    out["fp8_matmul_flops_per_s"] = 2 * m**3 / time_launch_s(
        [lambda: torch._scaled_mm(xf, wf, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)])
    return out


def gemms(deadline: float) -> dict:
    rows = []
    for model, shapes in GEMM_SHAPES.items():
        for layer, (n, k) in shapes.items():
            for dtype in ("bf16", "fp8"):
                if time.monotonic() > deadline:
                    rows.append({"model": model, "layer": layer, "dtype": dtype, "skipped": "out of time"})
                    continue
                rows.extend(_gemm_rows(model, layer, n, k, dtype))
            torch.cuda.empty_cache()
    return {"rows": rows}


def _gemm_rows(model: str, layer: str, n: int, k: int, dtype: str) -> list[dict]:
    elem = 2 if dtype == "bf16" else 1
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies_for(n * k * elem))]
    if dtype == "fp8":
        weights = [w.to(torch.float8_e4m3fn).t() for w in weights]      # column-major (k, n), as cuBLASLt wants
    one = torch.ones((), device="cuda")
    rows = []
    for m in GEMM_M:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        try:
            if dtype == "bf16":
                calls = [lambda w=w: F.linear(x, w) for w in weights]
            else:
                xq = x.to(torch.float8_e4m3fn)
                calls = [lambda w=w: torch._scaled_mm(xq, w, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
                         for w in weights]
            t = time_launch_s(calls)
            rows.append({"model": model, "layer": layer, "dtype": dtype, "m": m, "n": n, "k": k, "time_s": t,
                         "tflops": 2 * m * n * k / t / 1e12,
                         "weight_gb_per_s": n * k * elem / t / 1e9})
        except Exception as e:  # noqa: BLE001
            rows.append({"model": model, "layer": layer, "dtype": dtype, "m": m, "n": n, "k": k,
                         "error": f"{type(e).__name__}: {e}"[:300]})
    return rows


def decode_attention(deadline: float) -> dict:
    """One decode step's attention per layer. A query head group shares its KV head, so the step is a
    non-causal attention of ``heads / kv_heads`` queries per KV head (exact for one new token)."""
    rows = []
    for model, (heads, kv_heads, hd) in ATTENTION_HEADS.items():
        for b in ATTENTION_BATCH:
            for step in ATTENTION_STEP:
                kv_len = step + 1
                kv_bytes = 2 * b * kv_heads * kv_len * hd * 2
                row = {"model": model, "heads": heads, "kv_heads": kv_heads, "head_dim": hd, "batch": b,
                       "step": step, "kv_bytes": kv_bytes}
                if kv_bytes > ATTENTION_MAX_BYTES:
                    rows.append({**row, "skipped": "cache over 24 GiB"})
                    continue
                if time.monotonic() > deadline:
                    rows.append({**row, "skipped": "out of time"})
                    continue
                caches = [(torch.randn(b, kv_heads, kv_len, hd, device="cuda", dtype=torch.bfloat16),
                           torch.randn(b, kv_heads, kv_len, hd, device="cuda", dtype=torch.bfloat16))
                          for _ in range(copies_for(kv_bytes))]
                q = torch.randn(b, kv_heads, heads // kv_heads, hd, device="cuda", dtype=torch.bfloat16)
                for backend, label in ATTENTION_BACKENDS:
                    try:
                        with sdpa_kernel([backend]):
                            t = time_launch_s([lambda kc=kc, vc=vc: F.scaled_dot_product_attention(q, kc, vc)
                                               for kc, vc in caches])
                        row[f"{label}_s"] = t
                    except Exception as e:  # noqa: BLE001
                        row[f"{label}_error"] = f"{type(e).__name__}: {e}"[:200]
                times = [row[f"{label}_s"] for _, label in ATTENTION_BACKENDS if f"{label}_s" in row]
                if times:
                    row["time_s"] = min(times)
                    row["kv_gb_per_s"] = kv_bytes / row["time_s"] / 1e9
                else:
                    row["error"] = "; ".join(str(row.get(f"{label}_error")) for _, label in ATTENTION_BACKENDS)
                rows.append(row)
                caches = q = None
                torch.cuda.empty_cache()
    return {"kernel": "torch SDPA on a contiguous bf16 cache, the faster of the backends timed",
            "backends": [label for _, label in ATTENTION_BACKENDS], "rows": rows}


def grouped_experts(deadline: float) -> dict:
    """Routed experts as two grouped GEMMs (gate/up, down) over tokens sorted by expert."""
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(1)
    for model, (h, inter, topk, experts) in MOE_SHAPES.items():
        w_bytes = experts * 3 * h * inter * 2
        sets = copies_for(w_bytes)
        w13 = [torch.randn(experts, h, 2 * inter, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
        w2 = [torch.randn(experts, inter, h, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
        for t_count in MOE_TOKENS:
            row = {"model": model, "hidden": h, "inter": inter, "topk": topk, "experts": experts, "tokens": t_count}
            if time.monotonic() > deadline:
                rows.append({**row, "skipped": "out of time"})
                continue
            try:
                scores = torch.rand(t_count, experts, device="cuda", generator=gen)
                chosen = scores.topk(topk, dim=1).indices.flatten()
                counts = torch.bincount(chosen, minlength=experts)
                offs = torch.cumsum(counts, 0).to(torch.int32)
                x = torch.randn(t_count * topk, h, device="cuda", dtype=torch.bfloat16)
                act = torch.randn(t_count * topk, inter, device="cuda", dtype=torch.bfloat16)

                try:
                    t = time_launch_s([lambda i=i: (torch._grouped_mm(x, w13[i], offs=offs),
                                                    torch._grouped_mm(act, w2[i], offs=offs)) for i in range(sets)])
                except RuntimeError:
                    # some builds take the expert weights only column-major
                    w13 = [w.transpose(-2, -1).contiguous().transpose(-2, -1) for w in w13]
                    w2 = [w.transpose(-2, -1).contiguous().transpose(-2, -1) for w in w2]
                    t = time_launch_s([lambda i=i: (torch._grouped_mm(x, w13[i], offs=offs),
                                                    torch._grouped_mm(act, w2[i], offs=offs)) for i in range(sets)])
                    row["weights"] = "column-major"
                active = int((counts > 0).sum())
                rows.append({**row, "time_s": t, "active_experts": active,
                             "weight_gb_per_s": active * 3 * h * inter * 2 / t / 1e9})
            except Exception as e:  # noqa: BLE001
                rows.append({**row, "error": f"{type(e).__name__}: {e}"[:300]})
        w13 = w2 = None
        torch.cuda.empty_cache()
    return {"kernel": "torch._grouped_mm bf16, gate/up then down, uniform random top-k routing (seed 1)",
            "rows": rows}


# ---- power ----------------------------------------------------------------------------------------

class PowerMeter:
    """NVML board power, sampled on a thread while a kernel replays."""

    def __init__(self) -> None:
        import pynvml
        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.field = getattr(pynvml, "NVML_FI_DEV_POWER_INSTANT", None)
        self.limit_w = pynvml.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1e3

    def read_w(self) -> tuple[float, str]:
        if self.field is not None:
            try:
                v = self.nvml.nvmlDeviceGetFieldValues(self.handle, [self.field])[0]
                if v.nvmlReturn == 0:
                    return v.value.uiVal / 1e3, "instant"
            except Exception:  # noqa: BLE001 - older drivers: fall back to the averaged reading
                self.field = None
        return self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1e3, "average"

    def energy_j(self) -> float:
        return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1e3

    def hold(self, replay, seconds: float, gap_s: float = 0.0) -> dict:
        samples: list[tuple[float, float, str, int, int]] = []
        stop = threading.Event()

        def sample() -> None:
            t0 = time.monotonic()
            while not stop.is_set():
                w, kind = self.read_w()
                clock = self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM)
                temp = self.nvml.nvmlDeviceGetTemperature(self.handle, self.nvml.NVML_TEMPERATURE_GPU)
                samples.append((time.monotonic() - t0, w, kind, clock, temp))
                time.sleep(0.02)

        thread = threading.Thread(target=sample)
        thread.start()
        t0 = time.monotonic()
        e0 = t_e0 = None
        busy_s = 0.0
        while time.monotonic() - t0 < seconds:
            if e0 is None and time.monotonic() - t0 >= seconds / 2:
                e0, t_e0 = self.energy_j(), time.monotonic()
            if replay is None:
                time.sleep(0.05)
            else:
                t1 = time.monotonic()
                replay()
                torch.cuda.synchronize()
                busy_s += time.monotonic() - t1
                if gap_s:
                    time.sleep(gap_s)
        energy_w = (self.energy_j() - e0) / (time.monotonic() - t_e0) if e0 is not None else None
        stop.set()
        thread.join()
        late = [s for s in samples if s[0] >= seconds / 2]
        return {"power_w": statistics.median(s[1] for s in late), "power_w_max": max(s[1] for s in late),
                "power_w_mean": statistics.fmean(s[1] for s in late), "energy_power_w": energy_w,
                "host_busy_share": busy_s / seconds,
                "reading": late[0][2], "sm_clock_mhz": statistics.median(s[3] for s in late),
                "temperature_c": max(s[4] for s in late), "samples": len(late)}


def power_points(deadline: float) -> dict:
    meter = PowerMeter()
    rows = [{"point": "idle", **meter.hold(None, POWER_HOLD_S)}]
    big = 8192
    x = torch.randn(big, big, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(big, big, device="cuda", dtype=torch.bfloat16)
    xf, wf = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    points = {
        "bf16 GEMM 8192^3 (compute-bound)": [lambda: x @ w],
        "fp8 GEMM 8192^3 (compute-bound)": [lambda: torch._scaled_mm(xf, wf, scale_a=one, scale_b=one,
                                                                      out_dtype=torch.bfloat16)],
    }
    n, k = 7168, 8192                                      # Llama-70B TP8 gate/up: weight streaming
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies_for(n * k * 2))]
    for m in (1, 64, 512, 4096):
        xm = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        points[f"bf16 GEMM m={m} n={n} k={k}"] = [lambda w=w, xm=xm: F.linear(xm, w) for w in ws]
    src = torch.randn(2**30, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    points["2 GiB device copy (memory-bound)"] = [lambda: dst.copy_(src)]
    b, heads, kv_heads, hd, kv_len = 64, 8, 1, 128, 16384
    q = torch.randn(b, kv_heads, heads // kv_heads, hd, device="cuda", dtype=torch.bfloat16)
    kv = [(torch.randn(b, kv_heads, kv_len, hd, device="cuda", dtype=torch.bfloat16),
           torch.randn(b, kv_heads, kv_len, hd, device="cuda", dtype=torch.bfloat16)) for _ in range(2)]
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        points[f"decode attention b={b} ctx={kv_len} {heads}/{kv_heads}/{hd}"] = [
            lambda kc=kc, vc=vc: F.scaled_dot_product_attention(q, kc, vc) for kc, vc in kv]
        for name, calls in points.items():
            if time.monotonic() > deadline:
                rows.append({"point": name, "skipped": "out of time"})
                continue
            try:
                per = time_launch_s(calls)
                graph = graph_of(calls, POWER_HOLD_S)
                rows.append({"point": name, "launch_s": per, **meter.hold(graph.replay, POWER_HOLD_S)})
                del graph
            except Exception as e:  # noqa: BLE001
                rows.append({"point": name, "error": f"{type(e).__name__}: {e}"[:300]})
    rows.append({"point": "idle after", **meter.hold(None, POWER_HOLD_S)})
    return {"enforced_power_limit_w": meter.limit_w, "rows": rows}


def decode_step_power(deadline: float) -> dict:
    """A whole Llama-3.1-8B (TP1, bf16) decode step as one graph: per layer the qkv GEMM, attention over a
    2,048-token cache per sequence, o, gate/up, SiLU-and-mul and down, then the lm_head. Its time and board
    power at several batches back to back, then at one batch with host-side gaps between steps (the duty
    cycle an engine's scheduling and sampling leave)."""
    meter = PowerMeter()
    hidden, heads, kv_heads, hd, inter, layers, vocab, ctx = 4096, 32, 8, 128, 14336, 32, 128256, 2048
    bf = torch.bfloat16
    w = [{"qkv": torch.randn((heads + 2 * kv_heads) * hd, hidden, device="cuda", dtype=bf) * 0.02,
          "o": torch.randn(hidden, heads * hd, device="cuda", dtype=bf) * 0.02,
          "gate_up": torch.randn(2 * inter, hidden, device="cuda", dtype=bf) * 0.02,
          "down": torch.randn(hidden, inter, device="cuda", dtype=bf) * 0.02} for _ in range(layers)]
    lm_head = torch.randn(vocab, hidden, device="cuda", dtype=bf) * 0.02
    rows = []
    for b in (1, 8, 32, 128, 256):
        if time.monotonic() > deadline:
            rows.append({"batch": b, "skipped": "out of time"})
            continue
        try:
            cache = [(torch.randn(b, kv_heads, ctx, hd, device="cuda", dtype=bf),
                      torch.randn(b, kv_heads, ctx, hd, device="cuda", dtype=bf)) for _ in range(layers)]
            x0 = torch.randn(b, hidden, device="cuda", dtype=bf)

            def step(x0=x0, cache=cache, b=b):
                x = x0
                for lw, (kc, vc) in zip(w, cache):
                    qkv = F.linear(x, lw["qkv"])
                    q = qkv[:, : heads * hd].reshape(b, kv_heads, heads // kv_heads, hd)
                    a = F.scaled_dot_product_attention(q, kc, vc).reshape(b, heads * hd)
                    x = x + F.linear(a, lw["o"])
                    g, u = F.linear(x, lw["gate_up"]).chunk(2, dim=-1)
                    x = x + F.linear(F.silu(g) * u, lw["down"])
                return F.linear(x, lm_head)

            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                step()
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    step()
            for _ in range(3):
                graph.replay()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            times = []
            for _ in range(10):
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            step_s = statistics.median(times)
            rows.append({"batch": b, "context": ctx, "step_s": step_s, "duty": 1.0,
                         **meter.hold(graph.replay, POWER_HOLD_S)})
            if b == 32:
                for duty in (0.75, 0.5, 0.25):
                    gap = step_s * (1 / duty - 1)
                    rows.append({"batch": b, "context": ctx, "step_s": step_s, "duty": duty, "gap_s": gap,
                                 **meter.hold(graph.replay, POWER_HOLD_S, gap_s=gap)})
            del graph
        except Exception as e:  # noqa: BLE001
            rows.append({"batch": b, "error": f"{type(e).__name__}: {e}"[:300]})
        finally:
            cache = None
            torch.cuda.empty_cache()
    rows.append({"batch": 0, "point": "idle after", **meter.hold(None, POWER_HOLD_S)})
    return {"model": "Llama-3.1-8B shapes, TP1, bf16 weights and KV, random weights", "rows": rows}


def summarise(result: dict) -> None:
    s = result["sections"]
    print(json.dumps(result["device"]))
    print("ceilings:", json.dumps(s.get("ceilings")))
    for name in ("gemm", "decode_attention", "moe"):
        rows = s.get(name, {}).get("rows", [])
        ok = [r for r in rows if "time_s" in r]
        bad = [r for r in rows if "error" in r]
        print(f"{name}: {len(ok)} timed, {len(bad)} errors, {len(rows) - len(ok) - len(bad)} skipped")
        for r in bad[:3]:
            print("  error:", r["error"][:200])
    gem = [r for r in s.get("gemm", {}).get("rows", []) if "time_s" in r and r["m"] in (1, 64, 4096)]
    for r in gem:
        print(f"  gemm {r['model']:18s} {r['layer']:14s} {r['dtype']} m={r['m']:5d} {r['time_s'] * 1e6:9.1f} us")
    for r in s.get("power", {}).get("rows", []):
        print("  power", r.get("point"), r.get("power_w"), r.get("energy_power_w"), r.get("sm_clock_mhz"), r.get("error", ""))
    for r in s.get("decode_step_power", {}).get("rows", []):
        print("  step", {k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()})


if __name__ == "__main__":
    sys.exit(main())
