"""math-verify, called safely: checked once that it grades, its own timeouts off, parsed golds cached.

:func:`math_equal` is math-verify's equivalence of two extracted answers (gold first, because math-verify
is not symmetric); :func:`_parse_boxed` its cached parse of one answer, which
:mod:`isocompute.tasks.answers.math_forms` reads too. math-verify's own timeouts use ``SIGALRM`` and cannot run
outside the main thread, so they are switched off (``parsing_timeout=None``, ``timeout_seconds=None``);
callers bound each item themselves (:mod:`isocompute.tasks.grading_workers`).

Ignores: timeouts (see above) and everything the grading rule decides before math-verify is asked.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

from isocompute.errors import DependencyError

__all__ = ["math_equal", "require_math_verify"]


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
