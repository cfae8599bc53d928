"""A results file damaged or edited by hand is refused at its line and field when read back (``apmw bench
--resume``, the summary), never met as a traceback or summed into a wrong figure; found by fuzzing
``apmw bench --resume`` (78 of 431 mutated files crashed it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apmw.loadgen import BenchError, CallResult, RunConfig, slo_dict, workload_dict
from apmw.loadgen.bench import config_from_file
from apmw.loadgen.results import read_records, summarise
from apmw.spec import spec_from_dict
from tests.conftest import small_spec_dict


def _records() -> list[dict]:
    """One short segment, each record built as the runner builds it (RunConfig.record, CallResult.record)."""
    spec = spec_from_dict(small_spec_dict())
    cfg = RunConfig(endpoint="http://127.0.0.1:8000", model="m", agents=2, duration_s=2.0, warmup_s=0.5, seed=1,
                    workload=workload_dict(spec), slo=slo_dict(spec))
    call = CallResult(ok=True, status=200, ttft_s=0.1, tpot_s=0.01, latency_s=0.5, prompt_tokens=100,
                      output_tokens=20, cached_tokens=50, usage_reported=True, token_times_s=[0.1, 0.11, 0.3])
    call.start_s = 1.0
    base = {"segment": 0, "agents": 2, "agent": 0, "task": 0, "session_id": "r-0-0-0", "warmup": False}
    return [{"type": "run", "segment": 0, "config": cfg.record(), "started_at": "2026-12-07T00:00:00+00:00",
             "token_count_method": "tokenizer-endpoint"},
            {"type": "server", "segment": 0, "t_s": 0.6, "metrics": {"vllm:num_requests_running": 2.0}},
            {"type": "call", **base, "step": 0, "call": 0, "target_prompt_tokens": 100, "target_output_tokens": 20,
             **call.record()},
            {"type": "server", "segment": 0, "t_s": 1.2, "metrics": {"vllm:num_requests_running": 1.0}},
            {"type": "task", **base, "status": "completed", "fault": None, "start_s": 1.0, "end_s": 1.6,
             "latency_s": 0.6, "calls": 1, "steps": 1, "tool_s": 0.1},
            {"type": "end", "segment": 0, "reason": "duration", "elapsed_s": 2.5, "measure_end_s": 2.5}]


def _write(path: Path, records: list[dict]) -> Path:
    """The records as ResultsWriter writes them (one JSON object a line), NaN allowed: a hand edit may put one."""
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_file_as_the_runner_writes_it_is_read_and_summarised(tmp_path):
    p = _write(tmp_path / "r.jsonl", _records())
    assert len(read_records(p)) == 6
    assert summarise(read_records(p))["levels"][0]["calls"] == 1
    assert config_from_file(p).agents == 2


def _set(line: int, path: str, value):
    def edit(records: list[dict]) -> None:
        *outer, last = path.split(".")
        target = records[line]
        for key in outer:
            target = target[key]
        if value is KeyError:
            del target[last]
        else:
            target[last] = value
    return edit


@pytest.mark.parametrize("edit, said", [
    (_set(2, "ttft_s", "x"), r"r.jsonl:3: the call record's ttft_s is 'x' \(input should be a valid number"),
    (_set(2, "start_s", "x"), "r.jsonl:3: the call record's start_s is 'x'"),
    (_set(2, "tpot_s", float("nan")), "r.jsonl:3: the call record's tpot_s is nan"),
    (_set(2, "prompt_tokens", {}), "r.jsonl:3: the call record's prompt_tokens is {}"),
    (_set(2, "prompt_tokens", -5), "r.jsonl:3: the call record's prompt_tokens is -5"),
    (_set(2, "ok", "yes"), "r.jsonl:3: the call record's ok is 'yes'"),
    (_set(2, "token_times_s", [0.1, "x"]), r"r.jsonl:3: the call record's token_times_s.1 is 'x'"),
    (_set(2, "segment", -1), "r.jsonl:3: the call record's segment is -1"),
    (_set(2, "segment", {}), "r.jsonl:3: the call record's segment is {}"),
    (_set(2, "segment", 3), "r.jsonl:3: a call record of segment 3, which no earlier 'run' record opened"),
    (_set(2, "ttft_s", 1e308), r"r.jsonl:3: the call record's ttft_s is 1e\+308 \(input should be less than or equal"),
    (_set(2, "ttft_s", KeyError), "r.jsonl:3: an ok call record without its ttft_s"),
    (_set(2, "prompt_tokens", 10**400), "r.jsonl:3: the call record's prompt_tokens is 1000"),
    (_set(4, "status", "done"), "r.jsonl:5: the task record's status is 'done'"),
    (_set(4, "latency_s", 1e308), "r.jsonl:5: the task record's latency_s is 1e\\+308"),
    (_set(4, "latency_s", None), "r.jsonl:5: the task record's latency_s is None"),
    (_set(4, "end_s", KeyError), "r.jsonl:5: the task record's end_s is missing"),
    (_set(5, "measure_end_s", "x"), "r.jsonl:6: the end record's measure_end_s is 'x'"),
    (_set(1, "metrics", {"running": "x"}), "r.jsonl:2: the server record's metrics.running is 'x'"),
    (_set(0, "config.agents", 0), "r.jsonl:1: the run record's config.agents is 0"),
    (_set(0, "config.duration_s", "2"), "r.jsonl:1: the run record's config.duration_s is '2'"),
    (_set(0, "config.slo.ttft_p95_s", "x"), "r.jsonl:1: the run record's config.slo.ttft_p95_s is 'x'"),
    (_set(0, "config.slo", [1]), r"r.jsonl:1: the run record's config.slo is \[1\]"),
    (_set(0, "config.history", {}), "r.jsonl:1: the run record's config.history is {}"),
    (_set(3, "type", "note"), "r.jsonl:4: a record of type 'note'; apmw bench writes run, call, task, server, end"),
])
def test_a_record_a_reader_cannot_use_is_refused_at_its_line_and_field(tmp_path, edit, said):
    records = _records()
    edit(records)
    p = _write(tmp_path / "r.jsonl", records)
    with pytest.raises(BenchError, match=said) as err:
        read_records(p)
    assert "restore it, remove the line, or start a new --out" in str(err.value)


@pytest.mark.parametrize("line", ['{"type": "call", "segment": 0, "latency_s": 1' + "0" * 5000 + "}",
                                  "[" * 100_000 + "]" * 100_000])
def test_a_line_json_cannot_hold_in_python_is_refused_at_its_line(tmp_path, line):
    """A number past Python's 4,300 digits, or lists nested 100,000 deep: a ValueError and a RecursionError of the
    json module, not a JSONDecodeError."""
    p = tmp_path / "r.jsonl"
    lines = [json.dumps(r) for r in _records()]
    p.write_text("\n".join(lines[:2] + [line] + lines[2:]) + "\n")
    with pytest.raises(BenchError, match="r.jsonl:3: not a JSON object apmw bench writes"):
        read_records(p)


def test_a_field_a_writer_may_leave_out_is_read_at_its_default(tmp_path):
    records = _records()
    del records[2]["prompt_tokens"], records[2]["cached_tokens"]
    level = summarise(read_records(_write(tmp_path / "r.jsonl", records)))["levels"][0]
    assert level["calls"] == 1 and level["prompt_tokens_mean"] is None and level["prefix_hit_rate"] is None
