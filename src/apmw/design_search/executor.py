"""Where a search's points are planned: in this process, on a local process pool, or on a Ray cluster.

Points go out in batches of consecutive points (one task each) and come back as rows, batch by
batch, in the order they finish. Only the driver keeps rows, so a worker that dies mid-batch loses
nothing: its batch runs again elsewhere (Ray's task retries; a new pool for the process pool) and
its rows arrive once. Planning a point is deterministic (the spec carries its seed), so where a
point ran does not change its row.
"""

from __future__ import annotations

import contextlib
import math
import socket
import sys
import multiprocessing
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Callable, Iterator

from apmw.design_search.point import evaluate_batch
from apmw.errors import ApmwError

# Times a batch is sent again after the process that ran it died (Ray's default for tasks is 3).
MAX_RETRIES = 3
# Seconds to wait for a Ray cluster's port to answer.
CONNECT_TIMEOUT_S = 5.0
# Points per task: big enough that sending the spec is small beside planning (about 0.1 s a point),
# small enough that a lost worker costs little and progress moves.
MAX_BATCH = 16
# Batches per worker at least, so that uneven points (pruned ones are fast) even out.
BATCHES_PER_WORKER = 4


def batches(todo: list[tuple[int, dict]], workers: int) -> list[list[tuple[int, dict]]]:
    """``todo`` cut into batches of consecutive points for ``workers`` workers."""
    size = max(1, min(MAX_BATCH, math.ceil(len(todo) / (workers * BATCHES_PER_WORKER))))
    return [todo[i:i + size] for i in range(0, len(todo), size)]


def execute(base: dict, todo: list[tuple[int, dict]], workers: int = 1,
            ray_address: str | None = None, fn: Callable = evaluate_batch) -> Iterator[list[dict]]:
    """The rows of every point of ``todo``, a batch at a time as batches finish; ``fn(base, batch)``
    gives a batch's rows (a module-level function, so that workers can import it)."""
    if ray_address is not None:
        yield from _on_ray(base, todo, ray_address, fn)
    elif workers <= 1:
        for point in todo:
            yield fn(base, [point])
    else:
        yield from _on_pool(base, todo, workers, fn)


def _pool_context():
    """Workers forked from a server that imported the planner once: they start in milliseconds and
    share nothing with this process (its threads, its state) but the arguments."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["apmw.design_search.point"])
    return context


def _on_pool(base: dict, todo: list[tuple[int, dict]], workers: int, fn: Callable = evaluate_batch) -> Iterator[list[dict]]:
    """A local process pool of ``workers`` processes."""
    waiting = dict(enumerate(batches(todo, workers)))
    for attempt in range(MAX_RETRIES + 1):
        with ProcessPoolExecutor(max_workers=workers, mp_context=_pool_context()) as pool:
            running = {pool.submit(fn, base, batch): i for i, batch in waiting.items()}
            try:
                while running:
                    done, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in done:
                        i = running.pop(future)
                        rows = future.result()
                        del waiting[i]
                        yield rows
            except BrokenProcessPool:
                if attempt == MAX_RETRIES:
                    raise ApmwError(f"the process pool lost a worker {MAX_RETRIES + 1} times; {len(waiting)} "
                                    "batch(es) were not planned (out of memory? try fewer --workers)") from None
            finally:
                for future in running:
                    future.cancel()
        if not waiting:
            return


def _on_ray(base: dict, todo: list[tuple[int, dict]], address: str, fn: Callable = evaluate_batch) -> Iterator[list[dict]]:
    """An existing Ray cluster (``auto``, ``host:port`` or ``ray://host:port``); its workers need apmw
    importable (a local cluster started from the same environment has it)."""
    try:
        import ray
    except ImportError:
        raise ApmwError("--ray needs Ray, which is not installed: pip install 'apmw[ray]'") from None
    with contextlib.redirect_stdout(sys.stderr):      # Ray reports a lost worker on stdout; --json owns it
        yield from _ray_tasks(ray, base, todo, address, fn)


def _reachable(address: str) -> None:
    """A cluster address names a port that answers, checked first: Ray itself waits for one for minutes."""
    if address == "auto":
        return              # Ray reads the local cluster's address, and says at once when there is none
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ApmwError(f"--ray {address}: give auto, host:port (the head's GCS port, 6379 unless set) or "
                        "ray://host:port (the Ray client port, 10001 unless set)")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ApmwError(f"--ray {address}: nothing answers there ({exc.strerror or exc}); start a cluster with "
                        "'ray start --head', or leave out --ray to use a local process pool") from None


def _ray_tasks(ray, base: dict, todo: list[tuple[int, dict]], address: str, fn: Callable = evaluate_batch) -> Iterator[list[dict]]:
    _reachable(address)
    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False, configure_logging=False)
    except Exception as exc:      # Ray raises ConnectionError, RuntimeError or its own types here
        raise ApmwError(f"--ray {address}: cannot join the Ray cluster ({str(exc).splitlines()[0][:200]}); start "
                        "one with 'ray start --head', or leave out --ray to use a local process pool") from None
    try:
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        task = ray.remote(num_cpus=1, max_retries=MAX_RETRIES)(fn)
        base_ref = ray.put(base)
        pending = [task.remote(base_ref, batch) for batch in batches(todo, cpus)]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                rows = ray.get(done[0])
            except ray.exceptions.RayError as exc:
                raise ApmwError(f"a Ray task failed after {MAX_RETRIES} retries: {str(exc).splitlines()[0][:300]}"
                                ) from None
            yield rows
    finally:
        ray.shutdown()
