"""Exact plan estimates for waiting-wave plans: the lattice side contracted with the prompt side.

With the lattice of vote types (:mod:`~isocompute.solver.plans.vote_lattice`: a_π(λ, ν), how many label
sequences of each type stop at each boundary) and the prompt's class sums
(:mod:`~isocompute.solver.plans.vote_polynomials`: M0, MU, MW over labelled count vectors of each type),

    P(stop with ν nulls and votes λ) = a_π(λ, ν) · (m₀)_ν · M0[λ] / (n)_K,        K = |λ| + ν,
    U = Σ a_π(λ, ν) (m₀)_ν MU[λ] / (t_λ (n)_K),      E[channel] = Σ a_π (m₀)_ν (MW[λ] + ν w₀ M0[λ]) / (n)_K

(t_λ = how many parts tie at the top, w₀ the nulls' mean channel value). The contraction is a matrix
product per partition size over all plans at once. It needs the partitions of up to the largest plan's
samples (915 for 16, 7,338 for 24), which is the method's limit, not the number of answer classes.

It holds only where a plan's stops depend on the random order alone: waiting waves, or parallel-stop
waves whose rule never fires (``none``); a parallel-stop wave's finish order follows the samples'
lengths (:mod:`~isocompute.solver.plans.waves`). Ignored: everything about lengths but linear channels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from isocompute.solver.outcomes import NULL_CODE, PAD_CODE
from isocompute.solver.plans.plan import Plan
from isocompute.solver.plans.vote_lattice import partitions, stop_counts
from isocompute.solver.plans.vote_polynomials import class_sums, falling


@dataclass(frozen=True, eq=False)
class Classes:
    """Per prompt: n, nulls m₀ and their channel means w₀ (N, C); per class, largest first: sizes,
    values and channel means (N, G[, C]); ``rank`` (N, G_code) maps a row's code to its class index."""

    n: np.ndarray
    nulls: np.ndarray
    null_w: np.ndarray
    sizes: np.ndarray
    values: np.ndarray
    weights: np.ndarray
    rank: np.ndarray

    def rank_of_code(self, codes: np.ndarray) -> np.ndarray:
        return np.take_along_axis(self.rank, np.maximum(codes, 0), axis=1)


def classes(codes: np.ndarray, correct: np.ndarray, per_sample: np.ndarray) -> Classes:
    N, C = codes.shape[0], per_sample.shape[2]
    G = max(int(codes.max(initial=-1)) + 1, 1)
    voting = codes >= 0
    row = np.broadcast_to(np.arange(N)[:, None], codes.shape)
    key = (row * G + codes)[voting]
    counts = np.bincount(key, minlength=N * G).reshape(N, G).astype(np.float64)
    right = np.bincount(key, weights=correct[voting], minlength=N * G).reshape(N, G)
    chan = np.stack([np.bincount(key, weights=per_sample[..., c][voting], minlength=N * G).reshape(N, G)
                     for c in range(C)], axis=2) if C else np.zeros((N, G, 0))
    null = codes == NULL_CODE
    nulls = null.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        null_w = np.where(nulls[:, None] > 0, (per_sample * null[..., None]).sum(axis=1) / nulls[:, None], 0.0)
        values = np.where(counts > 0, right / counts, 0.0)
        weights = np.where(counts[..., None] > 0, chan / counts[..., None], 0.0)
    order = np.argsort(-counts, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(G)[None, :].repeat(N, 0), axis=1)
    return Classes(
        n=(codes != PAD_CODE).sum(axis=1), nulls=nulls, null_w=null_w,
        sizes=np.take_along_axis(counts, order, 1).astype(np.int64), values=np.take_along_axis(values, order, 1),
        weights=np.take_along_axis(weights, order[:, :, None], 1), rank=rank,
    )


def exact_estimates(cls: Classes, plans: Sequence[Plan], chunk: int,
           part: Literal["all", "fired"] = "all") -> tuple[np.ndarray, ...]:
    """(N, P) utility, samples, waves, (N, P, C) channels and (N, P) probability of every plan's stops
    in ``part`` (all of them, or where the rule fired), exactly: E[X·1{part}] and P(part)."""
    k = max(p.max_samples for p in plans)
    lat = partitions(k)
    P = len(plans)
    wave_of = np.zeros((P, k + 1))  # wave index at each boundary
    ties = np.array([lam.count(lam[0]) if lam else 1 for lam in lat.items], dtype=np.float64)
    sizes_idx = [np.flatnonzero(lat.size == s) for s in range(k + 1)]
    # per partition size s: A_s[λ, ν, plan] = the plan's stop count for votes λ and ν ≤ k − s nulls
    A_s = [np.zeros((idx.size, k + 1 - s, P)) for s, idx in enumerate(sizes_idx)]
    for j, plan in enumerate(plans):
        for wave, K in enumerate(plan.boundaries, start=1):
            wave_of[j, K] = wave
        counts = stop_counts(plan, k, part)
        for s in range(k + 1):
            A_s[s][:, :, j] = counts[sizes_idx[s], : k + 1 - s]
    N, C = cls.sizes.shape[0], cls.weights.shape[2]
    Q = 2 + C  # contracted quantities: M0, MU / ties, MW per channel
    res_u, res_s, res_w, res_p = np.zeros((N, P)), np.zeros((N, P)), np.zeros((N, P)), np.zeros((N, P))
    res_c = np.zeros((N, P, C))
    by_nulls = np.argsort(cls.nulls, kind="stable")  # chunks of similar null counts skip more columns
    for lo in range(0, N, chunk):
        rows = by_nulls[lo:lo + chunk]
        n = rows.size
        G = int((cls.sizes[rows] > 0).sum(axis=1).max(initial=1))
        sums = class_sums(cls.sizes[rows, :G], cls.values[rows, :G], cls.weights[rows, :G], lat)
        f_null = falling(cls.nulls[rows], k).T  # (ν, n)
        inv_n = 1.0 / falling(cls.n[rows], k).T  # (K, n); plans never exceed a prompt's n
        v_max = int(cls.nulls[rows].max())
        z = np.zeros((k + 1, P, Q, n))  # by K = |λ| + ν
        znu = np.zeros((k + 1, P, n))
        for s in range(k + 1):
            idx = sizes_idx[s]
            nv = min(k - s, v_max) + 1
            At = A_s[s][:, :nv].reshape(idx.size, nv * P).T  # ((ν, plan), λ)
            if not At.any():
                continue
            M = np.concatenate([sums.m0[idx], sums.mu[idx] / ties[idx, None], *sums.mw[:, idx]], axis=1)
            y = (At @ M).reshape(nv, P, Q, n) * f_null[:nv, None, None, :]
            z[s:s + nv] += y
            znu[s:s + nv] += y[:, :, 0] * np.arange(nv)[:, None, None]
        tot = (z * inv_n[:, None, None, :]).sum(axis=0)  # (P, Q, n)
        prob = z[:, :, 0] * inv_n[:, None, :]  # (K, P, n): P(stop at K samples)
        res_u[rows] = tot[:, 1].T
        res_p[rows] = tot[:, 0].T
        res_s[rows] = (prob * np.arange(k + 1)[:, None, None]).sum(axis=0).T
        res_w[rows] = (prob * wave_of.T[:, :, None]).sum(axis=0).T
        nulls_drawn = (znu * inv_n[:, None, :]).sum(axis=0).T  # (n, P) expected nulls drawn
        res_c[rows] = tot[:, 2:].transpose(2, 0, 1) + nulls_drawn[:, :, None] * cls.null_w[rows][:, None, :]
    return res_u, res_s, res_w, res_c, res_p
