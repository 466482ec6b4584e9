"""Running independent jobs — the folds of a cross-validation — in this process or in worker processes.

``run_jobs(fn, ctx, jobs, workers=W)`` returns ``[fn(ctx, job) for job in jobs]``, in job order, whatever
``W``: with ``W > 1`` the jobs run in a pool of ``W`` worker processes (``forkserver``: no fork of a
process that holds threads), each of which receives the shared, read-only context ``ctx`` once (the
outcome arrays, the config) rather than with every job. ``fn`` must be a module-level function (it is
pickled by reference). Results are equal to the sequential ones as long as ``fn`` draws its randomness
from explicit seeds in ``ctx`` and ``job``, as the CV folds do (each fold's policy has its own seed), so
``workers`` changes the wall-clock only. ``workers=0`` means one per CPU core.

Ignores: jobs that fail part-way (the first exception propagates, as it would sequentially).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from isocompute.errors import InputError

_CTX: Any = None  # the shared context, set once per worker process


def _set_context(ctx: Any) -> None:
    global _CTX
    _CTX = ctx


def _call(fn: Callable[[Any, Any], Any], job: Any) -> Any:
    return fn(_CTX, job)


def resolve_workers(workers: int) -> int:
    """``workers`` as a process count: 0 → one per CPU core; InputError below 0."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise InputError(f"workers must be an integer ≥ 0 (0: one per CPU core); you passed {workers!r}.")
    return workers or (os.cpu_count() or 1)


def run_jobs(fn: Callable[[Any, Any], Any], ctx: Any, jobs: Sequence[Any], *, workers: int = 1,
             done: Callable[[], None] | None = None) -> list[Any]:
    """``[fn(ctx, job) for job in jobs]`` (module docstring); ``done()`` is called after each job."""
    n = min(resolve_workers(workers), len(jobs))
    if n <= 1:
        out = []
        for job in jobs:
            out.append(fn(ctx, job))
            if done is not None:
                done()
        return out
    pool = ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("forkserver"),
                               initializer=_set_context, initargs=(ctx,))
    with pool:
        futures = [pool.submit(_call, fn, job) for job in jobs]
        results = []
        for fut in futures:
            results.append(fut.result())
            if done is not None:
                done()
    return results
