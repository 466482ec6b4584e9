"""Outcome tables: the graded samples of every calibration prompt, read, validated, written and viewed.

Format, schema version 1 — JSONL, one JSON object per line, one line per prompt::

    {"id": "gsm8k-17", "prompt": "…", "gold": "18", "prompt_tokens": 91,
     "samples": [{"answer": "18", "correct": true, "completion_tokens": 143, "score": 0.82}, …],
     "meta": {"task": "gsm8k", "model": "…", "temperature": 0.7}}

Fields (required unless marked optional):

* ``id`` — non-empty string, unique in the file.
* ``prompt`` — the text given to the model.
* ``gold`` — reference final answer (a JSON number is read as its string).
* ``samples`` — non-empty list, one object per sampled completion:

  * ``answer`` — the extracted final answer, ``null`` when none could be extracted (a JSON number
    is read as its string), kept raw.
  * ``class`` (optional) — the answer's equivalence class (:mod:`isocompute.tasks.equivalence`): an
    integer, dense within the record (``0 … G−1``), ``null`` exactly when ``answer`` is null; equal
    answer strings share a class. A record gives ``class`` on every sample or on none. Majority votes
    count classes where given, else equal strings (so tables written before classes read as before).
  * ``correct`` — ``true``/``false``, the grader's verdict on this sample.
  * ``completion_tokens`` (optional) — generated tokens, integer ≥ 0.
  * ``score`` (optional) — verifier / reward-model score, a finite number (needed for best-of-k).

* ``prompt_tokens`` (optional) — prompt length in tokens, integer ≥ 0.
* ``meta`` (optional) — free-form object (task, model, temperature, …).

Unknown keys are kept in :attr:`OutcomeTable.records` and otherwise ignored. Prompts may have different
numbers of samples (a *ragged* table); the vectorised views are then padded and :attr:`OutcomeTable.mask`
marks the real entries. Blank lines are skipped. A line counts as written only once its newline is:
:class:`OutcomeWriter` flushes one complete line per record, and on reopening drops a partial last
line left by an interrupted run, so resuming neither loses nor duplicates finished prompts.

This module ignores how answers were extracted or graded (``isocompute.tasks``) and what the utilities
are (:mod:`isocompute.solver.estimators`).
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import math
import operator
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from isocompute.errors import InputError

SCHEMA_VERSION = 1
NULL_CODE = -1  # answer code of a sample whose answer is null
PAD_CODE = -2  # answer code of a padding entry in a ragged table

_FIX = "Fix it (the format is in the isocompute.solver.outcomes docstring) or regenerate the table."


# --------------------------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class Sample:
    """One graded completion; ``answer_class`` is written as ``"class"`` (module docstring)."""

    answer: str | None
    correct: bool
    completion_tokens: int | None = None
    score: float | None = None
    answer_class: int | None = None


@dataclass(frozen=True, slots=True)
class OutcomeRecord:
    """One prompt with its graded samples: a line of the outcome table."""

    id: str
    prompt: str
    gold: str
    samples: tuple[Sample, ...]
    prompt_tokens: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def record_to_dict(record: OutcomeRecord) -> dict[str, Any]:
    """The JSON object for ``record``; optional fields that are ``None`` (or an empty meta) are left out."""
    out: dict[str, Any] = {"id": record.id, "prompt": record.prompt, "gold": record.gold}
    if record.prompt_tokens is not None:
        out["prompt_tokens"] = record.prompt_tokens
    with_class = any(s.answer_class is not None for s in record.samples)
    out["samples"] = [_sample_to_dict(s, with_class) for s in record.samples]
    if record.meta:
        out["meta"] = record.meta
    return out


def _sample_to_dict(s: Sample, with_class: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"answer": s.answer}
    if with_class:
        out["class"] = s.answer_class
    out["correct"] = s.correct
    if s.completion_tokens is not None:
        out["completion_tokens"] = s.completion_tokens
    if s.score is not None:
        out["score"] = s.score
    return out


def record_to_json(record: OutcomeRecord | Mapping[str, Any]) -> str:
    """One line of the table (without the newline), validated the same way the reader validates it."""
    obj = record_to_dict(record) if isinstance(record, OutcomeRecord) else dict(record)
    _check_record(obj, lambda: f"record {obj.get('id')!r}")
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


# --------------------------------------------------------------------------------------------- validation

_ANSWER_TYPES = {str, type(None)}
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
        if v is _MISSING:
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
        raise fail("empty samples: every prompt needs at least one graded sample")
    return samples


def _check_samples(flat: list, locate: Callable[[int], tuple[str, int]]) -> tuple[list, list, list, list, list]:
    """Validate samples (of many records, back to back); return their columns
    (correct, answer, score, completion_tokens, class — :data:`_MISSING` where absent).

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
    except (KeyError, TypeError):
        for f, smp in enumerate(flat):
            if type(smp) is not dict:
                raise fail(f, f" must be an object, got {smp!r}") from None
            if "correct" not in smp:
                raise fail(f, " is missing 'correct' (true or false)") from None
            if "answer" not in smp:
                raise fail(f, " is missing 'answer' (null when none was extracted)") from None
        raise  # only a new kind of malformed sample gets here
    score = list(map(_get_score, flat))
    tokens = list(map(_get_tokens, flat))
    classes = list(map(_get_class, flat))
    if set(map(type, correct)) != {bool}:
        f = next(f for f, v in enumerate(correct) if type(v) is not bool)
        raise fail(f, f".correct must be true or false, got {correct[f]!r}")
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


_get_correct = operator.itemgetter("correct")
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
    bad = [j for j, (s, t) in enumerate(zip(score, tokens, strict=True))
           if (s is not None and not math.isfinite(s)) or (t is not None and t < 0)]
    if bad:
        raise InputError(f"{where()}: samples[{bad[0]}] has a non-finite score or a negative "
                         f"completion_tokens. {_FIX}")


# --------------------------------------------------------------------------------------------- table


@dataclass(frozen=True, eq=False)
class OutcomeTable:
    """Validated outcome records plus the vectorised views the estimators and cost tables use.

    Shapes: ``N`` prompts, ``n_max`` = the largest number of samples of any prompt. Entries of the
    (N, n_max) views beyond a prompt's ``n_samples`` are padding: ``mask`` False, ``correct`` False,
    ``answer_codes`` :data:`PAD_CODE`, ``scores``/``completion_tokens`` NaN.

    ``answer_codes[i, j]`` is dense per row: the distinct non-null answers of row i get codes
    0..G_i−1 (equal strings share a code; the numbering carries no meaning), a null answer gets
    :data:`NULL_CODE`. ``meta`` holds the key/value pairs shared by every record's meta (e.g. task,
    model, temperature); ``metas`` each record's own. ``sha256`` is the source file's digest (None for
    tables built in memory) and is kept by :meth:`subset`.
    """

    records: list[dict[str, Any]]
    ids: list[str]
    prompts: list[str]
    golds: list[str]
    n_samples: np.ndarray  # (N,) int64
    mask: np.ndarray  # (N, n_max) bool
    correct: np.ndarray  # (N, n_max) bool
    answer_codes: np.ndarray  # (N, n_max) int64
    scores: np.ndarray  # (N, n_max) float64, NaN when absent
    completion_tokens: np.ndarray  # (N, n_max) float64, NaN when absent
    prompt_tokens: np.ndarray  # (N,) float64, NaN when absent
    metas: list[dict[str, Any]]
    source: str
    sha256: str | None

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def n_max(self) -> int:
        return int(self.correct.shape[1])

    @property
    def is_ragged(self) -> bool:
        return bool(self.n_samples.min() != self.n_samples.max())

    @property
    def n_correct(self) -> np.ndarray:
        """(N,) number of correct samples per prompt."""
        return self.correct.sum(axis=1)

    @property
    def mean_completion_tokens(self) -> np.ndarray:
        """(N,) mean completion tokens over the samples that report them; NaN where none does."""
        ct = self.completion_tokens
        have = ~np.isnan(ct)
        cnt = have.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(cnt > 0, np.where(have, ct, 0.0).sum(axis=1) / cnt, np.nan)

    @property
    def has_token_counts(self) -> bool:
        """True when every prompt has ``prompt_tokens`` and every sample ``completion_tokens``."""
        return not (np.isnan(self.prompt_tokens).any() or np.isnan(self.completion_tokens[self.mask]).any())

    @property
    def has_scores(self) -> bool:
        """True when every sample carries a verifier ``score`` (needed by best-of-k)."""
        return not np.isnan(self.scores[self.mask]).any()

    @property
    def meta(self) -> dict[str, Any]:
        if not self.metas:
            return {}
        common = dict(self.metas[0])
        for m in self.metas[1:]:
            common = {k: v for k, v in common.items() if k in m and m[k] == v}
        return common

    def subset(self, indices: Sequence[int] | np.ndarray) -> OutcomeTable:
        """The rows ``indices`` (ints or a boolean mask), in that order, as a new table (for CV folds)."""
        idx = np.asarray(indices)
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)
        idx = idx.astype(np.int64, copy=False)
        if idx.size == 0:
            raise InputError("subset() needs at least one row; pass a non-empty list of row indices.")
        n = self.n_samples[idx]
        w = int(n.max())
        pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
        return OutcomeTable(
            records=pick(self.records), ids=pick(self.ids), prompts=pick(self.prompts), golds=pick(self.golds),
            n_samples=n, mask=self.mask[idx, :w], correct=self.correct[idx, :w],
            answer_codes=self.answer_codes[idx, :w], scores=self.scores[idx, :w],
            completion_tokens=self.completion_tokens[idx, :w], prompt_tokens=self.prompt_tokens[idx],
            metas=pick(self.metas), source=self.source, sha256=self.sha256,
        )


def _build(items: Iterable[tuple[Any, Callable[[], str]]], source: str, sha256: str | None) -> OutcomeTable:
    """Validate records (each with a lazy location string for errors) and assemble the views."""
    records: list[dict[str, Any]] = []
    wheres: list[Callable[[], str]] = []
    first_seen: dict[str, int] = {}
    flat: list[Any] = []
    ns: list[int] = []
    for obj, where in items:
        samples = _check_header(obj, where)
        rid = obj["id"]
        if rid in first_seen:
            raise InputError(f"{where()}: duplicate id {rid!r}, first seen at {wheres[first_seen[rid]]()}. "
                             "Ids must be unique; drop or rename one of the two records.")
        first_seen[rid] = len(records)
        records.append(obj)
        wheres.append(where)
        flat += samples
        ns.append(len(samples))
    if not records:
        raise InputError(f"{source}: no records. An outcome table needs one JSON line per prompt; "
                         "run `isocompute sample` to create one.")

    n = np.asarray(ns, dtype=np.int64)
    starts = np.cumsum(n) - n

    def locate(f: int) -> tuple[str, int]:
        i = int(np.searchsorted(starts, f, side="right")) - 1
        return wheres[i](), f - int(starts[i])

    corr_all, ans_all, score_all, tok_all, cls_all = _check_samples(flat, locate)
    mask = np.arange(n.max())[None, :] < n[:, None]

    def padded(col: np.ndarray, fill: Any) -> np.ndarray:
        out = np.full(mask.shape, fill, dtype=col.dtype)
        out[mask] = col
        return out

    scores_flat = np.asarray(score_all, dtype=np.float64)  # None -> NaN
    tokens_flat = np.asarray(tok_all, dtype=np.float64)
    not_finite = np.isinf(scores_flat)
    if np.isnan(scores_flat).sum() != score_all.count(None):
        # json.loads reads `NaN`; it must not pass for an absent score (None), which is NaN here too.
        not_finite |= np.fromiter((s is not None and s != s for s in score_all), bool, len(score_all))
    for bad, what in ((not_finite, ".score must be a finite number"),
                      (tokens_flat < 0, ".completion_tokens must be an integer >= 0")):
        if bad.any():
            where, j = locate(int(np.argmax(bad)))
            raise InputError(f"{where}: samples[{j}]{what}. {_FIX}")

    return OutcomeTable(
        records=records, ids=[r["id"] for r in records], prompts=[r["prompt"] for r in records],
        golds=[r["gold"] for r in records], n_samples=n, mask=mask,
        correct=padded(np.asarray(corr_all, dtype=bool), False),
        answer_codes=padded(_answer_codes(ans_all, cls_all, n, locate), PAD_CODE),
        scores=padded(scores_flat, np.nan), completion_tokens=padded(tokens_flat, np.nan),
        prompt_tokens=np.asarray([r.get("prompt_tokens") for r in records], dtype=np.float64),
        metas=[r.get("meta") or {} for r in records], source=source, sha256=sha256,
    )


def _answer_codes(answers: list, classes: list, n: np.ndarray, locate: Callable[[int], tuple[str, int]]) -> np.ndarray:
    """Flat answer codes: a record's classes where it gives them, else its factorised strings."""
    strings = _factorise_rows(answers, n)
    given = _class_codes(classes, answers, n, locate, strings)
    if given is None:
        return strings
    present, codes = given
    return np.where(present, codes, strings)


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


# --------------------------------------------------------------------------------------------- readers


def read_outcomes(path: str | os.PathLike[str]) -> OutcomeTable:
    """Read and validate an outcome table (JSONL, schema version 1).

    Raises :class:`InputError` naming the file, the line and what is wrong: bad JSON, a missing or
    duplicate id (both lines named), empty samples, ``correct`` not a bool, a negative token count, …
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise InputError(f"outcome table {p} does not exist; create it with `isocompute sample` "
                         "or pass the path of an existing .jsonl table.") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{p} is not UTF-8 text ({e}); re-save it as UTF-8 JSONL.") from None

    def items() -> Iterable[tuple[Any, Callable[[], str]]]:
        # split on "\n" only: str.splitlines() would also split on U+2028 inside JSON strings.
        for lineno, line in enumerate(text.split("\n"), start=1):
            if not line or line.isspace():  # isspace stops at the first character; strip() would copy
                continue
            where = lambda lineno=lineno: f"{p}, line {lineno}"  # noqa: E731
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                hint = " (the last line looks cut off: was a sampling run interrupted? resume it)" \
                    if not text.endswith("\n") and lineno == text.count("\n") + 1 else ""
                raise InputError(f"{where()}: bad JSON: {e.msg} at column {e.colno}{hint}. {_FIX}") from None
            yield obj, where

    # Parsing creates ~N·n small dicts and no cycles: the cyclic GC's repeated passes over them would
    # cost ~20% of the read, so it is paused meanwhile.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _build(items(), str(p), hashlib.sha256(data).hexdigest())
    finally:
        if was_enabled:
            gc.enable()


def from_records(records: Iterable[OutcomeRecord | Mapping[str, Any]], *, source: str = "<records>") -> OutcomeTable:
    """Build a table from in-memory records (dicts in the line format, or :class:`OutcomeRecord`)."""

    def items() -> Iterable[tuple[Any, Callable[[], str]]]:
        for i, r in enumerate(records):
            obj = record_to_dict(r) if isinstance(r, OutcomeRecord) else (dict(r) if isinstance(r, Mapping) else r)
            yield obj, (lambda i=i: f"{source}, record {i}")

    return _build(items(), source, None)


def from_qwen_cot_table(path: str | os.PathLike[str]) -> OutcomeTable:
    """Convert a Qwen2.5-Math evaluation dump (``qwen_math_cot_*.jsonl``) into an outcome table.

    Each input line has ``idx``, ``question``, ``gt`` and per-sample lists ``pred`` (extracted answer),
    ``score`` (bool: graded correct) and ``pred_score`` (``[[reward]]``, a reward-model score). They map
    to ``id = "qwen-<idx>"``, prompt, gold, and samples with answer = pred, correct = score,
    score = pred_score[j][0]. An empty pred becomes a null answer.
    """
    p = Path(path)
    out = []
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                preds, verdicts = r["pred"], r["score"]
                rewards = r.get("pred_score") or [None] * len(preds)
                samples = [
                    {"answer": a if a != "" else None, "correct": c,
                     **({"score": float(s[0] if isinstance(s, list) else s)} if s is not None else {})}
                    for a, c, s in zip(preds, verdicts, rewards, strict=True)
                ]
                out.append({"id": f"qwen-{r['idx']}", "prompt": r["question"], "gold": r["gt"],
                            "samples": samples, "meta": {"level": r.get("level")}})
            except (json.JSONDecodeError, KeyError, TypeError, ValueError, IndexError) as e:
                raise InputError(f"{p}, line {lineno}: not a Qwen CoT evaluation record "
                                 f"({type(e).__name__}: {e}); expected idx, question, gt, pred, score.") from None
    table = from_records(out, source=str(p))
    return dataclasses.replace(table, sha256=hashlib.sha256(p.read_bytes()).hexdigest())


# --------------------------------------------------------------------------------------------- writer


def _complete_prefix(path: Path) -> tuple[set[str], int]:
    """Ids on the complete (newline-terminated) lines of ``path`` and the byte length of those lines."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return set(), 0
    end = data.rfind(b"\n") + 1
    ids: set[str] = set()
    for lineno, line in enumerate(data[:end].split(b"\n")[:-1], start=1):
        if not line.strip():
            continue
        try:
            rid = json.loads(line)["id"]
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
            raise InputError(f"{path}, line {lineno}: a complete line that is not an outcome record; the "
                             "file is damaged beyond an interrupted last line. Fix or delete that line.") from None
        ids.add(rid)
    return ids, end


def completed_ids(path: str | os.PathLike[str]) -> set[str]:
    """Ids already written to ``path`` (empty if it does not exist). A truncated last line — one without
    its newline, left by an interrupted run — is not counted: that prompt is not finished."""
    return _complete_prefix(Path(path))[0]


class OutcomeWriter:
    """Append records to an outcome table, one flushed line each; reopening resumes.

    On open, a partial last line (an interrupted write) is cut off, and :attr:`completed` holds the ids
    already present so the sampler can skip them. Writing an id that is already present raises.

    >>> with OutcomeWriter("outcomes.jsonl") as w:            # doctest: +SKIP
    ...     for problem in problems:
    ...         if problem.id not in w.completed:
    ...             w.write(OutcomeRecord(problem.id, problem.prompt, problem.gold, samples))
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.completed: set[str] = set()
        self._f: Any = None

    def open(self) -> OutcomeWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.completed, end = _complete_prefix(self.path)
        if self.path.exists() and self.path.stat().st_size > end:
            with self.path.open("r+b") as f:
                f.truncate(end)
        self._f = self.path.open("a", encoding="utf-8")
        return self

    def write(self, record: OutcomeRecord | Mapping[str, Any]) -> None:
        if self._f is None:
            raise RuntimeError("OutcomeWriter is not open; use it as a context manager or call open().")
        line = record_to_json(record)
        rid = record.id if isinstance(record, OutcomeRecord) else record["id"]
        if rid in self.completed:
            raise InputError(f"{self.path} already holds a record with id {rid!r}; skip ids in "
                             "`writer.completed` when resuming.")
        self._f.write(line + "\n")  # one write per line, so a crash leaves at most one partial line
        self._f.flush()
        self.completed.add(rid)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def __enter__(self) -> OutcomeWriter:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()
