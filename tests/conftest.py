from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


@pytest.fixture(autouse=True)
def _no_evaluations_from_other_tests():
    """Each test starts with no closed-loop evaluation kept (apmw.capacity.closed_loop shares them between models
    alike but for their batch limit): a test that patches what an evaluation reads gets its own."""
    from apmw.capacity import closed_loop

    closed_loop._EVALUATIONS.clear()


@pytest.fixture
def example_dict():
    """A bundled example as a plain dict, to mutate in tests."""

    def load(name: str = "coding-agent") -> dict:
        return yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())

    return load


def small_spec_dict() -> dict:
    """A small, fast workload: dense 8B model on one H100."""
    return {
        "workload": {
            "steps_per_task": {"mean": 10, "p95": 20},
            "system_prompt_tokens": 1000,
            "new_input_tokens_per_call": {"mean": 300, "p95": 900},
            "output_tokens_per_call": {"mean": 150, "p95": 500},
            "tool_wait_s": {"p50": 2.0, "p95": 8.0},
        },
        "model": {"config": "meta-llama/Meta-Llama-3.1-8B", "weight_dtype": "bf16", "kv_dtype": "bf16"},
        "hardware": {"gpu": "H100", "gpus_per_replica": 1},
        "serving": {"max_batch": 256},
        "slo": {"task_latency_p95_s": 120},
        "cost": {"electricity_usd_per_kwh": 0.1, "gpu_hour_usd": 2.0},
    }
