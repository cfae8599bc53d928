"""Communication times read off measured tables: collectives and MoE dispatch/combine.

The tables are aiconfigurator-core 0.12.0's measurements (Apache-2.0), bundled compactly by
``scripts/build_comm_tables.py`` in ``catalog/data/comm/<system>.npz``; ``SOURCES.md`` there
names every source file. Systems are aiconfigurator's keys (``h100_sxm``, ``gb200``, ...;
:data:`MEASURED_SYSTEMS`); :data:`GPU_SYSTEMS` maps the catalogue's GPU names to them.

Use::

    comm = measured_collectives("h200_sxm")          # None: no tables, use the bandwidth formula
    t = comm.all_reduce_s(8, message_bytes)          # NCCL
    t = comm.all_reduce_s(8, message_bytes, engine="vllm")   # vLLM's custom all-reduce
    t = comm.moe_dispatch_combine_s("low_latency", ep=8, tokens_per_rank=128,
                                    hidden=7168, top_k=8, num_experts=256)

Every method returns seconds as a float ndarray shaped like its array argument, or None when
the table does not cover the request (the caller then falls back to its bandwidth formula).

Units and what the sizes mean (SI throughout: bytes, seconds):

* ``message_bytes`` follows nccl-tests' "size" column, the buffer one rank holds:
  all-reduce: the reduced tensor; all-gather: the *gathered* output (``gpus x`` each rank's
  share); reduce-scatter: the *input* before scattering (``gpus x`` each rank's result);
  all-to-all: the whole send buffer (``1/gpus`` of it to each peer). Collectives are measured in
  fp16 (NCCL, nccl-tests out-of-place time), engine all-reduces in bf16 under CUDA graphs.
* ``tokens_per_rank`` is the tokens one EP rank dispatches (its attention-DP batch); the
  result is dispatch + combine of one MoE layer (``phase`` picks one of them).

Interpolation, for each measured curve ``(x_i, t_i)`` with ``x`` bytes or tokens:

* the curve is first made non-decreasing by its lower envelope, ``t_i <- min(t_i..t_n)``:
  a point slower than some larger message is read as that larger message's time. Latency
  outliers are one-sided (a run is slowed by interference, never sped past the hardware), and
  the tables hold isolated spikes, e.g. SGLang's 8-GPU H100 all-reduce of 1 KiB at 38 us
  between 3.3 and 3.5 us; a running maximum would carry such a spike to every larger message.
  Points already in order are unchanged (about 10 % of all points move, by a median 2 %);
* at a measured ``x_i`` the result is ``t_i`` exactly;
* between points, log-log: ``t = exp(interp(log x, log x_i, log t_i))`` (latency-bound at
  small sizes, bandwidth-bound at large ones: straight lines in log-log);
* below the smallest point, the smallest point's time (a collective never gets faster than
  its smallest measured launch);
* beyond the largest, ``t = t_n + (x - x_n) / bw`` with ``bw = (x_n - x_{n-1}) / (t_n - t_{n-1})``
  the bandwidth of the last two points (or ``x_n / t_n`` if those are equal), so more bytes
  never cost less.

GPU counts: a count that was measured is used as is; one that was not is answered by the
nearest measured count *above* it (3 GPUs by the 4-GPU curve: more ranks cost more, so this
errs high); one above every measured count returns None (8 GPUs across two GB200 trays, or
16 H100s across InfiniBand, is a different network from what was measured). One GPU
communicates nothing: 0 s. The same rule picks the EP size for MoE dispatch/combine; asked with
``fewer_ranks``, it answers with the largest EP measured at or below instead, which a caller takes as a
floor under its own estimate for an EP past the tables (DeepEP measured on one 4-GPU GB200 tray
bounds a 32-rank exchange across the NVL72 rack from below).

``all_reduce_s(..., engine=...)`` uses the engine's custom all-reduce table where it covers the
GPU count, else NCCL (TensorRT-LLM's table on GB300 reaches 16 GPUs over MNNVL, NCCL's 4).

MoE dispatch/combine modes (``MOE_MODES``):

* ``low_latency``: DeepEP low-latency mode (SGLang's wide-EP tables; fp8 dispatch, bf16 combine),
  tokens 1..1024 per rank (2048 for the older H100 multi-node rows);
* ``normal``: DeepEP normal (high-throughput) mode at 20 SMs, tokens 1..131072 per rank;
* ``trtllm_alltoall``: TensorRT-LLM's NVLink two-sided MoE all-to-all on GB200 NVL72, EP 2..64,
  payload ``dtype`` "bfloat16" (default), "fp8" or "nvfp4"; dispatch includes its prepare step.

DeepEP tables cover one node (EP 8 on HGX, EP 4 on a GB200/GB300 tray) and, on H100 only,
EP 16/32/64 over InfiniBand. They were measured for a set of model shapes ``(hidden, top_k,
num_experts)`` (DeepSeek-V3, Qwen3, Kimi-K2, Llama-4, Mixtral, ...), not a full grid. A shape
that was measured is used as is. Any other is answered by a measured shape ``g`` with the token
axis rescaled by the payload one token sends, ``P``::

    t(tokens) = t_g(tokens * P(shape) / P(g))
    P = hidden * top_k                        low_latency: one copy per routed expert
    P = hidden * ranks_reached(top_k, E, ep)  normal, trtllm_alltoall: one copy per destination rank
    ranks_reached = ep * (1 - C(E - E/ep, top_k) / C(E, top_k))   (uniform routing)

``g`` is the shape nearest in ``|log P ratio|`` (then in ``|log E ratio|``; ties to the larger); for
``low_latency`` the two distances are added, since its per-expert receive buffers make the
expert count matter as much as the payload. Left-one-out over the measured shapes this
reproduces each held-out curve within 2 % (median), 10-24 % (90th percentile) and 1.4x (worst;
8-16-expert shapes), see ``docs/communication.md``. ``source`` says which shape answered.

Each curve's ``source`` string names the file, version and the GPU count, EP or shape used, so
a printed number can be traced.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Literal

import numpy as np

_DIR = Path(__file__).resolve().parent.parent / "catalog" / "data" / "comm"

MEASURED_SYSTEMS: tuple[str, ...] = tuple(sorted(p.stem for p in _DIR.glob("*.npz")))

# Catalogue GPU name (catalog/data/gpus.csv) -> aiconfigurator system key.
GPU_SYSTEMS: dict[str, str] = {
    "A100-SXM4-80GB": "a100_sxm", "H100-SXM5-80GB": "h100_sxm", "H200-SXM-141GB": "h200_sxm",
    "B200-SXM-180GB": "b200_sxm", "B300-SXM-288GB": "b300_sxm", "GB200 (per GPU)": "gb200",
    "GB300 (per GPU)": "gb300", "L40S": "l40s",
}

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
ENGINES = ("vllm", "sglang", "trtllm")
MOE_MODES = ("low_latency", "normal", "trtllm_alltoall")
Engine = Literal["vllm", "sglang", "trtllm"]
MoEMode = Literal["low_latency", "normal", "trtllm_alltoall"]
Phase = Literal["both", "dispatch", "combine"]


def interp_loglog(x: np.ndarray | float, xs: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """The module docstring's rule on one curve: ``xs`` increasing, ``ts`` non-decreasing, > 0."""
    x = np.asarray(x, dtype=float)
    xc = np.clip(x, xs[0], xs[-1])
    t = np.exp(np.interp(np.log(xc), np.log(xs), np.log(ts)))
    i = np.clip(np.searchsorted(xs, xc), 0, len(xs) - 1)    # first point at or above
    t = np.clip(t, ts[np.maximum(i - 1, 0)], ts[i])          # exp(log(t)) may round past a neighbour
    t = np.where(xs[i] == xc, ts[i], t)                     # exact at measured points
    if len(xs) > 1:
        rise = ts[-1] - ts[-2]
        per_byte = rise / (xs[-1] - xs[-2]) if rise > 0 else ts[-1] / xs[-1]
    else:
        per_byte = ts[-1] / xs[-1]
    return np.where(x > xs[-1], ts[-1] + (x - xs[-1]) * per_byte, t)


@dataclass(frozen=True)
class Curve:
    """One measured curve: ``x`` (bytes or tokens, increasing) -> seconds, with its provenance.

    ``measured_s`` is what the table holds; ``s`` is its non-decreasing lower envelope (module docstring).
    """

    x: np.ndarray
    measured_s: np.ndarray
    source: str

    @cached_property
    def s(self) -> np.ndarray:
        return np.minimum.accumulate(self.measured_s[::-1])[::-1]

    def __call__(self, x: np.ndarray | float) -> np.ndarray:
        return interp_loglog(x, self.x, self.s)


@dataclass(frozen=True)
class MoECurves:
    """Dispatch and combine of one MoE layer for one (mode, dtype, EP, model shape)."""

    dispatch: Curve
    combine: Curve
    shape: tuple[int, int, int]  # the measured (hidden, top_k, num_experts) that answers
    token_scale: float           # tokens are multiplied by this before the lookup (1 for a measured shape)
    source: str
    ep: int                      # the measured EP size that answers

    def __call__(self, tokens_per_rank: np.ndarray | float, phase: Phase = "both") -> np.ndarray:
        x = np.asarray(tokens_per_rank, dtype=float) * self.token_scale
        if phase == "dispatch":
            return self.dispatch(x)
        if phase == "combine":
            return self.combine(x)
        if phase == "both":
            return self.dispatch(x) + self.combine(x)
        raise ValueError(f"phase must be 'both', 'dispatch' or 'combine', not {phase!r}")


def ranks_reached(top_k: int, num_experts: int, ep: int) -> float:
    """Expected number of EP ranks a token's ``top_k`` distinct experts land on (uniform routing,
    ``num_experts / ep`` experts per rank): ``ep * (1 - C(E - E/ep, k) / C(E, k))``."""
    top_k = min(top_k, num_experts)
    if num_experts <= ep:
        return float(top_k)
    per_rank = num_experts / ep
    miss = 1.0
    for i in range(top_k):
        miss *= max(num_experts - per_rank - i, 0.0) / (num_experts - i)
    return ep * (1.0 - miss)


def moe_payload(mode: str, shape: tuple[int, int, int], ep: int) -> float:
    """Elements one token sends in a dispatch: per routed expert (low-latency), per rank (others)."""
    hidden, top_k, num_experts = shape
    if mode == "low_latency":
        return float(hidden * top_k)
    return hidden * ranks_reached(top_k, num_experts, ep)


def nearest_shape(mode: str, shapes: list[tuple[int, int, int]], asked: tuple[int, int, int],
                  ep: int) -> tuple[int, int, int]:
    """The measured shape that stands in for ``asked`` (module docstring); ties go to the larger."""
    p, experts = moe_payload(mode, asked, ep), asked[2]

    def d_payload(s: tuple[int, int, int]) -> float:
        return abs(float(np.log(moe_payload(mode, s, ep) / p)))

    def d_experts(s: tuple[int, int, int]) -> float:
        return abs(float(np.log(s[2] / experts)))

    if mode == "low_latency":   # per-expert receive buffers: the expert count matters as much as the payload
        return min(shapes, key=lambda s: (d_payload(s) + d_experts(s), -moe_payload(mode, s, ep), -s[2]))
    return min(shapes, key=lambda s: (d_payload(s), -moe_payload(mode, s, ep), d_experts(s), -s[2]))


def _at_or_above(measured: list[int], n: int) -> int | None:
    above = [m for m in sorted(measured) if m >= n]
    return above[0] if above else None


def _at_or_below(measured: list[int], n: int) -> int | None:
    below = [m for m in sorted(measured) if m <= n]
    return below[-1] if below else None


class MeasuredCollectives:
    """One system's measured communication tables (seconds); see the module docstring."""

    def __init__(self, system: str, path: Path):
        npz = np.load(path)
        meta = json.loads(str(npz["meta"]))
        self.system = system
        self.gpus_per_node: int = meta["gpus_per_node"]
        self.source: str = meta["source"]
        self.meta = meta
        c_table, c_gpus, c_bytes, c_s = (npz[k] for k in ("c_table", "c_gpus", "c_bytes", "c_s"))
        # (kind, op) -> gpus -> Curve; kind is "lib" (NCCL / oneCCL) or an engine name.
        self._coll: dict[tuple[str, str], dict[int, Curve]] = {}
        for j, t in enumerate(meta["collectives"]):
            kind, op = t["name"].split(":")
            rows = c_table == j
            curves = {}
            for g in np.unique(c_gpus[rows]):
                sel = rows & (c_gpus == g)
                order = np.argsort(c_bytes[sel])
                curves[int(g)] = Curve(c_bytes[sel][order].astype(float), c_s[sel][order],
                                       f"{t['library']} {op} on {int(g)} GPUs, {t['dtype']}: {t['origin']}")
            self._coll[(kind, op)] = curves
        # (mode, dtype) -> ep -> {(hidden, topk, experts): (tokens, dispatch_s, combine_s)}, and ep sources.
        self._moe: dict[tuple[str, str], dict[int, dict[tuple[int, int, int], tuple[np.ndarray, ...]]]] = {}
        self._moe_source: dict[tuple[str, str, int], str] = {}
        if "m_table" in npz.files:
            m = {k: npz[k] for k in ("m_table", "m_hidden", "m_topk", "m_experts", "m_tokens", "m_dispatch_s", "m_combine_s")}
            for j, t in enumerate(meta["moe"]):
                rows = m["m_table"] == j
                shapes = self._moe.setdefault((t["mode"], t["dtype"]), {}).setdefault(t["ep"], {})
                self._moe_source[(t["mode"], t["dtype"], t["ep"])] = f"{t['library']}, EP {t['ep']}: {t['origin']}"
                keys = np.stack([m["m_hidden"][rows], m["m_topk"][rows], m["m_experts"][rows]], axis=1)
                for key in np.unique(keys, axis=0):
                    sel = rows & (m["m_hidden"] == key[0]) & (m["m_topk"] == key[1]) & (m["m_experts"] == key[2])
                    order = np.argsort(m["m_tokens"][sel])
                    shapes[(int(key[0]), int(key[1]), int(key[2]))] = (
                        m["m_tokens"][sel][order].astype(float), m["m_dispatch_s"][sel][order], m["m_combine_s"][sel][order])

    # ---- collectives -------------------------------------------------------------------------

    def gpu_counts(self, op: str = "all_reduce", engine: Engine | None = None) -> tuple[int, ...]:
        """GPU counts measured for ``op`` (by the collective library, or the engine's all-reduce)."""
        return tuple(sorted(self._coll.get((engine or "lib", op), {})))

    def curve(self, op: str, gpus: int, engine: Engine | None = None) -> Curve | None:
        """The curve that answers ``op`` on ``gpus`` GPUs (engine table first, then the library), or None."""
        if op not in COLLECTIVES:
            raise ValueError(f"op must be one of {COLLECTIVES}, not {op!r}")
        if engine is not None and engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES} or None, not {engine!r}")
        if engine is not None and op != "all_reduce":
            raise ValueError("engine tables are all-reduces only")
        for kind in ((engine, "lib") if engine else ("lib",)):
            curves = self._coll.get((kind, op), {})
            g = _at_or_above(list(curves), gpus)
            if g is not None:
                return curves[g]
        return None

    def collective_s(self, op: str, gpus: int, message_bytes: np.ndarray | float,
                     engine: Engine | None = None) -> np.ndarray | None:
        """Seconds of one ``op`` over ``gpus`` GPUs; None where nothing measured covers ``gpus``."""
        if gpus <= 1:
            return np.zeros_like(np.asarray(message_bytes, dtype=float))
        c = self.curve(op, gpus, engine)
        return None if c is None else c(message_bytes)

    def all_reduce_s(self, gpus: int, message_bytes: np.ndarray | float,
                     engine: Engine | None = None) -> np.ndarray | None:
        """All-reduce of a ``message_bytes`` tensor; ``engine``'s custom all-reduce where measured, else NCCL."""
        return self.collective_s("all_reduce", gpus, message_bytes, engine)

    def all_gather_s(self, gpus: int, message_bytes: np.ndarray | float) -> np.ndarray | None:
        """All-gather whose *gathered* output is ``message_bytes`` per rank."""
        return self.collective_s("all_gather", gpus, message_bytes)

    def reduce_scatter_s(self, gpus: int, message_bytes: np.ndarray | float) -> np.ndarray | None:
        """Reduce-scatter of a ``message_bytes`` input per rank (each keeps ``1/gpus`` of it)."""
        return self.collective_s("reduce_scatter", gpus, message_bytes)

    def all_to_all_s(self, gpus: int, message_bytes: np.ndarray | float) -> np.ndarray | None:
        """All-to-all of a ``message_bytes`` send buffer per rank (``1/gpus`` of it to each peer)."""
        return self.collective_s("all_to_all", gpus, message_bytes)

    # ---- MoE dispatch / combine --------------------------------------------------------------

    def _moe_key(self, mode: str, dtype: str | None) -> tuple[str, str]:
        if mode not in MOE_MODES:
            raise ValueError(f"mode must be one of {MOE_MODES}, not {mode!r}")
        if dtype is None:
            dtype = "bfloat16" if mode == "trtllm_alltoall" else "default"
        return mode, dtype

    def moe_ep_sizes(self, mode: MoEMode, dtype: str | None = None) -> tuple[int, ...]:
        """EP sizes measured for ``mode`` (empty where the mode was not measured here)."""
        return tuple(sorted(self._moe.get(self._moe_key(mode, dtype), {})))

    def moe_shapes(self, mode: MoEMode, ep: int, dtype: str | None = None) -> tuple[tuple[int, int, int], ...]:
        """The measured model shapes ``(hidden, top_k, num_experts)`` at EP ``ep`` exactly."""
        return tuple(sorted(self._moe.get(self._moe_key(mode, dtype), {}).get(ep, {})))

    def moe_curves(self, mode: MoEMode, ep: int, hidden: int, top_k: int, num_experts: int,
                   dtype: str | None = None, fewer_ranks: bool = False) -> MoECurves | None:
        """The curves that answer one MoE layer's dispatch/combine, or None where not measured.

        ``fewer_ranks``: the largest EP measured at or below ``ep`` instead (a floor for an EP past
        every measured one: an exchange among more ranks costs no less than among fewer)."""
        key = self._moe_key(mode, dtype)
        by_ep = self._moe.get(key, {})
        e = (_at_or_below if fewer_ranks else _at_or_above)(list(by_ep), ep)
        if e is None:
            return None
        shapes = by_ep[e]
        asked = (hidden, top_k, num_experts)
        shape = asked if asked in shapes else nearest_shape(mode, list(shapes), asked, e)
        tokens, disp, comb = shapes[shape]
        scale = moe_payload(mode, asked, e) / moe_payload(mode, shape, e)
        where = f"{self._moe_source[(*key, e)]}; shape hidden {shape[0]}, top-k {shape[1]}, {shape[2]} experts"
        if shape != (hidden, top_k, num_experts):
            where += f" (asked {hidden}/{top_k}/{num_experts}: tokens x {scale:.4g})"
        return MoECurves(Curve(tokens, disp, where), Curve(tokens, comb, where), shape, scale, where, e)

    def moe_dispatch_combine_s(self, mode: MoEMode, ep: int, tokens_per_rank: np.ndarray | float, hidden: int,
                               top_k: int, num_experts: int, *, phase: Phase = "both",
                               dtype: str | None = None, fewer_ranks: bool = False) -> np.ndarray | None:
        """Seconds of one MoE layer's dispatch + combine (or one ``phase``) at ``tokens_per_rank``.

        None where ``mode`` was not measured on this system at EP ``ep`` or above (with ``fewer_ranks``,
        at ``ep`` or below: :meth:`moe_curves`).
        """
        if ep <= 1:
            self._moe_key(mode, dtype)
            return np.zeros_like(np.asarray(tokens_per_rank, dtype=float))
        c = self.moe_curves(mode, ep, hidden, top_k, num_experts, dtype, fewer_ranks)
        return None if c is None else c(tokens_per_rank, phase)


def measured_collectives(system: str) -> MeasuredCollectives | None:
    """The measured tables of ``system`` (aiconfigurator key or catalogue GPU name), or None if it has none.

    Loaded once per system (``measured_collectives.cache_clear()`` forgets them).
    """
    key = GPU_SYSTEMS.get(system, system)
    return _load(key) if key in MEASURED_SYSTEMS else None


@lru_cache(maxsize=None)
def _load(key: str) -> MeasuredCollectives:
    return MeasuredCollectives(key, _DIR / f"{key}.npz")


measured_collectives.cache_clear = _load.cache_clear  # type: ignore[attr-defined]
