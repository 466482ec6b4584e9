"""The learned continuation: at each check point, stop or go on, priced like the solver prices plans.

Continuations. At check point t of a walk (:mod:`~isocompute.policy.evidence.walks`) the runner may stop
(answer the vote now) or continue to a later finish: K ∈ :data:`HORIZONS` more finishes (K ≥ 1), to the end of this wave (K = −1:
at a wave's end, to the end of the next one), or to the plan's end (K = 0). Each continuation's value, from the prompt's own samples
(the walk's later check points: one draw of what the model would do), is

    gain ΔU_K = U[t + K] − U[t],   extra tokens ΔT_K = T[t + K] − T[t],   extra latency ΔL_K = L[t + K] − L[t]

(t + K capped at the plan's last finish). Three LightGBM regressors per horizon learn E[ΔU_K], E[ΔT_K]
and E[ΔL_K] given the evidence (:mod:`~isocompute.policy.evidence.features`; the check point's index is a
feature, so one model per horizon serves every decision point). The rule at prices (λ, μ):

    stop at the first t where  max_K  Ĝ_K − λ·T̂_K − μ·L̂_K  ≤ 0        (the last finish always stops)

Averaged over draws, ΔU_K is an unbiased label of the continuation's value given the state, so the
regressors estimate what the issue's labels ask (U − λ·tokens − μ·latency of each continuation) by
regression on Monte Carlo draws rather than per-state enumeration. Budgets: :func:`stop_points` on
out-of-fold predictions gives each price's mean tokens and latency; :mod:`~isocompute.policy.evidence.fit`
maps a budget to its price as the policy maps budgets to λ.

Worked example: Ĝ = (0.02, 0.03, 0.03, 0.04), T̂ = (1, 2, 3, 9), L̂ = (0.2, 0.4, 0.5, 1.5) at λ = 0.01,
μ = 0: scores (0.01, 0.01, 0.00, −0.05), max 0.01 > 0 → continue; at λ = 0.02 every score ≤ 0 → stop.

Ignores: the value of stopping later than K (each continuation is priced as if the rule then stopped;
the rule re-decides at the next finish, so it is a one-step look-ahead over several horizons).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from isocompute.policy.evidence.walks import Walks

__all__ = ["HORIZONS", "Heads", "continuation_labels", "stop_points"]

HORIZONS = (1, -1, 0)
TARGETS = ("gain", "tokens", "latency")
PARAMS = {"objective": "regression", "learning_rate": 0.05, "num_leaves": 15, "min_data_in_leaf": 100,
          "feature_fraction": 0.9, "bagging_fraction": 0.8, "bagging_freq": 1, "lambda_l2": 1.0,
          "verbose": -1, "num_threads": 2, "deterministic": True, "force_row_wise": True}
ROUNDS = 150


def continuation_labels(w: Walks, horizons: tuple[int, ...] = HORIZONS) -> dict[str, np.ndarray]:
    """(D, M, len(horizons)) gains, extra tokens and extra latency of each continuation (module docstring)."""
    ends = np.stack([_end(w, K) for K in horizons], axis=-1)
    out = {}
    for name, x in (("gain", w.utility), ("tokens", w.tokens), ("latency", w.latency)):
        out[name] = x[:, ends] - x[:, :, None]
    return out


def _end(w: Walks, K: int) -> np.ndarray:
    """Per check point t, the check point continuation K runs to: t + K (K ≥ 1), the end of the plan (0),
    the end of the wave that the next finish belongs to (−1: finish this wave, or at a wave's end run the
    next one)."""
    M = w.n_checks
    t = np.arange(M)
    if K > 0:
        return np.minimum(t + K, M - 1)
    if K == 0:
        return np.full(M, M - 1)
    nxt = np.minimum(t + 1, M - 1)
    return nxt + w.running[nxt]


@dataclass
class Heads:
    """The regressors: ``boosters[(target, K)]`` (LightGBM), fitted on evidence rows; ``confidence``: whether
    those rows had the samples' confidence (then the gateway asks its streams for logprobs to serve them)."""

    boosters: dict[tuple[str, int], Any] = field(default_factory=dict)
    seed: int = 0
    horizons: tuple[int, ...] = HORIZONS
    confidence: bool = False

    def fit(self, X: np.ndarray, labels: dict[str, np.ndarray]) -> Heads:
        """``X`` (rows, features); ``labels[target]`` (rows, len(HORIZONS))."""
        import lightgbm as lgb

        for target in TARGETS:
            for h, K in enumerate(self.horizons):
                data = lgb.Dataset(X, labels[target][:, h], free_raw_data=True)
                self.boosters[(target, K)] = lgb.train({**PARAMS, "seed": self.seed}, data, ROUNDS)
        return self

    def predict(self, X: np.ndarray) -> dict[str, np.ndarray]:
        """Per target, (rows, len(HORIZONS)) predictions; extra tokens and latency are never negative."""
        out = {}
        for target in TARGETS:
            cols = [self.boosters[(target, K)].predict(X, num_threads=2) for K in self.horizons]
            out[target] = np.stack(cols, axis=-1) if X.shape[0] else np.zeros((0, len(self.horizons)))
        out["tokens"] = np.maximum(out["tokens"], 0.0)
        out["latency"] = np.maximum(out["latency"], 0.0)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "horizons": list(self.horizons), "confidence": self.confidence,
                "boosters": {f"{t}:{K}": b.model_to_string() for (t, K), b in self.boosters.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Heads:
        import lightgbm as lgb

        boosters = {}
        for key, text in d["boosters"].items():
            t, K = key.split(":")
            boosters[(t, int(K))] = lgb.Booster(model_str=text)
        return cls(boosters, int(d.get("seed", 0)), tuple(int(K) for K in d.get("horizons", HORIZONS)),
                   bool(d.get("confidence", False)))


def scores(pred: dict[str, np.ndarray], lam: float, mu: float) -> np.ndarray:
    """max over continuations of Ĝ − λ·T̂ − μ·L̂ (positive: continue)."""
    return (pred["gain"] - lam * pred["tokens"] - mu * pred["latency"]).max(axis=-1)


def stop_points(score: np.ndarray) -> np.ndarray:
    """(D,) first check point whose ``score`` (D, M) is ≤ 0; the last always stops."""
    stop = score <= 0
    stop[:, -1] = True
    return stop.argmax(axis=1)
