"""Canonical keys of answers for the cheap kinds (numbers, dates, letters, strings), and kinds of tasks.

:func:`kind_of` maps a task to its answer kind (:data:`TASK_KINDS`); :func:`canonical_key` reads a normalised
answer as that kind — ``"18.0"`` → ``num:18``, ``5/1/2021`` / ``2021-05-01`` / ``May 1, 2021`` →
``date:05/01/2021``, ``(b)`` → ``choice:B``; two ``num:`` keys still merge when within ``REL_TOL``/``ABS_TOL``
(:func:`numbers_close`). The rules that use them are in :mod:`isocompute.tasks.answers.equivalence`.

Ignores: ``math`` answers (math-verify reads those, :mod:`isocompute.tasks.answers.math_forms`), units, and words
for numbers (``"eighteen"`` has no key and is compared as a string).
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from fractions import Fraction

from isocompute.errors import InputError
from isocompute.tasks.answers.extract import normalize_answer

__all__ = [
    "ABS_TOL", "KINDS", "REL_TOL", "TASK_KINDS", "canonical_key", "kind_of", "normalised_or_none", "numbers_close",
]

KINDS = ("math", "number", "date", "choice", "exact")
TASK_KINDS = {"arith": "number", "gsm8k": "number", "math": "math", "math500": "math", "date": "date"}
REL_TOL = 1e-9
ABS_TOL = 1e-9


def kind_of(task: str) -> str:
    """The equivalence kind of a task name (``"gsm8k"`` → ``"number"``); a kind's own name is accepted."""
    key = task.strip().lower()
    if key in KINDS:
        return key
    if key in TASK_KINDS:
        return TASK_KINDS[key]
    raise InputError(f"unknown task or answer kind {task!r}; choose a task ({', '.join(TASK_KINDS)}) "
                     f"or a kind ({', '.join(KINDS)}).")


_NUMERIC_DATE = re.compile(r"(\d{1,2})[/.-](\d{1,2})[/.-](\d{4}|\d{2})")
_ISO_DATE = re.compile(r"(\d{4})-(\d{1,2})-(\d{1,2})")
_NAMED_DATES = ("%B %d, %Y", "%b %d, %Y", "%B %d %Y", "%b %d %Y", "%d %B %Y", "%d %b %Y")
_CHOICE = re.compile(r"\(?([A-Za-z])(?:\)|\.|:|$)(?:\s.*)?", re.DOTALL)


def _date_key(s: str) -> str | None:
    s = s.split("\n", 1)[0].strip().rstrip(".")  # a dump may keep text after the date's line
    if m := _NUMERIC_DATE.fullmatch(s):
        month, day, year = m.groups()
    elif m := _ISO_DATE.fullmatch(s):
        year, month, day = m.groups()
    else:
        for fmt in _NAMED_DATES:
            try:
                d = datetime.strptime(s, fmt)
            except ValueError:
                continue
            return f"date:{d.month:02d}/{d.day:02d}/{d.year:04d}"
        return None
    return f"date:{int(month):02d}/{int(day):02d}/{int(year):04d}"


def _number(s: str) -> Fraction | None:
    try:
        return Fraction(s.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def canonical_key(answer: str, kind: str) -> str | None:
    """The canonical key of a normalised, non-empty answer for a cheap kind (not ``math``), or ``None``
    when the answer does not read as that kind (then it is compared as a string).

    >>> canonical_key("18.0", "number"), canonical_key("5/1/2021", "date"), canonical_key("(b)", "choice")
    ('num:18', 'date:05/01/2021', 'choice:B')
    """
    if kind == "number":
        value = _number(answer)
        return None if value is None else f"num:{value}"
    if kind == "date":
        return _date_key(answer)
    if kind == "choice":
        m = _CHOICE.fullmatch(answer)
        return f"choice:{m.group(1).upper()}" if m else None
    if kind == "exact":
        return f"str:{answer}"
    raise InputError(f"canonical_key reads kinds number, date, choice, exact; {kind!r} goes through classify().")


def numbers_close(a: str, b: str) -> bool:
    """Do two ``num:`` keys merge (within ``REL_TOL`` and ``ABS_TOL``)?"""
    x, y = float(Fraction(a[4:])), float(Fraction(b[4:]))
    return math.isclose(x, y, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def normalised_or_none(answer: str | None) -> str | None:
    """The normalised answer, or None when it is None or normalises to nothing (no answer)."""
    if answer is None:
        return None
    s = normalize_answer(str(answer))
    return s or None
