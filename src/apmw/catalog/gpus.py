"""GPU catalogue: datasheet numbers for the accelerators the planner can place replicas on.

The numbers live in ``data/gpus.csv`` (one row per GPU, each row names its source; see
``data/SOURCES.md``). This module only parses that file and resolves names, so that a
spec value can be traced to a citation rather than to code.
"""

from __future__ import annotations

import csv
import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from apmw.errors import UnknownNameError

_CSV_PATH = Path(__file__).parent / "data" / "gpus.csv"

# Short names people type -> catalogue name. Keys are normalised with _norm().
_ALIASES = {
    "a100": "A100-SXM4-80GB",
    "a100sxm": "A100-SXM4-80GB",
    "a100sxm4": "A100-SXM4-80GB",
    "a10080gb": "A100-SXM4-80GB",
    "h100": "H100-SXM5-80GB",
    "h100sxm": "H100-SXM5-80GB",
    "h100sxm5": "H100-SXM5-80GB",
    "h10080gb": "H100-SXM5-80GB",
    "h10080gbhbm3": "H100-SXM5-80GB",   # nvidia-smi's name for the SXM5 part
    "h100pcie": "H100-PCIe-80GB",
    "h200": "H200-SXM-141GB",
    "h200sxm": "H200-SXM-141GB",
    "b200": "B200-SXM-180GB",
    "b200sxm": "B200-SXM-180GB",
    "b300": "B300-SXM-288GB",
    "b300sxm": "B300-SXM-288GB",
    "gb200": "GB200 (per GPU)",
    "gb200nvl72": "GB200 (per GPU)",
    "gb300": "GB300 (per GPU)",
    "gb300nvl72": "GB300 (per GPU)",
    "l40s": "L40S",
    "mi300x": "MI300X",
    "mi325x": "MI325X",
    "mi350x": "MI350X",
    "mi355x": "MI355X",
    "h20": "H20-96GB",
    "h2096gb": "H20-96GB",
    "h800": "H800-SXM5-80GB",
    "h800sxm": "H800-SXM5-80GB",
    "h800sxm5": "H800-SXM5-80GB",
    "h80080gbhbm3": "H800-SXM5-80GB",  # nvidia-smi's name, by analogy with the H100's
}

# aiconfigurator's system keys (ai-dynamo/aiconfigurator, aiconfigurator-core 0.12.0 systems/<key>.yaml)
# -> (catalogue GPU, whether that key has measured kernel tables). One table serves two
# purposes: the keys are accepted as GPU names (``get_gpu("h200_sxm")``), and
# ``aiconfigurator_system_of`` maps a GPU back to the key whose measurements describe it.
# h100_pcie is a placeholder there (a yaml, no tables); AMD parts have no key at all.
_AICONFIGURATOR_SYSTEMS = {
    "a100_sxm": ("A100-SXM4-80GB", True),
    "h100_sxm": ("H100-SXM5-80GB", True),
    "h100_pcie": ("H100-PCIe-80GB", False),
    "h200_sxm": ("H200-SXM-141GB", True),
    "b200_sxm": ("B200-SXM-180GB", True),
    "b300_sxm": ("B300-SXM-288GB", True),
    "gb200": ("GB200 (per GPU)", True),
    "gb300": ("GB300 (per GPU)", True),
    "l40s": ("L40S", True),
}

# Which tensor-core rate a weight dtype can use, best first. int4 weights cannot use FP4
# tensor cores (Hopper and Blackwell have no INT4 MMA), so int4 runs as W4A8/W4A16: it
# dequantises to fp8 or bf16 and uses that rate.
_RATE_CHAIN = {
    "bf16": ("bf16",),
    "fp16": ("bf16",),
    "fp8": ("fp8", "bf16"),
    "int8": ("int8", "bf16"),
    # 4-bit weights without native FP4 tensor cores run as W4A16: vLLM's Marlin kernels
    # (MXFP4/NVFP4 on Hopper, GPTQ/AWQ int4) dequantise to bf16 and multiply at the bf16 rate.
    "fp4": ("fp4", "bf16"),
    "int4": ("bf16",),
}


def gpu_label(name: str, overridden: Sequence[str]) -> str:
    """A GPU's name, and the catalogue figures a spec replaced where it replaced some."""
    return name if not overridden else f"{name} with {', '.join(overridden)} as given"


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator. Rates are dense (no 2:4 sparsity), per GPU.

    ``idle_power_w`` is a GPU holding a loaded model with no work (CUDA context up);
    ``busy_power_w`` is the draw to provision for when it is serving flat out.
    """

    name: str
    vendor: str
    hbm_bytes: float
    hbm_bandwidth_bytes_per_s: float
    bf16_flops: float
    fp8_flops: float | None
    fp4_flops: float | None
    int8_ops: float | None
    tdp_w: float
    idle_power_w: float
    busy_power_w: float
    scaleup_bw_bytes_per_s: float  # per direction per GPU
    source: str
    power_source: str
    overridden: tuple[str, ...] = ()    # the catalogue figures a spec replaced (hardware.gpu: {name, ...})

    @property
    def label(self) -> str:
        """The GPU as messages name it: a catalogue GPU whose figures a spec replaced says which, since its name
        alone would claim the catalogue's ("H100-SXM5-80GB with hbm_bytes as given")."""
        return gpu_label(self.name, self.overridden)

    def flops_for(self, dtype: str) -> float:
        """Best dense rate usable for weights stored as ``dtype``.

        A GPU without a native rate for the dtype falls back to the format its kernels
        dequantise to: fp8 -> bf16, and 4-bit weights -> bf16 (W4A16, see ``_RATE_CHAIN``).
        """
        chain = _RATE_CHAIN.get(dtype.lower())
        if chain is None:
            raise UnknownNameError(
                f"unknown dtype '{dtype}' for GPU '{self.name}'; use one of: "
                + ", ".join(_RATE_CHAIN)
            )
        rates = {"bf16": self.bf16_flops, "fp8": self.fp8_flops,
                 "fp4": self.fp4_flops, "int8": self.int8_ops}
        return next(rates[k] for k in chain if rates[k])


def _norm(name: str) -> str:
    """Case-, space- and punctuation-insensitive key: 'H100 SXM' == 'h100-sxm'."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _opt_float(text: str) -> float | None:
    return float(text) if text.strip() else None


def _row_to_spec(row: dict[str, str]) -> GpuSpec:
    return GpuSpec(
        name=row["gpu"],
        vendor=row["vendor"],
        hbm_bytes=float(row["hbm_capacity_bytes"]),
        hbm_bandwidth_bytes_per_s=float(row["hbm_bandwidth_bytes_per_s"]),
        bf16_flops=float(row["bf16_dense_flops"]),
        fp8_flops=_opt_float(row["fp8_dense_flops"]),
        fp4_flops=_opt_float(row["fp4_dense_flops"]),
        int8_ops=_opt_float(row["int8_dense_ops"]),
        tdp_w=float(row["tdp_watts"]),
        idle_power_w=float(row["idle_power_w"]),
        busy_power_w=float(row["busy_power_w"]),
        scaleup_bw_bytes_per_s=float(row["scaleup_bw_bytes_per_s_per_direction"]),
        source=f"{row['source']} ({row['source_ref']})",
        power_source=row["power_source"],
    )


@lru_cache(maxsize=1)
def _catalogue() -> dict[str, GpuSpec]:
    with _CSV_PATH.open(newline="") as f:
        return {row["gpu"]: _row_to_spec(row) for row in csv.DictReader(f)}


@lru_cache(maxsize=1)
def _lookup() -> dict[str, str]:
    """Normalised key -> catalogue name, for full names and aliases."""
    table = {_norm(name): name for name in _catalogue()}
    table.update(_ALIASES)
    table.update({_norm(key): gpu for key, (gpu, _) in _AICONFIGURATOR_SYSTEMS.items()})
    return table


def gpu_names() -> list[str]:
    """Catalogue names, in file order."""
    return list(_catalogue())


# Vendor words that `nvidia-smi --query-gpu=name` ("NVIDIA H200") and rocm-smi ("AMD Instinct
# MI300X") put before the model; stripped when the full string is not known.
_VENDOR_PREFIXES = ("nvidia", "amdinstinct", "amd")


def get_gpu(name: str) -> GpuSpec:
    """Look up a GPU by catalogue name, short alias ("H100", "b200"), aiconfigurator system
    key ("h200_sxm", "gb200") or the name nvidia-smi prints ("NVIDIA H100 80GB HBM3"),
    ignoring case, spaces and punctuation."""
    key = _norm(name)
    canonical = _lookup().get(key)
    for prefix in _VENDOR_PREFIXES:
        if canonical is None and key.startswith(prefix):
            canonical = _lookup().get(key.removeprefix(prefix))
    if canonical is None:
        raise UnknownNameError(_unknown_message(name))
    return _catalogue()[canonical]


def _unknown_message(name: str) -> str:
    keys = _lookup()
    close = difflib.get_close_matches(_norm(name), keys, n=6, cutoff=0.4)
    closest = list(dict.fromkeys(keys[k] for k in close))[:3]
    hint = ", ".join(closest) if closest else "none"
    return (f"unknown GPU '{name}'; closest: {hint}; known: {', '.join(gpu_names())}. "
            "Use one of the known names, a short alias such as H100, H200, B200 or an aiconfigurator system "
            "name such as h200_sxm, gb200; for a GPU not in the "
            "catalogue, describe it in the spec: hardware.gpu: {hbm_bytes, hbm_bandwidth_bytes_per_s, bf16_flops, "
            "tdp_w, idle_power_w, busy_power_w, scaleup_bw_bytes_per_s} from its datasheet (no 'name': a custom GPU)")


def aiconfigurator_system_of(gpu_name: str) -> str | None:
    """The aiconfigurator system key whose measured kernel tables describe this GPU.

    ``gpu_name`` is any spelling ``get_gpu`` accepts. None when aiconfigurator has no
    measurements of the part (AMD GPUs, H20, H800, and the H100-PCIe placeholder), so a
    caller knows to fall back to a measured relative or the plain roofline.
    """
    canonical = get_gpu(gpu_name).name
    return next((key for key, (gpu, measured) in _AICONFIGURATOR_SYSTEMS.items()
                 if gpu == canonical and measured), None)
