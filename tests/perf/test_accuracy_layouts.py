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
