"""Baselines over several models at a matched FLOP budget: each model's uniform maj@k, the best single
model with its best fixed plan, and the best fixed cascade — the methods a multi-model report compares.

All take an :class:`~isocompute.solver.models.estimates.ActionEstimates` menu (U and C in FLOPs per
prompt and action) and a mean-FLOPs budget B, and return a :class:`HeldOut`: per prompt, the expected
utility and cost of the method, scored on prompts its choice never saw.

* **uniform maj@k of model m** (:func:`uniform_at_budget`): ``m/none@k`` for every prompt, the two k
  whose mean FLOPs bracket B mixed so the mean is B (:func:`isocompute.policy.fallback.uniform_mix`);
  no choice is learned, so nothing is held out. Outside [k_min, k_max]'s costs: None.
* **a fixed action set** (:func:`best_fixed`): one action — or a budget-matched mix of two — for every
  prompt, chosen on k − 1 folds and scored on the k-th (:func:`isocompute.policy.plans.fixed.cross_validate_fixed_plan`).
  Vote weights are part of the action, so choosing on the training folds *is* fitting them there.
  ``None`` where B is below the cheapest column's mean cost on some training split.
* **best single model** (:func:`best_single_model`): :func:`best_fixed` over each model's own plans,
  and of those the model with the highest held-out accuracy — picked in hindsight, the choice most
  favourable to the baseline.
* **best fixed cascade** (:func:`best_fixed` on ``est.columns(kind=("cascade", "ensemble"))`` or only
  cascades): one cascade for everyone.

Worked example: models A (1 FLOP a sample) and B (10); at B = 3 uniform maj@k of A mixes k = 2 and 4
half and half; B's single sample costs 10, so B has no uniform point at 3 (None).

Ignores: per-prompt features (the learned policy's job) and Monte Carlo noise in U (the estimates are
taken as they are).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from isocompute.errors import BudgetError
from isocompute.policy.fallback import uniform_mix
from isocompute.policy.multi.menu import uniform_columns  # noqa: F401  (re-exported)
from isocompute.policy.plans.fixed import FixedPlanChoice, choose_fixed_plan, fold_assignment
from isocompute.solver.models.estimates import ActionEstimates


@dataclass(frozen=True, eq=False)
class HeldOut:
    """A method's per-prompt expected ``utility`` and ``cost`` (FLOPs), and what it chose (per fold)."""

    method: str
    utility: np.ndarray
    cost: np.ndarray
    choices: tuple[str, ...]

    @property
    def accuracy(self) -> float:
        return float(self.utility.mean())

    @property
    def mean_cost(self) -> float:
        return float(self.cost.mean())


def uniform_at_budget(est: ActionEstimates, model: str, budget: float) -> HeldOut | None:
    """The model's uniform maj@k at a mean-FLOPs budget (module docstring); None outside its range."""
    ks, cols = uniform_columns(est, model)
    if cols.size == 0:
        return None
    mean = est.cost[:, cols].mean(axis=0)
    rel = 1e-9 * mean[-1]
    if budget < mean[0] - rel or budget > mean[-1] + rel:
        return None
    if cols.size == 1:
        return HeldOut(f"uniform {model}", est.utility[:, cols[0]], est.cost[:, cols[0]], (est.names[cols[0]],))
    j, k, q = uniform_mix(mean, budget)
    u = (1 - q) * est.utility[:, cols[j]] + q * est.utility[:, cols[k]]
    c = (1 - q) * est.cost[:, cols[j]] + q * est.cost[:, cols[k]]
    return HeldOut(f"uniform {model}", u, c, (f"{1 - q:.3f}·maj@{ks[j]} + {q:.3f}·maj@{ks[k]}",))


def best_fixed(est: ActionEstimates, cols: Sequence[int] | np.ndarray, budget: float, *, folds: int = 5,
               seed: int = 0, method: str = "best fixed") -> HeldOut | None:
    """One action (or a mix of two) for every prompt among ``cols``, chosen on the training folds and
    scored held out — :func:`~isocompute.policy.plans.fixed.cross_validate_fixed_plan`'s procedure and
    folds, with each training split's columns first cut to the Pareto set of their mean (cost, utility)
    (only those can be on the hull it picks from; a menu has thousands). None where the budget is below
    the cheapest column on some training split."""
    cols = np.asarray(cols, dtype=np.int64)
    U, C = est.utility[:, cols], est.cost[:, cols]
    fold = fold_assignment(U.shape[0], folds, seed)
    utility, cost = np.zeros(U.shape[0]), np.zeros(U.shape[0])
    every = est.names
    choices = []
    for f in range(folds):
        test = fold == f
        keep = _pareto_means(U[~test].mean(axis=0), C[~test].mean(axis=0))
        try:
            ch = choose_fixed_plan(U[~test][:, keep], C[~test][:, keep], budget)
        except BudgetError:
            return None
        ch = FixedPlanChoice(lo=int(keep[ch.lo]), hi=int(keep[ch.hi]), mix=ch.mix, budget=ch.budget,
                             train_cost=ch.train_cost, train_utility=ch.train_utility)
        utility[test], cost[test] = ch.utility(U[test]), ch.cost(C[test])
        choices.append(ch.describe([every[j] for j in cols]))
    return HeldOut(method, utility, cost, tuple(choices))


def _pareto_means(u: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Indices of the columns whose mean utility beats every cheaper column's (cost ascending, stable)."""
    order = np.argsort(c, kind="stable")
    best_before = np.maximum.accumulate(np.concatenate([[-np.inf], u[order][:-1]]))
    return np.sort(order[u[order] > best_before])


def best_single_model(est: ActionEstimates, budget: float, *, folds: int = 5,
                      seed: int = 0) -> tuple[HeldOut | None, dict[str, HeldOut | None]]:
    """(the best model's held-out result, every model's) for its best fixed plan at ``budget``."""
    per = {m: best_fixed(est, est.columns(model=m), budget, folds=folds, seed=seed, method=f"fixed plan {m}")
           for m in est.models}
    scored = [h for h in per.values() if h is not None]
    return (max(scored, key=lambda h: h.accuracy) if scored else None), per
