"""Scoring votes on drawn subsets: each subset's credit under a weighted vote, optionally after DeepConf's filter.

:func:`vote_credits` gives, per prompt and subset, the credit of the vote over the subset's samples —
the winning class's value, shared 1/t among t tied classes, 0 when no sample votes — vectorised over all
prompts and subsets (no per-subset Python), the rule of :func:`isocompute.solver.votes.weights.weighted_vote`.
With log-weights ``None`` it is plain majority; averaged over every subset it equals ``majority_at_k``
(tests).

DeepConf's offline filter (Fu et al. 2025, "Deep Think with Confidence"): of the k samples drawn, keep those
whose confidence is at least the (100 − η)-th percentile of the k (numpy's linear interpolation, as the
authors' ``np.percentile``), i.e. the top k − ⌈(100 − η)/100 · (k − 1)⌉, then vote among them. η = 10 keeps
the single most confident of up to 10 samples, η = 90 drops the least confident one of 2–11. Equal confidences
are ranked by their position in the subset (random, since subsets are drawn at random). Filtered samples
are drawn and paid for: the tokens are those of the subset. :func:`filter_keep` is that count.

Worked example: classes [0, 0, 1, 1] with values [1, 1, 0, 0] (class 0 right): plain majority ties, credit
½; with weights [1, 1, 3, 1] class 1 wins, credit 0; keeping η = 10 (the top 1) of confidences
[0.9, 0.1, 0.2, 0.3] votes class 0 alone, credit 1.

Ignores: which weights or η to use (:mod:`isocompute.solver.votes.fit`).
"""

from __future__ import annotations

import math

import numpy as np

from isocompute.solver.votes.evidence import Evidence, Subsets
from isocompute.solver.votes.weights import TIE_RTOL

__all__ = ["filter_keep", "gather", "vote_credits"]

_BLOCK = 32  # prompts per block: bounds the (rows, draws, k, k) comparison arrays


def filter_keep(k: int, eta: float) -> int:
    """How many of k samples DeepConf's η% filter keeps (module docstring)."""
    return k - math.ceil(round((100.0 - eta) / 100.0 * (k - 1), 12))


def gather(x: np.ndarray, sub: Subsets) -> np.ndarray:
    """(P, M, k): the per-sample (P, n_max) array ``x`` at the subsets' samples."""
    P, M, k = sub.idx.shape
    return np.take_along_axis(x, sub.idx.reshape(P, M * k), axis=1).reshape(P, M, k)


def _block_credits(codes: np.ndarray, value: np.ndarray, lw: np.ndarray | None, keep: np.ndarray) -> np.ndarray:
    """(B, M) credits of the subsets of a block (module docstring)."""
    voting = (codes >= 0) & keep
    if lw is None:
        w = voting.astype(np.float64)
    else:
        lw = np.where(voting, lw, -np.inf)
        top_lw = lw.max(axis=2, keepdims=True)
        w = np.where(voting, np.exp(lw - np.where(np.isfinite(top_lw), top_lw, 0.0)), 0.0)
    eq = (codes[..., :, None] == codes[..., None, :]) & voting[..., None, :]
    score = np.einsum("bmjl,bml->bmj", eq, w)
    top = np.where(voting, score, -np.inf).max(axis=2, keepdims=True)
    is_top = voting & (score >= top - TIE_RTOL * np.abs(top))
    k = codes.shape[2]
    earlier = np.tril(np.ones((k, k), dtype=bool), -1)  # [j, l]: l < j
    first = voting & ~(eq & earlier).any(axis=3)
    win = is_top & first
    t = win.sum(axis=2)
    return np.where(t > 0, (win * value).sum(axis=2) / np.maximum(t, 1), 0.0)


def vote_credits(ev: Evidence, sub: Subsets, log_w: np.ndarray | None = None, *, eta: float | None = None,
                 filter_by: np.ndarray | None = None) -> np.ndarray:
    """(P, M) credit of each subset's vote: weights exp(``log_w``) per sample ((P, n_max), None: plain
    majority), after keeping the top η% of each subset by ``filter_by`` ((P, n_max), higher kept) when
    ``eta`` is given."""
    codes, value = gather(ev.codes, sub), gather(ev.value, sub)
    lw = None if log_w is None else gather(log_w, sub)
    keep = np.ones(codes.shape, dtype=bool)
    if eta is not None and eta < 100:
        if filter_by is None:
            raise ValueError("the DeepConf filter needs per-sample confidence (filter_by)")
        by = gather(filter_by, sub)
        order = np.argsort(-by, axis=2, kind="stable")
        rank = np.argsort(order, axis=2, kind="stable")
        keep = rank < filter_keep(sub.k, eta)
    P, M = codes.shape[:2]
    out = np.empty((P, M))
    for lo in range(0, P, _BLOCK):
        s = slice(lo, lo + _BLOCK)
        out[s] = _block_credits(codes[s], value[s], None if lw is None else lw[s], keep[s])
    return out
