"""A multi-model policy's action menu: the full menu cut to the actions worth learning, on training rows.

The default menu over three models holds about 3,150 actions (:func:`isocompute.solver.models.actions.default_actions`);
a learner cannot choose among that many from 500 prompts, and most are dominated. :func:`prune_menu`
keeps, from an :class:`~isocompute.solver.models.estimates.ActionEstimates` on the *training* rows only:

1. every vertex of the upper concave hull of the actions' (mean cost, mean utility) points — the only
   candidates of the fixed-action rule, which plays one of them (or a mix of two) for everyone;
2. per model, the hull vertices of its own single-model plans, and its uniform ladder ``m/none@k`` —
   what the single-model rule plays, and the report's uniform maj@k;
3. then, up to ``max_actions``, the actions the hindsight oracle uses most: the oracle
   (:func:`~isocompute.solver.models.estimates.oracle`) at ``n_budgets`` log-spaced budgets across the
   menu's range, each action scored by its total probability mass over prompts and budgets; an action no
   prompt's oracle ever picks at any budget (dominated per prompt) is never added.

Kept actions stay in menu order. Worked example: actions a (cost 1, utility 0.5 on every prompt), b (2,
0.6), c (2, 0.55) and d (4, 0.6): the hull is a → b (d costs more for the same mean, c lies below), so a
and b are kept by rule 1; c and d only if some prompt's oracle picks them (here none does: b dominates c
and d on every prompt).

Ignores: Monte Carlo noise in the weighted votes' utilities (the oracle may favour a noisy column; the
learner and the never-worse tests then judge it out of fold).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from isocompute.errors import InputError
from isocompute.solver.allocate import feasible_range
from isocompute.solver.models.estimates import ActionEstimates, oracle
from isocompute.solver.plans.rules import NoRule

MAX_ACTIONS = 40
N_BUDGETS = 8


def uniform_columns(est: ActionEstimates, model: str) -> tuple[np.ndarray, np.ndarray]:
    """``(k, columns)`` of the model's one-wave, no-rule plans ``model/none@k``, by k."""
    pairs = sorted((a.stages[0].plan.max_samples, j) for j, a in enumerate(est.actions)
                   if a.models == (model,) and isinstance(a.stages[0].plan.rule, NoRule) and a.stages[0].plan.n_waves == 1)
    return np.array([k for k, _ in pairs], np.int64), np.array([j for _, j in pairs], np.int64)


def hull_columns(u: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Indices of the vertices of the upper concave hull of points (c_j, u_j), from the cheapest point up
    to the highest utility (ties: the cheaper, then the first); sorted ascending."""
    u, c = np.asarray(u, dtype=np.float64), np.asarray(c, dtype=np.float64)
    order = np.lexsort((np.arange(c.size), -u, c))
    hull: list[int] = []
    for j in order:
        if hull and u[j] <= u[hull[-1]]:
            continue  # dearer (or as dear) and no better: below the hull
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # b is not a vertex when it lies on or below the segment a → j
            if (u[b] - u[a]) * (c[j] - c[a]) <= (u[j] - u[a]) * (c[b] - c[a]):
                hull.pop()
            else:
                break
        hull.append(int(j))
    return np.sort(np.array(hull, dtype=np.int64))


def oracle_mass(est: ActionEstimates, n_budgets: int = N_BUDGETS) -> np.ndarray:
    """(A,) total probability the oracle gives each action over prompts and ``n_budgets`` log-spaced
    budgets from the cheapest to the dearest per-prompt choice."""
    lo, hi = feasible_range(est.cost)
    budgets = np.geomspace(max(lo, 1e-300), hi, n_budgets) if lo > 0 else np.linspace(lo, hi, n_budgets)
    mass = np.zeros(len(est.actions))
    for b in budgets:
        mass += oracle(est, float(b)).probs.sum(axis=0)
    return mass


def prune_menu(est: ActionEstimates, models: Sequence[str], *, max_actions: int = MAX_ACTIONS,
               n_budgets: int = N_BUDGETS) -> np.ndarray:
    """Column indices of ``est`` to keep (module docstring), ascending; ``est`` holds the training rows."""
    if max_actions < 2:
        raise InputError(f"max_actions must be at least 2 (a cheap and a dear action); got {max_actions}.")
    u_bar, c_bar = est.utility.mean(axis=0), est.cost.mean(axis=0)
    keep: dict[int, None] = dict.fromkeys(hull_columns(u_bar, c_bar).tolist())
    for m in models:
        cols = est.columns(model=m)
        if cols.size == 0:
            raise InputError(f"the menu has no single-model action on {m}; the single-model rule needs its plans.")
        keep.update(dict.fromkeys(cols[hull_columns(u_bar[cols], c_bar[cols])].tolist()))
        keep.update(dict.fromkeys(uniform_columns(est, m)[1].tolist()))
    mass = oracle_mass(est, n_budgets)
    for j in np.argsort(-mass, kind="stable"):
        if len(keep) >= max_actions or mass[j] <= 0:
            break
        keep.setdefault(int(j), None)
    return np.array(sorted(keep), dtype=np.int64)
