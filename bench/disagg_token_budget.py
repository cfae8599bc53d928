"""Do the recipes' larger prefill budgets close the disaggregated rows' TTFT gap? (issue 21)

Run: .venv/bin/python bench/disagg_token_budget.py [--data ../shared/data/benchmarks]

bench/accuracy.py prices InferenceMAX's disaggregated rows with the engine's default token budget on both
sides (an ASSUMPTION in its docstring: the recipes' settings are not in the CSV and changed between script
versions). Dynamo's GB200 SGLang FP4 recipe passes ``--max-prefill-tokens 32768 --chunked-prefill-size 65536``
to its prefill workers, where SGLang's default on a GPU of 160 GiB or more is 16,384 (apmw.perf.serving_policy);
TensorRT-LLM's recipes set ``max_num_tokens`` of 4,608-8,448. This prices every predicted disaggregated point
again with both sides' budget at 4,096, 8,192, 16,384, 32,768 and 65,536 tokens (a server's total; SGLang
divides it among its DP workers), beside the default, and prints each group's median |error| % (median
signed %) of mean TPOT, mean TTFT and output tokens/s per GPU, as docs/accuracy.md's disaggregated table does.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import accuracy  # noqa: E402  (this folder)

BUDGETS = (None, 4096, 8192, 16384, 32768, 65536)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "benchmarks")
    args = ap.parse_args()
    rows = accuracy.imax_disagg_rows(args.data)
    groups: dict[str, list] = {}
    for r in rows:
        if r.note.startswith("not modelled"):     # skipped with its reason in docs/accuracy.md
            continue
        groups.setdefault(accuracy._imax_disagg_group(r), []).append(r)
    print(f"{'group':52s} {'budget':>7s}  {'n':>3s}  {'TPOT':>14s}  {'TTFT':>14s}  {'tok/s/GPU':>14s}")
    for name in sorted(groups):
        for budget in BUDGETS:
            priced = [copy.deepcopy(r) for r in groups[name]]
            for r in priced:
                accuracy.predict_disagg_row(r, token_budget=budget)
            priced = [r for r in priced if r.predicted]
            if not priced:
                continue
            cells = [accuracy.median_error_cell(priced, m)[0] for m in ("tpot_s", "ttft_s", "output_tokens_per_s_per_gpu")]
            print(f"{name:52s} {budget or 'default':>7}  {len(priced):3d}  {cells[0]:>14s}  {cells[1]:>14s}  {cells[2]:>14s}")


if __name__ == "__main__":
    main()
