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


# The range a measured time in a calibration row (a TTFT, a TPOT, a step) may take, in seconds. Every
# step of a real server takes longer than a microsecond (one kernel launch alone takes several), and no
# TTFT of a whole prompt on an idle server takes an hour; a time outside the range is no measurement, and
# far outside it (1e300 s, 1e-300 s) overflows the fit's sums (numpy warnings, a plan that contradicts itself).
MIN_TIME_S = 1e-6
MAX_TIME_S = 3600.0
# The most tokens (prompt, context, output) or sequences a row may count: a hundred times the longest
# context window of any model (about 1e7 tokens), and still small enough that the fit's sums stay finite.
MAX_COUNT = 1e9

_TIME = ("time", MIN_TIME_S, MAX_TIME_S)        # a number of seconds
_TOKENS = ("tokens", 0.0, MAX_COUNT)            # a number of tokens (a mean may be fractional)
_PROMPT = ("tokens", 1.0, MAX_COUNT)            # a prompt of at least one token
_SEQS = ("whole", 0.0, MAX_COUNT)               # a whole number of sequences
_BATCH = ("whole", 1.0, MAX_COUNT)              # a whole number of requests at once, at least one

# The fields of each table's rows that _points reads: what each must hold, and whether a row must have it.
ROW_FIELDS: dict[str, dict[str, tuple[tuple[str, float, float], bool]]] = {
    "ttft_vs_prompt_tokens": {"prompt_tokens": (_PROMPT, True), "ttft_s_p50": (_TIME, True)},
    "tpot_vs_concurrency": {"concurrency": (_BATCH, True), "tpot_s_p50": (_TIME, True),
                            "output_tokens": (_TOKENS, False)},
    "steps_under_load": {"decode_seqs": (_SEQS, True), "context_tokens": (_TOKENS, True),
                         "prefill_tokens": (_TOKENS, True), "prefill_context_tokens": (_TOKENS, True),
                         "step_s_p50": (_TIME, True)},
    "tpot_vs_context": {"prompt_tokens": (_PROMPT, True), "tpot_s_p50": (_TIME, True),
                        "output_tokens": (_TOKENS, False)},
}
_REMEASURE = "re-run apmw bench --calibrate FILE to write the file again"


def _value_error(value, kind: tuple[str, float, float]) -> str | None:
    """Why ``value`` cannot be a field of ``kind`` (``_TIME`` ...), or None when it can."""
    what, lo, hi = kind
    need = {"time": f"a time in seconds from {lo:g} to {hi:g}",
            "tokens": f"a number of tokens from {lo:g} to {hi:g}",
            "whole": f"a whole number from {lo:g} to {hi:g}"}[what]
    shown = json.dumps(value)       # as the file spells it: NaN, Infinity, "4", null
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"is {shown} ({type(value).__name__}); it must be {need}"
    # int and float compare exactly in Python, so a 400-digit int is out of range, not an overflow
    if not (isinstance(value, int) or np.isfinite(value)) or not lo <= value <= hi \
            or (what == "whole" and value != int(value)):
        return f"is {shown}; it must be {need}"
    return None


def _check_row(path: Path, where: str, row, fields: dict) -> None:
    """Refuse a calibration row (``where``: its table and index) whose fields _points cannot read as measured."""
    if not isinstance(row, dict):
        raise BenchError(f"{path}: {where} is {json.dumps(row)[:40]}, not an object with "
                         f"{', '.join(repr(f) for f in fields)}; {_REMEASURE}")
    for field, (kind, required) in fields.items():
        if field not in row:
            if required:
                raise BenchError(f"{path}: {where}: '{field}' is missing; {_REMEASURE}")
            continue
        why = _value_error(row[field], kind)
        if why is not None:
            raise BenchError(f"{path}: {where}: '{field}' {why}; {_REMEASURE}")


# Bytes read of a calibration file at most: one holds a few dozen measured rows (a few kB); a larger file is not one.
MAX_CALIBRATION_BYTES = 16 * 2**20


def read_calibration(path: Path) -> dict:
    """The calibration file at ``path``, every row the fit reads checked (BenchError names the row and field)."""
    p = Path(path)
    if p.exists() and not p.is_dir() and not p.is_file():
        raise BenchError(f"{path}: not a regular file (a device, pipe or socket); give the file apmw bench "
                         "--calibrate FILE wrote")
    if p.is_file() and p.stat().st_size > MAX_CALIBRATION_BYTES:
        raise BenchError(f"{path}: {p.stat().st_size:,} bytes, where a calibration file is a few kB (at most "
                         f"{MAX_CALIBRATION_BYTES:,} read) -- not an apmw calibration file; {_REMEASURE}")
    try:
        cal = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BenchError(f"{path}: calibration file not found (write one with apmw bench --calibrate FILE)") from None
    except IsADirectoryError:
        raise BenchError(f"{path}: is a directory, not a calibration file (give the file apmw bench --calibrate "
                         "FILE wrote)") from None
    except OSError as exc:
        raise BenchError(f"{path}: cannot read the calibration file ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise BenchError(f"{path}: byte {exc.start} is not UTF-8 text -- not an apmw calibration file "
                         f"({_REMEASURE})") from None
    except json.JSONDecodeError as exc:
        raise BenchError(f"{path}: line {exc.lineno}: not JSON ({exc.msg})") from None
    except ValueError:      # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise BenchError(f"{path}: holds a number too long to read (thousands of digits) -- not an apmw "
                         f"calibration file; {_REMEASURE}") from None
    except RecursionError:
        raise BenchError(f"{path}: JSON nested too deeply to be an apmw calibration file; {_REMEASURE}") from None
    if not isinstance(cal, dict) or cal.get("format") != FORMAT:
        raise BenchError(f"{path}: 'format' must be {FORMAT!r} -- not an apmw calibration file")
    for key in ("ttft_vs_prompt_tokens", "tpot_vs_concurrency"):
        if not isinstance(cal.get(key), list) or len(cal[key]) < 2:
            raise BenchError(f"{path}: '{key}' needs at least two rows")
    for key in ("steps_under_load", "tpot_vs_context"):     # optional tables
        if key in cal and not isinstance(cal[key], list):
            raise BenchError(f"{path}: '{key}' must be a list of rows; {_REMEASURE}")
    if "decode_prompt_tokens" in cal:
        why = _value_error(cal["decode_prompt_tokens"], _TOKENS)
        if why is not None:
            raise BenchError(f"{path}: 'decode_prompt_tokens' {why}; {_REMEASURE}")
    for table, fields in ROW_FIELDS.items():
        for i, row in enumerate(cal.get(table, [])):
            _check_row(path, f"'{table}' row {i} (counting from 0)", row, fields)
    return cal


# How far a decode step may be faster at the highest concurrency measured than at the lowest before the table
# contradicts itself (on an idle server a larger batch never steps faster; a tenth covers timing noise).
TPOT_FALL_TOLERATED = 0.1


def _check_trends(cal: dict) -> None:
    """Refuse tables that run against what they measure: a prefill that does not grow with the prompt, a
    decode step much faster with more requests at once (a server busy with other load, or prompts served
    from its prefix cache, while it was measured)."""
    ttft = sorted(cal["ttft_vs_prompt_tokens"], key=lambda r: r["prompt_tokens"])
    short, long = ttft[0], ttft[-1]
    if long["prompt_tokens"] > short["prompt_tokens"] and not long["ttft_s_p50"] > short["ttft_s_p50"]:
        raise BenchError(f"calibration: 'ttft_vs_prompt_tokens' does not grow with the prompt: "
                         f"{long['ttft_s_p50'] * 1e3:.1f} ms at {long['prompt_tokens']:g} tokens against "
                         f"{short['ttft_s_p50'] * 1e3:.1f} ms at {short['prompt_tokens']:g}, so every prompt token "
                         "would be free; the prompts were likely served from a prefix cache or the server was busy. "
                         "Measure again with apmw bench --calibrate FILE on an idle server")
    tpot = sorted(cal["tpot_vs_concurrency"], key=lambda r: r["concurrency"])
    low, high = tpot[0], tpot[-1]
    if high["tpot_s_p50"] < (1 - TPOT_FALL_TOLERATED) * low["tpot_s_p50"]:
        raise BenchError(f"calibration: 'tpot_vs_concurrency' falls as requests are added: "
                         f"{high['tpot_s_p50'] * 1e3:.2f} ms a token at {high['concurrency']:g} at once against "
                         f"{low['tpot_s_p50'] * 1e3:.2f} ms at {low['concurrency']:g} (more than "
                         f"{TPOT_FALL_TOLERATED:.0%} faster); on an idle server a larger batch never steps faster. "
                         "Measure again with apmw bench --calibrate FILE on an idle server")


def _points(cal: dict, spec: Spec):
    """Iteration loads of the calibration rows for the spec's model, and their measured seconds inside
    the engine (a TTFT less the engine's request overhead, apmw.perf.serving_policy.REQUEST_OVERHEAD_S)."""
    _check_trends(cal)
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
