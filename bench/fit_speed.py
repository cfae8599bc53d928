"""How fast does `apmw fit` read a trace, and how much memory does it hold?

Run: .venv/bin/python bench/fit_speed.py [--lines 1000000] [--seed 0] [--no-orjson]

Writes synthetic traces of ``--lines`` calls (seeded) to a temporary folder, one
per format family -- mini-swe-agent CSV, generic CSV with --map, Mooncake JSONL
with hash_ids, AgentPerf JSONL (without its messages payload) and OTLP JSON
(100 spans per line) -- then fits each in a fresh child process and prints
lines per second (whole fit: read, sort, summarise, fit, validate; best of 3)
and the child's peak resident memory. Sessions are 100 calls each; prompts grow as in
an agent loop. The issue's target is >= 200k lines/s for CSV/JSONL.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CALLS_PER_SESSION = 100
SPANS_PER_OTLP_LINE = 100
REPEATS = 3


def _calls(n: int, seed: int):
    """(session, index, prompt, output, cached, tool_s) for n calls, as numpy arrays."""
    rng = np.random.default_rng(seed)
    session = np.arange(n) // CALLS_PER_SESSION
    index = np.arange(n) % CALLS_PER_SESSION
    out = np.maximum(rng.lognormal(4.8, 0.9, n).astype(int), 1)
    new = rng.lognormal(4.9, 1.0, n).astype(int)
    new[index == 0] += 2000
    grow = np.cumsum(new + out) - out
    grow -= np.repeat(grow[index == 0] - new[index == 0], CALLS_PER_SESSION)[:n]
    prompt = grow
    cached = np.where(index == 0, 0, prompt - new)
    tool = np.round(rng.lognormal(-1.2, 0.8, n), 3)
    return session, index, prompt, out, cached, tool


def write_traces(folder: Path, n: int, seed: int) -> dict[str, tuple[Path, list[str]]]:
    s, i, p, o, c, t = _calls(n, seed)
    files: dict[str, tuple[Path, list[str]]] = {}
    path = folder / "calls.csv"
    with open(path, "w") as f:
        f.write("run,instance_id,call_index,model,t_response_s,t_request_s,llm_latency_s,prompt_tokens,"
                "completion_tokens,cached_prompt_tokens,reasoning_tokens,n_actions,tool_phase_s,finish_reason\n")
        for row in zip(s.tolist(), i.tolist(), p.tolist(), o.tolist(), c.tolist(), t.tolist()):
            f.write(f"bench,task-{row[0]},{row[1]},m,,,,{row[2]},{row[3]},{row[4]},,1,{row[5]},tool_calls\n")
    files["mini-swe-agent csv"] = (path, [])
    path = folder / "generic.csv"
    with open(path, "w") as f:
        f.write("conv,idx,prompt,completion,tool_s\n")
        for row in zip(s.tolist(), i.tolist(), p.tolist(), o.tolist(), t.tolist()):
            f.write("%d,%d,%d,%d,%s\n" % row)
    files["generic csv --map"] = (path, ["--format", "csv", "--map",
                                         "session=conv,order=idx,input_tokens=prompt,output_tokens=completion,"
                                         "tool_wait_s=tool_s"])
    path = folder / "mooncake.jsonl"
    with open(path, "w") as f:
        chain: list[int] = []
        next_id = 1
        for sess, idx, prompt, out in zip(s.tolist(), i.tolist(), p.tolist(), o.tolist()):
            if idx == 0:
                chain = [0]
            while len(chain) < -(-prompt // 512):
                chain.append(next_id)
                next_id += 1
            ids = chain[: -(-prompt // 512)]
            f.write(json.dumps({"timestamp": sess * 1000 + idx * 10, "input_length": prompt, "output_length": out,
                                "hash_ids": ids}, separators=(",", ":")) + "\n")
            del chain[prompt // 512:]
    files["mooncake jsonl"] = (path, [])
    path = folder / "agentperf.jsonl"
    with open(path, "w") as f:
        for sess, idx, prompt, out, tool in zip(s.tolist(), i.tolist(), p.tolist(), o.tolist(), t.tolist()):
            f.write(json.dumps({"version": 1, "conversation_id": f"task-{sess}", "conversation_idx": idx,
                                "simulated_tool_delay_ms_after": tool * 1e3, "recorded_prompt_tokens": prompt,
                                "recorded_completion_tokens": out, "recorded_model_duration_ms": 1500.0},
                               separators=(",", ":")) + "\n")
    files["agentperf jsonl"] = (path, [])
    path = folder / "otlp.jsonl"
    with open(path, "w") as f:
        spans = []
        t0 = 1_767_225_600_000_000_000
        for k, (sess, idx, prompt, out, cached) in enumerate(zip(s.tolist(), i.tolist(), p.tolist(), o.tolist(),
                                                               c.tolist())):
            start = t0 + sess * 10**12 + idx * 10**10
            spans.append({"traceId": f"{sess:032x}", "spanId": f"{k:016x}", "name": "chat m", "kind": 3,
                          "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + 2 * 10**9),
                          "attributes": [
                              {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                              {"key": "gen_ai.conversation.id", "value": {"stringValue": f"c{sess}"}},
                              {"key": "gen_ai.usage.input_tokens", "value": {"intValue": str(prompt)}},
                              {"key": "gen_ai.usage.output_tokens", "value": {"intValue": str(out)}},
                              {"key": "gen_ai.usage.cache_read.input_tokens", "value": {"intValue": str(cached)}}]})
            if len(spans) == SPANS_PER_OTLP_LINE:
                f.write(json.dumps({"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {"name": "b"},
                                    "spans": spans}]}]}, separators=(",", ":")) + "\n")
                spans = []
    files["otel otlp-json (100 spans/line)"] = (path, [])
    return files


def child(path: str, args: list[str]) -> None:
    """Fit one file in this process and print seconds, calls and peak RSS as JSON."""
    if "--no-orjson" in args:
        sys.modules["orjson"] = None  # type: ignore[assignment]  # makes `import orjson` fail: stdlib json
    from apmw.traces import fit_trace

    fmt = args[args.index("--format") + 1] if "--format" in args else None
    mapping = args[args.index("--map") + 1] if "--map" in args else None
    dt = float("inf")
    for _ in range(REPEATS):  # best of REPEATS, as bench/plan_speed.py: the least disturbed by other load
        r = None  # free the previous fit first: peak memory is that of one fit
        t = time.perf_counter()
        r = fit_trace(path, fmt, mapping=mapping)
        dt = min(dt, time.perf_counter() - t)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    print(json.dumps({"s": dt, "calls": r.summary["calls"], "lines": r.summary["lines_read"], "rss_bytes": rss}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--no-orjson", action="store_true", help="also time the JSONL formats with the stdlib parser")
    a, rest = ap.parse_known_args()
    if a.child:
        child(a.child, rest + (["--no-orjson"] if a.no_orjson else []))
        return
    try:
        import orjson  # noqa: F401
        json_lib = "orjson"
    except ImportError:
        json_lib = "json (stdlib)"
    base = subprocess.run([sys.executable, "-c", "import apmw.traces, resource; "
                           "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)"],
                          capture_output=True, text=True, check=True)
    print(f"{a.lines:,} calls per trace, seed {a.seed}, JSON parser {json_lib}; "
          f"interpreter + imports alone: {int(base.stdout) / 2**20:.0f} MiB peak RSS; "
          f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'format':<34}{'lines':>11}{'MB':>8}{'seconds':>9}{'lines/s':>11}{'calls/s':>11}{'peak MiB':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        for label, (path, args) in write_traces(Path(tmp), a.lines, a.seed).items():
            r = subprocess.run([sys.executable, __file__, f"--child={path}", *args],
                               capture_output=True, text=True)
            if r.returncode:
                print(f"{label}: failed\n{r.stderr}")
                continue
            _row(label, path, json.loads(r.stdout))
            if a.no_orjson and path.suffix == ".jsonl":
                r = subprocess.run([sys.executable, __file__, f"--child={path}", *args, "--no-orjson"],
                                   capture_output=True, text=True, check=True)
                _row(label.split(" (")[0] + " [stdlib json]", path, json.loads(r.stdout))
    print(f"load average after: {os.getloadavg()[0]:.1f}")


def _row(label: str, path: Path, d: dict) -> None:
    print(f"{label:<34}{d['lines']:>11,}{path.stat().st_size / 1e6:>8.0f}{d['s']:>9.2f}"
          f"{d['lines'] / d['s']:>11,.0f}{d['calls'] / d['s']:>11,.0f}{d['rss_bytes'] / 2**20:>10.0f}")


if __name__ == "__main__":
    main()
