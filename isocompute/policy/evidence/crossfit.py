"""Cross-fitted values of the learned continuation: what it would do on prompts it was not trained on.

:func:`crossfit_values` splits the table's prompts into folds; for each fold it trains the continuation
heads (:class:`~isocompute.policy.evidence.continuation.Heads`) on the walks of the other folds' prompts
and plays the rule on fresh walks of the fold's prompts at every price (λ, μ) of a grid. Per prompt and
price it returns the mean utility, tokens and latency over the prompt's evaluation draws (in units of
the typical length), plus the decision points' predicted and realised gains for the calibration plot.

Prices: λ on a log grid (:data:`LAMBDAS`, utility per typical length of tokens), μ = ρ·λ for ρ in
:data:`RHOS` (latency priced at 0, 1 or 4 times a token of one sample).

Worked example: 500 prompts, folds = 5, draws = 16: each fold's heads learn from 400 × 16 walks of 12
check points and are scored on 100 × ``eval_draws`` walks; a price's row of ``utility`` is each prompt's
mean over its draws.

Ignores: the fixed plans (:mod:`isocompute.policy.evidence.chain` compares against them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from isocompute.policy.evidence.continuation import HORIZONS, Heads, continuation_labels, scores, stop_points
from isocompute.policy.evidence.features import walk_features
from isocompute.policy.evidence.walks import Walks, walk

__all__ = ["LAMBDAS", "RHOS", "Values", "crossfit_values", "train_heads", "walks_of"]

LAMBDAS = tuple(float(x) for x in np.geomspace(1e-4, 0.03, 28))
RHOS = (0.0, 1.0, 4.0)


@dataclass(frozen=True, eq=False)
class Values:
    """Per prompt (rows) and price (columns, :attr:`prices`): mean ``utility``, ``tokens``, ``latency``
    (units of the typical length); ``calibration``: (predicted, realised) gain of the chosen continuation
    at every decision point of the evaluation walks at the middle price."""

    prices: tuple[tuple[float, float], ...]
    utility: np.ndarray
    tokens: np.ndarray
    latency: np.ndarray
    calibration: tuple[np.ndarray, np.ndarray]
    fold_of: np.ndarray | None = None

    def subset(self, rows: np.ndarray) -> Values:
        """The prompts ``rows`` (the calibration pairs are kept whole)."""
        return Values(self.prices, self.utility[rows], self.tokens[rows], self.latency[rows], self.calibration,
                      None if self.fold_of is None else self.fold_of[rows])


def walks_of(table, waves: tuple[int, ...], rows: np.ndarray, *, unit: float, draws: int,
             seed: int) -> tuple[Walks, np.ndarray | None]:
    """Walks of the table's prompts ``rows`` and their finishers' confidence (None without)."""
    sub = table.subset(rows)
    w = walk(sub.answer_codes, sub.correct, sub.completion_tokens, sub.n_samples, waves, unit=unit,
             draws=draws, seed=seed)
    return w, confidence_of(sub, w)


def confidence_of(table, w: Walks) -> np.ndarray | None:
    """(D, M) each finisher's confidence (DeepConf's lowest window mean), or None when the table has none."""
    conf = getattr(table, "confidence_min_window", None)
    if conf is None or np.isnan(conf[table.mask]).all():
        return None
    return np.asarray(conf, dtype=float)[w.prompt[:, None], w.order]


def train_heads(w: Walks, *, seed: int, horizons: tuple[int, ...] = HORIZONS,
                confidence: np.ndarray | None = None) -> Heads:
    """Heads fitted on every check point but the last (where the plan stops anyway); ``confidence`` (the
    finishers', :func:`confidence_of`) given: heads that read it (``Heads.confidence``)."""
    X = walk_features(w, confidence)[:, :-1]
    labels = continuation_labels(w, horizons)
    rows = X.reshape(-1, X.shape[-1])
    heads = Heads(seed=seed, horizons=horizons, confidence=confidence is not None)
    return heads.fit(rows, {k: v[:, :-1].reshape(-1, v.shape[-1]) for k, v in labels.items()})


def predict_walks(heads: Heads, w: Walks, confidence: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """(D, M, horizons) predictions at every check point of ``w``."""
    X = walk_features(w, confidence)
    D, M = X.shape[:2]
    pred = heads.predict(X.reshape(-1, X.shape[-1]))
    return {k: v.reshape(D, M, -1) for k, v in pred.items()}


def play(pred: dict[str, np.ndarray], w: Walks, lam: float, mu: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per walk: utility, tokens and latency where the rule at (λ, μ) stops."""
    t = stop_points(scores(pred, lam, mu))
    r = np.arange(t.size)
    return w.utility[r, t], w.tokens[r, t], w.latency[r, t]


def crossfit_values(table, waves: tuple[int, ...], *, unit: float, folds: int = 5, draws: int = 16,
                    eval_draws: int = 16, seed: int = 0, fold_of: np.ndarray | None = None,
                    horizons: tuple[int, ...] = HORIZONS, use_confidence: bool = True) -> Values:
    """The learned continuation's out-of-fold values at every price (module docstring); ``use_confidence``
    False leaves the confidence columns out (NaN) even where the table has them."""
    N = len(table)
    fold_of = np.random.default_rng(seed).permutation(N) % folds if fold_of is None else fold_of
    prices = tuple((lam, rho * lam) for rho in RHOS for lam in LAMBDAS)
    out = {k: np.zeros((N, len(prices))) for k in ("utility", "tokens", "latency")}
    cal_p, cal_r = [], []
    for f in range(int(fold_of.max()) + 1):
        train, test = np.flatnonzero(fold_of != f), np.flatnonzero(fold_of == f)
        w, conf = walks_of(table, waves, train, unit=unit, draws=draws, seed=seed + 7 * f)
        heads = train_heads(w, seed=seed + f, horizons=horizons, confidence=conf if use_confidence else None)
        w, conf = walks_of(table, waves, test, unit=unit, draws=eval_draws, seed=seed + 7 * f + 1000)
        pred = predict_walks(heads, w, conf if use_confidence else None)
        for j, (lam, mu) in enumerate(prices):
            for k, v in zip(("utility", "tokens", "latency"), play(pred, w, lam, mu), strict=True):
                out[k][test, j] = v.reshape(test.size, -1).mean(axis=1)
        p, r = _calibration(pred, w, LAMBDAS[len(LAMBDAS) // 2], horizons)
        cal_p.append(p)
        cal_r.append(r)
    return Values(prices, out["utility"], out["tokens"], out["latency"],
                  (np.concatenate(cal_p), np.concatenate(cal_r)), fold_of)


def _calibration(pred: dict[str, np.ndarray], w: Walks, lam: float,
                 horizons: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Predicted and realised gain of going to the plan's end, at each check point the rule at λ visits."""
    t = stop_points(scores(pred, lam, 0.0))
    M = w.n_checks
    visited = np.arange(M)[None, :] <= t[:, None]
    realised = w.utility[:, -1:] - w.utility
    if 0 not in horizons:
        return np.zeros(0), np.zeros(0)
    return pred["gain"][..., horizons.index(0)][visited], realised[visited]
