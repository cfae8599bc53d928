"""Does the served MoE ceiling hold for a coarse-grained MoE? MLPerf's Mixtral-8x7B Offline runs, swept.

apmw caps routed-expert GEMMs at a served rate (``apmw.perf.served_moe``: 150 TFLOP/s per GPU on Hopper, fitted on
InferenceMAX's gpt-oss TTFT on vLLM; on GPUs without tables the same figure scaled by the bf16 peak). Every MoE it was
fitted or checked on is fine-grained (gpt-oss: 128 experts, 4 a token; MiniMax-M2.5: 256, 8). MLPerf Inference's
Mixtral-8x7B rows (8 experts, 2 a token: large per-expert GEMMs) are in ``../shared/data`` but were never predicted,
since the benchmark's mean input length (a mix of OpenOrca, GSM8K and MBXP prompts) is not recorded anywhere here.
This sweeps that length instead of assuming it, with the ceiling on (apmw as shipped) and off, and prints the
median signed error of the Offline output tokens/s per GPU by part (predicted / measured - 1). Offline issues every
query at once, so the replicas run compute-bound, where the ceiling binds. Nothing here is fitted or changed.

    python bench/mixtral_moe_ceiling.py        # needs ../shared/data and the dev extra (pandas)
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import accuracy  # noqa: E402  (bench/accuracy.py: the MLPerf rows and how each is predicted)

from apmw.perf import calibrated, efficiency  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "benchmarks"
MIXTRAL = "mistralai/Mixtral-8x7B-v0.1"
INPUT_LENGTHS = (150, 300, 450, 600, 900)
AMD = ("MI300X", "MI325X")


def medians(isl: int) -> dict[str, tuple[float, int]]:
    """Median signed throughput error (%) and row count by GPU, at mean input length ``isl``."""
    accuracy.MLPERF_MODELS["mixtral-8x7b"] = (MIXTRAL, isl)
    rows = [r for r in accuracy.mlperf_rows(DATA, 1.0) if r.model == MIXTRAL and r.scenario == "Offline"]
    by_gpu: dict[str, list[float]] = {}
    for r in rows:
        accuracy.predict_row(r)
        if r.predicted:
            by_gpu.setdefault(r.gpu, []).append(100 * (r.predicted["output_tokens_per_s_per_gpu"]
                                                       / r.measured["output_tokens_per_s_per_gpu"] - 1))
    return {gpu: (statistics.median(e), len(e)) for gpu, e in sorted(by_gpu.items())}


def ceiling(on: bool) -> None:
    """The served MoE ceiling as shipped, or lifted: on the calibrated path (NVIDIA's H100/H200) and on the plain
    roofline of AMD's parts."""
    calibrated.SERVED_MOE_TFLOPS_PER_GPU = SHIPPED_CEILING if on else None
    for gpu in AMD:
        efficiency.EFFICIENCY_BY_GPU[gpu] = dataclasses.replace(
            SHIPPED_AMD[gpu], served_moe_flops_per_s=SHIPPED_AMD[gpu].served_moe_flops_per_s if on else None)


SHIPPED_CEILING = calibrated.SERVED_MOE_TFLOPS_PER_GPU
SHIPPED_AMD = {gpu: efficiency.efficiency_for_gpu(gpu) for gpu in AMD}


def main() -> None:
    print("Mixtral-8x7B MLPerf Offline, output tokens/s per GPU: median signed error % (rows), by mean input length")
    for on in (True, False):
        ceiling(on)
        print(f"served MoE ceiling {'on (as shipped)' if on else 'lifted'}:")
        for isl in INPUT_LENGTHS:
            cells = "  ".join(f"{gpu} {e:+5.0f} ({n})" for gpu, (e, n) in medians(isl).items())
            print(f"  input {isl:4d} tokens: {cells}")
    ceiling(True)


if __name__ == "__main__":
    main()
