"""P(the leading answer has the largest probability) under a Dirichlet posterior, in closed form.

The Bayesian stopping rules (:mod:`isocompute.solver.plans.rules`) need, for vote counts turned into
Dirichlet shapes a₁ (the leader), a₂ … a_J (the other classes, integers) and optionally one more
competitor of real shape α (the mass of answers not seen yet),

    P₁ = P( p₁ > p_j for every j ≥ 2, and p₁ > p_α ),    (p₁, …, p_J, p_α) ~ Dirichlet(a₁, …, a_J, α).

Write p_j = G_j / ΣG with independent G_j ~ Gamma(a_j, 1); then P₁ = E[ ∏_j F_{a_j}(G₁) · F_α(G₁) ]
with F the Gamma CDF. For an integer shape, F_a(x) = 1 − e^{−x} Σ_{i<a} x^i/i!, so inclusion–exclusion
over the subsets S of the other classes (s = |S|) gives a finite sum of terms that are each a
probability in [0, 1] (so the alternating sum loses at most 2^{J−1} ulps, no catastrophic cancellation):

    P₁ = Σ_S (−1)^s Σ_{d ≥ 0} NB(d; a₁, 1/(1+s)) · Q_S(d) · I_{1/(2+s)}(α, a₁ + d)

where NB(d; r, p) = C(d+r−1, d) p^r (1−p)^d is the negative-binomial pmf, Q_S(d) is the probability that
d letters drawn uniformly from the s letters of S use each letter j fewer than a_j times (a finite
convolution of binomials; zero beyond d = Σ_{j∈S}(a_j − 1), so the sum over d is finite), and
I_x(α, b) the regularised incomplete Beta function — the chance that Gamma(α) stays below the leader's
share, P(G_α < Y) for Y ~ Gamma(a₁+d, rate 1+s). Without the α competitor that factor is 1. No
quadrature and no Monte Carlo: the result is the same number in the offline estimator and the gateway.

Worked example (two classes, no α): shapes (3, 2): S = ∅ gives 1; S = {2} gives
−Σ_{d<2} NB(d; 3, 1/2) = −(1/8 + 3/16) = −5/16, so P₁ = 11/16 = P(Beta(3, 2) > 1/2) = beta.sf(0.5, 3, 2).

Rows are independent: every sum runs in a fixed order and padding adds exact zeros, so a row's value
does not depend on which other rows share the batch (a threshold decision never flips with batching).
Ignored: non-integer class shapes (the rules only produce counts + an integer prior).
"""

from __future__ import annotations

import numpy as np
from scipy.special import betainc
from scipy.special import binom as choose


def leader_max_prob(leader: np.ndarray, others: np.ndarray, alpha: float | None = None) -> np.ndarray:
    """P₁ for each row: ``leader`` (S,) integer shapes ≥ 1, ``others`` (S, J) integer shapes where 0 marks
    an absent class, ``alpha`` the real shape of one extra competitor (None: no extra competitor)."""
    a1 = np.asarray(leader, dtype=np.int64)
    oth = np.atleast_2d(np.asarray(others, dtype=np.int64))
    n_rows, n_oth = oth.shape
    out = np.zeros(n_rows)
    if alpha is None:
        out += 1.0
    else:
        out += betainc(alpha, a1, 0.5)
    for mask in range(1, 1 << n_oth):
        idx = [j for j in range(n_oth) if mask >> j & 1]
        s = len(idx)
        bounds = oth[:, idx]
        present = (bounds > 0).all(axis=1)
        if not present.any():
            continue
        depth = int(np.where(present, (bounds - 1).sum(axis=1), 0).max()) + 1
        q = np.zeros((n_rows, depth))
        q[:, 0] = 1.0
        for t in range(s):  # add the letters of S one at a time: a binomial split of the d draws
            a_j = np.where(present, bounds[:, t], 0)
            new = np.zeros_like(q)
            for i in range(int(a_j.max())):
                d = np.arange(i, depth)
                w = choose(d, i) * (1.0 / (t + 1)) ** i * (t / (t + 1)) ** (d - i)  # Binomial(d, 1/(t+1)) pmf
                new[:, i:] += np.where((i < a_j)[:, None], w[None, :] * q[:, : depth - i], 0.0)
            q = new
        term = np.zeros(n_rows)
        p_nb = 1.0 / (1.0 + s)
        for d in range(depth):  # a fixed summation order keeps rows independent of the batch
            f = choose(d + a1 - 1, d) * p_nb**a1 * (1.0 - p_nb) ** d * q[:, d]  # NB(d; a₁, p_nb) pmf
            if alpha is not None:
                f = f * betainc(alpha, a1 + d, 1.0 / (2.0 + s))
            term += f
        out += np.where(present, -term if s % 2 else term, 0.0)
    return np.clip(out, 0.0, 1.0)
