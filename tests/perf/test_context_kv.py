"""A model whose KV never grows with the context (every attention layer windowed) is refused with the reason, not
divided by zero: apmw's KV pool counts tokens of context."""

from __future__ import annotations

import json

import pytest

from apmw.catalog import load_config
from apmw.capacity.benchmark import predict_with
from apmw.errors import ApmwError
from apmw.perf import benchmark_replica


def _windowed(tmp_path, every_layer: bool):
    cfg, _ = load_config("mistralai/Mixtral-8x7B-v0.1")
    cfg = {**cfg, "sliding_window": 4096}
    if not every_layer:                     # a window on half the layers, full attention on the rest
        cfg["layer_types"] = ["sliding_attention", "full_attention"] * (cfg["num_hidden_layers"] // 2)
    path = tmp_path / ("all" if every_layer else "half") / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    return str(path)


def test_every_layer_windowed_is_refused_with_the_reason(tmp_path):
    with pytest.raises(ApmwError, match="every attention layer keeps a sliding window of 4,096 tokens, so no KV "
                                        "grows with the context"):
        benchmark_replica(_windowed(tmp_path, every_layer=True), "H200", 2, "bf16", "bf16")


def test_some_full_attention_layers_are_priced(tmp_path):
    replica = benchmark_replica(_windowed(tmp_path, every_layer=False), "H200", 2, "bf16", "bf16")
    assert replica.step.kv_bytes_per_token > 0
    assert predict_with(replica, isl=3000, osl=500, concurrency=16).tpot_s > 0
