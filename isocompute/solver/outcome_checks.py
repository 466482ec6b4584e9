"""Validation of outcome records: every field's type and range, and the ``class`` column's consistency.

The reader checks a whole file at once — columns pulled out with C-level ``map`` over every sample, a
location string built only for an error — and the writer checks one record the same way
(:func:`_check_record`). Answers are factorised into codes dense within each record
(:func:`_factorise_rows`, null → :data:`NULL_CODE`); given classes must be dense, null exactly with a
null answer, and shared by equal answers (:func:`_class_codes`). Messages name the file, the line and
the sample, and end in :data:`_FIX`.

Ignores: duplicate ids and non-finite scores across a file (:mod:`isocompute.solver.outcome_table` checks
those while it assembles the views).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from isocompute.errors import InputError

__all__ = ["EVIDENCE_FIELDS", "NULL_CODE"]

NULL_CODE = -1  # answer code of a sample whose answer is null

_FIX = "Fix it (the format is in the isocompute.solver.outcomes docstring) or regenerate the table."

_ANSWER_TYPES = {str, type(None)}
_CORRECT_TYPES = {bool, type(None)}
_SCORE_TYPES = {float, int, type(None)}
_TOKEN_TYPES = {int, type(None)}
_MISSING = object()


def _check_header(obj: Any, where: Callable[[], str]) -> list:
    """Validate a record's own fields (not its samples' contents); return its samples list."""

    def fail(what: str) -> InputError:
        return InputError(f"{where()}: {what}. {_FIX}")

    if type(obj) is not dict:
        raise fail(f"expected a JSON object, got {type(obj).__name__}")
    rid = obj.get("id")
    if type(rid) is not str or not rid:
        raise fail("missing id (a non-empty string)" if rid is None else f"id must be a non-empty string, got {rid!r}")
    for key in ("prompt", "gold"):
        v = obj.get(key, _MISSING)
        if v is _MISSING or (key == "gold" and v is None):
            if key == "gold":  # unlabelled traffic: read under the consensus target
                continue
            raise fail(f"missing {key!r}")
        if type(v) in (int, float):
            obj[key] = str(v)
        elif type(v) is not str:
            raise fail(f"{key} must be a string, got {v!r}")
    pt = obj.get("prompt_tokens")
    if pt is not None and (type(pt) is not int or pt < 0):
        raise fail(f"prompt_tokens must be an integer >= 0, got {pt!r}")
    meta = obj.get("meta")
    if meta is not None and type(meta) is not dict:
        raise fail(f"meta must be an object, got {meta!r}")
    samples = obj.get("samples", _MISSING)
    if samples is _MISSING:
        raise fail("missing 'samples'")
    if type(samples) is not list:
        raise fail(f"samples must be a list of objects, got {type(samples).__name__}")
    if not samples:
        raise fail("empty samples: every prompt needs at least one sample")
    return samples


def _check_samples(flat: list, locate: Callable[[int], tuple[str, int]]) -> tuple[list, list, list, list, list]:
    """Validate samples (of many records, back to back); return their columns
    (correct — None where ungraded —, answer, score, completion_tokens, class — :data:`_MISSING` where absent).

    Columns are pulled out and type-checked with C-level map/set over the whole file; only when a
    check fails is the offending sample searched for and ``locate(flat_index)`` turned into a
    location, so a clean 10,000 × 48 table costs tens of milliseconds here.
    """

    def fail(f: int, what: str) -> InputError:
        where, j = locate(f)
        return InputError(f"{where}: samples[{j}]{what}. {_FIX}")

    try:
        correct = list(map(_get_correct, flat))
        answer = list(map(_get_answer, flat))
    except (KeyError, TypeError, AttributeError):
        for f, smp in enumerate(flat):
            if type(smp) is not dict:
                raise fail(f, f" must be an object, got {smp!r}") from None
            if "answer" not in smp:
                raise fail(f, " is missing 'answer' (null when none was extracted)") from None
        raise  # only a new kind of malformed sample gets here
    score = list(map(_get_score, flat))
    tokens = list(map(_get_tokens, flat))
    classes = list(map(_get_class, flat))
    if not set(map(type, correct)) <= _CORRECT_TYPES:
        f = next(f for f, v in enumerate(correct) if type(v) not in _CORRECT_TYPES)
        raise fail(f, f".correct must be true or false, got {correct[f]!r} (leave it out for an ungraded sample)")
    if not set(map(type, answer)) <= _ANSWER_TYPES:
        for f, v in enumerate(answer):
            if type(v) in (int, float):
                answer[f] = str(v)
            elif type(v) not in _ANSWER_TYPES:
                raise fail(f, f".answer must be a string or null, got {v!r}")
    if not set(map(type, score)) <= _SCORE_TYPES:
        f = next(f for f, v in enumerate(score) if type(v) not in _SCORE_TYPES)
        raise fail(f, f".score must be a number, got {score[f]!r}")
    if not set(map(type, tokens)) <= _TOKEN_TYPES:
        f = next(f for f, v in enumerate(tokens) if type(v) not in _TOKEN_TYPES)
        raise fail(f, f".completion_tokens must be an integer >= 0, got {tokens[f]!r}")
    if not set(map(type, classes)) <= _CLASS_TYPES:
        f = next(f for f, v in enumerate(classes) if type(v) not in _CLASS_TYPES)
        raise fail(f, f".class must be an integer >= 0 or null, got {classes[f]!r}")
    return correct, answer, score, tokens, classes


# Optional per-sample evidence (DeepConf-style, isocompute.tasks.confidence): field → (rule, holds).
EVIDENCE_FIELDS = ("logprob_mean", "confidence_min_window")
_EVIDENCE_RULES = {"logprob_mean": ("a finite number <= 0 (a mean log-probability)", np.less_equal),
                   "confidence_min_window": ("a finite number >= 0 (a mean of −log-probabilities)",
                                             np.greater_equal)}


def _check_evidence(flat: list, locate: Callable[[int], tuple[str, int]]) -> dict[str, np.ndarray | None]:
    """Validate the optional evidence fields of samples (of many records, back to back); each field's
    flat float column (NaN where absent), or None when no sample has it. Vectorised like
    :func:`_check_samples`: a location is only built for an error."""
    out: dict[str, np.ndarray | None] = {}
    for name in EVIDENCE_FIELDS:
        col = list(map(operator.methodcaller("get", name), flat))
        absent = col.count(None)
        if absent == len(col):
            out[name] = None
            continue
        rule, holds = _EVIDENCE_RULES[name]
        bad = None
        if not set(map(type, col)) <= _SCORE_TYPES:
            bad = next(f for f, v in enumerate(col) if type(v) not in _SCORE_TYPES)
        else:
            x = np.asarray(col, dtype=np.float64)  # None -> NaN
            given = np.fromiter((v is not None for v in col), bool, len(col))
            wrong = given & ~(np.isfinite(x) & holds(np.nan_to_num(x, nan=0.0), 0.0))
            if wrong.any():
                bad = int(np.argmax(wrong))
        if bad is not None:
            where, j = locate(bad)
            raise InputError(f"{where}: samples[{j}].{name} must be {rule}, got {col[bad]!r}. {_FIX}")
        out[name] = x
    return out


_get_correct = operator.methodcaller("get", "correct")  # absent or null: ungraded (consensus target)
_get_answer = operator.itemgetter("answer")
_get_score = operator.methodcaller("get", "score")
_get_tokens = operator.methodcaller("get", "completion_tokens")
_get_class = operator.methodcaller("get", "class", _MISSING)
_CLASS_TYPES = {int, type(None), object}  # object: the type of _MISSING (no "class" key)


def _check_record(obj: Any, where: Callable[[], str]) -> None:
    """Validate one record completely (the writer's check; the reader batches the same checks)."""
    samples = _check_header(obj, where)
    _, answer, score, tokens, classes = _check_samples(samples, lambda f: (where(), f))
    _class_codes(classes, answer, np.asarray([len(samples)]), lambda f: (where(), f))
    _check_evidence(samples, lambda f: (where(), f))
    bad = [j for j, (s, t) in enumerate(zip(score, tokens, strict=True))
           if (s is not None and not math.isfinite(s)) or (t is not None and t < 0)]
    if bad:
        raise InputError(f"{where()}: samples[{bad[0]}] has a non-finite score or a negative "
                         f"completion_tokens. {_FIX}")


def _class_codes(
    classes: list, answers: list, n: np.ndarray, locate: Callable[[int], tuple[str, int]],
    strings: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """Validate the ``class`` column (module docstring); ``(present, codes)`` flat, or None if absent.

    Vectorised like the other checks: per-record presence by ``reduceat``, density and "equal strings,
    one class" by one ``np.unique`` each; a location is only built for an error.
    """
    if classes.count(_MISSING) == len(classes):
        return None
    # One C-level pass: an int class is its own code, null -> NULL_CODE, absent -> _ABSENT_CODE.
    codes = np.fromiter(map(_CLASS_CODE.get, classes, classes), dtype=np.int64, count=len(classes))
    present = codes != _ABSENT_CODE
    strings = _factorise_rows(answers, n) if strings is None else strings
    starts = np.cumsum(n) - n

    def fail(f: int, what: str) -> InputError:
        where, j = locate(int(f))
        return InputError(f"{where}: samples[{j}]{what}. {_FIX}")

    per_row = np.add.reduceat(present.astype(np.int64), starts)
    partial = np.flatnonzero((per_row > 0) & (per_row < n))
    if partial.size:
        i = int(partial[0])
        f = starts[i] + int(np.argmin(present[starts[i]:starts[i] + n[i]]))
        raise fail(f, " has no 'class' while other samples of its record do; give every sample a class "
                      "(null for a null answer) or none")
    bad = present & ((codes < 0) != (strings == NULL_CODE))
    if bad.any():
        f = int(np.argmax(bad))
        raise fail(f, f".class is {classes[f]!r} for answer {answers[f]!r}; a class is null exactly when the "
                      "answer is null, else an integer >= 0")
    row = np.repeat(np.arange(n.size, dtype=np.int64), n)
    real = present & (codes >= 0)
    span = int(codes.max()) + 2
    distinct = np.bincount(np.unique(row[real] * span + codes[real]) // span, minlength=n.size)
    top = np.maximum.reduceat(np.where(real, codes, -1), starts)  # -1: a record without classes or answers
    sparse = np.flatnonzero(top + 1 != distinct)
    if sparse.size:
        i = int(sparse[0])
        raise fail(starts[i] + int(np.argmax(codes[starts[i]:starts[i] + n[i]])),
                   f".class: the record's classes must be 0 … G-1 with none skipped; it has {int(distinct[i])} "
                   f"classes but the largest is {int(top[i])}")
    # One key per (record, answer string); a second class for the same key is an inconsistency.
    key = row[real] * (int(strings.max()) + 2) + strings[real]
    pair_keys = np.unique(key * span + codes[real])
    if pair_keys.size != np.unique(pair_keys // span).size:
        dup = pair_keys // span
        k = dup[np.flatnonzero(np.diff(dup) == 0)[0]]
        f = int(np.flatnonzero(real)[np.flatnonzero(key == k)[-1]])
        raise fail(f, f": answer {answers[f]!r} has two different classes in its record; equal answers "
                      "must share one class")
    return present, codes


_ABSENT_CODE = -3
_CLASS_CODE = {None: NULL_CODE, _MISSING: _ABSENT_CODE}


def _factorise_rows(answers: list[str | None], n: np.ndarray) -> np.ndarray:
    """Flat answers (rows of lengths ``n`` back to back) → codes dense within each row, null → -1.

    Two dict passes give global codes; then (row, code) pairs are ranked within their row by a single
    np.unique, so no Python loop runs per row.
    """
    lookup = {a: i for i, a in enumerate(dict.fromkeys(answers))}  # C-level passes, no per-item Python
    lookup[None] = NULL_CODE
    glob = np.fromiter(map(lookup.__getitem__, answers), dtype=np.int64, count=len(answers))
    row = np.repeat(np.arange(n.size, dtype=np.int64), n)
    out = np.full(glob.shape, NULL_CODE, dtype=np.int64)
    real = glob >= 0
    span = len(lookup)
    key = row[real] * span + glob[real]
    uniq, inv = np.unique(key, return_inverse=True)
    out[real] = inv - np.searchsorted(uniq, row[real] * span)
    return out
