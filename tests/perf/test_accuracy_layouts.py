"""The InferenceMAX CSV-row -> apmw layout mapping of bench/accuracy.py (``imax_layout``, ``imax_rows``).

InferenceMAX's ``tp`` is the replica's GPU count as its launch scripts pass it (SGLang
``--tensor-parallel-size``, trtllm-serve ``--tp_size``), ``ep`` the experts' parallel size, and
``dp_attention`` gives every GPU its own attention rank (trtllm-serve ``enable_attention_dp``, SGLang
``--enable-dp-attention --dp $TP``). These literal rows pin the mapping so that it cannot change
silently (docs/accuracy.md, "InferenceMAX beyond tensor parallelism").
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

pd = pytest.importorskip("pandas")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import accuracy  # noqa: E402  (bench/accuracy.py)


@pytest.mark.parametrize("tp, ep, dp_attention, expected", [
    # plain TP (every row predicted before layouts were modelled): no layout
    (8, 1, False, (8, None, "TP-only")),
    (4, 1.0, False, (4, None, "TP-only")),
    (8, math.nan, False, (8, None, "TP-only")),
    # SGLang `--tp 8 --ep-size 8` (B200 FP4 DeepSeek-R1): attention TP8, experts EP8 unsplit
    (8, 8, False, (8, {"dp_attention": 1, "ep": 8, "moe_tp": 1}, "EP")),
    (4, 4.0, False, (4, {"dp_attention": 1, "ep": 4, "moe_tp": 1}, "EP")),
    # SGLang `--tp 8 --dp 8 --enable-dp-attention --ep 8`: apmw tp 1 x dp_attention 8, ep 8
    (8, 8, True, (1, {"dp_attention": 8, "ep": 8, "moe_tp": 1}, "DP-attention + EP")),
    # trtllm-serve `--tp_size 4 --ep_size 1` with enable_attention_dp: DP4 attention, MoE TP4
    (4, 1, True, (1, {"dp_attention": 4, "ep": 1, "moe_tp": 4}, "DP-attention")),
    (2, 2.0, True, (1, {"dp_attention": 2, "ep": 2, "moe_tp": 1}, "DP-attention + EP")),
])
def test_imax_layout_maps_the_csv_fields(tp, ep, dp_attention, expected):
    assert accuracy.imax_layout(tp, ep, dp_attention) == expected


def test_imax_layout_multiplies_out():
    """GPUs = tp x dp_attention and moe_tp x ep = tp x dp_attention (apmw.spec.Parallelism)."""
    for tp, ep, dp in [(8, 8, False), (8, 8, True), (4, 1, True), (4, 2, True), (8, 2, False)]:
        attn_tp, layout, _ = accuracy.imax_layout(tp, ep, dp)
        assert attn_tp * layout["dp_attention"] == tp
        assert layout["moe_tp"] * layout["ep"] == tp


def test_imax_layout_refuses_an_ep_that_does_not_divide_the_gpus():
    with pytest.raises(accuracy.ApmwError):
        accuracy.imax_layout(8, 3, False)


COLUMNS = ["hw", "model", "framework", "precision", "spec_decoding", "disagg", "isl", "osl", "conc", "tp", "ep",
           "dp_attention", "mean_ttft", "median_ttft", "mean_tpot", "output_tput_per_gpu"]
LITERAL_ROWS = [
    # two runs of one setting: merged into one point by their median
    ["b200", "nvidia/DeepSeek-R1-0528-FP4-V2", "sglang", "fp4", "none", False, 1024, 1024, 64, 8, 8, False,
     0.5, 0.4, 0.02, 500.0],
    ["b200", "nvidia/DeepSeek-R1-0528-FP4-V2", "sglang", "fp4", "none", False, 1024, 1024, 64, 8, 8, False,
     0.7, 0.6, 0.03, 600.0],
    ["b200-trt", "openai/gpt-oss-120b", "trt", "fp4", "none", False, 1024, 1024, 256, 4, 4, True,
     0.3, 0.2, 0.01, 2000.0],
    ["h200", "openai/gpt-oss-120b", "vllm", "fp4", "none", False, 1024, 1024, 16, 2, 1, False,
     0.1, 0.1, 0.005, 900.0],
    ["mi355x", "openai/gpt-oss-120b", "atom", "fp4", "none", False, 1024, 1024, 16, 1, 1, False,
     0.1, 0.1, 0.005, 900.0],
    ["gb200", "deepseek-ai/DeepSeek-R1", "dynamo-sglang", "fp8", "none", True, 1024, 1024, 16, None, None, None,
     0.1, 0.1, 0.005, 900.0],
]


@pytest.fixture()
def imax_csv(tmp_path: Path) -> Path:
    (tmp_path / "inferencemax").mkdir()
    pd.DataFrame(LITERAL_ROWS, columns=COLUMNS).to_csv(tmp_path / "inferencemax" / "inferencemax_agg_bmk.csv",
                                                      index=False)
    return tmp_path


def test_imax_rows_carry_the_layout_and_keep_plain_tp_rows_as_before(imax_csv):
    rows = {r.label.split()[0]: r for r in accuracy.imax_rows(imax_csv)}
    assert set(rows) == {"b200", "b200-trt", "h200", "mi355x"}      # the disaggregated row is not a point
    ep = rows["b200"]
    assert (ep.tp, ep.gpus, ep.layout, ep.layout_kind) == (8, 8, {"dp_attention": 1, "ep": 8, "moe_tp": 1}, "EP")
    assert ep.csv_rows == 2 and ep.measured["tpot_s"] == pytest.approx(0.025)
    assert (ep.note, ep.engine, ep.legacy) == ("fp4/fp8", "sglang", False)
    dp = rows["b200-trt"]
    assert (dp.tp, dp.gpus, dp.layout) == (1, 4, {"dp_attention": 4, "ep": 4, "moe_tp": 1})
    assert dp.measured["replica_output_tokens_per_s"] == pytest.approx(8000.0)   # per GPU x all 4 GPUs
    plain = rows["h200"]
    assert (plain.tp, plain.layout, plain.legacy, plain.note) == (2, None, True, "fp4/bf16")
    assert plain.label == "h200 gpt-oss-120b tp2 ep1 1024/1024 c16"                # unchanged label
    atom = rows["mi355x"]
    assert (atom.engine, atom.note, atom.framework, atom.legacy) == ("sglang", "fp4/fp8", "atom", False)
    disagg = accuracy.imax_disaggregated(imax_csv)
    assert disagg.rows.sum() == 1


def test_an_ep_row_is_predicted_on_all_its_gpus(imax_csv):
    row = next(r for r in accuracy.imax_rows(imax_csv) if r.label.startswith("b200 "))
    accuracy.predict_row(row)
    assert row.predicted, row.note
    assert row.predicted["output_tokens_per_s_per_gpu"] > 0
    assert row.predicted["tpot_s"] > 0


# --- disaggregated rows (imax_disagg_workers, imax_disagg_rows) -----------------------------------------
# Each side has <side>_num_workers workers sharing num_<side>_gpu GPUs (InferenceMAX's process_result.py
# takes those from PREFILL_GPUS / DECODE_GPUS); Dynamo's SGLang rows carry placeholder tp/ep/dp_attention
# (every worker is DEP over its GPUs); AMD's attention-DP rows give each rank's attention TP (1) as tp.
DISAGG_FIELDS = ["hw", "framework", "prefill_num_workers", "prefill_tp", "prefill_ep", "prefill_dp_attention",
                 "num_prefill_gpu", "decode_num_workers", "decode_tp", "decode_ep", "decode_dp_attention",
                 "num_decode_gpu"]


def _disagg(*values, precision: str = "fp4"):
    from types import SimpleNamespace
    return SimpleNamespace(**dict(zip(DISAGG_FIELDS, values)), precision=precision)


@pytest.mark.parametrize("row, expected", [
    # GB200 Dynamo TensorRT-LLM, DeepSeek-R1 FP4 1k/1k "tep": 1 prefill worker TP4/EP4, 4 decode workers TP8/EP8
    (_disagg("gb200", "dynamo-trt", 1.0, 4.0, 4.0, False, 4.0, 4.0, 8.0, 8.0, False, 32.0),
     ((1, 4, {"dp_attention": 1, "ep": 4, "moe_tp": 1}), (4, 8, {"dp_attention": 1, "ep": 8, "moe_tp": 1}))),
    # GB200 Dynamo TensorRT-LLM gpt-oss: prefill TP1, decode TP4 (plain TP: no layout)
    (_disagg("gb200", "dynamo-trt", 1.0, 1.0, 1.0, False, 1.0, 1.0, 4.0, 1.0, False, 4.0),
     ((1, 1, None), (1, 4, None))),
    # GB200 Dynamo SGLang: tp/ep 1 are placeholders; 4 prefill workers on 16 GPUs are DEP4, the decode worker
    # DEP32 with the 32 redundant experts Dynamo's FP4 script gives its decode workers
    (_disagg("gb200", "dynamo-sglang", 4.0, 1.0, 1.0, True, 16.0, 1.0, 1.0, 1.0, True, 32.0),
     ((4, 1, {"dp_attention": 4, "ep": 4, "moe_tp": 1}),
      (1, 1, {"dp_attention": 32, "ep": 32, "moe_tp": 1, "redundant_experts": 32}))),
    # ... whatever the placeholder dp_attention says (8k/1k FP4 rows: prefill false); EP48 holds 256 + 32 experts
    (_disagg("gb200", "dynamo-sglang", 6.0, 1.0, 1.0, False, 24.0, 1.0, 1.0, 1.0, True, 48.0),
     ((6, 1, {"dp_attention": 4, "ep": 4, "moe_tp": 1}),
      (1, 1, {"dp_attention": 48, "ep": 48, "moe_tp": 1, "redundant_experts": 32}))),
    # Dynamo's FP8 script gives both sides 32 redundant experts
    (_disagg("gb200", "dynamo-sglang", 2.0, 1.0, 1.0, True, 16.0, 1.0, 1.0, 1.0, True, 48.0, precision="fp8"),
     ((2, 1, {"dp_attention": 8, "ep": 8, "moe_tp": 1, "redundant_experts": 32}),
      (1, 1, {"dp_attention": 48, "ep": 48, "moe_tp": 1, "redundant_experts": 32}))),
    # MI355X sglang-disagg: tp 1 with ep 8 and DP attention on an 8-GPU worker is DP8 attention, EP8
    (_disagg("mi355x-amd_0", "sglang-disagg", 1.0, 1.0, 8.0, True, 8.0, 2.0, 1.0, 8.0, True, 16.0),
     ((1, 1, {"dp_attention": 8, "ep": 8, "moe_tp": 1}), (2, 1, {"dp_attention": 8, "ep": 8, "moe_tp": 1}))),
    (_disagg("mi355x-amd_0", "sglang-disagg", 1.0, 8.0, 8.0, False, 8.0, 2.0, 8.0, 8.0, False, 16.0),
     ((1, 8, {"dp_attention": 1, "ep": 8, "moe_tp": 1}), (2, 8, {"dp_attention": 1, "ep": 8, "moe_tp": 1}))),
])
def test_imax_disagg_workers_map_the_csv_fields(row, expected):
    pre, dec, _ = accuracy.imax_disagg_workers(row)
    assert ((pre.count, pre.tp, pre.layout), (dec.count, dec.tp, dec.layout)) == expected


@pytest.mark.parametrize("row, reason", [
    # a 16-GPU MI355X decode worker spans two 8-GPU nodes: its all-to-all crosses the NICs apmw only assumes
    (_disagg("mi355x-amd_0", "sglang-disagg", 1.0, 1.0, 8.0, True, 8.0, 1.0, 1.0, 16.0, True, 16.0), "spans 2"),
    # GPUs that do not split evenly into workers, and a tp that contradicts the worker's GPU count
    (_disagg("gb200", "dynamo-trt", 3.0, 4.0, 4.0, False, 8.0, 1.0, 8.0, 8.0, False, 8.0), "do not split"),
    (_disagg("gb200", "dynamo-trt", 1.0, 4.0, 4.0, False, 8.0, 1.0, 8.0, 8.0, False, 8.0), "does not match"),
])
def test_imax_disagg_workers_refuse_what_apmw_cannot_express(row, reason):
    with pytest.raises(accuracy.ApmwError, match=reason):
        accuracy.imax_disagg_workers(row)


DISAGG_COLUMNS = ["hw", "model", "framework", "precision", "spec_decoding", "disagg", "isl", "osl", "conc",
                  "mean_ttft", "median_ttft", "mean_tpot", "mean_itl", "mean_e2el", "output_tput_per_gpu",
                  "tput_per_gpu", *DISAGG_FIELDS[2:]]
DISAGG_ROWS = [
    # two runs of one setting merged by their median; output_tput_per_gpu is over the 32 decode GPUs
    ["gb200", "/mnt/lustre01/models/deepseek-r1-0528-fp4-v2", "dynamo-trt", "fp4", "none", True, 1024, 1024, 64,
     0.3, 0.2, 0.010, 0.2, 10.0, 180.0, 100.0, 1, 4, 4, False, 4, 4, 8, 8, False, 32],
    ["gb200", "/mnt/lustre01/models/deepseek-r1-0528-fp4-v2", "dynamo-trt", "fp4", "none", True, 1024, 1024, 64,
     0.5, 0.2, 0.012, 0.24, 12.0, 200.0, 110.0, 1, 4, 4, False, 4, 4, 8, 8, False, 32],
    # MTP on Dynamo: its draft length and acceptance are not recorded: counted, skipped
    ["gb200", "/mnt/lustre01/models/deepseek-r1-0528-fp4-v2", "dynamo-trt", "fp4", "mtp", True, 1024, 1024, 64,
     0.3, 0.2, 0.010, 0.45, 10.0, 180.0, 100.0, 1, 4, 4, False, 4, 4, 8, 8, False, 32],
    ["gb200", "deepseek-ai/DeepSeek-R1", "dynamo-sglang", "fp8", "none", True, 8192, 1024, 512,
     3.0, 2.0, 0.020, 0.020, 25.0, 300.0, 500.0, 5, 1, 1, True, 40, 1, 1, 1, True, 32],
    # MTP on AMD's SGLang: one draft token, its acceptance read off ITL / TPOT (SGLang streams an iteration's tokens)
    ["mi355x-amd_0", "/models/DeepSeek-R1", "sglang-disagg", "fp8", "mtp", True, 1024, 1024, 32,
     1.7, 0.17, 0.0125, 0.0225, 13.4, 132.4, 176.3, 1, 8, 8, False, 8, 2, 8, 8, False, 16],
]


@pytest.fixture()
def disagg_csv(tmp_path: Path) -> Path:
    (tmp_path / "inferencemax").mkdir()
    pd.DataFrame(DISAGG_ROWS, columns=DISAGG_COLUMNS).to_csv(tmp_path / "inferencemax" / "inferencemax_agg_bmk.csv",
                                                            index=False)
    return tmp_path


def test_imax_disagg_rows_carry_workers_and_measured_figures_over_all_gpus(disagg_csv):
    rows = {r.label: r for r in accuracy.imax_disagg_rows(disagg_csv)}
    assert len(rows) == 4
    trt = rows["gb200 DeepSeek-R1 fp4 dynamo-trt 4P1w+32D4w 1024/1024 c64"]
    assert trt.csv_rows == 2 and trt.concurrency == 64 and trt.gpus == 36
    assert (trt.engine, trt.note, trt.gpu, trt.legacy) == ("trtllm", "fp4/fp8", "GB200", False)
    pre, dec = trt.disagg
    assert (pre.count, pre.tp, dec.count, dec.tp) == (1, 4, 4, 8)
    # output tokens/s per GPU over all 36 GPUs: the decode GPUs' median figure x 32 / 36
    assert trt.measured["output_tokens_per_s_per_gpu"] == pytest.approx(190.0 * 32 / 36)
    assert trt.measured["tpot_s"] == pytest.approx(0.011) and trt.measured["e2e_s"] == pytest.approx(11.0)
    assert trt.kv_link_bytes_per_s == pytest.approx(900e9)      # 36 GPUs inside one NVL72 rack: NVLink
    mtp = next(r for r in rows.values() if r.note.startswith("not modelled: speculative"))
    assert mtp.disagg is not None and mtp.csv_rows == 1 and "not recorded" in mtp.note
    amd = rows["mi355x-amd_0 DeepSeek-R1 fp8 sglang-disagg 8P1w+16D2w 1024/1024 c32 mtp"]
    assert amd.framework == "sglang-disagg + MTP" and not amd.note.startswith("not modelled")
    assert amd.speculative == {"draft": "mtp", "draft_tokens": 1, "acceptance_rate": pytest.approx(0.8)}
    sgl = rows["gb200 DeepSeek-R1 fp8 dynamo-sglang 40P5w+32D1w 8192/1024 c512"]
    assert (sgl.engine, sgl.note) == ("sglang", "fp8/bf16")     # the script passes no --kv-cache-dtype
    assert sgl.disagg[0].layout == {"dp_attention": 8, "ep": 8, "moe_tp": 1, "redundant_experts": 32}


def test_an_mtp_row_is_priced_with_its_acceptance(disagg_csv):
    row = next(r for r in accuracy.imax_disagg_rows(disagg_csv) if r.speculative)
    accuracy.predict_row(row)
    assert row.predicted, row.note
    # the decode iteration verifies 2 tokens per sequence and yields 1.8: TPOT is the iteration over 1.8
    assert row.predicted["decode_iteration_s"] == pytest.approx(1.8 * row.predicted["tpot_s"])


def test_a_disaggregated_row_is_predicted_through_apmw(disagg_csv):
    row = next(r for r in accuracy.imax_disagg_rows(disagg_csv) if "dynamo-sglang" in r.label)
    accuracy.predict_row(row)
    assert row.predicted, row.note
    assert row.predicted["tpot_s"] > 0 and row.predicted["ttft_s"] > row.predicted["prefill_service_s"]
    assert row.predicted["output_tokens_per_s_per_gpu"] > 0


def test_mtp_pairs_compare_the_speed_up_with_the_point_without_mtp():
    def row(label, speculative, measured_tpot, predicted_tpot):
        return accuracy.Row(source="InferenceMAX", split="held-out", model="m", gpu="g", engine="sglang", tp=0,
                            scenario="s", isl=1, osl=1, rate_per_replica=None, concurrency=1,
                            measured={"tpot_s": measured_tpot}, label=label, predicted={"tpot_s": predicted_tpot},
                            disagg=("P", "D"), speculative=speculative)
    rows = [row("x c32", None, 0.020, 0.010), row("x c32 mtp", {"draft": "mtp"}, 0.012, 0.0066),
            row("y c64 mtp", {"draft": "mtp"}, 0.012, 0.006)]     # no point without MTP: left out
    text = accuracy.mtp_pairs(rows)
    assert "measured 0.600  predicted 0.660  +10.0%" in text and "y c64" not in text
    assert text.endswith("1 pairs: median |error| of the ratio 10.0%, median signed +10.0%")
