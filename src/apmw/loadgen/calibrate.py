"""Measure an endpoint's step times and fit the planner's roofline efficiencies to them.

``apmw bench --calibrate FILE`` sends, on an otherwise idle server:

* **TTFT vs prompt length** -- one request at a time, fresh random text (no prefix-cache hits),
  ``max_tokens`` 2, ``repeats`` times per length: the time of a whole-prompt prefill;
* **TPOT vs concurrency** -- ``B`` requests at once with short prompts and ``decode_tokens``
  output tokens each: per-token decode latency at batch ``B`` (the batching curve).

The file (JSON, ``"format": "apmw-calibration/1"``) holds both tables, raw medians, and a
straight-line fit of each (documented in docs/bench.md). :func:`efficiency_from_calibration`
fits the three :class:`~apmw.perf.Efficiency` numbers (``fixed_s``, ``bandwidth``, ``flops``) of
the roofline step model for a given spec's model and hardware to the measured points, so
``apmw plan`` (via ``--compare-plan --calibration``) predicts with them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as _dt
import json
from pathlib import Path

import numpy as np

from apmw.loadgen.bench import make_text
from apmw.loadgen.client import BenchError, Client
from apmw.perf import DEFAULT_EFFICIENCY, Efficiency, IterationLoad, RooflineStepModel, replica_from_spec
from apmw.spec import Spec

FORMAT = "apmw-calibration/1"
PROMPT_TOKENS = (32, 128, 512, 1024, 1536)
CONCURRENCY = (1, 2, 4, 8)
DECODE_TOKENS = 64
DECODE_PROMPT_TOKENS = 32


async def _ttft_row(client: Client, text, rng, n: int, repeats: int) -> dict:
    samples = []
    for r in range(repeats):
        res = await client.call(text.text(n - 1, rng).lstrip(), 2, f"calibrate-ttft-{n}-{r}")   # +1 for BOS
        if not res.ok:
            raise BenchError(f"calibration call ({n} prompt tokens) failed: {res.fault}: {res.detail}")
        samples.append((res.ttft_s, res.prompt_tokens or n))
    t = [s[0] for s in samples]
    return {"prompt_tokens": int(np.median([s[1] for s in samples])), "samples": len(t),
            "ttft_s_p50": float(np.median(t)), "ttft_s_min": float(min(t)), "ttft_s_mean": float(np.mean(t))}


async def _tpot_row(client: Client, text, rng, b: int, decode_tokens: int) -> dict:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    results = await asyncio.gather(*(client.call(text.text(DECODE_PROMPT_TOKENS - 1, rng).lstrip(), decode_tokens,
                                                 f"calibrate-tpot-{b}-{i}") for i in range(b)))
    wall = loop.time() - t0
    bad = [r for r in results if not r.ok]
    if bad:
        raise BenchError(f"calibration at concurrency {b} failed: {bad[0].fault}: {bad[0].detail}")
    tpot = [r.tpot_s for r in results if r.tpot_s is not None]
    return {"concurrency": b, "samples": len(tpot), "tpot_s_p50": float(np.median(tpot)),
            "tpot_s_mean": float(np.mean(tpot)), "output_tokens": decode_tokens,
            "output_tokens_per_s": sum(r.output_tokens or 0 for r in results) / wall}


async def measure_calibration(endpoint: str, model: str, path: Path, api_key: str | None = None,
                              timeout_s: float = 60.0, seed: int = 0, prompt_tokens=PROMPT_TOKENS,
                              concurrency=CONCURRENCY, repeats: int = 3, decode_tokens: int = DECODE_TOKENS) -> dict:
    """Measure both tables against ``endpoint`` and write the calibration file to ``path``."""
    client = Client(endpoint, model, api="completions", api_key=api_key, timeout_s=timeout_s,
                    max_connections=max(concurrency) + 2)
    rng = np.random.default_rng(seed)
    try:
        text = await make_text(client)
        await client.call(text.text(16, rng), 4, "calibrate-warmup")     # first call pays one-off set-up
        ttft = [await _ttft_row(client, text, rng, n, repeats) for n in prompt_tokens]
        tpot = [await _tpot_row(client, text, rng, b, decode_tokens) for b in concurrency]
    finally:
        await client.close()
    a, b0 = np.polyfit([r["prompt_tokens"] for r in ttft], [r["ttft_s_p50"] for r in ttft], 1)
    d, c0 = np.polyfit([r["concurrency"] for r in tpot], [r["tpot_s_p50"] for r in tpot], 1)
    cal = {
        "format": FORMAT,
        "endpoint": client.base, "model": model,
        "measured_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "token_count_method": text.method,
        "decode_prompt_tokens": DECODE_PROMPT_TOKENS,
        "ttft_vs_prompt_tokens": ttft,
        "tpot_vs_concurrency": tpot,
        "linear_fit": {"ttft_intercept_s": float(b0), "prefill_s_per_token": float(a),
                       "tpot_intercept_s": float(c0), "tpot_s_per_sequence": float(d)},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cal, indent=2) + "\n")
    return cal


def read_calibration(path: Path) -> dict:
    try:
        cal = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise BenchError(f"{path}: calibration file not found (write one with apmw bench --calibrate FILE)") from None
    except json.JSONDecodeError as exc:
        raise BenchError(f"{path}: line {exc.lineno}: not JSON ({exc.msg})") from None
    if not isinstance(cal, dict) or cal.get("format") != FORMAT:
        raise BenchError(f"{path}: 'format' must be {FORMAT!r} -- not an apmw calibration file")
    for key in ("ttft_vs_prompt_tokens", "tpot_vs_concurrency"):
        if not isinstance(cal.get(key), list) or len(cal[key]) < 2:
            raise BenchError(f"{path}: '{key}' needs at least two rows")
    return cal


def _points(cal: dict, spec: Spec):
    """Iteration loads of the calibration points for the spec's model, and their measured times."""
    arch, kv_dtype = replica_from_spec(spec).arch, spec.model.kv_dtype
    loads, times = [], []
    for r in cal["ttft_vs_prompt_tokens"]:
        n = float(r["prompt_tokens"])
        loads.append(IterationLoad(decode_seqs=0.0, prefill_tokens=n, kv_read_bytes=0.0,
                                   attention_flops=n * float(arch.attention_flops_per_token(n / 2))))
        times.append(r["ttft_s_p50"])
    ctx = cal.get("decode_prompt_tokens", DECODE_PROMPT_TOKENS)
    for r in cal["tpot_vs_concurrency"]:
        b, c = float(r["concurrency"]), ctx + r.get("output_tokens", DECODE_TOKENS) / 2
        loads.append(IterationLoad(decode_seqs=b, prefill_tokens=0.0,
                                   kv_read_bytes=b * float(arch.kv_bytes_for_context(c, kv_dtype)),
                                   attention_flops=b * float(arch.attention_flops_per_token(c))))
        times.append(r["tpot_s_p50"])
    return loads, np.array(times)


def efficiency_from_calibration(cal: dict, spec: Spec) -> Efficiency:
    """The ``fixed_s``, ``bandwidth`` and ``flops`` efficiencies that best reproduce the measurement.

    Least squares on log(predicted / measured) over all TTFT and TPOT points, with the spec's
    GPU figures as the peaks the efficiencies scale. Values above 1 mean the spec's peaks are
    lower than what the server reached (e.g. nominal figures for a CPU 'GPU').
    """
    from scipy.optimize import least_squares

    loads, measured = _points(cal, spec)
    step = replica_from_spec(spec).step

    def predict(x: np.ndarray) -> np.ndarray:
        eff = _efficiency(*np.exp(x), source="")
        # the plain roofline: its efficiencies are what a calibration fits (apmw plan reads them with
        # calibrated=False)
        s = RooflineStepModel(arch=step.arch, gpu=step.gpu, gpus=step.gpus, weight_dtype=step.weight_dtype,
                      kv_dtype=step.kv_dtype, efficiency=eff, attention_data_parallel=step.attention_data_parallel)
        return np.array([float(s.iteration_time_s(ld)) for ld in loads])

    x0 = np.log([max(float(measured.min()) / 2, 1e-5), DEFAULT_EFFICIENCY.bandwidth, DEFAULT_EFFICIENCY.flops["bf16"]])
    fit = least_squares(lambda x: np.log(predict(x) / measured), x0)
    fixed, bw, fl = (float(v) for v in np.exp(fit.x))
    rms = float(np.sqrt(np.mean(fit.fun ** 2)))
    return _efficiency(fixed, bw, fl, source=f"fitted to calibration of {cal.get('endpoint')} "
                       f"({cal.get('measured_at')}): fixed {fixed * 1e3:.3g} ms, bandwidth x{bw:.3g}, "
                       f"flops x{fl:.3g}, rms log error {rms:.2f}")


def _efficiency(fixed_s: float, bandwidth: float, flops: float, source: str) -> Efficiency:
    """One bandwidth and one flops factor for every dtype (a calibration measures one server, one dtype).

    Sets whichever per-dtype tables :class:`Efficiency` has (weights, KV), so the fitted
    bandwidth is the one the step model uses whatever the spec's dtypes are.
    """
    changes = {"fixed_s": fixed_s, "bandwidth": bandwidth, "source": source,
               "flops": {k: flops for k in DEFAULT_EFFICIENCY.flops}}
    for name in ("bandwidth_by_dtype", "kv_bandwidth_by_dtype"):
        table = getattr(DEFAULT_EFFICIENCY, name, None)
        if isinstance(table, dict):
            changes[name] = {k: bandwidth for k in table}
    return dataclasses.replace(DEFAULT_EFFICIENCY, **changes)
