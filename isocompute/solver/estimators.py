"""Unbiased k-sample estimators: the expected accuracy of answering with k of a prompt's n samples.

For each prompt with n graded samples and each action k, the utility U[i, k] is the EXACT expectation of
a strategy's correctness over all C(n, k) equally likely k-subsets of the samples (a U-statistic, no
Monte Carlo). Strategies:

``pass``      pass@k: some sample in the subset is correct. With c correct samples,
              U = 1 − C(n−c, k)/C(n, k) = 1 − ∏_{i=n−c+1}^{n} (1 − k/i)   (human-eval's stable form).
``majority``  maj@k: plurality vote over the subset's extracted answers. Null answers never vote
              (a subset of nulls only scores 0); when t answers tie at the top each gets credit 1/t.
              A winning answer scores the mean correctness of its samples (0/1 when grading is
              consistent); a null sample is wrong whatever its ``correct`` flag says.
``best_of``   best-of-k: the subset's sample with the highest verifier score answers; ties in score
              are broken uniformly at random. Needs a score on every sample.

Majority, exactly. Let the target answer have m samples, the other answers counts m_h, and the nulls
fill the rest. The target wins with j of its samples in the subset iff every other answer has ≤ j, and
the t others with exactly j share the win: credit 1/(1+t). Per j, the generating function

    F_j(z, w) = ∏_h ( Σ_{x<j} C(m_h, x) z^x  +  w · C(m_h, j) z^j ) · (1+z)^{s_j}

(z counts other samples drawn, w counts ties; answers with m_h < j and nulls, s_j samples in all, can
never reach j and fold into the binomial) gives

    U = Σ_j C(m, j) · Σ_t [z^{k−j} w^t] F_j / (1+t)  /  C(n, k).

All coefficients are non-negative, so the sums lose no precision. The products are vectorised over
prompts (groups sorted by size, so each factor applies to a prefix of the prompts), prompts that share
(n, m, sorted other counts) are computed once, and one pass serves every k ≤ max(actions).

Worked example (majority): answers [a, a, b, b, c], a correct, k = 4. Of the 5 subsets, dropping an a
leaves b the winner (0, twice), dropping a b leaves a (1, twice), dropping c ties a and b (1/2):
U = 2.5/5 = 0.5. By the formula: j = 1 is impossible (3 others from {b, b, c} with each ≤ 1); j = 2:
C(2,2)·([b b] tie 1/2 + [b c] ×2 → 2) = 2.5, over C(5,4) = 5.

Best-of, exactly. Sort the scores; a level v with m_v samples (c_v correct) and L_< samples below it
is the subset's maximum with probability (C(L_< + m_v, k) − C(L_<, k)) / C(n, k), and then the chosen
sample is uniform over the level's m_v samples, so U = Σ_v that probability · c_v/m_v.
Example: scores [0.9, 0.5, 0.5, 0.1], correct [F, T, F, T], k = 2: P(max = 0.5) = (C(3,2) − C(1,2))/6
= 1/2, times 1/2 correct at that level; the other levels contribute 0: U = 0.25.

This module ignores costs (see the cost tables) and how answers were graded (``isocompute.tasks``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from isocompute.errors import InputError
from isocompute.solver.outcomes import PAD_CODE, OutcomeTable

STRATEGIES: tuple[str, ...] = ("pass", "majority", "best_of")
MAX_SAMPLES = 1000  # C(n, k) must stay finite in float64 (C(1029, 514) overflows)
_CHUNK = 2048  # count profiles per block in the maj@k generating-function pass


def _binomials(n_max: int) -> np.ndarray:
    """Table C(a, b) for 0 ≤ a, b ≤ n_max in float64 (exact below 2**53), zero where b > a."""
    if n_max > MAX_SAMPLES:
        raise InputError(f"{n_max} samples per prompt is more than the {MAX_SAMPLES} the exact estimators "
                         "support (binomials overflow float64); subsample the table's samples.")
    t = np.zeros((n_max + 1, n_max + 1))
    t[:, 0] = 1.0
    for a in range(1, n_max + 1):
        t[a, 1:] = t[a - 1, 1:] + t[a - 1, :-1]
    return t


def _ks(k: int | Sequence[int]) -> np.ndarray:
    ks = np.atleast_1d(np.asarray(k))
    if ks.ndim != 1 or ks.size == 0 or ks.dtype.kind not in "iu" or (ks < 1).any():
        raise InputError(f"actions must be positive integers (numbers of samples k), got {k!r}.")
    return ks.astype(np.int64)


def _check_feasible(n: np.ndarray, ks: np.ndarray) -> None:
    if n.size and ks.max() > n.min():
        i = int(np.argmin(n))
        raise InputError(f"k={int(ks.max())} needs {int(ks.max())} samples but row {i} has only {int(n[i])}; "
                         f"use k <= {int(n.min())}.")


def _shaped(out: np.ndarray, k: int | Sequence[int], rows: object = None) -> np.ndarray:
    """Results take k's shape as a trailing axis, and a single row (1-D input) drops the row axis."""
    out = out[..., 0] if np.ndim(k) == 0 else out
    return out[0] if rows is not None and np.ndim(rows) == 1 else out


# --------------------------------------------------------------------------------------------- pass@k


def pass_at_k(n: np.ndarray | int, c: np.ndarray | int, k: int | Sequence[int]) -> np.ndarray:
    """pass@k = 1 − C(n−c, k)/C(n, k) for arrays of sample counts ``n`` and correct counts ``c``.

    Uses the product form 1 − ∏_{i=n−c+1}^{n} (1 − k/i), which never forms a large binomial.
    Example: n = 4, c = 1, k = 2: 1 − (1 − 2/4) = 0.5 (half of the 6 pairs contain the correct one).
    Returns shape broadcast(n, c) (+ (len(k),) when k is a sequence).
    """
    n_arr, c_arr = np.broadcast_arrays(np.asarray(n, dtype=np.int64), np.asarray(c, dtype=np.int64))
    ks = _ks(k)
    if (c_arr < 0).any() or (c_arr > n_arr).any():
        raise InputError("pass_at_k needs 0 <= c <= n for every row; check the correct counts.")
    _check_feasible(n_arr.ravel(), ks)
    i = np.arange(1, int(n_arr.max(initial=0)) + 1)
    in_prod = (i > (n_arr - c_arr)[..., None]) & (i <= n_arr[..., None])
    out = np.empty(n_arr.shape + (ks.size,))
    for a, kk in enumerate(ks):
        prod = np.where(in_prod, 1.0 - kk / i, 1.0).prod(axis=-1)
        out[..., a] = np.where(n_arr - c_arr < kk, 1.0, 1.0 - prod)
    return _shaped(out, k)


# --------------------------------------------------------------------------------------------- best-of-k


def best_of_k(
    scores: np.ndarray, correct: np.ndarray, k: int | Sequence[int], mask: np.ndarray | None = None
) -> np.ndarray:
    """best-of-k by verifier score with uniform tie-breaking, for rows of ``scores`` / ``correct``.

    ``mask`` (default: all True) marks real samples in padded rows. Returns (N,) (+ (len(k),)).
    """
    scores_in = scores
    scores, correct = np.atleast_2d(scores).astype(np.float64), np.atleast_2d(correct).astype(np.float64)
    mask = np.ones(scores.shape, dtype=bool) if mask is None else np.atleast_2d(mask)
    if np.isnan(scores[mask]).any():
        raise InputError("best_of needs a verifier score on every sample; some are missing (NaN). "
                         "Score the samples or use strategy 'majority' or 'pass'.")
    ks = _ks(k)
    n = mask.sum(axis=1)
    _check_feasible(n, ks)
    binom = _binomials(int(n.max()))
    out = np.zeros((scores.shape[0], ks.size))
    for nn in np.unique(n):  # rows of equal length share one sort; tables are rarely ragged
        rows = np.flatnonzero(n == nn)
        s, x = scores[rows], correct[rows]
        if nn < scores.shape[1]:  # compact the real samples of padded rows to the left
            m = mask[rows]
            s = s[m].reshape(rows.size, nn)
            x = x[m].reshape(rows.size, nn)
        order = np.argsort(s, axis=1, kind="stable")
        s, x = np.take_along_axis(s, order, 1), np.take_along_axis(x, order, 1)
        pos = np.arange(nn)
        starts = np.ones(s.shape, dtype=bool)
        starts[:, 1:] = s[:, 1:] != s[:, :-1]
        ends = np.ones(s.shape, dtype=bool)
        ends[:, :-1] = starts[:, 1:]
        below = np.maximum.accumulate(np.where(starts, pos, 0), axis=1)  # L_<: samples below the level
        upto = np.minimum.accumulate(np.where(ends, pos + 1, nn)[:, ::-1], axis=1)[:, ::-1]  # L_≤
        for a, kk in enumerate(ks):
            p_level = (binom[upto, kk] - binom[below, kk]) / binom[nn, kk]
            out[rows, a] = (x * p_level / (upto - below)).sum(axis=1)
    return _shaped(out, k, scores_in)


# --------------------------------------------------------------------------------------------- maj@k


def majority_at_k(answer_codes: np.ndarray, correct: np.ndarray, k: int | Sequence[int]) -> np.ndarray:
    """maj@k with fractional tie credit, for rows of answer codes (equal answers share a code ≥ 0,
    null = -1, padding = :data:`~isocompute.solver.outcomes.PAD_CODE`) and per-sample correctness.

    Returns (N,) (+ (len(k),)). See the module docstring for the generating function.
    """
    codes = np.atleast_2d(np.asarray(answer_codes, dtype=np.int64))
    correct = np.atleast_2d(np.asarray(correct, dtype=np.float64))  # bool verdicts or consensus credit
    ks = _ks(k)
    n = (codes != PAD_CODE).sum(axis=1)
    _check_feasible(n, ks)
    N = codes.shape[0]
    out = np.zeros((N, ks.size))
    voting = codes >= 0
    if not voting.any():
        return _shaped(out, k, answer_codes)
    G = int(codes.max()) + 1
    row = np.broadcast_to(np.arange(N)[:, None], codes.shape)[voting]
    key = row * G + codes[voting]
    counts = np.bincount(key, minlength=N * G).reshape(N, G)
    n_right = np.bincount(key, weights=correct[voting], minlength=N * G).reshape(N, G)

    # One entry per (prompt, answer that can score): its share of wins, times its mean correctness.
    e_row, e_grp = np.nonzero(n_right > 0)
    if e_row.size == 0:
        return _shaped(out, k, answer_codes)
    value = n_right[e_row, e_grp] / counts[e_row, e_grp]
    m = counts[e_row, e_grp]
    others = counts[e_row].copy()
    others[np.arange(e_row.size), e_grp] = 0
    others = -np.sort(-others, axis=1)
    others = others[:, : max(1, int((others > 0).sum(axis=1).max()))]
    profile = np.column_stack([n[e_row], m, others])
    uniq, inv = np.unique(profile, axis=0, return_inverse=True)
    binom = _binomials(int(n.max()))
    # chunks bound the (profiles, k, ties) work arrays to a few tens of MB even for k up to n
    share = np.concatenate([_win_share(u[:, 0], u[:, 1], u[:, 2:], ks, binom)
                            for u in np.array_split(uniq, -(-len(uniq) // _CHUNK))])
    contrib = share[inv.ravel()] * value[:, None]
    for a in range(ks.size):
        out[:, a] = np.bincount(e_row, weights=contrib[:, a], minlength=N)
    return _shaped(out, k, answer_codes)


def _win_share(n: np.ndarray, m: np.ndarray, others: np.ndarray, ks: np.ndarray, binom: np.ndarray) -> np.ndarray:
    """(E, A) expected win share of a target answer with m of n samples, the other answers having counts
    ``others`` (rows sorted descending, zero-padded), over uniform k-subsets, for each k in ``ks``."""
    E, kmax = n.size, int(ks.max())
    total = np.zeros((E, ks.size))
    for j in range(1, min(kmax, int(m.max())) + 1):
        sel = np.flatnonzero(m >= j)
        n_big = (others[sel] >= j).sum(axis=1)
        if j == 1:  # singletons share one closed-form factor (1 + wz)^r below; long tails are cheap
            n_big = (others[sel] >= 2).sum(axis=1)
        order = np.argsort(-n_big, kind="stable")
        sel, n_big = sel[order], n_big[order]
        oth = others[sel]
        ties_max = int((oth >= j).sum(axis=1).max(initial=0))  # at most this many others can tie
        dz, dw = kmax - j + 1, min((kmax - j) // j, ties_max) + 1
        poly = np.zeros((sel.size, dz, dw))  # poly[e, a, t] = coefficient of z^a w^t
        poly[:, 0, 0] = 1.0
        for q in range(int(n_big.max(initial=0))):
            L = int((n_big > q).sum())  # a prefix: the prompts whose q-th largest group is big
            P, c = poly[:L], oth[:L, q]
            new = P.copy()
            for x in range(1, min(j, dz)):
                new[:, x:, :] += binom[c, x][:, None, None] * P[:, : dz - x, :]
            if j < dz:
                new[:, j:, 1:] += binom[c, j][:, None, None] * P[:, : dz - j, :-1]
            poly[:L] = new
        if j == 1:
            r1 = (oth == 1).sum(axis=1)
            P = poly.copy()
            for i in range(1, min(dz, dw)):
                poly[:, i:, i:] += binom[r1, i][:, None, None] * P[:, : dz - i, : dw - i]
            filler = n[sel] - m[sel] - oth.sum(axis=1)
        else:
            filler = n[sel] - m[sel] - np.where(oth >= j, oth, 0).sum(axis=1)
        q_z = poly @ (1.0 / np.arange(1, dw + 1))  # tie credit 1/(1+t) folded in
        for a, kk in enumerate(ks):
            if kk < j:
                continue
            d = int(kk) - j
            fill = binom[filler[:, None], d - np.arange(d + 1)]
            total[sel, a] += binom[m[sel], j] * (q_z[:, : d + 1] * fill).sum(axis=1)
    return total / binom[n[:, None], ks[None, :]]


# --------------------------------------------------------------------------------------------- table API


def utilities(table: OutcomeTable, actions: Sequence[int], strategy: str) -> np.ndarray:
    """U[i, a]: expected correctness of prompt i under ``strategy`` with k = actions[a] samples.

    Raises :class:`InputError` for an unknown strategy, an action larger than some prompt's number of
    samples, or best_of on a table without verifier scores.
    """
    if strategy not in STRATEGIES:
        raise InputError(f"unknown strategy {strategy!r}; valid strategies: {', '.join(STRATEGIES)}.")
    ks = _ks(list(actions))
    bad = np.flatnonzero(table.n_samples < ks.max())
    if bad.size:
        i = int(bad[0])
        n_i = int(table.n_samples[i])
        feasible = [int(k) for k in ks if k <= table.n_samples.min()]
        raise InputError(f"action k={int(ks.max())} is infeasible: the table ({table.source}) has only {n_i} "
                         f"samples per prompt for prompt {table.ids[i]!r}. Feasible actions: {feasible or 'none'}; "
                         "drop the larger actions or sample more per prompt.")
    if strategy == "pass":
        return pass_at_k(table.n_samples, table.n_correct, ks)
    if strategy == "majority":
        return majority_at_k(table.answer_codes, table.correct, ks)
    if not table.has_scores:
        i = int(np.flatnonzero((np.isnan(table.scores) & table.mask).any(axis=1))[0])
        raise InputError(f"strategy 'best_of' needs a verifier score on every sample, but prompt "
                         f"{table.ids[i]!r} in {table.source} has samples without 'score'. Score them, or use "
                         "'majority' or 'pass'.")
    return best_of_k(table.scores, table.correct, ks, mask=table.mask)
