"""Named efficiencies of the roofline step-time model, with where each comes from.

These are the seam for calibration: a calibration file (or a later fitted table)
replaces an :class:`Efficiency` without touching the step-time formula.

Default values were measured from aiconfigurator's vLLM 0.24.0 GEMM tables
(``../shared/data/profiles/aiconfigurator/{h100_sxm,h200_sxm}/gemm``); rerun
``python bench/derive_efficiencies.py`` to reproduce them:

* bandwidth: median achieved HBM bandwidth of weight-streaming GEMMs (m <= 8,
  n*k >= 4096^2) over the spec-sheet figure, each GEMM's time less its launch latency
  (``gemm_launch_s``, charged per GEMM on top) -- bf16 0.85 on H200, 0.90 on H100;
  fp8 0.65 / 0.72 (the per-tensor FP8 GEMMs stream weights markedly less well). With the
  launch left in the figures would be 0.74 / 0.80 and 0.52 / 0.61, which charge a small
  GEMM too little and a large one too much, so the launch is charged apart. aiconfigurator's own
  ``mem_bw_empirical_scaling_factor`` is 0.8.
* flops: median achieved rate of large GEMMs (m, n, k >= 4096) over the dense
  peak -- bf16 0.77 (H200) / 0.80 (H100); fp8 0.60 / 0.53.
* KV bandwidth: median achieved bandwidth of decode attention (FlashAttention 3,
  batch x context >= 64k tokens) -- bf16 KV 0.67 / 0.76, fp8 KV 0.33 / 0.45.
The defaults are the H100/H200 means. 4-bit weights and KV have no measured table:
they take the fp8 figures (ASSUMPTION: dequantising kernels stream no better).

A100 (Ampere) has its own bf16 figures, measured from Vidur's linear-layer tables
(``../shared/data/profiles/vidur/compute/a100``, microsoft/vidur@7d47513, MIT; same
script): weight-streaming bandwidth 0.77 (launch taken off, as above) and large-GEMM compute
0.72. On H100 the same Vidur measurement gives 0.90 / 0.71 against aiconfigurator's 0.90 / 0.80,
so the two sources agree within about 10 %. AMD's MI300X and MI325X take their matrix rate from AMD's own
MLPerf runs (:data:`AMD_FP8_FLOPS_EFFICIENCY`), and every AMD part its die's GEMM launch cost from AMD's InferenceMAX
runs (:data:`AMD_GEMM_LAUNCH_S_BY_DIE`). Other GPUs with only a spec sheet (B200, ...) take the Hopper defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Efficiency:
    """How close a replica gets to its spec sheet, and what it pays per iteration."""

    bandwidth: float = 0.88                 # bf16 weights; see bandwidth_for
    # Weight-streaming efficiency by weight dtype once each GEMM's launch latency (gemm_launch_s) is
    # taken off its time (bench/derive_efficiencies.py: the median over the measured weight-streaming
    # GEMMs of H100 and H200 of bytes / (latency - gemm_launch_s)). 4- and 8-bit take fp8's figure.
    bandwidth_by_dtype: dict[str, float] = field(default_factory=lambda: {
        "bf16": 0.88, "fp16": 0.88, "fp8": 0.68, "int8": 0.68, "fp4": 0.68, "int4": 0.68})
    # Latency of one GEMM launch that no bandwidth hides: a GEMM of a few tokens takes this plus its
    # weights over the streaming bandwidth. 4 us: the intercept of that affine form fitted to vLLM
    # 0.24.0's measured bf16 GEMMs at <= 8 tokens (aiconfigurator tables: 4.2 us on H100, 3.9 us on
    # H200) and to PyTorch's cuBLAS GEMMs measured on an H200 (4.8 us bf16, 4.4 us fp8; docs/accuracy.md,
    # "Measured on an H200"). The plain roofline charges it per GEMM a step launches
    # (apmw.perf.step.RooflineFigures.gemm_launches); measured tables carry it already.
    gemm_launch_s: float = 4.0e-6
    # Streaming efficiency of the small elementwise kernels (norms, residual adds, activation, RoPE) the
    # calibrated path adds to its measured GEMMs and attention: the median weight-streaming figure with
    # launches left in (no gemm_launch_s charged beside it), which the fitted per-layer overheads
    # (apmw.perf.serving_policy.ENGINE_OVERHEAD_S_PER_LAYER) were fitted beside.
    elementwise_bandwidth: float = 0.77
    # KV-reading efficiency of decode attention by KV dtype (bench/derive_efficiencies.py).
    kv_bandwidth_by_dtype: dict[str, float] = field(default_factory=lambda: {
        "bf16": 0.72, "fp16": 0.72, "fp8": 0.39, "int8": 0.39, "fp4": 0.39, "int4": 0.39})
    flops: dict[str, float] = field(default_factory=lambda: {"bf16": 0.78, "fp16": 0.78, "fp8": 0.57, "int8": 0.57,
                                                             "fp4": 0.57, "int4": 0.57})
    # Per-iteration fixed cost: kernel launches that CUDA graphs do not hide, the
    # scheduler's CPU work and sampling. 3 us of memory latency per access
    # (aiconfigurator mem_empirical_constant_latency) times ~4 kernels per layer
    # is ~1 ms for an 80-layer model; the roofline takes 1 ms for any model (ASSUMPTION).
    # The calibrated path charges it per layer instead, fitted for vLLM
    # (apmw.perf.calibrated.ENGINE_OVERHEAD_S_PER_LAYER); `apmw bench --calibrate` fits
    # this figure for one measured model.
    fixed_s: float = 1.0e-3
    # Latency of one small TP all-reduce: vLLM's custom all-reduce under CUDA graphs takes
    # 4.4-4.8 us for messages up to 2k elements on 2, 4 and 8 H200s (aiconfigurator
    # comm/vllm/0.24.0/custom_allreduce_perf.parquet, backend vllm_graph).
    comm_latency_s: float = 4.5e-6
    # Routed-expert GEMMs as served run no faster than this per GPU on Hopper (H100/H200):
    # FITTED at 150 TFLOP/s on InferenceMAX's h100 gpt-oss TTFTs (apmw.perf.calibrated,
    # SERVED_MOE_TFLOPS_PER_GPU, which takes this figure). The measured fused-MoE tables reach
    # 310-440 TFLOP/s at prefill sizes, the plain roofline 57 % of the fp8 peak (1.1 PFLOP/s on an
    # H200); served MoE prefill ran at neither. Blackwell takes a fitted share of its measured kernel, and
    # GPUs without a measured kernel scale this figure by their dense bf16 peak over Hopper's 989 TFLOP/s
    # (HOPPER_BF16_FLOPS; ASSUMPTION): apmw.perf.served_moe.
    served_moe_flops_per_s: float | None = 150e12
    source: str = "roofline defaults from aiconfigurator vLLM 0.24.0 GEMM tables (bench/derive_efficiencies.py)"

    def bandwidth_for(self, weight_dtype: str) -> float:
        return self.bandwidth_by_dtype.get(weight_dtype.lower(), self.bandwidth)

    def kv_bandwidth_for(self, kv_dtype: str) -> float:
        return self.kv_bandwidth_by_dtype.get(kv_dtype.lower(), self.bandwidth)

    def flops_for(self, dtype: str) -> float:
        return self.flops.get(dtype, self.flops["bf16"])


DEFAULT_EFFICIENCY = Efficiency()

# Dense bf16 peak of the H100-SXM and H200-SXM (catalogue, NVIDIA datasheets): the GPUs the served
# MoE ceiling was fitted on.
HOPPER_BF16_FLOPS = 989e12

# Per-GPU roofline efficiencies where a measured table says more than the Hopper defaults.
EFFICIENCY_BY_GPU: dict[str, Efficiency] = {
    "A100-SXM4-80GB": Efficiency(
        bandwidth=0.77,
        bandwidth_by_dtype={**DEFAULT_EFFICIENCY.bandwidth_by_dtype, "bf16": 0.77, "fp16": 0.77},
        flops={**DEFAULT_EFFICIENCY.flops, "bf16": 0.72, "fp16": 0.72},
        source="A100 bf16 efficiencies from Vidur's linear-layer tables (bench/derive_efficiencies.py); "
               "other figures are the Hopper defaults",
    ),
}


# AMD Instinct parts have no kernel table here. Their matrix rate is fitted on AMD's own runs: the fp8 share of
# the spec sheet's peak at which the MLPerf Inference v5.1 llama2-70b Offline runs on vLLM (AMD's and its partners'
# submissions, one model per GPU) reach their measured throughput (``python bench/accuracy.py --fit``,
# fit_amd_flops, after the launch cost below; ../shared/data/benchmarks/mlperf_inference). Offline issues every
# query at once, so each GPU runs compute-bound: the figure is the sustained matrix rate under the part's power cap
# (the same compute die at 750 W on MI300X and 1,000 W on MI325X). FITTED; held out on v4.1 (older vLLM), the
# Interactive and Server runs and InferenceMAX's runs (docs/accuracy.md). Bandwidth and KV figures stay NVIDIA's.
AMD_FP8_FLOPS_EFFICIENCY = {"MI300X": 0.375, "MI325X": 0.465}

# What each GEMM a decode step launches costs on AMD's parts beyond its weights over the bandwidth. Priced with
# NVIDIA's 4 us (gemm_launch_s), InferenceMAX's DeepSeek-R1 decode on SGLang comes out short by a near-constant time
# per iteration, whatever the batch (MI300X 18-22 ms, MI355X 3-5 ms at TP8; the same on AMD's ATOM engine and, for
# llama2-70b, on vLLM in MLPerf's Interactive runs): a cost per kernel the step launches (ROCm's launches and the many
# small kernels around each GEMM), not a rate. FITTED per compute die, each on one engine's runs and held out on the others
# (``python bench/accuracy.py --fit-amd``, fit_amd_launch; docs/accuracy.md has the rows before and after): CDNA3 on
# MI300X's DeepSeek-R1 SGLang runs (MI325X, the same die, holds it out with its SGLang and its MLPerf vLLM runs),
# CDNA4 on MI355X's DeepSeek-R1 SGLang runs (its ATOM runs of DeepSeek-R1 and gpt-oss hold it out). MI350X is
# MI355X's die at a lower power cap: ASSUMPTION, the same figure (no run of it here).
AMD_GEMM_LAUNCH_S_BY_DIE = {"CDNA3": 35.0e-6, "CDNA4": 10.0e-6}
AMD_DIE = {"MI300X": "CDNA3", "MI325X": "CDNA3", "MI350X": "CDNA4", "MI355X": "CDNA4"}


def amd_efficiency(gpu_name: str, fp8_flops: float | None = None, gemm_launch_s: float | None = None) -> Efficiency:
    """An AMD part's efficiencies: the Hopper defaults with its die's GEMM launch cost (``gemm_launch_s``, unset:
    :data:`AMD_GEMM_LAUNCH_S_BY_DIE`) and, where fitted, the fp8 matrix rate ``fp8_flops`` (its 8- and 4-bit
    siblings take it, as they do fp8's on NVIDIA), with bf16 at NVIDIA's bf16:fp8 ratio of measured rates
    (ASSUMPTION: no bf16 run on AMD here; the power cap slows every matrix format alike)."""
    d = DEFAULT_EFFICIENCY
    die = AMD_DIE[gpu_name]
    launch = AMD_GEMM_LAUNCH_S_BY_DIE[die] if gemm_launch_s is None else gemm_launch_s
    basis = f"{gpu_name}: GEMM launch {launch * 1e6:.1f} us fitted on {die} DeepSeek-R1 SGLang runs (InferenceMAX)"
    if fp8_flops is None:
        return replace(d, gemm_launch_s=launch, source=f"{basis}; other figures the Hopper defaults from aiconfigurator "
                                                         "vLLM 0.24.0 GEMM tables")
    bf16 = fp8_flops * d.flops["bf16"] / d.flops["fp8"]
    return replace(d, gemm_launch_s=launch,
                   flops={"bf16": bf16, "fp16": bf16, "fp8": fp8_flops, "int8": fp8_flops, "fp4": fp8_flops,
                          "int4": fp8_flops},
                   source=f"{basis}; fp8 matrix rate {fp8_flops:.3f} of the peak fitted on MLPerf v5.1 llama2-70b "
                          "Offline vLLM runs (bf16 at NVIDIA's bf16:fp8 ratio); other figures the Hopper defaults "
                          "from aiconfigurator vLLM 0.24.0 GEMM tables")


EFFICIENCY_BY_GPU.update({gpu: amd_efficiency(gpu, AMD_FP8_FLOPS_EFFICIENCY.get(gpu)) for gpu in AMD_DIE})


def efficiency_for_gpu(gpu_name: str) -> Efficiency:
    """The roofline efficiencies for a catalogue GPU: its own where measured, else the defaults."""
    return EFFICIENCY_BY_GPU.get(gpu_name, DEFAULT_EFFICIENCY)


# What the fitted AMD roofline is worth on runs none of its fits saw: the median signed error of its time per output
# token, predicted / measured - 1 (``python bench/accuracy.py``, amd_held_out_rows; docs/accuracy.md), the runs it is
# read on and how many, and what they show beyond the median.
AMD_HELD_OUT_TPOT_ERROR = {
    "MI300X": (-0.007, 15, "MI325X's InferenceMAX DeepSeek-R1 SGLang runs (the same die)", ""),
    "MI325X": (-0.007, 15, "its InferenceMAX DeepSeek-R1 SGLang runs", ""),
    "MI355X": (+0.015, 65, "its InferenceMAX runs of DeepSeek-R1 and gpt-oss-120b on AMD's ATOM engine",
               "; gpt-oss-120b on one GPU comes out 20-76 % too long (its decode attention priced too slow)"),
}


def roofline_caveat(gpu_name: str, vendor: str) -> str | None:
    """What a user should know about step times on ``gpu_name`` where they are least checked, or None."""
    if vendor.upper() != "AMD":
        return None
    if gpu_name not in AMD_DIE:
        return (f"{gpu_name}: step times come from the plain roofline with efficiencies measured on NVIDIA kernel "
                "tables (no AMD kernel table exists here), and no measured run on it has been checked; treat these "
                "figures as unverified")
    fitted = [f"its GEMM launch cost fitted on AMD's InferenceMAX DeepSeek-R1 SGLang runs on its die "
              f"({AMD_DIE[gpu_name]})"]
    if gpu_name in AMD_FP8_FLOPS_EFFICIENCY:
        fitted.append("its matrix rate on AMD's MLPerf v5.1 llama2-70b Offline runs on this part")
    basis = (f"step times come from the plain roofline: {' and '.join(fitted)}; its other efficiencies are measured "
             "on NVIDIA kernel tables (no AMD kernel table exists here)")
    if gpu_name not in AMD_HELD_OUT_TPOT_ERROR:
        return (f"{gpu_name}: {basis}, and no measured run on this part has been checked; treat these figures as "
                "unverified")
    err, n, runs, beyond = AMD_HELD_OUT_TPOT_ERROR[gpu_name]
    return (f"{gpu_name}: {basis}. Held out, against {runs}, the time per output token comes out {err:+.0%} (median "
            f"of {n}; bench/accuracy.py){beyond}")
