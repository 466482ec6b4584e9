"""Grading: is a completion's final answer equal to the reference answer?

Two entry points share one rule:

* :func:`grade` — pure, one item, in the calling process (the training reward uses it);
* :class:`Grader` — a reusable process pool for thousands of items (the sampler uses it).

The rule for ``(gold, text, task)``:

1. ``pred = extract_answer(text)`` (see :mod:`isocompute.tasks.answers.extract`); ``None`` is incorrect.
2. ``task == "arith"``: exact numeric equality, both sides read as fractions — ``"420" == "420.0"``,
   ``"-3/4" == "-0.75"``, but ``"419.9999" != "420"``.
3. otherwise, identical normalised strings are correct; else math-verify decides:
   ``verify(parse("\\boxed{gold}"), parse("\\boxed{pred}"))`` — gold first, because math-verify is not
   symmetric (assignments and intervals are read differently on each side).

Timeouts. math-verify's own timeouts use ``SIGALRM`` and cannot run outside the main thread, so they are
switched off (``parsing_timeout=None``, ``timeout_seconds=None``) and replaced by ours, in two layers:

* soft: each item runs under an interval timer in the worker's main thread. A runaway comparison
  (``10^{10^{8}}+1`` makes sympy build a 100-million-digit integer; CPython's big-integer loops check
  for signals) raises there and the item is marked timed out — the worker survives;
* hard: code that never returns to the interpreter (a C extension that ignores signals) would outlive
  that timer, so the parent gives each chunk ``len(chunk) * timeout + grace`` seconds, then kills the
  pool's processes, rebuilds the pool and re-runs that chunk's items one at a time, alone, to find the
  culprit. A worker that dies (segfault, out-of-memory kill) is handled the same way.

A timed-out or crashed item counts as incorrect and is listed in :class:`GradeResult`.

Where it lives: this module is the pool (:class:`Grader`); the rule for one item is
:mod:`isocompute.tasks.grading_rule`, what the workers run (soft timeouts, :func:`map_in_process`)
:mod:`isocompute.tasks.grading_workers`, and the math-verify calls :mod:`isocompute.tasks.verify`. Their
public names are importable from here too.

Ignores: partial credit, multiple-choice letter matching, units beyond what math-verify normalises.

>>> from isocompute.tasks.base import Problem
>>> grade(Problem("arith-0", "What is 2 + 2?", "4", "arith"), "2 + 2 = 4. The answer is 4.")
True
"""

from __future__ import annotations

import logging
import multiprocessing
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

from isocompute.errors import DependencyError, InputError
from isocompute.tasks.grading_rule import NUMERIC_TASKS, _shortcut, answer_correct, grade, numbers_equal  # noqa: F401
from isocompute.tasks.grading_workers import (
    _POOL_FUNCTIONS,
    _RIGHT,
    _TIMEOUT,
    _WRONG,
    MapResult,
    _map_values,
    _verify_chunk,
    _worker_init,
    _worker_ready,
    map_in_process,
)
from isocompute.tasks.verify import _math_verify, _parse_boxed, math_equal, require_math_verify  # noqa: F401

__all__ = [
    "GradeResult", "Grader", "MapResult", "answer_correct", "grade", "map_in_process", "math_equal", "numbers_equal",
    "require_math_verify",
]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class GradeResult:
    """Outcome of :meth:`Grader.run`: ``correct[i]`` for pair ``i``; timed-out and crashed items are
    incorrect and their indices listed; ``restarts`` counts pool rebuilds after a hang or crash."""

    correct: list[bool]
    answers: list[str | None]
    timed_out: list[int] = field(default_factory=list)
    crashed: list[int] = field(default_factory=list)
    restarts: int = 0
    seconds: float = 0.0


@dataclass(slots=True)
class _Chunk:
    indices: list[int]
    alone: bool = False  # a suspect after a hang or crash: run with nothing else in flight


class Grader:
    """A reusable process pool applying the grading rule to many items.

    ``workers`` processes (``start_method`` "forkserver" where available, else "spawn" — never "fork",
    which would copy the caller's threads and locks); ``timeout`` seconds per item; items go to the pool
    in chunks of ``chunk_size``; a chunk is killed after ``len(chunk) * timeout + grace`` seconds.
    ``soft_timeout=False`` skips the in-worker timer and relies on the kill alone (slower to recover;
    it exists to exercise the kill path with a real workload).

    >>> with Grader(workers=1) as g:                               # doctest: +SKIP
    ...     g.grade_many([("\\\\frac12", "so \\\\boxed{0.5}", "math"), ("18", "#### 17", "gsm8k")])
    [True, False]
    """

    def __init__(
        self,
        *,
        workers: int = 2,
        timeout: float = 5.0,
        chunk_size: int = 16,
        grace: float = 10.0,
        start_method: str | None = None,
        startup_timeout: float = 120.0,
        soft_timeout: bool = True,
    ) -> None:
        if workers < 1:
            raise InputError(f"workers must be ≥ 1; you passed {workers}.")
        if not timeout > 0:
            raise InputError(f"timeout must be > 0 seconds; you passed {timeout}.")
        if chunk_size < 1:
            raise InputError(f"chunk_size must be ≥ 1; you passed {chunk_size}.")
        if grace < 0:
            raise InputError(f"grace must be ≥ 0 seconds; you passed {grace}.")
        methods = multiprocessing.get_all_start_methods()
        start_method = start_method or ("forkserver" if "forkserver" in methods else "spawn")
        if start_method not in ("forkserver", "spawn") or start_method not in methods:
            raise InputError(
                f"start_method must be 'forkserver' or 'spawn' (available here: {methods}); "
                f"you passed {start_method!r}."
            )
        self.workers = workers
        self.timeout = timeout
        self.chunk_size = chunk_size
        self.grace = grace
        self.start_method = start_method
        self.startup_timeout = startup_timeout
        self.soft_timeout = soft_timeout
        self._pool: ProcessPoolExecutor | None = None

    # -- lifecycle
    def __enter__(self) -> Grader:
        self._ensure_pool()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Shut the pool down; the next call starts a fresh one."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _ensure_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # Checked here, in the parent, so the error reaches the caller with its message; a worker
            # whose initializer raises only leaves a BrokenProcessPool behind.
            require_math_verify()
            ctx = multiprocessing.get_context(self.start_method)
            if self.start_method == "forkserver":
                # Workers fork from a server that has math-verify imported, so a rebuild after a kill
                # costs milliseconds, not a second of sympy imports. Only takes effect before the
                # process's forkserver first starts; harmless otherwise.
                ctx.set_forkserver_preload(["__main__", "math_verify", __name__])
            pool = ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=_worker_init)
            # Start every worker now, so process start-up does not eat into the first chunk's deadline.
            ready = [pool.submit(_worker_ready) for _ in range(self.workers)]
            _, late = wait(ready, timeout=self.startup_timeout)
            self._pool = pool
            if late:
                self._kill()
                raise InputError(
                    f"grading workers did not start within {self.startup_timeout:.0f} s; the machine may be "
                    "overloaded — raise startup_timeout or lower workers."
                )
            if any(f.exception() is not None for f in ready):
                self._kill()
                raise DependencyError(
                    "grading workers failed in their initializer (math-verify's import and warm-up; the "
                    "traceback is printed above) although math-verify works in this process; check the "
                    "environment a fresh Python process inherits (PYTHONPATH, the virtualenv)."
                )
        return self._pool

    def _kill(self) -> None:
        """Kill the pool's processes (a hung worker ignores shutdown) and forget the pool."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        # ProcessPoolExecutor has no public kill before Python 3.14 (`kill_workers`); `_processes` is
        # the pid → Process map it keeps for its own shutdown.
        procs = list((getattr(pool, "_processes", None) or {}).values())
        for proc in procs:
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            proc.join(timeout=5)
        logger.debug("killed %d grading worker(s)", len(procs))

    # -- grading
    def grade_many(self, pairs: Sequence[tuple[str, str, str]]) -> list[bool]:
        """``[(gold, completion_or_answer, task), ...]`` → correct flags; timeouts are logged."""
        result = self.run(pairs)
        if result.timed_out or result.crashed:
            logger.warning(
                "grading: %d item(s) timed out after %.1f s and %d crashed a worker; counted incorrect "
                "(indices %s)",
                len(result.timed_out),
                self.timeout,
                len(result.crashed),
                (result.timed_out + result.crashed)[:20],
            )
        return result.correct

    def run(self, pairs: Sequence[tuple[str, str, str]]) -> GradeResult:
        """Grade ``pairs`` and report timeouts and crashes; see the module docstring for the rule."""
        start = time.perf_counter()
        n = len(pairs)
        status = [_WRONG] * n
        answers: list[str | None] = [None] * n
        jobs: list[tuple[str, str]] = [("", "")] * n
        todo: list[int] = []
        for i, (gold, text, task) in enumerate(pairs):
            gold_n, pred, verdict = _shortcut(gold, text, task)
            answers[i] = pred
            if verdict is None:
                jobs[i] = (gold_n, pred or "")
                todo.append(i)
            else:
                status[i] = _RIGHT if verdict else _WRONG
        crashed: list[int] = []
        restarts = self._run_pool(todo, jobs, status, crashed) if todo else 0
        return GradeResult(
            correct=[s == _RIGHT for s in status],
            answers=answers,
            timed_out=[i for i in range(n) if status[i] == _TIMEOUT],
            crashed=sorted(crashed),
            restarts=restarts,
            seconds=time.perf_counter() - start,
        )

    def map(self, function: str, items: Sequence[Any], *, timeout: float | None = None) -> MapResult:
        """Run a worker function over ``items`` in the pool, with the same per-item timeouts and hang or
        crash recovery as grading. ``function``: ``"verify"`` — items are ``(gold, pred)`` extracted
        answers, values ``True``/``False`` (math-verify, gold first); ``"math_key"`` — items are answers,
        values :func:`~isocompute.tasks.answers.math_forms.math_key`. ``timeout`` (seconds per item) defaults to
        the grader's own; a shorter one serves callers with a deadline (the gateway's vote).
        """
        if function not in _POOL_FUNCTIONS:
            raise InputError(f"Grader.map runs one of {sorted(_POOL_FUNCTIONS)}; you passed {function!r}.")
        n = len(items)
        raw: list[Any] = [None] * n
        crashed: list[int] = []
        restarts = self._run_pool(list(range(n)), list(items), raw, crashed, _POOL_FUNCTIONS[function],
                                  timeout) if n else 0
        result = _map_values(function, raw)
        result.crashed, result.restarts = sorted(crashed), restarts
        return result

    def _run_pool(
        self, todo: list[int], jobs: list[Any], status: list[Any], crashed: list[int],
        function: Any = _verify_chunk, timeout: float | None = None,
    ) -> int:
        """Drive chunks of ``function`` through the pool with at most ``workers`` in flight, so each
        chunk starts when submitted and its deadline is honest. Returns the number of pool rebuilds."""
        timeout = self.timeout if timeout is None else timeout
        pending = deque(_Chunk(todo[i : i + self.chunk_size]) for i in range(0, len(todo), self.chunk_size))
        inflight: dict[Future[list[int]], tuple[_Chunk, float]] = {}
        restarts = 0

        def requeue_as_suspects(chunk: _Chunk) -> None:
            pending.extendleft(_Chunk([i], alone=True) for i in reversed(chunk.indices))

        while pending or inflight:
            pool = self._ensure_pool()
            while pending and len(inflight) < self.workers:
                if pending[0].alone and inflight:
                    break
                chunk = pending.popleft()
                fut = pool.submit(
                    function,
                    [jobs[i] for i in chunk.indices],
                    timeout if self.soft_timeout else None,
                )
                inflight[fut] = (chunk, time.monotonic() + len(chunk.indices) * timeout + self.grace)
                if chunk.alone:
                    break
            next_deadline = min(deadline for _, deadline in inflight.values())
            done, _ = wait(
                inflight, timeout=max(0.0, next_deadline - time.monotonic()), return_when=FIRST_COMPLETED
            )
            broken: list[_Chunk] = []
            for fut in done:
                chunk, _ = inflight.pop(fut)
                try:
                    for i, s in zip(chunk.indices, fut.result(), strict=True):
                        status[i] = s
                except BrokenProcessPool:
                    broken.append(chunk)
            now = time.monotonic()
            expired = [f for f, (_, deadline) in inflight.items() if deadline <= now]
            if not broken and not expired:
                continue
            # A hang or a crash: the pool is unusable. Culprits are re-run alone; innocent chunks that
            # were merely in flight are re-run as they were.
            hung = [inflight.pop(f)[0] for f in expired]
            innocent = [chunk for chunk, _ in inflight.values()]
            inflight.clear()
            self._kill()
            restarts += 1
            for chunk in hung:
                if chunk.alone or len(chunk.indices) == 1:
                    status[chunk.indices[0]] = _TIMEOUT
                else:
                    requeue_as_suspects(chunk)
            for chunk in broken:
                if chunk.alone:
                    crashed.append(chunk.indices[0])  # status stays _WRONG
                else:
                    requeue_as_suspects(chunk)
            # A crash cannot be pinned on one in-flight chunk, so the others become suspects too.
            for chunk in innocent:
                if broken:
                    requeue_as_suspects(chunk)
                else:
                    pending.appendleft(chunk)
        return restarts
