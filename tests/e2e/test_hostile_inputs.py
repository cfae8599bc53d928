"""Reproducers of what fuzzing found (issue 23): each hostile input gets a clear one-line error and
the exit code of its class, never a traceback, a hang or a silently wrong answer."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.conftest import EXAMPLES
from tests.e2e.test_cli import APMW


def with_first_call(text: str, value: str) -> str:
    """``text`` with its workload's ``first_call_input_tokens`` (on one line or a block) set to ``value``."""
    out = re.sub(r"^  first_call_input_tokens:.*\n(?:    .*\n)*", f"  first_call_input_tokens: {value}\n", text,
                 count=1, flags=re.M)
    assert out != text
    return out


CODING = (EXAMPLES / "coding-agent.yaml").read_text()


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([APMW, *args], capture_output=True, text=True, timeout=timeout)


def _plan_text(tmp_path, text: str | bytes) -> subprocess.CompletedProcess:
    path = tmp_path / "spec.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return _run("plan", str(path))


def _clean(r: subprocess.CompletedProcess, code: int = 1) -> str:
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr
    assert r.returncode == code, (r.returncode, r.stderr)
    return " ".join(r.stderr.split())


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32"])
def test_a_spec_in_utf16_or_utf32_with_its_byte_order_mark_is_read(tmp_path, encoding):
    """YAML reads UTF-16 and UTF-32 that start with a byte-order mark, as Windows tools write them; apmw refused
    them with "byte 0xff is not UTF-8"."""
    text = CODING.encode(encoding) if encoding != "utf-16-be" else b"\xfe\xff" + CODING.encode(encoding)
    r = _plan_text(tmp_path, text)
    assert r.returncode == 0, r.stderr


def test_a_spec_in_utf16_without_a_byte_order_mark_is_refused_saying_how_to_convert_it(tmp_path):
    said = _clean(_plan_text(tmp_path, CODING.encode("utf-16-le")))
    assert "NUL bytes beside its first letters: UTF-16 or UTF-32 text without a byte-order mark" in said
    assert "iconv -f UTF-16LE -t UTF-8" in said


def _alias_bomb(depth: int, width: int) -> str:
    lines = ["a0: &a0 [" + ",".join(["x"] * width) + "]"]
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]" for i in range(1, depth)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text,words", [
    (CODING.encode() + b"# caf\xe9\n", "byte 0xe9 is not UTF-8"),
    ("loop: &a [1, *a]\n", "refers to its own anchor"),
    # at the anchor's own line, not the document's first (fuzzing, session 45)
    (CODING + "loop: &a [1, *a]\n", f"line {CODING.count(chr(10)) + 1}, column 7: an alias refers to its own anchor"),
    ("base: &b {x: 1}\nmore:\n  <<: *b\n  y: 2\n", "line 3, column 3: a YAML merge key (<<: *name) is not read here"),
    ("x: " + "[" * 1000 + "]" * 1000 + "\n", "nested more than"),
    (CODING.replace("gpus_per_replica: 8", "gpus_per_replica: 8\n  gpus_per_replica: 1"),
     "'gpus_per_replica' is given twice (first on line"),
    (CODING.replace("task_latency_p95_s: 1800", "task_latency_p95_s: .inf"), "finite number"),
    (CODING.replace("pue: 1.3", "pue: .nan"), "finite number"),
    (CODING.replace("  max_batch: 256", "  engine: llamacpp\n  overlap_scheduling: true\n  max_batch: 256")
     .replace("tool_wait_kv_policy: retain", "tool_wait_kv_policy: evict"),
     "engine llamacpp forms each batch after the last one ends (no overlap scheduling)"),
    # FlashInfer's MXFP4 kernel choice changed a llama.cpp answer 39 -> 53 agents (fuzzing, session 43)
    (CODING.replace("  max_batch: 256", "  engine: llamacpp\n  mxfp4_moe_activations: mxfp8\n  max_batch: 256")
     .replace("tool_wait_kv_policy: retain", "tool_wait_kv_policy: evict"),
     "engine llamacpp runs its own: leave mxfp4_moe_activations out"),
    # YAML reads these as line breaks: the rest of the comment was parsed, and the error named line 20 (fuzzing,
    # session 52)
    ("# note\u2028see below\n" + CODING, "line 1, column 7: character U+2028 (line separator), which YAML reads"),
    (CODING.replace("gpus_per_replica: 8", "gpus_per_replica: 8  # eight\x85GPUs"), "character U+0085 (next line)"),
    (CODING.replace("gpus_per_replica: 8", "gpus_per_replica: 010"),
     "'010' has a leading zero, which YAML 1.1 reads as octal (010 is 8)"),
    # YAML 1.1-only numbers, read as numbers where the README says YAML 1.2 (fuzz round 6)
    (CODING.replace("task_latency_p95_s: 1800", "task_latency_p95_s: 0b11100001000"),
     "'0b11100001000' is a number only in YAML 1.1"),
    (CODING.replace("task_latency_p95_s: 1800", "task_latency_p95_s: 1_800"), "'1_800' is a number only in YAML 1.1"),
    (CODING.replace("kv_memory_fraction: 0.9", "kv_memory_fraction: 0.9_0"), "'0.9_0' is a number only in YAML 1.1"),
    (CODING.replace("config: deepseek-ai/DeepSeek-V3", "config: " + "a" * 300), "unknown model"),
    (CODING.replace("config: deepseek-ai/DeepSeek-V3", 'config: "~0"'), "unknown model '~0'"),
    (CODING.replace("target_agents: 10000", "target_agents: " + "9" * 400), "fleet.target_agents"),
    # past the digits Python converts: a ValueError from the YAML reader (fuzzing, session 52)
    (CODING.replace("target_agents: 10000", "target_agents: " + "9" * 5000),
     "a whole number written in 5,000 characters: no field takes one so large"),
    (CODING.replace("max_batch: 256", "max_batch: 1000000000000"), "max_batch"),
    (CODING.replace(CODING[CODING.index("  tool_wait_s:"):CODING.index("model:")], "  tool_wait_s: {p50: 3600, p95: 1.0e8}\n"),
     "at most 604,800 s (a week) is modelled"),
    (CODING.replace(CODING[CODING.index("  tool_wait_s:"):CODING.index("model:")], "  tool_wait_s: {p50: 0.26, p95: 1.0e28}\n"),
     "a lognormal that wide"),
    (CODING.replace("{input: 0.27, cached_input: 0.07", "{input: 0.07, cached_input: 0.27"),
     "cost.api_usd_per_million_tokens.cached_input: 0.27 is above input (0.07)"),
    (CODING.replace("config: deepseek-ai/DeepSeek-V3", "config: meta-llama/Meta-Llama-3.1-8B\n  moe_dtype: fp8"),
     "moe_dtype 'fp8' is set, but meta-llama/Meta-Llama-3.1-8B has no routed experts"),
    (CODING.replace("  calls_per_step: 1\n", "  calls_per_step: 1\n  summarize_at_tokens: 1394\n  summary_tokens: 1\n"),
     "summarize_at_tokens: 1394 would write about 11,965 summaries a task"),
    (CODING.replace("prefix_caching: true", "prefix_caching: 1"), "prefix_caching: 1 is not a yes/no; write true or false"),
    (CODING.replace("prefix_caching: true", 'prefix_caching: "yes"'), "prefix_caching: 'yes' is not a yes/no"),
])
def test_a_hostile_spec_is_refused_with_where_and_why(tmp_path, text, words):
    assert words in _clean(_plan_text(tmp_path, text))


def test_an_alias_bomb_is_refused_or_read_fast(tmp_path):
    # nine aliases nine deep would expand to 9^10 nodes: refused at the first anchor past a million values
    r = _plan_text(tmp_path, _alias_bomb(10, 9))
    assert "line 7, column 5: its aliases (*name) repeat one another into more than 1,000,000 values" in _clean(r)
    many = "".join(f"k{i}: &k{i} 1\n" for i in range(200)) + "".join(f"v{i}: *k{i}\n" for i in range(200))
    assert "more than 100 aliases" in _clean(_plan_text(tmp_path, many))


def test_an_alias_bomb_in_a_search_space_is_refused_at_once(tmp_path):
    """An alias chain inside one axis' values is a space of nine points whose values the space reader walked alias
    by alias (10^8 in the last): `apmw search` hung (fuzz round 5). Every YAML file apmw reads is refused there."""
    space = tmp_path / "space.yaml"
    values = ["[" + ",".join(["1"] * 10) + "]"] + ["[" + ",".join([f"*x{i - 1}"] * 10) + "]" for i in range(1, 9)]
    space.write_text("axes:\n  serving.max_batch:\n" + "".join(f"    - &x{i} {v}\n" for i, v in enumerate(values)))
    said = _clean(_run("search", str(EXAMPLES / "support-chat.yaml"), "--space", str(space)))
    assert "invalid search space" in said and "more than 1,000,000 values" in said


def test_a_task_of_a_million_calls_is_refused_before_any_work(tmp_path):
    text = CODING.replace("calls_per_step: 1", "calls_per_step: 9223372036854775808")
    assert "calls per task" in _clean(_plan_text(tmp_path, text))


@pytest.mark.parametrize("flag,value,words", [
    ("--request-overhead-ms", "nan", "--request-overhead-ms must be a non-negative number"),
    ("--max-batch", "0", "--max-batch must be at least 1"),
    ("--max-batch", "100000", "--max-batch: Input should be less than or equal to 65536 (got 100000)"),
    ("--length-spread", "nan", "--length-spread must be between 0 and 2"),
    ("--kv-memory-fraction", "nan", "--kv-memory-fraction must be in (0, 1]"),
])
def test_predict_refuses_numbers_it_cannot_price(flag, value, words):
    r = _run("predict", "--model", "meta-llama/Meta-Llama-3.1-8B", "--gpu", "H200", "--isl", "100", "--osl", "10",
             "--concurrency", "4", flag, value)
    assert words in _clean(r)


def test_parser_errors_are_user_errors_not_the_infeasible_code():
    assert "No such option" in _clean(_run("plan", str(EXAMPLES / "coding-agent.yaml"), "--bogus"))
    assert "Missing argument" in _clean(_run("plan"))
    v = _run("--version")
    assert v.returncode == 0 and v.stdout.startswith("apmw ")


def test_messages_are_printed_as_written(tmp_path):
    """A path holding rich markup or an emoji code (':100:') is printed as written."""
    weird = tmp_path / "[bold]x[/]:100:.yaml"
    r = _run("plan", str(weird))
    assert f"{weird}: invalid spec" in " ".join(_clean(r).split()) or str(weird) in r.stderr
    assert "💯" not in r.stderr and "[bold]x[/]:100:" in r.stderr
    help_text = _run("simulate", "--help").stdout
    assert "a:b[:step]" in help_text and "🅱" not in help_text


def test_engine_spellings_and_typos_get_did_you_mean(tmp_path):
    text = (CODING.replace("max_batch: 256", "max_num_seqs: 256")
            .replace("gpus_per_replica: 8", "tensor_parallel_size: 8").replace("pue: 1.3", "peu: 1.3"))
    msg = _clean(_plan_text(tmp_path, text))
    assert "did you mean hardware.gpus_per_replica? (tensor_parallel_size is how vLLM spells it)" in msg
    assert "did you mean serving.max_batch? (max_num_seqs is how vLLM spells it)" in msg
    assert "power.peu: unknown field; did you mean power.pue?" in msg


def test_an_unknown_gpu_names_the_custom_gpu_form(tmp_path):
    msg = _clean(_plan_text(tmp_path, CODING.replace("gpu: H200", "gpu: H2000")))
    assert "unknown GPU 'H2000'" in msg and "hardware.gpu: {hbm_bytes" in msg and "a custom GPU" in msg


def test_a_power_capped_gpu_draws_no_more_than_its_cap():
    from apmw.perf import resolve_gpu
    from apmw.spec import GpuOverride

    capped = resolve_gpu(GpuOverride(name="H100", tdp_w=400))
    assert capped.busy_power_w <= 400 and "scaled to the overridden tdp_w" in capped.power_source
    with pytest.raises(Exception, match="exceeds tdp_w"):
        resolve_gpu(GpuOverride(name="H100", busy_power_w=900))


TRACES = EXAMPLES.parent / "tests" / "fixtures" / "traces" if (EXAMPLES.parent / "tests").is_dir() else None


def _trace_lines() -> list[bytes]:
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "mini_swe_calls_3sessions.csv"
    return path.read_bytes().splitlines(keepends=True)


def _fit(tmp_path, name: str, data: bytes, *flags: str) -> subprocess.CompletedProcess:
    path = tmp_path / name
    path.write_bytes(data)
    return _run("fit", str(path), "--json", *flags)


def test_a_csv_line_that_is_not_utf8_is_skipped_and_counted(tmp_path):
    import json

    lines = _trace_lines()
    clean = json.loads(_fit(tmp_path, "clean.csv", b"".join(lines)).stdout)
    broken = lines[:5] + [lines[5].replace(b",", b"\xe9,", 1)] + lines[6:]
    r = _fit(tmp_path, "calls.csv", b"".join(broken))
    _clean(r, 0)
    d = json.loads(r.stdout)
    assert d["skipped_lines"] == clean["skipped_lines"] + 1
    assert any("not UTF-8" in reason for reason in d["skipped"])
    strict = _fit(tmp_path, "calls.csv", b"".join(broken), "--strict")
    assert "calls.csv:6: bytes that are not UTF-8" in _clean(strict)


def test_an_oversized_field_or_bare_carriage_return_costs_its_line_only(tmp_path):
    import json

    lines = _trace_lines()
    huge = lines[:4] + [lines[4].rstrip(b"\r\n") + b"," + b"x" * 200_000 + b"\n"] + lines[5:]
    r = _fit(tmp_path, "huge.csv", b"".join(huge))
    _clean(r, 0)
    assert json.loads(r.stdout)["skipped_lines"] >= 1
    cr = lines[:4] + [lines[4].replace(b",", b",1\r2", 1)] + lines[5:]
    _clean(_fit(tmp_path, "cr.csv", b"".join(cr)), 0)


def test_a_gz_that_is_not_gzip_or_is_truncated_names_the_file(tmp_path):
    import gzip

    assert "gzip" in _clean(_fit(tmp_path, "calls.csv.gz", b"".join(_trace_lines())))
    whole = gzip.compress(b"".join(_trace_lines() * 50))
    msg = _clean(_fit(tmp_path, "cut.csv.gz", whole[: len(whole) // 2]))
    assert "cut.csv.gz" in msg and "truncated" in msg


def test_an_azure_trace_with_a_blank_header_says_which_columns_are_missing(tmp_path):
    msg = _clean(_run("fit", str(_write(tmp_path, "AzureLLMInferenceTrace_code.csv", b"\n2023-11-16 18:17:03,4,5\n")),
                      "--format", "azure"))
    assert "TIMESTAMP" in msg and "Azure" in msg


def _write(tmp_path, name: str, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_a_mooncake_line_with_a_nested_hash_id_is_skipped_and_counted(tmp_path):
    import json
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "mooncake_conversation_head200.jsonl"
    lines = src.read_text().splitlines()
    bad = json.loads(lines[3])
    bad["hash_ids"] = [bad["hash_ids"][0], [1, 2]]
    lines[3] = json.dumps(bad)
    r = _fit(tmp_path, "mooncake.jsonl", ("\n".join(lines) + "\n").encode())
    _clean(r, 0)
    d = json.loads(r.stdout)
    assert d["skipped"]["hash_ids must be a list of block ids (integers)"]["examples"] == [f"{tmp_path}/mooncake.jsonl:4"]


def test_an_empty_mapped_start_cell_is_counted_not_guessed(tmp_path):
    trace = tmp_path / "calls.csv"
    trace.write_text("sid,inp,out,t0,t1\na,100,10,0,1000\na,200,10,,3000\na,300,10,5000,6000\n"
                     "b,100,10,0,500\nb,200,10,1500,2000\n")
    r = _run("fit", str(trace), "--format", "csv", "--json",
             "--map", "session=sid,input_tokens=inp,output_tokens=out,start_ms=t0,end_ms=t1")
    _clean(r, 0)
    summary = json.loads(r.stdout)
    assert summary["calls_missing_time"] == {"start": 1}
    assert any("1 of 5 call(s) have no start time" in n for n in summary["notes"])


@pytest.mark.parametrize("example", ["support-chat", "deep-research"])
def test_a_first_call_of_no_new_tokens_simulates(tmp_path, example):
    # the whole prompt is the shared system prompt: a prefix hit must still leave a token to compute
    text = (EXAMPLES / f"{example}.yaml").read_text()
    text = with_first_call(text, "0")
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    r = _run("simulate", str(path), "--agents", "4", "--duration-s", "600", "--json")
    _clean(r, 0)
    assert json.loads(r.stdout)["completed_tasks"] > 0


@pytest.mark.parametrize("args,words", [
    (["report", str(EXAMPLES / "support-chat.yaml"), "-o", "{dir}"], "-o {dir} is a folder; give a file path inside "
     "it, e.g. {dir}/report.html"),
    (["fleet", str(EXAMPLES / "coding-agent.yaml"), "--csv", "-"], "--csv -: this output is written to a file"),
    (["fit", str(EXAMPLES.parent / "tests" / "fixtures" / "traces" / "otel_genai.jsonl"), "-o", "{dir}"],
     "-o {dir} is a folder"),
    (["fit", str(EXAMPLES.parent / "tests" / "fixtures" / "traces" / "otel_genai.jsonl"), "--export", "aiperf",
      "--export-path", "{dir}/no/x.jsonl"], "the folder {dir}/no does not exist"),
    (["bench", str(EXAMPLES / "support-chat.yaml"), "--model", "m", "--out", "{dir}"], "--out {dir} is a folder"),
    # a folder that exists but takes no new file (/proc's): refused before the report is built
    (["report", str(EXAMPLES / "support-chat.yaml"), "--no-simulate", "-o", "/proc/self/r.html"],
     "-o /proc/self/r.html: cannot write there"),
    (["bench", str(EXAMPLES / "support-chat.yaml"), "--model", "m", "--resume", "--out", "{dir}/binary.jsonl"],
     "binary.jsonl:2: byte 0x80 is not UTF-8"),
    (["simulate", str(EXAMPLES / "support-chat.yaml"), "--agents", "4", "--duration-s", "1e9"], "at most 604,800 s"),
    (["simulate", str(EXAMPLES / "support-chat.yaml"), "--agents", "1000000"], "at most 65,536 sequences"),
    (["simulate", str(EXAMPLES / "support-chat.yaml"), "--agents-sweep", "1:100000:1"], "at most 100 are simulated"),
])
def test_work_and_output_paths_are_checked_before_any_work(tmp_path, args, words):
    (tmp_path / "binary.jsonl").write_bytes(bytes(range(256)))
    r = _run(*[a.replace("{dir}", str(tmp_path)) for a in args], timeout=30)
    assert words.replace("{dir}", str(tmp_path)) in _clean(r)


@pytest.mark.parametrize("args", [
    ["report", str(EXAMPLES / "support-chat.yaml"), "--no-simulate", "-o", "{dir}/new/"],
    ["fit", str(EXAMPLES.parent / "tests" / "fixtures" / "traces" / "otel_genai.jsonl"), "-o", "{dir}/new/"],
    ["fleet", str(EXAMPLES / "coding-agent.yaml"), "--csv", "{dir}/new/"],
    ["search", str(EXAMPLES / "support-chat.yaml"), "--html", "{dir}/new/"],
    ["bench", str(EXAMPLES / "support-chat.yaml"), "--model", "m", "--out", "{dir}/new/"],
])
def test_an_output_path_that_names_a_folder_by_its_slash_is_refused(tmp_path, args):
    """`-o out/` for a folder not there yet wrote a file named `out` (fuzzing, session 31's list): the path's form
    says a folder, and no file is written."""
    said = _clean(_run(*[a.replace("{dir}", str(tmp_path)) for a in args], timeout=60))
    assert f"{tmp_path}/new/ ends in '/', so it names a folder" in said
    assert list(tmp_path.iterdir()) == []


def test_an_empty_output_path_is_refused(tmp_path):
    said = _clean(subprocess.run([APMW, "report", str(EXAMPLES / "support-chat.yaml"), "--no-simulate", "-o", ""],
                                 capture_output=True, text=True, timeout=60, cwd=tmp_path))
    assert "the path is empty; give a file path" in said and list(tmp_path.iterdir()) == []


def test_report_to_standard_output(tmp_path):
    """`-o -` wrote a file named '-' (fuzzing, session 44): it is the HTML on standard output, and no file."""
    r = subprocess.run([APMW, "report", str(EXAMPLES / "support-chat.yaml"), "--no-simulate",
                        "-o", "-"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("<!DOCTYPE html>") and r.stdout.rstrip().endswith("</html>")
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("fixture,field", [
    ("agentperf_two_tasks.jsonl", "conversation_id"),
    ("aiperf_multi_turn.jsonl", "session_id"),
])
def test_a_session_id_that_is_a_list_costs_its_line_only(tmp_path, fixture, field):
    src = EXAMPLES.parent / "tests" / "fixtures" / "traces" / fixture
    lines = src.read_text().splitlines()
    bad = json.loads(lines[1])
    bad[field] = []
    lines[1] = json.dumps(bad)
    r = _fit(tmp_path, fixture, ("\n".join(lines) + "\n").encode())
    _clean(r, 0)
    d = json.loads(r.stdout)
    assert d["skipped_lines"] == 1 and d["lines_read"] == len(lines)
    (reason,) = d["skipped"]
    assert f"{field} must be a string or a number, got list" in reason


# Session 31's fuzzing run (about 935 hostile inputs over every verb): what ended in an internal error or
# was read silently wrong.
SUPPORT = (EXAMPLES / "support-chat.yaml").read_text()
WAITS = "  tool_wait_s: {p50: 126, p95: 612}"


@pytest.mark.parametrize("text,words", [
    ("workload:\n  ? {x: 1}\n  : 2\n", "a key must be a name or a number, not a list or a map"),
    (SUPPORT.replace(WAITS, "  tool_wait_s: {quantiles: {0.0: 0, 0.5: 26, 0.50: 9000, 0.9: 9000}}"),
     "'0.50' is given twice"),
    (SUPPORT.replace(WAITS, "  tool_wait_s: {mean: true, p95: 3}"), "mean: true is a yes/no, not a number"),
    (SUPPORT.replace(WAITS, "  tool_wait_s: {quantiles: {true: 5, 0.5: 3}}"), "the key true is a yes/no"),
    (CODING.replace("tasks_per_hour: [609,", "tasks_per_hour: [true,"), "line 47: fleet.tasks_per_hour.0: true is a yes/no"),
    (CODING.replace("gpu_hour_usd: 2.5", "gpu_hour_usd: 1.0e+9"), "cost.gpu_hour_usd: Input should be less than"),
    (CODING.replace("pue: 1.3", "pue: 1.0e+300"), "power.pue: Input should be less than or equal to 10"),
    (with_first_call(SUPPORT, "500000"),
     "100.0% of the workload's calls hold more tokens (prompt and output) than meta-llama/Meta-Llama-3.1-70B's "
     "context window of 131,072 tokens"),
    (CODING.replace("  gpu: H200", "  gpu: {name: H200, bf16_flops: 1.0e-300}"),
     "hardware.gpu.bf16_flops: Input should be greater than or equal to 1000000"),
])
def test_what_fuzzing_found_in_specs_is_refused_where_it_is(tmp_path, text, words):
    assert words in _clean(_plan_text(tmp_path, text))


def test_calls_past_the_context_window_are_noted_with_their_share(tmp_path):
    # deep-research without its summaries: its tail of long sessions outgrows gpt-oss-120b's window, priced
    # as if served, and said so; the bundled example summarises at 96,000 tokens, and only its new input's
    # lognormal far tail (about 60,000 tokens at one call in 100,000) carries a call past the window: said, with
    # the cap it already has
    text = (EXAMPLES / "deep-research.yaml").read_text()
    spec = tmp_path / "no-summaries.yaml"
    spec.write_text(text.replace("  summarize_at_tokens: 96000\n", ""))
    r = _run("plan", str(spec), "--analytic", "--json")
    _clean(r, 0)
    (note,) = [w for w in json.loads(r.stdout)["warnings"] if "context window" in w]
    assert re.match(r"\d+\.\d\d% of the sampled calls hold more tokens", note) and "summarize_at_tokens" in note
    bundled = _run("plan", str(EXAMPLES / "deep-research.yaml"), "--analytic", "--json")
    _clean(bundled, 0)
    (note,) = [w for w in json.loads(bundled.stdout)["warnings"] if "context window" in w]
    assert note.startswith("under 0.01% of the sampled calls") and "summarize_at_tokens (96,000)" in note


def test_a_share_past_the_window_too_small_for_two_decimals_is_not_printed_as_zero():
    from dataclasses import replace

    from apmw.capacity.plan import past_window_note, plan
    from apmw.spec import load_spec

    p = plan(load_spec(EXAMPLES / "deep-research.yaml"))
    note = past_window_note(p.replica, replace(p.sample, call_past_window_share=3e-6))
    assert note.startswith("under 0.01% of the sampled calls")


@pytest.mark.parametrize("args,words", [
    (["simulate", str(EXAMPLES / "support-chat.yaml"), "--agents", "2", "--seed", "-1"], "'--seed'"),
    (["plan", str(EXAMPLES / "support-chat.yaml"), "--agents", "100000000"], "less than or equal to 1000000"),
    (["predict", "--model", "meta-llama/Meta-Llama-3.1-8B", "--gpu", "H100", "--isl", "1000", "--osl", "100",
      "--concurrency", "4", "--request-overhead-ms", "inf"], "--request-overhead-ms must be a non-negative number"),
    (["bench", str(EXAMPLES / "support-chat.yaml"), "--endpoint", "http://127.0.0.1:99999", "--model", "m",
      "--duration-s", "1"], "give a port from 1 to 65535"),
    (["bench", str(EXAMPLES / "support-chat.yaml"), "--endpoint", "http://[::1", "--model", "m",
      "--duration-s", "1"], "or an IPv6 one in brackets"),
    (["bench", str(EXAMPLES / "support-chat.yaml"), "--endpoint", "http://[zz]:80", "--model", "m",
      "--duration-s", "1"], "'zz' does not appear to be an IPv4 or IPv6 address"),
    (["fit", str(EXAMPLES.parent / "tests" / "fixtures" / "traces" / "otel_genai.jsonl"), "--export", "aiperf",
      "--export-from", "fitted", "--export-sessions", "100000000"], "less than or equal to 100000"),
])
def test_what_fuzzing_found_in_flags_is_refused(args, words):
    r = _run(*args, timeout=60)
    assert "Traceback" not in r.stderr and r.returncode in (1, 2), (r.returncode, r.stderr)
    assert words in " ".join(r.stderr.split())


@pytest.mark.parametrize("name,data,words", [
    ("cr_only.csv", b"a,b\r1,2\r3,4\r", "not readable as CSV"),
    ("trace.parquet", b"PAR1" + bytes(64) + b"PAR1", "a Parquet file; apmw reads traces as JSONL or CSV"),
])
def test_a_trace_that_is_not_text_lines_is_refused(tmp_path, name, data, words):
    assert words in _clean(_fit(tmp_path, name, data))


def test_search_explain_gives_each_pruned_points_reason_on_its_line(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("axes:\n  serving.max_batch: [0, 64]\n")
    r = _run("search", str(EXAMPLES / "support-chat.yaml"), "--space", str(space), "--explain", timeout=300)
    _clean(r, 2) if r.returncode == 2 else _clean(r, 0)
    (line,) = [x for x in r.stdout.splitlines() if "max_batch=0" in x]
    assert "invalid spec; serving.max_batch: Input should be greater than or equal to 1" in line


# Session 34's fuzzing run (9,331 inputs): four exited 70 (a bug) and several were read silently wrong.
@pytest.mark.parametrize("text,words", [
    (CODING.replace("  pue: 1.3", "  pue: 1.3\n  gpu_idle_power_w: 0\n  gpu_busy_power_w: 5.0e-324\n"
                    "  host_power_w_per_gpu: 0"), "power.gpu_busy_power_w: Input should be greater than or equal to 1"),
    (CODING.replace("  pue: 1.3", "  pue: 1.3\n  gpu_idle_power_w: 5000\n  gpu_busy_power_w: 1"),
     "the GPU's idle draw (5000 W, power.gpu_idle_power_w) exceeds its busy draw (1 W, power.gpu_busy_power_w)"),
    (CODING.replace("  pue: 1.3", "  pue: 1.3\n  gpu_idle_power_w: 5000"),
     "the GPU's idle draw (5000 W, power.gpu_idle_power_w) exceeds its busy draw (700 W, H200-SXM-141GB's)"),
    (CODING.replace("  gpu: H200", "  gpu: {name: H200, idle_power_w: 1000, busy_power_w: 10}"),
     "hardware.gpu: idle_power_w 1000 W is not below busy_power_w 10 W"),
    (CODING.replace("  max_batched_tokens: 8192", "  max_batched_tokens: 1000000000000000000000000000000"),
     "serving.max_batched_tokens: Input should be less than or equal to 1048576"),
    (CODING.replace("  tool_wait_kv_policy: retain", "  tool_wait_kv_policy: offload\n"
                    "  offload_bandwidth_bytes_per_s: 1.0e-300"),
     "serving.offload_bandwidth_bytes_per_s: Input should be greater than or equal to 1000000"),
])
def test_what_fuzzing_found_in_power_and_engine_figures_is_refused(tmp_path, text, words):
    assert words in _clean(_plan_text(tmp_path, text))


@pytest.mark.parametrize("args,words", [
    (["simulate", str(EXAMPLES / "support-chat.yaml"), "--agents-sweep", "1:1000000000:1"],
     "at most 200,000 agents are simulated"),
    (["simulate", str(EXAMPLES / "support-chat.yaml"), "--agents-sweep", "1:1000:1"],
     "has 1,000 points; at most 100 are simulated (each is a full run): use a step of at least 10"),
    (["predict", "--model", "meta-llama/Meta-Llama-3.1-8B", "--gpu", "H100", "--isl", "1000", "--osl", "100",
      "--concurrency", "4", "--token-budget", "99999999999999999999"], "--token-budget: Input should be less than"),
    (["predict", "--model", "meta-llama/Meta-Llama-3.1-8B", "--gpu", "H100", "--isl", "1000", "--osl", "100",
      "--concurrency", "4", "--disagg", "--kv-transfer-gb-per-s", "1e-300"], "(--kv-transfer-gb-per-s 0.001 to 100000)"),
    # said "got 1": the bytes per second of the 1e-9 GB/s given (fuzz round 8)
    (["predict", "--model", "meta-llama/Meta-Llama-3.1-8B", "--gpu", "H100", "--isl", "1000", "--osl", "100",
      "--concurrency", "4", "--disagg", "--kv-transfer-gb-per-s", "1e-9"], "got 1 bytes/s (1e-09 GB/s)"),
    (["predict", "--model", "meta-llama/Meta-Llama-3.1-8B", "--gpu", "H100", "--isl", "1000", "--osl", "100",
      "--concurrency", "1,,2"], "--concurrency: '1,,2' has an empty entry between commas"),
    # answered with a TTFT of 5.5e20 ms before (fuzzing, session 52)
    (["predict", "--model", "meta-llama/Meta-Llama-3.1-8B", "--gpu", "H100", "--isl", "1000", "--osl", "100",
      "--concurrency", "18446744073709551616"], "is past the 1,000,000 clients apmw models on one replica"),
    (["predict", "--model", "meta-llama/Meta-Llama-3.1-8B", "--gpu", "H100", "--isl", "1000", "--osl", "100",
      "--request-rate", "0.5,"], "--request-rate: '0.5,' has an empty entry between commas"),
    (["fit", "/tmp"], "/tmp: is a directory; give one trace file"),
    (["simulate", str(EXAMPLES / "support-chat.yaml"), "--agents", "3", "--trace", "/dev/null"],
     "/dev/null: not a regular file"),
    (["plan", "/dev/null"], "/dev/null: invalid spec not a regular file (give the path of a YAML spec"),
    # session 40's fuzzing: flags that were silently ignored, and a worker count with no upper bound
    (["simulate", str(EXAMPLES / "support-chat.yaml"), "--agents", "2", "--trace-format", "otel"],
     "--trace-format otel applies to --trace TRACE"),
    (["fit", str(EXAMPLES / "support-chat.yaml"), "--export-path", "x.jsonl", "--seed", "3"],
     "--export-path, --seed: apply only with --export aiperf"),
    (["predict", "--model", "meta-llama/Meta-Llama-3.1-8B", "--gpu", "H100", "--isl", "1000", "--osl", "100",
      "--concurrency", "4", "--disagg", "--prefill-workers", "100000"],
     "--prefill-workers 100,000: a disaggregated replica has at most 1,024 prefill workers"),
    (["predict", "--model", "meta-llama/Meta-Llama-3.1-8B", "--gpu", "H100", "--isl", "1000", "--osl", "100",
      "--request-rate", "1e300"], "error: 1e+300 requests/s exceeds the replica's capacity of"),
])
def test_what_fuzzing_found_in_session_34s_flags_is_refused(args, words):
    r = _run(*args, timeout=60)
    assert "Traceback" not in r.stderr and r.returncode == 1, (r.returncode, r.stderr)
    assert words in " ".join(r.stderr.split())


def test_a_number_in_yaml_1_2_exponent_form_is_read_as_the_number(tmp_path):
    """PyYAML reads ``48e6`` and ``1.5e3`` (numbers in YAML 1.2) as text; a number field reads them as numbers."""
    written = _run("plan", str(_write(tmp_path, "e.yaml", CODING.replace("task_latency_p95_s: 1800",
                                                                         "task_latency_p95_s: 1.8e3").encode())),
                   "--analytic", "--json")
    plain = _run("plan", str(_write(tmp_path, "plain.yaml", CODING.encode())), "--analytic", "--json")
    assert written.returncode == 0, written.stderr
    assert json.loads(written.stdout)["agents_per_replica"] == json.loads(plain.stdout)["agents_per_replica"]


def test_an_output_never_replaces_an_input_another_output_or_a_device(tmp_path):
    """Fuzzing (session 38): `report -o SPEC`, `fit -o TRACE`, `fleet --csv SPEC`, `search --html SPACE` each
    replaced their own input; `--csv X --parquet X` kept one of the two; `search --parquet` renamed a file over a
    device and `fleet --parquet` removed one when its write failed. Each is refused before any work, the input
    left as it was; a text output may still go to a device (/dev/null here)."""
    spec = tmp_path / "spec.yaml"
    spec.write_text((EXAMPLES / "support-chat.yaml").read_text())
    space = tmp_path / "space.yaml"
    space.write_text("axes:\n  serving.max_batch: [32, 64]\n")
    trace = tmp_path / "t.jsonl"
    trace.write_bytes((EXAMPLES.parent / "tests" / "fixtures" / "traces" / "otel_genai.jsonl").read_bytes())
    kept = {p: p.read_bytes() for p in (spec, space, trace)}
    for args, said in (
            (("report", str(spec), "--no-simulate", "-o", str(spec)), f"-o {spec} is the input {spec}"),
            (("fit", str(trace), "-o", str(tmp_path / ".." / tmp_path.name / "t.jsonl")), "is the input"),
            (("fleet", str(spec), "--csv", str(spec)), f"--csv {spec} is the input"),
            (("fleet", str(spec), "--csv", str(tmp_path / "x"), "--parquet", str(tmp_path / "x")),
             "--csv and --parquet both write"),
            (("search", str(spec), "--space", str(space), "--html", str(space)), f"--html {space} is the input"),
            (("search", str(spec), "--space", str(space), "--parquet", "/dev/null"), "not a regular file")):
        assert said in _clean(_run(*args)), args
    assert {p: p.read_bytes() for p in kept} == kept
    r = _run("fit", str(trace), "-o", "/dev/null")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("flags,said", [
    (("--disagg", "--mixed-prefill"), "--mixed-prefill/--prefill-first: not modelled with --disagg"),
    (("--disagg", "--no-overlap-scheduling"), "--overlap-scheduling/--no-overlap-scheduling: not modelled"),
    (("--disagg", "--length-spread", "0"), "--length-spread: not modelled with --disagg"),
    (("--disagg", "--requests-per-client", "1"), "--requests-per-client: not modelled with --disagg"),
    (("--kv-transfer-gb-per-s", "5"), "--kv-transfer-gb-per-s describes disaggregated workers: add --disagg"),
])
def test_predict_refuses_a_flag_its_layout_does_not_read(flags, said):
    """Fuzzing (session 38): each of these gave the same prediction as without it, without a word."""
    base = ("predict", "--model", "meta-llama/Meta-Llama-3.1-8B", "--gpu", "H100", "--isl", "1024", "--osl", "128",
            "--concurrency", "4")
    assert said in _clean(_run(*base, *flags))


def _line_of(text: str, key: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.strip().startswith(key))


# Session 40: refusals made while the replica is built (its step model, its GPU, its power) name the spec's file
# and the line of the field that caused them, as the loader's own refusals do.
@pytest.mark.parametrize("text,key,words", [
    (CODING.replace("config: deepseek-ai/DeepSeek-V3", "config: meta-llama/Llama-3.1-8B")
     .replace("  weight_dtype: fp8", "  weight_dtype: fp8\n  moe_dtype: mxfp4"), "moe_dtype:",
     "has no routed experts for it to apply to"),
    (CODING.replace("  max_batch: 256", "  engine: llamacpp\n  max_batch: 256")
     .replace("tool_wait_kv_policy: retain", "tool_wait_kv_policy: evict").replace("kv_dtype: bf16", "kv_dtype: fp8")
     .replace("  weight_dtype: fp8", "  weight_dtype: int8"),
     "kv_dtype:", "kv_dtype fp8: llamacpp stores its KV cache in"),
    # fuzz round 8: llama.cpp has no 8-bit float weights, and search generated such points
    (CODING.replace("  max_batch: 256", "  engine: llamacpp\n  max_batch: 256")
     .replace("tool_wait_kv_policy: retain", "tool_wait_kv_policy: evict"),
     "weight_dtype:", "weight_dtype fp8: llama.cpp serves GGUF weights, which have no 8-bit float type"),
    (CODING.replace("  max_batch: 256", "  engine: trtllm\n  max_batch: 256").replace("gpu: H200", "gpu: MI355X"),
     "engine:", "engine trtllm (TensorRT-LLM) runs on NVIDIA GPUs only"),
    (CODING.replace("  max_batch: 256", "  engine_version: 0.1.0\n  max_batch: 256"), "engine_version:",
     "serving.engine_version '0.1.0' (vllm): no bundled kernel tables"),
    (CODING.replace("  pue: 1.3", "  pue: 1.3\n  gpu_idle_power_w: 900"), "gpu_idle_power_w:",
     "the GPU's idle draw (900 W, power.gpu_idle_power_w) exceeds its busy draw"),
    (CODING.replace("  pue: 1.3", "  pue: 1.3\n  provisioned_kw_per_gpu: 0.5"), "provisioned_kw_per_gpu:",
     "power: the provisioned budget per GPU, 500 W"),
    (CODING.replace("  gpu: H200", "  gpu: {hbm_bytes: 141.0e+9}"), "gpu:",
     "hardware.gpu: a custom GPU (no 'name') needs hbm_bandwidth_bytes_per_s"),
    (CODING.replace("  gpu: H200", "  gpu: {name: H200, idle_power_w: 900}"), "gpu:",
     "hardware.gpu: idle_power_w 900 W is not below busy_power_w (H200-SXM-141GB's catalogue figure) 700 W"),
    # a power cap alone: the idle and busy draws it was compared with are the catalogue's (fuzzing, session 45)
    (CODING.replace("  gpu: H200", "  gpu: {name: H200, tdp_w: 100}"), "gpu:",
     "idle_power_w (H200-SXM-141GB's catalogue figure) 105 W is not below busy_power_w (H200-SXM-141GB's catalogue "
     "figure scaled to your tdp_w) 100 W"),
])
def test_a_refusal_found_building_the_replica_names_the_spec_file_and_line(tmp_path, text, key, words):
    said = _clean(_plan_text(tmp_path, text))
    assert f"{tmp_path / 'spec.yaml'}: line {_line_of(text, key)}: " in said
    assert words in said



def test_a_custom_gpu_field_given_wrong_is_the_only_error_reported(tmp_path):
    """hardware.gpu takes a name or a mapping; a mapping with one bad field also drew "hardware.gpu: Input should be a
    valid string" (the name's error) ahead of the real one (fuzzing, session 40)."""
    said = _clean(_plan_text(tmp_path, CODING.replace("  gpu: H200", "  gpu: {name: H200, tdp_w: -5}")))
    assert "hardware.gpu.tdp_w: Input should be greater than 0" in said
    assert "valid string" not in said


# Session 41: what the earlier fuzzing rounds left.
@pytest.mark.parametrize("text,words", [
    (CODING.replace("  max_batch: 256", "  max_batch: abc"), "serving.max_batch: Input should be a valid integer, "
     "unable to parse string as an integer (got the text 'abc')"),
    (CODING.replace("  max_batch: 256", "  max_batch: [256]"), "serving.max_batch: Input should be a valid integer "
     "(got a list)"),
    (CODING.replace("  max_batch: 256", "  max_batch: 1.0e+308"), "(got 1e+308)"),
    (SUPPORT.replace(WAITS, "  tool_wait_s: {quantiles: {0.0: 0, 0.5: 26, '0.5': 30, 0.9: 9000}}"),
     "workload.tool_wait_s.quantiles: quantile 0.5 is given twice (as 0.5 and '0.5'): keep one"),
    (CODING.replace("  tool_wait_kv_policy: retain", "  tool_wait_kv_policy: retain\n  offload_bandwidth_bytes_per_s: 3.2e10"),
     "serving.offload_bandwidth_bytes_per_s: only applies to tool_wait_kv_policy 'offload', not 'retain'"),
])
def test_what_session_41_found_in_specs_is_refused_with_the_value_given(tmp_path, text, words):
    assert words in _clean(_plan_text(tmp_path, text))


def test_an_integer_in_exponent_form_is_read_as_the_number(tmp_path):
    """YAML 1.2 and JSON read ``1e3`` as a number; PyYAML read it as text, so `max_batch: 1e3` was refused as
    "unable to parse string as an integer" (a float field took it)."""
    written = _run("plan", str(_write(tmp_path, "e.yaml", CODING.replace("max_batch: 256", "max_batch: 256e0").encode())),
                   "--analytic", "--json")
    plain = _run("plan", str(_write(tmp_path, "plain.yaml", CODING.encode())), "--analytic", "--json")
    assert written.returncode == 0, written.stderr
    assert json.loads(written.stdout)["agents_per_replica"] == json.loads(plain.stdout)["agents_per_replica"]


def test_an_offload_specs_other_policies_are_still_levers():
    """A spec that offloads over its own host link: the levers to retain, evict and ttl drop the link with the policy
    rather than being refused for it."""
    from apmw.levers import _policy
    from apmw.spec import spec_from_dict
    from apmw.spec.load import load_yaml

    data = load_yaml(EXAMPLES / "coding-agent.yaml")
    data["serving"] |= {"tool_wait_kv_policy": "offload", "offload_bandwidth_bytes_per_s": 3.2e10}
    spec = spec_from_dict(data)
    for policy in ("retain", "evict", "ttl"):
        changed = _policy(policy)(spec, None)
        assert changed.serving.tool_wait_kv_policy == policy, changed
        assert changed.serving.offload_bandwidth_bytes_per_s == 64e9


@pytest.mark.parametrize("axis,said", [
    ("workload.new_input_tokens_per_call", "the workload is what a search compares deployments for"),
    ("slo.task_latency_p95_s", "points under two SLOs do not compare"),
    ("fleet.headroom", "every point would be the same"),
])
def test_a_space_axis_in_a_section_the_search_holds_fixed_is_refused(tmp_path, axis, said):
    """`apmw search`'s workload and SLO are the spec's: axes on them ranked points of different workloads against
    each other (and a quantile mapping keyed 0.5 and '0.5' there raised TypeError); fleet.* changed nothing
    (fuzzing, sessions 40 and 41)."""
    space = _write(tmp_path, "space.yaml", f"axes:\n  {axis}: [1, 2]\n".encode())
    r = _run("search", str(EXAMPLES / "support-chat.yaml"), "--space", str(space))
    msg = _clean(r)
    assert f"axis {axis}: " in msg and said in msg


@pytest.mark.parametrize("name,encoding", [("calls.csv", "utf-16"), ("calls.csv.gz", "utf-16-be"),
                                           ("spans.jsonl", "utf-32")])
def test_a_utf16_or_utf32_trace_is_refused_saying_how_to_convert_it(tmp_path, name, encoding):
    import gzip

    data = b"".join(_trace_lines()).decode().encode(encoding)
    if encoding == "utf-16-be":       # no byte-order mark: the NUL bytes give it away
        data = gzip.compress(data)
    for flags in ((), ("--format", "csv", "--map", "input_tokens=prompt_tokens,output_tokens=completion_tokens")):
        said = _clean(_fit(tmp_path, name, data, *flags))
        assert f"{name}: the file is " in said and "not UTF-8: save it as UTF-8" in said and "iconv" in said


def test_an_aiperf_conversation_id_given_twice_costs_the_second_line(tmp_path):
    """Two lines with one session_id were read as one conversation, the second's turns after the first's."""
    line = (b'{"session_id": "chat-1", "turns": [{"input_length": 500, "output_length": 120}, '
            b'{"input_length": 80, "output_length": 60, "delay": 2000}]}\n')
    other = line.replace(b"chat-1", b"chat-2")
    r = _fit(tmp_path, "multi_turn.jsonl", line + other + line)
    _clean(r, 0)
    d = json.loads(r.stdout)
    assert d["skipped_lines"] == 1
    assert any("session_id 'chat-1' is the conversation of line 1 already" in reason for reason in d["skipped"])


@pytest.mark.parametrize("where,said", [("missing.yaml", "no such file"), (".", "is a directory")])
def test_fleet_on_a_path_that_is_no_file_names_both_forms_it_takes(tmp_path, where, said):
    msg = _clean(_run("fleet", str(tmp_path / where)))
    assert said in msg and "give one workload's spec" in msg and "fleet file" in msg


# Session 41's fuzzing round (410 inputs): what ended in an internal error, ran out of memory or was read wrong.
def test_a_calibration_that_is_a_device_or_huge_is_refused_before_it_is_read(tmp_path):
    spec = str(EXAMPLES / "support-chat.yaml")
    assert "/dev/zero: not a regular file" in _clean(_run("plan", spec, "--analytic", "--calibration", "/dev/zero"))
    big = _write(tmp_path, "cal.json", b" " * (16 * 2**20 + 1))
    assert "where a calibration file is a few kB" in _clean(_run("plan", spec, "--analytic", "--calibration", str(big)))


def test_a_base_60_number_is_refused_not_read_as_150(tmp_path):
    said = _clean(_plan_text(tmp_path, CODING.replace("max_batch: 256", "max_batch: 2:30")))
    assert "'2:30' reads as a base-60 number in YAML 1.1 (2:30 is 150)" in said


def test_a_fleet_file_given_where_a_spec_is_says_so():
    said = _clean(_run("plan", str(EXAMPLES / "fleets" / "mixed-fleet.yaml"), "--analytic"))
    assert "a fleet file (a top-level 'workloads' list), not one workload's spec: size it with apmw fleet FILE" in said
    assert "missing (required)" not in said


def test_a_utf8_bom_before_jsonl_is_skipped(tmp_path):
    from pathlib import Path

    plain = (Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "aiperf_multi_turn.jsonl").read_bytes()
    r = _fit(tmp_path, "bom.jsonl", b"\xef\xbb\xbf" + plain)
    _clean(r, 0)
    bom = json.loads(r.stdout)
    assert (bom["sessions"], bom["calls"], bom["skipped_lines"]) == (2, 5, 0)


def test_a_search_with_no_feasible_point_exits_as_infeasible(tmp_path):
    space = _write(tmp_path, "space.yaml", b"axes:\n  serving.max_batch: [-5, 0]\n")
    r = _run("search", str(EXAMPLES / "support-chat.yaml"), "--space", str(space), "--json", timeout=300)
    assert "none of the 2 point(s) of the space is feasible" in _clean(r, 2)
    assert json.loads(r.stdout)["feasible"] == 0


@pytest.mark.parametrize("space,said", [
    (b"axes:\n  serving.max_batch: [64, '64']\n", "axis serving.max_batch lists 64 more than once"),
])
def test_a_space_value_written_twice_in_two_spellings_is_refused(tmp_path, space, said):
    r = _run("search", str(EXAMPLES / "support-chat.yaml"), "--space", str(_write(tmp_path, "s.yaml", space)))
    assert said in _clean(r)


def test_resume_with_nothing_saved_at_the_path_is_refused(tmp_path):
    space = _write(tmp_path, "space.yaml", b"axes:\n  serving.max_batch: [64, 128]\n")
    r = _run("search", str(EXAMPLES / "support-chat.yaml"), "--space", str(space), "--parquet",
             str(tmp_path / "typo.parquet"), "--resume")
    assert "--resume: nothing to resume at --parquet" in _clean(r)


def test_replications_of_zero_names_the_flag():
    said = _clean(_run("fleet", str(EXAMPLES / "coding-agent.yaml"), "--simulate", "--replications", "0"))
    assert "--replications must be at least 1" in said


def test_an_output_never_replaces_a_file_the_spec_or_fleet_file_reads(tmp_path):
    """Fuzzing (session 41): `report -o` over the spec's model.config and `fleet --csv` over a workload's spec
    replaced them; only the files named on the command line were guarded."""
    import shutil

    config = tmp_path / "config.json"
    shutil.copy(EXAMPLES.parent / "src" / "apmw" / "catalog" / "data" / "models" / "meta-llama--Meta-Llama-3.1-70B.json",
                config)
    spec = _write(tmp_path, "spec.yaml", SUPPORT.replace("  config: meta-llama/Meta-Llama-3.1-70B",
                                                          f"  config: {config}").encode())
    before = config.read_bytes()
    said = _clean(_run("report", str(spec), "-o", str(config), "--no-simulate"))
    assert f"-o {config} is the input" in said and config.read_bytes() == before
    workload = _write(tmp_path, "coding.yaml", CODING.encode())
    fleet = _write(tmp_path, "fleet.yaml", b"workloads:\n  - name: code\n    spec: coding.yaml\n")
    said = _clean(_run("fleet", str(fleet), "--csv", str(workload)))
    assert "is the input" in said and workload.read_text() == CODING


def test_azure_stamps_in_iso_8601_are_read_and_a_zoneless_one_is_utc_on_any_machine(tmp_path):
    """ISO 8601 stamps (T and Z) skipped every line as "could not convert string to float" (fuzzing, session 41); a
    stamp without a zone was read in the machine's own time zone, moving tasks_per_hour by its offset."""
    import os

    rows = [(f"2023-11-16 {h:02d}:17:03.9799600", 4808, 10) for h in range(24) for _ in range(3)]
    plain = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{t},{i},{o}\n" for t, i, o in rows)
    iso = plain.replace(" ", "T").replace("600,", "600Z,")
    fitted = {}
    for name, text, tz in (("plain", plain, "UTC"), ("iso", iso, "UTC"), ("plain", plain, "America/Los_Angeles")):
        path = _write(tmp_path, f"AzureLLMInferenceTrace_{name}.csv", text.encode())
        r = subprocess.run([APMW, "fit", str(path), "--json"], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "TZ": tz})
        _clean(r, 0)
        d = json.loads(r.stdout)
        assert d["skipped_lines"] == 0, d["skipped"]
        fitted[(name, tz)] = d["tasks_per_hour"]
    assert fitted[("plain", "UTC")] == fitted[("iso", "UTC")] == fitted[("plain", "America/Los_Angeles")]


def test_predict_names_the_engines_own_batch_limit_when_none_was_given():
    r = _run("predict", "--model", "meta-llama/Meta-Llama-3.1-8B", "--gpu", "H100", "--isl", "100", "--osl", "10",
             "--concurrency", "64", "--token-budget", "16")
    _clean(r, 0)
    out = " ".join(r.stdout.split())
    # vLLM lowers its default batch limit to the token budget: that is what caps it, not --max-batch (fuzz round 8)
    assert "--token-budget: vllm runs no more requests than its tokens per iteration, 16 here" in out
    assert "--max-batch sets it" not in out


def test_an_otel_span_exported_twice_is_counted_once_and_a_usage_given_twice_is_refused(tmp_path):
    """`cat a.jsonl a.jsonl` (or a collector's retry) doubled every call; a span giving its input tokens twice was
    read with the last value (fuzzing, session 41)."""
    from pathlib import Path

    spans = (Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "otel_genai.jsonl").read_bytes()
    once = json.loads(_fit(tmp_path, "once.jsonl", spans).stdout)
    r = _fit(tmp_path, "twice.jsonl", spans + spans)
    _clean(r, 0)
    twice = json.loads(r.stdout)
    assert (twice["calls"], twice["sessions"]) == (once["calls"], once["sessions"])
    assert twice["input_tokens_per_call"] == once["input_tokens_per_call"]
    assert twice["skipped_lines"] == once["skipped_lines"] + len(spans.splitlines())
    assert any("a span exported twice" in reason for reason in twice["skipped"])
    usage = b'{"key":"gen_ai.usage.input_tokens","value":{"intValue":"1200"}}'
    assert usage in spans
    doubled = spans.replace(usage, usage + b',{"key":"gen_ai.usage.input_tokens","value":{"intValue":"999999"}}', 1)
    d = json.loads(_fit(tmp_path, "usage.jsonl", doubled).stdout)
    assert d["calls"] == once["calls"] - 1
    assert any("attribute gen_ai.usage.input_tokens is given twice, with two values" in why for why in d["skipped"])


def test_calls_that_start_before_the_one_before_them_ended_are_noted_not_dropped_silently(tmp_path):
    """A start column in seconds mapped as milliseconds put every start before the previous call's end: 246 of 249
    tool waits were dropped with no word, and the fit read 0.3 ms waits off the other 3 (fuzzing, session 41)."""
    from pathlib import Path

    trace = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "mini_swe_calls_3sessions.csv"
    columns = "session=instance_id,order=call_index,input_tokens=prompt_tokens,output_tokens=completion_tokens"
    r = _run("fit", str(trace), "--format", "csv", "--map", columns + ",start_ms=t_request_s,end_s=t_response_s",
             "--json")
    _clean(r, 0)
    (note,) = [n for n in json.loads(r.stdout)["notes"] if "before the call before them ended" in n]
    assert note.startswith("246 of 249 call(s)") and "two units" in note
    right = _run("fit", str(trace), "--format", "csv", "--map", columns + ",start_s=t_request_s,end_s=t_response_s",
                 "--json")
    _clean(right, 0)
    assert not [n for n in json.loads(right.stdout)["notes"] if "before the call before them ended" in n]


def test_a_jsonl_whose_first_line_is_past_the_sniffed_bytes_asks_for_its_format(tmp_path):
    """A first line over 4 MiB was cut before its JSON ended and blamed on CSV line endings (fuzzing, session 41)."""
    turn = '{"text": "' + "x" * (5 * 2**20) + '", "output_length": 10}'
    line = ('{"session_id": "a", "turns": [' + turn + "]}\n").encode()
    said = _clean(_fit(tmp_path, "long.jsonl", line))
    assert "the first line is longer than the 4 MiB apmw reads to recognise a format: give it with --format" in said
    r = _fit(tmp_path, "long.jsonl", line, "--format", "aiperf-multi-turn")
    _clean(r, 0)
    assert json.loads(r.stdout)["calls"] == 1


@pytest.mark.parametrize("args,said", [
    (["predict", "--model", "meta-llama/Meta-Llama-3.1-8B", "--gpu", "H100", "--isl", "100", "--osl", "10",
      "--concurrency", "4,8,4"], "--concurrency: '4,8,4' gives 4 more than once"),
    (["fit", "{trace}", "--format", "csv", "--map", "input_tokens=prompt_tokens,output_tokens=prompt_tokens"],
     "--map reads column 'prompt_tokens' as both input_tokens and output_tokens"),
])
def test_one_value_asked_for_twice_is_refused(args, said):
    from pathlib import Path

    trace = str(Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "mini_swe_calls_3sessions.csv")
    assert said in _clean(_run(*[a.replace("{trace}", trace) for a in args]))


@pytest.mark.parametrize("text,said", [
    ("workload:\x00\n", "line 1, column 10: character U+0000 is not allowed in YAML"),
    (CODING + "1: 2\n", f"line {CODING.count(chr(10)) + 1}: 1: Keys should be strings"),
])
def test_a_yaml_error_without_a_mark_still_names_its_line(tmp_path, text, said):
    assert said in _clean(_plan_text(tmp_path, text))


def test_a_session_id_written_as_a_number_or_as_text_is_one_session(tmp_path):
    """Mooncake sessions 1, "1" and 1.0 were two sessions, by JSON type (fuzzing, session 41)."""
    lines = [{"session_id": sid, "input_length": n, "output_length": 5, "timestamp": t}
             for sid, n, t in ((1, 100, 0), ("1", 50, 1000), (1.0, 50, 2000))]
    r = _fit(tmp_path, "mooncake.jsonl", "".join(json.dumps(x) + "\n" for x in lines).encode())
    _clean(r, 0)
    d = json.loads(r.stdout)
    assert (d["sessions"], d["calls"]) == (1, 3)


# Session 42: flags that did nothing where they were given (fuzzing, session 40's S9).
@pytest.mark.parametrize("args,said", [
    (["model", "--list", "--gpus"], "--list, --gpus given together: each lists one catalogue"),
    (["model", "--gpus", "--systems"], "--gpus, --systems given together"),
    (["model", "deepseek-ai/DeepSeek-V3", "--list"],
     "--list lists a catalogue and takes no model, but 'deepseek-ai/DeepSeek-V3' was given"),
    (["plan", str(EXAMPLES / "support-chat.yaml"), "--trace-format", "mooncake"],
     "--trace-format mooncake applies to --workload-from TRACE"),
])
def test_a_flag_that_would_do_nothing_is_refused(args, said):
    assert said in _clean(_run(*args))


def test_search_says_check_tasks_does_nothing_without_check(tmp_path):
    r = _run("search", str(EXAMPLES / "support-chat.yaml"), "--space", str(tmp_path / "missing.yaml"),
             "--check-tasks", "5")
    said = _clean(r)
    assert "--check-tasks has no effect without --check K" in said


def test_a_mooncake_request_that_arrives_before_the_one_it_continues_is_skipped_and_said(tmp_path):
    """Out of time order, a continuation's gap came out negative and was dropped, and its session re-sorted so
    that its prompt shrank (fuzzing, session 40)."""
    lines = [{"timestamp": t, "input_length": n, "output_length": 50, "hash_ids": list(range(1, n // 512 + 2))}
             for t, n in ((5000, 1200), (1000, 1800), (9000, 2400))]
    for fast in (True, False):      # the fast path, and the general one (a float count sends a line there)
        if not fast:
            lines[1]["output_length"] = 50.0
        r = _fit(tmp_path, "mooncake.jsonl", "".join(json.dumps(x) + "\n" for x in lines).encode())
        _clean(r, 0)
        d = json.loads(r.stdout)
        assert (d["calls"], d["skipped_lines"]) == (2, 1)
        reason, = d["skipped"]
        assert "earlier than that of the request whose blocks it extends" in reason and "sort it by timestamp" in reason
        assert d["skipped"][reason]["examples"] == [f"{tmp_path / 'mooncake.jsonl'}:2"]
        assert d["tool_wait_s"]["count"] == 1 and d["tool_wait_s"]["p50"] == 4.0     # 5 s -> 9 s


@pytest.mark.parametrize("name,text,flags", [
    ("mooncake.jsonl", '{"timestamp": 0, "input_length": 10.5, "output_length": 3}\n'
                       '{"timestamp": 1, "input_length": 10, "output_length": 3}\n', ()),
    ("calls.csv", "sid,inp,out\na,10.5,3\na,10,3\n",
     ("--format", "csv", "--map", "session=sid,input_tokens=inp,output_tokens=out")),
    ("mini_swe.csv", "run,instance_id,call_index,model,t_response_s,t_request_s,llm_latency_s,prompt_tokens,"
     "completion_tokens,cached_prompt_tokens,reasoning_tokens,n_actions,tool_phase_s,finish_reason\n"
     "r,i,0,m,0.0,,,2036,77.5,320,,1,0.3,tool_calls\nr,i,1,m,1.0,,,2136,77,320,,1,0.3,tool_calls\n", ()),
])
def test_a_fractional_token_count_is_skipped_and_counted(tmp_path, name, text, flags):
    """10.5 tokens were read as they were (fuzzing, session 40)."""
    r = _fit(tmp_path, name, text.encode(), *flags)
    _clean(r, 0)
    d = json.loads(r.stdout)
    assert d["calls"] == 1 and d["skipped"]["a token count that is not a whole number"]["count"] == 1


def test_a_rate_sweep_with_an_infinite_level_is_refused():
    """`--request-rate 2,inf --json` ended in an internal error writing inf to JSON (fuzzing, session 42)."""
    said = _clean(_run("predict", "--model", "meta-llama/Meta-Llama-3.1-8B", "--gpu", "H100", "--isl", "1024", "--osl",
                       "256", "--request-rate", "2,inf", "--json"))
    assert "--request-rate: '2,inf' holds a level that is not a finite number" in said


IDLE_AGENTS = """workload: {steps_per_task: 2, system_prompt_tokens: 300, new_input_tokens_per_call: 60,
           output_tokens_per_call: 20, tool_wait_s: {p50: 600, p95: 1800}}
model: {config: meta-llama/Meta-Llama-3.1-8B, weight_dtype: fp8, kv_dtype: fp8}
hardware: {gpu: B200}
serving: {tool_wait_kv_policy: evict}
slo: {task_latency_p95_s: 3600}
cost: {electricity_usd_per_kwh: 0.08, gpu_hour_usd: 4.0}
"""


def test_an_n_star_at_the_search_ceiling_says_so_and_is_not_simulated(tmp_path):
    """A human-in-the-loop agent on a B200: N* stopped at the 1,000,000-agent ceiling was reported as bound by the
    batch limit, and the default plan failed with "agents must be between 1 and 200,000" (fuzzing, session 42)."""
    path = tmp_path / "idle.yaml"
    path.write_text(IDLE_AGENTS)
    r = _run("plan", str(path), "--json", timeout=300)
    said = _clean(r, 0)
    d = json.loads(r.stdout)
    assert (d["agents_per_replica"], d["binding_constraint"]) == (1_000_000, "agent_limit")
    assert {q["stopped_by"] for q in d["slo_sensitivity"]} == {"agent_limit"}
    assert "N* is at the 1,000,000 agents per replica apmw searches up to" in said
    assert "not checked in the simulator: the analytic N* (1,000,000 agents) is at or past the 200,000" in said


def test_levers_say_why_the_spec_refuses_a_change(tmp_path):
    """On llama.cpp five levers read "the spec refuses the change: 1 validation error for Serving", pydantic's
    count, not the reason (fuzzing, session 42)."""
    path = tmp_path / "llamacpp.yaml"
    path.write_text("workload: {steps_per_task: 10, system_prompt_tokens: 500, new_input_tokens_per_call: 200,\n"
                    "           output_tokens_per_call: 100, tool_wait_s: 2}\n"
                    "model: {config: meta-llama/Meta-Llama-3.1-8B, weight_dtype: bf16}\n"
                    "hardware: {gpu: H100, gpus_per_replica: 1}\nslo: {task_latency_p95_s: 300}\n"
                    "cost: {electricity_usd_per_kwh: 0.08, gpu_hour_usd: 2.0}\n"
                    "serving: {engine: llamacpp, max_batch: 4, tool_wait_kv_policy: evict}\n")
    r = _run("levers", str(path), "--json", timeout=300)
    _clean(r, 0)
    skipped = json.loads(r.stdout)["not_applicable"]
    refused = {k: v for k, v in skipped.items() if v.startswith("the spec refuses the change")}
    assert set(refused) >= {"policy_retain", "speculative_decoding"}
    assert not any("validation error" in v for v in refused.values())
    assert "'retain' is not what engine llamacpp does" in refused["policy_retain"]


def test_plan_says_when_tensor_parallelism_leaves_the_node(tmp_path):
    """TP16 on H100 was planned without a word, where apmw levers refuses to go past the 8-GPU domain (fuzzing,
    session 42): it is priced over the scale-out network, and plan says so."""
    path = tmp_path / "tp16.yaml"
    path.write_text((EXAMPLES / "support-chat.yaml").read_text().replace("gpus_per_replica: 2", "gpus_per_replica: 16"))
    said = _clean(_run("plan", str(path), "--analytic", timeout=300), 0)
    assert "tensor parallelism over 16 GPUs crosses the 8-GPU scale-up domain of H100-SXM5-80GB" in said
    quiet = _run("plan", str(EXAMPLES / "support-chat.yaml"), "--analytic", timeout=300)
    assert "crosses the" not in quiet.stderr


def test_predict_says_when_expert_parallelism_leaves_the_rack():
    """EP 128 on GB200 spans two NVL72 racks: its exchange was priced over the scale-out network without a word
    (fuzzing, session 42). EP 64 stays inside one rack and says nothing."""
    args = ["predict", "--model", "deepseek-ai/DeepSeek-R1", "--gpu", "GB200", "--tp", "1", "--weight-dtype", "fp8",
            "--isl", "1000", "--osl", "100", "--concurrency", "1024", "--json"]
    said = _clean(_run(*args, "--dp-attention", "128", "--ep", "128", timeout=300), 0)
    assert ("expert parallelism over 128 GPUs crosses the 72-GPU scale-up domain of GB200 (per GPU)" in said
            and "100 GB/s per GPU" in said)
    inside = _run(*args, "--dp-attention", "64", "--ep", "64", timeout=300)
    assert inside.returncode == 0 and "crosses the" not in inside.stderr


def test_a_prefill_queue_that_misses_the_slo_asks_for_prefill_workers(tmp_path):
    """1,000 decode workers on one prefill worker were told to get "a faster replica" (fuzzing, session 42)."""
    path = tmp_path / "disagg.yaml"
    path.write_text("workload: {steps_per_task: 10, system_prompt_tokens: 500, new_input_tokens_per_call: 200,\n"
                    "           output_tokens_per_call: 100, tool_wait_s: 2}\n"
                    "model: {config: Qwen/Qwen3-30B-A3B, weight_dtype: bf16}\n"
                    "hardware: {gpu: H100, gpus_per_replica: 2}\nslo: {task_latency_p95_s: 300}\n"
                    "cost: {electricity_usd_per_kwh: 0.08, gpu_hour_usd: 2.0}\n"
                    "serving: {disaggregation: {prefill_gpus: 1, decode_workers: 1000}}\n")
    said = _clean(_run("plan", str(path), "--analytic", timeout=300), 2)
    assert "queue dominates" in said and "more prefill workers for its 1000 decode worker(s)" in said
    assert "a faster replica" not in said


@pytest.mark.parametrize("verb,flag", [("fleet", "--csv"), ("search", "--csv")])
def test_an_output_file_that_is_standard_output_is_refused_beside_json(verb, flag):
    """--json --csv /dev/stdout interleaved the CSV with the JSON, which then did not parse (fuzzing, session 43)."""
    r = _run(verb, str(EXAMPLES / "support-chat.yaml"), "--json", flag, "/dev/stdout")
    said = _clean(r)
    assert f"{flag} /dev/stdout writes to standard output, where --json prints its document" in said
    assert r.stdout == ""


def test_simulate_refuses_a_workload_past_the_context_window_as_plan_does(tmp_path):
    """Every call past Llama-3.1-70B's window: plan refused it, simulate ran it with every call rejected and told
    the user to run longer (fuzzing, session 44)."""
    path = tmp_path / "past.yaml"
    path.write_text(with_first_call(SUPPORT, "500000"))
    said = _clean(_run("simulate", str(path), "--agents", "1", "--duration-s", "300", timeout=300), 1)
    assert "100.0% of the workload's calls hold more tokens" in said and "summarize_at_tokens" in said


def test_simulate_timeseries_without_json_is_refused():
    """--timeseries only adds to --json: without it the table was printed the same, the flag dropped."""
    said = _clean(_run("simulate", str(EXAMPLES / "support-chat.yaml"), "--agents", "1", "--duration-s", "60",
                       "--timeseries", timeout=300), 1)
    assert "--timeseries adds the decode batch and KV over time to --json" in said


def test_a_name_too_long_for_the_file_system_is_a_user_error_wherever_it_is_given(tmp_path):
    long = tmp_path / ("a" * 300)
    spec = EXAMPLES / "support-chat.yaml"
    for args in (["report", str(spec), "--no-simulate", "-o", f"{long}.html"], ["simulate", f"{long}.yaml", "--agents", "2"],
                 ["fit", f"{long}.jsonl"]):
        said = _clean(_run(*args))
        assert re.search(r"a name in this path is 30\d bytes long, past the file system's 255: shorten it", said), said


def test_an_output_that_is_a_loop_of_links_is_refused(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    said = _clean(_run("report", str(EXAMPLES / "support-chat.yaml"), "--no-simulate", "-o", str(tmp_path / "a")))
    assert "is a symbolic link that leads back to itself" in said


@pytest.mark.parametrize("flags,words", [
    (["--endpoint", "http://user:secret@127.0.0.1:9"], "--endpoint http://***@127.0.0.1:9: a name or password in the URL"),
    (["--duration-s", "inf"], "--duration-s inf: give a finite number of seconds"),
    (["--timeout-s", "inf"], "--timeout-s inf: give a finite number of seconds"),
    (["--drain-s", "1e9"], "--drain-s 1e+09: give a finite number of seconds, at most 604,800"),
    (["--agents", "3", "--agents-sweep", "1:4"], "--agents and --agents-sweep both say how many agents to run"),
    (["--loop-results", "runs.jsonl"], "--loop-results is read only with --calibrate"),
])
def test_bench_settings_that_would_be_dropped_leak_or_never_end_are_refused(tmp_path, flags, words):
    """Checked before any load: no server answers at 127.0.0.1:9, so reaching it would fail differently."""
    endpoint = [] if "--endpoint" in flags else ["--endpoint", "http://127.0.0.1:9"]
    r = _run("bench", str(EXAMPLES / "support-chat.yaml"), "--model", "m", *endpoint, "--out", str(tmp_path / "b.jsonl"),
             *flags)
    said = _clean(r)
    assert words in said and "secret" not in r.stderr + r.stdout, said


def test_bench_checks_the_calibration_path_before_measuring(tmp_path):
    said = _clean(_run("bench", "--model", "m", "--endpoint", "http://127.0.0.1:9", "--calibrate", str(tmp_path)))
    assert f"--calibrate {tmp_path} is a folder" in said


def test_paths_that_are_not_what_they_seem_are_named_for_what_they_are(tmp_path):
    """A spec that is a loop of links was 'file not found'; an output under a file was under a folder that 'does not
    exist'; a trace of one empty object listed its keys as nothing."""
    (tmp_path / "a.yaml").symlink_to(tmp_path / "b.yaml")
    (tmp_path / "b.yaml").symlink_to(tmp_path / "a.yaml")
    assert "a symbolic link that leads back to itself" in _clean(_run("plan", str(tmp_path / "a.yaml")))
    spec = EXAMPLES / "support-chat.yaml"
    said = _clean(_run("report", str(spec), "--no-simulate", "-o", f"{spec}/r.html"))
    assert f"{spec} is a file, not a folder" in said
    (tmp_path / "t.jsonl").write_text("{}\n")
    assert "a JSON object with no keys ({}) is not a format" in _clean(_run("fit", str(tmp_path / "t.jsonl")))
