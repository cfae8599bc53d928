"""One search run: the space's points, less those already saved, planned by the executor, each row
kept once, saved as it arrives; the answer from every row."""

from __future__ import annotations

from typing import Callable

from apmw.design_search.answer import SearchAnswer
from apmw.design_search.executor import execute
from apmw.design_search.space import check_paths, points, read_space, space_size, spec_point
from apmw.design_search.store import ResultStore
from apmw.spec import Spec


def spec_document(spec: Spec) -> dict:
    """The spec as the plain document every point's spec is built from."""
    return spec.model_dump(mode="json", by_alias=True, exclude_none=True)


def search(spec: Spec, axes: dict[str, list], progress: Callable[[int, int], None] | None = None, *,
           workers: int = 1, ray_address: str | None = None, store: ResultStore | None = None,
           resume: bool = False) -> SearchAnswer:
    """Plan ``spec`` at every point of ``axes`` (dotted path -> values); the answer keeps every point's row.

    ``workers`` > 1 plans on a local process pool, ``ray_address`` on a Ray cluster. With a
    ``store`` the rows are saved as they arrive; with ``resume`` the rows it already holds are
    taken as they are and only the other points are planned. ``progress(done, total)`` counts points.
    """
    axes = read_space({"axes": axes}, "search axes")   # the checks a --space file gets, for the Python API too
    base = spec_document(spec)
    check_paths(base, axes)
    rows: dict[int, dict] = {}
    if store is not None and resume:
        rows = {r["point"]: r for r in store.saved_rows()}
    total = space_size(axes)
    todo = [(i, s) for i, s in points(axes) if i not in rows]
    if progress is not None:
        progress(len(rows), total)
    try:
        for batch in execute(base, todo, workers=workers, ray_address=ray_address):
            fresh = [r for r in batch if r["point"] not in rows]
            rows.update((r["point"], r) for r in fresh)
            if store is not None:
                store.add(fresh)
            if progress is not None:
                progress(len(rows), total)
    finally:
        if store is not None:
            store.flush()
    answer = SearchAnswer.from_rows(list(rows.values()))
    answer.resumed = total - len(todo)
    answer.as_specified = spec_point(base, axes)
    return answer
