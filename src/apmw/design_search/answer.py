"""What a search answers: the feasible points, the pruned ones by reason, the Pareto front, the best per objective."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from apmw.design_search.point import FIGURES

# What each objective reads from a point, and whether more is better.
OBJECTIVES = {"agents_per_mw": True, "agents_per_mw_provisioned": True, "cost_per_session_usd": False,
              "agents_per_gpu": True, "task_latency_p95_s": False, "output_speed_tokens_per_s": True}


@dataclass(frozen=True)
class Point:
    settings: dict                      # dotted path -> value
    figures: dict                       # the objectives, and N* and its binding constraint
    launch: str                         # the engine's command line for this replica
    checked: dict | None = None         # N* settled in the simulator (check_front), or why it was not
    index: int = -1                     # the point's place in the space (space.points)


@dataclass
class SearchAnswer:
    points: list[Point]
    pruned: list[tuple[dict, str, str]] = field(default_factory=list)      # settings, reason, full message
    rows: list[dict] = field(default_factory=list)     # every point's row (point.evaluate_point), in point order
    resumed: int = 0                                   # rows taken from a stopped run's saved results
    as_specified: int | None = None                    # the point that is the spec itself, if the space holds it

    @classmethod
    def from_rows(cls, rows: list[dict]) -> SearchAnswer:
        """The answer the rows of every point give (``point.evaluate_point``), in point order."""
        answer = cls(points=[], rows=sorted(rows, key=lambda r: r["point"]))
        for row in answer.rows:
            settings = json.loads(row["settings"])
            if row["status"] == "feasible":
                answer.points.append(Point(settings=settings, figures={k: row[k] for k in FIGURES},
                                           launch=row["launch"], index=row["point"]))
            else:
                answer.pruned.append((settings, row["reason"], row["message"]))
        return answer

    def front(self) -> list[Point]:
        """Points no other beats on both agents per MW and per-agent output speed, best agents per MW first.
        Where no call outputs a second token (no point has an output speed), the front is the most agents per MW."""
        front: list[Point] = []
        fastest = -math.inf
        for p in sorted(self.points, key=lambda p: (-p.figures["agents_per_mw"], -_speed_sort_key(p))):
            if not front or _speed_sort_key(p) > fastest:
                front.append(p)
                fastest = _speed_sort_key(p)
        return front

    def best(self) -> dict[str, Point]:
        """The best point per objective, of those the objective applies to (none has an output speed where no
        call outputs a second token: that objective is left out)."""
        best = {}
        for name, more in OBJECTIVES.items():
            having = [p for p in self.points if p.figures[name] is not None]
            if having:
                best[name] = (max if more else min)(having, key=lambda p: p.figures[name])
        return best

    def to_dict(self, explain: bool = False) -> dict:
        reasons: dict[str, int] = {}
        for _, why, _ in self.pruned:
            reasons[why] = reasons.get(why, 0) + 1
        out = {
            "evaluated": len(self.points) + len(self.pruned),
            "feasible": len(self.points),
            "pruned": len(self.pruned),
            "pruned_by_reason": reasons,
            "resumed_points": self.resumed,
            "front": [point_dict(p) for p in self.front()],
            "best": {name: point_dict(p) for name, p in self.best().items()},
        }
        out["as_specified"] = self._as_specified()
        if explain:
            out["pruned_points"] = [{"settings": s, "reason": why, "message": msg} for s, why, msg in self.pruned]
        return out

    def _as_specified(self) -> dict | None:
        """The spec's own point: its figures and where it ranks by agents per MW, or why it was pruned."""
        if self.as_specified is None:
            return None
        own = next((p for p in self.points if p.index == self.as_specified), None)
        if own is not None:     # ties share a rank: 1 + the points strictly ahead of it
            ahead = sum(p.figures["agents_per_mw"] > own.figures["agents_per_mw"] for p in self.points)
            return {**point_dict(own), "rank_by_agents_per_mw": 1 + ahead}
        row = next(r for r in self.rows if r["point"] == self.as_specified)
        return {"point": row["point"], "settings": json.loads(row["settings"]), "reason": row["reason"],
                "message": row["message"]}


def _speed_sort_key(p: Point) -> float:
    speed = p.figures["output_speed_tokens_per_s"]
    return -math.inf if speed is None else speed


def point_dict(p: Point) -> dict:
    """A point as the JSON answer writes it: its index, settings, figures, launch line (and checked)."""
    d = {"point": p.index, "settings": p.settings, **p.figures, "launch": p.launch}
    if p.checked is not None:
        d["checked"] = p.checked
    return d
