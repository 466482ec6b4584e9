"""Budget calibration: a monotone table from the requested mean cost to a learner's internal knob.

A learned policy has one scalar knob that moves its spend: the classifier's *internal budget* b' (the
budget fed to it as an input feature) and the utility learner's *price* λ. The knob's mean cost on
prompts the learner never saw, c(knob), is what a request actually spends, and it is not the knob
itself (an imitator under-spends where it misses expensive oracle actions). Calibration inverts c on
cross-fitted, out-of-fold decisions (:mod:`isocompute.policy.policy`):

    for each requested budget B on a grid:   knob(B) = the knob whose held-out cost is nearest T(B),

where the target T(B) is B itself (or, if the policy is configured so, what the oracle spends at B on
the training prompts: less where extra samples buy nothing), subject to knob(B) being monotone in B
(non-decreasing for b', non-increasing for λ). Serving interpolates linearly between grid entries.
Each entry sits in the middle of a step of c, so rounding cannot tip a decision at a step's edge.

* :func:`calibrate_mixed_grid` — the classifier decides differently only between the budgets it was
  trained on (a grid), so each prompt plays one of the two grid budgets around b', chosen by a hash
  uniform u of its text (:func:`mixed_grid_index`): the share playing the upper one is the fractional
  position of b' between them. c is then a step function with one step per (prompt, grid cell); the
  steps are sorted once and each target takes the first step that reaches it (or the one before, if
  nearer).
* :func:`calibrate_by_bisection` — c(λ) is non-increasing by construction (each prompt's
  ``argmax_a Û − λ·c_a`` only moves to cheaper actions as λ grows); bisection finds the step that
  crosses the target.

Worked example (mixed grid): grid budgets (1, 2, 4), two prompts whose decision at grid budget g costs
g, u = (0.25, 0.75). Prompt i moves up a cell at position x = j + 1 − u_i, so c(x) = 1, then 1.5 from
x = 0.25, 2 from 0.75, 3 from 1.25, 4 from 1.75. Target 1.5 → x = 0.5 (mid-step), b' = 2^0.5.

Ignores: targets beyond what the learner can reach — they map to its costliest knob and it
under-spends (reported in ``realised``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

KNOBS = ("internal_budget", "lam")


@dataclass(frozen=True, eq=False)
class Calibration:
    """Requested budget → knob, a monotone table interpolated linearly.

    ``budgets`` strictly increasing; ``values`` the knob per budget (non-decreasing for
    ``internal_budget``, non-increasing for ``lam``); ``realised`` the validation mean cost at each entry;
    ``n_validation`` the number of validation prompts it was measured on.
    """

    knob: str
    budgets: np.ndarray
    targets: np.ndarray
    values: np.ndarray
    realised: np.ndarray
    n_validation: int

    def __call__(self, budget: float) -> float:
        return float(np.interp(budget, self.budgets, self.values))

    def expected_cost(self, budget: float) -> float:
        """Validation mean cost at ``budget`` (interpolated): what a request is expected to spend."""
        return float(np.interp(budget, self.budgets, self.realised))

    def max_relative_error(self, *, within_reach: bool = False) -> float:
        """Largest |realised − target| / target over the table (0 where the target is 0); with
        ``within_reach`` only over targets up to the most the learner spends (beyond it, it under-spends
        by design: it predicts nothing there is worth buying)."""
        ok = self.targets > 0
        if within_reach:
            ok &= self.targets <= self.realised.max()
        if not ok.any():
            return 0.0
        return float((np.abs(self.realised[ok] - self.targets[ok]) / self.targets[ok]).max())

    def to_dict(self) -> dict[str, Any]:
        return {"knob": self.knob, "budgets": self.budgets.tolist(), "targets": self.targets.tolist(),
                "values": self.values.tolist(),
                "realised": self.realised.tolist(), "n_validation": self.n_validation}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibration:
        return cls(knob=str(d["knob"]), budgets=np.asarray(d["budgets"], dtype=np.float64),
                   targets=np.asarray(d["targets"], dtype=np.float64),
                   values=np.asarray(d["values"], dtype=np.float64),
                   realised=np.asarray(d["realised"], dtype=np.float64), n_validation=int(d["n_validation"]))


def grid_position(budget: float | np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Position x of a budget on an evenly spaced grid (geometric when grid[0] > 0): x = j at grid[j]."""
    b = np.asarray(budget, dtype=np.float64)
    if grid[0] > 0:
        return (np.log(b) - math.log(grid[0])) / (math.log(grid[-1]) - math.log(grid[0])) * (grid.size - 1)
    return (b - grid[0]) / (grid[-1] - grid[0]) * (grid.size - 1)


def grid_budget(x: float | np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Inverse of :func:`grid_position`."""
    t = np.asarray(x, dtype=np.float64) / (grid.size - 1)
    if grid[0] > 0:
        return np.exp(math.log(grid[0]) + t * (math.log(grid[-1]) - math.log(grid[0])))
    return grid[0] + t * (grid[-1] - grid[0])


def mixed_grid_index(x: float | np.ndarray, u: np.ndarray, n_grid: int) -> np.ndarray:
    """Grid budget each prompt plays at position x: ``clip(rint(x + u − ½))`` with u ∈ [0, 1) per prompt.

    A prompt plays grid[j+1] iff u > j + 1 − x, so at x = j + w a share w of the prompts (u uniform)
    plays grid[j+1] and 1 − w plays grid[j]: linear interpolation between adjacent grid budgets, exact
    for each prompt's draw and pure (u is a hash of the prompt text).
    """
    return np.clip(np.floor(np.asarray(x) + u), 0, n_grid - 1).astype(np.intp)


def calibrate_mixed_grid(budgets: np.ndarray, targets: np.ndarray, grid: np.ndarray, grid_costs: np.ndarray,
                         u: np.ndarray, *, n_validation: int) -> Calibration:
    """Internal-budget table for a learner whose decisions are only known on a grid of budgets.

    ``grid_costs[g, i]`` is the cost of prompt i's decision at ``grid[g]`` (held-out prompts), ``u[i]`` its
    tie-breaking uniform. With :func:`mixed_grid_index`, the mean cost c(x) is a step function whose
    steps are single prompts moving to the next grid budget at x = j + 1 − u_i; the events are sorted
    once and each requested budget takes the first x where c(x) reaches its target (or the nearer side
    of that step), so the table is monotone in B even where c is not.
    """
    budgets = np.asarray(budgets, dtype=np.float64)
    targets = np.asarray(targets, dtype=np.float64)
    G, n = grid_costs.shape
    j0 = mixed_grid_index(0.0, u, G)
    start = float(grid_costs[j0, np.arange(n)].mean())
    # Event (prompt i moves from grid j to j+1) at x = j + 1 − u_i, changing the total by Δ.
    js = np.arange(G - 1)[:, None]
    at = (js + 1 - u[None, :]).ravel()
    delta = (grid_costs[1:] - grid_costs[:-1]).ravel() / n
    order = np.argsort(at, kind="stable")
    xs = np.concatenate([[0.0], at[order]])
    cs = start + np.concatenate([[0.0], np.cumsum(delta[order])])
    # Steps: c(x) = cs_k on [xs_k, xs_{k+1}) after merging events at the same x.
    xs_u = np.unique(xs)
    cs_u = cs[np.searchsorted(xs, xs_u, side="right") - 1]
    # Each entry sits mid-step, so rounding in budget ↔ position round trips cannot cross an event.
    mids = 0.5 * (xs_u + np.append(xs_u[1:], G - 1))
    run_max = np.maximum.accumulate(cs_u)
    values = np.empty_like(budgets)
    for r, b in enumerate(targets):
        e = int(np.searchsorted(run_max, b, side="left"))  # first step whose cost reaches b
        if e >= xs_u.size:
            e = int(np.argmax(cs_u))  # out of reach: spend as much as the learner can
        elif e > 0 and abs(cs_u[e - 1] - b) < abs(cs_u[e] - b):
            e -= 1
        values[r] = mids[e]
    values = np.maximum.accumulate(values)
    realised = cs_u[np.searchsorted(xs_u, values, side="right") - 1]
    return Calibration("internal_budget", budgets, targets, grid_budget(values, grid), realised, n_validation)


def _edge(cost_at: Callable[[float], float], inside: float, outside: float, level: float, iters: int) -> float:
    """Bisect between ``inside`` (cost == level) and ``outside`` (cost != level) for the step's far edge."""
    for _ in range(iters):
        mid = 0.5 * (inside + outside)
        if cost_at(mid) == level:
            inside = mid
        else:
            outside = mid
    return outside


def calibrate_by_bisection(budgets: np.ndarray, targets: np.ndarray, cost_at: Callable[[float], float],
                           lam_max: float, *, n_validation: int, iters: int = 60) -> Calibration:
    """Price table for a cost ``cost_at(λ)`` that is non-increasing in λ, searched on [−lam_max, lam_max]
    (``lam_max`` must be enough to reach the cheapest decisions, and −lam_max the dearest).

    For each target, bisection finds the step of c(λ) that crosses it; the entry takes whichever of the
    two adjacent cost levels is nearer the target and sits in the *middle* of that level's λ interval,
    so a new prompt's decision does not hinge on a price that is exactly some calibration prompt's
    indifference point. A negative price only comes into play when the learner spends less than the
    target even at λ = 0, i.e. it predicts no gain from samples the oracle found worth buying: then
    ties in predicted utility go to the dearer action until the target is met.
    """
    budgets = np.asarray(budgets, dtype=np.float64)
    targets = np.asarray(targets, dtype=np.float64)
    values = np.empty_like(budgets)
    realised = np.empty_like(budgets)
    lam_lo, lam_hi = -float(lam_max), float(lam_max)
    top, bottom = cost_at(lam_lo), cost_at(lam_hi)
    for r, b in enumerate(targets):
        if top <= b:  # out of reach: even the dearest decisions spend at most b
            values[r], realised[r] = lam_lo, top
            continue
        lo, hi = lam_lo, lam_hi  # invariant: cost(lo) > b ≥ cost(hi)
        c_lo, c_hi = top, bottom
        for _ in range(iters):
            mid = 0.5 * (lo + hi)
            c = cost_at(mid)
            if c > b:
                lo, c_lo = mid, c
            else:
                hi, c_hi = mid, c
        if c_lo - b < b - c_hi:  # the dearer level, on (start, lo]
            start = _edge(cost_at, lo, lam_lo, c_lo, iters) if top != c_lo else lam_lo
            values[r], realised[r] = 0.5 * (start + lo), c_lo
        else:  # the cheaper level, on [hi, end)
            end = _edge(cost_at, hi, lam_hi, c_hi, iters) if bottom != c_hi else lam_hi
            values[r], realised[r] = 0.5 * (hi + end), c_hi
    # Entries are picked per budget; nearest-side choices are monotone in theory, enforce it against ties.
    mono = np.minimum.accumulate(values)
    for r in np.flatnonzero(mono != values):
        realised[r] = cost_at(float(mono[r]))
    return Calibration("lam", budgets, targets, mono, realised, n_validation)
