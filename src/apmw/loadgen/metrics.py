"""The server's own view of the run: its Prometheus ``/metrics``, polled during each segment.

vLLM, SGLang, TGI and llama.cpp (``--metrics``) export Prometheus text. Each poll keeps the
plain samples (histogram buckets dropped, label sets summed per metric name) and is written as
a ``server`` record. The summary reports, per level, the mean of every gauge and the increase
of every counter over the measurement window, and the server-side batch where the engine's
names are known:

* llama.cpp: ``tokens_predicted_total / n_decode_total`` increase -- tokens generated per
  ``llama_decode()`` call (prefill calls count too, so this is a lower bound of the decode batch);
* vLLM: mean of ``vllm:num_requests_running``; SGLang: mean of ``sglang:num_running_reqs``.
"""

from __future__ import annotations

import math

import httpx

POLL_S = 1.0


def parse_prometheus(text: str) -> dict[str, float]:
    """``{metric name: value}`` summed over label sets; histogram buckets and non-numbers skipped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, rest = line[: line.index("{")], line[line.rindex("}") + 1:]
        else:
            name, _, rest = line.partition(" ")
        if name.endswith("_bucket"):
            continue
        try:
            value = float(rest.split()[0])
        except (ValueError, IndexError):
            continue
        if math.isfinite(value):
            out[name] = out.get(name, 0.0) + value
    return out


async def poll(http: httpx.AsyncClient) -> dict[str, float] | None:
    """One poll, or None when the server has no usable ``/metrics``."""
    try:
        r = await http.get("/metrics", timeout=5.0)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    values = parse_prometheus(r.text)
    return values or None


_COUNTER_SUFFIXES = ("_total", "_count", "_sum", "_created")


def summarise_polls(segments: list[list[dict]]) -> dict | None:
    """Gauge means and counter increases over each segment's time-ordered polls (``{"t_s", "metrics"}``)."""
    segments = [p for p in segments if len(p) >= 2]
    if not segments:
        return None
    counters: dict[str, float] = {}
    sums: dict[str, float] = {}
    n = 0
    for polls in segments:
        first, last = polls[0]["metrics"], polls[-1]["metrics"]
        for k in last:
            if k.endswith(_COUNTER_SUFFIXES) and k in first:
                counters[k] = counters.get(k, 0.0) + last[k] - first[k]
        for p in polls:
            for k, v in p["metrics"].items():
                if not k.endswith(_COUNTER_SUFFIXES):
                    sums[k] = sums.get(k, 0.0) + v
        n += len(polls)
    gauges = {k: v / n for k, v in sorted(sums.items())}
    batch, how = None, None
    if counters.get("llamacpp:n_decode_total"):
        batch = counters.get("llamacpp:tokens_predicted_total", 0.0) / counters["llamacpp:n_decode_total"]
        how = "llama.cpp tokens_predicted_total / n_decode_total"
    elif "vllm:num_requests_running" in gauges:
        batch, how = gauges["vllm:num_requests_running"], "vLLM num_requests_running (mean of polls)"
    elif "sglang:num_running_reqs" in gauges:
        batch, how = gauges["sglang:num_running_reqs"], "SGLang num_running_reqs (mean of polls)"
    return {"polls": n, "decode_batch_mean": batch, "decode_batch_source": how, "gauges_mean": gauges,
            "counters_increase": counters}
