"""Measure an endpoint's step times, and price a replica's iterations from them.

``apmw bench --calibrate FILE`` sends, on an otherwise idle server:

* **TTFT vs prompt length** -- one request at a time, fresh random text (no prefix-cache hits),
  ``max_tokens`` 2, ``repeats`` times per length: the time of a whole-prompt prefill;
* **TPOT vs concurrency** -- ``B`` requests at once with short prompts and ``decode_tokens``
  output tokens each, ``repeats`` rounds: per-token decode latency at batch ``B`` (the batching curve);
* **TPOT vs context** -- one request at a time with a prompt of each length and
  ``decode_tokens`` output tokens: what reading a longer context adds to a decode step.

With ``--loop-results RESULTS`` (once per results file) the file also gets ``steps_under_load``: the
server's iterations read off the token arrival times of ``apmw bench`` runs against it (:mod:`apmw.loadgen.loop_steps`),
decode steps by batch and context and prefill steps beside them, priced in the same fit.

The file (JSON, ``"format": "apmw-calibration/1"``) holds the tables, raw medians, and a
straight-line fit of the first two (documented in docs/bench.md). :func:`step_model_from_calibration`
turns the rows into iteration loads of the spec's model and prices its iterations by the line
through them (:class:`apmw.perf.measured.MeasuredStepModel`), so ``apmw plan --calibration`` and
``apmw bench --compare-plan --calibration`` predict with the server's own step times.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
import time
from pathlib import Path

import numpy as np

from apmw.loadgen.bench import make_text
from apmw.loadgen.client import BenchError, Client
from apmw.loadgen.loop_steps import MIN_DECODE_SAMPLES, steps_under_load
from apmw.perf import IterationLoad, replica_from_spec
from apmw.perf.measured import MeasuredStepModel
from apmw.spec import Spec

FORMAT = "apmw-calibration/1"
PROMPT_TOKENS = (32, 128, 512, 1024, 1536)
CONCURRENCY = (1, 2, 4, 8)
CONTEXT_TOKENS = (32, 512, 1024, 1536)
DECODE_TOKENS = 128
# output tokens of a row whose file does not record them (calibration files written with 64)
UNRECORDED_DECODE_TOKENS = 64
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


async def _tpot_row(client: Client, text, rng, b: int, decode_tokens: int, repeats: int) -> dict:
    """``repeats`` rounds of ``b`` requests at once: one round's median TPOT moved by 2x between
    calibrations of one llama.cpp server (two requests, 64 tokens each); docs/bench.md has the figures."""
    loop = asyncio.get_running_loop()
    tpot, tokens, wall = [], 0, 0.0
    for r in range(repeats):
        t0 = loop.time()
        results = await asyncio.gather(*(client.call(text.text(DECODE_PROMPT_TOKENS - 1, rng).lstrip(), decode_tokens,
                                                     f"calibrate-tpot-{b}-{r}-{i}") for i in range(b)))
        wall += loop.time() - t0
        bad = [x for x in results if not x.ok]
        if bad:
            raise BenchError(f"calibration at concurrency {b} failed: {bad[0].fault}: {bad[0].detail}")
        tpot += [x.tpot_s for x in results if x.tpot_s is not None]
        tokens += sum(x.output_tokens or 0 for x in results)
    return {"concurrency": b, "samples": len(tpot), "tpot_s_p50": float(np.median(tpot)),
            "tpot_s_mean": float(np.mean(tpot)), "output_tokens": decode_tokens,
            "output_tokens_per_s": tokens / wall}


async def _context_row(client: Client, text, rng, n: int, decode_tokens: int, repeats: int) -> dict:
    samples = []
    for r in range(repeats):
        res = await client.call(text.text(n - 1, rng).lstrip(), decode_tokens, f"calibrate-context-{n}-{r}")
        if not res.ok or res.tpot_s is None:
            raise BenchError(f"calibration decode after {n} prompt tokens failed: {res.fault}: {res.detail}")
        samples.append((res.tpot_s, res.prompt_tokens or n, res.output_tokens or decode_tokens))
    return {"prompt_tokens": int(np.median([s[1] for s in samples])), "samples": len(samples),
            "tpot_s_p50": float(np.median([s[0] for s in samples])),
            "output_tokens": int(np.median([s[2] for s in samples]))}


async def measure_calibration(endpoint: str, model: str, path: Path, api_key: str | None = None,
                              timeout_s: float = 60.0, seed: int = 0, prompt_tokens=PROMPT_TOKENS,
                              concurrency=CONCURRENCY, repeats: int = 3, decode_tokens: int = DECODE_TOKENS,
                              context_tokens=CONTEXT_TOKENS, loop_runs: list[list[dict]] | None = None) -> dict:
    """Measure the tables against ``endpoint`` and write the calibration file to ``path``; with
    ``loop_runs`` (``apmw bench`` results files' records, one list a file) add the steps their calls saw."""
    loop_rows = None if not loop_runs else steps_under_load(*loop_runs)
    if loop_rows == []:
        raise BenchError("--loop-results: too few calls in those results carry token times to read the server's steps "
                         f"from (each row needs {MIN_DECODE_SAMPLES} gaps between tokens; results files of apmw bench "
                         "before 2026-12-02 have none): run apmw bench for longer, or with more output tokens per call")
    client = Client(endpoint, model, api="completions", api_key=api_key, timeout_s=timeout_s,
                    max_connections=max(concurrency) + 2)
    # the prompts differ from every earlier calibration's, whatever the seed: a server keeps the last
    # prompts it ran (llama.cpp per slot, vLLM in its prefix cache), and a hit is no prefill time
    rng = np.random.default_rng((seed, time.time_ns()))
    try:
        text = await make_text(client)
        await client.call(text.text(16, rng), 4, "calibrate-warmup")     # first call pays one-off set-up
        ttft = [await _ttft_row(client, text, rng, n, repeats) for n in prompt_tokens]
        tpot = [await _tpot_row(client, text, rng, b, decode_tokens, repeats) for b in concurrency]
        context = [await _context_row(client, text, rng, n, decode_tokens, repeats) for n in context_tokens]
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
        "tpot_vs_context": context,
        "linear_fit": {"ttft_intercept_s": float(b0), "prefill_s_per_token": float(a),
                       "tpot_intercept_s": float(c0), "tpot_s_per_sequence": float(d)},
    }
    if loop_rows is not None:
        cal["steps_under_load"] = loop_rows
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
    """Iteration loads of the calibration rows for the spec's model, and their measured seconds inside
    the engine (a TTFT less the engine's request overhead, apmw.perf.serving_policy.REQUEST_OVERHEAD_S)."""
    replica = replica_from_spec(spec)
    arch, kv_dtype, policy = replica.arch, spec.model.kv_dtype, replica.policy
    loads, times = [], []
    for r in cal["ttft_vs_prompt_tokens"]:
        n = float(r["prompt_tokens"])
        t = r["ttft_s_p50"] - policy.request_overhead_s
        if t <= 0:
            raise BenchError(f"calibration: TTFT {r['ttft_s_p50'] * 1e3:.1f} ms at {n:.0f} prompt tokens is no more "
                             f"than engine {policy.engine}'s request overhead ({policy.request_overhead_s * 1e3:.0f} ms); "
                             "is serving.engine the server that was measured?")
        loads.append(IterationLoad(decode_seqs=0.0, prefill_tokens=n, kv_read_bytes=0.0,
                                   attention_flops=n * float(arch.attention_flops_per_token(n / 2))))
        times.append(t)
    ctx = cal.get("decode_prompt_tokens", DECODE_PROMPT_TOKENS)
    for r in cal["tpot_vs_concurrency"]:
        # requests beyond the engine's batch limit wait for a slot: the batch is the limit
        b, c = float(min(r["concurrency"], policy.max_batch)), ctx + r.get("output_tokens", UNRECORDED_DECODE_TOKENS) / 2
        loads.append(IterationLoad(decode_seqs=b, prefill_tokens=0.0,
                                   kv_read_bytes=b * float(arch.kv_read_bytes_for_context(c, kv_dtype)),
                                   attention_flops=b * float(arch.attention_flops_per_token(c))))
        times.append(r["tpot_s_p50"])
    for r in cal.get("steps_under_load", []):      # apmw.loadgen.loop_steps
        b, c = float(min(r["decode_seqs"], policy.max_batch)), r["context_tokens"]
        n, prefix = r["prefill_tokens"], r["prefill_context_tokens"]
        loads.append(IterationLoad(decode_seqs=b, prefill_tokens=n,
                                   kv_read_bytes=b * float(arch.kv_read_bytes_for_context(c, kv_dtype)),
                                   attention_flops=b * float(arch.attention_flops_per_token(c))
                                   + n * float(arch.attention_flops_per_token(prefix + n / 2))))
        times.append(r["step_s_p50"])
    for r in cal.get("tpot_vs_context", []):       # files written before this table have none
        c = float(r["prompt_tokens"]) + r.get("output_tokens", UNRECORDED_DECODE_TOKENS) / 2
        loads.append(IterationLoad(decode_seqs=1.0, prefill_tokens=0.0,
                                   kv_read_bytes=float(arch.kv_read_bytes_for_context(c, kv_dtype)),
                                   attention_flops=float(arch.attention_flops_per_token(c))))
        times.append(r["tpot_s_p50"])
    return replica.step, loads, np.array(times)


def step_model_from_calibration(cal: dict, spec: Spec) -> MeasuredStepModel:
    """The spec's replica priced by the server's measured rows (:class:`apmw.perf.measured.MeasuredStepModel`)."""
    step, loads, times = _points(cal, spec)
    return MeasuredStepModel.fit(step, loads, times, origin=f"{cal.get('endpoint')} ({cal.get('measured_at')})")
