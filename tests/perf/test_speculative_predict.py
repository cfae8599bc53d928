"""Speculative decoding in `apmw predict` (aggregated and disaggregated): the target verifies ``k + 1``
tokens per decoding sequence, one iteration yields ``(1 - a^(k+1)) / (1 - a)`` tokens, and the draft
adds its share to every iteration (apmw.perf.speculative, as the closed loop prices it)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import apmw.cli
from apmw.arch import load_architecture
from apmw.capacity.benchmark import decode_load, predict, replica_for_benchmark
from apmw.capacity.disaggregated_benchmark import Workers, predict_disaggregated
from apmw.cli import app
from apmw.perf.speculative import MTP_ACCEPTANCE_RATE, mtp_draft_cost_fraction

LLAMA8 = "meta-llama/Meta-Llama-3.1-8B"
DSR1 = "deepseek-ai/DeepSeek-R1"
apmw.cli._register_verbs()


def _draft(k: int, a: float, cost: float = 0.0) -> dict:
    return {"draft": "model", "draft_tokens": k, "acceptance_rate": a, "draft_cost_fraction": cost}


def _point(speculative: dict | None, concurrency: int = 32, **kw):
    return predict(LLAMA8, "H100", 1, "fp8", "fp8", 1024, 512, concurrency, speculative=speculative, **kw)


def test_the_decode_iteration_verifies_k_plus_one_tokens_per_sequence():
    # k = 3: a decode iteration of 32 sequences runs 128 tokens through the target (each reading its KV once)
    p = _point(_draft(3, 0.6))
    replica = replica_for_benchmark(LLAMA8, "H100", 1, "fp8", "fp8", 1024, 512, speculative=_draft(3, 0.6))
    ctx = 1024 + 512 / 2
    kv = float(replica.arch.kv_read_bytes_for_context(ctx, "fp8"))
    load = decode_load(replica, 32.0, ctx)
    assert load.decode_seqs == 128 and load.kv_read_bytes == pytest.approx(32 * kv)
    assert p.decode_iteration_s == pytest.approx(float(replica.step.iteration_time_s(load)))
    assert p.decode_iteration_s > _point(None).decode_iteration_s


def test_no_acceptance_only_costs_and_acceptance_pays():
    base = _point(None)
    # every draft token rejected: one token per iteration, each iteration verifying two per sequence
    assert _point(_draft(1, 0.0)).tpot_s > base.tpot_s
    tpots = [_point(_draft(3, a)).tpot_s for a in (0.3, 0.6, 0.9)]
    rates = [_point(_draft(3, a)).output_tokens_per_s_per_gpu for a in (0.3, 0.6, 0.9)]
    assert tpots == sorted(tpots, reverse=True) and rates == sorted(rates)
    assert tpots[-1] < base.tpot_s


def test_tpot_is_the_iteration_over_the_tokens_it_yields():
    # one client: its decode iterations carry no prompt (its own prefill came before its first token)
    p = _point(_draft(3, 0.8), concurrency=1)
    per_iteration = (1 - 0.8 ** 4) / (1 - 0.8)
    assert p.speculative["tokens_per_iteration"] == pytest.approx(per_iteration)
    assert p.mixed_iteration_share > 0
    assert p.tpot_s == pytest.approx(p.decode_iteration_s / per_iteration)


def test_the_draft_cost_scales_every_iteration():
    free, paid = _point(_draft(2, 0.7, 0.0)), _point(_draft(2, 0.7, 0.25))
    assert paid.decode_iteration_s == pytest.approx(1.25 * free.decode_iteration_s)
    assert paid.mixed_iteration_s == pytest.approx(1.25 * free.mixed_iteration_s)


def test_mtp_takes_the_models_own_head_and_the_cited_acceptance():
    arch = load_architecture(DSR1)
    p = predict(DSR1, "H200", 8, "fp8", "fp8", 1024, 1024, 16, engine="sglang", speculative={"draft": "mtp"})
    assert p.speculative == {"draft_tokens": arch.mtp_modules, "acceptance_rate": MTP_ACCEPTANCE_RATE,
                             "draft_cost_fraction": pytest.approx(mtp_draft_cost_fraction(arch, arch.mtp_modules)),
                             "tokens_per_iteration": pytest.approx(1 + MTP_ACCEPTANCE_RATE)}
    three = predict(DSR1, "H200", 8, "fp8", "fp8", 1024, 1024, 16, engine="sglang",
                    speculative={"draft": "mtp", "draft_tokens": 3})
    assert three.speculative["draft_tokens"] == 3
    assert three.tpot_s < p.tpot_s < predict(DSR1, "H200", 8, "fp8", "fp8", 1024, 1024, 16, engine="sglang").tpot_s


def test_disaggregated_decode_workers_verify_and_yield_the_same_way():
    workers = dict(prefill=Workers(1, 1), decode=Workers(1, 1))
    spec = _draft(3, 0.7, 0.1)
    p = predict_disaggregated(LLAMA8, "H100", "fp8", "fp8", 1024, 512, 1, **workers, speculative=spec)
    base = predict_disaggregated(LLAMA8, "H100", "fp8", "fp8", 1024, 512, 1, **workers)
    per_iteration = (1 - 0.7 ** 4) / (1 - 0.7)
    assert p.decode_iteration_s == pytest.approx(p.tpot_s * per_iteration)
    # one request decoding alone on its worker: the decode-only iteration of one sequence verifying 4 tokens
    dec = replica_for_benchmark(LLAMA8, "H100", 1, "fp8", "fp8", 1024, 512, speculative=spec)
    alone = float(np.asarray(dec.step.iteration_time_s(decode_load(dec, 1.0, 1024 + 256))))
    assert p.decode_iteration_s == pytest.approx(1.1 * alone, rel=1e-6)
    assert p.tpot_s < base.tpot_s and p.speculative["draft_tokens"] == 3
    # the draft runs on the prefill workers too
    assert p.ttft_parts_s["steady_state"] == pytest.approx(1.1 * base.ttft_parts_s["steady_state"])


def test_cli_prices_and_reports_speculative_decoding():
    args = ["predict", "--model", LLAMA8, "--gpu", "H100", "--weight-dtype", "fp8", "--kv-dtype", "fp8",
            "--isl", "1024", "--osl", "512", "--concurrency", "32"]
    r = CliRunner().invoke(app, args + ["--speculative", "model", "--draft-tokens", "3", "--acceptance-rate", "0.6",
                                        "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["speculative"]["draft_tokens"] == 3 and got["speculative"]["acceptance_rate"] == 0.6
    assert got["tpot_s"] == pytest.approx(_point(_draft(3, 0.6, 0.1)).tpot_s)   # a separate draft costs 0.1
    assert json.loads(CliRunner().invoke(app, args + ["--json"]).output)["speculative"] is None


@pytest.mark.parametrize("extra, says", [
    (["--draft-tokens", "3"], "--draft-tokens describe speculative decoding; add --speculative"),
    (["--speculative", "eagle"], "'eagle' is not a draft apmw knows"),
    (["--speculative", "mtp"], "--speculative mtp needs a model with a multi-token-prediction head"),
    (["--speculative", "model", "--draft-tokens", "3"], "a separate draft model needs --acceptance-rate"),
    (["--speculative", "model", "--draft-tokens", "3", "--acceptance-rate", "1"], "--acceptance-rate: Input should be less than 1"),
])
def test_cli_refuses_what_it_cannot_price(extra, says):
    r = CliRunner().invoke(app, ["predict", "--model", LLAMA8, "--gpu", "H100", "--isl", "1024", "--osl", "512",
                                 "--concurrency", "4", "--kv-dtype", "bf16"] + extra)
    assert r.exit_code != 0 and isinstance(r.exception, SystemExit)     # a clear error, no traceback
    assert says in r.output, r.output


def test_drafts_take_their_places_in_the_token_budget():
    """vLLM counts a decoder's draft tokens against max_num_batched_tokens: 199 decoders verifying 4 tokens
    each leave 228 of a 1,024-token budget for prompts, not 825, so a 4,096-token prompt takes 18 mixed
    iterations instead of 5 and prompts queue for the budget far longer (no acceptance, a free draft: the
    iterations themselves are only a little longer)."""
    base = predict(LLAMA8, "H100", 1, "fp8", "fp8", 4096, 256, 200, token_budget=1024)
    drafts = predict(LLAMA8, "H100", 1, "fp8", "fp8", 4096, 256, 200, token_budget=1024,
                     speculative=_draft(3, 0.0, 0.0))
    assert drafts.mixed_iteration_s < 1.3 * base.mixed_iteration_s
    assert drafts.ttft_parts_s["steady_state"] > 3 * base.ttft_parts_s["steady_state"]
