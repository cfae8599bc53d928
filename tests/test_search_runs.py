"""apmw search runs: the same rows in this process, on a process pool and on Ray; every point saved to
Parquet as it arrives; an interrupted search resumed; a worker killed mid-search replaced."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from apmw.design_search import ResultStore, search, search_key, spec_document
from apmw.design_search.store import META_KEY
from apmw.spec import load_spec
from tests.conftest import EXAMPLES
from tests.e2e.test_cli import APMW

SPEC = EXAMPLES / "support-chat.yaml"
AXES = {"hardware.gpus_per_replica": [1, 2, 4, 8], "serving.max_batch": [32, 64, 128, 192, 256, 512],
        "serving.engine": ["vllm", "sglang"]}
# The interrupted search's space: twice as many points, so that after its first part is saved (64 rows or
# 2 s in) seconds of planning are left for the interrupt to land in, however fast the machine plans.
LONG_AXES = {**AXES, "serving.kv_memory_fraction": [0.85, 0.9]}


def _space_yaml(axes: dict) -> str:
    return "axes:\n" + "".join(f"  {k}: [{', '.join(map(str, v))}]\n" for k, v in axes.items())


SPACE_YAML = _space_yaml(AXES)


def planned_here(out: Path, axes: dict = AXES) -> Path:
    """The undisturbed search, planned in this process, as its Parquet file ``out``."""
    spec = load_spec(SPEC)
    store = ResultStore(out, search_key(spec_document(spec), axes), axes)
    answer = search(spec, axes, store=store)
    store.finish(answer.rows)
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    return planned_here(tmp_path_factory.mktemp("reference") / "reference.parquet")


@pytest.fixture()
def space(tmp_path) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(SPACE_YAML)
    return path


def _same_table(a: Path, b: Path) -> None:
    ta, tb = pq.read_table(a), pq.read_table(b)
    assert ta.schema.metadata[META_KEY] == tb.schema.metadata[META_KEY]
    assert ta.to_pylist() == tb.to_pylist()


def test_the_parquet_holds_every_point_typed_with_its_reason_or_figures(reference, space, tmp_path):
    out, table_csv = tmp_path / "points.parquet", tmp_path / "points.csv"
    r = subprocess.run([APMW, "search", str(SPEC), "--space", str(space), "--workers", "1", "--parquet", str(out),
                        "--csv", str(table_csv), "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    _same_table(out, reference)
    t = pq.read_table(out)
    assert t.num_rows == 48 and t.column("point").to_pylist() == list(range(48))
    assert t.schema.field("hardware.gpus_per_replica").type == pa.int64()
    assert t.schema.field("serving.engine").type == pa.string()
    assert t.schema.field("agents_per_mw").type == pa.float64()
    rows = t.to_pylist()
    pruned = [row for row in rows if row["status"] == "pruned"]
    assert pruned and all(row["reason"] and row["message"] and row["agents_per_mw"] is None for row in pruned)
    assert all(row["hardware.gpus_per_replica"] == 1 for row in pruned)     # one GPU holds no session's KV
    feasible = [row for row in rows if row["status"] == "feasible"]
    assert all(row["agents_per_replica"] > 0 and row["launch"] for row in feasible)
    assert json.loads(t.schema.metadata[META_KEY])["axes"] == AXES
    d = json.loads(r.stdout)
    assert (d["evaluated"], d["feasible"], d["resumed_points"]) == (48, len(feasible), 0)
    with table_csv.open() as f:
        lines = list(csv.DictReader(f))
    assert len(lines) == 48 and [int(x["point"]) for x in lines] == list(range(48))
    assert set(lines[0]) == set(t.schema.names) - {"checked"}
    assert float(lines[-1]["agents_per_mw"]) == pytest.approx(rows[-1]["agents_per_mw"])
    assert not out.with_name(out.name + ".parts").exists()


def test_the_process_pool_gives_the_rows_this_process_gives(reference):
    answer = search(load_spec(SPEC), AXES, workers=2)
    assert answer.rows == pq.read_table(reference, columns=list(answer.rows[0])).to_pylist()


@pytest.mark.slow
def test_an_interrupted_search_resumes_where_it_stopped_and_ends_with_the_same_answer(tmp_path):
    space = tmp_path / "long.yaml"
    space.write_text(_space_yaml(LONG_AXES))
    total = 2 * 48
    reference = planned_here(tmp_path / "reference.parquet", LONG_AXES)
    out = tmp_path / "points.parquet"
    parts = out.with_name(out.name + ".parts")
    cmd = [APMW, "search", str(SPEC), "--space", str(space), "--workers", "1", "--parquet", str(out), "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(parts.glob("part-*.parquet")) and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "--resume" in stderr and not out.exists()
    saved = sum(pq.read_metadata(f).num_rows for f in parts.glob("part-*.parquet"))
    assert 0 < saved < total
    r = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["resumed_points"] >= saved
    _same_table(out, reference)
    assert not parts.exists()
    # resuming a finished search plans nothing more
    again = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and json.loads(again.stdout)["resumed_points"] == total


def test_resume_refuses_the_results_of_another_space_and_needs_the_file(space, tmp_path):
    out = tmp_path / "points.parquet"
    other = tmp_path / "other.yaml"
    other.write_text("axes:\n  serving.max_batch: [64, 128]\n")
    r = subprocess.run([APMW, "search", str(SPEC), "--space", str(other), "--parquet", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([APMW, "search", str(SPEC), "--space", str(space), "--parquet", str(out), "--resume"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "another spec or space" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([APMW, "search", str(SPEC), "--space", str(space), "--resume"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "--parquet" in r.stderr


@pytest.mark.parametrize("change,said", [
    ({"settings": "{not json"}, "are not JSON"),
    ({"point": 999}, "is not a point of this space"),
    ({"settings": json.dumps({"hardware.gpus_per_replica": 3})}, "are not that point's"),
    ({"status": "weird"}, "neither 'feasible' nor 'pruned'"),
    ({"status": "feasible", "agents_per_mw": float("nan")}, "agents_per_mw is nan"),
    ({"status": "feasible", "agents_per_replica": None}, "agents_per_replica is None"),
])
def test_resume_refuses_a_row_the_search_did_not_write_and_says_which(reference, tmp_path, change, said):
    """A results file whose rows were changed after the search wrote them (a fuzzed file gave exit 70, or NaN and
    points of no space in the answer): refused, naming the file, the row and what is wrong, and left as it was."""
    table = pq.read_table(reference)
    rows = table.to_pylist()
    feasible = next(i for i, r in enumerate(rows) if r["status"] == "feasible")
    rows[feasible].update(change)
    out = tmp_path / "tampered.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), out)
    before = out.read_bytes()
    space = tmp_path / "space.yaml"
    space.write_text(SPACE_YAML)
    r = subprocess.run([APMW, "search", str(SPEC), "--space", str(space), "--parquet", str(out), "--resume"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{out}: row {feasible + 1}" in r.stderr and said in r.stderr
    assert out.read_bytes() == before


@pytest.mark.parametrize("metadata", [b"not json", b"[]", b"5", b"null"])
def test_resume_refuses_a_file_whose_search_key_is_unreadable(reference, tmp_path, metadata):
    """Metadata that is not the search's JSON object (fuzzing: exit 70) is another search's file, not a crash."""
    out = tmp_path / "foreign.parquet"
    pq.write_table(pq.read_table(reference).replace_schema_metadata({META_KEY: metadata}), out)
    space = tmp_path / "space.yaml"
    space.write_text(SPACE_YAML)
    r = subprocess.run([APMW, "search", str(SPEC), "--space", str(space), "--parquet", str(out), "--resume"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{out} holds the results of another spec or space" in r.stderr


def test_resume_names_the_columns_a_results_file_lacks(reference, tmp_path):
    out = tmp_path / "short.parquet"
    pq.write_table(pq.read_table(reference).drop(["agents_per_mw"]), out)
    space = tmp_path / "space.yaml"
    space.write_text(SPACE_YAML)
    r = subprocess.run([APMW, "search", str(SPEC), "--space", str(space), "--parquet", str(out), "--resume"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{out}: not a search's results: it has no column agents_per_mw;" in " ".join(r.stderr.split())


def test_a_file_where_the_parts_folder_goes_is_refused_before_planning(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("axes:\n  serving.max_batch: [64, 128]\n")
    out = tmp_path / "points.parquet"
    (tmp_path / "points.parquet.parts").write_text("x\n")
    r = subprocess.run([APMW, "search", str(SPEC), "--space", str(space), "--parquet", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "points.parquet.parts: cannot hold the search's parts there (it is a file)" in " ".join(r.stderr.split())
    assert not out.exists()


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.slow
def test_a_pool_worker_killed_mid_search_is_replaced_and_nothing_is_lost_or_counted_twice(tmp_path):
    # the longer space, so that the pool is still planning a moment after its workers start
    space = tmp_path / "long.yaml"
    space.write_text(_space_yaml(LONG_AXES))
    reference = planned_here(tmp_path / "reference.parquet", LONG_AXES)
    out = tmp_path / "points.parquet"
    proc = subprocess.Popen([APMW, "search", str(SPEC), "--space", str(space), "--workers", "2", "--parquet", str(out),
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def pool_workers() -> list[int]:
        servers = [p for p in _children(proc.pid) if "forkserver" in _cmdline(p)]
        return [w for s in servers for w in _children(s)]

    deadline = time.monotonic() + 60
    while not pool_workers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool_workers(), "no pool worker started"
    time.sleep(0.2)            # the workers have taken their first batches
    alive = pool_workers()
    assert alive and proc.poll() is None, "the search ended before a worker could be killed"
    os.kill(alive[0], signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert json.loads(stdout)["evaluated"] == 2 * 48
    _same_table(out, reference)


def test_a_resumed_search_keeps_the_simulator_answers_the_earlier_run_wrote(space, tmp_path):
    """Resuming without --check rewrote the checked column empty, with no word (fuzzing, session 43)."""
    out = tmp_path / "points.parquet"
    spec = load_spec(SPEC)
    store = ResultStore(out, search_key(spec_document(spec), AXES), AXES)
    answer = search(spec, AXES, store=store)
    answer_check = {"agents_per_replica": 11, "agents_per_replica_interval": [10, 12],   # as check_front writes one
                    "agents_simulated": [10, 11, 12], "binding_constraint": "slo", "agents_per_mw": 8100.5,
                    "cost_per_session_usd": 0.004, "task_latency_p95_s": 830.0,
                    "task_latency_p95_interval_s": [790.0, None], "completed_tasks": 150}
    store.finish(answer.rows, {2: answer_check})
    r = subprocess.run([APMW, "search", str(SPEC), "--space", str(space), "--parquet", str(out), "--resume"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "1 point(s) checked in the simulator by the earlier run keep their answers" in " ".join(r.stderr.split())
    checked = pq.read_table(out, columns=["point", "checked"]).to_pylist()
    assert [json.loads(c["checked"]) for c in checked if c["checked"]] == [answer_check]
    assert checked[2]["checked"] is not None


def test_a_fresh_search_drops_a_leftover_part_it_cannot_read(space, tmp_path):
    """Starting afresh refused a junk part left in the parts folder ("remove it to start afresh"), although the
    user was starting afresh (fuzzing, session 43)."""
    out = tmp_path / "points.parquet"
    parts = tmp_path / "points.parquet.parts"
    parts.mkdir()
    (parts / "part-000000000-1.parquet").write_text("junk\n")
    r = subprocess.run([APMW, "search", str(SPEC), "--space", str(space), "--parquet", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert pq.read_table(out).num_rows == 48 and not parts.exists()


def test_an_axis_integer_past_int64_is_kept_as_json_text_not_an_internal_error(tmp_path):
    """An axis with 99999999999999999999999 (a pruned point) ended `--parquet` in OverflowError while writing the
    axis column (fuzzing, session 45); it is written as JSON text, exactly, and the other point keeps its row."""
    space = tmp_path / "space.yaml"
    space.write_text("axes:\n  serving.workspace_bytes_per_gpu: [3758096384, 99999999999999999999999]\n")
    out = tmp_path / "points.parquet"
    r = subprocess.run([APMW, "search", str(SPEC), "--space", str(space), "--workers", "1", "--parquet", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    t = pq.read_table(out)
    assert t.schema.field("serving.workspace_bytes_per_gpu").type == pa.string()
    assert t.column("serving.workspace_bytes_per_gpu").to_pylist() == ["3758096384", "99999999999999999999999"]
    assert [row["status"] for row in t.to_pylist()] == ["feasible", "pruned"]
    assert not out.with_name(out.name + ".parts").exists()
