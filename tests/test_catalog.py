"""GPU and model catalogue: every entry loads, names resolve, mistakes get helpful errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from apmw.catalog import get_gpu, gpu_names, load_config, model_names
from apmw.catalog.gpus import GpuSpec
from apmw.errors import ApmwError, ConfigError, UnknownNameError

DATA = Path(__file__).resolve().parents[1] / "src" / "apmw" / "catalog" / "data"


# ------------------------------------------------------------------------------ GPUs

def test_every_csv_row_loads():
    with (DATA / "gpus.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["gpu"] for r in rows] == gpu_names()
    for name in gpu_names():
        g = get_gpu(name)
        assert isinstance(g, GpuSpec) and g.name == name
        assert g.hbm_bytes > 1e10 and g.hbm_bandwidth_bytes_per_s > 1e11
        assert g.bf16_flops > 1e14 and g.scaleup_bw_bytes_per_s > 0
        assert 0 < g.idle_power_w < g.busy_power_w <= g.tdp_w
        assert g.source and g.power_source


@pytest.mark.parametrize("alias,name", [
    ("H100", "H100-SXM5-80GB"), ("h100", "H100-SXM5-80GB"), ("H100-SXM", "H100-SXM5-80GB"),
    ("h100_pcie", "H100-PCIe-80GB"), ("H200", "H200-SXM-141GB"), ("B200", "B200-SXM-180GB"),
    ("B300", "B300-SXM-288GB"), ("A100", "A100-SXM4-80GB"), ("L40S", "L40S"),
    ("mi300x", "MI300X"), ("MI325X", "MI325X"), ("GB200", "GB200 (per GPU)"),
    ("gb300", "GB300 (per GPU)"), ("h200-sxm-141gb", "H200-SXM-141GB"),
    ("h200_sxm", "H200-SXM-141GB"), ("b300_sxm", "B300-SXM-288GB"), ("a100_sxm", "A100-SXM4-80GB"),
    ("H20", "H20-96GB"), ("NVIDIA H20", "H20-96GB"), ("h800", "H800-SXM5-80GB"), ("NVIDIA H800", "H800-SXM5-80GB"),
])
def test_aliases(alias, name):
    assert get_gpu(alias).name == name


def test_unknown_gpu_suggests_closest():
    with pytest.raises(UnknownNameError) as err:
        get_gpu("H10")
    msg = str(err.value)
    assert "unknown GPU 'H10'" in msg and "closest:" in msg and "H100-SXM5-80GB" in msg
    assert "known:" in msg and isinstance(err.value, ApmwError)


def test_flops_for_falls_back_to_wider_formats():
    h100, a100, b200 = get_gpu("H100"), get_gpu("A100"), get_gpu("B200")
    assert h100.flops_for("bf16") == h100.bf16_flops
    assert h100.flops_for("fp8") == h100.fp8_flops
    assert h100.flops_for("fp4") == h100.bf16_flops      # Hopper has no FP4 tensor cores: W4A16
    assert a100.flops_for("fp8") == a100.bf16_flops      # Ampere has no FP8
    assert b200.flops_for("fp4") == b200.fp4_flops
    assert b200.flops_for("int4") == b200.bf16_flops     # int4 weights run as W4A16 (Marlin)
    with pytest.raises(UnknownNameError, match="fp6"):
        h100.flops_for("fp6")


def test_cdna4_rates_follow_the_published_sparse_fp4_peak():
    mi355x, mi350x, mi300x = get_gpu("MI355X"), get_gpu("mi350x"), get_gpu("MI300X")
    assert mi355x.fp4_flops == pytest.approx(20.1e15 / 2) and mi350x.fp4_flops == pytest.approx(18.45e15 / 2)
    assert mi355x.fp8_flops == pytest.approx(5.0e15, rel=0.01)          # AMD's "five petaflops" of FP8
    assert mi355x.bf16_flops == pytest.approx(mi355x.fp8_flops / 2)
    assert mi355x.hbm_bytes == 288 * 2**30 and mi355x.hbm_bandwidth_bytes_per_s == 8e12 and mi355x.tdp_w == 1400
    assert mi355x.flops_for("fp4") == mi355x.fp4_flops                # CDNA 4 has native MXFP4
    assert mi300x.flops_for("fp4") == mi300x.bf16_flops                # CDNA 3 has not: W4A16


def test_power_defaults_follow_documented_rule():
    for name in gpu_names():
        g = get_gpu(name)
        assert g.busy_power_w == g.tdp_w
        assert g.idle_power_w == pytest.approx(0.15 * g.tdp_w)
        assert "SOURCES.md#power" in g.power_source


# ---------------------------------------------------------------------------- models

@pytest.mark.parametrize("name", model_names())
def test_every_bundled_model_loads(name):
    cfg, source = load_config(name)
    assert isinstance(cfg, dict) and "model_type" in cfg
    assert ("aiconfigurator" in source or "Hugging Face page (MIT)" in source) and name in source


def test_model_name_forms():
    full = "meta-llama/Meta-Llama-3.1-70B"
    for form in [full, "meta-llama--Meta-Llama-3.1-70B", "Meta-Llama-3.1-70B",
                 "Llama-3.1-70B", "llama-3.1-70b", "META-LLAMA/META-LLAMA-3.1-70B"]:
        assert load_config(form)[1].endswith(full), form
    assert load_config("Kimi-K2")[1].endswith("moonshotai/Kimi-K2-Instruct")
    assert load_config("gpt-oss-120b")[0]["model_type"] == "gpt_oss"


@pytest.mark.parametrize("served, base", [
    ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B"),
    ("nvidia/Llama-3.1-8B-Instruct-FP8", "meta-llama/Meta-Llama-3.1-8B"),
    ("RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8-dynamic", "meta-llama/Meta-Llama-3.1-70B"),
    ("Qwen/Qwen3-32B-FP8", "Qwen/Qwen3-32B"),
    ("meta-llama/Llama-3.3-70B-Instruct", "meta-llama/Meta-Llama-3.1-70B"),
])
def test_the_checkpoint_a_user_serves_reads_its_base_config_and_says_so(served, base):
    cfg, source = load_config(served)
    assert cfg == load_config(base)[0]
    assert source.startswith(load_config(base)[1]) and f"read for '{served}'" in source


@pytest.mark.parametrize("name", ["meta-llama/Llama-3.2-3B-Instruct", "nvidia/Llama-3.1-Nemotron-70B-Instruct-HF",
                                  "Qwen/Qwen3-14B-FP8", "Llama-3.1-8B-Instruct-v2",
                                  # paths are files or directories, never hub ids to guess from
                                  "./Llama-3.1-8B-Instruct", "/models/Llama-3.3-70B-Instruct",
                                  "ckpt/meta-llama/Llama-3.1-8B-Instruct", "~/Llama-3.1-8B-Instruct"])
def test_other_models_are_not_guessed(name):
    with pytest.raises(UnknownNameError):
        load_config(name)


def test_a_checkpoint_directory_reads_its_own_config(tmp_path, monkeypatch):
    """A downloaded checkpoint named like a bundled model is read from disk, not from the bundle."""
    from apmw.arch import load_architecture

    ckpt = tmp_path / "models" / "Llama-3.1-8B-Instruct"
    ckpt.mkdir(parents=True)
    cfg = dict(load_config("meta-llama/Meta-Llama-3.1-8B")[0], num_hidden_layers=16)
    (ckpt / "config.json").write_text(json.dumps(cfg))
    monkeypatch.chdir(tmp_path)
    for form in ("models/Llama-3.1-8B-Instruct", str(ckpt), "models/Llama-3.1-8B-Instruct/config.json"):
        arch = load_architecture(form)
        assert (arch.num_layers, arch.name) == (16, "Llama-3.1-8B-Instruct"), form
        assert arch.source.startswith("file "), form
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="without a config.json"):
        load_config("empty")


@pytest.mark.parametrize("name, dtype", [("nvidia/Llama-3.1-8B-Instruct-FP8", "fp8"),
                                         ("nvidia/Llama-3.3-70B-Instruct-NVFP4", "fp4"),
                                         ("RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w8a8", "int8"),
                                         ("hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4", "int4"),
                                         ("meta-llama/Llama-3.1-8B-Instruct", None), ("Qwen/Qwen3-32B", None)])
def test_the_weight_dtype_a_checkpoint_name_states(name, dtype):
    from apmw.catalog.models import checkpoint_weight_dtype

    assert checkpoint_weight_dtype(name) == dtype


def test_unknown_model_suggests_closest():
    with pytest.raises(UnknownNameError) as err:
        load_config("Llama-3.1-7B")
    msg = str(err.value)
    assert "closest:" in msg and "meta-llama/Meta-Llama-3.1-70B" in msg


def test_config_from_path(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", "hidden_size": 8}')
    cfg, source = load_config(str(path))
    assert cfg["hidden_size"] == 8 and str(path) in source


def test_bad_json_names_file_line_and_column(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{\n  "hidden_size": 4096,\n  "num_layers": ,\n}\n')
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    msg = str(err.value)
    assert str(path) in msg and "line 3" in msg and "column 17" in msg


def test_json_that_is_not_an_object(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="expected an object"):
        load_config(str(path))


def test_sources_file_names_every_bundled_config():
    sources = (DATA / "SOURCES.md").read_text()
    for path in sorted((DATA / "models").glob("*.json")):
        assert path.name in sources, path.name
    assert "gpus.csv" in sources and "Apache-2.0" in sources


@pytest.mark.parametrize("gpu,words", [
    ("MI355X", "Held out, against its InferenceMAX runs of DeepSeek-R1 and gpt-oss-120b on AMD's ATOM engine, the "
               "time per output token comes out +2% (median of 65; bench/accuracy.py)"),
    ("MI350X", "no measured run on this part has been checked"),
    ("H200", None),
])
def test_step_times_least_checked_say_so(gpu, words):
    import subprocess

    from tests.e2e.test_cli import APMW

    r = subprocess.run([APMW, "predict", "--model", "meta-llama/Meta-Llama-3.1-8B", "--gpu", gpu, "--isl", "100",
                        "--osl", "10", "--concurrency", "4", "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    notes = " ".join(r.stderr.split())
    assert (words in notes) if words else "plain roofline" not in notes
