"""Systems catalogue: the nodes and racks GPUs ship in, for scale-up, scale-out and all-in power.

A GPU's datasheet says nothing about the box around it. A replica of ``g`` GPUs talks over
NVLink / Infinity Fabric while it fits inside one scale-up domain (8 GPUs on an HGX board or
an AMD 8-OAM platform, 72 on a GB200/GB300 NVL72 rack) and over the NICs beyond it; and a
fleet is provisioned per node or rack, with CPUs, NICs, switches and fans on top of the
GPUs. The numbers live in ``data/systems.csv``, one row per system, each row naming its
sources and its assumptions (``docs/systems.md`` has the table). This module parses that
file and answers the questions the step model and the power model ask.

All figures are SI: bytes per second per GPU per direction, watts.
"""

from __future__ import annotations

import csv
import difflib
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from apmw.catalog.gpus import get_gpu
from apmw.errors import ConfigError, UnknownNameError

_CSV_PATH = Path(__file__).parent / "data" / "systems.csv"


@dataclass(frozen=True)
class SystemSpec:
    """One node or rack type.

    ``scaleup_domain_gpus`` GPUs share NVLink / Infinity Fabric at ``scaleup_bw_bytes_per_s``
    each (per direction); traffic leaving the domain goes over the NICs at
    ``scaleout_bw_bytes_per_s_per_gpu``. ``power_w`` is the whole system provisioned all-in
    (GPUs, CPUs, memory, NICs, switch trays, fans): the figure a data hall budgets for.
    """

    name: str
    gpu: str                              # catalogue GPU name (apmw.catalog.gpus)
    vendor: str
    gpus_per_node: int
    nodes_per_system: int
    scaleup_domain_gpus: int
    scaleup_fabric: str
    scaleup_bw_bytes_per_s: float         # per GPU, per direction
    scaleout_bw_bytes_per_s_per_gpu: float  # per GPU, per direction
    scaleout_nic: str
    power_w: float                        # all-in, whole system
    aiconfigurator_system: str | None
    topology_source: str
    power_source: str
    assumptions: str

    @property
    def gpus_per_system(self) -> int:
        """GPUs in one system: nodes x GPUs per node (72 for an NVL72 rack, 8 for HGX)."""
        return self.gpus_per_node * self.nodes_per_system


def _norm(name: str) -> str:
    """Case-, space- and punctuation-insensitive key: 'GB200 NVL72' == 'gb200_nvl72'."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _row_to_spec(row: dict[str, str]) -> SystemSpec:
    return SystemSpec(
        name=row["system"],
        gpu=row["gpu"],
        vendor=row["vendor"],
        gpus_per_node=int(row["gpus_per_node"]),
        nodes_per_system=int(row["nodes_per_system"]),
        scaleup_domain_gpus=int(row["scaleup_domain_gpus"]),
        scaleup_fabric=row["scaleup_fabric"],
        scaleup_bw_bytes_per_s=float(row["scaleup_bw_bytes_per_s_per_direction"]),
        scaleout_bw_bytes_per_s_per_gpu=float(row["scaleout_bw_bytes_per_s_per_gpu"]),
        scaleout_nic=row["scaleout_nic"],
        power_w=float(row["power_w"]),
        aiconfigurator_system=row["aiconfigurator_system"] or None,
        topology_source=row["topology_source"],
        power_source=row["power_source"],
        assumptions=row["assumptions"],
    )


def _check(spec: SystemSpec) -> SystemSpec:
    """Reject a row whose figures contradict each other, naming the row and the fix.

    The step model relies on these: a domain that is not a whole number of nodes, or a
    scale-out link faster than scale-up, would make a bigger replica communicate faster.
    """
    where = f"{_CSV_PATH.name} row '{spec.name}'"
    problems = []
    if spec.scaleup_domain_gpus % spec.gpus_per_node or spec.scaleup_domain_gpus > spec.gpus_per_system:
        problems.append(f"scaleup_domain_gpus {spec.scaleup_domain_gpus} must be a whole number of "
                        f"{spec.gpus_per_node}-GPU nodes within the system's {spec.gpus_per_system} GPUs")
    if not 0 < spec.scaleout_bw_bytes_per_s_per_gpu <= spec.scaleup_bw_bytes_per_s:
        problems.append("scaleout_bw_bytes_per_s_per_gpu must be positive and no faster than scale-up")
    if spec.power_w <= 0:
        problems.append("power_w must be positive")
    if problems:
        raise ConfigError(f"{where}: " + "; ".join(problems))
    get_gpu(spec.gpu)  # an unknown GPU name raises UnknownNameError listing the known ones
    return spec


@lru_cache(maxsize=1)
def _catalogue() -> dict[str, SystemSpec]:
    with _CSV_PATH.open(newline="") as f:
        return {row["system"]: _check(_row_to_spec(row)) for row in csv.DictReader(f)}


def system_names() -> list[str]:
    """Catalogue names, in file order."""
    return list(_catalogue())


def list_systems() -> list[SystemSpec]:
    """Every system, in file order."""
    return list(_catalogue().values())


def system_for_gpu(gpu_name: str) -> SystemSpec | None:
    """The system a GPU ships in by default (the first row with that GPU), or None.

    ``gpu_name`` is any spelling ``get_gpu`` accepts ("H200", "h200_sxm", "NVIDIA H200").
    None for a catalogue GPU sold in no catalogued system (A100, H100-PCIe, L40S): the
    caller then prices the GPU alone.
    """
    canonical = get_gpu(gpu_name).name
    return next((s for s in _catalogue().values() if s.gpu == canonical), None)


def get_system(name: str) -> SystemSpec:
    """Look up a system by name ("HGX H200", "gb200_nvl72", "DGX B200"), ignoring case and
    punctuation. DGX is read as HGX (NVIDIA's own build of the same board). A GPU name
    ("H200", "gb300") gives the system that GPU ships in.
    """
    by_key = {_norm(n): n for n in _catalogue()}
    key = _norm(name)
    key = "hgx" + key.removeprefix("dgx") if key.startswith("dgx") else key
    if key in by_key:
        return _catalogue()[by_key[key]]
    try:
        default = system_for_gpu(name)
    except UnknownNameError:
        raise UnknownNameError(_unknown_message(name, by_key)) from None
    if default is None:
        raise UnknownNameError(f"GPU '{get_gpu(name).name}' ships in no catalogued system; known systems: "
                               f"{', '.join(system_names())}; price it per GPU instead")
    return default


def _unknown_message(name: str, by_key: dict[str, str]) -> str:
    close = difflib.get_close_matches(_norm(name), by_key, n=3, cutoff=0.4)
    hint = ", ".join(by_key[k] for k in close) or "none"
    return (f"unknown system '{name}'; closest: {hint}; known: {', '.join(system_names())}. "
            "Use one of the known names, or a GPU name (H200, gb300, MI355X) for the system it ships in; "
            "`apmw model --systems` lists them with their sources")


def provisioned_power_w_per_gpu(system: SystemSpec) -> float:
    """All-in provisioned power per GPU: the system's power shared evenly over its GPUs.

    This is what a megawatt buys per GPU once CPUs, NICs, switches and fans are counted,
    so agents per MW should divide by it rather than by the GPU's TDP.
    """
    return system.power_w / system.gpus_per_system


def assumed_figures(system: SystemSpec) -> list[str]:
    """Which of a row's figures are assumptions rather than cited values ("power", "scale-out").

    Read from the row itself: its power source starts with ASSUMPTION, or its NIC is marked
    "(assumed)". Lets a table flag them without repeating the long ``assumptions`` text.
    """
    flags = []
    if "ASSUMPTION" in system.power_source:
        flags.append("power")
    if "(assumed)" in system.scaleout_nic:
        flags.append("scale-out")
    return flags


def link_kind(system: SystemSpec, gpus: int) -> str:
    """'scale-up' when a group of ``gpus`` fits in one NVLink / Infinity Fabric domain,
    'scale-out' when it must cross the NICs."""
    _check_group(system, gpus)
    return "scale-up" if gpus <= system.scaleup_domain_gpus else "scale-out"


def link_bandwidth_bytes_per_s(system: SystemSpec, gpus: int) -> float:
    """Per-GPU, per-direction bandwidth a group of ``gpus`` GPUs communicates over.

    A group inside one scale-up domain uses the scale-up fabric (a replica spanning trays of
    an NVL72 rack still talks NVLink); a bigger group is paced by its slowest hop, the
    scale-out NICs, so it gets the scale-out figure. Never increases with ``gpus``.
    """
    if link_kind(system, gpus) == "scale-up":
        return system.scaleup_bw_bytes_per_s
    return system.scaleout_bw_bytes_per_s_per_gpu


def _check_group(system: SystemSpec, gpus: int) -> None:
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        raise ConfigError(f"a GPU group on '{system.name}' needs a whole number of GPUs >= 1, got {gpus!r}")


def markdown_table() -> str:
    """The catalogue as a Markdown table (docs/systems.md is this output)."""
    head = ("| system | GPU | GPUs/node | nodes | scale-up domain | scale-up GB/s/dir | scale-out GB/s/GPU "
            "| power kW | kW/GPU | aiconfigurator | assumptions |")
    lines = [head, "|" + "---|" * 11]
    for s in list_systems():
        lines.append(
            f"| {s.name} | {s.gpu} | {s.gpus_per_node} | {s.nodes_per_system} | {s.scaleup_domain_gpus} "
            f"| {s.scaleup_bw_bytes_per_s / 1e9:g} | {s.scaleout_bw_bytes_per_s_per_gpu / 1e9:g} "
            f"| {s.power_w / 1e3:g} | {provisioned_power_w_per_gpu(s) / 1e3:.2f} "
            f"| {s.aiconfigurator_system or '-'} | {s.assumptions or 'none'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # .venv/bin/python -m apmw.catalog.systems > table for docs/systems.md
    print(markdown_table(), end="")
