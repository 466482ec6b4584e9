"""A table's per-sample evidence for weighted votes, and the k-subsets every vote is scored on.

:func:`evidence` reads, per prompt and sample: the answer class (``answer_codes``: null −1, padding −2),
the *value* of the sample's class — its mean correctness over all of the prompt's samples, what maj@k
credits a winning class with (:mod:`isocompute.solver.estimators`; a null is worth 0) — its completion
tokens, and its confidence when the raw JSON lines carry one of
:data:`~isocompute.solver.votes.weights.CONFIDENCE_FIELDS` on every sample (``confidence_min_window``,
DeepConf's lowest sliding-window confidence, else ``logprob_mean``; the table reader keeps unknown keys
in ``records``).

:func:`draw_subsets` draws, per prompt, ``draws`` uniformly random k-subsets of its samples (seeded;
every subset when all prompts have n samples and C(n, k) ≤ ``exact_limit``, so a small table is scored
exactly). Every vote of a comparison is scored on the same subsets: the same samples are drawn and paid
for, only the vote differs — matched tokens by construction.

Worked example: a prompt with answers a, a, b (a correct), k = 2, exact: the subsets {0,1}, {0,2}, {1,2}
give majority credits 1, ½, ½ → maj@2 = 2/3, as ``majority_at_k``.

Ignores: how a vote weighs the evidence (:mod:`isocompute.solver.votes.weights`) and FLOPs.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from isocompute.errors import InputError
from isocompute.solver.outcomes import OutcomeTable
from isocompute.solver.votes.weights import CONFIDENCE_FIELDS

__all__ = ["Evidence", "Subsets", "draw_subsets", "evidence", "read_confidence"]


@dataclass(frozen=True)
class Evidence:
    """(P, n_max) views of a table for votes (module docstring); ``confidence`` None without one."""

    codes: np.ndarray
    value: np.ndarray
    tokens: np.ndarray
    confidence: np.ndarray | None
    confidence_field: str | None
    n: np.ndarray


def read_confidence(table: OutcomeTable) -> tuple[np.ndarray | None, str | None]:
    """The first of :data:`CONFIDENCE_FIELDS` that every sample of every record carries, as (P, n_max)
    floats (NaN padding), and its name; (None, None) when no field is complete."""
    for name in CONFIDENCE_FIELDS:
        out = np.full(table.mask.shape, np.nan)
        complete = True
        for i, rec in enumerate(table.records):
            vals = [s.get(name) if isinstance(s, dict) else None for s in rec["samples"]]
            if any(type(v) not in (int, float) or not math.isfinite(v) for v in vals):
                complete = False
                break
            out[i, : len(vals)] = vals
        if complete:
            return out, name
    return None, None


def evidence(table: OutcomeTable) -> Evidence:
    """The table's vote evidence (module docstring)."""
    codes = table.answer_codes
    P, n_max = codes.shape
    voting = codes >= 0
    G = int(codes.max()) + 1 if voting.any() else 1
    row = np.broadcast_to(np.arange(P)[:, None], codes.shape)
    key = np.where(voting, row * G + np.maximum(codes, 0), P * G)
    counts = np.bincount(key.ravel(), minlength=P * G + 1)
    right = np.bincount(key.ravel(), weights=np.where(voting, table.correct, 0.0).ravel(), minlength=P * G + 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_class = np.where(counts > 0, right / np.maximum(counts, 1), 0.0)
    value = np.where(voting, per_class[key], 0.0)
    conf, name = read_confidence(table)
    return Evidence(codes=codes, value=value, tokens=table.completion_tokens.astype(np.float64),
                    confidence=conf, confidence_field=name, n=table.n_samples.astype(np.int64))


@dataclass(frozen=True)
class Subsets:
    """``idx[i, m]``: the sample indices of prompt i's m-th subset (k of them); ``exact`` when they are
    every subset (each equally likely) rather than random draws."""

    idx: np.ndarray
    exact: bool

    @property
    def k(self) -> int:
        return int(self.idx.shape[2])


def draw_subsets(n: np.ndarray, k: int, *, draws: int = 256, seed: int = 0, exact_limit: int = 512) -> Subsets:
    """Per prompt with ``n[i]`` samples, its k-subsets (module docstring); InputError when k > some n."""
    n = np.asarray(n, dtype=np.int64)
    if k < 1 or int(n.min()) < k:
        raise InputError(f"weighted votes at k = {k} need k ≥ 1 and at least k samples per prompt; the "
                         f"smallest prompt has {int(n.min())}. Use a smaller k.")
    if int(n.min()) == int(n.max()) and math.comb(int(n[0]), k) <= exact_limit:
        combos = np.asarray(list(itertools.combinations(range(int(n[0])), k)), dtype=np.int64)
        return Subsets(np.broadcast_to(combos, (n.size, *combos.shape)).copy(), exact=True)
    rng = np.random.default_rng(seed)
    n_max = int(n.max())
    out = np.empty((n.size, draws, k), dtype=np.int64)
    for lo in range(0, n.size, 64):  # blocks bound the (rows, draws, n_max) keys to a few MB
        hi = min(lo + 64, n.size)
        keys = rng.random((hi - lo, draws, n_max), dtype=np.float32)
        pad = np.broadcast_to(np.arange(n_max)[None, None, :] >= n[lo:hi, None, None], keys.shape)
        keys[pad] = 2.0  # padding is never drawn
        out[lo:hi] = np.argpartition(keys, k - 1, axis=2)[:, :, :k]
    return Subsets(out, exact=False)
