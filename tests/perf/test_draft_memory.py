"""What a draft holds in memory, and where each engine holds it (apmw.perf.memory;
apmw.arch.Architecture.mtp_module_bytes / mtp_kv_bytes_per_token; apmw.perf.speculative.draft_memory)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from apmw import plan
from apmw.arch import load_architecture
from apmw.cli import _register_verbs, app
from apmw.errors import ApmwError
from apmw.perf.replica import benchmark_replica
from apmw.spec import Serving, spec_from_dict
from apmw.spec.serving import Parallelism, Speculative

_register_verbs()
EXAMPLES = Path(__file__).resolve().parents[2] / "src" / "apmw" / "examples"
DSR1, V4 = "deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-V4-Pro"
MTP = Speculative(draft="mtp")


def _replica(model: str, speculative: Speculative | None, engine: str = "vllm", gpus: int = 8,
             parallelism: Parallelism | None = None, kv_memory_fraction: float | None = None):
    settings = {} if kv_memory_fraction is None else {"kv_memory_fraction": kv_memory_fraction}
    return benchmark_replica(model, "H200", gpus if parallelism is None else parallelism.tp or 1, "fp8", "fp8",
                             serving=Serving(engine=engine, speculative=speculative, parallelism=parallelism, **settings))


def _r1_module() -> tuple[float, float, float, float]:
    return load_architecture(DSR1).mtp_module_bytes("fp8")


def test_deepseek_r1s_mtp_module_is_one_moe_layer_and_its_projection_by_hand():
    """DeepSeek-R1's config: hidden 7168, 128 heads, q_lora 1536, kv_lora 512, nope 128, rope 64, v 128, 256
    routed experts and one shared of width 2048. In fp8 a weight is one byte; the router stays bf16, and so
    does the 2h x h projection, which the engines build as a plain nn.Linear."""
    h, heads, moe = 7168, 128, 2048
    attention = (h * 1536 + 1536 * heads * (128 + 64) + h * (512 + 64) + 512 * heads * (128 + 128)
                 + heads * 128 * h + 1536 + 512)                          # projections and the two latent norms
    routed = 256 * 3 * h * moe
    rest = 3 * h * moe + 256 * h * 2                                      # shared expert, router
    assert _r1_module() == pytest.approx((attention, rest, routed, 2 * h * h * 2), rel=1e-9)
    # about 11.7 GB, where the 671 B model's checkpoint of 685 B carries 14 B of MTP (embedding and head included)
    assert sum(_r1_module()) / 1e9 == pytest.approx(11.71, abs=0.01)


def test_a_draft_module_is_held_as_the_layout_holds_a_layer_and_its_projection_on_every_gpu():
    """Plain TP8 holds the layer once and the unsharded projection 8 times. Under attention DP every rank holds
    its own attention; SGLang shards the dense weights (shared expert, router) over all 8 GPUs and EP splits the
    routed experts: so DEP8 holds the attention 8 times and the rest once."""
    attention, rest, routed, projection = _r1_module()
    assert _replica(DSR1, MTP).memory.draft_weight_bytes == pytest.approx(attention + rest + routed + 8 * projection)
    dep = _replica(DSR1, MTP, "sglang", parallelism=Parallelism(tp=1, dp_attention=8, ep=8, moe_tp=1))
    assert dep.memory.draft_weight_bytes == pytest.approx(8 * attention + rest + routed + 8 * projection)


def test_under_vllm_the_draft_comes_out_of_the_pool_in_the_targets_tokens():
    plain, mtp = _replica(DSR1, None), _replica(DSR1, MTP)
    a, b = plain.memory, mtp.memory
    assert a.draft_weight_bytes == a.draft_kv_bytes == 0
    # the pool loses the module's weights; the draft caches its one MLA layer (576 fp8 elements a token) in as
    # many tokens as the target's 61 layers (35,136 bytes a token)
    pool = a.kv_capacity_bytes - b.draft_weight_bytes
    assert b.kv_capacity_bytes + b.draft_kv_bytes == pytest.approx(pool)
    assert b.draft_kv_bytes / pool == pytest.approx(576 / (35_136 + 576))
    assert b.weight_bytes == a.weight_bytes and b.usable_bytes == a.usable_bytes


def test_under_sglang_the_draft_takes_the_memory_outside_its_share():
    """SGLang sizes the target's pool alone and the draft runner takes the rest of the memory: the target keeps
    every token, and the draft caches as many in the memory outside mem_fraction_static."""
    plain, mtp = _replica(DSR1, None, "sglang"), _replica(DSR1, MTP, "sglang")
    assert mtp.kv_capacity_bytes == plain.kv_capacity_bytes
    assert mtp.memory.draft_kv_bytes == pytest.approx(plain.memory.kv_capacity_bytes * 576 / 35_136)
    assert mtp.memory.draft_weight_bytes + mtp.memory.draft_kv_bytes < mtp.memory.hbm_bytes - mtp.memory.usable_bytes
    with pytest.raises(ApmwError, match=r"draft does not fit .* outside its memory share.*to at most 0\.98"):
        _replica(DSR1, MTP, "sglang", kv_memory_fraction=0.99)
    _replica(DSR1, MTP, "sglang", kv_memory_fraction=0.98)                # the largest share it names fits


def test_without_a_draft_every_byte_is_as_before():
    """The layouts' held weights, the same rule for the model and its draft, are those of the formula the
    memory budget used before drafts held memory, to the bit."""
    for model in (DSR1, "moonshotai/Kimi-K2-Instruct"):
        for par in (None, Parallelism(tp=1, dp_attention=8, ep=8, moe_tp=1), Parallelism(tp=2, dp_attention=4, ep=8)):
            step = benchmark_replica(model, "H200", 8 if par is None else par.tp, "fp8", "fp8",
                                     serving=Serving(engine="sglang", parallelism=par), moe_dtype="fp4").step
            c, lay = step._rates, step.parallel
            routed = c.num_experts * c.expert_params
            slots = (c.num_experts + lay.redundant_experts) / c.num_experts if routed else 1.0
            before = (c.attention_bytes / lay.tp + c.held_rest_bytes / lay.dense_tp
                      + routed * slots / (lay.moe_tp * lay.ep) * c.expert_bytes_per_param) / lay.pp * step.gpus
            assert step.held_weight_bytes == before


def test_deepseek_v4s_mtp_layer_keeps_only_its_window():
    """V4-Pro's compress_ratios ends in 0 for its MTP module: a window-only layer, no KV per token."""
    arch = load_architecture(V4)
    assert arch.compressed.mtp_ratio == 0 and arch.mtp_kv_bytes_per_token("fp8") == 0
    r = benchmark_replica(V4, "B300", 8, "fp8", "fp8", serving=Serving(speculative=MTP))
    assert r.memory.draft_kv_bytes == 0 and r.memory.draft_weight_bytes > 0


def test_a_separate_draft_model_left_unnamed_holds_nothing_apmw_can_count():
    r = _replica(DSR1, Speculative(draft="model", draft_tokens=3, acceptance_rate=0.7))
    assert r.memory.draft_weight_bytes == r.memory.draft_kv_bytes == 0


def _dsr1_coding_agent() -> dict:
    doc = yaml.safe_load((EXAMPLES / "coding-agent.yaml").read_text())
    doc["model"] = {"config": DSR1, "weight_dtype": "fp8", "kv_dtype": "fp8"}
    doc["hardware"] = {"gpu": "H200", "gpus_per_replica": 8}
    doc["serving"]["engine"] = "vllm"
    return doc


def test_plan_reports_the_draft_and_fits_fewer_contexts():
    doc = _dsr1_coding_agent()
    base = plan(spec_from_dict(doc), agents=8).to_dict()
    doc["serving"]["speculative"] = {"draft": "mtp"}
    mtp = plan(spec_from_dict(doc), agents=8).to_dict()
    assert base["draft_weight_bytes"] == base["draft_kv_bytes"] == 0
    attention, rest, routed, projection = _r1_module()
    assert mtp["draft_weight_bytes"] == pytest.approx(attention + rest + routed + 8 * projection)
    assert mtp["kv_tokens_capacity"] < base["kv_tokens_capacity"]
    assert mtp["draft_kv_bytes"] / (mtp["draft_kv_bytes"] + mtp["kv_capacity_bytes"]) == pytest.approx(1 / 62)


def test_plan_prints_what_the_draft_holds(tmp_path):
    doc = _dsr1_coding_agent()
    doc["serving"]["speculative"] = {"draft": "mtp"}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(doc))
    r = CliRunner().invoke(app, ["plan", str(tmp_path / "spec.yaml"), "--agents", "8", "--analytic"])
    assert r.exit_code == 0, r.output
    assert "13.2 GB of weights" in " ".join(r.stdout.split())


def test_apmw_model_shows_what_the_mtp_modules_hold():
    got = json.loads(CliRunner().invoke(app, ["model", DSR1, "--json"]).stdout)
    assert got["mtp_modules"] == 1 and got["mtp_kv_bytes_per_token"]["fp8"] == 576
    assert got["mtp_weight_bytes"]["fp8"] == pytest.approx(sum(_r1_module()))
    assert "mtp_modules" not in json.loads(CliRunner().invoke(app, ["model", "meta-llama/Meta-Llama-3.1-8B",
                                                                      "--json"]).stdout)


ARGS = ["predict", "--model", DSR1, "--gpu", "H200", "--tp", "8", "--weight-dtype", "fp8", "--kv-dtype", "fp8",
        "--isl", "1024", "--osl", "1024", "--concurrency", "16"]


def test_cli_notes_only_the_draft_it_cannot_count():
    def said(extra: list[str]) -> str:
        r = CliRunner().invoke(app, ARGS + extra)
        assert r.exit_code == 0, r.output
        return " ".join(r.output.split())
    assert "not counted in memory" not in said(["--speculative", "mtp"])
    assert "separate draft model: its weights and KV are not counted in memory" in said(
        ["--speculative", "model", "--draft-tokens", "3", "--acceptance-rate", "0.7"])


@pytest.mark.parametrize("engine, fewer", [("vllm", True), ("sglang", False)])
def test_predict_caps_the_running_requests_at_the_pool_the_engine_leaves(engine, fewer):
    """Long requests fill the KV pool: under vLLM the draft's share leaves room for fewer of them; under SGLang
    the target's pool, sized alone, holds as many."""
    args = ARGS[:ARGS.index("--isl")] + ["--isl", "60000", "--osl", "4000", "--concurrency", "256", "--engine",
                                         engine, "--json"]
    run = lambda extra: json.loads(CliRunner().invoke(app, args + extra).stdout)  # noqa: E731
    plain, mtp = run([]), run(["--speculative", "mtp"])
    assert {plain["running_limited_by"], mtp["running_limited_by"]} == {"kv_memory"}
    assert (mtp["running_requests"] < plain["running_requests"]) == fewer
    assert mtp["running_requests"] <= plain["running_requests"]


# --- a separate draft model, named (serving.speculative.draft_model) ---------------------------------------
LLAMA70, LLAMA8 = "meta-llama/Meta-Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-8B"


def _llama70(draft: Speculative | None, tp: int = 8, parallelism: Parallelism | None = None):
    return benchmark_replica(LLAMA70, "H100", tp, "fp8", "fp8", serving=Serving(speculative=draft, parallelism=parallelism))


def test_a_named_draft_model_holds_its_weights_and_its_kv_in_the_targets_tokens():
    """Llama-3.1-8B drafting for Llama-3.1-70B at TP8: 8B's bf16 weights (its checkpoint's own dtype) held once,
    sharded; its KV (32 layers x 8 heads x 128 x 2) beside the 70B's (80 layers) in as many tokens; at TP8 both
    have one KV head a GPU, so neither is replicated."""
    named = Speculative(draft="model", draft_tokens=4, acceptance_rate=0.7, draft_model=LLAMA8)
    plain, drafted = _llama70(None), _llama70(named)
    eight = load_architecture(LLAMA8)
    assert drafted.memory.draft_weight_bytes == pytest.approx(eight.weight_bytes("bf16"))
    pool = plain.memory.kv_capacity_bytes - drafted.memory.draft_weight_bytes
    kv8, kv70 = 32 * 8 * 128 * 2 * 1.0, 80 * 8 * 128 * 2 * 1.0            # fp8 KV: one byte an element
    assert drafted.memory.draft_kv_bytes == pytest.approx(pool * kv8 / (kv70 + kv8))
    assert drafted.memory.kv_capacity_bytes == pytest.approx(pool * kv70 / (kv70 + kv8))


def test_a_named_draft_models_passes_cost_its_share_of_the_bytes_a_step_reads():
    named = _llama70(Speculative(draft="model", draft_tokens=4, acceptance_rate=0.7, draft_model=LLAMA8))
    eight, seventy = load_architecture(LLAMA8), load_architecture(LLAMA70)
    assert named.speculative.draft_cost_fraction == pytest.approx(
        4 * eight.active_weight_bytes("bf16") / seventy.active_weight_bytes("fp8"))
    given = _llama70(Speculative(draft="model", draft_tokens=4, acceptance_rate=0.7, draft_model=LLAMA8,
                                 draft_cost_fraction=0.05))
    assert given.speculative.draft_cost_fraction == 0.05 and given.memory.draft_weight_bytes > 0


@pytest.mark.parametrize("speculative, layout, says", [
    (Speculative(draft="model", draft_tokens=3, acceptance_rate=0.7, draft_model="Qwen/Qwen3-8B"), None,
     "must share its vocabulary"),
    (Speculative(draft="model", draft_tokens=3, acceptance_rate=0.7, draft_model="no/such-model"), None,
     "serving.speculative.draft_model"),
    (Speculative(draft="model", draft_tokens=3, acceptance_rate=0.7, draft_model=LLAMA8),
     Parallelism(tp=4, pp=2), "tensor-parallel replica only"),
])
def test_a_draft_model_apmw_cannot_place_is_refused(speculative, layout, says):
    with pytest.raises(ApmwError, match=says):
        _llama70(speculative, tp=4 if layout else 8, parallelism=layout)


def test_draft_model_is_for_separate_drafts_only():
    with pytest.raises(ValueError, match="names a separate draft model"):
        Speculative(draft="mtp", draft_model=LLAMA8)


def test_predict_counts_a_named_draft_and_notes_an_unnamed_one():
    args = ["predict", "--model", LLAMA70, "--gpu", "H100", "--tp", "8", "--weight-dtype", "fp8", "--kv-dtype", "fp8",
            "--isl", "1024", "--osl", "256", "--concurrency", "8", "--speculative", "model", "--draft-tokens", "4",
            "--acceptance-rate", "0.7"]
    named = CliRunner().invoke(app, args + ["--draft-model", LLAMA8, "--json"])
    assert named.exit_code == 0, named.output
    assert "not counted in memory" not in named.output
    # four passes of an 8B draft in bf16 read about 0.85 of what one 70B fp8 iteration reads: no cheap draft
    assert json.loads(named.stdout)["speculative"]["draft_cost_fraction"] == pytest.approx(0.85, abs=0.01)
    unnamed = CliRunner().invoke(app, args)
    assert unnamed.exit_code == 0 and "name the draft" in " ".join(unnamed.output.split())
    wrong = CliRunner().invoke(app, args + ["--draft-model", "Qwen/Qwen3-8B"])
    assert wrong.exit_code != 0 and "--draft-model: Qwen/Qwen3-8B has a vocabulary" in " ".join(wrong.output.split())


def test_a_draft_that_makes_decoding_slower_is_said_so():
    """An 8B draft for an 8B target (draft_cost_fraction 4.0 over four draft tokens) made every token about twice as
    slow with nothing said (fuzzing, session 45): a note says decoding is slower than without it; a cheap draft
    has none."""
    import subprocess

    from tests.e2e.test_cli import APMW

    base = [APMW, "predict", "--model", "meta-llama/Meta-Llama-3.1-8B", "--gpu", "H100", "--isl", "1000", "--osl",
            "100", "--concurrency", "4", "--speculative", "model", "--draft-tokens", "4", "--acceptance-rate", "0.7"]
    slow = subprocess.run(base + ["--draft-model", "meta-llama/Meta-Llama-3.1-8B"], capture_output=True, text=True,
                          timeout=300)
    assert slow.returncode == 0, slow.stderr
    assert "decoding is slower than without it" in " ".join(slow.stderr.split())
    cheap = subprocess.run(base + ["--draft-cost-fraction", "0.1"], capture_output=True, text=True, timeout=300)
    assert cheap.returncode == 0 and "slower than without it" not in cheap.stderr
