"""The whole utility-vs-budget frontier of the Lagrangian oracle, every breakpoint, in O(NA log NA).

The LP value V(B) of the budgeted allocation (see :mod:`isocompute.solver.allocate`) is concave and
piecewise linear in the mean budget B. Start every prompt on its cheapest action; each hull edge
(Δc, Δu, slope = Δu/Δc) of each prompt (see :mod:`isocompute.solver.hull`) is an increment that
buys Δu/N of mean utility for Δc/N of mean cost. Taking all increments in order of decreasing slope
traces V exactly — the classic greedy for the LP relaxation of the multiple-choice knapsack — because
within a prompt the slopes already decrease. Increments of equal slope form one straight segment, so
the breakpoints are the ends of the groups of equal slope:

    cost[0] = (1/N) Σ_i C[i, start_i],      cost[g+1] = cost[g] + (1/N) Σ_{edges in group g} Δc
    utility likewise with Δu,                lam[g] = slope of group g (the price along segment g),
    lam[K] = 0 at the last point, where every prompt sits on its best action.

``lam[g]`` is also the smallest optimal price at budget ``cost[g]``, i.e. what ``allocate`` reports
there. Between breakpoints V is the linear interpolation; above ``cost[K]`` it is flat up to
``max_cost`` (the mean cost of the costliest action everywhere).

Worked example (the two prompts of ``allocate``'s docstring, costs 1, 2, 4)::

    edges: prompt 0 +1 cost, +0.4 utility (slope 0.4); prompt 1 +3 cost, +0.6 utility (slope 0.2)
    cost    = [1.0, 1.5, 3.0]      utility = [0.35, 0.55, 0.85]      lam = [0.4, 0.2, 0.0]
    utility_at(2.0) = 0.55 + (2.0 − 1.5) · 0.2 = 0.65;  max_cost = 4.

Ignores: integrality (the points between breakpoints need randomised mixing, as in ``allocate``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from isocompute.errors import BudgetError
from isocompute.solver.hull import upper_hulls


@dataclass(frozen=True, eq=False)
class Frontier:
    """Breakpoints of the LP-optimal mean utility as a function of the mean-cost budget.

    Attributes
    ----------
    cost, utility : (K+1,) float
        Mean cost (strictly increasing) and optimal mean utility at each breakpoint.
    lam : (K+1,) float
        Price of the segment leaving each breakpoint to the right (0 at the last one).
    max_cost : float
        Largest feasible budget: every prompt on its costliest action.
    n_prompts : int
    """

    cost: np.ndarray
    utility: np.ndarray
    lam: np.ndarray
    max_cost: float
    n_prompts: int

    @property
    def min_cost(self) -> float:
        return float(self.cost[0])

    def _check(self, budget: object) -> np.ndarray:
        b = np.asarray(budget, dtype=np.float64)
        pad = 1e-12 * max(abs(self.min_cost), abs(self.max_cost), 1e-300)
        bad = ~np.isfinite(b) | (b < self.min_cost - pad) | (b > self.max_cost + pad)
        if bad.any():
            first = float(np.atleast_1d(b)[np.atleast_1d(bad)][0])
            raise BudgetError(f"budget {first:.6g} is outside the feasible range [{self.min_cost:.6g}, "
                              f"{self.max_cost:.6g}] of mean cost per prompt; pick budgets in that range.")
        return b

    def utility_at(self, budget: float | np.ndarray) -> float | np.ndarray:
        """Optimal (LP) mean utility at a budget or an array of budgets: linear interpolation."""
        b = self._check(budget)
        out = np.interp(b, self.cost, self.utility)
        return float(out) if out.ndim == 0 else out

    def lam_at(self, budget: float | np.ndarray) -> float | np.ndarray:
        """Smallest optimal price λ* at a budget (what :func:`allocate` reports)."""
        b = self._check(budget)
        j = np.searchsorted(self.cost, b, side="right") - 1
        out = self.lam[np.clip(j, 0, self.lam.size - 1)]
        return float(out) if out.ndim == 0 else out


def frontier(utilities: object, costs: object) -> Frontier:
    """Every breakpoint of the budget → optimal mean utility curve; inputs as for ``allocate``."""
    hulls = upper_hulls(utilities, costs)
    U, C = hulls.utilities, hulls.costs
    n = U.shape[0]
    start_cost = float(hulls.gather(C, hulls.start).sum())
    start_util = float(hulls.gather(U, hulls.start).sum())
    slopes, d_cost, d_util = hulls.edges()
    keep = slopes > 0
    slopes, d_cost, d_util = slopes[keep], d_cost[keep], d_util[keep]
    order = np.argsort(slopes)[::-1]
    slopes = slopes[order]
    ends = np.flatnonzero(np.r_[slopes[1:] != slopes[:-1], True]) if slopes.size else np.empty(0, np.intp)
    cum_cost = np.cumsum(d_cost[order])[ends]
    cum_util = np.cumsum(d_util[order])[ends]
    return Frontier(cost=(start_cost + np.r_[0.0, cum_cost]) / n,
                    utility=(start_util + np.r_[0.0, cum_util]) / n,
                    lam=np.r_[slopes[ends], 0.0],
                    max_cost=float(C[:, -1].mean()),
                    n_prompts=n)
