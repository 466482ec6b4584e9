"""The grading rule for one item, in the calling process: cheap verdicts first, then math-verify.

For ``(gold, text, task)``: ``pred = extract_answer(text)`` (``None`` is incorrect); ``task == "arith"``
is exact numeric equality, both sides read as fractions (``"420" == "420.0"``, ``"-3/4" == "-0.75"``, but
``"419.9999" != "420"``); otherwise identical normalised strings are correct, else math-verify decides,
gold first. :func:`_shortcut` is the cheap part, which :class:`isocompute.tasks.grading.Grader` also runs
in the parent before sending the rest to its pool; :func:`grade` is the pure entry point the training
reward uses (see :mod:`isocompute.tasks.grading` for the whole story, timeouts included).

Ignores: partial credit, multiple-choice letter matching, units beyond what math-verify normalises.

>>> from isocompute.tasks.base import Problem
>>> grade(Problem("arith-0", "What is 2 + 2?", "4", "arith"), "2 + 2 = 4. The answer is 4.")
True
"""

from __future__ import annotations

from fractions import Fraction

from isocompute.tasks.answers.extract import extract_answer, normalize_answer
from isocompute.tasks.base import Problem
from isocompute.tasks.grading_workers import _RIGHT, _math_equal_status

__all__ = ["NUMERIC_TASKS", "answer_correct", "grade", "numbers_equal"]

NUMERIC_TASKS = frozenset({"arith"})


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


def answer_correct(gold: str, text: str, task: str, *, timeout: float | None = 5.0) -> bool:
    """The grading rule for one item in this process; ``text`` is a completion or an extracted answer.

    ``timeout`` (seconds) is enforced with ``SIGALRM`` only on the main thread; it cannot stop sympy
    stuck inside C code — use :class:`~isocompute.tasks.grading.Grader` for untrusted batches.
    """
    gold_n, pred, verdict = _shortcut(gold, text, task)
    if verdict is not None:
        return verdict
    assert pred is not None  # _shortcut returns a verdict when there is no prediction
    return _math_equal_status(gold_n, pred, timeout) == _RIGHT


def grade(problem: Problem, completion: str) -> bool:
    """Is ``completion``'s final answer equal to ``problem.gold``? Pure; a timeout (5 s) is incorrect."""
    return answer_correct(problem.gold, completion, problem.task)
