"""Independent jobs in forked worker processes. A worker inherits the job function and its
inputs through fork, so they are never pickled (the compiled build's packing classes cannot be
unpickled); only job numbers go to the workers and only results come back, through queues.
Results must therefore be plain picklable data.

Where the platform cannot fork, or with one job at a time, the jobs run in this process.
"""

from __future__ import annotations

import multiprocessing
import queue
from collections.abc import Callable
from multiprocessing.context import ForkProcess
from typing import TypeVar

R = TypeVar("R")
#: Seconds between checks that the workers are still alive while waiting for a result.
POLL_S = 1.0


class WorkerError(RuntimeError):
    """A job raised in a worker (the message names the job and the error), or a worker died."""


def run_jobs(
    job: Callable[[int], R],
    count: int,
    *,
    jobs: int,
    done: Callable[[int, int], None] | None = None,
) -> list[R]:
    """[job(0), ..., job(count - 1)], in up to `jobs` processes; `done(finished, count)` after
    each. Raises WorkerError."""
    if jobs <= 1 or count <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        out = []
        for k in range(count):
            out.append(job(k))
            if done is not None:
                done(k + 1, count)
        return out
    ctx = multiprocessing.get_context("fork")
    tasks: multiprocessing.Queue[int | None] = ctx.Queue()
    answers: multiprocessing.Queue[tuple[int, R | None, str | None]] = ctx.Queue()
    for k in range(count):
        tasks.put(k)
    workers = [
        ctx.Process(target=_work, args=(job, tasks, answers), daemon=True)
        for _ in range(min(jobs, count))
    ]
    for _ in workers:
        tasks.put(None)
    for w in workers:
        w.start()
    results: dict[int, R] = {}
    try:
        while len(results) < count:
            try:
                k, value, error = answers.get(timeout=POLL_S)
            except queue.Empty:
                _check_alive(workers)
                continue
            if error is not None:
                raise WorkerError(f"job {k}: {error}")
            results[k] = value  # type: ignore[assignment]
            if done is not None:
                done(len(results), count)
    finally:
        for w in workers:
            if w.is_alive():
                w.terminate()
            w.join(timeout=10)
    return [results[k] for k in range(count)]


def _check_alive(workers: list[ForkProcess]) -> None:
    """Raise where a worker died, or where all ended with jobs not reported (nothing more can
    come)."""
    for w in workers:
        if not w.is_alive() and w.exitcode not in (0, None):
            raise WorkerError(f"a worker process ended with exit code {w.exitcode}")
    if not any(w.is_alive() for w in workers):
        raise WorkerError("the worker processes ended before every job was reported")


def _work(
    job: Callable[[int], R],
    tasks: multiprocessing.Queue[int | None],
    answers: multiprocessing.Queue[tuple[int, R | None, str | None]],
) -> None:
    while (k := tasks.get()) is not None:
        try:
            answers.put((k, job(k), None))
        except Exception as exc:  # reported to the parent, which raises it
            answers.put((k, None, f"{type(exc).__name__}: {exc}"))
