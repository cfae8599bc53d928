"""Closed-loop load generator against OpenAI-compatible endpoints (``apmw bench``).

N agents run the spec's agent tasks (shared system prompt, growing history, tool waits) against
a real server, stream every call, and append each finished call and task to a JSON-lines file.
See docs/bench.md for the file format, the summary's field names and the calibration file.
"""

from apmw.loadgen.bench import BenchOutcome, config_from_file, run_bench, slo_dict, workload_dict
from apmw.loadgen.client import BenchError, CallResult, Client, FAULT_KINDS
from apmw.loadgen.results import read_records, summarise
from apmw.loadgen.runner import LiveStats, RunConfig

__all__ = ["BenchError", "BenchOutcome", "CallResult", "Client", "FAULT_KINDS", "LiveStats", "RunConfig",
           "config_from_file", "read_records", "run_bench", "slo_dict", "summarise", "workload_dict"]
