"""The prompt side of the plan estimators: for every vote type λ, sums over the prompt's labelled
count vectors of that type.

For a prompt with answer classes of sizes m_g, values v_g (mean correctness of the class's samples)
and per-sample channel means w_g (completion tokens, decode FLOPs, …), and a partition λ of the votes,
sum over the labelled vectors x whose nonzero entries are λ (each class takes one part or none):

    M0[λ] = Σ_x ∏_g (m_g)_{x_g}                                  — how many ordered draws give x
    MU[λ] = Σ_x ∏_g (m_g)_{x_g} · Σ_{g: x_g = λ₁} v_g            — times the value of the classes at the top
    MW[λ] = Σ_x ∏_g (m_g)_{x_g} · Σ_g x_g w_g                    — times the drawn samples' channel total

(the plan estimator divides MU by the number of tied leaders — fractional tie credit — and adds the
nulls' factor (m₀)_ν). All three are coefficients of one product over classes,

    ∏_g ( 1 + Σ_p (m_g)_p · y_p · (1 + ε·[p = top] v_g + δ·p w_g) ),

taken to first order in ε and δ: multiplying in class g adds, for each part p of λ, (m_g)_p times the
state "λ without one p" — one pass over the lattice's removal edges per class, vectorised over prompts.
The top part of λ \\ p is λ₁ unless p was λ's only largest part, so MU needs no other bookkeeping.
Singletons (m_g = 1), often most classes on hard prompts, go in one step: (1 + y₁)^r contributes
C(r, j) for j ones, and the first-order terms C(r−1, j−1)·Σ v (or Σ w).

Worked example: classes of sizes (2, 1), values (1, 0); λ = (1, 1): x = (1, 1) only, M0 = 2·1 = 2,
MU = 2·(1 + 0) = 2 (two tied leaders; credit ½ each later); λ = (2): x = (2, 0), M0 = (2)₂ = 2, MU = 2.

Ignored: nulls (a separate factor), the rule (the lattice side), prompts' order (rows are independent).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from isocompute.solver.plans.vote_lattice import Partitions


@dataclass(frozen=True, eq=False)
class ClassSums:
    """M0 (P, N), MU (P, N), MW (C, P, N) — partition-major, so lattice edges gather whole rows."""

    m0: np.ndarray
    mu: np.ndarray
    mw: np.ndarray


def falling(m: np.ndarray, k: int) -> np.ndarray:
    """(…, k+1) falling factorials (m)_p for p = 0..k (zero once p > m)."""
    m = np.asarray(m, dtype=np.float64)
    out = np.ones(m.shape + (k + 1,))
    for p in range(1, k + 1):
        out[..., p] = out[..., p - 1] * np.maximum(m - (p - 1), 0.0)
    return out


def class_sums(sizes: np.ndarray, values: np.ndarray, weights: np.ndarray, lattice: Partitions) -> ClassSums:
    """M0, MU, MW over ``lattice`` for N prompts: ``sizes`` (N, G) class sizes (0 = no class),
    ``values`` (N, G), ``weights`` (N, G, C) per-class channel means."""
    N = sizes.shape[0]
    C = weights.shape[2]
    P, k = len(lattice), lattice.k
    single = sizes == 1
    big = sizes >= 2
    n_big = big.sum(axis=1)
    order = np.argsort(-n_big, kind="stable")  # the g-th big class applies to a prefix of the prompts
    inv = np.empty_like(order)
    inv[order] = np.arange(N)
    rank = np.argsort(~big, axis=1, kind="stable")  # each prompt's big classes first
    s_m = np.take_along_axis(sizes, rank, 1)[order]
    s_v = np.take_along_axis(values, rank, 1)[order]
    s_w = np.take_along_axis(weights, rank[:, :, None], 1)[order]
    n_big = n_big[order]

    m0 = np.zeros((P, N))
    m0[0] = 1.0
    mu = np.zeros((P, N))
    mw = np.zeros((C, P, N))
    for g in range(int(n_big.max(initial=0))):
        L = int((n_big > g).sum())
        c = falling(s_m[:L, g], k).T  # (k+1, L)
        v = s_v[:L, g]
        w = s_w[:L, g].T[:, None, :]  # (C, 1, L)
        o0, ou, ow = m0[:, :L].copy(), mu[:, :L].copy(), mw[:, :, :L].copy()
        for p in range(1, min(k, int(s_m[:L, g].max())) + 1):
            dst, src = lattice.rm_dst[p], lattice.rm_src[p]
            if not dst.size:
                continue
            cp = c[p]
            base = o0[src] * cp
            m0[dst, :L] += base
            keep, top = lattice.rm_keeps_top[p], lattice.rm_is_top[p]
            mu[dst[keep], :L] += ou[src[keep]] * cp
            mu[dst[top], :L] += base[top] * v
            mw[:, dst, :L] += ow[:, src] * cp + p * base[None] * w

    r = single.sum(axis=1)[order]
    if r.any():
        sv = np.where(single, values, 0.0).sum(axis=1)[order]
        sw = np.where(single[:, :, None], weights, 0.0).sum(axis=1)[order].T[:, None, :]  # (C, 1, N)
        o0, ou, ow = m0.copy(), mu.copy(), mw.copy()
        top_one = lattice.top == 1
        for j in range(1, min(k, int(r.max())) + 1):
            dst = np.flatnonzero(lattice.strip[j] >= 0)
            src = lattice.strip[j][dst]
            cj, cj1 = _binom(r, j), _binom(r - 1, j - 1)
            m0[dst] += o0[src] * cj
            mu[dst] += ou[src] * cj
            ones = top_one[dst]
            mu[dst[ones]] += o0[src[ones]] * (cj1 * sv)
            mw[:, dst] += ow[:, src] * cj + o0[src][None] * (cj1 * sw)
    return ClassSums(m0=m0[:, inv], mu=mu[:, inv], mw=mw[:, :, inv])


def _binom(n: np.ndarray, j: int) -> np.ndarray:
    """C(n, j) for integer arrays n ≥ -1 (zero when j > n or n < 0), float64."""
    n = np.asarray(n, dtype=np.float64)
    out = np.ones_like(n)
    for i in range(j):
        out *= np.maximum(n - i, 0.0) / (i + 1)
    return np.where(n >= j, out, 0.0)
