"""apmw search --ray on a real local Ray cluster (a head and a second worker node on loopback): the
same answer as in one process, also when a worker is killed in the middle of a task."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES
from tests.e2e.test_cli import APMW
from tests.test_search_runs import SPACE_YAML, SPEC, _cmdline, _same_table, planned_here

pytestmark = [pytest.mark.slow, pytest.mark.serial]
RAY = str(Path(sys.executable).parent / "ray")
NODE = ["--num-cpus", "1", "--object-store-memory", str(100 * 2**20), "--disable-usage-stats"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    """``ray start --head`` and a second node joining it: two one-CPU workers on this machine."""
    port = _free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    try:
        subprocess.run([RAY, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
                        "--include-dashboard=false", *NODE], check=True, capture_output=True, env=env, timeout=120)
        subprocess.run([RAY, "start", "--address", f"127.0.0.1:{port}", "--node-ip-address", "127.0.0.1", *NODE],
                       check=True, capture_output=True, env=env, timeout=120)
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, env=env, timeout=120)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    return planned_here(tmp_path_factory.mktemp("reference") / "reference.parquet")


def _ray_workers_planning() -> list[int]:
    return [int(p.name) for p in Path("/proc").glob("[0-9]*") if _cmdline(int(p.name)).startswith("ray::evaluate_batch")]


def test_a_search_on_ray_with_a_worker_killed_mid_task_equals_the_undisturbed_one(cluster, reference, tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE_YAML)
    calm, hit = tmp_path / "calm.parquet", tmp_path / "hit.parquet"
    r = subprocess.run([APMW, "search", str(SPEC), "--space", str(space), "--ray", cluster, "--parquet", str(calm),
                        "--json"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    _same_table(calm, reference)
    proc = subprocess.Popen([APMW, "search", str(SPEC), "--space", str(space), "--ray", cluster, "--parquet", str(hit),
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    busy: list[int] = []
    deadline = time.monotonic() + 300
    while not busy and time.monotonic() < deadline and proc.poll() is None:
        busy = _ray_workers_planning()
        time.sleep(0.05)
    assert busy, "no Ray worker was seen planning"
    os.kill(busy[0], signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr
    d = json.loads(stdout)                              # stdout stays one JSON document
    assert d["evaluated"] == 48
    _same_table(hit, reference)


def test_a_cluster_address_where_nothing_answers_is_a_clear_error(tmp_path):
    r = subprocess.run([APMW, "search", str(EXAMPLES / "support-chat.yaml"), "--ray", f"127.0.0.1:{_free_port()}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "nothing answers there" in r.stderr and "Traceback" not in r.stderr
