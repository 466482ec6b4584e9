"""How a fitted policy's cross-fitted members decide: the actions at a knob, and the knob a batch needs.

Every learner of a :class:`~isocompute.policy.policy.Policy` has k members (member j never saw
calibration fold j, :mod:`isocompute.policy.learn.crossfit`); a prompt is served by the member its text hashes
to (``route``). :func:`member_actions` maps a budget to the learner's knob — from the calibration table,
or solved on the batch itself (:func:`batch_knob`) — and asks each member for its prompts' actions: the
classifier's most probable oracle plan at the internal budget, or the utility learner's
``argmax_a Û − λ·Ĉ`` (Ĉ from its cost head for plans, the plans' mean costs otherwise).

Worked example (batch knob): 1,024 prompts at budget 4 with actions 1…16 — bisection on λ over this
batch's own predictions spends within one prompt's step, 8/1024 = 0.2%, of 4.

Ignores: features (the caller passes X) and the never-worse chain (:mod:`isocompute.policy.fallback`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from isocompute.errors import InputError
from isocompute.policy.learn.calibration import calibrate_by_bisection, calibrate_mixed_grid
from isocompute.policy.learn.crossfit import max_useful_price
from isocompute.policy.learn.learners import OracleClassifier, price


def member_actions(policy: Any, X: np.ndarray, u: np.ndarray, route: np.ndarray, budget: float, learner: str, *,
                   match: str = "calibrated") -> tuple[np.ndarray, float]:
    """(action index per prompt, knob): member j decides the prompts routed to it. During fitting member
    j scored exactly the calibration fold it did not see, so a new prompt meets the process the
    calibration measured. ``match="batch"``: the knob is solved on this batch (:func:`batch_knob`)."""
    f = policy.learners_[learner]
    if match == "batch":
        knob = batch_knob(policy, X, u, route, budget, learner)
    elif match == "calibrated":
        knob = f.calibration(budget)
    else:
        raise InputError(f"match must be 'calibrated' or 'batch'; you passed {match!r}.")
    a = np.zeros(X.shape[0], dtype=np.intp)
    for j, model in enumerate(f.models):
        sel = np.flatnonzero(route == j)
        if sel.size == 0:
            continue
        if isinstance(model, OracleClassifier):
            a[sel] = model.predict(X[sel], knob, u[sel])
        else:
            a[sel] = model.predict(X[sel], knob, policy.action_costs_, u[sel])
    return a, knob


def batch_knob(policy: Any, X: np.ndarray, u: np.ndarray, route: np.ndarray, budget: float, learner: str) -> float:
    """The knob at which *this batch's* mean expected cost is nearest ``budget``.

    The same search the calibration runs on out-of-fold decisions (bisection on λ for the utility
    learner, the mixed-grid step search for the classifier), run on the batch's own decisions; the batch
    then spends the budget up to one prompt's step, ``max_a Δc_a / N``, instead of up to the sampling
    noise of which prompts happen to arrive. Decisions then depend on the whole batch. A decision's
    expected cost here is Ĉ (the cost head) or the plan's mean training cost.
    """
    f = policy.learners_[learner]
    n = X.shape[0]
    b = np.array([float(budget)])
    if n == 0:
        return f.calibration(budget)
    P = len(policy.plans)
    if f.calibration.knob == "lam":
        Uh, Ch = np.empty((n, P)), np.empty((n, P))
        for j, model in enumerate(f.models):
            sel = np.flatnonzero(route == j)
            if sel.size:
                Uh[sel] = model.predict_utilities(X[sel])
                Ch[sel] = model.predict_costs(X[sel], policy.action_costs_)
        rows = np.arange(n)

        def cost_at(lam: float) -> float:
            return float(Ch[rows, price(Uh, lam, Ch, u)].mean())

        cal = calibrate_by_bisection(b, b, cost_at, max_useful_price(Uh, Ch), n_validation=n)
    else:
        grid = f.models[0].budget_grid_
        grid_act = np.empty((grid.size, n), dtype=np.intp)
        for j, model in enumerate(f.models):
            sel = np.flatnonzero(route == j)
            if sel.size:
                grid_act[:, sel] = model.grid_actions(X[sel])
        cal = calibrate_mixed_grid(b, b, grid, policy.action_costs_[grid_act], u, n_validation=n)
    return float(cal.values[0])
