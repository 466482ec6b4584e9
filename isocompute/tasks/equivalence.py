"""Answer equivalence: which extracted answers are the same answer, per kind of task.

Votes count *classes* of equivalent answers, not strings: ``(3,\\pi/2)`` and ``(3,\\frac{\\pi}{2})`` are one
answer (the Phi-4 MATH-500 dump splits 52 + 23 votes between them), ``\\frac12`` meets ``0.5``, and
``5/1/2021`` meets ``05/01/2021``. One rule per *kind* (:data:`TASK_KINDS` maps a task to its kind):

| kind | an answer's canonical key | keys that still merge |
|---|---|---|
| ``math`` | math-verify's parse, printed (``srepr``), see :func:`isocompute.tasks.math_forms.math_key` | ``verify(a, b)`` |
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

Ignores: units ("18 dollars" is not the number 18 — extraction's job), partial credit, and answers
that differ only beyond the kinds above (e.g. synonyms in free text).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from fractions import Fraction
from typing import Any

from isocompute.errors import InputError
from isocompute.tasks.extract import normalize_answer
from isocompute.tasks.grading import Grader, map_in_process
from isocompute.tasks.math_forms import values_differ

__all__ = [
    "KINDS", "TASK_KINDS", "Classes", "Votes", "answer_classes", "canonical_key", "classify", "kind_of",
    "vote_classes",
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


# ------------------------------------------------------------------------------------------ keys
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


def _numbers_close(a: str, b: str) -> bool:
    x, y = float(Fraction(a[4:])), float(Fraction(b[4:]))
    return math.isclose(x, y, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def _normalise(answer: str | None) -> str | None:
    if answer is None:
        return None
    s = normalize_answer(str(answer))
    return s or None


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


_Key = tuple[str | None, complex | None]  # canonical key (None: unreadable) and, for math, a constant's value
_Group = tuple[str, str | None, complex | None]  # a record's distinct answer: first string, key, value


# math-verify's work is a pure function of the strings, so it is remembered across calls in this process
# (an import grades in batches; the gateway sees the same answers again). Timeouts are not remembered.
_CACHE_LIMIT = 200_000
_MATH_KEYS: dict[str, _Key] = {}
_VERIFIED: dict[tuple[str, str], bool] = {}


def _remember(cache: dict, items: Any) -> None:
    if len(cache) > _CACHE_LIMIT:
        cache.clear()
    cache.update(items)


def _keys(
    strings: list[str], kind: str, grader: Grader | None, timeout: float | None, deadline: float | None
) -> tuple[list[_Key], int]:
    """Canonical key (and value) of each distinct string, and how many parses timed out."""
    if kind != "math":
        return [(canonical_key(s, kind), None) for s in strings], 0
    todo = [s for s in strings if s not in _MATH_KEYS]
    if grader is None:
        result = map_in_process("math_key", todo, timeout=timeout, deadline=deadline)
    else:
        result = grader.map("math_key", todo, timeout=_within(timeout, deadline))
    failed = set(result.timed_out) | set(result.crashed)
    fresh = {s: ((None, None) if v is None else (f"math:{v[0]}", v[1]))
             for s, v in zip(todo, result.values, strict=True)}
    _remember(_MATH_KEYS, ((s, k) for i, (s, k) in enumerate(fresh.items()) if i not in failed))
    return [fresh[s] if s in fresh else _MATH_KEYS[s] for s in strings], len(failed)


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
    rows = [[norm_cache[a] if a in norm_cache else norm_cache.setdefault(a, _normalise(a)) for a in rec]
            for rec in records]
    gold_rows = [None] * len(rows) if golds is None else [_normalise(g) for g in golds]
    # A record whose answers and gold are all one string needs no key: identical strings are equal
    # (grading's own shortcut), so math-verify only reads records where something differs.
    single = [len({*row, gold} - {None}) <= 1 for row, gold in zip(rows, gold_rows, strict=True)]
    strings = list(dict.fromkeys(x for row, gold, one in zip(rows, gold_rows, single, strict=True) if not one
                                 for x in (*row, gold) if x is not None))
    keys, timed_out = _keys(strings, kind, grader, timeout, deadline)
    key_of = dict(zip(strings, keys, strict=True))

    # Groups: one per distinct key (or string, when unreadable) of a record, gold first when readable.
    groups: list[list[_Group]] = []
    sample_group: list[list[int | None]] = []
    gold_unreadable: list[int] = []
    for r, (row, gold) in enumerate(zip(rows, gold_rows, strict=True)):
        index: dict[str, int] = {}
        reps: list[_Group] = []
        if single[r]:
            key_of_r = {x: (f"same:{x}", None) for x in {*row, gold} - {None}}
        else:
            key_of_r = key_of
        if golds is not None:
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

    cluster, more_timeouts, complete = _merge(groups, kind, grader, timeout, deadline)
    timed_out += more_timeouts
    complete = complete and timed_out == 0  # a parse or comparison cut short may have split a class

    classes: list[list[int | None]] = []
    correct: list[list[bool] | None] = []
    n_classes: list[int] = []
    for r, row_groups in enumerate(sample_group):
        dense: dict[int, int] = {}
        out = [None if g is None else dense.setdefault(cluster[r][g], len(dense)) for g in row_groups]
        classes.append(out)
        n_classes.append(len(dense))
        if golds is None or r in gold_unreadable:
            correct.append(None)
        else:
            gold_cluster = cluster[r][0]
            correct.append([g is not None and cluster[r][g] == gold_cluster for g in row_groups])
    distinct = [len({s for s in row if s is not None}) for row in rows]
    return Classes(classes, correct, distinct, n_classes, gold_unreadable, timed_out, complete)


def _merge(
    groups: list[list[_Group]], kind: str, grader: Grader | None,
    timeout: float | None, deadline: float | None,
) -> tuple[list[list[int]], int, bool]:
    """Greedy merge of each record's groups (module docstring): cluster id per group, timeouts, complete."""
    cluster = [list(range(len(g))) for g in groups]
    if kind not in ("math", "number"):
        return cluster, 0, True  # canonical keys are the whole rule
    # Only readable keys can merge; an unreadable answer is a class of its own string.
    pending = [[i for i, (_, k, _) in enumerate(g) if k is not None] for g in groups]
    cache: dict[tuple[str, str], bool] = {}
    timed_out = 0
    while True:
        todo = [r for r, p in enumerate(pending) if len(p) >= 2]
        if not todo:
            return cluster, timed_out, True
        if deadline is not None and time.monotonic() >= deadline:
            return cluster, timed_out, False
        pairs = []
        for r in todo:
            first = groups[r][pending[r][0]]
            for g in pending[r][1:]:
                other = groups[r][g]
                pair = _pair(first, other, kind)
                if pair not in cache and kind == "math" and values_differ(first[2], other[2]):
                    cache[pair] = False  # two constants far apart: no need to ask math-verify
                pairs.append(pair)
        new = [p for p in dict.fromkeys(pairs) if p not in cache]
        verdicts, late = _verdicts(new, kind, grader, timeout, deadline)
        timed_out += late
        cache.update(zip(new, verdicts, strict=True))
        for r in todo:
            rep, rest = pending[r][0], pending[r][1:]
            keep = []
            for g in rest:
                if cache[_pair(groups[r][rep], groups[r][g], kind)]:
                    cluster[r][g] = cluster[r][rep]
                else:
                    keep.append(g)
            pending[r] = keep


def _verdicts(
    pairs: list[tuple[str, str]], kind: str, grader: Grader | None, timeout: float | None,
    deadline: float | None,
) -> tuple[list[bool], int]:
    """Does each pair merge (first element first)? And how many comparisons timed out (False)."""
    if kind == "number":
        return [_numbers_close(a, b) for a, b in pairs], 0
    todo = [p for p in pairs if p not in _VERIFIED]
    if not todo:
        return [_VERIFIED[p] for p in pairs], 0
    if grader is None:
        result = map_in_process("verify", todo, timeout=timeout, deadline=deadline)
    else:
        result = grader.map("verify", todo, timeout=_within(timeout, deadline))
    failed = set(result.timed_out) | set(result.crashed)
    fresh = {p: bool(v) for p, v in zip(todo, result.values, strict=True)}
    _remember(_VERIFIED, ((p, v) for i, (p, v) in enumerate(fresh.items()) if i not in failed))
    return [fresh[p] if p in fresh else _VERIFIED[p] for p in pairs], len(failed)


def _within(timeout: float | None, deadline: float | None) -> float | None:
    """The per-item timeout, shortened to what is left before ``deadline``."""
    if deadline is None:
        return timeout
    left = max(deadline - time.monotonic(), 1e-3)
    return left if timeout is None else min(timeout, left)


def _pair(rep: _Group, other: _Group, kind: str) -> tuple[str, str]:
    """What is compared: math-verify reads the strings, the number rule reads the keys."""
    if kind == "number":
        return rep[1], other[1]  # type: ignore[return-value]
    return rep[0], other[0]


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
