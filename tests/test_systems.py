"""Systems catalogue: rows agree with the GPU catalogue and with themselves, links and power behave."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from apmw.catalog.gpus import aiconfigurator_system_of, get_gpu
from apmw.catalog.systems import (
    SystemSpec,
    assumed_figures,
    get_system,
    link_bandwidth_bytes_per_s,
    link_kind,
    list_systems,
    markdown_table,
    provisioned_power_w_per_gpu,
    system_for_gpu,
    system_names,
)
from apmw.errors import ApmwError, ConfigError, UnknownNameError

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "src" / "apmw" / "catalog" / "data"


def _rows(name: str) -> list[dict[str, str]]:
    with (DATA / name).open(newline="") as f:
        return list(csv.DictReader(f))


def test_every_row_loads_and_names_a_catalogue_gpu():
    assert [r["system"] for r in _rows("systems.csv")] == system_names()
    for s in list_systems():
        assert isinstance(s, SystemSpec)
        assert get_gpu(s.gpu).name == s.gpu
        assert s.topology_source and s.power_source


def test_gpus_per_system_is_nodes_times_gpus_per_node():
    for s in list_systems():
        assert s.gpus_per_system == s.gpus_per_node * s.nodes_per_system
    assert get_system("GB200 NVL72").gpus_per_system == 72 == 18 * 4
    assert get_system("HGX H100").gpus_per_system == 8


@pytest.mark.parametrize("name,domain", [
    ("GB200 NVL72", 72), ("GB300 NVL72", 72), ("HGX H100", 8), ("HGX H200", 8), ("HGX B200", 8),
    ("HGX B300", 8), ("HGX H20", 8), ("HGX H800", 8), ("MI355X platform", 8),
])
def test_scaleup_domain(name, domain):
    assert get_system(name).scaleup_domain_gpus == domain


def test_link_bandwidth_switches_to_scale_out_beyond_the_domain():
    hgx, nvl = get_system("HGX H200"), get_system("GB200 NVL72")
    assert link_bandwidth_bytes_per_s(hgx, 8) == 450e9 and link_kind(hgx, 8) == "scale-up"
    assert link_bandwidth_bytes_per_s(hgx, 16) == 50e9 and link_kind(hgx, 16) == "scale-out"
    # an NVL72 replica spanning several 4-GPU trays still talks NVLink
    assert link_bandwidth_bytes_per_s(nvl, 16) == 900e9 and link_kind(nvl, 72) == "scale-up"
    assert link_bandwidth_bytes_per_s(nvl, 144) == nvl.scaleout_bw_bytes_per_s_per_gpu


def test_link_bandwidth_never_grows_with_the_group():
    for s in list_systems():
        bws = [link_bandwidth_bytes_per_s(s, g) for g in range(1, 2 * s.gpus_per_system + 9)]
        assert all(a >= b for a, b in zip(bws, bws[1:])), s.name
        assert bws[-1] < bws[0], s.name  # beyond the domain it really is the slower link


@pytest.mark.parametrize("bad", [0, -8, 2.5, True])
def test_link_bandwidth_rejects_a_bad_group(bad):
    with pytest.raises(ConfigError, match="whole number of GPUs"):
        link_bandwidth_bytes_per_s(get_system("HGX H100"), bad)


def test_provisioned_power_per_gpu_covers_the_gpu_and_more():
    for s in list_systems():
        per_gpu = provisioned_power_w_per_gpu(s)
        assert per_gpu == pytest.approx(s.power_w / s.gpus_per_system)
        assert per_gpu > get_gpu(s.gpu).tdp_w, s.name  # all-in adds CPUs, NICs, switches, fans
    assert provisioned_power_w_per_gpu(get_system("DGX H100")) == pytest.approx(10200 / 8)


def test_assumed_figures_say_so():
    for row in _rows("systems.csv"):
        if "ASSUMPTION" in row["power_source"]:
            assert "power" in row["assumptions"], row["system"]


@pytest.mark.parametrize("gpu,system", [
    ("H100", "HGX H100"), ("h200_sxm", "HGX H200"), ("NVIDIA B200", "HGX B200"), ("b300_sxm", "HGX B300"),
    ("gb200", "GB200 NVL72"), ("GB300", "GB300 NVL72"), ("H20", "HGX H20"), ("h800", "HGX H800"),
    ("MI300X", "MI300X platform"), ("mi355x", "MI355X platform"),
])
def test_system_for_gpu(gpu, system):
    assert system_for_gpu(gpu).name == system
    assert get_system(gpu).name == system   # a GPU name gives the system it ships in


def test_gpu_without_a_system():
    assert system_for_gpu("A100") is None and system_for_gpu("L40S") is None
    with pytest.raises(UnknownNameError, match="ships in no catalogued system"):
        get_system("A100")


@pytest.mark.parametrize("spelling,name", [
    ("hgx h200", "HGX H200"), ("DGX H200", "HGX H200"), ("dgx-b200", "HGX B200"),
    ("gb300_nvl72", "GB300 NVL72"), ("MI355X Platform", "MI355X platform"),
])
def test_system_spellings(spelling, name):
    assert get_system(spelling).name == name


def test_unknown_system_names_the_known_ones():
    with pytest.raises(UnknownNameError) as err:
        get_system("NVL36")
    msg = str(err.value)
    assert isinstance(err.value, ApmwError)
    assert "unknown system 'NVL36'" in msg and "closest:" in msg
    assert all(n in msg for n in system_names())


@pytest.mark.parametrize("key,gpu", [
    ("h100_sxm", "H100-SXM5-80GB"), ("h200_sxm", "H200-SXM-141GB"), ("b200_sxm", "B200-SXM-180GB"),
    ("b300_sxm", "B300-SXM-288GB"), ("gb200", "GB200 (per GPU)"), ("gb300", "GB300 (per GPU)"),
    ("a100_sxm", "A100-SXM4-80GB"), ("l40s", "L40S"), ("h100_pcie", "H100-PCIe-80GB"),
])
def test_aiconfigurator_names_are_gpu_aliases(key, gpu):
    assert get_gpu(key).name == gpu


def test_aiconfigurator_system_of():
    assert aiconfigurator_system_of("H200") == "h200_sxm"
    assert aiconfigurator_system_of("NVIDIA GB300") == "gb300"
    assert aiconfigurator_system_of("MI355X") is None          # no AMD measurements there
    assert aiconfigurator_system_of("H20") is None
    assert aiconfigurator_system_of("h100_pcie") is None        # a placeholder yaml without tables
    for s in list_systems():                                   # the two catalogues agree
        assert s.aiconfigurator_system == aiconfigurator_system_of(s.gpu), s.name


def test_h20_and_h800_rows_exist_and_are_cited():
    rows = {r["gpu"]: r for r in _rows("gpus.csv")}
    h20, h800 = get_gpu("H20"), get_gpu("H800")
    assert h20.hbm_bandwidth_bytes_per_s == 4.0e12 and h20.tdp_w == 400 and h20.bf16_flops == 148e12
    assert h20.fp8_flops == 296e12 and h20.scaleup_bw_bytes_per_s == 450e9
    assert h800.bf16_flops == get_gpu("H100").bf16_flops and h800.scaleup_bw_bytes_per_s == 200e9
    for name in (h20.name, h800.name):
        assert "http" in rows[name]["source_ref"] and rows[name]["source"]


def test_docs_table_is_the_generated_one():
    doc = (ROOT / "docs" / "systems.md").read_text()
    assert markdown_table() in doc, "regenerate: .venv/bin/python -m apmw.catalog.systems"


def test_assumed_figures_flag_the_assumed_rows():
    assert assumed_figures(get_system("GB300 NVL72")) == []
    assert assumed_figures(get_system("HGX H800")) == ["power"]
    assert assumed_figures(get_system("MI355X platform")) == ["power", "scale-out"]


def test_cli_model_systems_json_and_table():
    from typer.testing import CliRunner

    from apmw.cli import _register_verbs, app

    _register_verbs()
    runner = CliRunner()
    r = runner.invoke(app, ["model", "--systems", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)["systems"]
    assert [row["name"] for row in rows] == system_names()
    nvl = next(row for row in rows if row["name"] == "GB300 NVL72")
    assert nvl["gpus_per_system"] == 72 and nvl["provisioned_power_w_per_gpu"] == pytest.approx(142e3 / 72)
    assert "142 kW" in nvl["power_source"]
    r = runner.invoke(app, ["model", "--systems"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "MI355X platform" in r.output and "power, scale-out" in r.output
