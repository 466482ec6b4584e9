"""Empirical-Bayes shrinkage of per-prompt utilities toward the task's mean, for less noisy oracle labels.

A prompt's utility row U[i, ·] is estimated from its n samples; with n = 24 a prompt that is right 8
times in 24 has a maj@k curve whose shape (and with it the oracle's action) changes with every redraw
of those samples. The learner imitates the oracle on U, so it learns that noise. Shrinkage replaces
each entry by its posterior mean under a normal prior across the prompts of the same task:

    u_i(a) ~ N(m_a, τ²_a)                 prior: the task's mean curve and its spread across prompts
    U[i, a] | u_i ~ N(u_i(a), σ²_i(a))    sampling noise of prompt i's estimate
    Ũ[i, a] = m_a + w_i(a) (U[i, a] − m_a),   w_i(a) = τ²_a / (τ²_a + σ²_i(a)),

with σ²_i(a) the variance of U[i, a] over bootstrap redraws of the prompt's own samples
(:func:`isocompute.policy.learn.label_noise.resampled_utilities`), m_a the task's mean of U[·, a] and
τ²_a = max(Var_i U[i, a] − mean_i σ²_i(a), 0) (method of moments). A prompt every sample gets right
(or wrong) has σ² = 0 and keeps its row; an ambiguous one moves toward the task's curve.

Worked example: a task whose k = 4 utilities have mean 0.5 and variance 0.09 across prompts, with mean
sampling variance 0.01: τ² = 0.08. A prompt at U = 0.9 with σ² = 0.02 gets w = 0.08/0.10 = 0.8 and
Ũ = 0.5 + 0.8 · 0.4 = 0.82; one at U = 1.0 with σ² = 0 keeps 1.0.

Only the learners' *training labels* are shrunk (``PolicyConfig(shrinkage="eb")``); calibration, the
never-worse test and every evaluation score the raw utilities. It is off by default because it did not
help in cross-validation (``bench/bench_label_shrinkage.py``, 5 folds × 3 seeds, learned rule alone, gain
over uniform raw → eb): GSM8K/Llama-2-13B −4.05% → −3.42% at budget 4 (difference +0.2 points, CI
[−0.2, +0.6]); Date +1.57% → +1.41%; MATH-500/gpt-oss +0.75% → +0.74% at 2; the demo table +12.79% →
+11.17% at 4 and +7.37% → +3.75% at 8 (−0.7 points, CI [−1.2, −0.2]). The labels are not where the
noise is: p̂'s sampling noise is 0–4% of its variance across prompts on these tables
(``bench/bench_feature_signal.py``); what the features miss is the signal itself. Ignores: correlation between the
entries of a row (each action is shrunk on its own, so a row can lose monotonicity in k) and the
bootstrap's optimism for small n (it treats the n samples as the population).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from isocompute.policy.learn.label_noise import resampled_utilities
from isocompute.solver.outcomes import OutcomeTable

SHRINKAGE = ("none", "eb")


def sampling_variance(table: OutcomeTable, actions: Sequence[int], strategy: str, *, reps: int = 30,
                      seed: int = 0) -> np.ndarray:
    """(N, A) variance of each utility estimate over ``reps`` bootstrap redraws of each prompt's samples."""
    rng = np.random.default_rng(seed)
    draws = np.stack([resampled_utilities(table, actions, strategy, rng) for _ in range(reps)])
    return draws.var(axis=0, ddof=1)


def shrink_utilities(U: np.ndarray, var: np.ndarray, groups: Sequence[str] | None = None) -> np.ndarray:
    """Ũ = m + w (U − m) per group of prompts (a task; one group if None), module docstring."""
    U, var = np.asarray(U, dtype=np.float64), np.asarray(var, dtype=np.float64)
    out = np.empty_like(U)
    labels = np.zeros(U.shape[0], dtype=np.intp) if groups is None else np.unique(list(groups), return_inverse=True)[1]
    for g in np.unique(labels):
        rows = np.flatnonzero(labels == g)
        m = U[rows].mean(axis=0)
        tau2 = np.maximum(U[rows].var(axis=0) - var[rows].mean(axis=0), 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            w = np.where(tau2 + var[rows] > 0, tau2 / (tau2 + var[rows]), 1.0)
        out[rows] = m + w * (U[rows] - m)
    return out
