"""Held-out budget search for the fixed plan: the knob that makes its *held-out* mean cost the budget.

The fixed plan at budget B is the mix of two hull vertices of the plans' training means (c̄_j, ū_j) whose
training mean cost is B (:mod:`isocompute.policy.plans.fixed`). Where costs are tokens on a few hard
prompts, that mix overspends on prompts it was not chosen on, at every budget (+8% to +15% at 2x–4x on
30-prompt hard subsets of MATH-500, ``bench/bench_budget_bias.py``), for two reasons:

* **winner's curse** — among the plans, the hull prefers those whose training cost came out low by
  chance (a plan that looks cheap looks efficient), so the chosen plans' held-out cost is higher;
* **ratio bias** — with p = (B − c̄_lo)/(c̄_hi − c̄_lo), the realised cost B·c_ho/c̄ is a ratio of noisy
  means, and E[1/c̄] > 1/E[c̄] (heavy-tailed lengths make c̄ noisy).

Neither shows on the training prompts, so the same data cannot both choose the plans and certify their
cost. :func:`heldout_budgets` searches instead for the *internal* budget g(B) at which the choice made on
k − 1 inner folds spends B on the k-th, averaged over the folds,

    h(g) = (1/N) Σ_f Σ_{i ∈ fold f} c_i(choice on the other folds at g),     g(B) = h⁻¹(B),

over a geometric grid of g, h made non-decreasing; the served choice is the hull's at g(B) on all the
prompts. It is the fixed plan's analogue of the learned rule's calibration on out-of-fold decisions
(:mod:`isocompute.policy.learn.calibration`). A budget above what the hull ever spends held out maps to
the top of the grid (the budget does not bind).

Worked example: on prompts where every plan's training mean understates its held-out mean by 10%,
h(g) = 1.1·g, so a budget of 4x is served at g = 3.64x and spends 4x held out.

Ignores: the utility side of the choice (it is selected on training means as before), and latency.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from isocompute.policy.plans.fixed import fold_assignment

INNER_FOLDS = 5
REPEATS = 4  # inner fold splits averaged: the search's own noise, not only its bias, moves what is spent
GRID = 193  # internal budgets searched, geometric between the cheapest and the dearest plan's mean


def hull_mix(u_bar: np.ndarray, c_bar: np.ndarray, budgets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lo, hi, p) per budget, vectorised: the mix of two adjacent vertices of the upper concave hull of
    (c̄_j, ū_j) whose mean cost is the budget (clipped to the hull's ends) — what
    :func:`~isocompute.policy.plans.fixed.choose_fixed_plans` chooses, without its per-budget solve."""
    order = np.lexsort((-u_bar, c_bar))
    hull: list[int] = []
    for j in order:
        if hull and c_bar[j] == c_bar[hull[-1]]:
            continue  # same cost, lower utility (sorted): never on the hull
        if hull and u_bar[j] <= u_bar[hull[-1]]:
            continue  # dearer and no better: never on the increasing part
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # b lies on or below the chord a → j: drop it
            if (u_bar[b] - u_bar[a]) * (c_bar[j] - c_bar[a]) <= (u_bar[j] - u_bar[a]) * (c_bar[b] - c_bar[a]):
                hull.pop()
            else:
                break
        hull.append(int(j))
    v = np.asarray(hull, dtype=np.intp)
    hc = c_bar[v]
    g = np.clip(np.asarray(budgets, dtype=np.float64), hc[0], hc[-1])
    k = np.clip(np.searchsorted(hc, g, side="right") - 1, 0, v.size - 1)
    k1 = np.minimum(k + 1, v.size - 1)
    span = hc[k1] - hc[k]
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.where(span > 0, (g - hc[k]) / np.where(span > 0, span, 1.0), 0.0)
    return v[k], v[k1], np.clip(p, 0.0, 1.0)


def heldout_budgets(U: np.ndarray, C: np.ndarray, budgets: Sequence[float], *, folds: int = INNER_FOLDS,
                    seed: int = 0, repeats: int = REPEATS, unit: np.ndarray | None = None) -> np.ndarray:
    """Internal budget per requested budget (module docstring): the fixed plan chosen at it on k − 1
    inner folds spends the budget on the k-th, on average over ``repeats`` splits. ``unit`` (N,): each
    prompt's cost of one sample (the cheapest ladder plan): an inner fold then chooses at the budget times
    its own mean unit over the whole's, as a budget written in ``x`` is served by a policy in its own 1x
    (the common length scale is then not corrected twice). Few prompts (< 2·folds): the budgets unchanged."""
    U, C = np.asarray(U, dtype=np.float64), np.asarray(C, dtype=np.float64)
    budgets = np.asarray(budgets, dtype=np.float64)
    n = U.shape[0]
    if n < 2 * folds:
        return budgets.copy()
    c_all = C.mean(axis=0)
    grid = np.geomspace(max(float(c_all.min()), 1e-12), max(float(c_all.max()), 1e-12) * 1.000001, GRID)
    spent = np.zeros(GRID)
    for r in range(repeats):
        fold = fold_assignment(n, folds, seed + 7919 * r)
        for f in range(folds):
            te = fold == f
            scale = 1.0 if unit is None else float(unit[~te].mean() / unit.mean())
            lo, hi, p = hull_mix(U[~te].mean(axis=0), C[~te].mean(axis=0), grid * scale)
            Ct = C[te]
            spent += ((1 - p) * Ct[:, lo] + p * Ct[:, hi]).sum(axis=0)
    h = np.maximum.accumulate(spent / (n * repeats))
    out = np.interp(budgets, h, grid)  # below h[0]: the cheapest; above h[-1]: the top (does not bind)
    return np.where(budgets >= h[-1], grid[-1], out)


def budget_table(U: np.ndarray, C: np.ndarray, requested: np.ndarray, *, seed: int = 0,
                 unit: np.ndarray | None = None) -> dict[str, list[float]]:
    """JSON-able ``{"requested", "internal"}``: :func:`heldout_budgets` at each of ``requested`` (a policy's
    calibration budgets), what a fitted policy stores and serves the fixed plan through."""
    requested = np.asarray(requested, dtype=np.float64)
    internal = heldout_budgets(U, C, requested, seed=seed, unit=unit)
    return {"requested": requested.tolist(), "internal": internal.tolist()}


def internal_budget(table: dict[str, list[float]] | None, budget: float) -> float:
    """The internal budget for ``budget`` from a :func:`budget_table`, interpolated in log scale; ``table``
    None: the budget itself (a policy fitted with ``fixed_budget="train"``, or before the search)."""
    if table is None:
        return float(budget)
    r = np.asarray(table["requested"], dtype=np.float64)
    i = np.asarray(table["internal"], dtype=np.float64)
    if r[0] > 0 and budget > 0 and (i > 0).all():
        return float(np.exp(np.interp(np.log(budget), np.log(r), np.log(i))))
    return float(np.interp(budget, r, i))
