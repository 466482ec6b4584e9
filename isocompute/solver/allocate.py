"""The Lagrangian oracle: per-prompt actions that maximise mean utility under a mean-cost budget.

Problem (a multiple-choice knapsack in mean form), for N prompts and A actions sorted by cost::

    maximise   (1/N) Σ_i U[i, a_i]
    subject to (1/N) Σ_i C[i, a_i] ≤ B,        a_i ∈ {0, …, A−1}.

Pricing the budget at λ ≥ 0 splits it into independent per-prompt problems with a closed form,

    a_i(λ) = argmax_a  U[i, a] − λ·C[i, a]          (ties go to the cheaper action),

and the mean cost of a(λ) is non-increasing in λ. Every a_i(λ) sits on the upper concave hull of the
prompt's (cost, utility) points (see :mod:`isocompute.solver.hull`), and it changes only where λ
crosses one of the hull's edge slopes, so instead of bisecting on λ we search the slopes exactly:

    λ* = min{λ ≥ 0 : mean cost of a(λ) ≤ B}     — a weighted selection over all edge slopes, O(NA).

The *cheap side* a(λ*) spends at most B; the *dear side* a(λ*−) also takes the edges whose slope
equals λ* and spends more than B. Prompts whose action differs between the two sides ("mixed")
play the dear side with probability

    p = (B − cost(a(λ*))) / (cost(a(λ*−)) − cost(a(λ*)))

so the expected mean cost is exactly B; this randomised allocation attains the LP relaxation optimum
(x[i, a] ∈ [0, 1], Σ_a x[i, a] = 1), an upper bound for every deterministic allocation. If every
prompt's best action fits (B ≥ mean cost of a(0)), λ* = 0 and the budget is not binding.

``rounding="deterministic"`` instead keeps the cheap side and upgrades mixed prompts to the dear side,
smallest cost increase first, while the budget allows. All mixed upgrades share the utility-per-cost
λ*, so this greedy never stops early for a lack of value, and it loses less than one prompt's utility
gap, ``max_i (max_a U[i,a] − min_a U[i,a]) / N``, against the LP bound (hence against the integer
optimum too).

Worked example (2 prompts, actions k = 1, 2, 4 with costs 1, 2, 4, budget B = 2)::

    U = [[0.5, 0.9, 0.9],      prompt 0: hull 1 → 2 (slope 0.4); k = 4 adds nothing
         [0.2, 0.3, 0.8]]      prompt 1: hull 1 → 4 (slope 0.2); k = 2 lies under that chord

    Both prompts start at k = 1 (mean cost 1). λ* = 0.2: the cheap side takes only prompt 0's edge,
    a = (1, 0), mean cost 1.5, mean utility 0.55; the dear side adds prompt 1's edge, a = (1, 2),
    mean cost 3, mean utility 0.85. Prompt 1 mixes with p = (2 − 1.5) / (3 − 1.5) = 1/3:
    expected mean cost 2, expected mean utility 0.55 + 0.3/3 = 0.65 (the LP optimum).
    Deterministic rounding cannot afford prompt 1's upgrade (+1.5 in mean cost) and returns a = (1, 0),
    mean utility 0.55; the integer optimum here is a = (1, 1) with 0.6.

Ignores: budgets on anything but the mean cost (no per-prompt caps) and uncertainty in U itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from isocompute.errors import BudgetError, InputError
from isocompute.solver.hull import Hulls, upper_hulls

STATUS_OK = 0          # the budget is met: exactly in expectation ("mix"), or from below ("deterministic")
STATUS_NOT_BINDING = 1  # every prompt's best action fits; the spare budget buys nothing

Rounding = Literal["mix", "deterministic"]


@dataclass(frozen=True, eq=False)
class Allocation:
    """Result of :func:`allocate` (in the style of scipy's ``OptimizeResult``).

    Attributes
    ----------
    actions : (N,) int
        Action index per prompt: the cheap side a(λ*) for ``rounding="mix"``, the rounded allocation
        for ``rounding="deterministic"``.
    actions_hi : (N,) int
        The dear side a(λ*−); equal to ``actions`` outside ``mixed``.
    mix_prob : float
        Probability that a mixed prompt plays ``actions_hi`` (0 when nothing mixes).
    mixed : (M,) int
        Indices of the prompts whose two sides differ.
    lam : float
        λ*, the smallest price at which the cheap side fits the budget (0 if the budget is not binding).
    mean_cost, mean_utility : float
        Expected mean cost and utility of the allocation.
    lp_utility : float
        Optimum of the LP relaxation: an upper bound for any allocation at this budget.
    budget : float
    rounding : str
    n_actions : int
    status : int
        ``STATUS_OK`` (0) or ``STATUS_NOT_BINDING`` (1).
    message : str
    """

    actions: np.ndarray
    actions_hi: np.ndarray
    mix_prob: float
    mixed: np.ndarray
    lam: float
    mean_cost: float
    mean_utility: float
    lp_utility: float
    budget: float
    rounding: str
    n_actions: int
    status: int
    message: str

    @property
    def n_prompts(self) -> int:
        return int(self.actions.shape[0])

    def action_probs(self) -> np.ndarray:
        """(N, A) probability of each action per prompt; rows sum to 1."""
        n = self.n_prompts
        probs = np.zeros((n, self.n_actions))
        probs[np.arange(n), self.actions] = 1.0
        probs[self.mixed, self.actions[self.mixed]] = 1.0 - self.mix_prob
        probs[self.mixed, self.actions_hi[self.mixed]] = self.mix_prob
        return probs

    def sample(self, seed: int | np.random.Generator | None = None) -> np.ndarray:
        """One draw of the randomised allocation: each mixed prompt independently plays ``actions_hi``
        with probability ``mix_prob``. Its mean cost is B in expectation, not in every draw."""
        rng = np.random.default_rng(seed)
        out = self.actions.copy()
        up = self.mixed[rng.random(self.mixed.shape[0]) < self.mix_prob]
        out[up] = self.actions_hi[up]
        return out


def lagrangian_actions(utilities: object, costs: object, lam: float) -> np.ndarray:
    """Per-prompt ``argmax_a U[i, a] − lam·C[i, a]`` (ties to the cheaper action) for a price lam ≥ 0.

    Computed on the hulls, so the mean cost is non-increasing in lam even where floating-point
    rounding would make a direct argmax flip between near-tied actions.
    """
    lam = float(lam)
    if not lam >= 0:
        raise InputError(f"the price lam must be ≥ 0 (got {lam}); a negative price would reward spending.")
    return upper_hulls(utilities, costs).actions_at(lam)


def allocate(utilities: object, costs: object, budget: float, *, rounding: Rounding = "mix",
             tol: float = 1e-12, hulls: Hulls | None = None) -> Allocation:
    """Solve the budgeted allocation exactly (see the module docstring for the maths and an example).

    Parameters
    ----------
    utilities, costs : (N, A) array-like
        U[i, a] and C[i, a] for prompt i and action a; costs ascend along a. Not modified.
    budget : float
        Target mean cost per prompt, within [mean of C[:, 0], mean of C[:, -1]].
    rounding : "mix" | "deterministic"
        Randomise the mixed prompts so the expected cost is exactly ``budget`` (LP optimum), or round
        them greedily so the cost never exceeds it.
    tol : float
        Relative tolerance (on the total cost scale) for a budget that sits exactly on a breakpoint.
    hulls : Hulls, optional
        ``upper_hulls(utilities, costs)`` when the caller already built them (one table, many budgets).

    Raises
    ------
    BudgetError
        The budget is outside the feasible range; the message names the range.
    """
    if rounding not in ("mix", "deterministic"):
        raise InputError(f"rounding must be 'mix' or 'deterministic', not {rounding!r}.")
    hulls = upper_hulls(utilities, costs) if hulls is None else hulls
    U, C = hulls.utilities, hulls.costs
    n, n_actions = U.shape
    budget = check_budget(budget, C)
    scale = float(np.abs(C[:, -1]).mean() + np.abs(C[:, 0]).mean()) or 1.0
    slack = tol * scale * n  # totals within this of a breakpoint count as hitting it

    target = n * budget
    start_cost = float(hulls.gather(C, hulls.start).sum())
    # Padding edges have slope −inf and zero cost, so the padded arrays can be searched as they are.
    slopes, d_cost = hulls.slope.ravel(), hulls.d_cost.ravel()
    room = target - start_cost
    if float(np.sum(d_cost, where=slopes > 0)) <= room + slack:
        lam = 0.0
    else:
        # max(·, 0): λ ≥ 0, and an edge whose slope underflowed to 0 is never worth buying.
        lam = max(_price(slopes, d_cost, room + slack), 0.0)
    lo = hulls.actions_at(lam)
    hi = hulls.actions_at(lam, inclusive=True) if lam > 0 else lo
    cost_lo, cost_hi = float(hulls.gather(C, lo).sum()), float(hulls.gather(C, hi).sum())
    util_lo, util_hi = float(hulls.gather(U, lo).sum()), float(hulls.gather(U, hi).sum())
    spare = target - cost_lo
    p = min(spare / (cost_hi - cost_lo), 1.0) if cost_hi > cost_lo and spare > slack else 0.0
    lp_util = ((1.0 - p) * util_lo + p * util_hi) / n

    if lam == 0.0 and target - cost_lo > slack:
        status = STATUS_NOT_BINDING
        message = (f"budget not binding: every prompt's best action costs {cost_lo / n:.6g} on average, "
                   f"below the budget {budget:.6g}; the rest buys no utility (lower the budget or add "
                   "costlier actions).")
    else:
        status = STATUS_OK
        message = ""

    if rounding == "deterministic":
        actions = _round_down(hulls, lo, hi, target - cost_lo + slack)
        cost, util = hulls.gather(C, actions).sum() / n, hulls.gather(U, actions).sum() / n
        message = message or (f"deterministic rounding spends {cost:.6g} of {budget:.6g}; "
                              f"LP bound {lp_util:.6g}, gap {lp_util - util:.3g}.")
        return Allocation(actions=actions, actions_hi=actions.copy(), mix_prob=0.0,
                          mixed=np.empty(0, dtype=np.intp), lam=lam, mean_cost=float(cost),
                          mean_utility=float(util), lp_utility=lp_util, budget=budget, rounding=rounding,
                          n_actions=n_actions, status=status, message=message)

    if p == 0.0:
        hi = lo
    mixed = np.flatnonzero(lo != hi)
    mean_cost = ((1.0 - p) * cost_lo + p * cost_hi) / n
    message = message or (f"expected mean cost {mean_cost:.6g} = budget; {mixed.size} prompt(s) mix "
                          f"with p = {p:.6g} at λ* = {lam:.6g}.")
    return Allocation(actions=lo, actions_hi=hi, mix_prob=p, mixed=mixed, lam=lam, mean_cost=mean_cost,
                      mean_utility=lp_util, lp_utility=lp_util, budget=budget, rounding=rounding,
                      n_actions=n_actions, status=status, message=message)


def feasible_range(costs: np.ndarray) -> tuple[float, float]:
    """(min, max) mean cost: every prompt on its cheapest, or on its costliest, action (the first and last
    columns when costs ascend along each row; plan columns need not, :mod:`isocompute.solver.plans.estimates`)."""
    costs = np.asarray(costs, dtype=np.float64)
    return float(costs.min(axis=1).mean()), float(costs.max(axis=1).mean())


def check_budget(budget: float, costs: np.ndarray, *, tol: float = 1e-12) -> float:
    """Return the budget as a float, or raise BudgetError naming the feasible range."""
    lo, hi = feasible_range(costs)
    try:
        b = float(budget)
    except (TypeError, ValueError):
        raise BudgetError(f"budget must be a number, not {budget!r}; pick one in [{lo:.6g}, {hi:.6g}].") from None
    pad = tol * max(abs(lo), abs(hi), 1e-300)
    if not (math.isfinite(b) and lo - pad <= b <= hi + pad):
        raise BudgetError(f"budget {b:.6g} is outside the feasible range [{lo:.6g}, {hi:.6g}] of mean cost per "
                          "prompt (cheapest action everywhere … costliest action everywhere); pick a budget "
                          "in that range.")
    return b


def _price(slopes: np.ndarray, weights: np.ndarray, room: float) -> float:
    """Largest slope t with Σ weights[slopes ≥ t] > room (the caller guarantees Σ weights > room).

    Weighted selection in O(n): one pass keeps only a narrow band of slopes around the answer, guessed
    from a strided sample (Floyd–Rivest style); then weighted quickselect rounds, each partitioning
    around the median and keeping one side, finish the band exactly. A wrong guess only costs speed.
    """
    above = 0.0  # weight of the slopes already known to lie above the remaining ones
    lowest_above = np.inf  # the smallest of those slopes
    if slopes.size > 1 << 16:
        stride = slopes.size >> 12
        s_smp, w_smp = slopes[::stride], weights[::stride]
        order = np.argsort(-s_smp, kind="stable")
        cum = np.cumsum(w_smp[order])
        if cum[-1] > 0:
            guess = int(np.searchsorted(cum, room / float(weights.sum()) * cum[-1]))
            hi = float(s_smp[order][max(guess - 64, 0)])
            lo = float(s_smp[order][min(guess + 64, order.size - 1)])
            gt = slopes > hi
            w_gt = float(np.sum(weights, where=gt))
            if w_gt > room:
                slopes, weights = slopes[gt], weights[gt]
            else:
                ge = slopes >= lo
                w_ge = float(np.sum(weights, where=ge))
                if w_ge > room:
                    above, lowest_above = w_gt, hi
                    keep = ge & ~gt
                else:
                    above, lowest_above = w_ge, lo
                    keep = ~ge
                slopes, weights = slopes[keep], weights[keep]
    while slopes.size > 256:
        mid = slopes.size // 2
        pivot = np.partition(slopes, mid)[mid]
        gt = slopes > pivot
        w_gt = float(np.sum(weights, where=gt))
        if above + w_gt > room:
            slopes, weights = slopes[gt], weights[gt]
            continue
        eq = slopes == pivot
        w_eq = float(np.sum(weights, where=eq))
        if above + w_gt + w_eq > room:
            return float(pivot)
        above += w_gt + w_eq
        lowest_above = float(pivot)
        lt = ~(gt | eq)
        slopes, weights = slopes[lt], weights[lt]
    real = weights > 0
    slopes, weights = slopes[real], weights[real]
    if slopes.size == 0:  # only reachable through rounding in the running sums
        return lowest_above
    order = np.argsort(-slopes, kind="stable")
    cum = above + np.cumsum(weights[order])
    j = min(int(np.searchsorted(cum, room, side="right")), slopes.size - 1)
    return float(slopes[order][j])


def _round_down(hulls: Hulls, lo: np.ndarray, hi: np.ndarray, room: float) -> np.ndarray:
    """Cheap side plus the mixed prompts' upgrades, smallest extra cost first, while they fit in room."""
    actions = lo.copy()
    mixed = np.flatnonzero(lo != hi)
    if mixed.size == 0:
        return actions
    extra = hulls.gather(hulls.costs, hi)[mixed] - hulls.gather(hulls.costs, lo)[mixed]
    order = np.argsort(extra, kind="stable")
    fits = int(np.searchsorted(np.cumsum(extra[order]), room, side="right"))
    up = mixed[order[:fits]]
    actions[up] = hi[up]
    return actions
