"""The fixed mixture's LP, kept warm in HiGHS: the best mean utility over mixtures of fixed plans within a mean
tokens bound and a mean latency bound.

``MixLP(U, T, L, l_max)`` builds the LP once for one set of prompts (columns: plans; rows: mean tokens ≤ t,
mean latency ≤ l, weights sum to 1); ``solve(t)`` changes the tokens bound and re-solves from the last
basis. The held-out budget search (:func:`isocompute.policy.evidence.chain.heldout_mix_budget`) solves it
on a grid of 17 bounds per inner fold: about 0.07 ms a solve here, against about 2 ms for a fresh
``scipy.optimize.linprog`` (the same HiGHS, most of its time spent checking options and converting inputs;
measured: a 120-prompt evidence fit 14 s → 3 s).
"""

from __future__ import annotations

import contextlib
import os

import highspy
import numpy as np

_quiet = False


@contextlib.contextmanager
def _no_banner():
    """HiGHS prints its banner to stdout when the first ``Highs`` of a process is made; the CLI's output and
    the JSON some commands print must not carry it."""
    global _quiet
    if _quiet:
        yield
        return
    import sys

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        _quiet = True


class MixLP:
    """max ū·w over w ≥ 0, Σw = 1, T̄·w ≤ t, L̄·w ≤ ``l_max`` (None or inf: no latency row); ū, T̄, L̄ the
    column means of ``U``, ``T``, ``L`` (prompts × plans)."""

    def __init__(self, U: np.ndarray, T: np.ndarray, L: np.ndarray, l_max: float | None):
        P = U.shape[1]
        rows = [T.mean(axis=0)]
        upper = [np.inf]
        if l_max is not None and np.isfinite(l_max):
            rows.append(L.mean(axis=0))
            upper.append(float(l_max))
        rows.append(np.ones(P))
        A = np.vstack(rows)
        inf = highspy.kHighsInf
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = P, A.shape[0]
        lp.col_cost_ = -U.mean(axis=0)
        lp.col_lower_, lp.col_upper_ = np.zeros(P), np.ones(P)
        lp.row_lower_ = np.array([-inf] * (A.shape[0] - 1) + [1.0])
        lp.row_upper_ = np.array([min(u, inf) for u in upper] + [1.0])
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = np.arange(0, A.size + 1, A.shape[0])
        lp.a_matrix_.index_ = np.tile(np.arange(A.shape[0]), P)
        lp.a_matrix_.value_ = A.T.ravel()
        with _no_banner():
            self._h = highspy.Highs()
        self._h.setOptionValue("output_flag", False)
        self._h.passModel(lp)

    def solve(self, t_max: float) -> tuple[np.ndarray, np.ndarray] | None:
        """(plan indices, weights) of the optimum within mean tokens ``t_max``, or None when none fits."""
        h = self._h
        h.changeRowBounds(0, -highspy.kHighsInf, float(t_max))
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return None
        x = np.asarray(h.getSolution().col_value)
        keep = np.flatnonzero(x > 1e-9)
        return keep, x[keep] / x[keep].sum()
