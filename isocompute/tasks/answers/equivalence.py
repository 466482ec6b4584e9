"""Answer equivalence: which extracted answers are the same answer, per kind of task.

Votes count *classes* of equivalent answers, not strings: ``(3,\\pi/2)`` and ``(3,\\frac{\\pi}{2})`` are one
answer (the Phi-4 MATH-500 dump splits 52 + 23 votes between them), ``\\frac12`` meets ``0.5``, and
``5/1/2021`` meets ``05/01/2021``. One rule per *kind* (:data:`TASK_KINDS` maps a task to its kind):

| kind | an answer's canonical key | keys that still merge |
|---|---|---|
| ``math`` | math-verify's parse, printed (``srepr``), see :func:`isocompute.tasks.answers.math_forms.math_key` | ``verify(a, b)`` |
| ``number`` | the exact value (``"18.0"`` → 18, ``"3/4"`` → 3/4) | ``|a − b| ≤ 1e-9·max(|a|, |b|) + 1e-9`` |
| ``date`` | ``MM/DD/YYYY`` of the first line (``5/1/2021``, ``2021-05-01``, ``May 1, 2021``) | — |
| ``choice`` | the letter (``(b)``, ``B.``, ``B) text`` → ``B``) | — |
| ``exact`` | the normalised string | — |

An answer whose key cannot be read (math-verify finds no expression, a number kind's ``"eighteen"``) is
its own normalised string, equal only to the same string. Empty answers are null: no class.

Classes are built greedily, in order of first appearance: each distinct key joins the first earlier class
whose *representative* (first key of the class) it merges with, tested ``rep`` first (math-verify is
not symmetric: gold goes first). With a gold answer the gold leads, so a sample is correct exactly when
it lands in the gold's class — for ``math`` that is :mod:`isocompute.tasks.grading`'s rule
(``verify(gold, pred)``) on extracted answers. Class ids are dense per record, ``0, 1, …`` in order of
the samples' first appearance; the gold's class has whatever id its first sample gives it.

Worked example (``math``): answers ``["(3,\\pi/2)", "", "(3,\\frac{\\pi}{2})", "(0,3)"]`` → keys equal for the
first and third, null for the second → classes ``[0, None, 0, 1]``; with gold ``\\left( 3, \\frac{\\pi}{2}
\\right)`` the correct flags are ``[True, False, True, False]``.

Cost: math-verify parses each distinct string once (and remembers it for the process's later calls); only distinct keys of one record are compared,
round by round (round r compares class r's representative with the keys still unassigned), and each
pair's verdict is cached, so the three MATH-500 dumps (120,000 samples, ~2,000 distinct strings) need
a few thousand math-verify calls. Given a :class:`~isocompute.tasks.grading.Grader`, parses and
comparisons run in its process pool with its per-item timeout and hang recovery; without one they run
in this process (soft timeout on the main thread only). A parse that times out leaves the answer a
string; a comparison that times out keeps the two apart (and a gold comparison counts as incorrect).

Where it lives: the kinds and the cheap kinds' keys are :mod:`isocompute.tasks.answers.answer_keys`; reading
``math`` keys and the rounds of comparisons :mod:`isocompute.tasks.answers.class_merge`; this module builds each
record's groups, the classes and the votes. Names of the first are importable from here too.

Ignores: units ("18 dollars" is not the number 18 — extraction's job), partial credit, and answers
that differ only beyond the kinds above (e.g. synonyms in free text).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from isocompute.errors import InputError
from isocompute.tasks.answers.answer_keys import (  # noqa: F401
    ABS_TOL,
    KINDS,
    REL_TOL,
    TASK_KINDS,
    canonical_key,
    kind_of,
    normalised_or_none,
)
from isocompute.tasks.answers.class_merge import Group, Key, distinct_keys, merge_groups
from isocompute.tasks.grading import Grader

__all__ = [
    "KINDS", "TASK_KINDS", "Classes", "Votes", "answer_classes", "canonical_key", "classify", "kind_of",
    "vote_classes",
]


# ------------------------------------------------------------------------------------------ classes
@dataclass(slots=True)
class Classes:
    """Outcome of :func:`classify` over many records.

    ``classes[r][j]``: class of sample j of record r (dense per record, None for a null answer);
    ``correct[r]``: per-sample verdicts against the record's gold, ``None`` when no gold was given or
    the gold's key could not be read (those records are listed in ``gold_unreadable``);
    ``distinct[r]``: distinct normalised answer strings of record r (``distinct[r] - n_classes[r]`` is
    how many strings merged away); ``timed_out``: parses and comparisons that ran out of time (or were
    skipped at the deadline); ``complete``: False when a timeout or the deadline cut the merging short
    (some equal answers may then be split, never wrongly joined).
    """

    classes: list[list[int | None]]
    correct: list[list[bool] | None]
    distinct: list[int]
    n_classes: list[int]
    gold_unreadable: list[int] = field(default_factory=list)
    timed_out: int = 0
    complete: bool = True


def classify(
    records: Sequence[Sequence[str | None]],
    kind: str,
    *,
    golds: Sequence[str | None] | None = None,
    grader: Grader | None = None,
    timeout: float | None = None,
    deadline: float | None = None,
) -> Classes:
    """Equivalence classes of each record's answers (and, with ``golds``, each sample's verdict).

    ``records[r]`` are record r's extracted answers (None or empty = no answer); ``kind`` one of
    :data:`KINDS` (or a task name, see :func:`kind_of`); ``golds[r]`` the reference answer of record r;
    ``grader`` runs math-verify in its pool (``timeout`` seconds per item, default the grader's, or 5 s
    in this process); ``deadline`` (a ``time.monotonic()`` value) stops merging when passed. See the
    module docstring for the rule.
    """
    kind = kind_of(kind)
    if golds is not None and len(golds) != len(records):
        raise InputError(f"classify got {len(records)} records but {len(golds)} gold answers; pass one per record.")
    norm_cache: dict[Any, str | None] = {}
    rows = [[norm_cache[a] if a in norm_cache else norm_cache.setdefault(a, normalised_or_none(a)) for a in rec]
            for rec in records]
    gold_rows = [None] * len(rows) if golds is None else [normalised_or_none(g) for g in golds]
    # A record whose answers and gold are all one string needs no key: identical strings are equal
    # (grading's own shortcut), so math-verify only reads records where something differs.
    single = [len({*row, gold} - {None}) <= 1 for row, gold in zip(rows, gold_rows, strict=True)]
    strings = list(dict.fromkeys(x for row, gold, one in zip(rows, gold_rows, single, strict=True) if not one
                                 for x in (*row, gold) if x is not None))
    keys, timed_out = distinct_keys(strings, kind, grader, timeout, deadline)
    key_of = dict(zip(strings, keys, strict=True))
    groups, sample_group, gold_unreadable = _groups(rows, gold_rows, single, key_of, with_gold=golds is not None)

    cluster, more_timeouts, complete = merge_groups(groups, kind, grader, timeout, deadline)
    timed_out += more_timeouts
    complete = complete and timed_out == 0  # a parse or comparison cut short may have split a class
    classes, correct, n_classes = _dense(cluster, sample_group, gold_unreadable, with_gold=golds is not None)
    distinct = [len({s for s in row if s is not None}) for row in rows]
    return Classes(classes, correct, distinct, n_classes, gold_unreadable, timed_out, complete)


def _groups(
    rows: list[list[str | None]], gold_rows: list[str | None], single: list[bool], key_of: dict[str, Key],
    *, with_gold: bool,
) -> tuple[list[list[Group]], list[list[int | None]], list[int]]:
    """One group per distinct key (or string, when unreadable) of a record, gold first when readable:
    each record's groups, each sample's group (None for a null answer), records whose gold is unreadable."""
    groups: list[list[Group]] = []
    sample_group: list[list[int | None]] = []
    gold_unreadable: list[int] = []
    for r, (row, gold) in enumerate(zip(rows, gold_rows, strict=True)):
        index: dict[str, int] = {}
        reps: list[Group] = []
        if single[r]:
            key_of_r = {x: (f"same:{x}", None) for x in {*row, gold} - {None}}
        else:
            key_of_r = key_of
        if with_gold:
            gkey, gvalue = key_of_r[gold] if gold is not None else (None, None)
            if gkey is None:
                gold_unreadable.append(r)
            else:
                index[gkey] = 0
                reps.append((gold, gkey, gvalue))
        row_groups: list[int | None] = []
        for s in row:
            if s is None:
                row_groups.append(None)
                continue
            k, value = key_of_r[s]
            ident = k if k is not None else f"raw:{s}"
            if ident not in index:
                index[ident] = len(reps)
                reps.append((s, k, value))
            row_groups.append(index[ident])
        groups.append(reps)
        sample_group.append(row_groups)
    return groups, sample_group, gold_unreadable


def _dense(
    cluster: list[list[int]], sample_group: list[list[int | None]], gold_unreadable: list[int], *, with_gold: bool
) -> tuple[list[list[int | None]], list[list[bool] | None], list[int]]:
    """Dense class ids per record in order of first appearance, verdicts against the gold's class (None
    without a readable gold), and the number of classes per record."""
    classes: list[list[int | None]] = []
    correct: list[list[bool] | None] = []
    n_classes: list[int] = []
    for r, row_groups in enumerate(sample_group):
        dense: dict[int, int] = {}
        out = [None if g is None else dense.setdefault(cluster[r][g], len(dense)) for g in row_groups]
        classes.append(out)
        n_classes.append(len(dense))
        if not with_gold or r in gold_unreadable:
            correct.append(None)
        else:
            gold_cluster = cluster[r][0]
            correct.append([g is not None and cluster[r][g] == gold_cluster for g in row_groups])
    return classes, correct, n_classes


def answer_classes(
    answers: Sequence[str | None], kind: str, *, grader: Grader | None = None
) -> list[int | None]:
    """Dense class ids of one record's answers (None for a null answer); see the module docstring.

    >>> answer_classes(["5/1/2021", None, "05/01/2021", "5/2/2021"], "date")
    [0, None, 0, 1]
    """
    return classify([answers], kind, grader=grader).classes[0]


# ------------------------------------------------------------------------------------------ the vote
@dataclass(frozen=True, slots=True)
class Votes:
    """The k answers of one request merged into classes and counted.

    ``classes[j]``: class of answer j (None when it has none); for class c: ``representatives[c]`` its
    first raw answer, ``first_index[c]`` the sample that gave it, ``counts[c]`` its votes. ``winner`` is
    the class with most votes, ties going to the class that appeared first (None without any answer);
    ``complete`` is False when the time limit (or a per-item timeout) cut the merging short (classes
    may then be split, never wrongly joined); ``seconds`` the time spent.
    """

    classes: list[int | None]
    representatives: list[str]
    first_index: list[int]
    counts: list[int]
    winner: int | None
    complete: bool
    seconds: float

    @property
    def answer(self) -> str | None:
        """The winning class's representative answer."""
        return None if self.winner is None else self.representatives[self.winner]

    @property
    def n_valid(self) -> int:
        """Samples that gave an answer."""
        return sum(self.counts)

    def as_dict(self) -> dict[str, int]:
        """``{representative: votes}`` in order of first appearance (the gateway's ``votes`` field)."""
        return dict(zip(self.representatives, self.counts, strict=True))


def vote_classes(
    answers: Sequence[str | None], kind: str, *, timeout_s: float, grader: Grader | None = None
) -> Votes:
    """Merge one request's answers into classes within ``timeout_s`` seconds and count the votes.

    For the gateway: parses and comparisons stop when the time is up (``complete=False``; answers not yet
    merged keep voting apart). With a ``grader`` math-verify runs in its pool, each item bounded by what
    is left of ``timeout_s``; without one it runs in this process (bounded on the main thread only).
    Distinct strings are parsed once per call.

    >>> v = vote_classes(["(3,\\\\pi/2)", "(0,3)", "(3,\\\\frac{\\\\pi}{2})"], "math", timeout_s=5.0)
    >>> v.answer, v.counts, v.first_index
    ('(3,\\\\pi/2)', [2, 1], [0, 1])
    """
    if not timeout_s > 0:
        raise InputError(f"timeout_s must be > 0 seconds; you passed {timeout_s}.")
    start = time.monotonic()
    result = classify([answers], kind, grader=grader, timeout=timeout_s, deadline=start + timeout_s)
    classes = result.classes[0]
    n = result.n_classes[0]
    counts = [0] * n
    first = [-1] * n
    for j, c in enumerate(classes):
        if c is not None:
            counts[c] += 1
            if first[c] < 0:
                first[c] = j
    winner = max(range(n), key=lambda c: (counts[c], -c)) if n else None
    reps = [str(answers[i]) for i in first]
    return Votes(classes, reps, first, counts, winner, result.complete, time.monotonic() - start)
