"""The best fixed plan: one stopping rule for every prompt, budget-matched, chosen on training folds.

This is the baseline a user would pick instead of a learned policy (ESC, Adaptive-Consistency and
Best-of-∞ all set one rule for everyone): no features, no per-prompt choice. Given a menu of plans with
per-prompt expected utility U[i, j] and cost C[i, j] (:func:`isocompute.solver.plans.estimates.estimate_plans`),
each plan is one point (c̄_j, ū_j) of mean cost and mean utility over the training prompts. The best
policy that plays the same plan everywhere, allowed to randomise between two plans, is the upper
concave hull of those points at the budget B:

    play plan lo with probability 1 − p and plan hi with probability p,
    p = (B − c̄_lo) / (c̄_hi − c̄_lo),   c̄_lo ≤ B ≤ c̄_hi adjacent hull vertices,

so the expected mean cost on the training prompts is exactly B (less where a cheaper plan is better, or
B is above every plan's cost: the budget does not bind) — a one-"prompt" instance of the
Lagrangian solver (:func:`isocompute.solver.allocate.allocate` on the row of means). Held out
(:func:`cross_validate_fixed_plan`): the prompts are split into k folds; the choice made on k − 1 folds
scores each prompt of the remaining fold with (1 − p)·U[i, lo] + p·U[i, hi] and costs it likewise, so
every prompt is scored once by a choice that never saw it, and the realised held-out cost carries the
fold's sampling noise (it is B only on average).

Worked example: plans with training means (c̄, ū) = (1, 0.50), (2, 0.60), (4, 0.66), (3, 0.55);
at B = 3 the hull runs (2, 0.60) → (4, 0.66), so p = ½ of each: ū = 0.63 (plan (3, 0.55) lies below).

Ignored: per-prompt features (that is the learned policy's job) and the cost unit (whatever C holds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from isocompute.errors import BudgetError, InputError
from isocompute.solver.allocate import allocate
from isocompute.solver.hull import upper_hulls


@dataclass(frozen=True)
class FixedPlanChoice:
    """Plan ``lo`` with probability 1 − ``mix``, plan ``hi`` with ``mix`` (indices into the menu), and
    the mean cost and utility this gives on the prompts it was chosen on."""

    lo: int
    hi: int
    mix: float
    budget: float
    train_cost: float
    train_utility: float

    def utility(self, U: np.ndarray) -> np.ndarray:
        """(N,) expected utility of each prompt under this choice."""
        return (1.0 - self.mix) * U[:, self.lo] + self.mix * U[:, self.hi]

    def cost(self, C: np.ndarray) -> np.ndarray:
        return (1.0 - self.mix) * C[:, self.lo] + self.mix * C[:, self.hi]

    def describe(self, names: Sequence[str]) -> str:
        if self.mix == 0.0 or self.lo == self.hi:
            return names[self.lo]
        return f"{1 - self.mix:.3f}·{names[self.lo]} + {self.mix:.3f}·{names[self.hi]}"


def choose_fixed_plan(U: np.ndarray, C: np.ndarray, budget: float) -> FixedPlanChoice:
    """The best budget-matched mix of two plans on these prompts (see the module docstring)."""
    return choose_fixed_plans(U, C, [budget])[0]


def choose_fixed_plans(U: np.ndarray, C: np.ndarray, budgets: Sequence[float]) -> list[FixedPlanChoice]:
    """:func:`choose_fixed_plan` at each of ``budgets``, on one hull of the plans' means."""
    U, C = _check(U, C)
    u_bar, c_bar = U.mean(axis=0), C.mean(axis=0)
    order = np.argsort(c_bar, kind="stable")
    row_u, row_c = u_bar[order][None], c_bar[order][None]
    hulls = upper_hulls(row_u, row_c)
    out = []
    for budget in budgets:
        if not budget >= c_bar.min():
            raise BudgetError(f"budget {budget:.6g} is below the cheapest plan's mean cost {c_bar.min():.6g} on "
                              "these prompts; add cheaper plans (e.g. none@1) or raise the budget.")
        # above the dearest plan the budget does not bind: the best plan that fits spends less
        res = allocate(row_u, row_c, min(float(budget), float(c_bar.max())), hulls=hulls)
        lo, hi = int(order[res.actions[0]]), int(order[res.actions_hi[0]])
        mix = res.mix_prob if lo != hi else 0.0
        out.append(FixedPlanChoice(lo=lo, hi=hi, mix=float(mix), budget=float(budget),
                                   train_cost=float(res.mean_cost), train_utility=float(res.mean_utility)))
    return out


@dataclass(frozen=True, eq=False)
class FixedPlanCV:
    """Held-out result of :func:`cross_validate_fixed_plan`: per prompt, the expected ``utility`` and
    ``cost`` under the choice made without it (``fold[i]`` says which), and each fold's choice."""

    budget: float
    folds: int
    seed: int
    fold: np.ndarray
    choices: tuple[FixedPlanChoice, ...]
    utility: np.ndarray
    cost: np.ndarray

    @property
    def accuracy(self) -> float:
        return float(self.utility.mean())

    @property
    def mean_cost(self) -> float:
        return float(self.cost.mean())


def fold_assignment(n: int, folds: int, seed: int) -> np.ndarray:
    """(n,) fold index of each prompt: a seeded permutation cut into ``folds`` near-equal parts."""
    if not isinstance(folds, int) or folds < 2 or folds > n:
        raise InputError(f"folds must be an integer in [2, {n}] (the number of prompts), got {folds!r}.")
    out = np.empty(n, dtype=np.int64)
    for f, part in enumerate(np.array_split(np.random.default_rng(seed).permutation(n), folds)):
        out[part] = f
    return out


def cross_validate_fixed_plan(U: np.ndarray, C: np.ndarray, budget: float, *, folds: int = 5,
                              seed: int = 0) -> FixedPlanCV:
    """k-fold held-out score of the best fixed plan at ``budget`` (chosen on the other folds)."""
    U, C = _check(U, C)
    fold = fold_assignment(U.shape[0], folds, seed)
    utility, cost = np.zeros(U.shape[0]), np.zeros(U.shape[0])
    choices = []
    for f in range(folds):
        test = fold == f
        choice = choose_fixed_plan(U[~test], C[~test], budget)
        utility[test], cost[test] = choice.utility(U[test]), choice.cost(C[test])
        choices.append(choice)
    return FixedPlanCV(budget=float(budget), folds=folds, seed=seed, fold=fold, choices=tuple(choices),
                       utility=utility, cost=cost)


def _check(U: np.ndarray, C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    U, C = np.asarray(U, dtype=np.float64), np.asarray(C, dtype=np.float64)
    if U.ndim != 2 or U.shape != C.shape or U.shape[0] == 0:
        raise InputError(f"U and C must be (prompts, plans) arrays of one shape with at least one prompt; got "
                         f"{U.shape} and {C.shape}.")
    if not (np.isfinite(U).all() and np.isfinite(C).all()):
        raise InputError("U and C must be finite; a NaN cost usually means a table without token counts — "
                         "use the 'samples' cost unit.")
    return U, C
