"""Cross-fitted comparison of votes at one k: every method scored out of fold on the same drawn subsets.

A :class:`VoteStudy` holds a table's evidence, its k-subsets (:func:`~isocompute.solver.votes.evidence.draw_subsets`,
shared by every method: the same samples are drawn, so tokens are matched and only the vote differs), seeded
folds over prompts, and plain majority's credits. A method is a grid of candidates — weight parameters
(β, γ) of :class:`~isocompute.solver.votes.weights.VoteWeights`, or DeepConf filter levels η — scored on
every prompt once (mean credit over its subsets); :meth:`VoteStudy.cross_fit` picks, for each fold, the
candidate with the best mean on the other folds (ties to the one nearest plain majority) and scores it on
the fold. :meth:`VoteStudy.kept` is the choice as a fit would serve it, nested: in each outer fold the
weighting is cross-fitted on the training prompts alone and kept only where a one-sided paired bootstrap
there supports its gain over majority at ``level`` (else majority), so its out-of-fold figure is honest.

The weights' units (typical length T, confidence mean and spread) come from the whole table's evidence —
no grading is used, and T and μ cancel in a vote — so one grid serves every fold.

:func:`paired_bootstrap` resamples prompts (seeded) for the difference of two methods' per-prompt accuracy.

Worked example: on a table whose wrong answers run 3× longer than right ones, the β grid's best candidate
on each fold's training part is β = 4 (shortest wins), out of fold it beats majority by about 35 points and
the bootstrap keeps it; on random lengths the candidates tie within noise and :meth:`kept` serves majority.

Ignores: serving (``vote.json``: :mod:`isocompute.solver.votes.fit`) and costs beyond the matched subsets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from isocompute.solver.votes.credits import vote_credits
from isocompute.solver.votes.evidence import Evidence, Subsets
from isocompute.solver.votes.weights import VoteWeights

__all__ = ["BETAS", "ETAS", "GAMMAS", "Bootstrap", "Row", "VoteStudy", "paired_bootstrap"]

BETAS: tuple[float, ...] = (-1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.0, 2.0, 4.0)
GAMMAS: tuple[float, ...] = (-1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 4.0, 8.0)
ETAS: tuple[float, ...] = (10.0, 25.0, 50.0, 75.0, 90.0, 100.0)
Candidate = tuple[float, float] | float  # (β, γ) of a weighting, or η of a filter


@dataclass(frozen=True)
class Bootstrap:
    """Mean difference, its two-sided 95% CI and the one-sided lower bound at the study's level."""

    mean: float
    low: float
    high: float
    lower_bound: float


def paired_bootstrap(d: np.ndarray, *, level: float = 0.95, reps: int = 2000, seed: int = 0) -> Bootstrap:
    """Bootstrap over prompts of the mean of per-prompt differences ``d`` (seeded)."""
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, size=(reps, d.size))].mean(axis=1)
    lo, hi, lb = np.quantile(means, [0.025, 0.975, 1.0 - level])
    return Bootstrap(float(d.mean()), float(lo), float(hi), float(lb))


@dataclass(frozen=True)
class Row:
    """One method out of fold: per-prompt accuracy, per-subset credits, each fold's candidate, and the
    paired comparison with majority on the same subsets (``mc_se``: Monte Carlo error of the difference)."""

    name: str
    per_prompt: np.ndarray
    credits: np.ndarray
    chosen: list[Candidate]
    vs_majority: Bootstrap
    mc_se: float

    @property
    def accuracy(self) -> float:
        return float(self.per_prompt.mean())


class VoteStudy:
    """Votes at one k on one table (module docstring)."""

    def __init__(self, ev: Evidence, sub: Subsets, *, folds: int = 5, seed: int = 0, level: float = 0.95) -> None:
        self.ev, self.sub, self.seed, self.level = ev, sub, seed, level
        P = ev.codes.shape[0]
        self.fold = np.random.default_rng(seed).permutation(P) % min(folds, P)
        self.base = units(ev)
        self._cache: dict[tuple[str, Candidate], np.ndarray] = {}
        self.majority_credits = vote_credits(ev, sub)
        self.majority = self._row("majority", self.majority_credits, [(0.0, 0.0)] * self.n_folds)

    @property
    def n_folds(self) -> int:
        return int(self.fold.max()) + 1

    @property
    def filter_evidence(self) -> str | None:
        """What DeepConf's filter ranks by: the table's confidence, else shortness (None: neither)."""
        if self.ev.confidence is not None:
            return self.ev.confidence_field
        return "shortness" if not np.isnan(self.ev.tokens[self.ev.codes != -2]).all() else None

    def weights(self, beta: float, gamma: float) -> VoteWeights:
        b = self.base
        return VoteWeights(beta=beta, gamma=gamma, typical_tokens=b.typical_tokens, confidence_field=b.confidence_field,
                           confidence_mean=b.confidence_mean, confidence_std=b.confidence_std)

    def credits(self, kind: str, cand: Candidate) -> np.ndarray:
        """(P, M) credits of one candidate: ``kind`` "weights" (β, γ) or "filter" (η), cached."""
        key = (kind, cand)
        if key not in self._cache:
            if kind == "weights":
                beta, gamma = cand  # type: ignore[misc]
                lw = None if beta == gamma == 0 else self.weights(beta, gamma).log_weights(self.ev.tokens,
                                                                                          self.ev.confidence)
                self._cache[key] = self.majority_credits if lw is None else vote_credits(self.ev, self.sub, lw)
            else:
                by = self.ev.confidence if self.ev.confidence is not None else -np.log1p(self.ev.tokens)
                self._cache[key] = vote_credits(self.ev, self.sub, eta=float(cand), filter_by=by)  # type: ignore[arg-type]
        return self._cache[key]

    def grid(self, kind: str, cands: Sequence[Candidate]) -> np.ndarray:
        """(C, P) mean credit of each candidate on each prompt."""
        return np.stack([self.credits(kind, c).mean(axis=1) for c in cands])

    def cross_fit(self, name: str, kind: str, cands: Sequence[Candidate]) -> Row:
        """The method's out-of-fold row: per fold, the best candidate on the other folds."""
        A = self.grid(kind, cands)
        chosen = [cands[_best(A, self.fold != f, cands)] for f in range(self.n_folds)]
        return self._assemble(name, kind, chosen)

    def fixed(self, name: str, kind: str, cand: Candidate) -> Row:
        """A method with no fitted choice (e.g. DeepConf at η = 10) on every prompt."""
        return self._assemble(name, kind, [cand] * self.n_folds)

    def kept(self, name: str, cands: Sequence[tuple[float, float]]) -> Row:
        """The weighting as a fit serves it, nested (module docstring)."""
        A = self.grid("weights", cands)
        plain = list(cands).index((0.0, 0.0))
        chosen: list[Candidate] = []
        for f in range(self.n_folds):
            train = np.flatnonzero(self.fold != f)
            keep, best = keep_decision(A[:, train], plain, cands, folds=self.n_folds, seed=self.seed + 1 + f,
                                       level=self.level)
            chosen.append(cands[best] if keep else (0.0, 0.0))
        return self._assemble(name, "weights", chosen)

    def _assemble(self, name: str, kind: str, chosen: list[Candidate]) -> Row:
        credits = np.empty_like(self.majority_credits)
        for f, c in enumerate(chosen):
            rows = self.fold == f
            credits[rows] = self.credits(kind, c)[rows]
        return self._row(name, credits, chosen)

    def _row(self, name: str, credits: np.ndarray, chosen: list[Candidate]) -> Row:
        d = credits - self.majority_credits
        M = credits.shape[1]
        mc = 0.0 if self.sub.exact or M < 2 else float(np.sqrt((d.var(axis=1, ddof=1) / M).sum()) / d.shape[0])
        boot = paired_bootstrap(d.mean(axis=1), level=self.level, seed=self.seed)
        return Row(name, credits.mean(axis=1), credits, chosen, boot, mc)


def _best(A: np.ndarray, rows: np.ndarray, cands: Sequence[Candidate]) -> int:
    """The candidate with the highest mean over ``rows``; ties go to the one nearest plain (0, 0) / η 100."""
    means = A[:, rows].mean(axis=1)
    top = np.flatnonzero(means >= means.max() - 1e-12)
    return int(min(top, key=lambda c: _distance(cands[c])))


def _distance(c: Candidate) -> float:
    return abs(c[0]) + abs(c[1]) if isinstance(c, tuple) else abs(100.0 - c)


def keep_decision(A: np.ndarray, plain: int, cands: Sequence[Candidate], *, folds: int, seed: int,
                  level: float) -> tuple[bool, int]:
    """On the prompts (columns) of ``A`` alone: cross-fit the candidate over ``folds`` seeded folds, and keep
    it iff the one-sided paired bootstrap of its out-of-fold gain over candidate ``plain`` has its lower
    bound above 0 at ``level``. Returns (keep, the candidate fitted on all the prompts)."""
    P = A.shape[1]
    fold = np.random.default_rng(seed).permutation(P) % min(folds, P)
    oof = np.empty(P)
    for f in range(int(fold.max()) + 1):
        rows = fold == f
        oof[rows] = A[_best(A, ~rows, cands), rows]
    boot = paired_bootstrap(oof - A[plain], level=level, seed=seed)
    best = _best(A, np.ones(P, dtype=bool), cands)
    return bool(boot.lower_bound > 0 and best != plain), best


def units(ev: Evidence) -> VoteWeights:
    """β = γ = 0 weights carrying the table's units: median completion tokens, confidence mean and spread."""
    real = ev.codes != -2
    tok = ev.tokens[real]
    tok = tok[~np.isnan(tok)]
    typical = float(np.median(tok)) if tok.size else 1.0
    mean, std = 0.0, 1.0
    if ev.confidence is not None:
        c = ev.confidence[real]
        mean, std = float(c.mean()), float(c.std())
        std = std if std > 0 else 1.0
    return VoteWeights(typical_tokens=typical, confidence_field=ev.confidence_field, confidence_mean=mean,
                       confidence_std=std)
