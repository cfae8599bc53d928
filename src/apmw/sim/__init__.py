"""Iteration-level simulator of one agent-serving replica (``apmw simulate``).

A continuous-batching engine (vLLM V1 behaviour: token budget with chunked
prefill, ``max_batch``, block-granular KV, admission only when blocks are free,
preemption by recompute, LRU prefix cache) driven by closed-loop agents, with the
iteration time of the shared step-time model. See docs/simulate.md.
"""

from apmw.sim.agents import TaskShape
from apmw.sim.batch import Seq
from apmw.sim.engine import Engine
from apmw.sim.kv_ledger import BLOCK_TOKENS
from apmw.sim.result import SimResult
from apmw.sim.run import (SweepResult, simulate, simulate_open_loop, sweep, unsupported,
                          unsupported_on_one_replica)
from apmw.sim.verify import verify_plan

__all__ = ["BLOCK_TOKENS", "Engine", "Seq", "TaskShape", "SimResult", "SweepResult", "simulate", "simulate_open_loop", "sweep", "unsupported",
           "unsupported_on_one_replica", "verify_plan"]
