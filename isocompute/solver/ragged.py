"""Ragged outcome tables: prompts with fewer samples than the largest action, kept instead of refused.

An action k is an estimate over k-subsets of a prompt's n samples, so for k > n_i the utility
U[i, k] is unknown. :func:`~isocompute.solver.estimators.utilities` refuses such tables; this module
offers the two ways to keep the data (``isocompute solve/fit/report --min-samples N`` and
``--ragged infeasible``):

* **drop** the prompts with fewer than ``min_samples`` samples (and say how many), then
* **mark infeasible** what is left: actions with k > n_i are infeasible *for prompt i only*. The
  estimators run per group of equal n on the feasible actions only, and an infeasible entry gets the
  utility of the prompt's largest feasible action,

      U[i, a] = U[i, a*(i)]   for k_a > n_i,   a*(i) = the largest a with k_a ≤ n_i,

  at its own (higher) cost, so it is dominated — no better than a cheaper action — and the solver's
  hulls drop it: no budget and no λ ever picks it for that prompt. Scoring a policy that plays it
  anyway credits it with what that prompt's samples support (no gain assumed beyond n_i samples).

Example: actions (1, 2, 4, 8), a prompt with n = 5 and U = (0.40, 0.40, 0.55, ?) gets U[·, 8] = 0.55
at cost 8: dominated by k = 4 (same utility, half the cost), never chosen.

A prompt with fewer samples than the smallest action has no feasible action at all and is always
dropped (:attr:`RaggedTable.dropped` says which). Ignores: which samples a short prompt lost (they are
assumed missing at random, like every sample set the estimators see).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from isocompute.errors import InputError
from isocompute.solver.estimators import utilities
from isocompute.solver.outcomes import OutcomeTable

RAGGED_MODES = ("error", "infeasible")


@dataclass(frozen=True, eq=False)
class RaggedTable:
    """What :func:`prepare` keeps. ``table``: the kept prompts; ``utilities``: (N, A) as in the module
    docstring; ``feasible``: (N, A) bool, k_a ≤ n_i; ``kept``: (N,) their rows in the input table;
    ``dropped``: ids of the prompts dropped, with ``min_samples`` the threshold that dropped them."""

    table: OutcomeTable
    utilities: np.ndarray
    feasible: np.ndarray
    kept: np.ndarray
    dropped: list[str]
    min_samples: int

    @property
    def n_ragged(self) -> int:
        """Kept prompts with at least one infeasible action."""
        return count_ragged(self.feasible)

    def summary(self) -> str:
        """"dropped 3 prompts with < 8 samples; 12 prompts have actions k > n marked infeasible" (or "")."""
        return ragged_summary(self.dropped, self.min_samples, self.n_ragged, len(self.table),
                              "action; their actions k > n are marked infeasible")


def count_ragged(feasible: np.ndarray) -> int:
    """Prompts (rows of the (N, A) ``feasible`` mask) with at least one infeasible action."""
    return int((~feasible).any(axis=1).sum())


def ragged_summary(dropped: Sequence[str], min_samples: int, ragged: int, n_prompts: int, marked: str) -> str:
    """What a ragged table lost or had marked (empty when nothing): the ``dropped`` prompts and the
    ``ragged`` of ``n_prompts`` kept with fewer samples than "the largest " + ``marked``."""
    parts = []
    if dropped:
        parts.append(f"dropped {len(dropped)} prompt(s) with fewer than {min_samples} samples "
                     f"(e.g. {dropped[0]!r})")
    if ragged:
        parts.append(f"{ragged} of {n_prompts} prompts have fewer samples than the largest {marked} "
                     "(never chosen for them)")
    return "; ".join(parts)


def ragged_utilities(table: OutcomeTable, actions: Sequence[int], strategy: str) -> tuple[np.ndarray, np.ndarray]:
    """(U, feasible) for a table whose prompts all have ≥ actions[0] samples (module docstring): the
    estimators per group of equal n on the feasible actions, infeasible entries dominated."""
    ks = np.asarray(list(actions), dtype=np.int64)
    n = table.n_samples
    if not table.is_ragged and n.min() >= ks.max():
        return utilities(table, ks.tolist(), strategy), np.ones((len(table), ks.size), dtype=bool)
    if n.min() < ks[0]:
        i = int(np.argmin(n))
        raise InputError(f"prompt {table.ids[i]!r} has {int(n[i])} samples, fewer than the smallest action k = "
                         f"{int(ks[0])}; drop such prompts (--min-samples {int(ks[0])}).")
    U = np.empty((len(table), ks.size))
    feasible = ks[None, :] <= n[:, None]
    for nn in np.unique(n):
        rows = np.flatnonzero(n == nn)
        feas = ks <= nn
        Ug = utilities(table.subset(rows), ks[feas].tolist(), strategy)
        U[np.ix_(rows, np.flatnonzero(feas))] = Ug
        U[np.ix_(rows, np.flatnonzero(~feas))] = Ug[:, -1:]
    return U, feasible


def drop_short(table: OutcomeTable, actions: Sequence[int], *, min_samples: int = 0,
               ragged: str = "error") -> tuple[OutcomeTable, np.ndarray, list[str], int]:
    """(kept table, kept rows, dropped ids, the threshold): prompts with fewer than ``min_samples``
    samples are dropped — and, with ``ragged="infeasible"``, those with fewer than the smallest action.
    With ``ragged="error"`` every kept prompt must then have ≥ max(actions) samples: InputError naming
    both ways to keep the data otherwise."""
    if ragged not in RAGGED_MODES:
        raise InputError(f"ragged must be one of {', '.join(RAGGED_MODES)}; you passed {ragged!r}.")
    if isinstance(min_samples, bool) or not isinstance(min_samples, int | np.integer) or min_samples < 0:
        raise InputError(f"min_samples must be an integer ≥ 0 (e.g. 16); you passed {min_samples!r}.")
    ks = [int(k) for k in actions]
    if not ks or any(b <= a for a, b in zip(ks, ks[1:], strict=False)):
        raise InputError(f"actions must be strictly increasing sample counts, e.g. 1,2,4,8; you passed {ks}.")
    floor = max(int(min_samples), ks[0] if ragged == "infeasible" else 0)
    keep = table.n_samples >= floor
    kept = np.flatnonzero(keep)
    dropped = [table.ids[i] for i in np.flatnonzero(~keep)]
    if kept.size == 0:
        raise InputError(f"no prompt of {table.source} has at least {floor} samples (the most any has: "
                         f"{int(table.n_samples.max())}); lower --min-samples.")
    sub = table if not dropped else table.subset(kept)
    short = sub.n_samples < ks[-1]
    if ragged == "error" and short.all():
        feasible = [k for k in ks if k <= int(sub.n_samples.max())]
        raise InputError(f"action k={ks[-1]} is infeasible: the prompts of {table.source} have only "
                         f"{int(sub.n_samples.max())} samples or fewer. Feasible actions: {feasible or 'none'}; "
                         "drop the larger actions or sample more per prompt.")
    if ragged == "error" and short.any():
        i = int(np.flatnonzero(short)[0])
        feasible = [k for k in ks if k <= int(sub.n_samples.min())]
        raise InputError(
            f"{int(short.sum())} of {len(sub)} prompts in {table.source} have fewer samples than the largest action "
            f"k = {ks[-1]} (e.g. {sub.ids[i]!r} with {int(sub.n_samples[i])}; the fewest: {int(sub.n_samples.min())}). "
            f"Keep your data: --min-samples {ks[-1]} drops those prompts, or --ragged infeasible marks k > n "
            f"infeasible for them only; or use actions ≤ {feasible[-1] if feasible else 'their n'}.")
    return sub, kept, dropped, int(floor)


def prepare(table: OutcomeTable, actions: Sequence[int], strategy: str, *, min_samples: int = 0,
            ragged: str = "error") -> RaggedTable:
    """:func:`drop_short`, then the utilities of what is kept (:func:`ragged_utilities`)."""
    sub, kept, dropped, floor = drop_short(table, actions, min_samples=min_samples, ragged=ragged)
    U, feasible = ragged_utilities(sub, actions, strategy)
    return RaggedTable(sub, U, feasible, kept, dropped, floor)
