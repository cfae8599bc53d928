"""A real llama.cpp server on loopback serving a tiny model the tests write themselves.

``tiny_model`` writes a random-weight Llama GGUF with the ``gguf`` package (tiny_model.py);
``llama_server`` runs llama.cpp's HTTP server from the ``xllamacpp`` wheel in a child process
(serve_tiny.py) on 127.0.0.1 and a free port, with 4 parallel slots (continuous batching) and
one compute thread. Both come from the ``test`` extra; nothing is downloaded.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.loadgen.tiny_model import write_tiny_llama

HERE = Path(__file__).parent
SLOTS = 4
START_TIMEOUT_S = 60


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    model_path: Path
    config_path: Path

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def on_cpus(cpus: set[int] | None):
    """A ``preexec_fn`` that keeps a child process to ``cpus`` (None: anywhere; so too where the OS
    cannot pin processes or has fewer CPUs)."""
    usable = (cpus is not None and hasattr(os, "sched_setaffinity") and cpus <= os.sched_getaffinity(0)
              and len(os.sched_getaffinity(0)) >= 2)
    return (lambda: os.sched_setaffinity(0, cpus)) if usable else None


def start_server(model: Path, config: Path, slots: int = SLOTS, cpus: set[int] | None = None) -> Server:
    proc = subprocess.Popen([sys.executable, str(HERE / "serve_tiny.py"), str(model), "--slots", str(slots),
                             "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            preexec_fn=on_cpus(cpus))
    deadline = time.monotonic() + START_TIMEOUT_S
    line = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("LISTENING "):
            return Server(url=line.split()[1], proc=proc, model_path=model, config_path=config)
        if proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError(f"llama.cpp server did not start (exit {proc.poll()}, last line {line!r})")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> tuple[Path, Path]:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def llama_server(tiny_model):
    server = start_server(*tiny_model)
    yield server
    server.kill()


@pytest.fixture
def own_server(tiny_model):
    """A server of the test's own, which the test may kill."""
    server = start_server(*tiny_model)
    yield server
    server.kill()


# The load generator and the server share a 2-core machine; left to the OS, the server's compute
# thread and the client's event loop sometimes share a core, and the server's decode steps measured
# up to 2x slower from one calibration to the next. Each on a core of its own, five calibrations of
# one server planned N* 13-14 for the knee workload; unpinned, six planned 11-14 and the loop test's
# twelve-odd ranged 12-18 (docs/bench.md "Calibration").
SERVER_CPUS, CLIENT_CPUS = {0}, {1}


@pytest.fixture
def pinned_server(tiny_model):
    """A server of the test's own on CPU 0 (the load generator goes on CPU 1: ``on_cpus(CLIENT_CPUS)``)."""
    server = start_server(*tiny_model, cpus=SERVER_CPUS)
    yield server
    server.kill()


def tiny_spec_dict(config: Path, **workload) -> dict:
    """A spec for the tiny model on a nominal CPU 'GPU' (see test_bench.py for the numbers' sources)."""
    w = {"steps_per_task": 2, "system_prompt_tokens": 64, "new_input_tokens_per_call": {"mean": 24, "p95": 48},
         "output_tokens_per_call": {"mean": 16, "p95": 32}, "tool_wait_s": {"p50": 0.1, "p95": 0.2}}
    w.update(workload)
    return {
        "workload": w,
        "model": {"config": str(config), "weight_dtype": "int8", "kv_dtype": "fp16"},
        "hardware": {"gpu": CPU_GPU},
        "serving": {"engine": "llamacpp", "max_batch": SLOTS, "kv_memory_fraction": 1.0, "workspace_bytes_per_gpu": 0,
                    "max_batched_tokens": 2048},
        "slo": {"task_latency_p95_s": 5.0},
        "cost": {"electricity_usd_per_kwh": 0.1, "gpu_hour_usd": 0.05},
    }


# A custom 'GPU' standing for one core of the test machine. Nominal figures, not measurements:
# the calibration fit scales them. hbm_bytes = weights (~14 MB, Q8_0) + the server's KV cache
# (4 slots x 2048 tokens x 4096 B/token = 33.6 MB, serve_tiny.py defaults); bandwidth ~20 GB/s
# (one DDR4 channel, order of magnitude); bf16_flops ~80 GFLOP/s (one AVX2 core, 2 FMA x 8 fp32 x
# 2.5 GHz); power figures of a server CPU core share (order of magnitude, unused by the checks).
CPU_GPU = {"hbm_bytes": 48e6, "hbm_bandwidth_bytes_per_s": 20e9, "bf16_flops": 80e9, "tdp_w": 15.0,
           "idle_power_w": 5.0, "busy_power_w": 15.0, "scaleup_bw_bytes_per_s": 1e9}
