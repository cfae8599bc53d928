"""How right are apmw's step times? Predict every benchmark row we can model and compare.

Run:  python bench/accuracy.py [--data ../shared/data/benchmarks] [--rows] [--fit] [--write-docs] [--write-fixture]

Rows (all from ../shared/data/benchmarks, see its README for provenance and licences):

* MLPerf Inference closed v4.1 / v5.1, LLM Server and Interactive scenarios on H100-SXM
  and H200-SXM for the dense models (llama2-70b, llama3.1-8b): Poisson arrivals at the
  measured rate; we predict mean TTFT and mean TPOT (``apmw.capacity.open_loop.predict_open_loop``).
  Offline rows: we predict output tokens/s per GPU at the KV/batch limit.
* InferenceMAX fixed-concurrency rows on h100/h200/b200 (gpt-oss-120b with vLLM, and on
  b200 also with TensorRT-LLM; DeepSeek-R1 with SGLang): mean TTFT, mean TPOT and output
  tokens/s per GPU (``apmw.capacity.benchmark``). gpt-oss takes the ``calibrated`` path on h100/h200 and
  the scaled ``roofline`` (``apmw.perf.scaled``) on b200; DeepSeek-R1 (MLA) the plain roofline.
* NVIDIA's silicon runs (bench/data/SOURCES.md) on H100/H200/B200/B300.

``--plain-roofline`` predicts every row on the plain spec-sheet roofline instead (what apmw
gave before ``apmw.perf.scaled``; how far it is from the calibrated path where both apply).

What the rows do not say, and we therefore assume (each is a documented ASSUMPTION):
* MLPerf replica layout: TensorRT-LLM, FP8 weights and FP8 KV (NVIDIA's MLPerf
  submissions quantise both); llama3.1-8b TP1; llama2-70b TP1 on H200 (70 GB of FP8
  weights fit in 141 GB) and TP2 on H100; the node's GPUs are independent replicas. AMD's rows (MI300X,
  MI325X): vLLM for ROCm, FP8 weights and KV (AMD's submissions quantise both), the layout chosen by the same
  rules (TP1); submissions that mix parts in one system are skipped.
  llama3.1-405b rows are skipped (pipeline parallel across nodes, input lengths unknown).
* MLPerf mean input lengths: no copy of the datasets is stored here. OpenOrca
  (llama2-70b) is FITTED on the v4.1 Offline throughput rows (300 tokens; a training-
  split fit of a workload number, reported as such); CNN-DailyMail (llama3.1-8b) is
  ASSUMED at 800 tokens. ``--isl-scale`` reruns with every input length scaled.
  Output lengths are measured: tokens_per_s / samples_per_s of each row.
* InferenceMAX: the framework's own engine, weights as the row's precision, bf16 KV
  (fp8 KV for DeepSeek-R1 with SGLang), 10 prompts per client.
* InferenceMAX layouts beyond TP (``imax_layout``, tests/perf/test_accuracy_layouts.py): the CSV's
  ``tp`` is the replica's GPU count as the launch script passes it (SGLang ``--tensor-parallel-size``,
  trtllm-serve ``--tp_size``, vLLM/ATOM ``-tp``), ``ep`` the MoE expert-parallel size (SGLang
  ``--ep-size`` / ``--enable-ep-moe``, trtllm-serve ``--ep_size``), so each expert is split
  ``tp / ep`` ways (apmw ``moe_tp``). ``dp_attention`` true (trtllm-serve ``enable_attention_dp``,
  SGLang ``--enable-dp-attention --dp $TP``) makes every GPU its own attention rank: apmw tp 1 x
  dp_attention ``tp``. ASSUMPTION: SGLang's DP attention is launched with ``--dp`` equal to
  ``--tp`` (InferenceMAX's scripts do; the CSV has no dp size). No SGLang row of this CSV uses it.
* ASSUMPTION (engine settings of the new rows): the engine's own defaults as apmw.perf.serving_policy prices
  them (token budget: 8192 for vLLM and TensorRT-LLM, SGLang's by the GPU's memory, 8192 on H100/H200 and 16384
  from 160 GiB; batch limit: SGLang's sized from its KV pool per DP worker; memory share), not the
  launch scripts' (e.g. SGLang FP4 on B200: ``--chunked-prefill-size 16384 --max-running-requests
  256 --mem-fraction-static 0.85``; trtllm-serve: ``--max_num_tokens 20000``), which changed
  between the script versions the CSV's runs came from and are not in the CSV.
* ASSUMPTION (ATOM, AMD's engine on MI355X): priced with apmw's SGLang serving policy. ATOM's
  scheduler is prefill first (its "Scheduling & KV Cache Guide": "a prefill-first scheduler"),
  admits by need (paged blocks) and has no kernel tables here either way (AMD: plain roofline);
  whether it schedules one iteration ahead, as SGLang does, is not established. KV in fp8
  (InferenceMAX's ATOM scripts pass ``--kv_cache_dtype fp8``, gpt-oss included).
* NVIDIA's FP4 DeepSeek-R1, ``nvidia/DeepSeek-R1-0528-FP4-V2``: priced as that published checkpoint
  (``IMAX_CHECKPOINTS``; apmw.catalog.models.PUBLISHED_FORMATS): NVFP4 experts, dense MLPs and attention
  output projection, the other attention projections BF16 (its model card and ModelOpt's DeepSeek recipe);
  fp8 KV (its script: ``--quantization modelopt_fp4 --kv-cache-dtype fp8_e4m3``). Dynamo's GB200
  TensorRT-LLM rows serve the same checkpoint (their model path ``deepseek-r1-0528-fp4-v2``).
* InferenceMAX disaggregated rows (``imax_disagg_rows``, ``imax_disagg_workers``;
  apmw.capacity.disaggregated_benchmark): each side has ``<side>_num_workers`` workers sharing
  ``num_<side>_gpu`` GPUs (process_result.py reads those from PREFILL_GPUS / DECODE_GPUS); a worker's
  layout is ``imax_layout`` of its GPUs, the side's ``ep`` and ``dp_attention``. ``conc`` is the
  client's total over all decode workers; ``output_tput_per_gpu`` is over the decode GPUs only and
  ``tput_per_gpu`` over all (process_result.py; the CSV agrees), so the compared output tokens/s per
  GPU is ``output_tput_per_gpu x num_decode_gpu / all GPUs``, as apmw's.
  ASSUMPTION (Dynamo SGLang on GB200): the CSV's tp/ep/dp_attention are placeholders (InferenceMAX's
  config: they "do nothing"); Dynamo's gb200 scripts launch every worker ``--tp-size N --dp-size N``
  with DeepEP MoE and ``--moe-dense-tp-size 1`` over its N GPUs: apmw tp 1 x dp_attention N, ep N,
  with the ``--ep-num-redundant-experts 32`` those scripts pass (gb200-fp4.sh: decode workers; gb200-fp8.sh:
  both sides; ``DYNAMO_SGLANG_REDUNDANT_EXPERTS``): which script version the CSV's runs used is not recorded.
  ASSUMPTION (KV dtype): fp8 DeepSeek-R1 under Dynamo SGLang bf16 (its script passes no
  ``--kv-cache-dtype``: SGLang's auto); every other DeepSeek-R1 row fp8 (as the aggregated FP4 rows);
  gpt-oss bf16 (as its aggregated rows). ASSUMPTION (Dynamo SGLang FP4 DeepSeek-R1, whose model path
  names no checkpoint): apmw's rule for a 4-bit MoE checkpoint, every attention projection in 16 bits (ModelOpt's
  default DeepSeek recipe, NVIDIA's v1 checkpoints).
  ASSUMPTION (KV hand-off link): NVLink (the system's scale-up bandwidth) where the whole deployment
  fits in one scale-up domain (every GB200 row: at most 72 GPUs; Dynamo's scripts force multi-node
  NVLink, ``MC_FORCE_MNNVL=1``), else the NICs (MI355X: 50 GB/s per GPU, itself an assumed figure).
  ASSUMPTION (engine settings): apmw's defaults on both sides, as for the aggregated rows (8192-token
  budget, apmw's batch limit), not the recipes' (e.g. TensorRT-LLM prefill ``max_num_tokens`` 4608 /
  8448, decode ``max_batch_size`` 16-512), which are not in the CSV; 10 prompts per client.
  MTP speculative decoding: AMD's MI355X rows with one draft token and the acceptance their ITL shows
  (``imax_mtp``, its ASSUMPTION); Dynamo's GB200 rows are skipped (neither is recorded).
  Skipped, each with its reason: MTP speculative decoding on Dynamo; a worker larger than its system's
  scale-up domain (a 16-GPU MI355X worker: its all-to-all crosses NICs apmw only assumes); layouts
  apmw refuses (TensorRT-LLM attention DP; FP8 DeepSeek-R1 on a 4-GPU DEP worker, which leaves apmw no KV).
* Not predicted (aggregated): speculative-decoding (MTP) rows, and any row whose
  layout apmw refuses (TensorRT-LLM attention DP: its batch limits under DP are not
  established, apmw.perf.serving_policy.schedulers_per_limit); each is listed with its reason.

Hold-out: MLPerf v4.1 rows are the training split, v5.1 rows (newer software, other
systems, and llama3.1-8b, which no v4.1 row has) and all InferenceMAX rows are held
out. ``--fit`` refits the two candidates on the training split only: the OpenOrca mean
input length (identified: 300) and the TensorRT-LLM per-layer iteration overhead (not
identified: it runs to the grid edge; see ENGINE_OVERHEAD_S_PER_LAYER). Errors are reported for
both splits. AMD's MLPerf rows (MI300X, MI325X on vLLM) are held out of those fits; ``fit_amd_flops`` fits each
part's fp8 matrix rate on its v5.1 llama2-70b Offline rows, and every other AMD row holds that out.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from apmw.arch import load_architecture  # noqa: E402
from apmw.errors import ApmwError  # noqa: E402
from apmw.perf import build_step_model, replica_with_step, resolve_gpu  # noqa: E402
from apmw.perf import calibrated as cal  # noqa: E402
from apmw.perf import efficiency, served_moe, serving_policy  # noqa: E402
from apmw.perf.scaled import ScaledStepModel  # noqa: E402
from apmw.capacity.benchmark import (DEFAULT_LENGTH_SPREAD, DEFAULT_REQUESTS_PER_CLIENT,  # noqa: E402
                                     kv_fit_requests, predict, predict_with, replica_for_benchmark,
                                     replica_power_w)
from apmw.capacity.disaggregated_benchmark import Workers, predict_disaggregated  # noqa: E402
from apmw.capacity.open_loop import predict_open_loop  # noqa: E402
from apmw.catalog.systems import link_bandwidth_bytes_per_s, system_for_gpu  # noqa: E402
from apmw.perf.serving_policy import MAX_BATCH, REQUEST_OVERHEAD_S  # noqa: E402
from apmw.spec import Serving  # noqa: E402

LLAMA2_70B = str(ROOT / "tests" / "fixtures" / "accuracy" / "meta-llama--Llama-2-70b-chat-hf.json")
# Mean input lengths: llama2-70b's (OpenOrca) is FITTED on the v4.1 Offline rows
# (`--fit` prints 300); 600 was physically impossible (it needs ~93% of H200's FP8 peak
# to reach the measured Offline throughput). llama3.1-8b's (CNN-DailyMail) is ASSUMED.
MLPERF_MODELS = {"llama2-70b": (LLAMA2_70B, 300), "llama3.1-8b": ("meta-llama/Meta-Llama-3.1-8B", 800)}
TRTLLM_MAX_BATCH = MAX_BATCH["trtllm"]     # TensorRT-LLM max_batch_size default (apmw.perf.serving_policy)
# Every engine's token budget on the H100/H200/B200-class GPUs of these rows (apmw.perf.serving_policy).
DEFAULT_TOKEN_BUDGET = 8192
IMAX_MODELS = {"openai/gpt-oss-120b": ("openai/gpt-oss-120b", "fp4", "bf16", "vllm"),
               "deepseek-ai/DeepSeek-R1-0528": ("deepseek-ai/DeepSeek-R1", "fp8", "fp8", "sglang"),
               # AMD's MXFP4 quantisation of R1 (routed and shared weights in MXFP4, KV in fp8)
               "amd/DeepSeek-R1-0528-MXFP4-Preview": ("deepseek-ai/DeepSeek-R1", "fp4", "fp8", "sglang"),
               # NVIDIA's NVFP4 quantisation of R1, v2 (docstring: its attention formats; KV fp8)
               "nvidia/DeepSeek-R1-0528-FP4-V2": ("deepseek-ai/DeepSeek-R1", "fp4", "fp8", "sglang")}
# InferenceMAX's models whose published checkpoint apmw prices by its own module formats
# (apmw.catalog.models.PUBLISHED_FORMATS): the v2 NVFP4 DeepSeek-R1, as the B200 rows and Dynamo's GB200
# TensorRT-LLM rows (its model path deepseek-r1-0528-fp4-v2) serve it.
IMAX_CHECKPOINTS = {"nvidia/DeepSeek-R1-0528-FP4-V2": "nvidia/DeepSeek-R1-0528-FP4-v2",
                    "/mnt/lustre01/models/deepseek-r1-0528-fp4-v2": "nvidia/DeepSeek-R1-0528-FP4-v2"}
# InferenceMAX's hardware labels (b200-trt: its TensorRT-LLM runs on B200) and frameworks
IMAX_GPUS = {"h100": "H100", "h200": "H200", "b200": "B200", "b200-trt": "B200",
             "mi300x": "MI300X", "mi325x": "MI325X", "mi355x": "MI355X",
             # the disaggregated rows' runners: a GB200 NVL72 rack, AMD's MI355X cluster
             "gb200": "GB200", "mi355x-amd_0": "MI355X"}
# ATOM (AMD's engine) is priced with SGLang's serving policy: ASSUMPTION in the docstring
IMAX_ENGINES = {"vllm": "vllm", "sglang": "sglang", "trt": "trtllm", "atom": "sglang"}
# KV dtype a framework's launch scripts set whatever the model (ATOM: --kv_cache_dtype fp8)
IMAX_KV_BY_FRAMEWORK = {"atom": "fp8"}
# KV dtype one runner's gpt-oss launch script sets (InferenceMAX/InferenceMAX benchmarks/): on B200,
# vLLM's gptoss_fp4_b200_docker.sh and _slurm.sh write `kv-cache-dtype: fp8` into the server's config, and
# TensorRT-LLM's gptoss_fp4_b200_trt_docker.sh and _slurm.sh `kv_cache_config: dtype: fp8`; the H100 and
# H200 scripts set none (vLLM's auto: the bf16 activations')
IMAX_KV_BY_RUNNER = {("b200", "vllm"): "fp8", ("b200-trt", "trt"): "fp8"}
# The activations of gpt-oss's MXFP4 experts where a runner's script sets them (apmw.spec.Serving's
# mxfp4_moe_activations; unset: the engine's default): vLLM's gptoss_fp4_b200_docker.sh and _slurm.sh export
# VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1. TensorRT-LLM's scripts set moe_config backend TRTLLM, its default
# on Blackwell (mxfp8) in apmw.
IMAX_MXFP4_MOE_ACTIVATIONS = {("b200", "vllm"): "mxfp8"}


def imax_scheduler_recv_interval(hw: str, framework: str, model: str, concurrency: int) -> int | None:
    """SGLang's --scheduler-recv-interval where a runner's DeepSeek-R1 script sets it (apmw.spec.Serving's
    scheduler_recv_interval; None: SGLang's default, 1). InferenceMAX's dsr1_fp4_b200_docker.sh and _slurm.sh
    and dsr1_fp8_b200_docker.sh and _slurm.sh pass 10, and 30 from concurrency 16 ("relax to ~30 requests
    between scheduler recv polls"); the H200, MI300X, MI325X and MI355X scripts read here set none."""
    if hw == "b200" and framework == "sglang" and "deepseek-r1" in model.lower():
        return 30 if concurrency >= 16 else 10
    return None
# What the rows predicted before layouts were modelled covered (kept apart so their groups stay comparable)
IMAX_LEGACY_MODELS = ("openai/gpt-oss-120b", "deepseek-ai/DeepSeek-R1-0528", "amd/DeepSeek-R1-0528-MXFP4-Preview")
IMAX_LEGACY_FRAMEWORKS = ("vllm", "sglang", "trt")
# --plain-roofline: predict on the plain spec-sheet roofline (build_step_model(calibrated=False))
PLAIN_ROOFLINE = False


# Client-seen TTFT outside the engine, per benchmark harness where its training rows pin it
# (`--fit`: InferenceMAX's, jointly with the served MoE ceiling); other sources use apmw's
# default (apmw.perf.serving_policy.REQUEST_OVERHEAD_S).
HARNESS_OVERHEAD_S = {"InferenceMAX": 0.0125}


@dataclass
class Row:
    source: str
    split: str          # train / held-out
    model: str
    gpu: str
    engine: str
    tp: int
    scenario: str
    isl: int
    osl: int
    rate_per_replica: float | None
    concurrency: int | None
    measured: dict
    label: str
    predicted: dict | None = None
    path: str = ""
    note: str = ""
    constraints: tuple[float, float] | None = None   # MLPerf (ttft_s, tpot_s) limits
    gpus: int = 1
    length_spread: float | None = None   # None: apmw.capacity.benchmark's default
    requests_per_client: int = DEFAULT_REQUESTS_PER_CLIENT   # the harness's prompts / concurrency
    mxfp4_moe_activations: str | None = None   # apmw.spec.Serving's field (None: the engine's default)
    scheduler_recv_interval: int | None = None   # apmw.spec.Serving's field (None: every iteration)
    request_overhead_s: float | None = None   # None: HARNESS_OVERHEAD_S or apmw's default
    # whether the engine formed the next batch while the current one ran (None: the engine's
    # default, apmw.perf.serving_policy; False where the run's engine predates that scheduler)
    overlap_scheduling: bool | None = None
    # InferenceMAX rows: the parallel sizes beyond tp (apmw.capacity.benchmark.predict's layout; None:
    # plain TP), the CSV's framework and precision, the layout kind, how many CSV rows the point merges,
    # and whether the point is of a kind predicted before layouts were modelled (its group kept apart)
    layout: dict | None = None
    framework: str = ""
    precision: str = ""
    layout_kind: str = "TP-only"
    csv_rows: int = 1
    legacy: bool = True
    # disaggregated InferenceMAX rows: (prefill Workers, decode Workers) for
    # apmw.capacity.disaggregated_benchmark, and the per-prefill-GPU link the KV crosses
    disagg: tuple | None = None
    kv_link_bytes_per_s: float | None = None
    # the published checkpoint priced where its module formats differ from the base model's (apmw.catalog.models.
    # PUBLISHED_FORMATS: NVIDIA's v2 NVFP4 DeepSeek-R1); None: ``model``
    checkpoint: str | None = None
    # speculative decoding as apmw.spec.Speculative's fields (imax_mtp); None without it
    speculative: dict | None = None

    @property
    def priced(self) -> str:
        """The model id apmw prices: the published checkpoint, else the model."""
        return self.checkpoint or self.model


def mlperf_rows(data: Path, isl_scale: float) -> list[Row]:
    frames = [pd.read_csv(data / "mlperf_inference" / f"mlperf_inference_llm_closed_{r}.csv") for r in ("v4.1", "v5.1")]
    d = pd.concat(frames)
    # NVIDIA's parts, and AMD's where one part's runs are on vLLM (MLPERF_AMD_ENGINES): a submission mixing
    # parts ("MI300X ... (x32), MI325X ... (x16)") has no one GPU to price
    d = d[d.accelerator.str.contains("H100-SXM|H200-SXM|B200-SXM|MI300X|MI325X") & ~d.accelerator.str.contains(r"\(x")
          & (d.result_valid == "VALID")]
    amd = d.accelerator.str.contains("MI3")
    d = d[~amd | d.framework.str.lower().str.contains("vllm")]
    d["base"] = d.benchmark.str.replace(r"-99(\.9)?$", "", regex=True)
    d = d[d.base.isin(MLPERF_MODELS)]
    d = d.drop_duplicates(subset=["round", "submitter", "system", "base", "scenario", "samples_per_s"])
    rows = []
    for r in d.itertuples():
        model, isl = MLPERF_MODELS[r.base]
        gpu = next(g for g in ("H200", "B200", "MI300X", "MI325X", "H100") if g in r.accelerator)
        tp = 0              # chosen per row in predict_row (see choose_tp)
        gpus = int(r.accelerators_per_node * r.number_of_nodes)
        osl = r.tokens_per_s / r.samples_per_s
        measured = {"output_tokens_per_s_per_gpu": r.tokens_per_s / gpus}
        if r.scenario in ("Server", "Interactive"):
            measured |= {"ttft_s": r.ttft_mean_ns / 1e9, "tpot_s": r.tpot_mean_ns / 1e9}
        if not math.isnan(r.avg_system_power_w):
            measured["node_power_w"] = r.avg_system_power_w / r.number_of_nodes
        engine = "vllm" if "vllm" in r.framework.lower() else "trtllm"
        # Engines that formed one batch at a time then: v4.1 (2024) predates TensorRT-LLM's
        # PyTorch backend (0.17, 2025), whose feature the overlap scheduler is; vLLM turned async
        # scheduling on by default only in late 2025 (vLLM PR #27614), after v5.1. Other v5.1
        # TensorRT-LLM runs: the engine's default (the backend used is not stated).
        overlap = False if r.round == "v4.1" or engine == "vllm" else None
        # AMD's rows are held out of the NVIDIA fits; fit_amd_flops picks its own training rows among them
        split = "train" if r.round == "v4.1" and not gpu.startswith("MI") else "held-out"
        rows.append(Row(source=f"MLPerf {r.round}", split=split,
                        model=model, gpu=gpu, engine=engine,
                        tp=tp, scenario=r.scenario,
                        isl=round(isl * isl_scale), osl=round(osl),
                        rate_per_replica=r.samples_per_s, concurrency=None, measured=measured,
                        label=f"{r.round} {r.submitter} {r.base} {r.scenario} {gpus}x{gpu}",
                        constraints=(r.ttft_constraint_ns / 1e9, r.tpot_constraint_ns / 1e9), gpus=gpus,
                        overlap_scheduling=overlap))
    return rows


def imax_layout(tp: int, ep: int | float | None, dp_attention: bool | None) -> tuple[int, dict | None, str]:
    """An InferenceMAX row's parallel fields as apmw lays the replica out: (apmw tp, layout, kind).

    The CSV's ``tp`` is the replica's GPU count as the launch script passes it (SGLang
    ``--tensor-parallel-size``, trtllm-serve ``--tp_size``), ``ep`` the experts' parallel size
    (``--ep-size`` / ``--ep_size``), so each routed expert is split ``tp / ep`` ways (apmw
    ``moe_tp``). ``dp_attention`` (trtllm-serve ``enable_attention_dp``, SGLang
    ``--enable-dp-attention --dp $TP``) gives every GPU its own attention rank: apmw tp 1 x
    dp_attention ``tp``. Plain TP (ep 1, no DP attention) has no layout. ``kind`` is 'TP-only',
    'EP' (attention TP, experts EP), 'DP-attention' (MoE TP) or 'DP-attention + EP'.
    """
    gpus = int(tp)
    ep = 1 if ep is None or (isinstance(ep, float) and math.isnan(ep)) else int(ep)
    dp = bool(dp_attention) and not (isinstance(dp_attention, float) and math.isnan(dp_attention))
    if gpus < 1 or ep < 1 or gpus % ep:
        raise ApmwError(f"ep {ep} does not divide the {gpus} GPUs of tp {gpus}")
    if not dp and ep == 1:
        return gpus, None, "TP-only"
    attn_tp, ranks = (1, gpus) if dp else (gpus, 1)
    layout = {"dp_attention": ranks, "ep": ep, "moe_tp": gpus // ep}
    kind = ("DP-attention + EP" if ep > 1 else "DP-attention") if dp else "EP"
    return attn_tp, layout, kind


def imax_rows(data: Path) -> list[Row]:
    """Every aggregated InferenceMAX point (repeated runs of one setting merged by their median)."""
    d = pd.read_csv(data / "inferencemax" / "inferencemax_agg_bmk.csv")
    d = d[~d.disagg.fillna(False).astype(bool)].copy()
    d["dp_attention"] = d.dp_attention.fillna(False).astype(bool)
    d["spec_decoding"] = d.spec_decoding.fillna("none")
    keys = ["hw", "model", "framework", "precision", "spec_decoding", "isl", "osl", "conc", "tp", "ep", "dp_attention"]
    g = d.groupby(keys, as_index=False).agg(
        mean_ttft=("mean_ttft", "median"), median_ttft=("median_ttft", "median"),
        mean_tpot=("mean_tpot", "median"), output_tput_per_gpu=("output_tput_per_gpu", "median"),
        csv_rows=("mean_ttft", "size"))
    rows = []
    for r in g.itertuples():
        legacy = (r.model in IMAX_LEGACY_MODELS and r.framework in IMAX_LEGACY_FRAMEWORKS and r.hw in IMAX_GPUS
                  and not r.dp_attention and int(r.ep) == 1)
        model, wdt, kvd, _ = IMAX_MODELS.get(r.model, (r.model, r.precision, "bf16", ""))
        kvd = IMAX_KV_BY_FRAMEWORK.get(r.framework, kvd)
        acts = None
        if "gpt-oss" in r.model:
            kvd = IMAX_KV_BY_RUNNER.get((r.hw, r.framework), kvd)
            acts = IMAX_MXFP4_MOE_ACTIVATIONS.get((r.hw, r.framework))
        engine = IMAX_ENGINES.get(r.framework, r.framework)
        note = f"{wdt}/{kvd}"
        try:
            tp, layout, kind = imax_layout(r.tp, r.ep, r.dp_attention)
        except ApmwError as exc:
            tp, layout, kind, note = int(r.tp), None, "?", f"not modelled: {exc}"
        if r.model not in IMAX_MODELS:
            note = f"not modelled: model {r.model} not known to the accuracy script"
        elif r.hw not in IMAX_GPUS:
            note = f"not modelled: hardware {r.hw} has no GPU mapping"
        elif r.framework not in IMAX_ENGINES:
            note = f"not modelled: framework {r.framework}"
        elif r.spec_decoding != "none":
            note = f"not modelled: speculative decoding ({r.spec_decoding})"
        short = model.split("/")[-1]
        lay = " dp-attention" if r.dp_attention else ""
        # InferenceMAX draws lengths uniformly from [0.8 L, L] (random_range_ratio 0.8):
        # mean 0.9 L, width 0.2 L.
        rows.append(Row(source="InferenceMAX", split="train" if r.hw == "h100" else "held-out", model=model,
                        gpu=IMAX_GPUS.get(r.hw, r.hw), engine=engine, mxfp4_moe_activations=acts,
                        scheduler_recv_interval=imax_scheduler_recv_interval(r.hw, r.framework, r.model, int(r.conc)),
                        tp=tp, scenario="fixed-concurrency", isl=round(0.9 * r.isl), osl=round(0.9 * r.osl),
                        length_spread=0.2 / 0.9,
                        rate_per_replica=None, concurrency=int(r.conc),
                        measured={"ttft_s": r.mean_ttft, "tpot_s": r.mean_tpot,
                                  "output_tokens_per_s_per_gpu": r.output_tput_per_gpu,
                                  "replica_output_tokens_per_s": r.output_tput_per_gpu * r.tp,
                                  "median_ttft_s": r.median_ttft},
                        label=(f"{r.hw} {short} tp{int(r.tp)} ep{int(r.ep)} {r.isl}/{r.osl} c{r.conc}" if legacy else
                               f"{r.hw} {short} {r.precision} {r.framework} tp{int(r.tp)} ep{int(r.ep)}{lay} "
                               f"{r.isl}/{r.osl} c{r.conc}"),
                        note=note, gpus=int(r.tp), layout=layout, framework=r.framework, precision=r.precision,
                        layout_kind=kind, csv_rows=int(r.csv_rows), legacy=legacy,
                        checkpoint=IMAX_CHECKPOINTS.get(r.model)))
    return rows


# Disaggregated rows: the CSV's framework -> apmw's engine (both sides run it)
IMAX_DISAGG_ENGINES = {"dynamo-sglang": "sglang", "dynamo-trt": "trtllm", "sglang-disagg": "sglang"}


def imax_disagg_model(model: str, precision: str, framework: str) -> tuple[str, str, str]:
    """(apmw model, weight dtype, KV dtype) of a disaggregated row (ASSUMPTIONs in the docstring)."""
    if "gpt-oss" in model:
        return "openai/gpt-oss-120b", "fp4", "bf16"
    if "deepseek-r1" not in model.lower():
        raise ApmwError(f"model {model} not known to the accuracy script")
    # Dynamo's GB200 SGLang script passes no --kv-cache-dtype: SGLang's "auto", the FP8 checkpoint's bf16
    kvd = "bf16" if framework == "dynamo-sglang" and precision == "fp8" else "fp8"
    return "deepseek-ai/DeepSeek-R1", precision, kvd


# Redundant experts Dynamo's GB200 SGLang scripts give each side (--ep-num-redundant-experts; ai-dynamo/dynamo,
# components/backends/sglang/slurm_jobs/scripts/gb200-fp4.sh and gb200-fp8.sh): FP4 its decode workers, FP8 both.
DYNAMO_SGLANG_REDUNDANT_EXPERTS = {("fp4", "decode"): 32, ("fp8", "prefill"): 32, ("fp8", "decode"): 32}


def _side_layout(side: str, framework: str, workers, tp, ep, dp_attention, gpus_total,
                 precision: str = "") -> tuple[Workers, str]:
    """One side's Workers from the CSV's ``<side>_num_workers, _tp, _ep, _dp_attention`` and
    ``num_<side>_gpu`` (imax_disagg_workers)."""
    workers, gpus_total = int(workers), int(gpus_total)
    if workers < 1 or gpus_total < 1 or gpus_total % workers:
        raise ApmwError(f"{side}: {gpus_total} GPUs do not split into {workers} workers")
    gpus = gpus_total // workers
    if framework == "dynamo-sglang":
        # the CSV's tp/ep/dp_attention "do nothing" (InferenceMAX's config): Dynamo's GB200 scripts
        # launch every worker as --tp-size N --dp-size N with DeepEP MoE over its N GPUs (DEP N), with
        # the redundant experts their recipe gives that side
        attn_tp, layout, kind = imax_layout(gpus, gpus, True)
        redundant = DYNAMO_SGLANG_REDUNDANT_EXPERTS.get((precision, side), 0)
        if layout is not None and redundant:
            layout = {**layout, "redundant_experts": redundant}
    else:
        dp = bool(dp_attention) and not (isinstance(dp_attention, float) and math.isnan(dp_attention))
        # with attention DP the CSV's tp is the worker's GPUs (trtllm) or each rank's attention TP, 1 (AMD)
        if int(tp) != gpus and not (dp and int(tp) == 1):
            raise ApmwError(f"{side}: tp {int(tp)} does not match the {gpus} GPUs of each of {workers} workers")
        attn_tp, layout, kind = imax_layout(gpus, ep, dp)
    return Workers(count=workers, tp=attn_tp, layout=layout), kind


def imax_disagg_workers(r) -> tuple[Workers, Workers, str]:
    """A disaggregated InferenceMAX row's prefill and decode workers as apmw lays them out, and a kind
    ('P <kind> x n / D <kind> x m'); ApmwError (the reason) where apmw cannot express the row.

    Each side has ``<side>_num_workers`` workers sharing ``num_<side>_gpu`` GPUs (InferenceMAX's
    process_result.py reads those from PREFILL_GPUS / DECODE_GPUS, not from tp x workers). The
    worker's layout is ``imax_layout`` of its GPU count, the side's ``ep`` and ``dp_attention``,
    except Dynamo's SGLang rows, whose fields are placeholders (every worker is DEP over its GPUs).
    A worker larger than the system's scale-up domain (more than one MI355X node) is refused: its
    expert all-to-all would cross a scale-out network apmw only assumes.
    """
    gpu = resolve_gpu(IMAX_GPUS[r.hw])
    system = system_for_gpu(gpu.name)
    sides = []
    for side in ("prefill", "decode"):
        w, kind = _side_layout(side, r.framework, getattr(r, f"{side}_num_workers"), getattr(r, f"{side}_tp"),
                               getattr(r, f"{side}_ep"), getattr(r, f"{side}_dp_attention"),
                               getattr(r, f"num_{side}_gpu"), r.precision)
        gpus = w.tp * (w.layout or {}).get("dp_attention", 1)
        if system is not None and gpus > system.scaleup_domain_gpus:
            raise ApmwError(f"a {side} worker of {gpus} GPUs spans {gpus // system.gpus_per_node} {system.name} "
                            f"nodes: its expert all-to-all crosses the scale-out network "
                            f"({system.scaleout_nic}), which apmw does not know")
        sides.append((w, f"{kind} x{w.count}"))
    (pre, pk), (dec, dk) = sides
    return pre, dec, f"disagg P {pk} / D {dk}"


def imax_disagg_rows(data: Path) -> list[Row]:
    """Every disaggregated InferenceMAX point (repeated runs of one setting merged by their median).

    ``conc`` is the benchmark client's --max-concurrency against the one frontend: the total over
    every decode worker (it matches Little's law with the measured mean E2E latency within 7 %).
    The CSV's ``output_tput_per_gpu`` is output tokens/s over the *decode* GPUs and ``tput_per_gpu``
    total tokens/s over all GPUs (InferenceMAX's process_result.py; the CSV agrees); the measured
    output tokens/s per GPU compared here is over all GPUs, as apmw's."""
    d = pd.read_csv(data / "inferencemax" / "inferencemax_agg_bmk.csv")
    d = d[d.disagg.fillna(False).astype(bool)].copy()
    d["spec_decoding"] = d.spec_decoding.fillna("none")
    for side in ("prefill", "decode"):
        d[f"{side}_dp_attention"] = d[f"{side}_dp_attention"].astype(str).str.lower() == "true"
    keys = ["hw", "model", "framework", "precision", "spec_decoding", "isl", "osl", "conc",
            "prefill_num_workers", "prefill_tp", "prefill_ep", "prefill_dp_attention", "num_prefill_gpu",
            "decode_num_workers", "decode_tp", "decode_ep", "decode_dp_attention", "num_decode_gpu"]
    g = d.groupby(keys, as_index=False).agg(
        mean_ttft=("mean_ttft", "median"), median_ttft=("median_ttft", "median"),
        mean_tpot=("mean_tpot", "median"), output_tput_per_gpu=("output_tput_per_gpu", "median"),
        tput_per_gpu=("tput_per_gpu", "median"), mean_e2el=("mean_e2el", "median"),
        mean_itl=("mean_itl", "median"), csv_rows=("mean_ttft", "size"))
    rows = []
    for r in g.itertuples():
        note, pre, dec, kind, link, drafting = "", None, None, "disagg", None, None
        gpus = int(r.num_prefill_gpu + r.num_decode_gpu)
        try:
            model, wdt, kvd = imax_disagg_model(r.model, r.precision, r.framework)
            note = f"{wdt}/{kvd}"
            pre, dec, kind = imax_disagg_workers(r)
            system = system_for_gpu(resolve_gpu(IMAX_GPUS[r.hw]).name)
            # the KV hand-off: NVLink where the whole deployment sits in one scale-up domain (a GB200
            # NVL72 rack; Dynamo's scripts force multi-node NVLink, MC_FORCE_MNNVL=1), else the NICs
            link = link_bandwidth_bytes_per_s(system, gpus)
        except ApmwError as exc:
            model, wdt = r.model, r.precision
            note = f"not modelled: {exc}"
        if r.framework not in IMAX_DISAGG_ENGINES:
            note = f"not modelled: framework {r.framework}"
        elif r.spec_decoding != "none" and not note.startswith("not modelled"):
            drafting, why = imax_mtp(r)
            if drafting is None:
                note = f"not modelled: speculative decoding ({r.spec_decoding}): {why}"
        short = model.split("/")[-1]
        measured_out = r.output_tput_per_gpu * r.num_decode_gpu / gpus    # over all GPUs (docstring)
        rows.append(Row(source="InferenceMAX", split="held-out", model=model, gpu=IMAX_GPUS.get(r.hw, r.hw),
                        engine=IMAX_DISAGG_ENGINES.get(r.framework, r.framework), tp=0,
                        scenario="fixed-concurrency (disaggregated)", isl=round(0.9 * r.isl),
                        osl=round(0.9 * r.osl), length_spread=0.2 / 0.9, rate_per_replica=None,
                        concurrency=int(r.conc),
                        measured={"ttft_s": r.mean_ttft, "tpot_s": r.mean_tpot,
                                  "output_tokens_per_s_per_gpu": measured_out,
                                  "total_tokens_per_s_per_gpu": r.tput_per_gpu,
                                  "median_ttft_s": r.median_ttft, "e2e_s": r.mean_e2el},
                        label=(f"{r.hw} {short} {r.precision} {r.framework} {int(r.num_prefill_gpu)}P"
                               f"{int(r.prefill_num_workers)}w+{int(r.num_decode_gpu)}D{int(r.decode_num_workers)}w "
                               f"{r.isl}/{r.osl} c{r.conc}" + ("" if r.spec_decoding == "none" else f" {r.spec_decoding}")),
                        note=note, gpus=gpus, precision=r.precision, layout_kind=kind,
                        framework=r.framework + (" + MTP" if r.spec_decoding == "mtp" else ""),
                        csv_rows=int(r.csv_rows), legacy=False, disagg=(pre, dec) if pre else None,
                        kv_link_bytes_per_s=link, checkpoint=IMAX_CHECKPOINTS.get(r.model), speculative=drafting))
    return rows


# How the MTP rows' acceptance rate is set (--mtp-acceptance): "measured" reads it off the row (imax_mtp),
# "default" takes apmw's cited default (apmw.perf.speculative.MTP_ACCEPTANCE_RATE).
MTP_ACCEPTANCE = "measured"


def mtp_pairs(rows: list[Row]) -> str:
    """Each predicted MTP point beside the point without MTP of the same label (lengths, concurrency, worker
    counts): TPOT with over TPOT without, measured and predicted, and the median |error| of that ratio."""
    without = {r.label: r for r in rows if r.disagg and r.speculative is None and r.predicted}
    lines, errs = [], []
    for r in rows:
        base = without.get(r.label.removesuffix(" mtp")) if r.speculative and r.predicted else None
        if base is None:
            continue
        measured = r.measured["tpot_s"] / base.measured["tpot_s"]
        predicted = r.predicted["tpot_s"] / base.predicted["tpot_s"]
        errs.append(predicted / measured - 1)
        lines.append(f"{r.label:70} measured {measured:.3f}  predicted {predicted:.3f}  {errs[-1]:+.1%}")
    if not errs:
        return "no MTP point has a predicted point without MTP beside it"
    return "\n".join(lines + [f"{len(errs)} pairs: median |error| of the ratio {statistics.median(map(abs, errs)):.1%}, "
                              f"median signed {statistics.median(errs):+.1%}"])


def imax_mtp(r) -> tuple[dict | None, str]:
    """The speculative decoding of an InferenceMAX MTP point as apmw.spec.Speculative's fields, or None and why.

    AMD's MI355X SGLang disaggregated rows: one draft token (ASSUMPTION: the CSV does not record it; every
    point's mean ITL over its mean TPOT lies between 1.69 and 1.98, never above the 2 tokens one MTP step
    can yield, and AMD's own MI355X DeepSeek-R1 disaggregated script sets ``DECODE_MTP_SIZE=1``). SGLang
    streams the tokens one iteration yields together, so that ratio is the point's accepted tokens per
    iteration (it is 1.00 on every non-MTP row of the same runner), and its acceptance rate is the ratio
    less one: an input the workload (random prompts, ``--ignore-eos``) sets, not the hardware. With it,
    this group's TPOT error is that of the verifying iteration's time. ``--mtp-acceptance default`` takes
    apmw's cited 0.85 instead. Dynamo's GB200 rows stream tokens in chunks (ITL/TPOT about 20 without
    MTP, 35-49 with it), and neither their draft length nor their acceptance is recorded: not modelled."""
    if r.hw != "mi355x-amd_0":
        return None, ("the draft length and acceptance rate of the recipe are not recorded (Dynamo streams tokens "
                      "in chunks, so the ITL does not reveal them)")
    tokens_per_iteration = r.mean_itl / r.mean_tpot
    if MTP_ACCEPTANCE == "default":
        return {"draft": "mtp", "draft_tokens": 1}, ""
    return {"draft": "mtp", "draft_tokens": 1, "acceptance_rate": min(max(tokens_per_iteration - 1, 0.0), 0.99)}, ""


def imax_disaggregated(data: Path) -> pd.DataFrame:
    """The disaggregated InferenceMAX rows (prefill and decode workers) by hardware and framework."""
    d = pd.read_csv(data / "inferencemax" / "inferencemax_agg_bmk.csv")
    d = d[d.disagg.fillna(False).astype(bool)]
    return d.groupby(["hw", "framework", "precision"]).size().rename("rows").reset_index()


SILICON = ROOT / "bench" / "data" / "aiconfigurator_silicon_sample.csv"
SILICON_ENGINES = {"vllm", "sglang", "trtllm"}


def silicon_rows(path: Path = SILICON) -> list[Row]:
    """NVIDIA's measured fixed-concurrency runs in aiconfigurator's ``silicon_sample.csv`` (bench/data/SOURCES.md).

    All held out. Only aggregated serving on H100/H200/B200/B300 with plain tensor parallelism (no
    expert parallelism, no attention data parallelism) is predicted: that is what apmw
    models. The file gives no KV dtype; vLLM and SGLang default to the activations' dtype,
    so bf16 KV is ASSUMED. The length spread is the default (the file does not say).
    """
    if not path.exists():
        return []
    d = pd.read_csv(path)
    d = d[d.system.isin(["h100_sxm", "h200_sxm", "b200_sxm", "b300_sxm"]) & (d["mode"] == "agg")
          & d.backend.isin(SILICON_ENGINES)]
    rows = []
    for r in d.itertuples():
        conc = int(str(r.silicon_data_source).split("silicon_concurrency=")[1].split(";")[0])
        gpu = r.system.split("_")[0].upper()
        plain_tp = (r.attention_dp_size == 1) and (pd.isna(r.moe_ep_size) or r.moe_ep_size == 1)
        rows.append(Row(source="aiconfigurator silicon", split="held-out", model=r.model_path, gpu=gpu,
                        engine=r.backend, tp=int(r.tp_size), scenario=f"fixed-concurrency ({r.backend} {r.backend_version if isinstance(r.backend_version, str) else 'version not given'})",
                        isl=int(r.isl), osl=int(r.osl), rate_per_replica=None, concurrency=conc,
                        measured={"ttft_s": r.silicon_ttft_ms / 1e3, "tpot_s": r.silicon_tpot_ms / 1e3},
                        label=f"{gpu} {r.model_path.split('/')[-1]} {r.backend} {r.backend_version if isinstance(r.backend_version, str) else ''} tp{int(r.tp_size)} "
                              f"{int(r.isl)}/{int(r.osl)} c{conc}",
                        note=f"{r.precision}/bf16" if plain_tp else "not modelled: expert or attention data parallelism"))
    return rows


PUBLISHED = ROOT / "bench" / "data" / "published_dense_fixed_concurrency.csv"


def published_rows(path: Path = PUBLISHED) -> list[Row]:
    """Published fixed-concurrency runs of dense models (NVIDIA NIM, GPUStack; bench/data/SOURCES.md).

    All held out. NIM runs use equal lengths (the default length spread applies);
    GPUStack's ShareGPT lengths vary by more than their mean (spread 1.0). Every run gets
    apmw's default prompts per client and request overhead; `main` sets NIM's on request
    (``--nim-requests-per-client``, ``--nim-overhead-ms``).
    """
    d = pd.read_csv(path)
    rows = []
    for r in d.itertuples():
        spread = 1.0 if r.source.startswith("gpustack") else None
        # whether the run's engine formed the next batch while the current one ran, by its version
        # (the file's overlap_scheduling column; empty: not known, the engine's default)
        overlap = None if pd.isna(r.overlap_scheduling) else bool(r.overlap_scheduling)
        rows.append(Row(source="Published", split="held-out", model=r.model, gpu=r.gpu, engine=r.engine,
                        tp=int(r.tp), scenario=f"fixed-concurrency ({r.source})", isl=round(r.isl), osl=round(r.osl),
                        rate_per_replica=None, concurrency=int(r.concurrency),
                        measured={"ttft_s": r.ttft_ms / 1e3, "tpot_s": r.tpot_ms / 1e3,
                                  **({} if pd.isna(r.output_tokens_per_s) else
                                     {"replica_output_tokens_per_s": r.output_tokens_per_s})},
                        label=f"{r.source} {r.model_reported} tp{r.tp} {round(r.isl)}/{round(r.osl)} c{r.concurrency}",
                        note=f"{r.weight_dtype}/{r.kv_dtype}", length_spread=spread, overlap_scheduling=overlap))
    return rows


def is_nim(row: Row) -> bool:
    """A published NVIDIA NIM run (its label starts with the source, e.g. 'nim-1.8.0')."""
    return row.source == "Published" and row.label.startswith("nim-")


def _step(row: Row, tp: int, wdt: str, kvd: str):
    return build_step_model(load_architecture(row.priced), resolve_gpu(row.gpu), tp, wdt, kvd,
                            engine=row.engine if row.engine in cal.ENGINE_OVERHEAD_S_PER_LAYER else "vllm",
                            calibrated=not PLAIN_ROOFLINE)


def path_of(step) -> str:
    """The step model's source, with the scaled roofline (apmw.perf.scaled) told apart from the plain one."""
    return "roofline (scaled)" if isinstance(step, ScaledStepModel) else step.source


def choose_tp(row: Row) -> tuple[int, object]:
    """The replica layout a submitter would pick, from the benchmark's rules, not its results.

    Offline: the TP (1, 2, 4, 8; dividing the node) with the highest predicted tokens/s per GPU.
    Server/Interactive: the smallest TP whose predicted latencies at the row's arrival rate
    meet MLPerf's TTFT and TPOT limits (smaller TP carries more load per GPU); if none
    does, the one with the lowest predicted TPOT.
    """
    per_node = row.gpus if row.gpus < 8 else 8
    best = None
    for tp in (1, 2, 4, 8):
        if tp > per_node or per_node % tp:
            continue
        try:
            step = _step(row, tp, "fp8", "fp8")
            if row.scenario == "Offline":
                n = min(TRTLLM_MAX_BATCH, kv_fit_requests(replica_with_step(step, Serving(engine=row.engine)), row.isl, row.osl))
                # MLPerf Offline issues every query at once; dataset lengths vary widely
                p = predict_with(replica_with_step(step, Serving(max_batched_tokens=DEFAULT_TOKEN_BUDGET, max_batch=TRTLLM_MAX_BATCH, engine=row.engine, overlap_scheduling=row.overlap_scheduling)), row.isl, row.osl, n, requests_per_client=10**9, length_spread=1.0)
                score = -p.output_tokens_per_s_per_gpu
            else:
                p = predict_open_loop(replica_with_step(step, Serving(max_batched_tokens=DEFAULT_TOKEN_BUDGET, max_batch=TRTLLM_MAX_BATCH, engine=row.engine, overlap_scheduling=row.overlap_scheduling)), row.isl, row.osl, row.rate_per_replica / (row.gpus // tp))
                ok = p.ttft_s <= row.constraints[0] and p.tpot_s <= row.constraints[1]
                if ok:
                    return tp, p
                score = 1e6 + p.tpot_s
        except ApmwError:
            continue
        if best is None or score < best[0]:
            best = (score, tp, p)
    if best is None:
        raise ApmwError("no tensor-parallel layout fits or carries the measured rate")
    return best[1], best[2]


def predict_row(row: Row) -> None:
    if row.source.startswith("MLPerf"):
        try:
            row.tp, p = choose_tp(row)
            row.path = path_of(_step(row, row.tp, "fp8", "fp8"))
            row.predicted = {"output_tokens_per_s_per_gpu": p.output_tokens_per_s_per_gpu}
            if row.scenario != "Offline":
                row.predicted = {"ttft_s": p.ttft_s, "tpot_s": p.tpot_s}
            if "node_power_w" in row.measured:
                step = _step(row, row.tp, "fp8", "fp8")
                gpu = resolve_gpu(row.gpu)
                rough = build_step_model(step.arch, gpu, row.tp, "fp8", "fp8", calibrated=False)
                replica_w = replica_power_w(replica_with_step(rough, Serving(max_batched_tokens=DEFAULT_TOKEN_BUDGET)),
                                            p, row.isl, row.osl)
                row.predicted["node_power_w"] = replica_w / row.tp * row.gpus
        except ApmwError as exc:
            row.predicted, row.note = None, f"not modelled: {exc}"
        return
    if row.note.startswith("not modelled"):
        row.predicted = None
        return
    if row.disagg:
        predict_disagg_row(row)
        return
    try:
        if row.source in ("InferenceMAX", "Published", "aiconfigurator silicon"):
            wdt, kvd = row.note.split("/")
        else:
            wdt, kvd = "fp8", "fp8"
        if row.layout:
            # a laid-out replica (InferenceMAX EP / DP-attention rows): apmw.capacity.benchmark builds it
            # with the same engine settings as the plain-TP rows below
            gpu = resolve_gpu(row.gpu)
            replica = replica_for_benchmark(row.priced, row.gpu, row.tp, wdt, kvd, row.isl, row.osl, row.engine,
                                            calibrated=not PLAIN_ROOFLINE, token_budget=None,
                                            max_batch=None,
                                            overlap_scheduling=row.overlap_scheduling, layout=row.layout,
                                            mxfp4_moe_activations=row.mxfp4_moe_activations,
                                            scheduler_recv_interval=row.scheduler_recv_interval)
            step = replica.step
        else:
            step = build_step_model(load_architecture(row.priced), resolve_gpu(row.gpu), row.tp, wdt, kvd,
                                    engine=row.engine if row.engine in cal.ENGINE_OVERHEAD_S_PER_LAYER else "vllm",
                                    calibrated=not PLAIN_ROOFLINE, mxfp4_moe_activations=row.mxfp4_moe_activations)
        row.path = path_of(step)
        if row.scenario == "Offline":
            n = min(TRTLLM_MAX_BATCH, kv_fit_requests(replica_with_step(step, Serving(engine=row.engine)), row.isl, row.osl))
            p = predict_with(replica_with_step(step, Serving(max_batched_tokens=DEFAULT_TOKEN_BUDGET, max_batch=TRTLLM_MAX_BATCH, engine=row.engine, overlap_scheduling=row.overlap_scheduling)), row.isl, row.osl, n, requests_per_client=10**9, length_spread=1.0)
            row.predicted = {"output_tokens_per_s_per_gpu": p.output_tokens_per_s_per_gpu}
        elif row.rate_per_replica is not None:
            p = predict_open_loop(replica_with_step(step, Serving(max_batched_tokens=DEFAULT_TOKEN_BUDGET, max_batch=TRTLLM_MAX_BATCH, engine=row.engine, overlap_scheduling=row.overlap_scheduling)), row.isl, row.osl, row.rate_per_replica)
            row.predicted = {"ttft_s": p.ttft_s, "tpot_s": p.tpot_s,
                             "output_tokens_per_s_per_gpu": row.measured["output_tokens_per_s_per_gpu"]}
        else:
            spread = DEFAULT_LENGTH_SPREAD if row.length_spread is None else row.length_spread
            p = predict_with(replica if row.layout else replica_with_step(step, Serving(max_batched_tokens=None, max_batch=None, engine=row.engine, overlap_scheduling=row.overlap_scheduling, scheduler_recv_interval=row.scheduler_recv_interval)), row.isl, row.osl, row.concurrency, requests_per_client=row.requests_per_client, request_overhead_s=row.request_overhead_s if row.request_overhead_s is not None else
                                                 HARNESS_OVERHEAD_S.get(row.source, REQUEST_OVERHEAD_S[row.engine]), length_spread=spread)
            row.predicted = {"ttft_s": p.ttft_s, "tpot_s": p.tpot_s,
                             "output_tokens_per_s_per_gpu": p.output_tokens_per_s_per_gpu,
                             "running_requests": p.running_requests}
    except ApmwError as exc:
        row.predicted = None
        row.note = f"not modelled: {exc}"


def predict_disagg_row(row: Row, token_budget: int | None = None) -> None:
    """A disaggregated InferenceMAX point through ``apmw.capacity.disaggregated_benchmark`` with the same
    engine settings as the aggregated rows (the engine's default token budget and batch limit, InferenceMAX's
    harness overhead; ASSUMPTION in the docstring) on both sides; ``token_budget`` sets both sides' budget
    instead (bench/disagg_token_budget.py)."""
    wdt, kvd = row.note.split("/")
    pre, dec = row.disagg
    try:
        p = predict_disaggregated(row.priced, row.gpu, wdt, kvd, row.isl, row.osl, row.concurrency, pre, dec,
                                  engine=row.engine, calibrated=not PLAIN_ROOFLINE,
                                  kv_transfer_bandwidth_bytes_per_s=row.kv_link_bytes_per_s,
                                  request_overhead_s=HARNESS_OVERHEAD_S["InferenceMAX"],
                                  token_budget=token_budget,
                                  max_batch=None,
                                  speculative=row.speculative)
    except ApmwError as exc:
        row.predicted, row.note = None, f"not modelled: {exc}"
        return
    row.path = "mixed" if "(calibrated" in p.source_detail and "(roofline" in p.source_detail else p.source
    row.predicted = {"ttft_s": p.ttft_s, "tpot_s": p.tpot_s, "output_tokens_per_s_per_gpu": p.output_tokens_per_s_per_gpu,
                     "total_tokens_per_s_per_gpu": p.total_tokens_per_s_per_gpu, "e2e_s": p.e2e_latency_s,
                     "running_requests": p.running_requests, "prefill_service_s": p.ttft_parts_s["steady_state"],
                     "prefill_wait_s": p.ttft_parts_s["slot_queue"], "running_limited_by": p.running_limited_by,
                     "decode_iteration_s": p.decode_iteration_s}


def errors(rows: list[Row], metric: str) -> list[float]:
    """Signed % errors (predicted / measured - 1) of rows that have both."""
    out = []
    for r in rows:
        if r.predicted and metric in r.predicted and metric in r.measured and r.measured[metric] > 0:
            if metric == "output_tokens_per_s_per_gpu" and r.rate_per_replica is not None and r.scenario != "Offline":
                continue    # Server throughput is the offered load, not a prediction
            out.append(100 * (r.predicted[metric] / r.measured[metric] - 1))
    return out


def summary(rows: list[Row], metric: str) -> str:
    e = errors(rows, metric)
    if not e:
        return "-"
    a = [abs(x) for x in e]
    return f"{statistics.median(a):.1f} / {statistics.mean(a):.1f} / {statistics.median(e):+.1f} (n={len(e)})"


METRICS = ("tpot_s", "ttft_s", "output_tokens_per_s_per_gpu", "node_power_w")


def table(rows: list[Row], by) -> list[str]:
    lines = ["| group | path | TPOT med/mean abs % (median signed) | TTFT | output tok/s/GPU | node power |",
             "|---|---|---|---|---|---|"]
    groups: dict = {}
    for r in rows:
        if r.predicted:
            groups.setdefault(by(r), []).append(r)
    for k in sorted(groups):
        g = groups[k]
        path = g[0].path if len({r.path for r in g}) == 1 else "mixed"
        lines.append(f"| {k} | {path} | " + " | ".join(summary(g, m) for m in METRICS) + " |")
    return lines


def fit_isl(rows: list[Row], model: str) -> int:
    """Grid-search the dataset's mean input length on the training Offline throughput rows."""
    train = [r for r in rows if r.split == "train" and r.model == model and r.scenario == "Offline"]
    base = {id(r): r.isl for r in train}
    best = (math.inf, None)
    for isl in range(100, 1001, 25):
        for r in train:
            r.isl = isl
            predict_row(r)
        e = errors(train, "output_tokens_per_s_per_gpu")
        score = statistics.median(abs(x) for x in e) if e else math.inf
        if score < best[0]:
            best = (score, isl)
    for r in train:
        r.isl = base[id(r)]
    print(f"fitted mean input length for {model.split('/')[-1]}: {best[1]} tokens "
          f"(train median |throughput err| {best[0]:.1f}%, {len(train)} rows)")
    return best[1]


def fit_moe_ceiling(rows: list[Row]) -> float:
    """Grid-search the served fused-MoE compute ceiling (TFLOP/s per GPU) on the InferenceMAX h100 rows,
    refitting InferenceMAX's harness overhead at each value (both move TTFT); keeps the best pair.

    It sets the calibrated path's ceiling only (``calibrated.SERVED_MOE_TFLOPS_PER_GPU``); the plain
    roofline keeps ``Efficiency.served_moe_flops_per_s``, the figure that constant is read from."""
    best = (math.inf, None, None)
    for tflops in [None, *np.arange(100.0, 400.1, 25.0)]:
        cal.SERVED_MOE_TFLOPS_PER_GPU = tflops
        score, overhead_s = fit_imax_overhead(rows)
        if score < best[0]:
            best = (score, tflops, overhead_s)
    cal.SERVED_MOE_TFLOPS_PER_GPU = best[1]
    HARNESS_OVERHEAD_S["InferenceMAX"] = best[2]
    n = sum(r.source == "InferenceMAX" and r.split == "train" for r in rows)
    print(f"fitted served MoE ceiling: {best[1]} TFLOP/s per GPU, with InferenceMAX's request overhead "
          f"{best[2] * 1e3:.1f} ms (train median |TTFT err| {best[0]:.1f}%, {n} rows)")
    return best[1]


def _b200_gptoss_rows(rows: list[Row], engine: str) -> list[Row]:
    """InferenceMAX's B200 gpt-oss rows of ``engine`` with a plain tensor-parallel layout: the training
    split of the Blackwell figures fitted below."""
    return [r for r in rows if r.source == "InferenceMAX" and r.gpu == "B200" and r.engine == engine
            and "gpt-oss" in r.model and not r.layout]


def fit_own_kernels_overhead(rows: list[Row], engine: str = "trtllm") -> float:
    """Grid-search the engine's per-layer overhead where its own measured kernels price the iteration
    (``apmw.perf.serving_policy.OWN_KERNELS_OVERHEAD_S_PER_LAYER``) on the InferenceMAX B200 gpt-oss rows of
    that engine with a plain tensor-parallel layout (the training split for this figure), scored as
    :func:`fit_overhead` scores (median |TPOT error| + median |throughput error|)."""
    train = _b200_gptoss_rows(rows, engine)
    best = (math.inf, None)
    for us in np.arange(0.0, 28.1, 2.0):
        serving_policy.OWN_KERNELS_OVERHEAD_S_PER_LAYER[engine] = us * 1e-6
        for r in train:
            predict_row(r)
        parts = [errors(train, "tpot_s"), errors(train, "output_tokens_per_s_per_gpu")]
        score = sum(statistics.median(abs(x) for x in e) for e in parts if e)
        print(f"  {engine} overhead with its own kernels {us:.0f} us per layer: train score {score:.1f}")
        if score < best[0]:
            best = (score, us * 1e-6)
    serving_policy.OWN_KERNELS_OVERHEAD_S_PER_LAYER[engine] = best[1]
    print(f"fitted {engine} overhead with its own kernels: {best[1] * 1e6:.0f} us per layer "
          f"(train score {best[0]:.1f}, {len(train)} rows)")
    return best[1]


def fit_blackwell_moe_share(rows: list[Row]) -> float:
    """Grid-search the served MoE ceiling on Blackwell as a share of the measured kernel
    (``apmw.perf.served_moe.BLACKWELL_SHARE``) on the InferenceMAX B200 gpt-oss vLLM rows' mean TTFT;
    keeps the smallest share with the best score (a larger share stops binding once the kernel does).
    The B200 rows are this figure's training split; the other Blackwell rows hold it out."""
    train = _b200_gptoss_rows(rows, "vllm")
    best = (math.inf, None)
    for share in (0.25, 0.3, 0.365, 0.43, 0.5, 0.69, 1.0, 1.5):
        served_moe.BLACKWELL_SHARE = share
        for r in train:
            predict_row(r)
        e = errors(train, "ttft_s")
        score = statistics.median(abs(x) for x in e)
        print(f"  Blackwell served MoE share {share:.3f}: train median |TTFT err| {score:.1f}% ({len(e)} rows)")
        if score < best[0] - 0.05:
            best = (score, share)
    served_moe.BLACKWELL_SHARE = best[1]
    print(f"fitted Blackwell served MoE share of the measured kernel: {best[1]} "
          f"(train median |TTFT err| {best[0]:.1f}%, {len(train)} rows)")
    return best[1]


def _amd_offline_rows(rows: list[Row], gpu: str) -> list[Row]:
    """The training rows of an AMD part's matrix rate: MLPerf v5.1 llama2-70b Offline runs on vLLM (every query
    issued at once, so each GPU runs compute-bound at the batch its KV memory holds)."""
    return [r for r in rows if r.source == "MLPerf v5.1" and r.gpu == gpu and r.scenario == "Offline"
            and r.model == LLAMA2_70B]


def _amd_launch_rows(rows: list[Row], gpu: str) -> list[Row]:
    """The training rows of a compute die's GEMM launch cost: InferenceMAX's DeepSeek-R1 runs on SGLang on ``gpu``
    (fixed concurrency 4-64, so decode iterations of a few to 64 sequences, where a constant per iteration shows)."""
    return [r for r in rows if r.source == "InferenceMAX" and r.gpu == gpu and r.framework == "sglang"
            and "DeepSeek-R1" in r.model and r.disagg is None]


# The part each AMD die's launch cost is fitted on; the die's other parts and the part's other engines hold it out.
AMD_LAUNCH_TRAINING_PART = {"CDNA3": "MI300X", "CDNA4": "MI355X"}


def fit_amd_launch(rows: list[Row]) -> dict[str, float]:
    """Grid-search each AMD die's GEMM launch cost (``apmw.perf.efficiency.AMD_GEMM_LAUNCH_S_BY_DIE``, 4-80 us) on
    its training part's DeepSeek-R1 SGLang runs: the smallest with the best median |TPOT error|. The die's other
    parts take it; their runs, ATOM's and MLPerf's hold it out."""
    fitted = {}
    for die, part in AMD_LAUNCH_TRAINING_PART.items():
        train = _amd_launch_rows(rows, part)

        def launch(us: float, die: str = die) -> None:
            efficiency.AMD_GEMM_LAUNCH_S_BY_DIE[die] = us * 1e-6

        score, fitted[die] = _smallest_best(np.round(np.arange(4.0, 80.01, 0.5), 1), launch, train, "tpot_s")
        print(f"fitted {die} GEMM launch: {fitted[die]:.1f} us (on {part}: train median |TPOT err| {score:.1f}%, "
              f"{len(train)} rows)")
    return fitted


def amd_held_out_rows(rows: list[Row], gpu: str) -> list[Row]:
    """The runs an AMD part's fitted roofline is checked on for its caveat (``apmw.perf.efficiency.
    AMD_HELD_OUT_TPOT_ERROR``), none of them in a fit: for MI300X and MI325X, MI325X's InferenceMAX DeepSeek-R1
    runs on SGLang (their die's launch cost is fitted on MI300X's); for MI355X its runs on AMD's ATOM engine."""
    if gpu in ("MI300X", "MI325X"):         # MI300X's die is fitted on MI300X's runs: MI325X's hold it out
        return _amd_launch_rows(rows, "MI325X")
    if gpu == "MI355X":
        return [r for r in rows if r.source == "InferenceMAX" and r.gpu == gpu and r.framework == "atom"
                and r.disagg is None]
    return []


def _smallest_best(grid: np.ndarray, apply, train: list[Row], metric: str) -> tuple[float, float]:
    """(median |``metric`` error| %, value): the smallest value of ``grid`` with the best score on ``train``, each
    tried by ``apply(value)`` and the AMD efficiencies rebuilt from it; the best is left applied."""
    best = (math.inf, float(grid[0]))
    for value in map(float, grid):
        apply(value)
        _refresh_amd_efficiencies()
        for r in train:
            predict_row(r)
        score = statistics.median(abs(x) for x in errors(train, metric))
        if score < best[0] - 1e-9:
            best = (score, value)
    apply(best[1])
    _refresh_amd_efficiencies()
    return best


def _refresh_amd_efficiencies() -> None:
    for gpu in efficiency.AMD_DIE:
        efficiency.EFFICIENCY_BY_GPU[gpu] = efficiency.amd_efficiency(gpu, efficiency.AMD_FP8_FLOPS_EFFICIENCY.get(gpu))


def fit_amd_flops(rows: list[Row]) -> dict[str, float]:
    """Grid-search each AMD part's fp8 matrix efficiency (``apmw.perf.efficiency.AMD_FP8_FLOPS_EFFICIENCY``, a
    share of the spec sheet's peak) on its MLPerf v5.1 Offline throughput; the smallest share with the best
    median |throughput error|. Every other AMD row (v4.1, Interactive, Server, InferenceMAX) holds it out."""
    fitted = {}
    for gpu in sorted(efficiency.AMD_FP8_FLOPS_EFFICIENCY):
        train = _amd_offline_rows(rows, gpu)

        def share(value: float, gpu: str = gpu) -> None:
            efficiency.AMD_FP8_FLOPS_EFFICIENCY[gpu] = value

        score, fitted[gpu] = _smallest_best(np.round(np.arange(0.20, 0.801, 0.005), 3), share, train,
                                            "output_tokens_per_s_per_gpu")
        print(f"fitted {gpu} fp8 matrix efficiency: {fitted[gpu]:.3f} of the peak (train median |throughput err| "
              f"{score:.1f}%, {len(train)} rows)")
    return fitted


def fit_imax_overhead(rows: list[Row], overlap: bool | None = None) -> tuple[float, float]:
    """(median |TTFT error| %, request overhead s) of the InferenceMAX request overhead (0-50 ms)
    that best fits its h100 (training) rows' mean TTFT, predicted with ``overlap`` scheduling
    (None: the engine's default)."""
    train = [r for r in rows if r.source == "InferenceMAX" and r.split == "train"]
    best = (math.inf, 0.0)
    for ms in np.arange(0.0, 50.1, 2.5):
        trial = [Row(**{**r.__dict__, "overlap_scheduling": overlap, "request_overhead_s": ms * 1e-3})
                 for r in train]
        for r in trial:
            predict_row(r)
        best = min(best, (statistics.median(abs(x) for x in errors(trial, "ttft_s")), ms * 1e-3))
    return best


def fit_overhead(rows: list[Row], engine: str) -> float:
    """Grid-search the engine's per-layer iteration overhead (0-140 us) on its calibrated training rows.

    The score adds the median |TPOT error| (Server) and the median |throughput error|
    (Offline): TPOT alone is degenerate near the Server knee, where any slower model
    looks better, while throughput pins how much each iteration costs.
    """
    train = [r for r in rows if r.split == "train" and r.engine == engine]
    best = (math.inf, None)
    # vLLM's grid stops at 2 ms per iteration for the 36-layer gpt-oss it is fitted on (the bound
    # of the per-iteration grid before session 7); TensorRT-LLM's at 5 ms for it
    for us in np.arange(0.0, 140.1, 1.0):
        if engine == "vllm" and us > 2e3 / 36:
            break
        cal.ENGINE_OVERHEAD_S_PER_LAYER[engine] = us * 1e-6
        for r in train:
            predict_row(r)
        parts = [errors(train, "tpot_s"), errors(train, "output_tokens_per_s_per_gpu")]
        score = sum(statistics.median(abs(x) for x in e) for e in parts if e) if any(parts) else math.inf
        if score < best[0]:
            best = (score, us * 1e-6)
    cal.ENGINE_OVERHEAD_S_PER_LAYER[engine] = best[1]
    print(f"fitted {engine} overhead: {best[1] * 1e6:.0f} us per layer (train score {best[0]:.1f}, {len(train)} rows)")
    return best[1]


DOCS = ROOT / "docs" / "accuracy.md"


def doc_tables(rows: list[Row]) -> dict[str, list[str]]:
    """The tables docs/accuracy.md quotes, keyed by their marker names."""
    mod = [r for r in rows if r.predicted and r.legacy]
    published = [r for r in mod if r.source == "Published"]
    dense = [r for r in mod if r.source.startswith("MLPerf") and r.path == "calibrated"]
    pub = table(published, lambda r: "all published rows")
    pub += table(published, lambda r: f"{r.label.split()[0]} {r.model.split('/')[-1]} tp{r.tp} {r.engine}")[2:]
    pub += table([r for r in published if r.concurrency <= _running(r)],
                 lambda r: "published, concurrency within the batch/KV limit")[2:]
    # concurrency 1 is where a harness's own overhead shows; the rest holds it out
    pub += table([r for r in published if r.concurrency > 1], lambda r: "published, concurrency above 1")[2:]
    by = table(mod, lambda r: f"{r.source.split()[0]} {r.model.split('/')[-1]} {r.gpu} {r.engine} {r.scenario}")
    by = [line.replace("meta-llama--Llama-2-70b-chat-hf.json", "Llama-2-70b") for line in by]
    silicon = [r for r in mod if r.source == "aiconfigurator silicon"]
    sil = table(silicon, lambda r: "all modelled silicon rows")
    sil += table(silicon, lambda r: f"{r.gpu} {r.model.split('/')[-1]} {r.scenario.split('(')[1].rstrip(')')} "
                                    f"tp{r.tp} {r.path}")[2:]
    legacy = [r for r in rows if r.legacy]
    return {"published": pub, "mlperf-split": table(dense, lambda r: r.split), "by-group": by, "silicon": sil,
            "steady-median": steady_state_ttft(legacy), "scaled": scaled_vs_plain(legacy),
            "imax-layouts": imax_layout_table(rows), "imax-disagg": imax_disagg_table(rows)}


# The targets for a group of at least IMAX_TARGET_MIN_POINTS points (median |error| %)
IMAX_TARGET_TPOT_PCT, IMAX_TARGET_TTFT_PCT, IMAX_TARGET_MIN_POINTS = 15.0, 30.0, 20
# disaggregated InferenceMAX rows by hardware and framework (imax_disaggregated), set by main
IMAX_DISAGG: pd.DataFrame | None = None


def _imax_group(r: Row) -> str:
    return f"{r.label.split()[0]} {r.model.split('/')[-1]} {r.precision} {r.framework} {r.layout_kind}"


def median_error_cell(rs: list[Row], metric: str) -> tuple[str, float | None]:
    """A table cell: the median |error| % (median signed %) of ``metric`` over ``rs``, and that median."""
    e = errors(rs, metric)
    if not e:
        return "-", None
    med = statistics.median(abs(x) for x in e)
    return f"{med:.1f} ({statistics.median(e):+.1f})", med


def imax_layout_table(rows: list[Row]) -> list[str]:
    """Every aggregated InferenceMAX point by (hardware, model, precision, framework, layout kind):
    median |error| % (median signed %) of mean TPOT, mean TTFT and output tokens/s per GPU, whether the
    issue's targets hold, then the points not predicted and why, and the disaggregated rows."""
    imax = [r for r in rows if r.source == "InferenceMAX" and not _is_disagg(r)]
    lines = ["| hardware, model, precision, framework, layout | CSV rows | n | path | TPOT | TTFT | "
             "output tok/s/GPU | targets (TPOT <= 15 %, TTFT <= 30 %) |", "|---|---|---|---|---|---|---|---|"]

    groups: dict[str, list[Row]] = {}
    for r in imax:
        if r.predicted:
            groups.setdefault(_imax_group(r), []).append(r)
    for name in sorted(groups):
        g = groups[name]
        path = g[0].path if len({r.path for r in g}) == 1 else "mixed"
        (tpot, mt), (ttft, mf), (thr, _) = (median_error_cell(g, m) for m in ("tpot_s", "ttft_s", "output_tokens_per_s_per_gpu"))
        if len(g) < IMAX_TARGET_MIN_POINTS:
            verdict = f"n < {IMAX_TARGET_MIN_POINTS}"
        else:
            misses = [n for n, v, t in (("TPOT", mt, IMAX_TARGET_TPOT_PCT), ("TTFT", mf, IMAX_TARGET_TTFT_PCT))
                      if v is None or v > t]
            verdict = "meets both" if not misses else "misses " + " and ".join(misses)
        lines.append(f"| {name} | {sum(r.csv_rows for r in g)} | {len(g)} | {path} | {tpot} | {ttft} | {thr} | "
                     f"{verdict} |")
    skipped: dict[tuple[str, str], list[Row]] = {}
    for r in imax:
        if not r.predicted:
            skipped.setdefault((_imax_group(r), r.note), []).append(r)
    for (name, note), g in sorted(skipped.items()):
        lines.append(f"| {name} | {sum(r.csv_rows for r in g)} | {len(g)} | {note} | - | - | - | not predicted |")
    if IMAX_DISAGG is not None and len(IMAX_DISAGG):
        parts = ", ".join(f"{x.hw} {x.framework} {x.precision} {x.rows}" for x in IMAX_DISAGG.itertuples())
        lines.append(f"| disaggregated ({IMAX_DISAGG.rows.sum()} rows: {parts}) | "
                     f"{IMAX_DISAGG.rows.sum()} | - | prefill/decode workers: the disaggregated table | - | - | - | "
                     "see that table |")
    n_pred = sum(r.csv_rows for r in imax if r.predicted)
    n_all = sum(r.csv_rows for r in imax) + (0 if IMAX_DISAGG is None else int(IMAX_DISAGG.rows.sum()))
    lines.append(f"\nPredicted {n_pred} of {n_all} CSV rows ({sum(1 for r in imax if r.predicted)} points; a point "
                 "merges the repeated runs of one setting by their median).")
    return lines


def _is_disagg(r: Row) -> bool:
    """A disaggregated InferenceMAX point (imax_disagg_rows), predicted or not."""
    return r.scenario.endswith("(disaggregated)")


def _disagg_rows(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r.source == "InferenceMAX" and _is_disagg(r)]


def _imax_disagg_group(r: Row) -> str:
    return f"{r.label.split()[0]} {r.model.split('/')[-1]} {r.precision} {r.framework}"


def imax_disagg_table(rows: list[Row]) -> list[str]:
    """Every disaggregated InferenceMAX point by (hardware, model, precision, framework), then by worker
    layout within it: median |error| % (median signed %) of mean TPOT, mean TTFT and throughput per GPU
    (over prefill and decode GPUs), whether the issue's targets hold; then the points not predicted, why."""
    dis = _disagg_rows(rows)
    lines = ["| hardware, model, precision, framework (workers) | CSV rows | n | path | TPOT | TTFT | "
             "tok/s per GPU | targets (TPOT <= 15 %, TTFT <= 30 %) |", "|---|---|---|---|---|---|---|---|"]

    def line(name: str, g: list[Row], judge: bool) -> str:
        path = g[0].path if len({r.path for r in g}) == 1 else "mixed"
        (tpot, mt), (ttft, mf), (thr, _) = (median_error_cell(g, m) for m in ("tpot_s", "ttft_s", "output_tokens_per_s_per_gpu"))
        if not judge:
            verdict = ""
        elif len(g) < IMAX_TARGET_MIN_POINTS:
            verdict = f"n < {IMAX_TARGET_MIN_POINTS}"
        else:
            misses = [n for n, v, t in (("TPOT", mt, IMAX_TARGET_TPOT_PCT), ("TTFT", mf, IMAX_TARGET_TTFT_PCT))
                      if v is None or v > t]
            verdict = "meets both" if not misses else "misses " + " and ".join(misses)
        return f"| {name} | {sum(r.csv_rows for r in g)} | {len(g)} | {path} | {tpot} | {ttft} | {thr} | {verdict} |"

    groups: dict[str, list[Row]] = {}
    for r in dis:
        if r.predicted:
            groups.setdefault(_imax_disagg_group(r), []).append(r)
    for name in sorted(groups):
        g = groups[name]
        lines.append(line(f"**{name}**", g, True))
        kinds: dict[str, list[Row]] = {}
        for r in g:
            kinds.setdefault(r.layout_kind, []).append(r)
        if len(kinds) > 1:
            for kind in sorted(kinds):
                lines.append(line(f"&nbsp;&nbsp;{kind}", kinds[kind], False))
    every = [r for g in groups.values() for r in g]
    if every:
        lines.append(line("all predicted disaggregated points", every, True))
    skipped: dict[tuple[str, str], list[Row]] = {}
    for r in dis:
        if not r.predicted:
            skipped.setdefault((_imax_disagg_group(r), r.note), []).append(r)
    for (name, note), g in sorted(skipped.items()):
        lines.append(f"| {name} | {sum(r.csv_rows for r in g)} | {len(g)} | {note} | - | - | - | skipped |")
    n_pred = sum(r.csv_rows for r in dis if r.predicted)
    lines.append(f"\nPredicted {n_pred} of {sum(r.csv_rows for r in dis)} disaggregated CSV rows "
                 f"({len(every)} points); skipped {sum(r.csv_rows for r in dis if not r.predicted)}.")
    return lines


def imax_disagg_diagnosis(rows: list[Row]) -> str:
    """Per disaggregated group (imax_disagg_table's), which term of the prediction disagrees with the row.

    * prefill capacity: the measured request rate (concurrency / measured mean E2E, Little's law) needs
      each prompt to hold a prefill worker at most ``workers / rate`` seconds; apmw's one-prompt service
      S over that bound (> 1: apmw's prefill workers cannot carry the measured rate at all)
    * queue share: apmw's prefill wait over its TTFT (its TTFT is mostly the prefill queue when high)
    * low load: measured TTFT less apmw's prefill service and overhead at concurrency <= 16 per prefill
      worker, ms (what a first token costs beyond one prompt's prefill: hand-off, scheduling, transfer)
    * decode: TPOT error where apmw's prefill is not the bottleneck (S / bound < 0.5), and apmw's running
      requests over the measured ones (concurrency x measured decode time / measured E2E)
    """
    groups: dict[str, list[Row]] = {}
    for r in _disagg_rows(rows):
        if r.predicted:
            groups.setdefault(_imax_disagg_group(r), []).append(r)
    lines = ["| group | n | apmw S / measured bound: median (max) | points S > bound | prefill wait / TTFT | "
             "low-load TTFT gap, ms (n) | TPOT signed %, prefill not binding (n) | running: apmw / measured |",
             "|---|---|---|---|---|---|---|---|"]

    def med(v: list[float], fmt: str = "{:.2f}") -> str:
        return (fmt.format(statistics.median(v)) + f" (n={len(v)})") if v else "-"

    for name in sorted(groups):
        g = groups[name]
        ratio, wait, gap, tpot, run = [], [], [], [], []
        for r in g:
            pre, dec = r.disagg
            rate = r.concurrency / r.measured["e2e_s"]
            s = r.predicted["prefill_service_s"]
            ratio.append(s / (pre.count / rate))
            wait.append(r.predicted["prefill_wait_s"] / r.predicted["ttft_s"])
            if r.concurrency <= 16 * pre.count:
                gap.append(1e3 * (r.measured["ttft_s"] - s - HARNESS_OVERHEAD_S["InferenceMAX"]))
            if ratio[-1] < 0.5:
                tpot.append(100 * (r.predicted["tpot_s"] / r.measured["tpot_s"] - 1))
            decoding = r.concurrency * (r.measured["e2e_s"] - r.measured["ttft_s"]) / r.measured["e2e_s"]
            run.append(r.predicted["running_requests"] / decoding)
        lines.append(f"| {name} | {len(g)} | {statistics.median(ratio):.2f} ({max(ratio):.2f}) | "
                     f"{sum(x > 1 for x in ratio)} | {statistics.median(wait):.2f} | {med(gap, '{:.0f}')} | "
                     f"{med(tpot, '{:+.1f}')} | {statistics.median(run):.2f} |")
    return "\n".join(lines)


def scaled_vs_plain(rows: list[Row]) -> list[str]:
    """The rows on the scaled roofline (apmw.perf.scaled), each also predicted on the plain one:
    median |error| % (median signed %) of TPOT and TTFT per group, scaled then plain."""
    global PLAIN_ROOFLINE
    groups: dict[str, list[tuple[Row, Row]]] = {}
    for r in rows:
        if r.predicted and r.path == "roofline (scaled)" and "ttft_s" in r.predicted:
            plain = Row(**{**r.__dict__, "predicted": None})
            PLAIN_ROOFLINE = True
            try:
                predict_row(plain)
            finally:
                PLAIN_ROOFLINE = False
            source = r.source.split()[0]
            name = f"{source} {r.model.split('/')[-1]} {r.gpu} {r.engine} tp{r.tp}"
            name = name.replace("meta-llama--Llama-2-70b-chat-hf.json", "Llama-2-70b")
            groups.setdefault(name, []).append((r, plain))
    lines = ["| group | n | TPOT scaled | TPOT plain | TTFT scaled | TTFT plain |", "|---|---|---|---|---|---|"]

    def cell(rs: list[Row], metric: str) -> str:
        e = errors(rs, metric)
        return f"{statistics.median(abs(x) for x in e):.1f} ({statistics.median(e):+.1f})" if e else "-"

    for name in sorted(groups):
        pairs = groups[name]
        scaled, plain = [p[0] for p in pairs], [p[1] for p in pairs]
        lines.append(f"| {name} | {len(pairs)} | {cell(scaled, 'tpot_s')} | {cell(plain, 'tpot_s')} | "
                     f"{cell(scaled, 'ttft_s')} | {cell(plain, 'ttft_s')} |")
    every = [p for v in groups.values() for p in v]
    lines.append(f"| all | {len(every)} | {cell([p[0] for p in every], 'tpot_s')} | "
                 f"{cell([p[1] for p in every], 'tpot_s')} | {cell([p[0] for p in every], 'ttft_s')} | "
                 f"{cell([p[1] for p in every], 'ttft_s')} |")
    return lines


def write_docs(rows: list[Row], path: Path = DOCS) -> None:
    """Replace the tables between the ``<!-- accuracy:NAME -->`` markers of docs/accuracy.md."""
    text = path.read_text()
    for name, lines in doc_tables(rows).items():
        start, end = f"<!-- accuracy:{name} -->", f"<!-- /accuracy:{name} -->"
        if start not in text or end not in text:
            raise SystemExit(f"{path}: marker {start} ... {end} is missing; restore it to write the table")
        head, rest = text.split(start, 1)
        text = head + start + "\n" + "\n".join(lines) + "\n" + end + rest.split(end, 1)[1]
    path.write_text(text)
    print(f"wrote the tables in {path.relative_to(ROOT)}")


def report(rows: list[Row], isl_scale: float) -> str:
    skipped = [r for r in rows if not r.predicted]
    tables = doc_tables(rows)
    lines = [f"Rows modelled: {len(rows) - len(skipped)} of {len(rows)} (input-length scale {isl_scale}).", "",
             "Cells: median |error| % / mean |error| % / median signed error % (n rows). "
             "Signed error = predicted / measured - 1.", "",
             "### Dense models at fixed concurrency (published NIM and GPUStack runs, held out)", "",
             *tables["published"],
             "", "### Dense models on H100/H200 (MLPerf, calibrated path), by split", "", *tables["mlperf-split"],
             "", "### By model, GPU, engine and scenario", "", *tables["by-group"],
             "", "### NVIDIA's measured runs in aiconfigurator's silicon_sample.csv (held out)", "",
             *tables["silicon"],
             "", "### Steady-state TTFT against InferenceMAX's measured median TTFT (no first wave)", "",
             *tables["steady-median"],
             "", "### GPUs without tables: the scaled roofline against the plain one (median |error| %, signed)", "",
             *tables["scaled"],
             "", "### InferenceMAX, every aggregated row, by hardware, model, precision, framework and layout", "",
             *tables["imax-layouts"],
             "", "### InferenceMAX, every disaggregated row (prefill and decode workers)", "",
             *tables["imax-disagg"]]
    if skipped:
        lines += ["", f"Not modelled ({len(skipped)}): " + "; ".join(sorted({r.note for r in skipped}))[:600]]
    return "\n".join(lines)


def _running(row: Row) -> int:
    return row.predicted.get("running_requests", row.concurrency) if row.predicted else row.concurrency


FIXTURE = ROOT / "tests" / "fixtures" / "accuracy" / "inferencemax_gptoss_h200.csv"


def write_fixture(rows: list[Row], path: Path = FIXTURE) -> None:
    """The regression subset from the shared benchmarks: InferenceMAX gpt-oss-120b on H200 (held out)."""
    keep = [r for r in rows if r.source == "InferenceMAX" and r.gpu == "H200" and "gpt-oss" in r.model
            and r.predicted and r.legacy]
    out = pd.DataFrame([{
        "label": r.label, "model": r.model, "gpu": r.gpu, "tp": r.tp, "weight_dtype": r.note.split("/")[0],
        "kv_dtype": r.note.split("/")[1], "engine": r.engine, "isl": r.isl, "osl": r.osl,
        "length_spread": round(r.length_spread, 6), "concurrency": r.concurrency,
        "measured_ttft_s": round(r.measured["ttft_s"], 6), "measured_tpot_s": round(r.measured["tpot_s"], 6),
        "measured_output_tokens_per_s_per_gpu": round(r.measured["output_tokens_per_s_per_gpu"], 3),
        "measured_median_ttft_s": round(r.measured["median_ttft_s"], 6),
    } for r in keep])
    out.to_csv(path, index=False)
    print(f"wrote {len(out)} rows to {path.relative_to(ROOT)}")


def steady_state_ttft(rows: list[Row]) -> list[str]:
    """apmw's steady-state TTFT against InferenceMAX's measured *median* TTFT, with and without
    overlap scheduling (apmw.perf.serving_policy).

    A run of ten prompts per client puts its first, simultaneous wave in the slowest tenth of
    its TTFTs, so the median is a steady-state figure whatever the harness's prompt count: it
    tests a prompt's wait and its own prefill alone. ``apmw.capacity.benchmark.predict_with`` with no first
    wave (``requests_per_client`` unbounded) predicts it.
    """
    # each variant with the harness overhead its own fit gives on the h100 (training) mean TTFTs
    overhead = {None: HARNESS_OVERHEAD_S["InferenceMAX"], False: fit_imax_overhead(rows, overlap=False)[1]}
    lines = ["| group | n | median abs % | median signed % | without overlap scheduling: abs % | signed % |",
             "|---|---|---|---|---|---|"]
    groups: dict[str, list[Row]] = {}
    for r in rows:
        if r.source == "InferenceMAX" and r.predicted and r.path == "calibrated":
            groups.setdefault(f"{r.gpu} {r.model.split('/')[-1]} {r.engine}, {round(r.isl / 0.9)} prompt tokens",
                              []).append(r)
    for name in sorted(groups):
        cells = []
        for overlap in (None, False):
            errs = []
            for r in groups[name]:
                steady = Row(**{**r.__dict__, "requests_per_client": 10**9, "overlap_scheduling": overlap,
                                "request_overhead_s": overhead[overlap]})
                predict_row(steady)
                errs.append(steady.predicted["ttft_s"] / r.measured["median_ttft_s"] - 1)
            cells += [f"{statistics.median(abs(e) for e in errs) * 100:.1f}", f"{statistics.median(errs) * 100:+.1f}"]
        lines.append(f"| {name} | {len(groups[name])} | " + " | ".join(cells) + " |")
    lines.append(f"\nHarness overhead: {overhead[None] * 1e3:.1f} ms with overlap scheduling, "
                 f"{overhead[False] * 1e3:.1f} ms without (each fitted on the h100 rows' mean TTFT).")
    return lines


def first_wave_ratios(rows: list[Row]) -> str:
    """Measured TTFT over the TTFT of a whole first wave, for the published runs below saturation.

    The first wave is every client's prompt queueing for the token budget at once
    (``apmw.capacity.benchmark.predict`` with ``requests_per_client=1`` and no request overhead). A ratio
    near 1 means the run behaves as if every cycle were a first wave; the steady state of a
    long run is far below it. Rows at concurrency under 5 or with queued requests are skipped.
    """
    out = []
    by_model: dict[str, list[float]] = {}
    for r in rows:
        if r.source != "Published" or r.concurrency < 5:
            continue
        wdt, kvd = r.note.split("/")
        kw = dict(engine=r.engine, length_spread=DEFAULT_LENGTH_SPREAD if r.length_spread is None else r.length_spread,
                  request_overhead_s=0.0, overlap_scheduling=r.overlap_scheduling)
        wave = predict(r.model, r.gpu, r.tp, wdt, kvd, r.isl, r.osl, r.concurrency, requests_per_client=1, **kw)
        if wave.queued_requests:
            continue
        ratio = r.measured["ttft_s"] / wave.ttft_s
        by_model.setdefault(f"{r.scenario} {r.model}", []).append(ratio)
        out.append(f"{r.label:58} measured {r.measured['ttft_s'] * 1e3:8.1f} ms  first wave "
                   f"{wave.ttft_s * 1e3:8.1f} ms  ratio {ratio:5.2f}")
    for name, v in by_model.items():
        q1, med, q3 = np.percentile(v, [25, 50, 75])
        out.append(f"{name}: measured / first-wave TTFT median {med:.2f} (quartiles {q1:.2f}-{q3:.2f}, n={len(v)})")
    return "\n".join(out)


# Replica output rates (tokens/s) at which the rows are grouped by --by-rate.
RATE_EDGES = (0, 2_000, 5_000, 10_000, float("inf"))


def by_output_rate(rows: list[Row]) -> str:
    """Signed TTFT and TPOT errors and predicted / measured replica throughput, grouped by the
    measured output rate of the replica (tokens/s), for the fixed-concurrency runs that publish it.

    It tests one explanation of low TTFT at high load: a server cost per output token (detokenising,
    streaming) outside the GPU iterations apmw prices would make errors drift with the rate whatever
    the model. They drift for the NIM 8B and InferenceMAX's vLLM runs but not for the NIM 70B at the
    same rates, so that cost alone is not it (docs/accuracy.md, "Where the model is weak").
    """
    groups: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    for r in rows:
        rate = r.measured.get("replica_output_tokens_per_s")
        if not (rate and r.predicted and r.concurrency and r.legacy) or r.predicted.get("ttft_s") is None:
            continue
        source = "NIM 1.8.0" if is_nim(r) else r.source
        family = f"{source} {r.model.split('/')[-1]} {r.engine} ({r.path})"
        band = next(i for i in range(len(RATE_EDGES) - 1) if rate < RATE_EDGES[i + 1])
        predicted_rate = r.predicted["output_tokens_per_s_per_gpu"] * r.tp
        groups.setdefault((family, band), []).append(
            (r.predicted["ttft_s"] / r.measured["ttft_s"] - 1, r.predicted["tpot_s"] / r.measured["tpot_s"] - 1,
             predicted_rate / rate))
    lines = ["| runs | measured output tokens/s per replica | n | TTFT median signed % | TPOT median signed % "
             "| predicted / measured throughput |", "|---|---|---|---|---|---|"]
    for (family, band), v in sorted(groups.items()):
        lo, hi = RATE_EDGES[band], RATE_EDGES[band + 1]
        span = f"{lo:,.0f}+" if hi == float("inf") else f"{lo:,.0f}-{hi:,.0f}"
        ttft, tpot, thr = (statistics.median(x[i] for x in v) for i in range(3))
        lines.append(f"| {family} | {span} | {len(v)} | {ttft * 100:+.1f} | {tpot * 100:+.1f} | {thr:.2f} |")
    return "\n".join(lines)


def vllm_version_ratios(data: Path) -> str:
    """InferenceMAX's gpt-oss grid run on both vLLM 0.11.2 and 0.13.0: the newer over the older.

    vLLM's default turned async scheduling on between the two (PR #27614), so equal figures say
    the harness passed ``--async-scheduling`` to both (docs/accuracy.md, session 7).
    """
    d = pd.read_csv(data / "inferencemax" / "inferencemax_agg_bmk.csv")
    d = d[d.hw.isin(["h100", "h200"]) & (d.framework == "vllm") & d.model.isin(IMAX_MODELS)]
    d = d.assign(version=d.image.str.extract(r"v(\d+\.\d+\.\d+)", expand=False))
    keys = ["hw", "isl", "osl", "conc", "tp"]
    g = d.groupby(keys + ["version"])[["mean_tpot", "median_ttft", "mean_ttft"]].median().unstack("version").dropna()
    lines = [f"vLLM 0.13.0 over 0.11.2 on InferenceMAX's gpt-oss grid ({len(g)} points run on both):"]
    for metric in ("mean_tpot", "median_ttft", "mean_ttft"):
        r = g[(metric, "0.13.0")] / g[(metric, "0.11.2")]
        lines.append(f"  {metric}: median {r.median():.3f} (quartiles {r.quantile(0.25):.3f}-{r.quantile(0.75):.3f})")
    return "\n".join(lines)


def imax_diagnosis(rows: list[Row]) -> str:
    """Per InferenceMAX group (imax_layout_table's): the measured mean TTFT over the median (a few very
    long TTFTs lift the mean), apmw's TTFT against the measured *median*, and the measured median TTFT
    less apmw's, in measured TPOTs, below and from concurrency 16 (where InferenceMAX's SGLang scripts
    on B200 raise ``--scheduler-recv-interval`` from 10 to 30); docs/accuracy.md, "Where the model is weak"."""
    groups: dict[str, list[Row]] = {}
    for r in rows:
        if r.source == "InferenceMAX" and r.predicted and not _is_disagg(r):
            groups.setdefault(_imax_group(r), []).append(r)
    lines = ["| group | n | measured mean / median TTFT | points with mean > 3 x median | "
             "TTFT vs measured median: abs % (signed) | "
             "(median TTFT - apmw's) / TPOT, concurrency < 16 | >= 16 |", "|---|---|---|---|---|---|---|"]

    def med(v: list[float]) -> str:
        return f"{statistics.median(v):.1f} (n={len(v)})" if v else "-"

    for name in sorted(groups):
        g = groups[name]
        ratio = statistics.median(r.measured["ttft_s"] / r.measured["median_ttft_s"] for r in g)
        e = [100 * (r.predicted["ttft_s"] / r.measured["median_ttft_s"] - 1) for r in g]
        gap = [((r.measured["median_ttft_s"] - r.predicted["ttft_s"]) / r.measured["tpot_s"], r.concurrency) for r in g]
        long = sum(r.measured["ttft_s"] > 3 * r.measured["median_ttft_s"] for r in g)
        lines.append(f"| {name} | {len(g)} | {ratio:.2f} | {long} | {statistics.median(abs(x) for x in e):.1f} "
                     f"({statistics.median(e):+.1f}) | {med([x for x, c in gap if c < 16])} | "
                     f"{med([x for x, c in gap if c >= 16])} |")
    return "\n".join(lines)


def _by_group_key(r: Row) -> str:
    name = f"{r.source.split()[0]} {r.model.split('/')[-1]} {r.gpu} {r.engine} {r.scenario}"
    return name.replace("meta-llama--Llama-2-70b-chat-hf.json", "Llama-2-70b")


def compare_with(other: Path, data: Path, rows: list[Row]) -> str:
    """The groups of docs/accuracy.md's by-group table as the accuracy script of checkout ``other``
    predicts them and as this one does (its rows predicted before layouts were modelled), both on
    this checkout's apmw: each source's overall median |error| %, and how many group cells differ."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("accuracy_other", other / "bench" / "accuracy.py")
    mod = importlib.util.module_from_spec(spec)
    saved = list(sys.path)
    sys.modules[spec.name] = mod
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path[:] = saved
    every_before = (mod.mlperf_rows(data, 1.0) + mod.imax_rows(data) + mod.published_rows() + mod.silicon_rows())
    for r in every_before:
        mod.predict_row(r)
    # the rows predicted before layouts were modelled, on both sides (a checkout that predicts layouts
    # marks the others legacy=False)
    before = [r for r in every_before if getattr(r, "legacy", True)]
    after = [r for r in rows if r.legacy]
    metrics = ("tpot_s", "ttft_s", "output_tokens_per_s_per_gpu")
    lines = ["| rows | before: TPOT | after: TPOT | before: TTFT | after: TTFT | before: tok/s/GPU | "
             "after: tok/s/GPU |", "|---|---|---|---|---|---|---|"]
    for source in ("MLPerf", "InferenceMAX", "Published", "aiconfigurator", "all"):
        b = [r for r in before if r.predicted and (source == "all" or r.source.startswith(source))]
        a = [r for r in after if r.predicted and (source == "all" or r.source.startswith(source))]
        cells = [summary(x, m) for m in metrics for x in (b, a)]
        lines.append(f"| {source} | " + " | ".join(cells) + " |")
    groups_b: dict[str, list] = {}
    groups_a: dict[str, list] = {}
    for rs, out in ((before, groups_b), (after, groups_a)):
        for r in rs:
            if r.predicted:
                out.setdefault(_by_group_key(r), []).append(r)
    differ = [k for k in sorted(set(groups_b) | set(groups_a))
              if [summary(groups_b.get(k, []), m) for m in METRICS] != [summary(groups_a.get(k, []), m) for m in METRICS]]
    lines.append(f"\nGroups of the by-group table: {len(groups_b)} before, {len(groups_a)} after; cells that differ "
                 f"in {len(differ)}" + (": " + "; ".join(differ) if differ else "") + ".")
    # every aggregated InferenceMAX point the other checkout predicts, legacy or not, matched by its label
    imax_b = {r.label: r.predicted for r in every_before if r.source == "InferenceMAX"}
    imax_a = {r.label: r.predicted for r in rows if r.source == "InferenceMAX" and not _is_disagg(r)}
    changed = [k for k in imax_b if imax_b[k] != imax_a.get(k, "missing")]
    lines.append(f"Aggregated InferenceMAX points: {len(imax_b)} before, {len(imax_a)} after; predictions that differ: "
                 f"{len(changed)}" + (" (" + "; ".join(changed[:5]) + ")" if changed else "") + ".")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description="apmw accuracy against published benchmarks")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "benchmarks")
    ap.add_argument("--plain-roofline", action="store_true",
                    help="predict every row on the plain spec-sheet roofline (no tables, no scaling)")
    ap.add_argument("--fit", action="store_true", help="refit the TensorRT-LLM overhead on the v4.1 (train) rows")
    ap.add_argument("--fit-amd", action="store_true", help="refit only AMD's GEMM launch cost per die and matrix rate "
                    "per part, on the NVIDIA figures as shipped (--fit refits them after its own)")
    ap.add_argument("--isl-scale", type=float, default=1.0, help="scale the assumed MLPerf input lengths")
    ap.add_argument("--rows", action="store_true", help="print every row's prediction")
    ap.add_argument("--write-docs", action="store_true", help="rewrite the result tables in docs/accuracy.md")
    ap.add_argument("--vllm-versions", action="store_true",
                    help="compare InferenceMAX's gpt-oss runs on vLLM 0.11.2 and 0.13.0 (docs/accuracy.md)")
    ap.add_argument("--first-wave", action="store_true",
                    help="print the published runs' measured TTFT over a whole first wave's (docs/accuracy.md)")
    ap.add_argument("--nim-scheduling", action="store_true",
                    help="median TTFT error of the NIM 8B and 70B tables under each scheduling hypothesis "
                         "(docs/accuracy.md)")
    ap.add_argument("--by-rate", action="store_true",
                    help="group the fixed-concurrency errors by the replica's measured output rate (docs/accuracy.md)")
    ap.add_argument("--mtp-pairs", action="store_true",
                    help="each predicted MTP point against its point without MTP: the TPOT ratio measured and "
                         "predicted (docs/accuracy.md, session 27)")
    ap.add_argument("--imax-diagnosis", action="store_true",
                    help="InferenceMAX groups: measured mean over median TTFT, TTFT against the median, and the "
                         "median's excess in TPOTs (docs/accuracy.md)")
    ap.add_argument("--compare-with", type=Path, default=None, metavar="DIR",
                    help="the rows predicted before layouts were modelled, by the accuracy script of another "
                         "checkout DIR (e.g. `git archive b89ae1a | tar -x -C DIR`) against this one, on this "
                         "checkout's apmw (docs/accuracy.md)")
    ap.add_argument("--write-fixture", action="store_true",
                    help="rewrite tests/fixtures/accuracy/inferencemax_gptoss_h200.csv (the regression subset)")
    ap.add_argument("--nim-requests-per-client", type=int, default=DEFAULT_REQUESTS_PER_CLIENT,
                    help="prompts per client in the NIM runs (NVIDIA's benchmarking guide: 3, the first wave "
                         "included; default: apmw's 10)")
    ap.add_argument("--nim-overhead-ms", type=float, default=None,
                    help="request overhead for the NIM runs (their concurrency-1 rows imply about 1.4 ms; "
                         "default: apmw's 25 ms)")
    ap.add_argument("--mtp-acceptance", choices=("measured", "default"), default="measured",
                    help="the MTP rows' acceptance rate: read off each row's ITL/TPOT (imax_mtp), or apmw's cited "
                         "default 0.85")
    args = ap.parse_args()
    global PLAIN_ROOFLINE, IMAX_DISAGG, MTP_ACCEPTANCE
    IMAX_DISAGG = imax_disaggregated(args.data)
    MTP_ACCEPTANCE = args.mtp_acceptance
    PLAIN_ROOFLINE = args.plain_roofline
    if args.nim_overhead_ms is not None and args.nim_overhead_ms < 0:
        ap.error(f"--nim-overhead-ms must not be negative (got {args.nim_overhead_ms:g})")
    if args.nim_requests_per_client < 1:
        ap.error(f"--nim-requests-per-client must be at least 1 (got {args.nim_requests_per_client})")
    rows = (mlperf_rows(args.data, args.isl_scale) + imax_rows(args.data) + imax_disagg_rows(args.data)
            + published_rows() + silicon_rows())
    # NVIDIA's guide sends 3 x concurrency requests per level, the first simultaneous wave
    # included; whether the published runs did is not stated (bench/data/SOURCES.md), so
    # apmw's defaults hold unless asked
    for r in filter(is_nim, rows):
        r.requests_per_client = args.nim_requests_per_client
        if args.nim_overhead_ms is not None:
            r.request_overhead_s = args.nim_overhead_ms / 1e3
    if args.fit:
        isl = fit_isl(rows, LLAMA2_70B)
        for r in rows:
            if r.model == LLAMA2_70B:
                r.isl = round(isl * args.isl_scale)
        assumed = cal.ENGINE_OVERHEAD_S_PER_LAYER["trtllm"]
        fit_overhead(rows, "trtllm")
        cal.ENGINE_OVERHEAD_S_PER_LAYER["trtllm"] = assumed   # not identified (fit_overhead): keep the default
        fit_overhead(rows, "vllm")                            # identified on the InferenceMAX h100 rows
        fit_moe_ceiling(rows)
        fit_blackwell_moe_share(rows)
        fit_own_kernels_overhead(rows)
    if args.fit or args.fit_amd:
        fit_amd_launch(rows)
        fit_amd_flops(rows)
    t = time.perf_counter()
    for r in rows:
        predict_row(r)
    per_row_ms = (time.perf_counter() - t) / len(rows) * 1e3
    if args.rows:
        for r in rows:
            if r.predicted:
                cells = "  ".join(f"{m[:4]} {r.predicted[m]:.4g}/{r.measured[m]:.4g}" for m in METRICS
                                  if m in r.measured and m in r.predicted)
                print(f"{r.split:8} {r.path:10} {r.label:58} {cells}")
    print(report(rows, args.isl_scale))
    if args.first_wave:
        print(first_wave_ratios(rows))
    if args.vllm_versions:
        print(vllm_version_ratios(args.data))
    if args.by_rate:
        print(by_output_rate(rows))
    if args.nim_scheduling:
        from nim_scheduling import table     # bench/nim_scheduling.py (this script's folder is on sys.path)
        print(table())
    if args.imax_diagnosis:
        print(imax_diagnosis(rows))
        print(imax_disagg_diagnosis(rows))
    if args.mtp_pairs:
        print(mtp_pairs(rows))
    if args.compare_with:
        print(compare_with(args.compare_with, args.data, rows))
    if args.write_docs:
        write_docs(rows)
    if args.write_fixture:
        write_fixture(rows)
    print(f"\n{per_row_ms:.1f} ms per row prediction (including model load)")


if __name__ == "__main__":
    main()
