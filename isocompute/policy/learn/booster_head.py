"""LightGBM shared by the learners: the hyper-parameters every booster trains with, rows stacked per
(prompt, action), and :class:`BoosterHead`, the cross-entropy model the utility learner and the cost
head (:mod:`isocompute.policy.learn.cost_head`) are built on.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from isocompute.policy.learn.booster_predict import BoosterPredictor


def _lgb_params(objective: dict[str, Any], *, num_leaves: int, learning_rate: float, min_data_in_leaf: int,
                seed: int) -> dict[str, Any]:
    return {
        **objective,
        "num_leaves": num_leaves,
        "learning_rate": learning_rate,
        "min_data_in_leaf": min_data_in_leaf,
        "lambda_l2": 1.0,
        "feature_fraction": 0.9,
        "seed": seed,
        "deterministic": True,
        "force_col_wise": True,
        "verbose": -1,
        # One thread: OpenMP workers spin-wait, and on a busy machine two threads train 10x slower than one.
        "num_threads": 1,
    }


def _booster_from_string(text: str) -> Any:
    import lightgbm as lgb

    return lgb.Booster(model_str=text)


def stack_rows(X: np.ndarray, desc: np.ndarray) -> np.ndarray:
    """(N·A, d + e) rows ``[x_i, desc_a]`` for every prompt i of ``X`` (N, d) and action a of ``desc``
    (A, e), i-major: what the cross-entropy learners train and predict on."""
    (n, d), (A, e) = X.shape, desc.shape
    Xs = np.empty((n, A, d + e))
    Xs[:, :, :d] = X[:, None, :]
    Xs[:, :, d:] = desc[None, :, :]
    return Xs.reshape(n * A, d + e)


class BoosterHead:
    """What the cross-entropy learners (:class:`UtilityRegressor`, the cost head) share: ``__init__``
    stores the LightGBM hyper-parameters (their state's ``params``), and one model trains on stacked rows."""

    PARAMS = ("n_rounds", "num_leaves", "learning_rate", "min_data_in_leaf", "seed")

    def __init__(self, *, n_rounds: int = 50, num_leaves: int = 15, learning_rate: float = 0.1,
                 min_data_in_leaf: int = 20, seed: int = 0) -> None:
        self.n_rounds = n_rounds
        self.num_leaves = num_leaves
        self.learning_rate = learning_rate
        self.min_data_in_leaf = min_data_in_leaf
        self.seed = seed

    def hyper_params(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.PARAMS}

    def _train(self, Xs: np.ndarray, y: np.ndarray) -> None:
        """Set ``booster_`` / ``predictor_``: a cross-entropy model of ``y`` ∈ [0, 1] on rows ``Xs``."""
        import lightgbm as lgb

        params = _lgb_params({"objective": "cross_entropy"}, num_leaves=self.num_leaves,
                             learning_rate=self.learning_rate, min_data_in_leaf=self.min_data_in_leaf,
                             seed=self.seed)
        self.booster_ = lgb.train(params, lgb.Dataset(Xs, y, free_raw_data=True), num_boost_round=self.n_rounds)
        self.predictor_ = BoosterPredictor(self.booster_)
