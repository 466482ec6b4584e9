"""How reproducible are the oracle's labels? A ceiling on imitation accuracy set by the samples alone.

The oracle action of prompt i comes from *its n samples*: draw another n from the same model and the
utilities, and with them the oracle's action, can change. A prompt's label is then one draw from a
distribution P_i(a) over actions, and no learner that sees only the prompt can match it more often
than by always answering that distribution's mode: imitation accuracy ≤ mean_i max_a P_i(a), whatever
the features. That is the **ceiling** reported here.

Estimate (bootstrap over samples): for r = 1..R, redraw each prompt's n samples with replacement from
its own n (answers and correctness travel together), recompute the utility table and the oracle at
budget B on all prompts. P_i is estimated by the share of redraws giving each action; reported per
budget: ``ceiling`` = mean_i max_a P̂_i(a) and ``agreement`` = the mean share of prompts whose redrawn
action equals the original oracle's (how often two draws of the labels agree with each other).

Worked example: a prompt with 16 samples, 2 correct, majority k ∈ {1, 16}. Its maj@16 utility is
about 0 on the original draw (2 of 16 never win a vote) but a redraw holds 4 correct ones with
probability ≈ 0.15 and then may win ties, so its oracle action flips with the draw; a prompt with 0 or
16 correct never flips (every redraw is the same).

Ignores: that the true answer distribution differs from the empirical one (the bootstrap treats the n
samples as the population, which understates the noise for small n), and the report's per-fold
oracles (here one oracle over the whole table).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from isocompute.errors import InputError
from isocompute.solver.allocate import allocate
from isocompute.solver.estimators import best_of_k, majority_at_k, pass_at_k
from isocompute.solver.hull import upper_hulls
from isocompute.solver.outcomes import PAD_CODE, OutcomeTable


def resampled_utilities(table: OutcomeTable, actions: Sequence[int], strategy: str,
                        rng: np.random.Generator) -> np.ndarray:
    """U from one bootstrap redraw of every prompt's samples (same n per prompt). On a ragged table the
    actions above a prompt's n take its largest feasible action's utility (:mod:`isocompute.solver.ragged`)."""
    n = table.n_samples
    N, width = table.correct.shape
    # column j of row i draws a uniform index below n_i; padding columns stay padding
    pick = np.minimum((rng.random((N, width)) * n[:, None]).astype(np.int64), n[:, None] - 1)
    rows = np.arange(N)[:, None]
    mask = table.mask
    correct = np.where(mask, table.correct[rows, pick], False)
    codes = np.where(mask, table.answer_codes[rows, pick], PAD_CODE)
    scores = np.where(mask, table.scores[rows, pick], np.nan)
    ks = np.asarray(list(actions))
    if n.min() >= ks.max():
        return _estimate(strategy, n, correct, codes, scores, mask, ks)
    U = np.empty((N, ks.size))
    for nn in np.unique(n):
        r, feas = np.flatnonzero(n == nn), np.flatnonzero(ks <= nn)
        Ug = _estimate(strategy, n[r], correct[r], codes[r], scores[r], mask[r], ks[feas])
        U[np.ix_(r, feas)] = Ug
        U[np.ix_(r, np.flatnonzero(ks > nn))] = Ug[:, -1:]
    return U


def _estimate(strategy: str, n: np.ndarray, correct: np.ndarray, codes: np.ndarray, scores: np.ndarray,
              mask: np.ndarray, ks: np.ndarray) -> np.ndarray:
    if strategy == "pass":
        return pass_at_k(n, np.rint(correct.sum(axis=1)).astype(np.int64), ks.tolist())
    if strategy == "majority":
        return majority_at_k(codes, correct, ks.tolist())
    if strategy == "best_of":
        return best_of_k(scores, correct, ks.tolist(), mask=mask)
    raise InputError(f"unknown strategy {strategy!r}; use majority, pass or best_of.")


def oracle_label_agreement(table: OutcomeTable, U: np.ndarray, C: np.ndarray, actions: Sequence[int],
                           strategy: str, budgets: Sequence[float], *, reps: int = 20,
                           seed: int = 0) -> dict[str, list[float]]:
    """Per budget, the imitation ``ceiling`` and the redraw ``agreement`` (module docstring).

    ``U``/``C``: the table's own utility and cost tables (N × A); ``C`` is kept fixed across redraws.
    """
    if reps < 1:
        raise InputError(f"reps must be ≥ 1; you passed {reps}.")
    rng = np.random.default_rng(seed)
    N, A = U.shape
    hulls = upper_hulls(U, C)  # built once per table, not once per budget
    base = [allocate(U, C, float(b), rounding="deterministic", hulls=hulls).actions for b in budgets]
    agree = np.zeros(len(budgets))
    freq = np.zeros((len(budgets), N, A))
    rows = np.arange(N)
    for _ in range(reps):
        Ur = resampled_utilities(table, actions, strategy, rng)
        hulls = upper_hulls(Ur, C)
        for j, b in enumerate(budgets):
            a = allocate(Ur, C, float(b), rounding="deterministic", hulls=hulls).actions
            agree[j] += float((a == base[j]).mean())
            freq[j, rows, a] += 1
    return {"ceiling": (freq.max(axis=2).mean(axis=1) / reps).tolist(), "agreement": (agree / reps).tolist(),
            "reps": reps}
