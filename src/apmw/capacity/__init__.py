"""Closed-loop solve, SLO search for N*, power, energy and cost per session, fleet sizing."""

from apmw.capacity.evaluate import Evaluation
from apmw.capacity.plan import InfeasibleError, Plan, plan, sweep

__all__ = ["Evaluation", "InfeasibleError", "Plan", "plan", "sweep"]
