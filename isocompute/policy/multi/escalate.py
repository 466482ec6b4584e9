"""The ``escalate`` rule: the best fixed action's two-action mix, with the dearer action given to the
prompts a learned score ranks as the ones that gain most from it.

The fixed-action rule (:mod:`isocompute.policy.plans.fixed_rule`) plays, at budget B, action ``lo`` with
probability 1 − q and ``hi`` with q for every prompt, chosen by a hash of the text. Which prompts get
``hi`` is then random. ``escalate`` keeps the pair and the share q but gives ``hi`` to the share q of
prompts with the highest *headroom score* g(x): a LightGBM regression (L2) from the prompt features to

    y_i = U[i, top] − U[i, base]

— how much the most accurate action of the hull (``top``) adds over its cheapest (``base``) on prompt i,
in expectation over sample orders. The threshold τ_B is the (1 − q) quantile of the score over the
training prompts, each scored out of fold, so on prompts like those the dearer action goes to a share
q: the mean cost is B up to how much ``hi``'s cost varies with the score. With an uninformative score
this is the fixed mix in expectation; the never-worse chain (:mod:`isocompute.policy.fallback`) admits
it only where its out-of-fold gain over the fixed action clears the chain's level.

Members are cross-fitted like the learners (:mod:`isocompute.policy.learn.crossfit`): member j is trained on
the calibration folds other than j, scores fold j's prompts out of fold, and at serving scores the
prompts the route hash sends to it. Worked example: at B with (lo, hi, q) = (a, b, 0.3) and out-of-fold
scores whose 70th percentile is τ = 0.02, a prompt with g = 0.05 plays b and one with g = 0.01 plays a.

Ignores: ties in the score beyond a hash jitter of 1e-9, and budgets where the fixed choice is one
action (q = 0: everyone plays ``lo``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from isocompute.policy.plans.fixed import FixedPlanChoice, choose_fixed_plan

ESCALATE = "escalate"
_JITTER = 1e-9


class HeadroomScore:
    """Cross-fitted members predicting y = U[top] − U[base] (module docstring)."""

    def __init__(self, *, n_rounds: int = 50, num_leaves: int = 15, learning_rate: float = 0.1,
                 min_data_in_leaf: int = 20, seed: int = 0) -> None:
        self.params = {"n_rounds": n_rounds, "num_leaves": num_leaves, "learning_rate": learning_rate,
                       "min_data_in_leaf": min_data_in_leaf, "seed": seed}

    def fit(self, X: np.ndarray, U: np.ndarray, C: np.ndarray, folds: Sequence[tuple[np.ndarray, np.ndarray]],
            u: np.ndarray) -> HeadroomScore:
        """``U``, ``C``: (N, A) training utilities and costs; ``folds`` the calibration folds; ``u`` each
        prompt's hash uniform (the tie jitter)."""
        import lightgbm as lgb

        from isocompute.policy.learn.booster_head import _lgb_params
        from isocompute.policy.learn.booster_predict import BoosterPredictor
        from isocompute.policy.multi.menu import hull_columns

        hull = hull_columns(U.mean(axis=0), C.mean(axis=0))
        c_bar = C.mean(axis=0)
        self.base_ = int(hull[np.argmin(c_bar[hull])])
        self.top_ = int(hull[np.argmax(U.mean(axis=0)[hull])])
        y = U[:, self.top_] - U[:, self.base_]
        p = self.params
        lgb_params = _lgb_params({"objective": "regression"}, num_leaves=p["num_leaves"],
                                 learning_rate=p["learning_rate"], min_data_in_leaf=p["min_data_in_leaf"], seed=p["seed"])
        self.boosters_, self.predictors_ = [], []
        self.oof_ = np.empty(U.shape[0])
        for tr, ho in folds:
            b = lgb.train(lgb_params, lgb.Dataset(X[tr], y[tr], free_raw_data=True), num_boost_round=p["n_rounds"])
            self.boosters_.append(b)
            self.predictors_.append(BoosterPredictor(b))
            self.oof_[ho] = self.predictors_[-1](X[ho])
        self.oof_ = self.oof_ + _JITTER * np.asarray(u, dtype=np.float64)
        return self

    def score(self, X: np.ndarray, route: np.ndarray, u: np.ndarray) -> np.ndarray:
        """g(x) per prompt from the member the route hash names."""
        out = np.empty(X.shape[0])
        for j, pred in enumerate(self.predictors_):
            sel = np.flatnonzero(route == j)
            if sel.size:
                out[sel] = pred(X[sel])
        return out + _JITTER * np.asarray(u, dtype=np.float64)

    def threshold(self, q: float, rows: np.ndarray | None = None) -> float:
        """τ: the score above which a share q of the (out-of-fold scored) training prompts lie."""
        g = self.oof_ if rows is None else self.oof_[rows]
        return float(np.quantile(g, 1.0 - q)) if q > 0 else np.inf

    def oof_scores(self, U: np.ndarray, C: np.ndarray, folds: Sequence[tuple[np.ndarray, np.ndarray]],
                   budgets: Sequence[float]) -> np.ndarray:
        """(B, N) out-of-fold utility under the rule: the fixed choice and τ from the other folds."""
        out = np.empty((len(budgets), U.shape[0]))
        for tr, ho in folds:
            u_bar, c_bar = U[tr].mean(axis=0), C[tr].mean(axis=0)
            for bi, b in enumerate(budgets):
                ch = choose_fixed_plan(u_bar[None], c_bar[None], max(float(b), float(c_bar.min())))
                up = self.oof_[ho] > self.threshold(ch.mix, tr) if ch.lo != ch.hi else np.zeros(ho.size, bool)
                out[bi, ho] = np.where(up, U[ho, ch.hi], U[ho, ch.lo])
        return out

    @staticmethod
    def actions(g: np.ndarray, choice: FixedPlanChoice, tau: float) -> np.ndarray:
        """Action per prompt: ``hi`` where the score exceeds τ, else ``lo``."""
        if choice.lo == choice.hi:
            return np.full(g.size, choice.lo, dtype=np.intp)
        return np.where(g > tau, choice.hi, choice.lo).astype(np.intp)

    # ---------------------------------------------------------------------------------- persistence
    def files(self) -> dict[str, bytes]:
        import json

        state = {"params": self.params, "base": self.base_, "top": self.top_, "oof": self.oof_.tolist(),
                 "members": len(self.boosters_)}
        out = {"escalate.json": (json.dumps(state) + "\n").encode()}
        for j, b in enumerate(self.boosters_):
            out[f"escalate_{j}.txt"] = b.model_to_string().encode()
        return out

    @classmethod
    def load(cls, d: Any) -> HeadroomScore:
        import json
        from pathlib import Path

        import lightgbm as lgb

        from isocompute.policy.learn.booster_predict import BoosterPredictor

        d = Path(d)
        state = json.loads((d / "escalate.json").read_text())
        obj = cls(**state["params"])
        obj.base_, obj.top_ = int(state["base"]), int(state["top"])
        obj.oof_ = np.asarray(state["oof"], dtype=np.float64)
        obj.boosters_ = [lgb.Booster(model_str=(d / f"escalate_{j}.txt").read_text()) for j in range(state["members"])]
        obj.predictors_ = [BoosterPredictor(b) for b in obj.boosters_]
        return obj
