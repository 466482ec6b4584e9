"""Grading: is a completion's final answer equal to the reference answer?

Two entry points share one rule:

* :func:`grade` — pure, one item, in the calling process (the training reward uses it);
* :class:`Grader` — a reusable process pool for thousands of items (the sampler uses it).

The rule for ``(gold, text, task)``:

1. ``pred = extract_answer(text)`` (see :mod:`isocompute.tasks.extract`); ``None`` is incorrect.
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

Ignores: partial credit, multiple-choice letter matching, units beyond what math-verify normalises.

>>> from isocompute.tasks.base import Problem
>>> grade(Problem("arith-0", "What is 2 + 2?", "4", "arith"), "2 + 2 = 4. The answer is 4.")
True
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import Any

from isocompute.errors import DependencyError, InputError
from isocompute.tasks.base import Problem
from isocompute.tasks.extract import extract_answer, normalize_answer

__all__ = [
    "GradeResult", "Grader", "MapResult", "answer_correct", "grade", "map_in_process", "math_equal", "numbers_equal",
    "require_math_verify",
]

logger = logging.getLogger(__name__)

NUMERIC_TASKS = frozenset({"arith"})

# Status codes a worker returns per item.
_WRONG, _RIGHT, _TIMEOUT = 0, 1, 2


# ------------------------------------------------------------------------------------------ the rule
def _to_number(s: str) -> Fraction | None:
    try:
        return Fraction(normalize_answer(s))
    except (ValueError, ZeroDivisionError):
        return None


def numbers_equal(gold: str, pred: str) -> bool:
    """Exact numeric equality after trivial normalisation; a non-number is never equal.

    >>> numbers_equal("1,000", "1000.0"), numbers_equal("3/4", "0.75"), numbers_equal("7", "seven")
    (True, True, False)
    """
    a, b = _to_number(gold), _to_number(pred)
    return a is not None and b is not None and a == b


class _MathVerifyNoise(logging.Filter):
    """Drop math-verify's one-off warning that its timeouts are off: here that is deliberate."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout is disabled")


@lru_cache(maxsize=1)
def _math_verify() -> tuple[Any, Any]:
    """math-verify's ``(parse, verify)``, after checking once that it really grades.

    Imported lazily: math-verify pulls in sympy (~1 s), which ``import isocompute.tasks`` should not pay.
    The known-answer check matters because math-verify's ``parse`` turns any exception — a missing
    LaTeX parser (antlr4) among them — into "no answer" logged at DEBUG, so a broken install would grade
    every math answer wrong without a word. A failure raises :class:`DependencyError`; lru_cache does
    not cache it, so every later call raises it again rather than grading.
    """
    fix = "reinstall it with `pip install 'math-verify[antlr4_13_2]'`"
    try:
        from math_verify import parse, verify
    except ImportError as e:
        raise DependencyError(f"math-verify is not installed or does not import ({e}); {fix}.") from e
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_MathVerifyNoise())
    try:
        # \frac{2}{4} and \frac{1}{2} differ as strings, so only a working LaTeX parser calls them equal.
        half, two_quarters = (parse(t, parsing_timeout=None) for t in ("$\\frac{1}{2}$", "$\\frac{2}{4}$"))
        works = bool(verify(half, two_quarters, timeout_seconds=None))
    except Exception as e:  # whatever broke inside math-verify, the message names it
        raise DependencyError(f"math-verify cannot parse LaTeX ({type(e).__name__}: {e}); {fix}.") from e
    if not works:
        raise DependencyError(
            "math-verify cannot parse LaTeX: it grades \\frac{1}{2} and \\frac{2}{4} as different (its own "
            f"error is logged by the `math_verify` logger at DEBUG); {fix}."
        )
    return parse, verify


def require_math_verify() -> None:
    """Raise :class:`DependencyError` unless math-verify imports and grades ``1/2 = 2/4``; cached.

    Call it before work whose grading will need math-verify, so a broken install stops the job at
    start-up, not after hours of sampling.
    """
    _math_verify()


@lru_cache(maxsize=4096)
def _parse_boxed(answer: str) -> Any:
    # Gold answers repeat (n samples per prompt), so parsed golds are cached. An exception (our soft
    # timeout) propagates through lru_cache without being cached.
    parse, _ = _math_verify()
    return parse("\\boxed{" + answer + "}", parsing_timeout=None)


def math_equal(gold: str, pred: str) -> bool:
    """math-verify equivalence of two extracted answers, gold first; no timeout of its own.

    >>> math_equal("\\\\frac{1}{2}", "0.5"), math_equal("(1, 2)", "(2, 1)")
    (True, False)
    """
    _, verify = _math_verify()
    return bool(verify(_parse_boxed(gold), _parse_boxed(pred), timeout_seconds=None))


def _shortcut(gold: str, text: str, task: str) -> tuple[str, str | None, bool | None]:
    """Cheap part of the rule: (normalised gold, extracted pred, verdict or None if math-verify must decide)."""
    gold_n = normalize_answer(gold)
    pred = extract_answer(text)
    if pred is None:
        return gold_n, None, False
    if task in NUMERIC_TASKS:
        return gold_n, pred, numbers_equal(gold_n, pred)
    if pred == gold_n:
        return gold_n, pred, True
    return gold_n, pred, None


class _ItemTimeout(BaseException):
    """Raised by our interval timer. A BaseException so math-verify's ``except Exception`` lets it out."""


@contextmanager
def _soft_timeout(seconds: float | None) -> Iterator[None]:
    """Raise :class:`_ItemTimeout` after ``seconds`` of wall time; a no-op off the main thread."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise _ItemTimeout

    previous = signal.signal(signal.SIGALRM, on_alarm)
    outer_delay, outer_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    started = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_delay:
            # The caller had its own timer running (pytest-timeout, a trainer's watchdog): re-arm what
            # is left of it rather than silently cancelling it.
            left = max(outer_delay - (time.monotonic() - started), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left, outer_interval)


def _math_equal_status(gold: str, pred: str, timeout: float | None) -> int:
    # Outside the try: a broken math-verify is the job's error, not one wrong answer.
    require_math_verify()
    try:
        with _soft_timeout(timeout):
            return _RIGHT if math_equal(gold, pred) else _WRONG
    except _ItemTimeout:
        return _TIMEOUT
    except Exception:  # an unparsable answer is a wrong answer, not a crashed batch
        logger.debug("math-verify failed on gold=%r pred=%r", gold[:80], pred[:80], exc_info=True)
        return _WRONG


def _math_key_status(answer: str, timeout: float | None) -> Any:
    from isocompute.tasks.math_forms import math_key  # lazily: math_forms reads parses through this module

    try:
        with _soft_timeout(timeout):
            return math_key(answer)
    except _ItemTimeout:
        return _TIMEOUT
    except Exception:  # an unparsable answer has no canonical form; it is compared as a string
        logger.debug("math-verify could not parse %r", answer[:80], exc_info=True)
        return None


def answer_correct(gold: str, text: str, task: str, *, timeout: float | None = 5.0) -> bool:
    """The grading rule for one item in this process; ``text`` is a completion or an extracted answer.

    ``timeout`` (seconds) is enforced with ``SIGALRM`` only on the main thread; it cannot stop sympy
    stuck inside C code — use :class:`Grader` for untrusted batches.
    """
    gold_n, pred, verdict = _shortcut(gold, text, task)
    if verdict is not None:
        return verdict
    assert pred is not None  # _shortcut returns a verdict when there is no prediction
    return _math_equal_status(gold_n, pred, timeout) == _RIGHT


def grade(problem: Problem, completion: str) -> bool:
    """Is ``completion``'s final answer equal to ``problem.gold``? Pure; a timeout (5 s) is incorrect."""
    return answer_correct(problem.gold, completion, problem.task)


# ------------------------------------------------------------------------------------------ the pool
def _worker_init() -> None:
    _math_verify()
    math_equal("1", "1")  # warm sympy's caches and the LaTeX parser before the first deadline starts


def _worker_ready() -> int:
    import os

    return os.getpid()


def _verify_chunk(pairs: list[tuple[str, str]], timeout: float | None) -> list[int]:
    """Worker side: math-verify status for each (gold, pred), each under its own soft timeout."""
    return [_math_equal_status(g, p, timeout) for g, p in pairs]


def _key_chunk(answers: list[str], timeout: float | None) -> list[Any]:
    """Worker side: :func:`~isocompute.tasks.math_forms.math_key` of each answer, ``_TIMEOUT`` (an int)
    where it ran out of time."""
    return [_math_key_status(a, timeout) for a in answers]


# What Grader.map can run in its workers: a name, so callers need not import private functions.
_POOL_FUNCTIONS = {"verify": _verify_chunk, "math_key": _key_chunk}


def _map_values(function: str, raw: list[Any]) -> MapResult:
    """Timeouts (``_TIMEOUT``) become ``None`` and are listed; verify statuses become booleans."""
    timed_out = [i for i, v in enumerate(raw) if type(v) is int and v == _TIMEOUT]
    values = list(raw)
    for i in timed_out:
        values[i] = None
    if function == "verify":
        values = [None if v is None else v == _RIGHT for v in values]
    return MapResult(values, timed_out)


def map_in_process(
    function: str, items: Sequence[Any], *, timeout: float | None = None, deadline: float | None = None
) -> MapResult:
    """:meth:`Grader.map` in this process: the same values, each item under a soft timeout (default
    5 s; it holds on the main thread only). Items still to do when ``deadline`` (a ``time.monotonic()``
    value) passes are not run: their value is ``None`` and they are listed as timed out.
    """
    if function not in _POOL_FUNCTIONS:
        raise InputError(f"map_in_process runs one of {sorted(_POOL_FUNCTIONS)}; you passed {function!r}.")
    run = _POOL_FUNCTIONS[function]
    raw: list[Any] = []
    for item in items:
        if deadline is not None and time.monotonic() >= deadline:
            raw.append(_TIMEOUT)
            continue
        left = None if deadline is None else max(deadline - time.monotonic(), 1e-3)
        per_item = 5.0 if timeout is None else timeout
        raw += run([item], per_item if left is None else min(per_item, left))
    return _map_values(function, raw)


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
class MapResult:
    """Outcome of :meth:`Grader.map`: ``values[i]`` for item ``i`` (``None`` where it timed out or
    crashed a worker, both listed); ``restarts`` counts pool rebuilds."""

    values: list[Any]
    timed_out: list[int] = field(default_factory=list)
    crashed: list[int] = field(default_factory=list)
    restarts: int = 0


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
        values :func:`~isocompute.tasks.math_forms.math_key`. ``timeout`` (seconds per item) defaults to
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
