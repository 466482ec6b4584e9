"""The never-worse chain's middle rule: one fixed plan (or a mix of two) for every prompt, budget-matched.

Between the learned rule and uniform (:mod:`isocompute.policy.fallback`) sits the rule a user would pick
instead of a learned policy: ESC, Adaptive-Consistency and Best-of-∞ each play one stopping rule for
everyone. At budget B it is the best budget-matched mix of two plans of the policy's menu on the
training prompts (:func:`isocompute.policy.plans.fixed.choose_fixed_plan`: the upper concave hull of
the plans' (mean cost, mean utility) points at B) — plan ``lo`` with probability 1 − q, plan ``hi``
with q, so a prompt from the training distribution spends exactly B in expectation.

* :func:`fixed_plan_scores` — what the chain tests: each training prompt scored by the choice made on
  the other cross-fitting folds (the same folds the learned rule's out-of-fold decisions come from);
  with ``heldout`` each fold's choice is made at its held-out-searched internal budget
  (:mod:`isocompute.policy.plans.heldout`), as serving makes it, so the rule is tested as it spends.
* :func:`fixed_plan_at` / :func:`fixed_actions` — what serves: the choice on every training prompt's
  means, each prompt taking ``hi`` iff its hash uniform u < q (or the round(q·N) smallest u of a batch),
  exactly as uniform mixes its two k.

Worked example: menu means (c̄, ū) = none@1 (1, 0.50), lead:m=2@1x8 (3, 0.62), none@4 (4, 0.60);
at B = 2 the hull runs none@1 → lead:m=2@1x8, q = ½: a prompt with u = 0.3 plays lead:m=2@1x8, one with
u = 0.7 plays none@1, and the mean over prompts is 2 samples.

Budgets below the cheapest plan's mean are clipped to it (the chain then spends that much, as uniform
does at its cheapest k). Costs here exclude what the learned rule pays per request (probe, extra
features): the fixed rule reads no features and pays none. Ignores: per-prompt features.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from isocompute.policy.fallback import mix_actions
from isocompute.policy.plans.fixed import FixedPlanChoice, choose_fixed_plan
from isocompute.policy.plans.heldout import heldout_budgets, hull_mix


def _clip(budget: float, c_bar: np.ndarray) -> float:
    return max(float(budget), float(c_bar.min()))


def fixed_plan_scores(U: np.ndarray, C: np.ndarray, folds: Sequence[tuple[np.ndarray, np.ndarray]],
                      budgets: Sequence[float], *, heldout: bool = False, seed: int = 0,
                      cost: bool = False, unit: np.ndarray | None = None) -> np.ndarray:
    """(B, N) out-of-fold expected utility of every prompt under the fixed plan chosen at each budget on
    the folds that do not hold it; ``C`` without per-request payments. ``heldout``: each fold chooses at
    its held-out-searched internal budget (``unit``: each prompt's cost of one sample, for the search);
    ``cost``: the (B, N) out-of-fold cost instead of the utility."""
    util, spent = fixed_plan_oof(U, C, folds, budgets, heldout=heldout, seed=seed, unit=unit)
    return spent if cost else util


def fixed_plan_oof(U: np.ndarray, C: np.ndarray, folds: Sequence[tuple[np.ndarray, np.ndarray]],
                   budgets: Sequence[float], *, heldout: bool = False, seed: int = 0,
                   unit: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(utility, cost), each (B, N): :func:`fixed_plan_scores` both at once (one search per fold)."""
    budgets = np.asarray(budgets, dtype=np.float64)
    util, spent = np.empty((budgets.size, U.shape[0])), np.empty((budgets.size, U.shape[0]))
    for tr, ho in folds:
        g = heldout_budgets(U[tr], C[tr], budgets, seed=seed, unit=None if unit is None else unit[tr]) if heldout else budgets
        lo, hi, p = hull_mix(U[tr].mean(axis=0), C[tr].mean(axis=0), g)
        util[:, ho] = ((1 - p) * U[ho][:, lo] + p * U[ho][:, hi]).T
        spent[:, ho] = ((1 - p) * C[ho][:, lo] + p * C[ho][:, hi]).T
    return util, spent


def fixed_plan_at(plan_utility: np.ndarray, plan_costs: np.ndarray, budget: float) -> FixedPlanChoice:
    """The serving choice at ``budget`` from the plans' mean training utility and cost."""
    c_bar = np.asarray(plan_costs, dtype=np.float64)
    return choose_fixed_plan(np.asarray(plan_utility, dtype=np.float64)[None], c_bar[None], _clip(budget, c_bar))


def fixed_actions(u: np.ndarray, choice: FixedPlanChoice, *, match: str = "calibrated") -> np.ndarray:
    """Plan index per prompt under ``choice``, mixed by each prompt's hash uniform (module docstring)."""
    return mix_actions(u, choice.lo, choice.hi, choice.mix, match=match)
