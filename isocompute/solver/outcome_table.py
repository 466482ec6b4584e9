"""The outcome table in memory: validated records plus the (N, n_max) views estimators and cost tables use.

:func:`_build` validates records (each with a lazy location for errors), rejects duplicate ids and
non-finite numbers, and pads ragged rows (:data:`PAD_CODE`, NaN, ``mask`` False);
:func:`from_records` builds a table from in-memory records. The format is in the
:mod:`isocompute.solver.outcomes` docstring, which also reads files into tables.

Ignores: files, and what the views mean to the solver (:mod:`isocompute.solver.estimators`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from isocompute.errors import InputError
from isocompute.solver.outcome_checks import (
    _FIX,
    _check_evidence,
    _check_header,
    _check_samples,
    _class_codes,
    _factorise_rows,
)
from isocompute.solver.outcome_records import OutcomeRecord, record_to_dict

__all__ = ["PAD_CODE", "OutcomeTable", "from_records"]

PAD_CODE = -2  # answer code of a padding entry in a ragged table


@dataclass(frozen=True, eq=False)
class OutcomeTable:
    """Validated outcome records plus the vectorised views the estimators and cost tables use.

    Shapes: ``N`` prompts, ``n_max`` = the largest number of samples of any prompt. Entries of the
    (N, n_max) views beyond a prompt's ``n_samples`` are padding: ``mask`` False, ``correct`` False,
    ``answer_codes`` :data:`PAD_CODE`, ``scores``/``completion_tokens`` NaN. The optional evidence views
    ``logprob_mean`` and ``confidence_min_window`` are NaN where a sample lacks the field, and None when no
    sample of the table has it.

    ``correct`` holds the table's *target*: gold verdicts (False where ungraded; ``graded`` marks the
    samples that have one), or, on a table from :func:`isocompute.solver.targets.with_target`, each
    sample's float credit for agreeing with its prompt's plurality class.

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
    logprob_mean: np.ndarray | None = None  # (N, n_max) float64, NaN when absent; None when no sample has it
    confidence_min_window: np.ndarray | None = None  # the same
    graded: np.ndarray | None = None  # (N, n_max) bool: the sample has a gold verdict; None when every one has
    target: str = "gold"  # what ``correct`` holds: gold verdicts, or consensus credit (isocompute.solver.targets)

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
        """(N,) number of correct samples per prompt (under consensus: the reference class's size)."""
        if self.correct.dtype == bool:
            return self.correct.sum(axis=1)
        return np.rint(self.correct.sum(axis=1)).astype(np.int64)

    @property
    def has_gold(self) -> bool:
        """True when every sample carries a gold verdict (``correct``)."""
        return self.graded is None or bool(self.graded[self.mask].all())

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
        rows = lambda a: None if a is None else a[idx, :w]  # noqa: E731
        return OutcomeTable(
            records=pick(self.records), ids=pick(self.ids), prompts=pick(self.prompts), golds=pick(self.golds),
            n_samples=n, mask=self.mask[idx, :w], correct=self.correct[idx, :w],
            answer_codes=self.answer_codes[idx, :w], scores=self.scores[idx, :w],
            completion_tokens=self.completion_tokens[idx, :w], prompt_tokens=self.prompt_tokens[idx],
            metas=pick(self.metas), source=self.source, sha256=self.sha256,
            logprob_mean=rows(self.logprob_mean), confidence_min_window=rows(self.confidence_min_window),
            graded=rows(self.graded), target=self.target,
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
    evidence = _check_evidence(flat, locate)
    mask = np.arange(n.max())[None, :] < n[:, None]

    def padded(col: np.ndarray, fill: Any) -> np.ndarray:
        out = np.full(mask.shape, fill, dtype=col.dtype)
        out[mask] = col
        return out

    graded = None
    if None in corr_all:  # some samples have no gold verdict
        graded = padded(np.fromiter((c is not None for c in corr_all), bool, len(corr_all)), False)
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
        golds=[r.get("gold") for r in records], n_samples=n, mask=mask,
        correct=padded(np.asarray(corr_all, dtype=bool), False),
        answer_codes=padded(_answer_codes(ans_all, cls_all, n, locate), PAD_CODE),
        scores=padded(scores_flat, np.nan), completion_tokens=padded(tokens_flat, np.nan),
        prompt_tokens=np.asarray([r.get("prompt_tokens") for r in records], dtype=np.float64),
        metas=[r.get("meta") or {} for r in records], source=source, sha256=sha256,
        **{k: None if v is None else padded(v, np.nan) for k, v in evidence.items()}, graded=graded,
    )


def _answer_codes(answers: list, classes: list, n: np.ndarray, locate: Callable[[int], tuple[str, int]]) -> np.ndarray:
    """Flat answer codes: a record's classes where it gives them, else its factorised strings."""
    strings = _factorise_rows(answers, n)
    given = _class_codes(classes, answers, n, locate, strings)
    if given is None:
        return strings
    present, codes = given
    return np.where(present, codes, strings)


def from_records(records: Iterable[OutcomeRecord | Mapping[str, Any]], *, source: str = "<records>") -> OutcomeTable:
    """Build a table from in-memory records (dicts in the line format, or :class:`OutcomeRecord`)."""

    def items() -> Iterable[tuple[Any, Callable[[], str]]]:
        for i, r in enumerate(records):
            obj = record_to_dict(r) if isinstance(r, OutcomeRecord) else (dict(r) if isinstance(r, Mapping) else r)
            yield obj, (lambda i=i: f"{source}, record {i}")

    return _build(items(), source, None)
