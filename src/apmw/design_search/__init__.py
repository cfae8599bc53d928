"""Which deployment to run: the spec's workload and SLO planned on every point of a design space.

A space names spec fields by their dotted path and lists the values to try (``space``). Each point
is the spec with those fields set, solved by ``apmw plan`` (``point``); one that is not a valid
spec, does not fit its memory or meets the SLO at no N is pruned, with the reason. Points are
planned in this process, on a local process pool or on a Ray cluster (``executor``), saved to
Parquet as they arrive and resumable (``store``). The answer is the Pareto front of agents per MW
against per-agent output speed (tokens/s at the p95 time per output token, the way interactivity
curves are read), the best point per objective and each front point's engine flags (``answer``);
``check_front`` settles N* in the simulator for the best front points, as ``apmw plan`` does.

Each point costs one plan, its N* search galloping up from one agent as ``apmw plan``'s does (10-50 ms a point
on the bundled examples' default spaces, one process): the evaluation vectorised across points that
share a workload sample, which the issue asks for, is not built yet.
"""

from apmw.design_search.answer import OBJECTIVES, Point, SearchAnswer
from apmw.design_search.check import check_front
from apmw.design_search.point import launch_flags
from apmw.design_search.run import search, spec_document
from apmw.design_search.space import MAX_POINTS, configs_beside, default_space, read_space, search_key
from apmw.design_search.store import ResultStore, write_csv

__all__ = ["MAX_POINTS", "OBJECTIVES", "Point", "ResultStore", "SearchAnswer", "check_front", "configs_beside",
           "default_space", "launch_flags", "read_space", "search", "search_key", "spec_document", "write_csv"]
