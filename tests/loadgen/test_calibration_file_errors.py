"""A hostile calibration file (apmw plan --calibration) is refused with a message naming the file, the
row and the field, never a traceback; found by fuzzing `apmw plan SPEC --analytic --calibration FILE`."""

from __future__ import annotations

import copy
import json
import subprocess
import warnings
from pathlib import Path

import pytest

from apmw.errors import ApmwError
from apmw.loadgen.calibrate import read_calibration, step_model_from_calibration
from apmw.spec import spec_from_dict
from tests.loadgen.conftest import tiny_spec_dict

FIXTURES = Path(__file__).parent.parent / "fixtures" / "calibration"
MEASURED = FIXTURES / "llamacpp-tiny-4slots.json"        # tests/perf/test_measured.py describes it
TINY_CONFIG = FIXTURES / "tiny-llama-config.json"
VALID = json.loads(MEASURED.read_text())
# steps under load as apmw.loadgen.loop_steps writes them: one decode step, one mixed step
STEPS = [{"decode_seqs": 2, "samples": 9, "context_tokens": 300.0, "prefill_tokens": 0.0,
          "prefill_context_tokens": 0.0, "step_s_p50": 0.003},
         {"decode_seqs": 1, "samples": 4, "context_tokens": 200.0, "prefill_tokens": 100.0,
          "prefill_context_tokens": 64.0, "step_s_p50": 0.05}]


def _set(table: str, row: int, field: str, value):
    def edit(cal: dict) -> None:
        cal[table][row][field] = value
    return edit


def _drop(table: str, row: int, field: str):
    def edit(cal: dict) -> None:
        del cal[table][row][field]
    return edit


def _steps(row: int, field: str, value):
    def edit(cal: dict) -> None:
        cal["steps_under_load"] = copy.deepcopy(STEPS)
        cal["steps_under_load"][row][field] = value
    return edit


def _drop_step_context(cal: dict) -> None:
    cal["steps_under_load"] = copy.deepcopy(STEPS)
    del cal["steps_under_load"][1]["context_tokens"]


def _ints_for_rows(cal: dict) -> None:
    cal["tpot_vs_concurrency"] = [4, 8]


def _top(field: str, value):
    def edit(cal: dict) -> None:
        cal[field] = value
    return edit


# (edit, words the message must hold besides the file's name)
ROW_CASES = {
    "ttft_is_a_string": (_set("ttft_vs_prompt_tokens", 1, "ttft_s_p50", "0.1"),
                         ["'ttft_vs_prompt_tokens' row 1", "'ttft_s_p50'", "str"]),
    "ttft_is_missing": (_drop("ttft_vs_prompt_tokens", 2, "ttft_s_p50"),
                        ["'ttft_vs_prompt_tokens' row 2", "'ttft_s_p50' is missing"]),
    "concurrency_is_a_string": (_set("tpot_vs_concurrency", 2, "concurrency", "4"),
                                ["'tpot_vs_concurrency' row 2", "'concurrency'", "whole number"]),
    "prompt_tokens_is_text": (_set("ttft_vs_prompt_tokens", 0, "prompt_tokens", "x"),
                              ["'ttft_vs_prompt_tokens' row 0", "'prompt_tokens'"]),
    "decode_prompt_tokens_is_a_string": (_top("decode_prompt_tokens", "32"), ["'decode_prompt_tokens'"]),
    "steps_under_load_is_a_number": (_top("steps_under_load", 5), ["'steps_under_load'", "list of rows"]),
    "rows_are_ints": (_ints_for_rows, ["'tpot_vs_concurrency' row 0", "not an object"]),
    "ttft_is_null": (_set("ttft_vs_prompt_tokens", 3, "ttft_s_p50", None),
                     ["'ttft_vs_prompt_tokens' row 3", "'ttft_s_p50'", "NoneType"]),
    "tpot_is_nan": (_set("tpot_vs_concurrency", 1, "tpot_s_p50", float("nan")),
                    ["'tpot_vs_concurrency' row 1", "'tpot_s_p50'", "NaN"]),
    "tpot_is_infinite": (_set("tpot_vs_context", 0, "tpot_s_p50", float("inf")),
                         ["'tpot_vs_context' row 0", "'tpot_s_p50'", "Infinity"]),
    "tpot_is_negative": (_set("tpot_vs_context", 2, "tpot_s_p50", -0.002),
                         ["'tpot_vs_context' row 2", "'tpot_s_p50'", "-0.002"]),
    "time_is_absurdly_long": (_set("ttft_vs_prompt_tokens", 4, "ttft_s_p50", 1e300),
                              ["'ttft_vs_prompt_tokens' row 4", "'ttft_s_p50'", "1e+300", "3600"]),
    "time_is_absurdly_short": (_set("tpot_vs_concurrency", 0, "tpot_s_p50", 1e-300),
                               ["'tpot_vs_concurrency' row 0", "'tpot_s_p50'", "1e-06"]),
    "concurrency_is_fractional": (_set("tpot_vs_concurrency", 3, "concurrency", 2.5),
                                  ["'tpot_vs_concurrency' row 3", "'concurrency'"]),
    "concurrency_is_a_bool": (_set("tpot_vs_concurrency", 0, "concurrency", True),
                              ["'tpot_vs_concurrency' row 0", "'concurrency'", "bool"]),
    "prompt_tokens_is_huge": (_set("tpot_vs_context", 1, "prompt_tokens", 10 ** 400),
                              ["'tpot_vs_context' row 1", "'prompt_tokens'", "..."]),
    "output_tokens_is_negative": (_set("tpot_vs_concurrency", 1, "output_tokens", -64),
                                  ["'tpot_vs_concurrency' row 1", "'output_tokens'"]),
    "step_row_misses_its_context": (_drop_step_context, ["'steps_under_load' row 1", "'context_tokens' is missing"]),
    "step_time_is_a_string": (_steps(0, "step_s_p50", "3 ms"), ["'steps_under_load' row 0", "'step_s_p50'"]),
    "decode_seqs_is_negative": (_steps(0, "decode_seqs", -1), ["'steps_under_load' row 0", "'decode_seqs'"]),
}


@pytest.mark.parametrize("case", sorted(ROW_CASES))
def test_a_bad_row_is_refused_naming_the_file_the_row_and_the_field(case, tmp_path):
    edit, words = ROW_CASES[case]
    cal = copy.deepcopy(VALID)
    edit(cal)
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(cal))        # NaN and Infinity as Python's json writes them
    with pytest.raises(ApmwError) as err:
        read_calibration(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: "), msg
    for w in words:
        assert w in msg, msg
    assert "re-run apmw bench --calibrate" in msg, msg


def _write_dir(tmp_path: Path) -> Path:
    return tmp_path


def _write_latin1(tmp_path: Path) -> Path:
    path = tmp_path / "cal.json"
    path.write_bytes(json.dumps(VALID).replace('"tiny"', '"tiny\xe9"').encode("latin-1"))
    return path


def _write_nested(tmp_path: Path) -> Path:
    path = tmp_path / "cal.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    return path


def _write_long_int(tmp_path: Path) -> Path:
    path = tmp_path / "cal.json"
    path.write_text('{"format": ' + "9" * 5000 + "}")
    return path


FILE_CASES = {
    "a_directory": (_write_dir, "is a directory"),
    "not_utf8": (_write_latin1, "not UTF-8"),
    "nested_too_deeply": (_write_nested, "nested too deeply"),
    "an_integer_too_long_to_read": (_write_long_int, "number too long"),
}


@pytest.mark.parametrize("case", sorted(FILE_CASES))
def test_a_file_that_cannot_be_read_is_refused_naming_it(case, tmp_path):
    write, words = FILE_CASES[case]
    path = write(tmp_path)
    with pytest.raises(ApmwError) as err:
        read_calibration(path)
    assert str(err.value).startswith(f"{path}: ") and words in str(err.value), str(err.value)


def test_valid_files_with_every_table_still_fit_without_warnings(tmp_path):
    cal = copy.deepcopy(VALID)
    cal["steps_under_load"] = copy.deepcopy(STEPS)
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(cal))
    spec = spec_from_dict(tiny_spec_dict(TINY_CONFIG))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = step_model_from_calibration(read_calibration(path), spec)
    assert model.source == "measured" and " 15 rows" in model.source_detail


def test_apmw_plan_refuses_a_bad_row_without_a_traceback(tmp_path):
    import yaml

    from tests.e2e.test_cli import APMW

    cal = copy.deepcopy(VALID)
    cal["ttft_vs_prompt_tokens"][1]["ttft_s_p50"] = "0.1"
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(cal))
    spec_path = tmp_path / "tiny.yaml"
    spec_path.write_text(yaml.safe_dump(tiny_spec_dict(TINY_CONFIG)))
    run = subprocess.run([APMW, "plan", str(spec_path), "--analytic", "--calibration", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stderr
    assert "'ttft_vs_prompt_tokens' row 1" in run.stderr and "Traceback" not in run.stderr
    assert "This is a bug" not in run.stderr


def _flat_ttft(cal: dict) -> None:
    for r in cal["ttft_vs_prompt_tokens"]:
        r["ttft_s_p50"] = 0.02


def _falling_ttft(cal: dict) -> None:
    for r, t in zip(sorted(cal["ttft_vs_prompt_tokens"], key=lambda r: r["prompt_tokens"]), (1.0, 0.5, 0.2, 0.1, 0.01)):
        r["ttft_s_p50"] = t


def _falling_tpot(cal: dict) -> None:
    rows = cal["tpot_vs_concurrency"]
    rows[-1]["tpot_s_p50"] = 0.8 * min(r["tpot_s_p50"] for r in rows)


TREND_CASES = {
    "flat TTFT": (_flat_ttft, "'ttft_vs_prompt_tokens' does not grow with the prompt: 20.0 ms at 1536 tokens "
                              "against 20.0 ms at 32"),
    "TTFT falling": (_falling_ttft, "'ttft_vs_prompt_tokens' does not grow with the prompt: 10.0 ms at 1536 tokens "
                                    "against 1000.0 ms at 32"),
    "TPOT falling with concurrency": (_falling_tpot, "'tpot_vs_concurrency' falls as requests are added"),
}


@pytest.mark.parametrize("case", sorted(TREND_CASES))
def test_tables_that_run_against_what_they_measure_are_refused(case, tmp_path):
    edit, words = TREND_CASES[case]
    cal = copy.deepcopy(VALID)
    edit(cal)
    spec = spec_from_dict(tiny_spec_dict(TINY_CONFIG))
    with pytest.raises(ApmwError, match="on an idle server") as err:
        step_model_from_calibration(cal, spec)
    assert words in str(err.value), str(err.value)
    # the measured file itself (its decode step at 8 requests is faster than at 4, within the limit of 4
    # slots, but not than at 1) fits
    assert step_model_from_calibration(copy.deepcopy(VALID), spec).source == "measured"
