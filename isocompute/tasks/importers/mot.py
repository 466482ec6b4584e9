"""MoT's Llama-2-13B result lists (``llama2_13b_<task>_<pot|cot>1.json``): GSM8K and Date Understanding.

One element of the JSON list (MurongYue/LLM_MoT_cascade, ``llama2_13B_result/``)::

    {"question": "Yesterday was April 30, 2021. What is the date today in MM/DD/YYYY?",
     "answer": {"05/01/2021": 1, "02/23/2021": 0, ...},
     "generated": ["Explain: ... A: 05/01/2021 ...", ...],
     "results": ["12/31/1899", "5/1/2021", "05/01/2021", ...], ...}

``answer`` is the gold: a number (GSM8K), or a dict whose key with value 1 is the correct option (Date);
``generated`` the completions and ``results`` the extracted answers. Each of ``answer``, ``generated``
and ``results`` may also be a string holding a Python literal (read with :func:`ast.literal_eval`, which
evaluates no code). The task comes from ``--task`` or, per record, from the gold: a dict is ``date``,
a number ``gsm8k``. Ids are ``<task>-<index>`` in file order (the GSM8K dump's are the first 400 test
questions, so they match ``isocompute sample --task gsm8k``'s ids).

Program-of-thought ``results`` list only the programs that ran, so a record may have fewer results than
completions: the missing ones are samples with no answer. Which completion failed is not recorded, so
the results fill the first samples and nulls the rest; a token count from ``--tokenizer`` follows the
completions' order, which keeps each prompt's total and mean exact but not the pairing of one count
with one answer (``meta["unaligned"]`` counts the nulls added). More results than completions is an
error that says both lengths.

Ignores: ``explain``, ``result_counter`` and ``prediction`` (the dump's own vote; recomputed by class).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from isocompute.tasks.importers.records import RawRecord, iter_json, malformed

__all__ = ["read_mot"]

_FIX = "each element needs question, answer (the gold), generated (completions) and results (answers)"


def _literal(value: Any, where: str, name: str) -> Any:
    if not isinstance(value, str):
        return value
    stripped = value.strip()
    if not stripped or stripped[0] not in "[{('\"-0123456789":
        return value
    try:
        return ast.literal_eval(stripped)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        if stripped[0] in "[{(":
            raise malformed(where, f"{name} looks like a Python literal but does not parse", _FIX) from None
        return value


def _gold(answer: Any) -> tuple[str | None, str | None, str]:
    """(gold, problem when unreadable, inferred task)."""
    if isinstance(answer, dict):
        right = [k for k, v in answer.items() if v == 1]
        if len(right) != 1:
            return None, f"the answer dict has {len(right)} keys with value 1, not exactly one", "date"
        return str(right[0]), None, "date"
    if isinstance(answer, bool) or answer is None:
        return None, f"the gold answer is {answer!r}", "gsm8k"
    if isinstance(answer, int | float):
        if not math.isfinite(answer):
            return None, f"the gold answer is {answer!r}", "gsm8k"
        return (str(int(answer)) if float(answer).is_integer() else repr(answer)), None, "gsm8k"
    if isinstance(answer, str) and answer.strip():
        return answer.strip(), None, "gsm8k"
    return None, f"the gold answer is {answer!r}", "gsm8k"


def _answer(value: Any) -> str | None:
    if value is None or isinstance(value, bool):
        return None if value is None else str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None  # a program that returned nan/inf gave no number
    return str(value) if str(value).strip() else None


def read_mot(path: str | Path, *, task: str | None = None) -> Iterator[RawRecord]:
    """The dump's records in file order (module docstring)."""
    for index, (where, obj) in enumerate(iter_json(path)):
        if type(obj) is not dict:
            raise malformed(where, f"expected a JSON object, got {type(obj).__name__}", _FIX)
        missing = [k for k in ("question", "answer", "generated", "results") if k not in obj]
        if missing:
            raise malformed(where, f"missing field(s) {missing}", _FIX)
        question = obj["question"]
        if not isinstance(question, str) or not question.strip():
            raise malformed(where, "question must be a non-empty string", _FIX)
        generated = _literal(obj["generated"], where, "generated")
        results = _literal(obj["results"], where, "results")
        for name, value in (("generated", generated), ("results", results)):
            if not isinstance(value, list):
                raise malformed(where, f"{name} must be a list (or a string holding one), got "
                                f"{type(value).__name__}", _FIX)
        if not all(isinstance(g, str) for g in generated):
            raise malformed(where, "generated must be a list of completion strings", _FIX)
        if len(results) > len(generated):
            raise malformed(where, f"results has {len(results)} entries but generated has {len(generated)}",
                            "results may be shorter than generated (programs that failed), never longer")
        gold, problem, inferred = _gold(_literal(obj["answer"], where, "answer"))
        name = task or inferred
        answers = [_answer(r) for r in results] + [None] * (len(generated) - len(results))
        yield RawRecord(
            id=f"{name}-{index}", prompt=question.strip(), gold=gold, gold_problem=problem, task=name,
            where=where, answers=answers, completions=list(generated),
            meta={"index": index, **({"unaligned": len(generated) - len(results)}
                                     if len(results) < len(generated) else {})},
        )
