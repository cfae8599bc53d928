"""Property-based fuzzing of the spec path (Hypothesis): any value in any field of a bundled spec
gives either a clean ApmwError / SpecError or a plan whose numbers are finite and ordered, and a
short simulation of the same spec ends cleanly with finite, ordered figures too.

CI runs a bounded number of examples; `make fuzz` runs many more (APMW_FUZZ_EXAMPLES)."""

from __future__ import annotations

import copy
import math
import os

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apmw.capacity import plan
from apmw.errors import ApmwError
from apmw.sim import simulate
from apmw.spec import SpecError, spec_from_dict
from tests.conftest import EXAMPLES

BASE = yaml.safe_load((EXAMPLES / "support-chat.yaml").read_text())
EXAMPLES_PER_RUN = int(os.environ.get("APMW_FUZZ_EXAMPLES", "40"))


def _paths(node, prefix=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))


PATHS = sorted(_paths(BASE), key=str)
HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
    st.sampled_from([0, -1, 1, 10**12, 1e-300, 1e300, "auto", "H20", "fp3", {"p50": 1, "p95": 1e12}]),
)


def _set(data: dict, path: tuple, value) -> dict:
    out = copy.deepcopy(data)
    node = out
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return out


def _finite_and_ordered(d: dict) -> None:
    lat = d["task_latency_s"]
    assert lat["p50"] <= lat["p95"] <= lat["p99"]
    for key in ("agents_per_mw", "agents_per_mw_provisioned", "energy_per_session_j", "cost_per_session_usd",
                "ttft_p95_s", "tpot_p95_s", "kv_tokens_resident_p95"):
        assert math.isfinite(d[key]) and d[key] >= 0, key


@settings(max_examples=EXAMPLES_PER_RUN, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(path=st.sampled_from(PATHS), value=HOSTILE)
def test_any_value_in_any_field_is_refused_cleanly_or_planned_soundly(path, value):
    try:
        spec = spec_from_dict(_set(BASE, path, value))
        result = plan(spec)
    except (SpecError, ApmwError):
        return
    _finite_and_ordered(result.to_dict())
    try:
        sim = simulate(spec, 2, 120.0).to_dict()
    except ApmwError:
        return
    for key in ("task_latency_s", "ttft_s", "tpot_s"):
        q = [sim[key][k] for k in ("p50", "p95", "p99") if sim[key][k] is not None]
        assert q == sorted(q) and all(math.isfinite(x) and x >= 0 for x in q), (key, sim[key])

