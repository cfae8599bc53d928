"""Property-based fuzzing of every verb (Hypothesis): a command line built from the verb's own
options (read from the typer app, so a new option is fuzzed without editing this file), each filled
with a hostile but fair value, run in-process through :func:`apmw.cli.main`. The promises:

- the exit code says the class: 0 done, 1 user error, 2 infeasible SLO, 3 a ``--verify`` miss;
  never 70 (a bug) or anything else, and never a traceback;
- it ends: a run past ``LIMIT_S`` is a hang, and fails;
- with ``--json`` and exit 0, the output is JSON with no NaN or Infinity, every number finite and
  non-negative (but for the signed figures in ``SIGNED``), and every p50 <= p95 <= p99.

CI runs 3 examples per verb; ``make fuzz`` APMW_FUZZ_EXAMPLES / 50 (100) per verb.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import signal
import sys
from contextlib import redirect_stderr, redirect_stdout
from unittest import mock

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apmw.cli import _register_verbs, app, main
from tests.conftest import EXAMPLES, ROOT

FIXTURES = ROOT / "tests" / "fixtures"

EXAMPLES_PER_VERB = max(int(os.environ.get("APMW_FUZZ_EXAMPLES", "40")) // 50, 3)
LIMIT_S = 300
EXIT_CODES = {0, 1, 2, 3}
# figures whose sign carries meaning (d log y / d log x)
SIGNED = {"elasticities"}
# per-quantile ratios (simulated p95 / analytic p95, ...): no order between their quantiles
RATIOS = {"simulated_over_analytic"}

_register_verbs()
VERBS = typer.main.get_command(app).commands

NUMBERS = ["0", "-1", "1", "3", "2.5", "1e-300", "1e9", "nan", "inf", "-inf", "9223372036854775808", "",
           "x", "1,000", "0x10"]
WORDS = ["auto", "H20", "H200", "B200", "fp8", "fp3", "vllm", "vLLM", "sglang", "1:10:3", "5:1:1", "0:0:0",
         ":100:", "[red]x[/red]", "a" * 300, "lognormal", "empirical", "otel", "csv", "input_tokens=x"]
MODELS = ["meta-llama/Meta-Llama-3.1-8B", "deepseek-ai/DeepSeek-V3", "Qwen/Qwen3-32B", "openai/gpt-oss-120b",
          "no/such-model"]
GPUS = ["H200", "H100", "B200", "A100", "H20", "h200"]
ENDPOINT = "http://127.0.0.1:9/v1"      # a closed port: bench must say it cannot reach it
PATH_OPTIONS = {"--workload-from", "--trace", "--calibration", "--compare-plan", "--history", "--export-from", "--space",
                "--resume"}
OUTPUT_OPTIONS = {"-o", "--out", "--export-path", "--csv", "--parquet", "--html"}
ALWAYS = {   # options given every time, so that a run stays short or reaches past the required ones
    "simulate": {"--duration-s": ["120", "300"]},
    "plan": {"--check-tasks": ["10", "30"]},
    "search": {"--check-tasks": ["10", "30"]},
    "bench": {"--duration-s": ["5"], "--endpoint": [ENDPOINT], "--model": ["m"]},
    "predict": {"--model": MODELS, "--gpu": GPUS, "--isl": ["100", "4000"], "--osl": ["10", "200"]},
}


class Hang(BaseException):
    """Raised by the alarm; a BaseException, so that the CLI's error path cannot turn it into an exit code."""


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, list[str]]:
    d = tmp_path_factory.mktemp("fuzz")
    coding = (EXAMPLES / "coding-agent.yaml").read_text()
    bad = {
        "empty.yaml": b"", "binary.yaml": bytes(range(256)), "list.yaml": b"- 1\n- 2\n", "json.yaml": b"{}",
        "half.yaml": coding[: len(coding) // 2].encode(), "not-gzip.jsonl.gz": b"not gzip",
        "truncated.jsonl.gz": gzip.compress((FIXTURES / "traces" / "otel_genai.jsonl").read_bytes())[:200],
        "config.json": b'{"architectures": ["X"], "hidden_size": -1}',
    }
    for name, data in bad.items():
        (d / name).write_bytes(data)
    (d / "a-directory").mkdir()
    hostile = [str(d / n) for n in bad] + [str(d / "a-directory"), str(d / "missing.yaml")]
    traces = sorted(str(p) for p in (FIXTURES / "traces").iterdir() if p.suffix in (".csv", ".jsonl"))
    specs = [str(EXAMPLES / f"{n}.yaml") for n in ("support-chat", "coding-agent", "deep-research")]
    return {"cwd": [str(d)], "spec": specs + hostile + traces[:1], "trace": traces + hostile + specs[:1],
            "config": MODELS + hostile, "out": [str(d / "out.html"), str(d / "a-directory"),
                                                str(d / "no" / "such" / "dir" / "x")]}


def _argv(data, verb: str, files: dict) -> list[str]:
    cmd = VERBS[verb]
    argv = [verb]
    for p in cmd.params:
        if p.param_type_name != "argument":
            continue
        pool = files["trace"] if p.name == "trace" else files["config"] if p.name == "config" else files["spec"]
        count = data.draw(st.integers(1, 3)) if p.nargs == -1 else data.draw(st.integers(0 if not p.required else 1, 1))
        argv += [data.draw(st.sampled_from(pool)) for _ in range(count)]
    options = [p for p in cmd.params if p.param_type_name == "option" and p.opts[0] not in ALWAYS.get(verb, {})]
    chosen = data.draw(st.lists(st.sampled_from(options), unique_by=lambda p: p.name, max_size=4)) if options else []
    for name, pool in ALWAYS.get(verb, {}).items():
        argv += [name, data.draw(st.sampled_from(pool + NUMBERS[:3]))]
    for p in chosen:
        flag = p.opts[0]
        if p.is_flag:
            argv.append(flag)
        elif flag in OUTPUT_OPTIONS:
            argv += [flag, data.draw(st.sampled_from(files["out"]))]
        elif flag in PATH_OPTIONS:
            argv += [flag, data.draw(st.sampled_from(files["trace"] + files["spec"]))]
        else:
            argv += [flag, data.draw(st.sampled_from(NUMBERS + WORDS))]
    return argv


def _run(argv: list[str], cwd: str) -> tuple[int, str, str]:
    """``apmw ARGV`` in-process, in ``cwd`` (default output files such as report.html land there)."""
    out, err = io.StringIO(), io.StringIO()

    def alarm(*_):
        raise Hang(f"apmw {' '.join(argv)} ran past {LIMIT_S} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(LIMIT_S)
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with redirect_stdout(out), redirect_stderr(err), mock.patch.object(sys, "argv", ["apmw", *argv]):
            try:
                main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.chdir(here)
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return code, out.getvalue(), err.getvalue()


def _no_constant(name: str):
    raise AssertionError(f"--json wrote {name}, which is not JSON")


def _sound(node, path: str = "", ordered: bool = True) -> None:
    if isinstance(node, dict):
        quantiles = [node.get(k) for k in ("p50", "p95", "p99")]
        if ordered and all(isinstance(q, (int, float)) for q in quantiles):
            assert quantiles == sorted(quantiles), (path, node)
        for key, value in node.items():
            if key not in SIGNED:
                _sound(value, f"{path}.{key}", key not in RATIOS)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _sound(value, f"{path}[{i}]", ordered)
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        assert math.isfinite(node) and node >= 0, (path, node)


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_any_command_line_exits_by_class_and_prints_sound_json(verb, files):
    @settings(max_examples=EXAMPLES_PER_VERB, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def check(data):
        argv = _argv(data, verb, files)
        code, out, err = _run(argv, files["cwd"][0])
        where = f"apmw {' '.join(argv)} -> exit {code}\n{err[-2000:]}"
        assert code in EXIT_CODES, where
        assert "Traceback" not in out + err, where
        if code == 0 and "--json" in argv and out.strip():
            _sound(json.loads(out, parse_constant=_no_constant))

    check()
