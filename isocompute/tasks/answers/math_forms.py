"""Canonical forms of math answers: what math-verify reads an answer as, and values that cannot match.

:func:`math_key` gives each answer a key (the ``srepr`` of math-verify's parse; equal keys are equal
expressions) and, when the answer is a constant or a set or tuple of constants, its numeric value.
:func:`values_differ` says when two values are so far apart that ``verify`` would say "different"
anyway, so :mod:`isocompute.tasks.answers.equivalence` need not ask it. Checked on the three MATH-500 dumps:
of 5,459 within-problem pairs it rules apart (428 of them sets or tuples), math-verify verifies none
equal. Parses are cached and run without a timeout of their own: call these through
:class:`isocompute.tasks.grading.Grader` (or ``map_in_process``), which bounds each item.

Ignores: intervals, matrices, equations and expressions with symbols (their values are unknown, so
``verify`` always decides them).
"""

from __future__ import annotations

import math
from typing import Any

from isocompute.tasks.verify import _parse_boxed

__all__ = ["Value", "math_key", "values_differ"]

Value = complex | tuple[complex, ...] | None  # what a parse denotes: a constant, a set or tuple of them, or unknown


def math_key(answer: str) -> tuple[str, Value] | None:
    """``(key, value)`` of ``answer`` as math-verify reads it, or ``None`` when it finds no expression.

    ``key`` is the ``srepr`` of its first parse: equal keys are equal expressions, so they need no
    ``verify``. ``value`` is the number it denotes when it is a constant (``2\\sqrt{2}`` → 2.828…+0j),
    the numbers of a set or tuple of constants (``3, 5, 7`` → (3, 5, 7)), else ``None``; values that
    cannot match need no ``verify`` either (see :func:`values_differ`).

    >>> math_key("(3,\\\\pi/2)")[0] == math_key("(3,\\\\frac{\\\\pi}{2})")[0], math_key("0.5") == math_key("\\\\frac12")
    (True, True)
    """
    from sympy import Basic, FiniteSet, Tuple, srepr

    parsed = _parse_boxed(answer)
    if not parsed:
        return None
    head = parsed[0]
    if not isinstance(head, Basic):
        return f"{type(head).__name__}:{head!r}", None
    value: Value = _constant(head)
    if value is None and isinstance(head, FiniteSet | Tuple) and len(head.args) <= 64:
        items = [_constant(x) for x in head.args]
        value = tuple(items) if items and all(v is not None for v in items) else None  # type: ignore[arg-type]
    return srepr(head), value


def _constant(expr: Any) -> complex | None:
    """The complex number a symbol-free sympy expression denotes, or ``None``."""
    from sympy import Expr

    if not isinstance(expr, Expr) or expr.free_symbols:
        return None
    try:
        value = complex(expr.evalf(30))
    except (TypeError, ValueError, OverflowError):
        return None
    return value if math.isfinite(value.real) and math.isfinite(value.imag) else None


def _far(a: complex, b: complex) -> bool:
    # math-verify compares numbers to ~6 decimals; 1e-4 relative is far beyond that.
    return abs(a - b) > 1e-4 * max(abs(a), abs(b), 1.0)


def values_differ(a: Value, b: Value) -> bool:
    """True when two values (:func:`math_key`) cannot verify equal, so math-verify need not be asked:
    two constants more than 1e-4 relative apart; a set or tuple of two or more numbers against one
    number; two sets or tuples of the same size where some number of one is far from every number of
    the other (order ignored, so it holds whether math-verify reads them as sets or as tuples).
    Unknown values, and collections of different sizes, never differ here.

    >>> values_differ(18, 4 * 2 ** 0.5), values_differ(0.5, 0.5000001), values_differ(None, 3)
    (True, False, False)
    >>> values_differ((3, 5, 7), 357), values_differ((1, 2), (2, 1)), values_differ((1, 2), (1, 3))
    (True, False, True)
    """
    if a is None or b is None:
        return False
    if not isinstance(a, tuple) and not isinstance(b, tuple):
        return _far(a, b)
    if not isinstance(a, tuple) or not isinstance(b, tuple):
        many, one = (a, b) if isinstance(a, tuple) else (b, a)
        return len(many) >= 2 or _far(many[0], one)  # type: ignore[arg-type]
    if len(a) != len(b):
        return False
    return any(all(_far(x, y) for y in b) for x in a) or any(all(_far(y, x) for x in a) for y in b)
