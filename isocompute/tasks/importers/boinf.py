"""BoInf's MATH-500 answer lists (``analysis_math500_<model>.jsonl``), joined with the problem file.

One line of the dump (jkomiyama/BoInf-code-publish, ``boinf/jsonl/``)::

    {"problem_num": 0, "total_answers": 80, "gold_answer": "(3,\\\\frac{\\\\pi}{2})",
     "answer_counts": {...}, "majority_answer": "(3,\\\\pi/2)",
     "all_answers": [["(3,\\\\frac{\\\\pi}{2})", 464], ["(3,\\\\pi/2)", 613], ["", 400], ...]}

``all_answers`` holds every sample in sampling order as ``[extracted answer, output tokens]``; ``""`` or
``null`` is a sample without an answer. There is no problem text: ``problem_num`` indexes the problem
file (``--problems``, MATH-500's ``test.jsonl``, line i = problem i), which gives the prompt, the id
(``math-<unique_id>``, the ids ``isocompute sample --task math`` writes, so tables of several models
share them) and ``meta["problem"]`` (level, subject). The dump's ``gold_answer`` is the gold.

Join checks: the dump and the problem file must have the same number of problems, and every
``problem_num`` must be in range and appear once — otherwise an error says both sizes. The problem
file's own answers (``reference``) are compared with the dump's golds when grading; a problem file
that does not line up (most golds disagree) is an error there.

Ignores: ``answer_counts`` and ``majority_answer`` (recomputed from ``all_answers``, by class).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from isocompute.errors import InputError
from isocompute.tasks.importers.records import RawRecord, iter_json, malformed
from isocompute.tasks.jsonl import read_records
from isocompute.tasks.math import parse_level

__all__ = ["read_boinf"]

_FIX = "each line needs problem_num (an integer), gold_answer and all_answers ([[answer, tokens], ...])"


def _problems(path: Path, question_field: str) -> list[dict[str, Any]]:
    return [rec for _, rec in read_records(path, required=(question_field,), what="problem")]


def read_boinf(path: str | Path, *, problems: str | Path, task: str = "math",
               question_field: str = "problem") -> Iterator[RawRecord]:
    """The dump's records in file order, each joined with its problem (module docstring)."""
    probs = _problems(Path(problems), question_field)
    lines = list(iter_json(path))
    if len(lines) != len(probs):
        raise InputError(f"{path} has {len(lines)} problems but the problem file {problems} has {len(probs)}; "
                         "they are joined by index, so pass the problem file the dump was made from "
                         "(for MATH-500, its 500-line test.jsonl).")
    seen: dict[int, str] = {}
    for where, obj in lines:
        if type(obj) is not dict:
            raise malformed(where, f"expected a JSON object, got {type(obj).__name__}", _FIX)
        num = obj.get("problem_num")
        if type(num) is not int:
            raise malformed(where, f"problem_num must be an integer, got {num!r}", _FIX)
        if not 0 <= num < len(probs):
            raise malformed(where, f"problem_num {num} is outside the problem file's 0..{len(probs) - 1} "
                            f"({len(probs)} problems, the dump has {len(lines)})",
                            "pass the problem file the dump was made from")
        if num in seen:
            raise malformed(where, f"problem_num {num} repeats {seen[num]}", "each problem must appear once")
        seen[num] = where
        samples = obj.get("all_answers")
        if type(samples) is not list or not samples:
            raise malformed(where, "all_answers must be a non-empty list of [answer, tokens] pairs", _FIX)
        answers: list[str | None] = []
        tokens: list[int | None] = []
        for j, pair in enumerate(samples):
            if type(pair) is not list or len(pair) != 2 or type(pair[0]) not in (str, type(None)) \
                    or (pair[1] is not None and (type(pair[1]) is not int or pair[1] < 0)):
                raise malformed(where, f"all_answers[{j}] is {pair!r}, not [answer, output tokens]", _FIX)
            answers.append(pair[0] or None)
            tokens.append(pair[1])
        gold = obj.get("gold_answer")
        if type(gold) in (int, float):
            gold = str(gold)
        prob = probs[num]
        uid = prob.get("unique_id")
        yield RawRecord(
            id=f"math-{uid}" if isinstance(uid, str) and uid else f"math-{num}",
            prompt=prob[question_field].strip(),
            gold=gold if isinstance(gold, str) and gold.strip() else None,
            gold_problem=None if isinstance(gold, str) and gold.strip() else f"gold_answer is {gold!r}",
            task=task,
            where=where,
            answers=answers,
            completion_tokens=tokens,
            reference=prob.get("answer") if isinstance(prob.get("answer"), str) else None,
            meta={"problem_num": num, "problem": {
                "level": parse_level(prob.get("level")),
                "subject": prob.get("subject") if isinstance(prob.get("subject"), str) else None,
                "unique_id": uid if isinstance(uid, str) else None,
            }},
        )
