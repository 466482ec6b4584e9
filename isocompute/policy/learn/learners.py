"""The two learners behind a policy, both LightGBM on the prompt features.

**OracleClassifier** (the seed's learner) imitates the solver. For a grid of budgets b_1 < … < b_G
spanning the trained range it computes the oracle's actions (deterministic rounding, so each prompt has
one label) and trains one multiclass model on rows ``[x_i, b_g] → a_i(b_g)``: the budget is an input
feature, so one model serves every budget in the range. Each prompt contributes distinct grid
budgets, all of them for small tables and at least 4 for large ones (about ``max_rows`` rows in all).
Decisions are ``argmax_a p(a | x, b)``. Trees split the budget feature only between grid values, so
decisions change only between grid budgets; a calibrated internal budget b' between two of them is
served by letting a hash-chosen share of prompts play the upper one (see the calibration module).

**UtilityRegressor** predicts every action's utility, Û(x, a) ≈ U[i, a], with one LightGBM model on
stacked rows ``[x_i, k_a] → U[i, a]`` (cross-entropy objective: utilities are probabilities in [0, 1]),
which is one model file and one ``predict`` call per batch. Decisions price the predictions like the
oracle prices the truth: ``argmax_a Û(x, a) − λ·c_a`` with per-action costs c_a and a calibrated λ.
For plans the action column k_a becomes a row of plan descriptors
(:func:`isocompute.policy.plans.menu.plan_descriptors`), and an adaptive plan's cost, which differs per
prompt, can come from the learner's cost head (:mod:`isocompute.policy.learn.cost_head`): then
``argmax_a Û(x, a) − λ·Ĉ(x, a)``.

Worked example of the utility rule: Û = (0.50, 0.62, 0.70) for k = (1, 2, 4) at λ = 0.05 scores
(0.45, 0.52, 0.50) → k = 2; at λ = 0.1, (0.40, 0.42, 0.30) → k = 2; at λ = 0.2, (0.30, 0.22, -0.10) → k = 1.

Both follow scikit-learn habits: ``__init__`` stores hyper-parameters, ``fit`` sets ``booster_`` and
friends, ``predict`` is pure. Persistence is LightGBM's own text format (``model.txt``) plus a small
JSON dict, no pickle. Ignores: class weights and cost-sensitive imitation (every oracle label counts the
same, which is what the imitation-accuracy target measures).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from isocompute.policy.learn.booster_head import (  # noqa: F401  (re-exported)
    BoosterHead,
    _booster_from_string,
    _lgb_params,
    stack_rows,
)
from isocompute.policy.learn.booster_predict import BoosterPredictor
from isocompute.policy.learn.calibration import grid_position, mixed_grid_index
from isocompute.solver.allocate import allocate, feasible_range
from isocompute.solver.hull import upper_hulls

PRICE_JITTER = 0.2  # log-width of the per-prompt price spread of the utility learner (±10%)
TIE_SPREAD = 1e-9  # additive price spread: splits exact ties in Û (no tree split on k) around λ = 0



def budget_grid(lo: float, hi: float, n: int) -> np.ndarray:
    """``n`` budgets from lo to hi, geometric when lo > 0 (budgets are ratios of compute), else linear."""
    return np.geomspace(lo, hi, n) if lo > 0 else np.linspace(lo, hi, n)


class OracleClassifier:
    """Budget-conditioned multiclass imitation of the oracle's actions (see the module docstring)."""

    def __init__(self, *, n_rounds: int = 50, num_leaves: int = 15, learning_rate: float = 0.1,
                 min_data_in_leaf: int = 20, n_budget_grid: int = 129, max_rows: int = 12_000,
                 seed: int = 0) -> None:
        self.n_rounds = n_rounds
        self.num_leaves = num_leaves
        self.learning_rate = learning_rate
        self.min_data_in_leaf = min_data_in_leaf
        self.n_budget_grid = n_budget_grid
        self.max_rows = max_rows
        self.seed = seed

    def oracle_labels(self, U: np.ndarray, C: np.ndarray, grid: np.ndarray) -> np.ndarray:
        """(G, N) oracle action per grid budget and prompt (deterministic rounding: cost ≤ budget).

        Budgets are clipped to these prompts' feasible range: with per-prompt (FLOP) costs a fold's
        cheapest mean cost can sit above the table's, and there every prompt takes its cheapest action.
        Plan columns are solved in each prompt's own cost order and mapped back (the identity for k's).
        The hulls do not depend on the budget: built once for the grid (a 56-plan fold: 129 builds were
        5.6 s of a 24 s fit)."""
        from isocompute.solver.plans.estimates import by_cost

        lo, hi = feasible_range(C)
        order = by_cost(U, C)
        hulls = upper_hulls(order.utility, order.cost)
        return np.stack([order.plans_of(allocate(order.utility, order.cost, float(np.clip(b, lo, hi)),
                                                 rounding="deterministic", hulls=hulls).actions) for b in grid])

    def fit(self, X: np.ndarray, U: np.ndarray, C: np.ndarray, budget_range: tuple[float, float]) -> OracleClassifier:
        import lightgbm as lgb

        n, n_actions = U.shape
        grid = budget_grid(budget_range[0], budget_range[1], self.n_budget_grid)
        labels = self.oracle_labels(U, C, grid)
        # Small tables get every grid budget; large ones a random subset per prompt (≥ 4), ~max_rows in all.
        m = int(np.clip(self.max_rows // max(n, 1), 4, grid.size))
        rng = np.random.default_rng(self.seed)
        pick = np.argsort(rng.random((n, grid.size)), axis=1)[:, :m]  # m distinct budgets per prompt
        rows = np.repeat(np.arange(n), m)
        g = pick.ravel()
        Xb = np.column_stack([X[rows], grid[g]])
        y = labels[g, rows]
        # Only the actions some label names are classes: a class without examples would only learn to be
        # never chosen, at one tree per round (a 56-plan menu labels about half its plans; 2x the work).
        # LightGBM's multiclass needs two classes, so a table with one label keeps a second.
        present = np.flatnonzero(np.bincount(y, minlength=n_actions))
        if present.size < 2:
            present = np.union1d(present, [1 if present[0] == 0 else 0])
        self.classes_ = present
        params = _lgb_params({"objective": "multiclass", "num_class": int(present.size)},
                             num_leaves=self.num_leaves, learning_rate=self.learning_rate,
                             min_data_in_leaf=self.min_data_in_leaf, seed=self.seed)
        # The budget column gets more histogram bins so every grid value is a possible split.
        params["max_bin_by_feature"] = [255] * X.shape[1] + [max(255, grid.size + 1)]
        self.booster_ = lgb.train(params, lgb.Dataset(Xb, np.searchsorted(present, y), free_raw_data=True),
                                  num_boost_round=self.n_rounds)
        self.predictor_ = BoosterPredictor(self.booster_)
        self.budget_grid_ = grid
        self.n_actions_ = n_actions
        self.train_rows_ = int(y.size)
        self.train_label_counts_ = np.bincount(y, minlength=n_actions).tolist()
        return self

    def predict_proba(self, X: np.ndarray, budgets: float | np.ndarray) -> np.ndarray:
        """(N, A) predicted probability of each oracle action at budget feature(s) ``budgets``."""
        n, d = X.shape
        Xb = np.empty((n, d + 1))
        Xb[:, :d] = X
        Xb[:, d] = budgets
        out = np.zeros((n, self.n_actions_))
        out[:, self.classes_] = self.predictor_(Xb).reshape(n, self.classes_.size)
        return out

    def predict(self, X: np.ndarray, internal_budget: float, u: np.ndarray) -> np.ndarray:
        """(N,) action index at internal budget b': the most probable oracle action (ties to the cheaper)
        with each prompt's budget feature mixed onto the grid by its uniform ``u`` (see calibration)."""
        j = mixed_grid_index(grid_position(internal_budget, self.budget_grid_), u, self.budget_grid_.size)
        return np.argmax(self.predict_proba(X, self.budget_grid_[j]), axis=1)

    def grid_actions(self, X: np.ndarray) -> np.ndarray:
        """(G, N) action index of every prompt at every grid budget (one batched predict)."""
        n, G = X.shape[0], self.budget_grid_.size
        if n == 0:
            return np.zeros((G, 0), dtype=np.intp)
        Xb = np.column_stack([np.tile(X, (G, 1)), np.repeat(self.budget_grid_, n)])
        return self.classes_[np.argmax(self.predictor_(Xb).reshape(G * n, self.classes_.size), axis=1)].reshape(G, n)

    def state(self) -> dict[str, Any]:
        return {"params": {k: getattr(self, k) for k in ("n_rounds", "num_leaves", "learning_rate",
                                                          "min_data_in_leaf", "n_budget_grid",
                                                          "max_rows", "seed")},
                "budget_grid": self.budget_grid_.tolist(), "n_actions": self.n_actions_,
                "classes": self.classes_.tolist(),
                "train_rows": self.train_rows_, "train_label_counts": self.train_label_counts_}

    @classmethod
    def from_state(cls, state: dict[str, Any], model_text: str) -> OracleClassifier:
        obj = cls(**state["params"])
        obj.booster_ = _booster_from_string(model_text)
        obj.predictor_ = BoosterPredictor(obj.booster_)  # checks the fast path against Booster.predict
        obj.budget_grid_ = np.asarray(state["budget_grid"], dtype=np.float64)
        obj.n_actions_ = int(state["n_actions"])
        # artifacts written before classes were compacted have one class per action
        obj.classes_ = np.asarray(state.get("classes", range(obj.n_actions_)), dtype=np.intp)
        obj.train_rows_ = int(state["train_rows"])
        obj.train_label_counts_ = list(state["train_label_counts"])
        return obj


class UtilityRegressor(BoosterHead):
    """Per-action utility regression, priced at serve time (see the module docstring)."""

    def fit(self, X: np.ndarray, U: np.ndarray, ks: np.ndarray, cost_head: Any = None) -> UtilityRegressor:
        """``ks``: (A,) the actions' k, or (A, d) plan descriptors; ``cost_head``: a fitted
        :class:`~isocompute.policy.learn.cost_head.SampleCostRegressor` (plans), kept for :meth:`predict_costs`."""
        n_actions = U.shape[1]
        ks = np.asarray(ks, dtype=np.float64)
        self._train(stack_rows(X, ks.reshape(n_actions, -1)), np.clip(U.reshape(-1), 0.0, 1.0))
        self.ks_ = ks
        self.n_actions_ = n_actions
        self.cost_head_ = cost_head
        return self

    def predict_utilities(self, X: np.ndarray) -> np.ndarray:
        """(N, A) predicted utility Û(x, a) of every action."""
        n, A = X.shape[0], self.n_actions_
        return self.predictor_(stack_rows(X, self.ks_.reshape(A, -1))).reshape(n, A)

    def predict_costs(self, X: np.ndarray, action_costs: np.ndarray) -> np.ndarray:
        """(N, A) the cost each prompt is priced at: the cost head's Ĉ(x, a), or ``action_costs`` (A,)
        for every prompt when the learner has no cost head."""
        if self.cost_head_ is None:
            return np.broadcast_to(np.asarray(action_costs, dtype=np.float64), (X.shape[0], self.n_actions_))
        return self.cost_head_.predict_costs(X)

    def predict(self, X: np.ndarray, lam: float, action_costs: np.ndarray, u: np.ndarray) -> np.ndarray:
        """(N,) ``argmax_a Û(x, a) − λ_i·c_a`` with each prompt's jittered price λ_i (see :func:`price`);
        c_a is the cost head's Ĉ(x, a) when the learner has one, else ``action_costs``."""
        costs = action_costs if self.cost_head_ is None else self.cost_head_.predict_costs(X)
        return price(self.predict_utilities(X), lam, costs, u)

    def state(self) -> dict[str, Any]:
        return {"params": self.hyper_params(), "ks": self.ks_.tolist(), "n_actions": self.n_actions_,
                "cost_head": None if self.cost_head_ is None else self.cost_head_.state()}

    @classmethod
    def from_state(cls, state: dict[str, Any], model_text: str, cost_text: str | None = None) -> UtilityRegressor:
        """Inverse of :meth:`state`; ``cost_text``: the cost head's LightGBM text, when it has a model."""
        from isocompute.policy.learn.cost_head import SampleCostRegressor

        obj = cls(**state["params"])
        obj.booster_ = _booster_from_string(model_text)
        obj.predictor_ = BoosterPredictor(obj.booster_)  # checks the fast path against Booster.predict
        obj.ks_ = np.asarray(state["ks"], dtype=np.float64)
        obj.n_actions_ = int(state["n_actions"])
        head = state.get("cost_head")  # absent before plans
        obj.cost_head_ = None if head is None else SampleCostRegressor.from_state(head, cost_text)
        return obj


def price(U_hat: np.ndarray, lam: float, action_costs: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Lagrangian rule on predicted utilities: ``argmax_a U_hat[i, a] − λ_i·c_a`` with the per-prompt
    price ``λ_i = λ·exp(PRICE_JITTER·(u_i − ½)) + TIE_SPREAD·(u_i − ½)``.

    Why the jitter: prompts with identical features have identical predictions and would all switch
    action at the same λ, so the mean cost would be a staircase whose steps are too tall to meet a
    budget within 2%. Spreading the price ±10% by a hash of the prompt splits such groups in proportion;
    it only moves prompts whose two best actions are within ~0.1·λ·Δc in priced utility. The mean cost
    stays non-increasing in λ (every λ_i is increasing in λ). The tiny additive spread does the same for
    prompts whose predictions are exactly equal across actions (the trees never split on k there):
    without it they would all flip from the cheapest to the dearest action at λ = 0. np.argmax keeps
    the first maximum, i.e. the cheaper action on remaining ties, since actions are sorted by cost.
    ``action_costs``: (A,) one cost per action, or (N, A) per prompt (plans priced by a cost head).
    """
    u = np.asarray(u)
    lam_i = lam * np.exp(PRICE_JITTER * (u - 0.5)) + TIE_SPREAD * (u - 0.5)
    costs = np.asarray(action_costs)
    return np.argmax(U_hat - lam_i[:, None] * (costs[None, :] if costs.ndim == 1 else costs), axis=1)


MIX_SEED, ROUTE_SEED = 7, 11


GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0  # the additive recurrence (Weyl sequence) that spreads repeats of a text


def prompt_uniforms(prompts: Sequence[str], seed: int = MIX_SEED) -> np.ndarray:
    """A uniform in [0, 1) per prompt from a hash of its text (murmurhash3): the policy's only
    randomness, so decisions stay pure and a repeated request gets the same decision. ``MIX_SEED`` drives
    the budget mixing / price jitter, ``ROUTE_SEED`` (independent of it) which member serves the prompt.

    A text that repeats *within one call* takes, at its j-th repeat, ``frac(h + j·φ)`` with ``h`` its own
    uniform and φ = (√5 − 1)/2 (a Weyl sequence: the repeats of one text cover [0, 1) evenly, so the
    share of them below any q is within about 1/n of q). Without it every copy drew the same u, and a mix
    of two plans — "the dearer one for a share q of the prompts" — gave all copies the same plan: a table
    whose prompts carry no text (dumps that ship only answers), or a batch of one repeated prompt, spent
    the dearer plan's cost instead of the budget. Distinct texts, and a text's first occurrence, hash as
    they always did.

    >>> u = prompt_uniforms(["", "", "x"]); bool(u[0] != u[1]), bool(u[2] == prompt_uniforms(["x"])[0])
    (True, True)
    """
    from sklearn.utils import murmurhash3_32

    seen: dict[str, int] = {}
    out = np.empty(len(prompts), dtype=np.float64)
    for i, p in enumerate(prompts):
        j = seen.get(p, 0)
        seen[p] = j + 1
        u = murmurhash3_32(p.encode("utf-8"), seed=seed, positive=True) / 2.0**32
        out[i] = u if j == 0 else (u + j * GOLDEN) % 1.0
    return out
