"""Hostile values in the layout sections (serving.parallelism, serving.disaggregation, model.moe_dtype): each
spec is refused with a clear error or planned soundly, never a traceback (Hypothesis; CI runs a few
examples, `make fuzz` more through APMW_FUZZ_EXAMPLES)."""

from __future__ import annotations

import copy
import math
import os

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apmw.capacity import plan
from apmw.errors import ApmwError
from apmw.spec import SpecError, spec_from_dict
from tests.conftest import small_spec_dict

EXAMPLES_PER_RUN = int(os.environ.get("APMW_FUZZ_EXAMPLES", "40"))

BASE = small_spec_dict()
BASE["model"] = {"config": "Qwen/Qwen3-30B-A3B", "weight_dtype": "fp8", "kv_dtype": "fp8"}
BASE["hardware"] = {"gpu": "H100"}
BASE["serving"] = {"engine": "sglang", "tool_wait_kv_policy": "retain",
                   "parallelism": {"tp": 1, "dp_attention": 2, "ep": 2},
                   "disaggregation": {"prefill_gpus": 1, "prefill_workers": 2, "decode_workers": 1}}
FIELDS = [("serving", "parallelism", k) for k in ("tp", "pp", "dp_attention", "moe_tp", "ep", "redundant_experts",
                                                  "expert_imbalance", "two_batch_overlap")]
FIELDS += [("serving", "disaggregation", k) for k in ("prefill_gpus", "prefill_workers", "decode_workers",
                                                      "prefill_parallelism", "kv_transfer_bandwidth_bytes_per_s")]
FIELDS += [("serving", "parallelism"), ("serving", "disaggregation"), ("model", "moe_dtype"),
           ("hardware", "gpus_per_replica"), ("serving", "engine")]
HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**40), max_value=2**40), st.integers(min_value=0, max_value=300),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.dictionaries(st.sampled_from(["tp", "pp", "dp_attention", "ep", "moe_tp", "x"]),
                    st.integers(min_value=-2, max_value=80), max_size=3),
    st.sampled_from([0, 1, 3, 7, 64, 128, 1024, "nvfp4", "mxfp4", "w4afp8", "trtllm", "llamacpp", "vllm", 1e-300]),
)


@settings(max_examples=EXAMPLES_PER_RUN, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(path=st.sampled_from(FIELDS), value=HOSTILE)
def test_a_hostile_layout_is_refused_cleanly_or_planned_soundly(path, value):
    data = copy.deepcopy(BASE)
    node = data
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    try:
        result = plan(spec_from_dict(yaml.safe_load(yaml.safe_dump(data))))
    except (SpecError, ApmwError):
        return
    d = result.to_dict()
    lat = d["task_latency_s"]
    assert lat["p50"] <= lat["p95"] <= lat["p99"]
    for key in ("agents_per_mw", "agents_per_mw_provisioned", "cost_per_session_usd", "ttft_p95_s", "tpot_p95_s"):
        assert math.isfinite(d[key]) and d[key] >= 0, key
