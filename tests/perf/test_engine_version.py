"""serving.engine_version / apmw predict --engine-version: a pinned engine release is priced by that
release's own measured tables or refused with the reason (issue 21, item 1)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import apmw.cli
from apmw.capacity.benchmark import predict
from apmw.cli import app
from apmw.errors import ApmwError
from apmw.examples import bundled_examples
from apmw.perf import replica_from_spec
from apmw.spec import load_spec

LLAMA8 = "meta-llama/Meta-Llama-3.1-8B"
apmw.cli._register_verbs()   # every verb, as the `apmw` entry point does


def _point(gpu: str, engine: str = "vllm", version: str | None = None, model: str = LLAMA8, **kw):
    return predict(model, gpu, kw.pop("tp", 1), kw.pop("weight_dtype", "bf16"), "bf16", 1000, 200, 16,
                   engine=engine, engine_version=version, **kw)


@pytest.mark.parametrize("gpu, engine, version", [("H200", "vllm", "0.24.0"), ("H100", "sglang", "0.5.14"),
                                                   ("B200", "trtllm", "1.3.0rc20")])
def test_the_bundled_release_prices_as_the_default(gpu, engine, version):
    pinned, default = _point(gpu, engine, version), _point(gpu, engine)
    assert pinned.source == "calibrated"
    assert f"{engine}'s own kernel tables" in pinned.source_detail
    assert (pinned.tpot_s, pinned.ttft_s) == (default.tpot_s, default.ttft_s)


@pytest.mark.parametrize("written", ["v0.24.0", "V0.24", "0.24"])
def test_a_release_written_as_tags_write_it_is_that_release(written):
    """'v0.24.0' (vLLM's git tag) was refused with "H200-SXM-141GB has vllm 0.24.0" (fuzz round 5)."""
    pinned, default = _point("H200", "vllm", written), _point("H200", "vllm")
    assert (pinned.tpot_s, pinned.ttft_s) == (default.tpot_s, default.ttft_s)


def test_a_release_not_bundled_is_refused_naming_the_bundled_one():
    with pytest.raises(ApmwError, match=r"engine_version '0\.20\.0' \(vllm\).*H200-SXM-141GB has vllm 0\.24\.0"):
        _point("H200", "vllm", "0.20.0")


def test_another_engines_tables_standing_in_do_not_satisfy_a_pin():
    # TensorRT-LLM on Hopper is priced with vLLM's kernels when unpinned; pinned, that is refused
    assert "vllm" in _point("H200", "trtllm").source_detail
    with pytest.raises(ApmwError, match="H200-SXM-141GB has no trtllm tables of its own"):
        _point("H200", "trtllm", "1.3.0rc20")


def test_a_replica_the_pinned_tables_cannot_price_is_refused_with_why():
    with pytest.raises(ApmwError, match="its tables cannot price this replica .*MLA attention with 16 query heads per rank"):
        _point("H200", "vllm", "0.24.0", model="deepseek-ai/DeepSeek-R1", tp=8, weight_dtype="fp8")
    with pytest.raises(ApmwError, match="no vllm tables of its own"):
        _point("A100", "vllm", "0.24.0")
    with pytest.raises(ApmwError, match="plain roofline was asked for"):
        _point("H200", "vllm", "0.24.0", calibrated=False)


def test_the_spec_field_is_named_in_its_error():
    spec = load_spec(bundled_examples()["support-chat"])
    pinned = spec.model_copy(update={"serving": spec.serving.model_copy(update={"engine_version": "0.4.0"})})
    with pytest.raises(ApmwError, match=r"support-chat\.yaml: line \d+: serving\.engine_version '0\.4\.0' \(vllm\)"):
        replica_from_spec(pinned)
    ok = spec.model_copy(update={"serving": spec.serving.model_copy(update={"engine_version": "0.24.0"})})
    assert replica_from_spec(ok).step.source == "calibrated"


def test_the_flag_is_named_in_the_cli_error():
    r = CliRunner().invoke(app, ["predict", "--model", LLAMA8, "--gpu", "H200", "--isl", "1000", "--osl", "200",
                                 "--concurrency", "4", "--engine-version", "0.1.0"])
    assert r.exit_code == 1
    assert "--engine-version '0.1.0' (vllm): no bundled kernel tables" in r.output
