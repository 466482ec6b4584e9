"""What grading's workers run: one item under a soft timeout, chunks of items, and the same in this process.

Each item runs under an interval timer (``SIGALRM``) in the calling process's main thread: a runaway
comparison (``10^{10^{8}}+1`` makes sympy build a 100-million-digit integer; CPython's big-integer loops
check for signals) raises there and the item is marked timed out (``_TIMEOUT``) — the worker survives.
Off the main thread the timer is a no-op. The functions a pool may run are named in ``_POOL_FUNCTIONS``
(``"verify"``, ``"math_key"``), so callers need not import private functions; :func:`map_in_process` runs
them here, item by item, with an optional deadline.

Ignores: code that never returns to the interpreter (a C extension that ignores signals) — only
:class:`isocompute.tasks.grading.Grader`'s kill of the whole worker stops that.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from isocompute.errors import InputError
from isocompute.tasks.answers.math_forms import math_key
from isocompute.tasks.verify import _math_verify, math_equal, require_math_verify

__all__ = ["MapResult", "map_in_process"]

# One logger for all of grading, as before it was split into modules.
logger = logging.getLogger("isocompute.tasks.grading")

# Status codes a worker returns per item.
_WRONG, _RIGHT, _TIMEOUT = 0, 1, 2


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
    try:
        with _soft_timeout(timeout):
            return math_key(answer)
    except _ItemTimeout:
        return _TIMEOUT
    except Exception:  # an unparsable answer has no canonical form; it is compared as a string
        logger.debug("math-verify could not parse %r", answer[:80], exc_info=True)
        return None


# ------------------------------------------------------------------------------------------ worker side
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
    """Worker side: :func:`~isocompute.tasks.answers.math_forms.math_key` of each answer, ``_TIMEOUT`` (an int)
    where it ran out of time."""
    return [_math_key_status(a, timeout) for a in answers]


# What Grader.map can run in its workers: a name, so callers need not import private functions.
_POOL_FUNCTIONS = {"verify": _verify_chunk, "math_key": _key_chunk}


@dataclass(slots=True)
class MapResult:
    """Outcome of :meth:`Grader.map`: ``values[i]`` for item ``i`` (``None`` where it timed out or
    crashed a worker, both listed); ``restarts`` counts pool rebuilds."""

    values: list[Any]
    timed_out: list[int] = field(default_factory=list)
    crashed: list[int] = field(default_factory=list)
    restarts: int = 0


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
