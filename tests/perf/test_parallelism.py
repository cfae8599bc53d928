"""Parallel layouts of one replica: GPU arithmetic, weight placement, KV per rank, batch limits per DP
rank, communication and its monotonicity (apmw.perf.parallelism, apmw.perf.step)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from apmw.arch import load_architecture
from apmw.capacity import plan
from apmw.catalog.gpus import get_gpu
from apmw.errors import ApmwError
from apmw.perf.parallelism import Layout, expert_imbalance
from apmw.perf.replica import replica_from_spec
from apmw.perf.roofline import RooflineStepModel
from apmw.perf.step import IterationLoad
from apmw.spec import SpecError, spec_from_dict
from tests.conftest import small_spec_dict

V3 = "deepseek-ai/DeepSeek-V3"


def _spec(parallelism: dict | None, gpus: int | None = None, engine: str = "vllm", gpu: str = "H200",
          model: str = V3, **serving) -> dict:
    d = small_spec_dict()
    d["model"] = {"config": model, "weight_dtype": "fp8", "kv_dtype": "fp8"}
    d["hardware"] = {"gpu": gpu} | ({"gpus_per_replica": gpus} if gpus else {})
    d["serving"] = {"engine": engine, **serving} | ({"parallelism": parallelism} if parallelism else {})
    return d


def _replica(*args, **kwargs):
    return replica_from_spec(spec_from_dict(_spec(*args, **kwargs)))


def _routed_params(a) -> float:
    """All layers' routed experts, from the published totals: total - active + top-k experts' share."""
    per_expert = (a.params - a.active_params) / (a.num_experts - a.experts_per_token)
    return a.num_experts * per_expert


def test_a_layout_that_does_not_multiply_out_is_refused_with_the_arithmetic():
    with pytest.raises(SpecError, match=r"tp 2 x pp 1 x dp_attention 8 = 16 GPUs, but hardware.gpus_per_replica is 8"):
        spec_from_dict(_spec({"tp": 2, "dp_attention": 8}, gpus=8))
    with pytest.raises(SpecError, match=r"moe_tp 2 x ep 8 = 16, but the MoE layers run on tp 1 x dp_attention 8 = 8"):
        spec_from_dict(_spec({"dp_attention": 8, "ep": 8, "moe_tp": 2}))
    with pytest.raises(SpecError, match=r"ep 3 does not divide the MoE layers' tp 1 x dp_attention 8 = 8 GPUs"):
        spec_from_dict(_spec({"dp_attention": 8, "ep": 3}))


def test_attention_data_parallel_said_twice_is_refused_and_a_dumped_spec_reloads():
    with pytest.raises(SpecError, match=r"both given; say it once"):
        spec_from_dict(_spec({"dp_attention": 8, "ep": 8}, attention_data_parallel=True))
    # a spec's dump carries attention_data_parallel's default (false) beside its layout, and reloads as it was
    s = spec_from_dict(_spec({"dp_attention": 8, "ep": 8}))
    assert spec_from_dict(s.model_dump(mode="json", by_alias=True, exclude_none=True)) == s


def test_an_unset_gpu_count_or_tp_is_what_the_layout_leaves():
    s = spec_from_dict(_spec({"dp_attention": 4, "ep": 8, "tp": 2}))
    assert s.hardware.gpus_per_replica == 8 and s.serving.parallelism.moe_tp == 1
    s = spec_from_dict(_spec({"pp": 2}, gpus=16))
    assert s.serving.parallelism.tp == 8 and s.serving.parallelism.moe_tp == 8


def test_the_model_and_engine_limits_are_refused_with_the_reason():
    with pytest.raises(ApmwError, match="ep 16 does not divide .* 256 routed experts \\+ 8 redundant = 264"):
        _replica({"dp_attention": 16, "ep": 16, "redundant_experts": 8})
    with pytest.raises(ApmwError, match="no routed experts, so ep"):
        _replica({"dp_attention": 2, "ep": 2}, model="meta-llama/Meta-Llama-3.1-70B")
    with pytest.raises(ApmwError, match="tp 3 does not divide"):
        _replica({"tp": 3}, model="meta-llama/Meta-Llama-3.1-70B")
    with pytest.raises(SpecError, match="serving.parallelism: not modelled with engine llamacpp"):
        spec_from_dict(_spec({"tp": 1}, engine="llamacpp", max_batch=4))


def test_expert_parallel_weights_are_placed_per_rank_by_hand():
    """DP8 x EP8 under vLLM: attention and dense weights on every rank, routed experts split 8 ways,
    redundant experts adding their share."""
    a = load_architecture(V3)
    routed = _routed_params(a)
    everything_else = a.weight_bytes("fp8") - routed * 1.0       # fp8 experts: one byte a weight
    for redundant in (0, 32):
        r = _replica({"dp_attention": 8, "ep": 8, "redundant_experts": redundant})
        held = 8 * everything_else + routed * 1.0 * (256 + redundant) / 256
        assert r.step.held_weight_bytes == pytest.approx(held, rel=1e-9)
        assert r.memory.weight_bytes == pytest.approx(held, rel=1e-9)
    # plain tensor parallelism holds the checkpoint once
    assert _replica(None, gpus=8).step.held_weight_bytes == pytest.approx(a.weight_bytes("fp8"), rel=1e-12)
    # SGLang runs the dense weights tensor parallel over all ranks: only attention is copied per rank
    s = _replica({"dp_attention": 8, "ep": 8}, engine="sglang")
    attn = a.attention_bytes("fp8")                              # one byte a weight: fp8 attention
    assert attn == a.attention_params
    assert s.step.held_weight_bytes == pytest.approx(8 * attn + a.weight_bytes("fp8") - attn, rel=1e-9)


def test_mla_kv_per_rank_under_dp_attention_and_tp():
    """The MLA latent is copied on every GPU of a tp group, once per DP rank: tp x dp = 2 x 4 keeps two
    copies, and the pool in tokens is the GPUs' free memory over two copies."""
    r = _replica({"tp": 2, "dp_attention": 4, "ep": 8})
    assert r.step.kv_replication == 2
    assert r.kv_capacity_bytes == pytest.approx(r.memory.kv_capacity_bytes / 2)
    gqa = _replica({"tp": 8}, model="meta-llama/Meta-Llama-3.1-70B")   # 8 KV heads: one per GPU
    assert gqa.step.kv_replication == 1
    assert _replica({"tp": 4, "dp_attention": 2}, model="meta-llama/Meta-Llama-3.1-70B").step.kv_replication == 1


def test_batch_limit_and_token_budget_per_dp_rank():
    """vLLM's max_num_seqs and max_num_batched_tokens are per DP rank (an engine core each); SGLang
    divides its totals among its DP workers."""
    v = _replica({"dp_attention": 8, "ep": 8}, max_batch=64, max_batched_tokens=4096)
    assert (v.policy.max_batch, v.policy.token_budget) == (8 * 64, 8 * 4096)
    s = _replica({"dp_attention": 8, "ep": 8}, engine="sglang", max_batch=64, max_batched_tokens=4096)
    assert (s.policy.max_batch, s.policy.token_budget) == (64, 4096)
    t = _replica({"tp": 4, "pp": 2})
    assert t.policy.max_batch == _replica(None, gpus=8).policy.max_batch


def test_sglang_sizes_its_running_requests_per_dp_worker_from_its_kv_pool():
    """Left unset, SGLang's max_running_requests is its own per DP worker: clamp(tokens / context x 512, 2048, 4096),
    at most tokens // 2 (ModelRunner.resolve_max_num_reqs), each worker's pool its share of the replica's; a value
    the spec sets is the server's total, as before. DeepSeek-V3 (163,840 context) on eight H200s, by hand."""
    from apmw.perf.serving_policy import sglang_running_requests

    assert sglang_running_requests(100_000, 163_840) == 2048           # 312 by the ratio: the floor
    assert sglang_running_requests(1_000_000, 163_840) == 3125         # 1e6 / 163,840 x 512
    assert sglang_running_requests(10_000_000, 163_840) == 4096        # the ceiling
    assert sglang_running_requests(3_000, 163_840) == 1500             # a pool of 3,000 tokens: half of it
    assert sglang_running_requests(100_000, None) == 2048              # no context length in the config
    assert sglang_running_requests(float("inf"), 163_840) == 4096      # no KV per token
    for par, workers in (({"dp_attention": 8, "ep": 8}, 8), ({"tp": 8}, 1)):
        r = _replica(par, engine="sglang")
        tokens = r.kv_capacity_bytes / r.step.kv_bytes_per_token / workers
        per_worker = min(max(int(tokens / 163_840 * 512), 2048), 4096)
        assert r.policy.max_batch == workers * min(per_worker, int(tokens) // 2)
        assert r.policy.max_batch > 2048 or workers == 1
    assert _replica({"dp_attention": 8, "ep": 8}, engine="sglang", max_batch=2048).policy.max_batch == 2048
    assert _replica({"dp_attention": 8, "ep": 8}).policy.max_batch == 8 * 1024          # vLLM: fixed per rank


def _decode(step, batch, ctx=4000):
    return IterationLoad(decode_seqs=batch, prefill_tokens=0.0, kv_read_bytes=batch * ctx * step.kv_bytes_per_token,
                         attention_flops=batch * float(step.arch.attention_flops_per_token(ctx)))


def test_a_tensor_layout_reproduces_the_plain_replica():
    a, gpu = load_architecture(V3), get_gpu("H200")
    plain = RooflineStepModel(arch=a, gpu=gpu, gpus=8, weight_dtype="fp8", kv_dtype="fp8")
    laid = RooflineStepModel(arch=a, gpu=gpu, gpus=8, weight_dtype="fp8", kv_dtype="fp8", layout=Layout.tensor(8))
    b = np.array([1.0, 16, 256])
    np.testing.assert_array_equal(plain.iteration_time_s(_decode(plain, b)), laid.iteration_time_s(_decode(laid, b)))
    # every GPU of plain TP reads an eighth of the weights every token reads (attention, shared experts and
    # dense MLPs at one byte, lm_head, norms and routers at two; not the input embedding) and of the experts touched
    c = plain._rates
    touched = c.num_experts * (1 - c.expert_miss ** b) * c.expert_params * 1.0
    always = a.attention_params + a.dense_ffn_params + 2.0 * (a.active_unquantized_params)
    assert plain.weight_read_bytes_per_gpu(b) == pytest.approx((always + touched) / 8, rel=1e-12)


def _ep_step(gpu, gpus=16, **kw):
    a = load_architecture(V3)
    lay = Layout(tp=1, dp=gpus, moe_tp=1, ep=gpus, dense_tp=1, **kw)
    return RooflineStepModel(arch=a, gpu=gpu, gpus=gpus, weight_dtype="fp8", kv_dtype="fp8", layout=lay)


def test_more_scale_up_bandwidth_is_never_slower():
    from dataclasses import replace
    h200 = get_gpu("H200")
    b = np.array([8.0, 64, 512, 4096])
    # a GPU off the catalogue, so the link formula prices every bandwidth (no measured table applies)
    times = [_ep_step(replace(h200, name="custom", scaleup_bw_bytes_per_s=bw), gpus=8).iteration_time_s(
        _decode(_ep_step(h200, gpus=8), b)) for bw in (100e9, 450e9, 900e9)]
    assert np.all(np.diff(np.array(times), axis=0) <= 0)
    assert np.any(times[0] > times[-1])


def test_a_group_past_the_scale_up_domain_pays_the_scale_out_network():
    """16 H200s (two HGX nodes) exchange their all-to-alls over 50 GB/s NICs; 16 GB300s in one NVL72
    rack over NVLink. The same layout on the larger domain communicates faster where the exchange moves
    bytes. At a few tokens per rank both are latency-bound and priced at least at their own system's
    DeepEP exchange among fewer ranks (GB300's 4-GPU tray 34 us a layer, H200's 8-GPU node 24 us): there
    the H200 pair over NICs is under-priced, a known limit (H100s measured over InfiniBand at EP 16 take
    48 us), so that point is not asserted."""
    h200, gb300 = get_gpu("H200"), get_gpu("GB300")
    b = np.array([64.0, 1024, 8192])
    inside = _ep_step(h200, gpus=8).comm_time_s(b)
    across = _ep_step(h200, gpus=16).comm_time_s(b)
    assert np.all(across > inside)
    rack = _ep_step(gb300, gpus=16).comm_time_s(b[1:])
    assert np.all(rack < across[1:])


def test_a_larger_nvlink_domain_never_gives_fewer_agents_for_the_same_gpus():
    """The same GPU figures in a GB200 NVL72 rack (domain 72) and on HGX B200 boards (domain 8)."""
    results = {}
    for gpu in ("GB200", "B200"):
        d = small_spec_dict()
        d["model"] = {"config": V3, "weight_dtype": "fp8", "kv_dtype": "fp8"}
        d["hardware"] = {"gpu": {"name": gpu, "hbm_bytes": 180e9, "hbm_bandwidth_bytes_per_s": 7.7e12,
                                 "bf16_flops": 2.25e15, "fp8_flops": 4.5e15, "scaleup_bw_bytes_per_s": 900e9}}
        d["serving"] = {"parallelism": {"dp_attention": 16, "ep": 16}}
        d["slo"] = {"task_latency_p95_s": 200}
        results[gpu] = plan(spec_from_dict(d)).to_dict()["agents_per_replica"]
    assert results["GB200"] >= results["B200"] > 0


def test_expert_imbalance_floor_and_given_figure():
    lay = Layout(tp=1, dp=8, moe_tp=1, ep=8, dense_tp=1)
    n = np.array([8.0, 800, 80_000])
    f = expert_imbalance(lay, n)
    assert np.all(f >= 1) and np.all(np.diff(f) < 0)        # more tokens, closer to balanced
    assert f[-1] == pytest.approx(1 + np.sqrt(2 * np.log(8)) * np.sqrt(80_000 / 8 * 7 / 8) / (80_000 / 8))
    assert np.all(expert_imbalance(Layout(tp=1, dp=8, moe_tp=1, ep=8, dense_tp=1, expert_imbalance=1.3), n) == 1.3)
    assert np.all(expert_imbalance(Layout.tensor(8), n) == 1)


def test_pipeline_stages_reread_weights_per_micro_batch():
    """At batch 1 a TP4 x PP2 replica reads each GPU's weights once per cycle (the whole model over 4
    GPUs), twice what TP8 reads per GPU: pipeline parallelism costs weight bandwidth at small batches."""
    a, gpu = load_architecture("meta-llama/Meta-Llama-3.1-70B"), get_gpu("H100")
    tp8 = RooflineStepModel(arch=a, gpu=gpu, gpus=8, weight_dtype="fp8", kv_dtype="fp8")
    pp = RooflineStepModel(arch=a, gpu=gpu, gpus=8, weight_dtype="fp8", kv_dtype="fp8",
                           layout=Layout(tp=4, pp=2, moe_tp=4, dense_tp=4))
    assert pp.weight_read_bytes_per_gpu(1.0) == pytest.approx(2 * tp8.weight_read_bytes_per_gpu(1.0))
    assert pp.held_weight_bytes == pytest.approx(tp8.held_weight_bytes)
    assert pp.iteration_time_s(_decode(pp, 1.0)) > tp8.iteration_time_s(_decode(tp8, 1.0))


def test_a_tensor_parallel_group_past_the_measured_gpu_counts_costs_no_less_than_the_widest_measured():
    """TP16 across two HGX H200 nodes: each all-reduce costs at least NCCL's measured 8-GPU one at the same message
    (the engines' custom all-reduce stops at the node), where the link formula alone charged a 4.5 us latency
    below what NCCL measures inside the node; TP8 is measured and keeps its formula."""
    from apmw.perf.communication import measured_collectives
    a, h200 = load_architecture("deepseek-ai/DeepSeek-R1"), get_gpu("H200")
    tp8, tp16 = (RooflineStepModel(arch=a, gpu=h200, gpus=g, weight_dtype="fp8", kv_dtype="fp8", engine="sglang")
                 for g in (8, 16))
    tokens = np.array([1.0, 64.0, 4096.0])
    nccl8 = measured_collectives(h200.name).all_reduce_s(8, tokens * a.hidden_size * 2)
    assert np.all(tp16.comm_time_s(tokens) >= 2 * a.num_layers * nccl8 - 1e-15)
    assert tp16.comm_time_s(1.0) > tp8.comm_time_s(1.0)
    assert tp8.comm.all_reduce_floor_s(tokens * a.hidden_size * 2) == 0.0


def test_a_lone_prompt_crosses_the_pipeline_stages_one_after_another():
    """One 8,192-token prompt on TP1 x PP8 is computed stage after stage: its GEMMs take what one GPU's take (the
    GPUs' rates added up would make it eight times faster); with a sequence per stage the stages overlap as
    before, and PP1 is untouched."""
    a, gpu = load_architecture("meta-llama/Meta-Llama-3.1-70B"), get_gpu("H200")
    one = RooflineStepModel(arch=a, gpu=gpu, gpus=1, weight_dtype="fp8", kv_dtype="fp8")
    pp8 = RooflineStepModel(arch=a, gpu=gpu, gpus=8, weight_dtype="fp8", kv_dtype="fp8",
                            layout=Layout(tp=1, pp=8, moe_tp=1, dense_tp=1))
    prompt = IterationLoad(0.0, 8192.0, 0.0, 0.0)
    assert pp8.roofline_terms(prompt)[1] == pytest.approx(one.roofline_terms(prompt)[1], rel=1e-9)
    assert pp8.iteration_time_s(prompt) >= 0.95 * one.iteration_time_s(prompt)
    # eight decoders fill the eight stages: their work overlaps, an eighth of one GPU's each
    busy = _decode(pp8, 8.0)
    assert pp8.roofline_terms(busy)[1] == pytest.approx(one.roofline_terms(_decode(one, 8.0))[1] / 8, rel=1e-9)
    # between: two decoders and a prompt fill three of the eight
    three = IterationLoad(2.0, 512.0, 0.0, 0.0)
    assert pp8.roofline_terms(three)[1] == pytest.approx(one.roofline_terms(three)[1] * 8 / 3 / 8, rel=1e-9)


def test_pipeline_stages_under_attention_dp_count_each_ranks_own_sequences():
    """PP2 x DP8: eight decoders put one on each rank, whose two stages then work in turn; sixteen fill them."""
    a, gpu = load_architecture("deepseek-ai/DeepSeek-R1"), get_gpu("H200")
    step = RooflineStepModel(arch=a, gpu=gpu, gpus=16, weight_dtype="fp8", kv_dtype="fp8",
                             layout=Layout(tp=1, pp=2, dp=8, moe_tp=1, ep=8, dense_tp=1))
    shares = step._pipeline_idle_share(IterationLoad(np.array([1.0, 8.0, 9.0, 16.0]), 0.0, 0.0, 0.0))
    np.testing.assert_array_equal(shares, [2.0, 2.0, 1.0, 1.0])


def test_expert_parallel_exchange_reads_the_measured_deepep_tables_where_they_cover_it():
    """EP8 on one HGX H200 node: each MoE layer's dispatch + combine is DeepEP's measured time (low-latency
    mode up to 128 tokens per rank, normal above); a custom GPU falls back to the link formula."""
    from dataclasses import replace

    from apmw.perf.communication import measured_collectives
    step = _ep_step(get_gpu("H200"), gpus=8)
    a, table = step.arch, measured_collectives("H200-SXM-141GB")
    per_rank = np.array([16.0, 128.0, 4096.0])
    low = table.moe_dispatch_combine_s("low_latency", 8, per_rank[:2], a.hidden_size, a.experts_per_token,
                                       a.num_experts)
    normal = table.moe_dispatch_combine_s("normal", 8, per_rank[2:], a.hidden_size, a.experts_per_token,
                                          a.num_experts)
    np.testing.assert_allclose(step.comm_time_s(per_rank * 8), a.moe_layers * np.concatenate([low, normal]))
    custom = _ep_step(replace(get_gpu("H200"), name="custom"), gpus=8)
    assert np.all(custom.comm_time_s(per_rank * 8) != step.comm_time_s(per_rank * 8))


def _trtllm_ep(model: str, gpus: int, weight_dtype: str = "fp4", **layout):
    """A TensorRT-LLM DEP replica on GB200 as apmw builds it (its MXFP4 activations resolved), each rank's dense
    layers its own (dense_tp 1: the MoE exchange is all it communicates)."""
    from apmw.perf.replica import build_step_model
    return build_step_model(load_architecture(model), get_gpu("GB200"), gpus, weight_dtype, "fp8", engine="trtllm",
                            calibrated=False, layout=Layout(tp=1, dp=gpus, moe_tp=1, ep=gpus, dense_tp=1, **layout))


def test_tensorrt_llm_exchanges_through_its_own_measured_all_to_all_on_gb200():
    """TensorRT-LLM's MoE layers dispatch through its NVLink all-to-all, measured on GB200 NVL72 up to EP 64:
    an EP 32 layer is its measured dispatch plus its bf16 combine, exactly at measured token counts, and several
    times the link formula's 2 x 4.5 us at small batches. The dispatch carries what the experts take: NVFP4 for
    NVIDIA's NVFP4 DeepSeek-R1, MXFP8 (8 bits) for gpt-oss's MXFP4 experts under TensorRT-LLM's default W4A8,
    bf16 under W4A16, FP8 for FP8 experts."""
    from apmw.perf.communication import measured_collectives
    table = measured_collectives(get_gpu("GB200").name)
    per_rank = np.array([1.0, 16.0, 128.0, 1024.0])
    cases = [("nvidia/DeepSeek-R1-0528-FP4-v2", "fp4", {}, "nvfp4"), ("deepseek-ai/DeepSeek-R1", "fp8", {}, "fp8"),
             ("openai/gpt-oss-120b", "fp4", {}, "fp8"),
             ("openai/gpt-oss-120b", "fp4", {"mxfp4_moe_activations": "bf16"}, "bfloat16")]
    for model, wdt, kw, payload in cases:
        step = _trtllm_ep(model, 32, wdt)
        if kw:
            step = replace(step, **kw)
        a = step.arch
        shape = (a.hidden_size, a.experts_per_token, a.num_experts)
        dispatch = table.moe_dispatch_combine_s("trtllm_alltoall", 32, per_rank, *shape, phase="dispatch", dtype=payload)
        combine = table.moe_dispatch_combine_s("trtllm_alltoall", 32, per_rank, *shape, phase="combine")
        np.testing.assert_allclose(step.comm_time_s(per_rank * 32), a.moe_layers * (dispatch + combine), err_msg=model)
        assert np.all(dispatch + combine > 4 * 2 * step.efficiency.comm_latency_s)


def test_an_exchange_past_the_measured_ep_sizes_costs_no_less_than_the_measured_one_among_fewer_ranks():
    """DeepEP was measured on one 4-GPU GB200 tray; SGLang's EP 8-64 across the NVL72 rack is priced by the link
    formula but never below the measured EP 4 exchange (more ranks never cost less)."""
    from dataclasses import replace

    from apmw.perf.communication import measured_collectives
    gb200 = get_gpu("GB200")
    per_rank = np.array([1.0, 16.0, 128.0, 4096.0])
    ep4 = replace(_ep_step(gb200, gpus=4), engine="sglang")
    table, a = measured_collectives(gb200.name), ep4.arch
    measured_ep4 = table.moe_dispatch_combine_s("low_latency", 4, np.minimum(per_rank, 128.0), a.hidden_size,
                                                a.experts_per_token, a.num_experts)
    np.testing.assert_allclose(ep4.comm_time_s(per_rank * 4)[:3], a.moe_layers * measured_ep4[:3])
    for ep in (8, 16, 32, 64):
        wide = replace(_ep_step(gb200, gpus=ep), engine="sglang")
        assert np.all(wide.comm_time_s(per_rank * ep) >= ep4.comm_time_s(per_rank * 4) - 1e-12)
    # a given expert imbalance scales the measured exchange and its floor alike: more ranks still never cost less
    times = [_trtllm_ep("nvidia/DeepSeek-R1-0528-FP4-v2", ep, expert_imbalance=1.3).comm_time_s(4096.0 * ep)
             for ep in (64, 72)]
    assert times[1] >= times[0]
    sglang = [replace(_ep_step(gb200, gpus=ep, expert_imbalance=1.3), engine="sglang").comm_time_s(per_rank * ep)
              for ep in (4, 8)]
    assert np.all(sglang[1] >= sglang[0] - 1e-12)


def test_the_step_source_says_where_the_moe_exchange_is_priced_from():
    """The step model's source names the exchange's tables and EP size: measured on one GB200 tray (EP 4), read
    at the nearest measured EP above for TensorRT-LLM's all-to-all (EP 48 at 64), an estimate floored by EP 4
    past DeepEP's tables (SGLang EP 48), the link formula alone on a GPU without tables; nothing without EP."""
    from dataclasses import replace

    gb200 = get_gpu("GB200")
    tray = replace(_ep_step(gb200, gpus=4), engine="sglang")
    assert tray.moe_exchange_floor_ep is None
    assert "at EP 4: measured: DeepEP via SGLang" in tray.moe_exchange_source
    assert "wideep_deepep_ll_perf" in tray.moe_exchange_source and "(<= 128)" in tray.moe_exchange_source
    assert tray.moe_exchange_source in tray.source_detail
    rack = replace(_ep_step(gb200, gpus=48), engine="sglang")
    assert rack.moe_exchange_floor_ep == 4
    assert "at EP 48, past the measured EP sizes" in rack.moe_exchange_source
    assert "no faster than the measured EP 4 (an estimate, not a measurement)" in rack.moe_exchange_source
    trtllm = _trtllm_ep("nvidia/DeepSeek-R1-0528-FP4-v2", 48)
    assert trtllm.moe_exchange_floor_ep is None
    assert "read at the nearest measured EP above, 64" in trtllm.moe_exchange_source
    custom = replace(_ep_step(replace(gb200, name="custom"), gpus=8), engine="sglang")
    assert custom.moe_exchange_floor_ep is None
    assert custom.moe_exchange_source == "MoE dispatch/combine at EP 8: the link-bandwidth formula (no measured tables for custom)"
    tp = RooflineStepModel(load_architecture("deepseek-ai/DeepSeek-R1"), gb200, 8, "fp8", "fp8")
    assert tp.moe_exchange_source is None and "dispatch/combine" not in tp.source_detail


def test_two_batch_overlap_hides_the_exchange_behind_the_kernels():
    h200 = get_gpu("H200")
    plain, tbo = _ep_step(h200, gpus=16), _ep_step(h200, gpus=16, two_batch_overlap=True)
    b = np.array([16.0, 256, 2048])
    load = _decode(plain, b)
    assert np.all(tbo.iteration_time_s(load) < plain.iteration_time_s(load))
    kernels = np.maximum(plain.roofline_terms(load)[0], plain.served_compute_s(load))
    np.testing.assert_allclose(tbo.iteration_time_s(load) - plain.iteration_time_s(load),
                               np.maximum(kernels, plain.comm_time_s(b)) - kernels - plain.comm_time_s(b), rtol=1e-9)


def test_predict_takes_a_layout_and_counts_concurrency_over_all_dp_ranks():
    from apmw.capacity.benchmark import predict
    args = ("deepseek-ai/DeepSeek-R1", "H200", 1, "fp8", "fp8", 1024, 1024, 256)
    dp = predict(*args, engine="sglang", layout={"dp_attention": 8, "ep": 8})
    assert dp.running_requests == 256
    assert dp.output_tokens_per_s_per_gpu == pytest.approx(256 * 1024 / 8 / (dp.tpot_s * 1023 + dp.ttft_s), rel=0.2)
    tp8 = predict("deepseek-ai/DeepSeek-R1", "H200", 8, "fp8", "fp8", 1024, 1024, 256, engine="sglang")
    assert dp.source_detail != tp8.source_detail or dp.tpot_s != tp8.tpot_s


def test_predict_cli_refuses_a_layout_that_does_not_multiply_out_in_flag_names():
    import subprocess
    import sys
    from pathlib import Path
    apmw = Path(sys.executable).with_name("apmw")
    r = subprocess.run([str(apmw), "predict", "--model", "deepseek-ai/DeepSeek-R1", "--gpu", "H200", "--tp", "2",
                        "--dp-attention", "8", "--ep", "3", "--isl", "1024", "--osl", "1024", "--concurrency", "64"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "--ep 3 does not divide the MoE layers' --tp 2 x --dp-attention 8 = 16 GPUs" in r.stderr


@pytest.mark.parametrize("layout", [{"moe_tp": 1}, {"moe_tp": 2}, {"ep": 2}])
def test_predict_refuses_any_expert_setting_on_a_dense_model_alike(layout):
    """On Llama at tp 2, `--moe-tp 2` was accepted, `--moe-tp 1` refused for its MoE arithmetic and `--ep 2` for
    the model having no experts (fuzz round 5): each is refused as the last was."""
    from apmw.capacity.benchmark import predict
    with pytest.raises(ApmwError, match="layout: meta-llama/Meta-Llama-3.1-8B has no routed experts"):
        predict("meta-llama/Meta-Llama-3.1-8B", "H100", 2, "bf16", "bf16", 1024, 256, 16, layout=layout)


def test_routed_experts_in_their_own_dtype():
    """NVFP4 experts beside FP8 layers: the experts' bytes at 4 bits, the rest at 8, the whole checkpoint
    as apmw.arch prices it; decode at batch 1 reads fewer bytes and is faster."""
    a, gpu = load_architecture("deepseek-ai/DeepSeek-R1"), get_gpu("B200")
    fp8 = RooflineStepModel(arch=a, gpu=gpu, gpus=8, weight_dtype="fp8", kv_dtype="fp8")
    mixed = RooflineStepModel(arch=a, gpu=gpu, gpus=8, weight_dtype="fp8", kv_dtype="fp8", moe_dtype="fp4")
    assert mixed.held_weight_bytes == pytest.approx(a.weight_bytes("fp8", "fp4"), rel=1e-9)
    assert mixed.held_weight_bytes < 0.6 * fp8.held_weight_bytes
    assert mixed.weight_read_bytes_per_gpu(1.0) < fp8.weight_read_bytes_per_gpu(1.0)
    assert mixed.iteration_time_s(_decode(mixed, 1.0)) < fp8.iteration_time_s(_decode(fp8, 1.0))


def test_a_spec_moe_dtype_takes_the_roofline_and_reads_engine_spellings():
    d = _spec(None, gpus=8, gpu="B200")
    d["model"]["moe_dtype"] = "nvfp4"
    r = replica_from_spec(spec_from_dict(d))
    assert r.step.moe_dtype == "fp4" and r.step.source == "roofline"
    d["model"]["moe_dtype"] = "fp8_block"          # the same as weight_dtype: nothing apart
    assert replica_from_spec(spec_from_dict(d)).step.moe_dtype is None


def test_each_attention_dp_rank_fits_its_own_share_of_the_kv_pool():
    """The same loop priced as one pool and as eight DP ranks' pools: eight copies of the shared prefix, and
    a spread sqrt(8) times wider against the whole (each rank's demand over a share of the agents)."""
    from apmw.capacity.closed_loop import closed_loop_model
    from apmw.capacity.evaluate import evaluate
    dp = spec_from_dict(_spec({"dp_attention": 8, "ep": 8}))
    one = spec_from_dict(_spec(None, gpus=8))
    r = replica_from_spec(dp)
    m = closed_loop_model(dp, r)
    m._curves_to(40)                  # the curve's rows as far as the loop at 40 agents reads them
    # the prompts' queue and TTFT priced alike in both (as a prefill-first engine's: one queue for the replica),
    # so that only the KV pools differ
    policy = replace(r.policy, mixed_prefill=False)
    args = (policy, m.sample, m.curve, r.kv_capacity_bytes, 40)
    split, pooled = evaluate(dp, *args), evaluate(one, *args)
    prefix = m.sample.shared_prefix_kv_bytes
    assert prefix > 0
    assert split.kv_bytes_resident_mean - pooled.kv_bytes_resident_mean == pytest.approx(7 * prefix)
    spread = (split.kv_bytes_resident_p95 - split.kv_bytes_resident_mean,
              pooled.kv_bytes_resident_p95 - pooled.kv_bytes_resident_mean)
    assert spread[0] == pytest.approx(np.sqrt(8) * spread[1], rel=1e-9)


def test_a_lone_sequence_on_an_attention_dp_rank_reads_its_kv_there():
    """Eight DP ranks and one decoding sequence: that rank reads all of its KV, so the KV term is eight times
    what an even spread over the ranks would give; eight sequences spread evenly."""
    step = _ep_step(get_gpu("H200"), gpus=8)
    c = step._rates
    for seqs, share in ((1.0, 8.0), (8.0, 1.0), (9.0, 8 * 2 / 9)):
        assert float(step.busiest_rank_share(np.array(seqs))) == pytest.approx(share)
    one = _decode(step, 1.0, ctx=100_000)
    memory_s, _ = step.roofline_terms(one)
    weights_s = float(step.weight_read_bytes_per_gpu(1.0)) / c.weight_bw
    assert float(memory_s) - weights_s == pytest.approx(float(one.kv_read_bytes) / c.kv_bw, rel=1e-9)


def test_dense_mlps_over_all_ranks_pay_their_gather_and_scatter():
    """A dense model under SGLang's DP attention runs its MLPs tensor parallel over every rank's GPUs, so each
    layer gathers the ranks' tokens and scatters them back; under vLLM each rank keeps its own MLP copy."""
    a, gpu = load_architecture("meta-llama/Meta-Llama-3.1-70B"), get_gpu("H100")
    sglang = RooflineStepModel(arch=a, gpu=gpu, gpus=8, weight_dtype="fp8", kv_dtype="fp8",
                               layout=Layout(tp=2, dp=4, moe_tp=8, dense_tp=8))
    vllm = RooflineStepModel(arch=a, gpu=gpu, gpus=8, weight_dtype="fp8", kv_dtype="fp8",
                             layout=Layout(tp=2, dp=4, moe_tp=8, dense_tp=2))
    b = np.array([64.0, 1024.0])
    assert np.all(sglang.comm_time_s(b) > vllm.comm_time_s(b))


def test_a_layout_never_changes_gpus_behind_the_specs_back():
    """The GPU-halving lever does not apply to a laid-out spec, and a replica whose GPU count and layout
    disagree (a spec edited past its checks) is refused with both numbers."""
    from apmw.levers import evaluate_levers
    s = spec_from_dict(_spec({"dp_attention": 8, "ep": 8}))
    assert "gpus_half" not in {r.lever for r in evaluate_levers(s)}
    bad = s.model_copy(update={"hardware": s.hardware.model_copy(update={"gpus_per_replica": 4})})
    with pytest.raises(ApmwError, match="4 GPUs, but serving.parallelism lays out 8"):
        replica_from_spec(bad)


@pytest.mark.parametrize("par,model,said", [
    ({"tp": 2, "expert_imbalance": 1.2}, "meta-llama/Meta-Llama-3.1-70B", "has no routed experts"),
    ({"tp": 2, "two_batch_overlap": True}, "meta-llama/Meta-Llama-3.1-70B", "has no routed experts"),
    ({"tp": 8, "redundant_experts": 32}, V3, "redundant_experts applies to expert parallelism, and ep is 1"),
    ({"tp": 8, "expert_imbalance": 1.5}, V3, "expert_imbalance applies to expert parallelism"),
    ({"tp": 8, "two_batch_overlap": True}, V3, "this layout has neither"),
    ({"dp_attention": 8, "ep": 8, "expert_imbalance": 64}, V3, "expert_imbalance 64 is more than ep 8"),
])
def test_a_layout_field_without_effect_or_past_its_bound_is_refused(par, model, said):
    """Fuzzing (session 38): an imbalance or two-batch overlap on a dense model, or with no exchange to balance or
    hide, changed nothing and was accepted; 32 redundant experts without expert parallelism added 82 GB of weights
    no engine loads; an imbalance of 64 on 8 ranks (at most 8: every token on one rank) gave N* 2 for 109."""
    with pytest.raises(ApmwError, match=said):
        _replica(par, model=model, gpu="H100" if "Llama" in model else "H200")
    _replica({"dp_attention": 8, "ep": 8, "expert_imbalance": 8.0, "two_batch_overlap": True})   # at the bound


def test_a_layout_whose_copies_do_not_fit_says_so_not_to_add_gpus():
    # 4,096 redundant experts make DeepSeek-V3's eight DEP ranks hold 11 TB; its 673 GB checkpoint fits on 8 x H200
    with pytest.raises(ApmwError) as err:
        _replica({"dp_attention": 8, "ep": 8, "redundant_experts": 4096}, gpus=8)
    msg = str(err.value)
    assert "The checkpoint's 673.0 GB would fit on these GPUs; the layout holds more (its 4096 redundant experts " \
           "and the attention on each of its 8 attention-DP ranks)" in msg
    assert "of at least" not in msg


def test_a_layout_the_model_refuses_is_named_with_its_file_and_line(tmp_path):
    import yaml

    from apmw.spec import load_spec

    path = tmp_path / "tp3.yaml"
    path.write_text(yaml.safe_dump(_spec({"tp": 3}, gpus=3), sort_keys=False))
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.strip() == "parallelism:")
    with pytest.raises(ApmwError) as err:
        replica_from_spec(load_spec(path))
    assert str(err.value).startswith(f"{path}: line {line}: serving.parallelism: tp 3 does not divide")
    with pytest.raises(ApmwError) as err:              # the same spec from a dict has no file to name
        replica_from_spec(spec_from_dict(_spec({"tp": 3}, gpus=3)))
    assert str(err.value).startswith("serving.parallelism: tp 3 does not divide")
    assert load_spec(path) == spec_from_dict(_spec({"tp": 3}, gpus=3))     # where it was read is not what it says


def test_weights_no_replica_can_hold_are_refused_without_advising_an_impossible_count(tmp_path):
    """A config whose sizes make 16 PB of weights was told to use tp of at least 123,655 (fuzzing, session 40)."""
    import json

    from apmw.catalog.models import load_config
    from apmw.perf import benchmark_replica

    cfg, _ = load_config("meta-llama/Meta-Llama-3.1-8B")
    path = tmp_path / "huge-vocab.json"
    # 8e14 parameters: under the bound past which a config is refused as mistyped (apmw.arch.from_config.MAX_PARAMS),
    # over what 1,024 H200s hold
    path.write_text(json.dumps({**cfg, "vocab_size": 10**11}))
    with pytest.raises(ApmwError) as err:
        benchmark_replica(str(path), "H200", 8, "fp8", "fp8")
    msg = str(err.value)
    assert "No replica holds it" in msg and "past the 1,024 GPUs a replica may have" in msg
    assert "at least 123" not in msg.split("No replica")[0]
