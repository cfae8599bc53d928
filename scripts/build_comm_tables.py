"""Build the measured communication tables shipped in ``apmw/catalog/data/comm/``.

Reads the ``comm/`` tables of aiconfigurator-core 0.12.0's kernel database
(``../shared/data/profiles/aiconfigurator/<system>/comm/...``, Apache-2.0; see that folder's
README section "profiles/aiconfigurator/") and writes one ``<system>.npz`` per system with
measured collectives, in SI units (bytes, seconds). Kept, per system:

* **Collectives** from nccl-tests (NCCL; oneCCL on Intel B60): ``all_reduce``, ``all_gather``,
  ``reduce_scatter``, ``alltoall`` for every GPU count measured, dtype ``half`` only, newest
  library version only. The tables count ``message_size`` in elements: the collector ran
  nccl-tests with ``-b bytes`` and stored ``bytes // bytes_per_element`` (2 for half), so the
  bytes kept are ``2 * message_size``, which is nccl-tests' "size" column: the all-reduce
  buffer, the *gathered* all-gather output, the *pre-scatter* reduce-scatter input, the
  whole all-to-all send buffer. Latency is nccl-tests' out-of-place time.
* **Engine custom all-reduce** (vLLM, SGLang, TensorRT-LLM): bf16 (``message_size`` counts
  bf16 elements: bytes = 2 * elements), CUDA-graph rows only for vLLM/SGLang (what decode
  runs; aiconfigurator keeps the same), newest version directory per engine whose rows name
  that engine (a few directories hold another engine's rows; those are skipped).
* **MoE dispatch + combine** (expert-parallel all-to-all, one MoE layer):
  - ``low_latency``: DeepEP low-latency mode, SGLang wide-EP tables (dispatch and combine
    mean times; the table's bandwidth columns show fp8 dispatch, bf16 combine);
  - ``normal``: DeepEP normal (high-throughput) mode, transmit + notify for dispatch and for
    combine, at 20 SMs (DeepEP's default ``Buffer.num_sms``; aiconfigurator queries 20 too);
  - ``trtllm_alltoall``: TensorRT-LLM's NVLink two-sided MoE all-to-all on GB200 NVL72
    (prepare + dispatch, and combine), per payload dtype, EP 2..64.
  ``node_num`` in the SGLang tables counts nodes of ``num_gpus_per_node`` GPUs (the system
  YAML: 8 on HGX, 4 on a GB200/GB300 compute tray), so EP = node_num * num_gpus_per_node, the
  same rule aiconfigurator applies when it queries them. For each EP the newest version that
  measured it is kept.

Nothing is smoothed here: the file stores the measured values (duplicate measurements of one
point, present in a few files, are reduced to their median). ``apmw.perf.communication``
makes each curve non-decreasing (its lower envelope) when it reads it.

Usage: ``python scripts/build_comm_tables.py [--profiles ../shared/data/profiles]`` (needs
pyarrow and PyYAML). Writes ``src/apmw/catalog/data/comm/<system>.npz`` and prints a summary.
``python scripts/build_comm_tables.py --report`` prints the coverage and number tables of
``docs/communication.md`` from the bundled files alone (no ``../shared`` needed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import yaml

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "apmw" / "catalog" / "data" / "comm"
MS, US = 1e-3, 1e-6
WHEEL = "aiconfigurator-core==0.12.0 (PyPI wheel), aiconfigurator_core/systems/data/"
LICENCE = "Apache-2.0"
# Files of the first snapshot (kept unchanged when the wheel's files were added; README).
GIT_SNAPSHOT = "ai-dynamo/aiconfigurator@095f58a51c4ca8e61b66ec108d86f223f8d559ce aic-core/src/aiconfigurator_core/systems/data/"
FROM_GIT = {"h100_sxm/comm/nccl/2.29.2/nccl_perf.parquet", "h200_sxm/comm/nccl/2.29.2/nccl_perf.parquet",
            "h100_sxm/comm/vllm/0.24.0/custom_allreduce_perf.parquet",
            "h200_sxm/comm/vllm/0.24.0/custom_allreduce_perf.parquet"}

COLLECTIVE_OPS = {"all_reduce": "all_reduce", "all_gather": "all_gather",
                  "reduce_scatter": "reduce_scatter", "alltoall": "all_to_all"}
BYTES_PER_ELEMENT = {"half": 2, "bfloat16": 2}
KEEP_DTYPE = "half"
ENGINES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TRTLLM"}   # directory -> framework column
DEEPEP_SMS = 20
TRTLLM_A2A_KERNEL = "NVLinkTwoSided"
# Files that are copies of another system's measurements under this system's name: their every
# number equals the other file's (checked below, so the reason stays true), so they are skipped.
COPIES = {
    "h200_sxm/comm/sglang/0.5.6.post2/wideep_deepep_ll_perf.parquet":
        "h100_sxm/comm/sglang/0.5.6.post2/wideep_deepep_ll_perf.parquet",
    "h200_sxm/comm/sglang/0.5.6.post2/wideep_deepep_normal_perf.parquet":
        "h100_sxm/comm/sglang/0.5.6.post2/wideep_deepep_normal_perf.parquet",
}


def version_key(v: str) -> tuple:
    """Order versions as aiconfigurator does: numeric parts, then a release above its rcs."""
    nums = [int(x) for x in re.findall(r"\d+", v.split("rc")[0].split(".post")[0])][:3]
    nums += [0] * (3 - len(nums))
    rc = re.search(r"rc(\d+)", v)
    post = re.search(r"post(\d+)", v)
    return (*nums, 0 if rc else 1, int(rc.group(1)) if rc else 0, int(post.group(1)) if post else 0)


def read(path: Path) -> dict[str, list]:
    return pq.read_table(path).to_pydict()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def provenance(base: Path, path: Path) -> dict:
    rel = path.relative_to(base).as_posix()
    return {"file": rel, "origin": (GIT_SNAPSHOT if rel in FROM_GIT else WHEEL) + rel,
            "sha256": sha256(path), "licence": LICENCE}


def median_by_key(keys: list[tuple], values: list[float]) -> tuple[list[tuple], list[float], int]:
    groups: dict[tuple, list[float]] = defaultdict(list)
    for k, v in zip(keys, values):
        groups[k].append(v)
    out_k = sorted(groups)
    dups = sum(len(v) - 1 for v in groups.values())
    return out_k, [float(np.median(groups[k])) for k in out_k], dups


def collectives(base: Path, system: str) -> tuple[list[dict], list[str]]:
    """Long-form rows of the collective library's and the engines' all-reduce tables."""
    comm = base / system / "comm"
    tables, notes = [], []
    for lib, fname in (("nccl", "nccl_perf.parquet"), ("oneccl", "oneccl_perf.parquet")):
        versions = sorted((p.parent.name for p in (comm / lib).glob(f"*/{fname}")), key=version_key)
        if not versions:
            continue
        version = versions[-1]
        path = comm / lib / version / fname
        d = read(path)
        dtype_col = "nccl_dtype"  # the oneCCL table uses the same column name
        label = {"nccl": "NCCL", "oneccl": "oneCCL"}[lib]
        for raw_op, op in COLLECTIVE_OPS.items():
            idx = [i for i in range(len(d["latency"])) if d["op_name"][i] == raw_op and d[dtype_col][i] == KEEP_DTYPE]
            if not idx:
                continue
            keys = [(int(d["num_gpus"][i]), int(d["message_size"][i]) * BYTES_PER_ELEMENT[KEEP_DTYPE]) for i in idx]
            k, v, dups = median_by_key(keys, [d["latency"][i] * MS for i in idx])
            tables.append({"name": f"lib:{op}", "rows": k, "s": v, "meta": {
                **provenance(base, path), "library": f"{label} {version}", "op": raw_op, "dtype": KEEP_DTYPE,
                "bytes_rule": "2 * message_size (elements of half)", "latency_rule": "latency [ms] * 1e-3",
                "duplicates_merged_by_median": dups, "versions_available": versions}})
        notes.append(f"{label}: kept {version} of {versions}")
    for engine, framework in ENGINES.items():
        cands = sorted((p.parent.name for p in (comm / engine).glob("*/custom_allreduce_perf.parquet")),
                       key=version_key, reverse=True)
        for version in cands:
            path = comm / engine / version / "custom_allreduce_perf.parquet"
            d = read(path)
            if set(d["framework"]) != {framework}:
                notes.append(f"{engine}: skipped {version} (its rows are {sorted(set(d['framework']))})")
                continue
            n = len(d["latency"])
            graph = [i for i in range(n) if str(d["backend"][i]).endswith("_graph")] if "backend" in d else []
            rows_kept = "CUDA-graph rows" if graph else "all rows (the table has no CUDA-graph rows)"
            graph = graph or list(range(n))
            keys = [(int(d["num_gpus"][i]), int(d["message_size"][i]) * BYTES_PER_ELEMENT["bfloat16"]) for i in graph]
            k, v, dups = median_by_key(keys, [d["latency"][i] * MS for i in graph])
            kernels = sorted(set(d["kernel_source"][i] for i in graph))
            tables.append({"name": f"{engine}:all_reduce", "rows": k, "s": v, "meta": {
                **provenance(base, path), "library": f"{framework} {version} custom all-reduce",
                "version_in_rows": sorted(set(d["version"])), "kernel_source": kernels,
                "dtype": "bfloat16", "bytes_rule": "2 * message_size (elements of bf16)",
                "latency_rule": "latency [ms] * 1e-3", "rows_kept": rows_kept,
                "duplicates_merged_by_median": dups, "versions_available": sorted(cands, key=version_key)}})
            notes.append(f"{engine}: kept custom all-reduce {version}")
            break
    return tables, notes


def moe(base: Path, system: str, gpus_per_node: int) -> tuple[list[dict], list[str]]:
    """Long-form rows of one MoE layer's dispatch and combine, per (mode, dtype, EP)."""
    comm = base / system / "comm"
    out, notes = [], []
    for mode, fname in (("low_latency", "wideep_deepep_ll_perf.parquet"), ("normal", "wideep_deepep_normal_perf.parquet")):
        taken: set[int] = set()
        for version in sorted((p.parent.name for p in (comm / "sglang").glob(f"*/{fname}")), key=version_key, reverse=True):
            path = comm / "sglang" / version / fname
            rel = path.relative_to(base).as_posix()
            if rel in COPIES:
                d, other = read(path), read(base / COPIES[rel])
                same = all(d[c] == other[c] for c in d if c != "device")
                assert same, f"{rel} no longer equals {COPIES[rel]}: review COPIES"
                notes.append(f"{mode}: skipped {rel} (every number equals {COPIES[rel]})")
                continue
            d = read(path)
            n = len(d["num_token"])
            by_ep: dict[int, list[int]] = defaultdict(list)
            for i in range(n):
                if mode == "normal" and int(d["dispatch_sms"][i]) != DEEPEP_SMS:
                    continue
                by_ep[int(d["node_num"][i]) * gpus_per_node].append(i)
            for ep, idx in sorted(by_ep.items()):
                if ep in taken:
                    continue
                taken.add(ep)
                keys = [(int(d["hidden_size"][i]), int(d["num_topk"][i]), int(d["num_experts"][i]), int(d["num_token"][i]))
                        for i in idx]
                if mode == "low_latency":
                    disp = [d["dispatch_avg_t_us"][i] * US for i in idx]
                    comb = [d["combine_avg_t_us"][i] * US for i in idx]
                else:
                    disp = [(d["dispatch_transmit_us"][i] + d["dispatch_notify_us"][i]) * US for i in idx]
                    comb = [(d["combine_transmit_us"][i] + d["combine_notify_us"][i]) * US for i in idx]
                k, dv, dups = median_by_key(keys, disp)
                _, cv, _ = median_by_key(keys, comb)
                out.append({"mode": mode, "dtype": "default", "ep": ep, "rows": k, "dispatch_s": dv, "combine_s": cv, "meta": {
                    **provenance(base, path), "library": f"DeepEP via SGLang {version} ({'low-latency' if mode == 'low_latency' else 'normal'} mode)",
                    "version_in_rows": sorted(set(d["version"])), "device": sorted(set(d["device"])),
                    "ep_rule": f"node_num {ep // gpus_per_node} x {gpus_per_node} GPUs per node",
                    "latency_rule": ("dispatch_avg_t_us, combine_avg_t_us [us] * 1e-6" if mode == "low_latency" else
                                     f"(transmit_us + notify_us) [us] * 1e-6 for dispatch and combine, dispatch_sms == {DEEPEP_SMS}"),
                    "duplicates_merged_by_median": dups}})
                notes.append(f"{mode}: EP {ep} from {rel}")
    path = comm / "trtllm" / "1.3.0rc10" / "trtllm_alltoall_perf.parquet"
    if path.exists():
        d = read(path)
        n = len(d["latency"])
        groups: dict[tuple[str, int], list[int]] = defaultdict(list)
        for i in range(n):
            if d["kernel_source"][i] == TRTLLM_A2A_KERNEL and d["distribution"][i] == "balanced":
                groups[(d["moe_dtype"][i], int(d["moe_ep_size"][i]))].append(i)
        for (dtype, ep), idx in sorted(groups.items()):
            phase: dict[str, dict] = {}
            for op in ("alltoall_prepare", "alltoall_dispatch", "alltoall_combine"):
                sel = [i for i in idx if d["op_name"][i] == op]
                keys = [(int(d["hidden_size"][i]), int(d["topk"][i]), int(d["num_experts"][i]), int(d["num_tokens"][i])) for i in sel]
                k, v, _ = median_by_key(keys, [d["latency"][i] * MS for i in sel])
                phase[op] = dict(zip(k, v))
            common = sorted(set(phase["alltoall_prepare"]) & set(phase["alltoall_dispatch"]) & set(phase["alltoall_combine"]))
            out.append({"mode": "trtllm_alltoall", "dtype": dtype, "ep": ep, "rows": common,
                        "dispatch_s": [phase["alltoall_prepare"][k] + phase["alltoall_dispatch"][k] for k in common],
                        "combine_s": [phase["alltoall_combine"][k] for k in common], "meta": {
                            **provenance(base, path), "library": f"TensorRT-LLM MoE all-to-all ({TRTLLM_A2A_KERNEL}, "
                            f"rows say TRTLLM {sorted(set(d['version']))[0]})",
                            "device": sorted(set(d["device"])), "ep_rule": "moe_ep_size",
                            "latency_rule": "dispatch = alltoall_prepare + alltoall_dispatch, combine = alltoall_combine; "
                                            "latency [ms] * 1e-3; distribution balanced",
                            "payload_dtype": dtype}})
        notes.append(f"trtllm_alltoall: {TRTLLM_A2A_KERNEL} from {path.relative_to(base).as_posix()}")
    return out, notes


def build(base: Path, system: str) -> dict | None:
    spec = yaml.safe_load((base / "systems" / f"{system}.yaml").read_text())
    gpus_per_node = int(spec["node"]["num_gpus_per_node"])
    colls, cnotes = collectives(base, system)
    moes, mnotes = moe(base, system, gpus_per_node)
    if not colls and not moes:
        return None
    arrays: dict[str, np.ndarray] = {
        "c_table": np.concatenate([np.full(len(t["rows"]), j, np.int16) for j, t in enumerate(colls)]).astype(np.int16),
        "c_gpus": np.array([g for t in colls for g, _ in t["rows"]], np.int16),
        "c_bytes": np.array([b for t in colls for _, b in t["rows"]], np.int64),
        "c_s": np.array([s for t in colls for s in t["s"]], np.float64),
    }
    if moes:
        arrays.update({
            "m_table": np.concatenate([np.full(len(m["rows"]), j, np.int16) for j, m in enumerate(moes)]),
            "m_hidden": np.array([r[0] for m in moes for r in m["rows"]], np.int32),
            "m_topk": np.array([r[1] for m in moes for r in m["rows"]], np.int16),
            "m_experts": np.array([r[2] for m in moes for r in m["rows"]], np.int16),
            "m_tokens": np.array([r[3] for m in moes for r in m["rows"]], np.int32),
            "m_dispatch_s": np.array([s for m in moes for s in m["dispatch_s"]], np.float64),
            "m_combine_s": np.array([s for m in moes for s in m["combine_s"]], np.float64),
        })
    meta = {
        "system": system, "gpus_per_node": gpus_per_node,
        "source": f"{WHEEL}{system}/comm/ ({LICENCE}); built by scripts/build_comm_tables.py",
        "collectives": [{"name": t["name"], **t["meta"]} for t in colls],
        "moe": [{"mode": m["mode"], "dtype": m["dtype"], "ep": m["ep"], **m["meta"]} for m in moes],
        "notes": cnotes + mnotes,
    }
    arrays["meta"] = np.array(json.dumps(meta, sort_keys=True))
    return {"arrays": arrays, "meta": meta}


SOURCES_HEAD = """# Sources of the bundled communication tables

Written by `scripts/build_comm_tables.py`; do not edit by hand (rerun the script).

Every `<system>.npz` here is derived from NVIDIA's aiconfigurator kernel database,
**aiconfigurator-core 0.12.0** (the PyPI wheel, `aiconfigurator_core/systems/data/<system>/comm/`),
licence **Apache-2.0** (each file's own header: SPDX-License-Identifier: Apache-2.0, Copyright (c) 2026
NVIDIA CORPORATION & AFFILIATES). Four H100/H200 files come from the first snapshot of the same data,
`ai-dynamo/aiconfigurator@095f58a51c4ca8e61b66ec108d86f223f8d559ce`, `aic-core/src/aiconfigurator_core/systems/data/`
(also Apache-2.0); the table below names which. The project keeps the raw files under
`../shared/data/profiles/aiconfigurator/` (its README, section "profiles/aiconfigurator/").

Changes made (Apache-2.0 section 4b): a subset of rows and columns is kept, units are converted to SI
(message sizes from elements to bytes, latencies from ms or us to seconds), and repeated measurements of
one point are merged by their median. Nothing is smoothed; `apmw.perf.communication` reads each curve's
non-decreasing lower envelope.

## What was kept

* **Collectives** (`lib:<op>`): nccl-tests (NCCL; oneCCL's benchmark on Intel B60) all-reduce, all-gather,
  reduce-scatter, all-to-all; dtype `half` only (int8 rows dropped); the newest library version per system.
  `message_size` counts fp16 elements (the collector stored nccl-tests' byte size // 2): bytes = 2 x
  message_size, nccl-tests' "size" (all-gather: the gathered output; reduce-scatter: the input;
  all-to-all: the whole send buffer). Latency: nccl-tests out-of-place time.
* **Engine custom all-reduce** (`vllm:`, `sglang:`, `trtllm:all_reduce`): bf16, bytes = 2 x message_size;
  CUDA-graph rows only for vLLM and SGLang (eager rows dropped; B60's vLLM table has only eager rows and
  is kept whole); the newest version directory whose rows name that engine.
* **MoE dispatch / combine**: DeepEP low-latency (`dispatch_avg_t_us`, `combine_avg_t_us`) and normal
  mode (`transmit_us + notify_us` of dispatch and of combine, at `dispatch_sms == 20` only) from SGLang's
  wide-EP tables, EP = `node_num` x the system YAML's `num_gpus_per_node` (8 on HGX, 4 on a GB200/GB300
  tray), the newest version that measured each EP; TensorRT-LLM's NVLink two-sided MoE all-to-all on
  GB200 (`NVLinkTwoSided`, balanced routing; dispatch = `alltoall_prepare + alltoall_dispatch`,
  combine = `alltoall_combine`), per payload dtype.

Not kept: older library and engine versions; int8 collectives; eager custom all-reduce rows; DeepEP normal
mode at other SM counts; TensorRT-LLM's `NVLinkOneSided` rows (no EP 64) and `alltoall_combine_low_precision`;
the `moe_a2a_perf` tables (vLLM 0.24.0 and TensorRT-LLM 1.3.0rc11 DeepEP through the engines, measured at
one node only, which the SGLang tables already cover with more shapes); the `errors_*.json` logs.
"""


def write_sources(built: dict[str, dict]) -> None:
    lines = [SOURCES_HEAD, "## Files\n", "| system | bundled as | source file | version | rows say | origin | sha256 |",
             "|---|---|---|---|---|---|---|"]
    for system, meta in built.items():
        by_file: dict[str, list[dict]] = defaultdict(list)
        for t in meta["collectives"]:
            by_file[t["file"]].append(t)
        for file, ts in by_file.items():
            t = ts[0]
            origin = "git snapshot 095f58a5" if t["origin"].startswith("ai-dynamo") else "wheel 0.12.0"
            rows_say = ", ".join(t.get("version_in_rows", [])) or "—"
            names = ", ".join(f"`{x['name']}`" for x in ts)
            lines.append(f"| {system} | {names} | `{file}` | {t['library']} | {rows_say} | {origin} | `{t['sha256'][:16]}` |")
        seen = set()
        for m in meta["moe"]:
            key = (m["file"], m["mode"])
            if key in seen:
                continue
            seen.add(key)
            eps = sorted({x["ep"] for x in meta["moe"] if (x["file"], x["mode"]) == key})
            rows_say = ", ".join(m.get("version_in_rows", [])) or "—"
            lines.append(f"| {system} | `moe:{m['mode']}` EP {'/'.join(map(str, eps))} | `{m['file']}` | {m['library']} "
                         f"| {rows_say} | wheel 0.12.0 | `{m['sha256'][:16]}` |")
    lines += ["", "## Skipped files\n"]
    for system, meta in built.items():
        lines += [f"* {system}: {n}" for n in meta["notes"] if "skipped" in n]
    lines += ["", "sha256: the first 16 hex digits of the source file's SHA-256 (the full digest is in each "
              "`.npz`'s `meta`)."]
    (OUT / "SOURCES.md").write_text("\n".join(lines) + "\n")


def _n(k: int, word: str) -> str:
    return f"{k} {word}" + ("" if k == 1 else "s")


def _us(t) -> str:
    return "—" if t is None else f"{float(t) * 1e6:,.1f}"


def _span(x: np.ndarray, unit: str) -> str:
    def one(v: float) -> str:
        if unit == "B":
            for u, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
                if v >= f:
                    return f"{v / f:g} {u}"
            return f"{v:g} B"
        return f"{v:g}"
    return f"{one(float(x.min()))} – {one(float(x.max()))}"


def report() -> None:
    """Markdown tables for docs/communication.md, from the bundled files only."""
    from apmw.perf.communication import (COLLECTIVES, ENGINES, MEASURED_SYSTEMS, MOE_MODES, Curve, measured_collectives,
                                         moe_payload, nearest_shape)

    print("### Coverage\n")
    print("| system | collectives (library, GPU counts, message bytes) | engine all-reduce (GPU counts) | MoE dispatch/combine (mode: EP) |")
    print("|---|---|---|---|")
    for system in MEASURED_SYSTEMS:
        c = measured_collectives(system)
        libs = {t["name"]: t for t in c.meta["collectives"]}
        ops = [op for op in COLLECTIVES if c.gpu_counts(op)]
        lib = libs[f"lib:{ops[0]}"]["library"] if ops else "—"
        xs = np.concatenate([c.curve(op, g).x for op in ops for g in c.gpu_counts(op)]) if ops else None
        coll = f"{lib}: {', '.join(o.replace('_', '-') for o in ops)}; GPUs {list(c.gpu_counts(ops[0]))}; {_span(xs, 'B')}" if ops else "—"
        eng = "; ".join(f"{libs[f'{e}:all_reduce']['library'].replace(' custom all-reduce', '')} {list(c.gpu_counts('all_reduce', e))}"
                        for e in ENGINES if c.gpu_counts("all_reduce", e)) or "—"
        moe = []
        for mode in MOE_MODES:
            for dtype in ([None] if mode != "trtllm_alltoall" else ["bfloat16"]):
                eps = c.moe_ep_sizes(mode, dtype)
                if eps:
                    tok = np.concatenate([c._moe[c._moe_key(mode, dtype)][e][s][0] for e in eps for s in c.moe_shapes(mode, e, dtype)])
                    moe.append(f"{mode.replace('_', '-')}: EP {'/'.join(map(str, eps))} ({_n(len(c.moe_shapes(mode, eps[0], dtype)), 'shape')} at EP {eps[0]}; tokens/rank {_span(tok, 't')})")
        print(f"| {system} | {coll} | {eng} | {'; '.join(moe) or '—'} |")

    print("\n### All-reduce, microseconds (measured points: 1 MiB and 64 MiB)\n")
    print("| system | GPUs | NCCL 1 MiB | NCCL 64 MiB | vLLM 1 MiB | vLLM 64 MiB | SGLang 1 MiB | SGLang 64 MiB | TRT-LLM 1 MiB | TRT-LLM 64 MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for system in MEASURED_SYSTEMS:
        c = measured_collectives(system)
        for g in (4, 8):
            cells = []
            for engine in (None, *ENGINES):
                counts = c.gpu_counts("all_reduce", engine)
                ok = g in counts
                cells += [_us(c.curve("all_reduce", g, engine)(b) if ok else None) for b in (2**20, 2**26)]
            print(f"| {system} | {g} | {' | '.join(cells)} |")

    print("\n### MoE dispatch + combine, microseconds per layer (hidden 7168, top-8, 256 experts: DeepSeek-V3)\n")
    print("| system | mode | EP | 1 token/rank | 128 tokens/rank | 1024 tokens/rank | 4096 tokens/rank |")
    print("|---|---|---|---|---|---|---|")
    for system in MEASURED_SYSTEMS:
        c = measured_collectives(system)
        for mode, dtype in (("low_latency", None), ("normal", None), ("trtllm_alltoall", "bfloat16"), ("trtllm_alltoall", "nvfp4")):
            for ep in c.moe_ep_sizes(mode, dtype):
                t = c.moe_dispatch_combine_s(mode, ep, np.array([1, 128, 1024, 4096]), 7168, 8, 256, dtype=dtype)
                tok_max = c.moe_curves(mode, ep, 7168, 8, 256, dtype).dispatch.x.max()
                cells = [_us(v) + ("*" if n > tok_max else "") for n, v in zip((1, 128, 1024, 4096), t)]
                label = mode.replace("_", "-") + (f" ({dtype})" if dtype else "")
                print(f"| {system} | {label} | {ep} | {' | '.join(cells)} |")
    print("\n(* beyond the largest measured tokens per rank: extrapolated at the last two points' slope)")

    print("\n### Shape substitution, left-one-out (held-out measured curve vs. its stand-in; ratio of times)\n")
    print("| system | mode | EP | shapes | median | 90th pct | worst |")
    print("|---|---|---|---|---|---|---|")
    for system in MEASURED_SYSTEMS:
        c = measured_collectives(system)
        for mode in ("low_latency", "normal"):
            for ep in c.moe_ep_sizes(mode):
                shapes = c._moe[(mode, "default")][ep]
                if len(shapes) < 3:
                    continue
                errs = []
                for s, (tok, d, cb) in shapes.items():
                    rest = {k: v for k, v in shapes.items() if k != s}
                    g = nearest_shape(mode, list(rest), s, ep)
                    t2, d2, c2 = rest[g]
                    f = moe_payload(mode, s, ep) / moe_payload(mode, g, ep)
                    pred = Curve(t2, d2, "")(tok * f) + Curve(t2, c2, "")(tok * f)
                    meas = Curve(tok, d, "").s + Curve(tok, cb, "").s
                    errs.append(np.abs(np.log(pred / meas)))
                e = np.concatenate(errs)
                print(f"| {system} | {mode.replace('_', '-')} | {ep} | {len(shapes)} | {np.exp(np.median(e)):.3f}x "
                      f"| {np.exp(np.quantile(e, 0.9)):.2f}x | {np.exp(e.max()):.2f}x |")

    print("\n### Measured points lowered to make curves non-decreasing (lower envelope)\n")
    raised = total = 0
    changes = []
    for system in MEASURED_SYSTEMS:
        c = measured_collectives(system)
        curves = [cv for d in c._coll.values() for cv in d.values()]
        curves += [Curve(tok, x, "") for by_ep in c._moe.values() for shapes in by_ep.values()
                   for tok, d, cb in shapes.values() for x in (d, cb)]
        for cv in curves:
            moved = cv.s < cv.measured_s
            raised += int(np.sum(moved))
            changes += list(cv.measured_s[moved] / cv.s[moved])
            total += len(cv.x)
    ch = np.array(changes)
    print(f"{raised} of {total} measured points ({100 * raised / total:.1f} %) are slower than a larger message and are "
          f"read as its time: by a median {100 * (np.median(ch) - 1):.1f} %, 90th percentile {100 * (np.quantile(ch, 0.9) - 1):.0f} %, "
          f"worst {ch.max():.1f}x (isolated spikes).")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profiles", type=Path, default=ROOT.parent / "shared" / "data" / "profiles")
    ap.add_argument("--report", action="store_true", help="print docs/communication.md's tables from the bundled files")
    args = ap.parse_args()
    if args.report:
        report()
        return
    base = args.profiles / "aiconfigurator"
    OUT.mkdir(parents=True, exist_ok=True)
    systems = sorted(p.parent.name for p in base.glob("*/comm") if any(p.rglob("*.parquet")))
    total = 0
    metas: dict[str, dict] = {}
    for system in systems:
        built = build(base, system)
        if built is None:
            continue
        metas[system] = built["meta"]
        path = OUT / f"{system}.npz"
        np.savez_compressed(path, **built["arrays"])
        size = path.stat().st_size
        total += size
        a, meta = built["arrays"], built["meta"]
        print(f"{system}: {size / 1024:.1f} kB, {len(a['c_s'])} collective points, "
              f"{len(a.get('m_tokens', []))} MoE points")
        for t in meta["collectives"]:
            j = [c["name"] for c in meta["collectives"]].index(t["name"])
            g = sorted(set(a["c_gpus"][a["c_table"] == j].tolist()))
            print(f"    {t['name']:<20} {t['library']:<40} gpus {g}")
        for j, m in enumerate(meta["moe"]):
            rows = a["m_table"] == j
            print(f"    moe {m['mode']:<16} {m['dtype']:<9} EP {m['ep']:<3} {rows.sum():4d} points  {m['file']}")
        for note in meta["notes"]:
            if "skipped" in note:
                print(f"    note: {note}")
    write_sources(metas)
    print(f"total {total / 1024:.1f} kB in {OUT.relative_to(ROOT)}; wrote SOURCES.md")


if __name__ == "__main__":
    main()
