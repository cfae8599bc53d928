"""Phase-aware GPU power and the replica power model (apmw.perf.power, the one power formula)."""

from __future__ import annotations

import numpy as np
import pytest

from apmw.arch import load_architecture
from apmw.catalog.gpus import get_gpu, gpu_names
from apmw.errors import ApmwError
from apmw.perf import GpuGroup, IterationLoad, PowerModel, RooflineStepModel, activity_power_w
from apmw.perf.power import MEMORY_BOUND_ACTIVITY
from apmw.spec import Power


def test_memory_bound_decode_draws_far_below_busy_and_prefill_draws_busy():
    idle, busy = 105.0, 700.0
    decode = activity_power_w(idle, busy, 1.0, 0.0)
    prefill = activity_power_w(idle, busy, 1.0, 1.0)
    assert decode == pytest.approx(idle + (busy - idle) * MEMORY_BOUND_ACTIVITY)
    assert decode == pytest.approx(300.0, abs=2)       # ML.ENERGY H100 batch-1 figure it is anchored to
    assert prefill == pytest.approx(busy)
    assert activity_power_w(idle, busy, 0.0, 1.0) == pytest.approx(idle)


def test_power_rises_with_utilisation_and_compute_share():
    u = np.linspace(0, 1, 11)
    p = activity_power_w(80.0, 700.0, u[:, None], u[None, :])
    assert np.all(np.diff(p, axis=0) >= 0) and np.all(np.diff(p, axis=1) >= 0)


def test_compute_share_is_low_for_decode_and_high_for_prefill():
    step = RooflineStepModel(arch=load_architecture("meta-llama/Meta-Llama-3.1-8B"), gpu=get_gpu("H200"), gpus=1,
                     weight_dtype="bf16", kv_dtype="bf16")
    decode = step.compute_share(IterationLoad(1.0, 0.0, 1e6, 1e9))
    prefill = step.compute_share(IterationLoad(0.0, 8192.0, 0.0, 1e14))
    assert decode < 0.05 and prefill == pytest.approx(1.0)


def test_replica_power_adds_the_host_share_per_gpu():
    """Every GPU group draws its phase-aware power; every GPU brings its host share."""
    m = PowerModel(gpu_idle_w=100.0, gpu_busy_w=700.0, gpu_tdp_w=700.0, host_w_per_gpu=125.0,
                   host_nameplate_w_per_gpu=575.0, pue=1.3, provisioned_kw_per_gpu=None)
    assert m.it_power_w(GpuGroup(8, 1.0, 1.0)) == pytest.approx(8 * (700.0 + 125.0))
    assert m.it_power_w(GpuGroup(8, 0.0, 0.0)) == pytest.approx(8 * (100.0 + 125.0))
    # a disaggregated prefill instance is a second group at its own operating point
    both = m.it_power_w(GpuGroup(8, 1.0, 0.0), GpuGroup(4, 0.5, 1.0))
    assert both == pytest.approx(8 * float(activity_power_w(100, 700, 1.0, 0.0)) + 4 * 400.0 + 12 * 125.0)
    assert m.facility_power_w(1000.0) == pytest.approx(1300.0)
    assert m.provisioned_power_w(8) == pytest.approx(8 * (700.0 + 575.0) * 1.3)


def test_power_model_reads_the_catalogue_and_the_spec_over_it():
    gpu = get_gpu("H200")
    default = PowerModel.of(gpu)
    assert (default.gpu_idle_w, default.gpu_busy_w, default.gpu_tdp_w) == (gpu.idle_power_w, gpu.busy_power_w,
                                                                           gpu.tdp_w)
    assert default.host_w_per_gpu == Power().host_power_w_per_gpu
    spec = PowerModel.of(gpu, Power(gpu_idle_power_w=50.0, host_power_w_per_gpu=0.0, provisioned_kw_per_gpu=2.0))
    assert spec.gpu_idle_w == 50.0 and spec.gpu_busy_w == gpu.busy_power_w and spec.host_w_per_gpu == 0.0
    assert spec.provisioned_power_w(8) == pytest.approx(16000.0)


def test_a_provisioned_budget_below_the_modelled_draw_is_refused():
    gpu = get_gpu("H100")
    with pytest.raises(ApmwError, match=r"power: the provisioned budget per GPU, 1 W \(power.provisioned_kw_per_gpu "
                                        r"0.001 kW\), is below the most the model lets a GPU draw, 1,072 W"):
        PowerModel.of(gpu, Power(provisioned_kw_per_gpu=0.001))
    with pytest.raises(ApmwError, match=r"910 W \(\(TDP 700 W \+ host nameplate 0 W, spec "
                                        r"power.host_nameplate_w_per_gpu\) x PUE 1.3\), is below .* 2,210 W"):
        PowerModel.of(gpu, Power(host_nameplate_w_per_gpu=0.0, host_power_w_per_gpu=1000.0))
    # every catalogue GPU's defaults hold their own draw
    for name in gpu_names():
        PowerModel.of(get_gpu(name))
