"""The NIM 8B and 70B tables under each scheduling hypothesis (docs/accuracy.md, "Where the model is weak").

NVIDIA's NIM 1.8.0 page publishes a Llama-3.1-8B and a Llama-3.3-70B table from one engine and,
by the page, one harness (bench/data/SOURCES.md). apmw fits the 70B's TTFT and not the 8B's. An
engine behaviour apmw leaves out would have to explain the 8B without breaking the 70B; this
prints the median |TTFT error| of both tables under each candidate. Run by
``python bench/accuracy.py --nim-scheduling`` or directly; pure standard library plus apmw, so
the regression test can run it without the accuracy script's pandas.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

from apmw.capacity.benchmark import predict

ROWS = Path(__file__).resolve().parent / "data" / "published_dense_fixed_concurrency.csv"

# name, then predict() keywords; all but the first take NIM's own request overhead (about
# 1.4 ms, its concurrency-1 rows less the predicted prefill)
NIM_SCHEDULING_VARIANTS = (
    ("as shipped (25 ms overhead, spread 0.2)", {}),
    ("NIM overhead 1.4 ms, spread 0.2", {"request_overhead_s": 0.0014}),
    ("lock step (equal lengths, spread 0)", {"request_overhead_s": 0.0014, "length_spread": 0.0}),
    ("lock step, prefill first (SGLang-style)", {"request_overhead_s": 0.0014, "length_spread": 0.0,
                                                 "mixed_prefill": False}),
    ("lock step, 2,048-token budget", {"request_overhead_s": 0.0014, "length_spread": 0.0, "token_budget": 2048}),
    ("lock step, 4,096-token budget", {"request_overhead_s": 0.0014, "length_spread": 0.0, "token_budget": 4096}),
)


def nim_scheduling_errors(path: Path = ROWS) -> dict[str, dict[str, float]]:
    """Median |TTFT error| (%) of the NIM 8B and 70B tables under each variant, keyed by variant,
    then "8B" / "70B"."""
    nim = [r for r in csv.DictReader(path.open()) if r["source"].startswith("nim-")]
    out = {}
    for name, kw in NIM_SCHEDULING_VARIANTS:
        err: dict[str, list[float]] = {"8B": [], "70B": []}
        for r in nim:
            # the file's overlap_scheduling column: empty leaves the engine's default
            overlap = None if not r["overlap_scheduling"] else r["overlap_scheduling"] == "true"
            p = predict(r["model"], r["gpu"], int(r["tp"]), r["weight_dtype"], r["kv_dtype"], round(float(r["isl"])),
                        round(float(r["osl"])), int(r["concurrency"]), engine=r["engine"],
                        overlap_scheduling=overlap, **kw)
            err["70B" if r["model"].endswith("70B") else "8B"].append(abs(p.ttft_s * 1e3 / float(r["ttft_ms"]) - 1) * 100)
        out[name] = {size: statistics.median(e) for size, e in err.items()}
    return out


def table() -> str:
    lines = [f"{'variant':45} {'8B median |TTFT err|':>21} {'70B':>8}"]
    for name, med in nim_scheduling_errors().items():
        lines.append(f"{name:45} {med['8B']:20.1f}% {med['70B']:7.1f}%")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
