"""The merging half of answer equivalence: keys of distinct strings, then greedy rounds of comparisons.

:func:`distinct_keys` reads each distinct string's canonical key (math-verify's parse for ``math``, through a
:class:`~isocompute.tasks.grading.Grader` or in this process); :func:`merge_groups` joins each record's groups
round by round, each distinct key to the first earlier representative it merges with (representative
first); :func:`_verdicts` asks whether pairs merge (the number rule, else math-verify). Parses and
verdicts are remembered across calls in this process; timeouts are not. The rule itself, and who calls
this, is :mod:`isocompute.tasks.answers.equivalence`.

Ignores: the kinds whose canonical key is the whole rule (``date``, ``choice``, ``exact``): they never merge
here.
"""

from __future__ import annotations

import time
from typing import Any

from isocompute.tasks.answers.answer_keys import canonical_key, numbers_close
from isocompute.tasks.answers.math_forms import values_differ
from isocompute.tasks.grading import Grader, map_in_process

__all__ = ["Group", "Key", "distinct_keys", "merge_groups"]

Key = tuple[str | None, complex | None]  # canonical key (None: unreadable) and, for math, a constant's value
Group = tuple[str, str | None, complex | None]  # a record's distinct answer: first string, key, value


# math-verify's work is a pure function of the strings, so it is remembered across calls in this process
# (an import grades in batches; the gateway sees the same answers again). Timeouts are not remembered.
_CACHE_LIMIT = 200_000
_MATH_KEYS: dict[str, Key] = {}
_VERIFIED: dict[tuple[str, str], bool] = {}


def _remember(cache: dict, items: Any) -> None:
    if len(cache) > _CACHE_LIMIT:
        cache.clear()
    cache.update(items)


def distinct_keys(
    strings: list[str], kind: str, grader: Grader | None, timeout: float | None, deadline: float | None
) -> tuple[list[Key], int]:
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


def merge_groups(
    groups: list[list[Group]], kind: str, grader: Grader | None,
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
        return [numbers_close(a, b) for a, b in pairs], 0
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


def _pair(rep: Group, other: Group, kind: str) -> tuple[str, str]:
    """What is compared: math-verify reads the strings, the number rule reads the keys."""
    if kind == "number":
        return rep[1], other[1]  # type: ignore[return-value]
    return rep[0], other[0]
