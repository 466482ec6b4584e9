"""Fit a weighted vote on a table at one k and keep it only where cross-validation supports it.

:func:`fit_vote` scores the weight family of :mod:`isocompute.solver.votes.weights` — β over
:data:`~isocompute.solver.votes.study.BETAS` (length) times γ over :data:`~isocompute.solver.votes.study.GAMMAS`
when the table carries a confidence field (else γ = 0) — on seeded random k-subsets of every prompt's
samples (the same subsets for every candidate and for plain majority: matched tokens). Cross-fitted over
``folds`` folds of prompts, each fold is scored with the candidate best on the others; a one-sided paired
bootstrap over prompts of that out-of-fold accuracy minus majority's decides: the weighting is kept iff its
lower bound at ``level`` (0.95) is above 0, and then the candidate best on the whole table is served;
otherwise β = γ = 0 (plain majority). Both accuracies, the CI and the decision are recorded in
:attr:`VoteFit.weights` ``.fit``, which :meth:`~isocompute.solver.votes.weights.VoteWeights.save` writes as
``vote.json`` for the gateway's ``strategy="weighted"`` (``serve --vote vote.json``).

Worked example (``tests/test_votes.py``): 300 prompts of 16 samples whose wrong answers are 3× longer than
the right ones; at k = 4 majority scores 0.542 and the fitted β = 4 (the shortest answer nearly always wins)
0.888 out of fold, gain CI [+32.6, +36.4] pt → kept. With lengths drawn independently of correctness the
gain is +0.2 pt [−0.4, +0.9] → not supported, β = γ = 0.

Ignores: DeepConf's filter (an offline baseline, :meth:`~isocompute.solver.votes.study.VoteStudy.cross_fit`
with ``kind="filter"``; the gateway does not filter) and the per-prompt plan (the policy's).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from isocompute.solver.outcomes import OutcomeTable
from isocompute.solver.votes.evidence import draw_subsets, evidence
from isocompute.solver.votes.study import BETAS, GAMMAS, Row, VoteStudy, keep_decision
from isocompute.solver.votes.weights import VoteWeights

__all__ = ["VoteFit", "candidates", "fit_vote", "study"]


@dataclass(frozen=True)
class VoteFit:
    """The fitted vote at ``k``: ``weights`` (what serves; β = γ = 0 unless ``kept``), ``candidate`` the
    best (β, γ) on the whole table, and the out-of-fold comparison ``weighted`` vs ``majority``."""

    k: int
    weights: VoteWeights
    kept: bool
    candidate: tuple[float, float]
    majority: Row
    weighted: Row

    def record(self) -> dict[str, Any]:
        b = self.weighted.vs_majority
        return {"k": self.k, "kept": self.kept, "candidate": list(self.candidate),
                "majority_oof": self.majority.accuracy, "weighted_oof": self.weighted.accuracy,
                "gain": b.mean, "gain_ci95": [b.low, b.high], "gain_lower_bound": b.lower_bound,
                "mc_se": self.weighted.mc_se, "fold_choices": [list(c) for c in self.weighted.chosen]}  # type: ignore[arg-type]


def candidates(has_confidence: bool, *, length: bool = True, confidence: bool = True) -> list[tuple[float, float]]:
    """The (β, γ) grid: β over BETAS when ``length``, γ over GAMMAS when the table has confidence."""
    betas = BETAS if length else (0.0,)
    gammas = GAMMAS if (confidence and has_confidence) else (0.0,)
    return [(b, g) for b in betas for g in gammas]


def study(table: OutcomeTable, k: int, *, folds: int = 5, seed: int = 0, draws: int = 256,
          level: float = 0.95) -> VoteStudy:
    """The :class:`VoteStudy` of ``table`` at ``k`` (seeded subsets and folds)."""
    ev = evidence(table)
    return VoteStudy(ev, draw_subsets(ev.n, k, draws=draws, seed=seed), folds=folds, seed=seed, level=level)


def fit_vote(table: OutcomeTable, k: int, *, folds: int = 5, seed: int = 0, draws: int = 256,
             level: float = 0.95, use_confidence: bool = True, vs: VoteStudy | None = None) -> VoteFit:
    """Fit, compare and decide (module docstring); ``vs`` reuses a study of the same table and k.
    ``use_confidence=False`` fits length alone (γ = 0), what a gateway without logprobs can apply."""
    vs = vs or study(table, k, folds=folds, seed=seed, draws=draws, level=level)
    cands = candidates(vs.ev.confidence is not None, confidence=use_confidence)
    weighted = vs.cross_fit("weighted", "weights", cands)
    keep, best = keep_decision(vs.grid("weights", cands), cands.index((0.0, 0.0)), cands, folds=vs.n_folds,
                               seed=vs.seed, level=vs.level)
    beta, gamma = cands[best]
    fitted = vs.weights(beta, gamma) if keep else vs.weights(0.0, 0.0)
    if not use_confidence:
        fitted = replace(fitted, confidence_field=None, confidence_mean=0.0, confidence_std=1.0)
    out = VoteFit(k=k, weights=fitted, kept=keep, candidate=(beta, gamma), majority=vs.majority, weighted=weighted)
    record = {**out.record(), "folds": vs.n_folds, "seed": vs.seed, "draws": int(vs.sub.idx.shape[1]),
              "exact": vs.sub.exact, "level": vs.level, "table_sha256": table.sha256, "prompts": len(table)}
    return replace(out, weights=replace(fitted, fit=record))
