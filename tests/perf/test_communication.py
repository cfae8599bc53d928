"""Measured communication tables (apmw.perf.communication): exact at measured points, monotone,
never cheaper beyond the table, None where nothing was measured, deterministic.

Everything but the last test reads only the bundled ``catalog/data/comm/*.npz``; the last one
compares them with the raw aiconfigurator parquet files when ``../shared`` is present.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from apmw.perf import communication as comm
from apmw.perf.communication import (ENGINES, GPU_SYSTEMS, MEASURED_SYSTEMS, Curve, interp_loglog,
                                     measured_collectives)

MAIN_SYSTEMS = ("h100_sxm", "h200_sxm", "b200_sxm", "b300_sxm", "gb200", "gb300")
DEEPSEEK = (7168, 8, 256)   # hidden, top-k, routed experts
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "profiles" / "aiconfigurator"


def _curves(c: comm.MeasuredCollectives):
    """Every collective curve of one system, with a label for messages."""
    for (kind, op), by_gpus in c._coll.items():
        for g, cv in by_gpus.items():
            yield f"{c.system} {kind}:{op} {g} GPUs", cv


def _moe_curves(c: comm.MeasuredCollectives):
    for (mode, dtype), by_ep in c._moe.items():
        for ep, shapes in by_ep.items():
            for shape in shapes:
                yield mode, dtype, ep, shape, c.moe_curves(mode, ep, *shape, dtype=None if dtype == "default" else dtype)


def test_the_six_measured_fleets_have_tables_and_stay_small():
    assert set(MAIN_SYSTEMS) <= set(MEASURED_SYSTEMS)
    total = sum((comm._DIR / f"{s}.npz").stat().st_size for s in MEASURED_SYSTEMS)
    assert total < 500_000
    assert (comm._DIR / "SOURCES.md").exists()
    for gpu, system in GPU_SYSTEMS.items():
        assert measured_collectives(gpu) is measured_collectives(system)


def test_a_system_without_tables_returns_none():
    for name in ("mi300x", "MI300X", "h100_pcie", "a30", "l4", "no such system"):
        assert measured_collectives(name) is None


@pytest.mark.parametrize("system", MEASURED_SYSTEMS)
def test_exact_at_measured_points(system):
    c = measured_collectives(system)
    for label, cv in _curves(c):
        assert np.array_equal(cv(cv.x), cv.s), label
        # the envelope only ever lowers a point, and leaves points already in order alone
        assert np.all(cv.s <= cv.measured_s), label
        in_order = cv.measured_s <= np.minimum.accumulate(cv.measured_s[::-1])[::-1]
        assert np.array_equal(cv(cv.x)[in_order], cv.measured_s[in_order]), label
    for mode, dtype, ep, shape, m in _moe_curves(c):
        assert m.token_scale == 1.0
        tokens = m.dispatch.x
        both = c.moe_dispatch_combine_s(mode, ep, tokens, *shape, dtype=None if dtype == "default" else dtype)
        assert np.array_equal(both, m.dispatch.s + m.combine.s), (system, mode, ep, shape)


@pytest.mark.parametrize("system", MEASURED_SYSTEMS)
def test_monotone_in_message_size_and_tokens(system):
    c = measured_collectives(system)
    sizes = np.geomspace(1, 8 * 2**30, 2000)
    for label, cv in _curves(c):
        t = cv(sizes)
        assert np.all(np.diff(t) >= 0), label
        assert np.all(t > 0), label
    tokens = np.geomspace(0.5, 4 * 131072, 800)
    for mode, dtype, ep, shape, m in _moe_curves(c):
        for phase in ("dispatch", "combine", "both"):
            assert np.all(np.diff(m(tokens, phase)) >= 0), (system, mode, dtype, ep, shape, phase)


@pytest.mark.parametrize("system", MEASURED_SYSTEMS)
def test_beyond_the_table_never_cheaper_and_below_it_the_smallest(system):
    c = measured_collectives(system)
    for label, cv in _curves(c):
        last, first = cv.x[-1], cv.x[0]
        beyond = cv(np.array([last * 1.5, last * 2, last * 16]))
        assert np.all(beyond >= cv.s[-1]), label
        assert np.all(np.diff(beyond) > 0), label           # more bytes cost more: a positive bandwidth
        # the last two points' bandwidth carries on
        per_byte = (cv.s[-1] - cv.s[-2]) / (last - cv.x[-2])
        if per_byte > 0:
            assert cv(2 * last) == pytest.approx(cv.s[-1] + last * per_byte, rel=1e-12), label
        below = cv(np.array([0.0, 1.0, first / 2]))
        assert np.all(below == cv.s[0]), label


def test_interpolation_is_log_log_between_points():
    xs, ts = np.array([1e3, 1e6]), np.array([1e-5, 1e-3])
    # log-log: a power law through both points is reproduced exactly between them
    assert interp_loglog(np.sqrt(1e3 * 1e6), xs, ts) == pytest.approx(np.sqrt(1e-5 * 1e-3), rel=1e-12)
    # flat last pair: beyond it the average bandwidth of the last point
    flat = Curve(np.array([1.0, 2.0, 4.0]), np.array([1e-6, 3e-6, 3e-6]), "")
    assert flat(8.0) == pytest.approx(3e-6 + 4.0 * 3e-6 / 4.0)


def test_units_are_bytes_and_seconds():
    h200 = measured_collectives("h200_sxm")
    nccl8 = h200.curve("all_reduce", 8)
    # nccl-tests ran 512 B .. 512 MiB of fp16: 256 .. 268435456 elements, bytes = 2 * elements
    assert nccl8.x[0] == 512 and nccl8.x[-1] == 512 * 2**20
    # 64 MiB across eight H200s over NVLink: a few hundred microseconds
    assert 1e-4 < float(h200.all_reduce_s(8, 64 * 2**20)) < 1e-3
    # DeepEP low-latency, one token per rank: tens of microseconds
    assert 5e-6 < float(h200.moe_dispatch_combine_s("low_latency", 8, 1, *DEEPSEEK)) < 1e-4


def test_gpu_counts_nearest_measured_above_else_none():
    h100 = measured_collectives("h100_sxm")
    assert h100.gpu_counts("all_reduce") == (2, 4, 8)
    b = np.geomspace(1e3, 1e9, 7)
    assert np.array_equal(h100.all_gather_s(3, b), h100.all_gather_s(4, b))
    assert np.array_equal(h100.reduce_scatter_s(6, b), h100.reduce_scatter_s(8, b))
    assert h100.all_to_all_s(16, b) is None                  # two nodes over InfiniBand: not measured
    assert np.array_equal(h100.all_reduce_s(1, b), np.zeros_like(b))
    gb200 = measured_collectives("gb200")
    assert gb200.gpu_counts("all_reduce") == (2, 4)          # one GB200 tray
    assert gb200.all_reduce_s(8, b) is None
    assert gb200.all_reduce_s(72, b, engine="trtllm") is None


def test_engine_all_reduce_falls_back_to_nccl():
    gb300 = measured_collectives("gb300")
    b = np.array([4096.0, 2**20])
    assert gb300.all_reduce_s(16, b) is None                  # NCCL measured on 2 and 4 GPUs only
    mnnvl = gb300.all_reduce_s(16, b, engine="trtllm")        # TensorRT-LLM's MNNVL all-reduce: 16
    assert mnnvl is not None and "TRTLLM" in gb300.curve("all_reduce", 16, "trtllm").source
    h200 = measured_collectives("h200_sxm")
    for engine in ENGINES:
        assert h200.gpu_counts("all_reduce", engine) == (2, 4, 8)
        assert not np.array_equal(h200.all_reduce_s(8, b, engine=engine), h200.all_reduce_s(8, b))
    b60 = measured_collectives("b60")                           # oneCCL on 2 and 4; vLLM's own on 8
    assert b60.all_reduce_s(8, b) is None and b60.all_reduce_s(8, b, engine="vllm") is not None
    assert np.array_equal(b60.all_reduce_s(4, b, engine="sglang"), b60.all_reduce_s(4, b))  # no SGLang table
    with pytest.raises(ValueError):
        h200.all_reduce_s(8, b, engine="tensorrt")
    with pytest.raises(ValueError):
        h200.collective_s("all_gather", 8, b, engine="vllm")
    with pytest.raises(ValueError):
        h200.collective_s("broadcast", 8, b)


@pytest.mark.parametrize("system", MAIN_SYSTEMS)
def test_deepep_low_latency_and_normal_both_measured(system):
    c = measured_collectives(system)
    node_ep = 4 if system.startswith("gb") else 8
    for mode in ("low_latency", "normal"):
        assert node_ep in c.moe_ep_sizes(mode), mode
        assert DEEPSEEK in c.moe_shapes(mode, node_ep)
        assert "DeepEP" in c.moe_curves(mode, node_ep, *DEEPSEEK).source
    tokens = np.array([1.0, 128.0, 1024.0])
    ll = c.moe_dispatch_combine_s("low_latency", node_ep, tokens, *DEEPSEEK)
    normal = c.moe_dispatch_combine_s("normal", node_ep, tokens, *DEEPSEEK)
    assert ll.shape == normal.shape == (3,)
    assert ll[0] < normal[0]                                 # low-latency mode is the faster one at decode sizes
    parts = [c.moe_dispatch_combine_s("low_latency", node_ep, tokens, *DEEPSEEK, phase=p) for p in ("dispatch", "combine")]
    assert np.allclose(parts[0] + parts[1], ll, rtol=1e-12)
    assert c.moe_dispatch_combine_s("low_latency", 1, tokens, *DEEPSEEK).tolist() == [0.0, 0.0, 0.0]


def test_ep_sizes_nearest_measured_above_else_none():
    h100 = measured_collectives("h100_sxm")
    assert h100.moe_ep_sizes("low_latency") == (8, 16, 32, 64)      # 16..64: the older multi-node H100 rows
    assert h100.moe_ep_sizes("normal") == (8, 16, 32, 64)
    t = np.array([1.0, 64.0, 256.0])
    assert np.array_equal(h100.moe_dispatch_combine_s("low_latency", 12, t, *DEEPSEEK),
                          h100.moe_dispatch_combine_s("low_latency", 16, t, *DEEPSEEK))
    assert h100.moe_dispatch_combine_s("low_latency", 128, t, *DEEPSEEK) is None
    h200 = measured_collectives("h200_sxm")                          # its multi-node file is H100's numbers: skipped
    assert h200.moe_ep_sizes("low_latency") == (8,)
    gb200 = measured_collectives("gb200")
    assert gb200.moe_dispatch_combine_s("low_latency", 8, t, *DEEPSEEK) is None   # DeepEP: one tray only
    assert gb200.moe_ep_sizes("trtllm_alltoall") == (2, 4, 8, 16, 32, 64)
    for dtype in ("bfloat16", "fp8", "nvfp4"):
        assert gb200.moe_dispatch_combine_s("trtllm_alltoall", 64, t, *DEEPSEEK, dtype=dtype) is not None
    assert gb200.moe_dispatch_combine_s("trtllm_alltoall", 72, t, *DEEPSEEK) is None
    assert measured_collectives("h100_sxm").moe_ep_sizes("trtllm_alltoall") == ()
    assert measured_collectives("l40s").moe_dispatch_combine_s("normal", 8, t, *DEEPSEEK) is None
    with pytest.raises(ValueError):
        h100.moe_dispatch_combine_s("deepep", 8, t, *DEEPSEEK)
    with pytest.raises(ValueError):
        h100.moe_dispatch_combine_s("low_latency", 8, t, *DEEPSEEK, phase="prepare")


def test_an_unmeasured_model_shape_uses_a_measured_one_rescaled_by_payload():
    h200 = measured_collectives("h200_sxm")
    gpt_oss = (2880, 4, 128)                                    # not measured
    for mode in ("low_latency", "normal"):
        assert gpt_oss not in h200.moe_shapes(mode, 8)
        m = h200.moe_curves(mode, 8, *gpt_oss)
        assert m.token_scale != 1.0 and "asked 2880/4/128" in m.source
        assert m.shape in h200.moe_shapes(mode, 8)
        g = h200.moe_curves(mode, 8, *m.shape)
        t = np.array([3.0, 50.0, 700.0])
        assert np.allclose(m(t), g(t * m.token_scale), rtol=1e-12)
    # low-latency pays per routed copy: twice the top-k, the payload of twice the tokens
    assert comm.moe_payload("low_latency", (4096, 8, 128), 8) == 2 * comm.moe_payload("low_latency", (4096, 4, 128), 8)
    # normal pays per destination rank: never more ranks than the EP size or the top-k
    for k in (1, 2, 4, 8, 22):
        r = comm.ranks_reached(k, 256, 8)
        assert min(k, 1) <= r <= min(k, 8)
    assert comm.ranks_reached(2, 8, 8) == 2.0


def test_vectorised_and_deterministic():
    c = measured_collectives("b200_sxm")
    b = np.geomspace(100, 4e9, 12).reshape(3, 4)
    t1 = c.all_to_all_s(8, b)
    assert t1.shape == (3, 4)
    assert np.array_equal(t1.ravel(), np.array([float(c.all_to_all_s(8, x)) for x in b.ravel()]))
    tok = np.arange(1, 13, dtype=float).reshape(3, 4) * 50
    m1 = c.moe_dispatch_combine_s("normal", 8, tok, 5000, 6, 160)
    assert m1.shape == (3, 4)
    measured_collectives.cache_clear()
    fresh = measured_collectives("b200_sxm")
    assert fresh is not c
    assert np.array_equal(fresh.all_to_all_s(8, b), t1)
    assert np.array_equal(fresh.moe_dispatch_combine_s("normal", 8, tok, 5000, 6, 160), m1)


@pytest.mark.parametrize("system", MAIN_SYSTEMS)
def test_every_curve_says_where_it_came_from(system):
    c = measured_collectives(system)
    assert "aiconfigurator" in c.source
    for label, cv in _curves(c):
        assert ".parquet" in cv.source and " GPUs" in cv.source, label
        assert any(lib in cv.source for lib in ("NCCL 2.", "vLLM ", "SGLang ", "TRTLLM ")), label
    for mode, dtype, ep, shape, m in _moe_curves(c):
        assert f"EP {ep}" in m.source and ".parquet" in m.source


@pytest.mark.skipif(not SHARED.exists(), reason="needs ../shared/data/profiles/aiconfigurator (the raw tables)")
def test_bundled_tables_equal_the_raw_parquet():
    pq = pytest.importorskip("pyarrow.parquet")
    for system in MAIN_SYSTEMS:
        c = measured_collectives(system)
        for t in c.meta["collectives"]:
            kind, op = t["name"].split(":")
            d = pq.read_table(SHARED / t["file"]).to_pydict()
            rows = range(len(d["latency"]))
            if kind == "lib":
                rows = [i for i in rows if d["op_name"][i] == t["op"] and d["nccl_dtype"][i] == "half"]
            else:
                rows = [i for i in rows if d.get("backend", ["x_graph"] * len(d["latency"]))[i].endswith("_graph")]
            for i in rows:
                cv = c._coll[(kind, op)][d["num_gpus"][i]]
                j = int(np.searchsorted(cv.x, 2 * d["message_size"][i]))
                assert cv.x[j] == 2 * d["message_size"][i]
                assert cv.measured_s[j] == pytest.approx(d["latency"][i] * 1e-3, rel=1e-12), (system, t["name"])
        ll = [m for m in c.meta["moe"] if m["mode"] == "low_latency"][0]
        d = pq.read_table(SHARED / ll["file"]).to_pydict()
        m = c.moe_curves("low_latency", ll["ep"], *DEEPSEEK)
        for i in range(len(d["num_token"])):
            if (d["hidden_size"][i], d["num_topk"][i], d["num_experts"][i]) == DEEPSEEK:
                j = int(np.searchsorted(m.dispatch.x, d["num_token"][i]))
                assert m.dispatch.measured_s[j] == pytest.approx(d["dispatch_avg_t_us"][i] * 1e-6, rel=1e-12)
                assert m.combine.measured_s[j] == pytest.approx(d["combine_avg_t_us"][i] * 1e-6, rel=1e-12)
