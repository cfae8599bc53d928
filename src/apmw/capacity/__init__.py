"""Closed-loop solve, SLO search for N*, power, energy and cost per session, fleet sizing."""

from apmw.capacity.plan import InfeasibleError, Plan, plan

__all__ = ["InfeasibleError", "Plan", "plan"]
