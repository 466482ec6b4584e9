"""GSM8K (grade-school maths word problems) from its public JSONL release.

One line of ``test.jsonl`` (openai/grade-school-math, MIT licence)::

    {"question": "Janet's ducks lay 16 eggs per day. ... How much in dollars does she make every day
      at the farmers' market?",
     "answer": "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\\nShe makes 9 * 2 =
      $<<9*2=18>>18 every day at the farmer's market.\\n#### 18"}

becomes ``Problem(id="gsm8k-0", gold="18", task="gsm8k", meta={"index": 0, "solution": "Janet sells…"})``.
The gold answer is the text after ``####`` with thousands commas removed (``#### 70,000`` → ``70000``),
the normaliser of the reference implementation (``grade_school_math/dataset.py::extract_answer``).
Ids number the records from 0 in file order. Grading is :func:`isocompute.tasks.grading.grade`.

Ignores: the ``<<…>>`` calculator annotations (kept verbatim in ``meta["solution"]``).
"""

from __future__ import annotations

from pathlib import Path

from isocompute.errors import InputError
from isocompute.tasks.base import Problem
from isocompute.tasks.jsonl import read_records

TASK = "gsm8k"

PROMPT = (
    "Solve the following math word problem. Reason step by step, then give the final answer as a "
    'number on the last line in the form "The answer is N."\n\n'
    "Question: {question}"
)


def make_prompt(question: str) -> str:
    """The instruction and the question, as the model sees them (before any chat template)."""
    return PROMPT.format(question=question.strip())


def parse_gold(answer: str) -> str | None:
    """The final answer after the last ``####``, commas removed; ``None`` without a marker.

    >>> parse_gold("9 * 2 = 18\\n#### 1,018")
    '1018'
    """
    if "####" not in answer:
        return None
    gold = answer.rsplit("####", 1)[1].strip().replace(",", "")
    return gold or None


def load(path: str | Path) -> list[Problem]:
    """All problems of a GSM8K JSONL file (``question``/``answer`` per line), in file order."""
    problems = []
    for index, (lineno, rec) in enumerate(read_records(path, required=("question",), what="GSM8K")):
        # a line without "answer" is an unlabelled prompt (sampled ungraded); one with an answer must parse
        if "answer" in rec and not (isinstance(rec["answer"], str) and rec["answer"].strip()):
            raise InputError(f"{path}:{lineno}: missing or empty field(s) ['answer']; give the GSM8K solution "
                             "ending in '#### <final answer>', or leave the field out for an unlabelled prompt.")
        gold = parse_gold(rec["answer"]) if "answer" in rec else None
        if gold is None and "answer" in rec:
            raise InputError(
                f"{path}:{lineno}: the answer has no '#### <final answer>' line; GSM8K answers end in one."
            )
        problems.append(
            Problem(
                id=f"{TASK}-{index}",
                prompt=make_prompt(rec["question"]),
                gold=gold,
                task=TASK,
                meta={"index": index, "solution": str(rec.get("answer", "")).rsplit("####", 1)[0].strip()},
            )
        )
    return problems
