"""The plan's worker processes: results in job order, inputs that cannot be pickled (the
compiled build's packing objects cannot be unpickled, so a worker must inherit them), a job's
error and a worker's death reported as WorkerError rather than a hang."""

from __future__ import annotations

import os
import threading

import pytest

from extender.simulate.workers import WorkerError, run_jobs


class Unpicklable:
    """Stands for an input pickling cannot carry: it refuses to be pickled at all."""

    def __init__(self, values: list[int]) -> None:
        self.values = values
        self.lock = threading.Lock()  # a lock cannot be pickled

    def __reduce__(self) -> str:
        raise TypeError("Unpicklable cannot be pickled")


def test_jobs_run_in_workers_on_inputs_that_are_never_pickled() -> None:
    data = Unpicklable(list(range(10)))
    seen: list[tuple[int, int]] = []
    parent = os.getpid()
    out = run_jobs(
        lambda k: (data.values[k] ** 2, os.getpid() != parent),
        10,
        jobs=2,
        done=lambda a, b: seen.append((a, b)),
    )
    assert [v for v, _ in out] == [k * k for k in range(10)]
    assert all(in_worker for _, in_worker in out)
    assert seen[-1] == (10, 10) and len(seen) == 10


def test_one_job_at_a_time_runs_here() -> None:
    parent = os.getpid()
    assert run_jobs(lambda k: os.getpid() == parent, 3, jobs=1) == [True, True, True]


def test_a_jobs_error_is_reported() -> None:
    def job(k: int) -> int:
        if k == 3:
            raise ValueError("bad input")
        return k

    with pytest.raises(WorkerError, match=r"job 3: ValueError: bad input"):
        run_jobs(job, 6, jobs=2)


def test_a_dead_worker_is_reported() -> None:
    def job(k: int) -> int:
        if k == 1:
            os._exit(3)
        return k

    with pytest.raises(WorkerError, match="exit code 3"):
        run_jobs(job, 4, jobs=2)
