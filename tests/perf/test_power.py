"""Phase-aware GPU power and node power."""

from __future__ import annotations

import numpy as np
import pytest

from apmw.arch import load_architecture
from apmw.catalog.gpus import get_gpu
from apmw.perf import IterationLoad, StepModel, activity_power_w, gpu_power_w, node_power_w
from apmw.perf.power import MEMORY_BOUND_ACTIVITY


def test_memory_bound_decode_draws_far_below_busy_and_prefill_draws_busy():
    idle, busy = 105.0, 700.0
    decode = activity_power_w(idle, busy, 1.0, 0.0)
    prefill = activity_power_w(idle, busy, 1.0, 1.0)
    assert decode == pytest.approx(idle + (busy - idle) * MEMORY_BOUND_ACTIVITY)
    assert decode == pytest.approx(300.0, abs=2)       # ML.ENERGY H100 batch-1 figure it is anchored to
    assert prefill == pytest.approx(busy)
    assert activity_power_w(idle, busy, 0.0, 1.0) == pytest.approx(idle)
    assert activity_power_w(idle, busy, 1.0, 1.0) == pytest.approx(gpu_power_w(idle, busy, 1.0))


def test_power_rises_with_utilisation_and_compute_share():
    u = np.linspace(0, 1, 11)
    p = activity_power_w(80.0, 700.0, u[:, None], u[None, :])
    assert np.all(np.diff(p, axis=0) >= 0) and np.all(np.diff(p, axis=1) >= 0)


def test_compute_share_is_low_for_decode_and_high_for_prefill():
    step = StepModel(arch=load_architecture("meta-llama/Meta-Llama-3.1-8B"), gpu=get_gpu("H200"), gpus=1,
                     weight_dtype="bf16", kv_dtype="bf16")
    decode = step.compute_share(IterationLoad(1.0, 0.0, 1e6, 1e9))
    prefill = step.compute_share(IterationLoad(0.0, 8192.0, 0.0, 1e14))
    assert decode < 0.05 and prefill == pytest.approx(1.0)


def test_node_power_adds_the_host_share():
    assert node_power_w(8, 600.0, host_w_per_8_gpus=1000.0) == pytest.approx(5800.0)
    assert node_power_w(16, 600.0, host_w_per_8_gpus=1000.0) == pytest.approx(11600.0)
