"""Where does apmw's wide-EP decode step fall short? NVIDIA's measured SGLang wide-EP modules, summed, beside it.

Run: .venv/bin/python bench/wide_ep_components.py [--data ../shared/data]

apmw's furthest-off InferenceMAX rows are GB200 NVL72 Dynamo SGLang DeepSeek-R1 decode workers laid out DEP 32
or 48 (docs/accuracy.md, disaggregated table): their time per output token is 1.5-3x apmw's. To separate the
step's price from the batch apmw puts on it, every point is priced here at the *measured* running requests per
decode worker (Little's law: concurrency x (E2E - TTFT) / E2E), three ways, in ms per decode iteration:

* ``apmw``: the decode worker's step model (the plain roofline today: these layouts have no calibrated path) at
  that batch and the mean context (ISL + OSL / 2);
* ``modules``: aiconfigurator's measured SGLang 0.5.10 wide-EP modules on GB200 (``../shared/data/profiles/
  aiconfigurator/gb200/``), summed per layer: the whole MLA attention module (``wideep_generation_mla``,
  128 heads on each attention-DP rank, fp8 block weights and fp8 KV) on all 61 layers; the DeepEP masked MoE
  kernel (``wideep_generation_moe``, power-law 1.01 routing, the distribution apmw's fused-MoE tables use)
  and DeepEP's low-latency dispatch and combine (``wideep_deepep_ll``) on the 58 MoE layers. Not in it: the
  three dense layers' MLPs, norms, the LM head and sampling, the engine's own time; so it is a floor of
  what these modules cost. The MoE table has EP 2-256 (not 48): log-interpolated between the EPs around;
  outside a table's measured range the nearest two points extrapolate (marked ``*``). These are fp8 modules:
  for the FP4 rows they overstate the MoE's weight reads (the checkpoint's attention is 16-bit, which the fp8
  MLA module understates);
* ``measured``: the row's mean TPOT.

Prints one line per point and the median of (modules / measured) and (apmw / measured).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import accuracy as A  # noqa: E402  (this folder)
from apmw.capacity import disaggregated_benchmark as D  # noqa: E402
from apmw.errors import ApmwError  # noqa: E402
from apmw.perf.step import IterationLoad  # noqa: E402

TABLES = "profiles/aiconfigurator/gb200"
LAYERS, MOE_LAYERS = 61, 58           # DeepSeek-R1 (configs/models: num_hidden_layers 61, first_k_dense_replace 3)


def _interp_log2(x: float, xs: np.ndarray, ys: np.ndarray) -> tuple[float, bool]:
    """``ys`` at ``x`` linear in log2(x) between measured points, extrapolated from the nearest two outside
    them; and whether it was extrapolated."""
    order = np.argsort(xs)
    lx, y = np.log2(np.asarray(xs, dtype=float)[order]), np.asarray(ys, dtype=float)[order]
    t = float(np.log2(x))
    if lx[0] <= t <= lx[-1] or len(lx) < 2:
        return float(np.interp(t, lx, y)), False
    i = (0, 1) if t < lx[0] else (-2, -1)
    slope = (y[i[1]] - y[i[0]]) / (lx[i[1]] - lx[i[0]])
    return float(y[i[0]] + slope * (t - lx[i[0]])), True


def _mla_ms(mla: pd.DataFrame, batch: float, context: float) -> tuple[float, bool]:
    """One layer's MLA module at ``batch`` sequences on a rank and ``context`` tokens each."""
    rows = mla[mla.num_heads == 128]
    batches = np.sort(rows.batch_size.unique())
    lo = batches[max(np.searchsorted(batches, batch, side="right") - 1, 0)]
    hi = batches[min(np.searchsorted(batches, batch), len(batches) - 1)]
    at = {}
    flag = False
    for b in {lo, hi}:
        r = rows[rows.batch_size == b]
        at[b], f = _interp_log2(context, r.isl.to_numpy(), r.latency.to_numpy())
        flag |= f
    if lo == hi:
        return at[lo], flag or batch != lo
    v, _ = _interp_log2(batch, np.array([lo, hi]), np.array([at[lo], at[hi]]))
    return v, flag


def _moe_ms(moe: pd.DataFrame, tokens: float, ep: int) -> tuple[float, bool]:
    """One MoE layer's DeepEP masked kernel on the busiest rank at ``tokens`` tokens over the EP group."""
    rows = moe[moe.distribution == "power_law_1.01"]
    eps = np.sort(rows.moe_ep_size.unique())
    near = [e for e in eps if e <= ep][-1:] + [e for e in eps if e >= ep][:1]
    at, flag = {}, False
    for e in set(near):
        r = rows[rows.moe_ep_size == e]
        at[e], f = _interp_log2(tokens, r.num_tokens.to_numpy(), r.latency.to_numpy())
        flag |= f
    if len(at) == 1:
        return next(iter(at.values())), flag
    v, _ = _interp_log2(ep, np.array(sorted(at)), np.array([at[e] for e in sorted(at)]))
    return v, flag


def _deepep_ms(ll: pd.DataFrame, tokens_per_rank: float) -> tuple[float, bool]:
    """DeepEP low-latency dispatch + combine of one MoE layer at ``tokens_per_rank``."""
    r = ll[(ll.hidden_size == 7168) & (ll.num_topk == 8) & (ll.num_experts == 256)]
    v, f = _interp_log2(max(tokens_per_rank, 1.0), r.num_token.to_numpy(),
                        (r.dispatch_avg_t_us + r.combine_avg_t_us).to_numpy() / 1e3)
    return v, f


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    a = ap.parse_args()
    base = a.data / TABLES
    mla = pd.read_parquet(base / "mla/sglang/0.5.10/wideep_generation_mla_perf.parquet")
    moe = pd.read_parquet(base / "moe/sglang/0.5.10/wideep_generation_moe_perf.parquet")
    ll = pd.read_parquet(base / "comm/sglang/0.5.12/wideep_deepep_ll_perf.parquet")
    rows = [r for r in A.imax_disagg_rows(a.data / "benchmarks") if r.gpu.startswith("GB200")
            and "sglang" in r.framework and not r.note.startswith("not")]
    print("| precision | ISL/OSL | conc | decode worker | running / worker | per rank | apmw ms | modules ms "
          "(MLA + MoE + DeepEP) | measured ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    ratios_modules, ratios_apmw, skipped = [], [], []
    for r in rows:
        _, dec = r.disagg
        wdt, kvd = r.note.split("/")
        try:
            rep = D._worker_replica("decode", dec, r.priced, r.gpu, wdt, kvd, r.isl, r.osl,
                                    dict(engine=r.engine, calibrated=True, token_budget=None, max_batch=None,
                                         kv_memory_fraction=None,
                                         request_overhead_s=A.HARNESS_OVERHEAD_S["InferenceMAX"], moe_dtype=None,
                                         engine_version=None, mxfp4_moe_activations=None, speculative=r.speculative))
        except ApmwError as exc:
            skipped.append(f"{r.precision} {r.isl}/{r.osl} conc {r.concurrency}: {exc}")
            continue
        step, lay = rep.step, rep.step.parallel
        m = r.measured
        running = r.concurrency * (m["e2e_s"] - m["ttft_s"]) / m["e2e_s"] / dec.count
        context = r.isl + r.osl / 2
        load = IterationLoad(np.array([running]), np.array([0.0]),
                             np.array([running * context * step.kv_bytes_per_token]), np.array([0.0]))
        apmw_ms = 1e3 * float(step.iteration_time_s(load)[0])
        per_rank = running / lay.dp
        mla_ms, f1 = _mla_ms(mla, np.ceil(per_rank), context)
        moe_ms, f2 = _moe_ms(moe, running, lay.ep)
        ep_ms, f3 = _deepep_ms(ll, np.ceil(per_rank))
        modules = LAYERS * mla_ms + MOE_LAYERS * (moe_ms + ep_ms)
        star = "*" if f1 or f2 or f3 else ""
        measured_ms = 1e3 * m["tpot_s"]
        ratios_modules.append(modules / measured_ms)
        ratios_apmw.append(apmw_ms / measured_ms)
        print(f"| {r.precision} | {r.isl}/{r.osl} | {r.concurrency} | {dec.count} x {lay.describe()} | {running:,.0f} | "
              f"{per_rank:.1f} | {apmw_ms:.1f} | {modules:.1f}{star} ({LAYERS * mla_ms:.1f} + {MOE_LAYERS * moe_ms:.1f} + "
              f"{MOE_LAYERS * ep_ms:.1f}) | {measured_ms:.1f} |")
    print(f"\n{len(ratios_apmw)} points; median modules / measured {statistics.median(ratios_modules):.2f}, "
          f"apmw / measured {statistics.median(ratios_apmw):.2f}")
    for reason in sorted({line.split(": ", 1)[1] for line in skipped}):
        print(f"skipped {sum(line.endswith(reason) for line in skipped)} point(s), apmw refuses the worker: {reason}")


if __name__ == "__main__":
    main()
