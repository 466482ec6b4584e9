"""The gateway's vote counts answer classes: a request's answers merged by the task's equivalence rule.

After every wave, each prompt's extracted answers so far (all its waves) go through
:func:`isocompute.tasks.answers.equivalence.vote_classes` with the server's ``answer_kind`` (``number`` by
default; ``math`` for MATH-style answers, where ``(3,\\pi/2)`` and ``(3,\\frac{\\pi}{2})`` are one class):
the plan's stopping rule reads those classes, and the final vote counts them. The same module puts the
offline tables' samples into classes, so the served vote and the estimators agree on what "the same
answer" is.

Where it runs:

* ``math``: math-verify in the gateway's grader pool (:class:`isocompute.tasks.grading.Grader`, started
  with the app), called from ONE worker thread — off the event loop, one merge at a time (the pool is
  not made for concurrent callers);
* the cheap kinds (``number``, ``date``, ``choice``, ``exact``): inline, microseconds per prompt.

Time: one merge of a request's answers gets ``min(vote_timeout_s, what is left of the request's
deadline)``; past it the answers not yet merged vote apart (``Votes.complete`` is False: classes may be
split, never wrongly joined). If the worker thread does not answer in that time (a merge stuck behind
another), the request votes on exact strings instead, so no request outlives its deadline waiting
for a vote. Answers that are all one string need no merging and skip it (:func:`one_string`: the
vote of one sample, or of unanimous waves). Repeats are cheap: math-verify's parses and comparisons are remembered per process
(:mod:`isocompute.tasks.answers.equivalence`), so the merge after a later wave re-reads the earlier waves'
answers for free.

Worked example (``math``): answers ``["(3,\\pi/2)", "(0,3)", "(3,\\frac{\\pi}{2})"]`` → classes
``[0, 1, 0]``, votes ``{"(3,\\pi/2)": 2, "(0,3)": 1}``.

Ignores: weighting votes by a verifier score (``strategy="best_of"`` picks a sample, it does not vote).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from isocompute.tasks.answers.equivalence import Votes, vote_classes
from isocompute.tasks.answers.extract import normalize_answer

__all__ = ["Voter", "one_string"]

log = logging.getLogger("isocompute.app")
MIN_TIMEOUT_S = 1e-3  # vote_classes needs a positive time; past the deadline it then merges nothing


class Voter:
    """Merges each prompt's answers into classes within a request's time (see the module docstring).

    ``kind``: an answer kind of :mod:`isocompute.tasks.answers.equivalence`; ``timeout_s``: the most one merge
    may take; ``grader``: the math-verify pool (used for ``math``; without one math-verify runs in the
    worker thread, with no hard timeout).
    """

    def __init__(self, kind: str, *, timeout_s: float, grader: Any = None) -> None:
        self.kind = kind
        self.timeout_s = timeout_s
        self.grader = grader
        self._thread = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="isocompute-vote")
                        if kind == "math" else None)

    def close(self) -> None:
        """Stop the worker thread (a merge in it finishes first)."""
        if self._thread is not None:
            self._thread.shutdown(wait=True, cancel_futures=True)

    async def classes(self, answers: Sequence[Sequence[str | None]], deadline_at: float) -> list[Votes]:
        """:class:`Votes` of each answer list, by ``deadline_at`` (a ``time.monotonic()`` value) at the latest."""
        same = [one_string(a) for a in answers]
        if all(v is not None for v in same):  # nothing to merge (one sample, or unanimous waves)
            return same  # type: ignore[return-value]
        end = min(time.monotonic() + self.timeout_s, deadline_at)
        if self._thread is None:
            return self._merge(answers, end)
        fut = asyncio.get_running_loop().run_in_executor(self._thread, self._merge, answers, end)
        try:
            # a little past the merge's own end (it stops itself there), never past the deadline
            return await asyncio.wait_for(fut, timeout=max(min(end + 0.05, deadline_at) - time.monotonic(), 0.0))
        except TimeoutError:
            log.warning("merging answers (%s) did not finish in time; this request votes on exact strings",
                        self.kind)
            return [vote_classes(a, "exact", timeout_s=1.0) for a in answers]

    def _merge(self, answers: Sequence[Sequence[str | None]], end: float) -> list[Votes]:
        return [one_string(a) or vote_classes(a, self.kind, timeout_s=max(end - time.monotonic(), MIN_TIMEOUT_S),
                                              grader=self.grader)
                for a in answers]


def one_string(answers: Sequence[str | None]) -> Votes | None:
    """The vote of ``answers`` when they are all one normalised string (or none at all): one class, or
    none, with no merging to do — what :func:`vote_classes` returns for them, without its work. None
    when there is something to merge."""
    first = next((j for j, a in enumerate(answers) if a is not None), None)
    if first is None:
        return Votes([None] * len(answers), [], [], [], None, True, 0.0)
    a = answers[first]
    if a != normalize_answer(a) or any(b is not None and b != a for b in answers):
        return None  # several strings, or one that normalises to another (maybe to nothing): vote_classes decides
    classes: list[int | None] = [None if b is None else 0 for b in answers]
    return Votes(classes, [a], [first], [len(answers) - classes.count(None)], 0, True, 0.0)
