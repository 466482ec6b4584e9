"""MATH competition problems (Hendrycks et al.) and its MATH-500 subset, from JSONL.

One line of MATH-500 ``test.jsonl`` (HuggingFaceH4/MATH-500)::

    {"problem": "Convert the point $(0,3)$ in rectangular coordinates to polar coordinates. ...",
     "solution": "We have that $r = \\\\sqrt{0^2 + 3^2} = 3.$ ... $\\\\boxed{\\\\left( 3, \\\\frac{\\\\pi}{2} \\\\right)}.$",
     "answer": "\\\\left( 3, \\\\frac{\\\\pi}{2} \\\\right)", "subject": "Precalculus", "level": 2,
     "unique_id": "test/precalculus/807.json"}

becomes ``Problem(id="math-test/precalculus/807.json", gold="\\\\left( 3, \\\\frac{\\\\pi}{2} \\\\right)",
task="math", meta={"level": 2, "subject": "Precalculus", "unique_id": …, "solution": …})``.

The original MATH layout (``problem``/``solution``/``level: "Level 2"``/``type``, no ``answer``) is read
too: the gold answer is then the last ``\\\\boxed{…}`` of the solution, as in the paper's evaluation
(``math_equivalence.py`` takes the last boxed string), and ``type`` fills ``subject``. Records without
``unique_id`` are numbered from 0 in file order (``math-0``). Equivalence is math-verify's, in
:mod:`isocompute.tasks.grading`.

Ignores: the ``[asy]`` figure code inside problems (passed through verbatim).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from isocompute.errors import InputError
from isocompute.tasks.answers.extract import extract_boxed
from isocompute.tasks.base import Problem
from isocompute.tasks.jsonl import read_records

TASK = "math"

PROMPT = (
    "Solve the following math problem. Reason step by step, and put your final answer within "
    "\\boxed{{}}.\n\n"
    "Problem: {problem}"
)


def make_prompt(problem: str) -> str:
    """The instruction and the problem, as the model sees them (before any chat template)."""
    return PROMPT.format(problem=problem.strip())


def parse_level(value: Any) -> int | None:
    """``2`` or ``"Level 2"`` → 2; ``"Level ?"`` (a few MATH train items) or missing → ``None``.

    >>> parse_level("Level 5"), parse_level(3), parse_level("Level ?")
    (5, 3, None)
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and (m := re.fullmatch(r"\s*(?:Level\s*)?(\d+)\s*", value)):
        return int(m.group(1))
    return None


def load(path: str | Path) -> list[Problem]:
    """All problems of a MATH / MATH-500 JSONL file, in file order."""
    problems = []
    seen: dict[str, int] = {}
    for index, (lineno, rec) in enumerate(read_records(path, required=("problem",), what="MATH")):
        answer = rec.get("answer")
        solution = rec.get("solution") if isinstance(rec.get("solution"), str) else ""
        gold = answer.strip() if isinstance(answer, str) and answer.strip() else extract_boxed(solution)
        unlabelled = "answer" not in rec and "solution" not in rec  # a prompt to sample ungraded
        if not unlabelled and (gold is None or not gold.strip()):
            raise InputError(
                f"{path}:{lineno}: no final answer: give an 'answer' field or a solution ending in "
                "\\boxed{...}."
            )
        unique_id = rec.get("unique_id")
        pid = f"{TASK}-{unique_id}" if isinstance(unique_id, str) and unique_id else f"{TASK}-{index}"
        if pid in seen:
            raise InputError(
                f"{path}:{lineno}: id {pid!r} repeats line {seen[pid]}; each unique_id must be unique."
            )
        seen[pid] = lineno
        subject = rec.get("subject", rec.get("type"))
        problems.append(
            Problem(
                id=pid,
                prompt=make_prompt(rec["problem"]),
                gold=None if unlabelled or gold is None else gold.strip(),
                task=TASK,
                meta={
                    "level": parse_level(rec.get("level")),
                    "subject": subject if isinstance(subject, str) else None,
                    "unique_id": unique_id if isinstance(unique_id, str) else None,
                    "solution": solution,
                },
            )
        )
    return problems
