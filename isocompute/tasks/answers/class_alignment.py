"""Answer classes shared by several models: one equivalence pass over the union of a prompt's answers.

An outcome table's classes are dense per record *within its own table*: class 0 of Phi-4's record 17
and class 0 of Qwen3's record 17 need not be the same answer. An ensemble vote (Phi-4's and Qwen3's
samples in one vote) and a cascade's vote over all the samples drawn need classes that mean the same
thing in every model's samples. :func:`align_answers` gives them: for each prompt it concatenates every
model's raw answers (model order, then sample order) and runs :func:`~isocompute.tasks.answers.equivalence.classify`
once over that union with the prompt's gold, then splits the classes back per model. So the rule is
exactly the one ``import`` and ``sample`` use (math-verify for ``math``, in the grader's process pool),
the classes are dense per prompt over the union (``0 … G−1``, the gold's class first when its key reads),
and ``correct`` is each sample's verdict against the gold under the union's classes.

Worked example (``number``): model A answers ``["18", "18.0", None]``, model B ``["17", "18"]`` → the
union ``18, 18.0, —, 17, 18`` with gold ``18`` → classes A ``[0, 0, None]``, B ``[1, 0]``; correct A
``[True, True, False]``, B ``[False, True]``.

Caching: the union pass costs a few thousand math-verify calls on the three MATH-500 dumps (3 × 500 ×
80 samples, ~2,000 distinct strings). With ``cache=PATH`` the result is stored there as JSON keyed by
a sha256 fingerprint of (kind, golds, every answer), written atomically, and read back instead of
recomputed while the fingerprint matches; a stale or damaged cache file is recomputed and replaced.

Ignores: which model answered (no per-model equivalence rules), verifier scores, and the tables' own
verdicts (callers compare them, e.g. :meth:`isocompute.solver.models.tables.ModelTables.with_classes`).
Greedy merging is not transitive, so the union may split or join a model's own classes in rare cases:
the callers count those prompts.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from isocompute.artifacts import atomic_write_text
from isocompute.errors import InputError
from isocompute.tasks.answers.equivalence import classify, kind_of
from isocompute.tasks.grading import Grader

__all__ = ["Alignment", "align_answers", "alignment_fingerprint"]

CACHE_SCHEMA = 1


@dataclass(frozen=True)
class Alignment:
    """Classes over the union of every model's answers, per prompt.

    ``classes[m][i][j]``: class of model m's sample j on prompt i (None for a null answer), dense per
    prompt over all models; ``n_classes[i]``: classes of prompt i; ``correct[m][i]``: verdicts against
    the gold (None where the gold's key did not read); ``timed_out``/``complete`` as in
    :class:`~isocompute.tasks.answers.equivalence.Classes`; ``fingerprint`` keys the cache; ``cached`` says whether
    this came from the cache file.
    """

    kind: str
    classes: list[list[list[int | None]]]
    n_classes: list[int]
    correct: list[list[list[bool] | None]]
    timed_out: int
    complete: bool
    fingerprint: str
    cached: bool = False


def alignment_fingerprint(answers: Sequence[Sequence[Sequence[str | None]]], kind: str,
                          golds: Sequence[str | None]) -> str:
    """sha256 of the inputs that determine the alignment (kind, golds, every model's answers in order)."""
    h = hashlib.sha256()
    h.update(json.dumps([CACHE_SCHEMA, kind_of(kind), list(golds)], ensure_ascii=False).encode())
    for model in answers:
        h.update(json.dumps([list(row) for row in model], ensure_ascii=False).encode())
    return h.hexdigest()


def align_answers(
    answers: Sequence[Sequence[Sequence[str | None]]],
    kind: str,
    *,
    golds: Sequence[str | None],
    grader: Grader | None = None,
    timeout: float | None = None,
    cache: str | os.PathLike[str] | None = None,
) -> Alignment:
    """Classes shared by every model (module docstring). ``answers[m][i]`` are model m's raw answers on
    prompt i (None = no answer); ``golds[i]`` prompt i's reference answer; ``kind`` an answer kind or task
    name; ``grader`` runs math-verify in its process pool (``timeout`` seconds per item)."""
    kind = kind_of(kind)
    if not answers:
        raise InputError("align_answers needs the answers of at least one model.")
    n = len(golds)
    bad = [m for m, rows in enumerate(answers) if len(rows) != n]
    if bad:
        raise InputError(f"model {bad[0]} has answers for {len(answers[bad[0]])} prompts but there are {n} golds; "
                         "pass every model's answers for the same prompts, in the same order (join the tables first).")
    fingerprint = alignment_fingerprint(answers, kind, golds)
    if cache is not None:
        hit = _read_cache(Path(cache), fingerprint)
        if hit is not None:
            return hit
    union = [[a for model in answers for a in model[i]] for i in range(n)]
    result = classify(union, kind, golds=list(golds), grader=grader, timeout=timeout)
    classes: list[list[list[int | None]]] = [[] for _ in answers]
    correct: list[list[list[bool] | None]] = [[] for _ in answers]
    for i in range(n):
        at = 0
        verdicts = result.correct[i]
        for m, model in enumerate(answers):
            width = len(model[i])
            classes[m].append(result.classes[i][at:at + width])
            correct[m].append(None if verdicts is None else verdicts[at:at + width])
            at += width
    out = Alignment(kind=kind, classes=classes, n_classes=list(result.n_classes), correct=correct,
                    timed_out=result.timed_out, complete=result.complete, fingerprint=fingerprint)
    if cache is not None and out.complete:  # an alignment cut short by timeouts is not worth keeping
        atomic_write_text(cache, json.dumps({"schema": CACHE_SCHEMA, **asdict(out), "cached": False}))
    return out


def _read_cache(path: Path, fingerprint: str) -> Alignment | None:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # absent or damaged: recompute (and overwrite)
    if not isinstance(obj, dict) or obj.get("schema") != CACHE_SCHEMA or obj.get("fingerprint") != fingerprint:
        return None
    try:
        return Alignment(kind=obj["kind"], classes=obj["classes"], n_classes=obj["n_classes"], correct=obj["correct"],
                         timed_out=int(obj["timed_out"]), complete=bool(obj["complete"]), fingerprint=fingerprint,
                         cached=True)
    except (KeyError, TypeError, ValueError):
        return None
