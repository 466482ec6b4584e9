"""Grading imported records: answers extracted, classes merged, verdicts against the gold, tokens counted.

:func:`grade_records` turns a batch of :class:`~isocompute.tasks.importers.records.RawRecord` into
outcome-table lines (the format of :mod:`isocompute.solver.outcomes`, as plain dicts: this room does not
import the solver). Per record:

1. answers are the dump's (raw text kept in ``answer``; one that normalises to nothing is null) or,
   without them, :func:`~isocompute.tasks.answers.extract.extract_answer` of each completion;
2. :func:`~isocompute.tasks.answers.equivalence.classify` with the record's task kind and gold gives each sample's
   ``class`` and ``correct`` — for ``math`` exactly ``verify(gold, answer)`` of
   :mod:`isocompute.tasks.grading`, in its process pool;
3. with a tokenizer, ``prompt_tokens`` (the prompt text alone: the dump's chat template is unknown) and,
   where the dump has completions but no counts, each ``completion_tokens``.

A record without a gold answer (none in the dump) is written with classes and no verdicts, for the
consensus target (:mod:`isocompute.solver.votes.consensus`). A record whose gold is malformed or cannot be
read as its kind (math-verify finds no expression; a number kind's gold is not a number; no date) is *not* written: it is listed in the batch's
``unreadable`` with its id and why, for the caller to report. A record's ``reference`` (a second gold
from a joined file) is graded against its gold too; :attr:`Batch.disagree` lists those that differ.
Ignores: how records were read (the format modules) and where lines go (the CLI).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from isocompute.errors import InputError
from isocompute.tasks.answers.equivalence import classify, kind_of
from isocompute.tasks.answers.extract import extract_answer, normalize_answer
from isocompute.tasks.grading import Grader
from isocompute.tasks.importers.records import RawRecord

__all__ = ["Batch", "Unreadable", "grade_records"]


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A record left out because its gold cannot be graded against."""

    id: str
    where: str
    why: str


@dataclass(slots=True)
class Batch:
    """Graded lines of one batch, in input order, and what was noticed on the way.

    ``merged`` lists ``(id, distinct strings, classes)`` for records where equivalent strings merged;
    ``disagree`` ``(id, where, gold, reference)`` for references that are not equivalent to the gold.
    """

    lines: list[dict[str, Any]] = field(default_factory=list)
    unreadable: list[Unreadable] = field(default_factory=list)
    merged: list[tuple[str, int, int]] = field(default_factory=list)
    disagree: list[tuple[str, str, str, str]] = field(default_factory=list)
    references: int = 0
    timed_out: int = 0


def _answers(rec: RawRecord) -> list[str | None]:
    if rec.answers is not None:
        return [a if a is not None and normalize_answer(a) else None for a in rec.answers]
    return [extract_answer(c) for c in rec.completions or []]


def _count_tokens(tokenizer: Any, texts: Sequence[str]) -> list[int]:
    if not texts:
        return []
    return [len(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]


def grade_records(records: Sequence[RawRecord], *, grader: Grader | None, tokenizer: Any = None) -> Batch:
    """Grade a batch (module docstring); records of several tasks may be mixed."""
    batch = Batch()
    by_kind: dict[str, list[int]] = {}
    for i, rec in enumerate(records):
        rec.check_lengths()
        try:
            by_kind.setdefault(kind_of(rec.task), []).append(i)
        except InputError as e:
            raise InputError(f"{rec.where}: {e}") from None
    answers = [_answers(rec) for rec in records]
    lines: dict[int, dict[str, Any]] = {}
    for kind, all_rows in by_kind.items():
        free = [i for i in all_rows if records[i].gold is None and records[i].gold_problem is None]
        if free:  # no gold at all: classes only, read under the consensus target
            res = classify([answers[i] for i in free], kind, grader=grader)
            batch.timed_out += res.timed_out
            for pos, i in enumerate(free):
                lines[i] = _line(records[i], kind, answers[i], res.classes[pos], None, tokenizer)
        rows = [i for i in all_rows if i not in set_free] if (set_free := set(free)) else all_rows
        if not rows:
            continue
        golds = [records[i].gold for i in rows]
        result = classify([answers[i] for i in rows], kind, golds=golds, grader=grader)
        batch.timed_out += result.timed_out
        refs = [i for i in rows if records[i].reference is not None and records[i].gold is not None]
        if refs:
            check = classify([[records[i].reference] for i in refs], kind, golds=[records[i].gold for i in refs],
                             grader=grader)
            batch.references += len(refs)
            for i, verdict in zip(refs, check.correct, strict=True):
                if verdict is not None and not verdict[0]:
                    rec = records[i]
                    batch.disagree.append((rec.id, rec.where, rec.gold or "", rec.reference or ""))
        unreadable = set(result.gold_unreadable)
        for pos, i in enumerate(rows):
            rec = records[i]
            if rec.gold is None or pos in unreadable:
                why = rec.gold_problem or f"the gold {rec.gold!r} does not read as a {kind} answer"
                batch.unreadable.append(Unreadable(rec.id, rec.where, why))
                continue
            if result.distinct[pos] > result.n_classes[pos]:
                batch.merged.append((rec.id, result.distinct[pos], result.n_classes[pos]))
            lines[i] = _line(rec, kind, answers[i], result.classes[pos], result.correct[pos] or [], tokenizer)
    batch.lines = [lines[i] for i in sorted(lines)]
    return batch


def _line(rec: RawRecord, kind: str, answers: list[str | None], classes: list[int | None],
          correct: list[bool] | None, tokenizer: Any) -> dict[str, Any]:
    tokens = rec.completion_tokens
    if tokens is None and tokenizer is not None and rec.completions is not None:
        tokens = list(_count_tokens(tokenizer, rec.completions))
    prompt_tokens = rec.prompt_tokens
    if prompt_tokens is None and tokenizer is not None:
        prompt_tokens = _count_tokens(tokenizer, [rec.prompt])[0]
    samples = []
    for j, (a, c) in enumerate(zip(answers, classes, strict=True)):
        s: dict[str, Any] = {"answer": a, "class": c}
        if correct is not None:
            s["correct"] = correct[j]
        if tokens is not None and tokens[j] is not None:
            s["completion_tokens"] = tokens[j]
        if rec.scores is not None and rec.scores[j] is not None:
            s["score"] = rec.scores[j]
        for name in ("logprob_mean", "confidence_min_window"):
            values = getattr(rec, name)
            if values is not None and values[j] is not None:
                s[name] = values[j]
        samples.append(s)
    out: dict[str, Any] = {"id": rec.id, "prompt": rec.prompt}
    if rec.gold is not None:
        out["gold"] = rec.gold
    if prompt_tokens is not None:
        out["prompt_tokens"] = prompt_tokens
    out["samples"] = samples
    out["meta"] = {"task": rec.task, "answer_kind": kind, **rec.meta}
    return out
