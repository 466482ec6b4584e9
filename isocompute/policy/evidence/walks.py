"""Finish sequences of a parallel-stop schedule, drawn from a prompt's own samples: the check points an
evidence-aware plan decides at, with what is known and what has been spent at each.

The model is the solver's (:mod:`isocompute.solver.plans.waves`): a uniformly random order of the prompt's
samples (without replacement) fills the waves in turn; inside each parallel-stop wave the samples finish
in length order (ties in the random order's order, i.e. uniformly at random). A *check point* is each
finish: the t-th finish (t = 0 … M − 1, M = the schedule's samples) of wave ``wave[t]``, with ``running[t]``
samples of that wave still decoding. What the runner has then — and what :func:`walk` returns per draw
and check point — in units of the model's typical length ``unit`` (the training table's median sample
length), with b the samples started by the end of the current wave and L_s the s-th finisher's length:

    tokens[t]   Σ_{s ≤ t} L_s + (b − t − 1) · L_t      (lock-step: a running sample has generated L_t)
    latency[t]  Σ_{earlier waves} max L + L_t
    utility[t]  majority credit of the t + 1 finished samples (ties split, nulls never vote)

so stopping at t costs ``tokens[t]`` and answers after ``latency[t]``, exactly as the solver prices a
plan that stops there. Draws are seeded; each prompt gets ``draws`` of them.

Worked example: samples (a, 300), (b, 120), (a, 200), (a, 900) of a correct a, schedule ``4s``, unit 100:
the finish order is b, a, a, a; tokens = (4·1.2, 1.2 + 2 + 2·2, 1.2 + 2 + 3 + 3, 1.2 + 2 + 3 + 9) = (4.8,
7.2, 9.2, 15.2), latency (1.2, 2, 3, 9), utility (0, ½, 1, 1).

Ignores: waiting waves (an evidence plan's waves are parallel-stop: the evidence is the finish order) and
samples without a length (the table needs ``completion_tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from isocompute.errors import InputError

__all__ = ["Walks", "walk"]

NULL = -1


@dataclass(frozen=True, eq=False)
class Walks:
    """``draws`` finish sequences per prompt, stacked: rows ``prompt[d]``; per check point t (columns)
    the finisher's class ``codes`` (−1 null), ``correct``, ``lengths`` (in ``unit``), the vote's
    ``utility``, ``tokens`` and ``latency`` so far; per column its ``wave`` and ``running`` (module
    docstring); ``order`` the finishers' sample indices. ``class_correct[d, g]`` says whether class g of row d's prompt is right."""

    prompt: np.ndarray  # (D,)
    order: np.ndarray  # (D, M) the finisher's index among its prompt's samples
    codes: np.ndarray  # (D, M)
    correct: np.ndarray  # (D, M)
    lengths: np.ndarray  # (D, M)
    utility: np.ndarray  # (D, M)
    tokens: np.ndarray  # (D, M)
    latency: np.ndarray  # (D, M)
    wave: np.ndarray  # (M,)
    running: np.ndarray  # (M,)
    class_correct: np.ndarray  # (D, G)
    unit: float

    @property
    def n_checks(self) -> int:
        return self.codes.shape[1]

    def counts(self) -> np.ndarray:
        """(D, M, G) votes per class after each check point (nulls not counted)."""
        G = self.class_correct.shape[1]
        onehot = (self.codes[:, :, None] == np.arange(G)[None, None, :])
        return np.cumsum(onehot, axis=1, dtype=np.int32)


def _check(codes: np.ndarray, lengths: np.ndarray, n_samples: np.ndarray, waves: tuple[int, ...]) -> None:
    if codes.shape != lengths.shape or codes.ndim != 2:
        raise InputError(f"answer codes and lengths must be (prompts, samples) arrays of one shape; got "
                         f"{codes.shape} and {lengths.shape}.")
    M = sum(waves)
    short = np.flatnonzero(n_samples < M)
    if short.size:
        raise InputError(f"an evidence plan of {M} samples needs at least {M} samples per prompt; prompt "
                         f"{int(short[0])} has {int(n_samples[short[0]])} (use a shorter schedule).")
    valid = np.arange(codes.shape[1])[None, :] < n_samples[:, None]
    if np.isnan(np.where(valid, lengths, 0.0)).any():
        raise InputError("evidence plans need every sample's completion_tokens; the table lacks some.")


def walk(codes: np.ndarray, correct: np.ndarray, lengths: np.ndarray, n_samples: np.ndarray,
         waves: tuple[int, ...], *, unit: float, draws: int, seed: int) -> Walks:
    """``draws`` seeded finish sequences per prompt of the parallel-stop schedule ``waves`` (module
    docstring). ``codes`` (N, n): dense answer codes, −1 null, anything < −1 padding."""
    codes, lengths = np.asarray(codes), np.asarray(lengths, dtype=np.float64)
    n_samples = np.asarray(n_samples)
    _check(codes, lengths, n_samples, waves)
    N, n = codes.shape
    M = sum(waves)
    rng = np.random.default_rng(seed)
    prompt = np.repeat(np.arange(N), draws)
    keys = rng.random((N * draws, n))
    keys[np.arange(n)[None, :] >= n_samples[prompt][:, None]] = np.inf
    order = np.argsort(keys, axis=1, kind="stable")[:, :M]
    L = lengths[prompt[:, None], order] / unit
    bounds = np.cumsum((0,) + waves)
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        inner = np.argsort(L[:, a:b], axis=1, kind="stable")
        order[:, a:b] = np.take_along_axis(order[:, a:b], inner, axis=1)
        L[:, a:b] = np.take_along_axis(L[:, a:b], inner, axis=1)
    c = codes[prompt[:, None], order]
    y = np.asarray(correct)[prompt[:, None], order]
    wave = np.repeat(np.arange(len(waves)), waves)
    running = bounds[wave + 1] - np.arange(M) - 1
    G = max(int(codes.max(initial=-1)) + 1, 1)
    class_correct = np.zeros((N, G))  # a class's value: 0/1 under gold, consensus credit under consensus
    rows, cols = np.nonzero(codes >= 0)
    np.maximum.at(class_correct, (rows, codes[rows, cols]), np.asarray(correct, dtype=np.float64)[rows, cols])
    cc = class_correct[prompt]
    tokens, latency = _spend(L, waves, running)
    out = Walks(prompt, order, c, y, L, np.zeros_like(L), tokens, latency, wave, running, cc, float(unit))
    object.__setattr__(out, "utility", credit(out.counts(), cc))
    return out


def _spend(L: np.ndarray, waves: tuple[int, ...], running: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Tokens generated and latency at each check point (module docstring)."""
    tokens = np.cumsum(L, axis=1) + running[None, :] * L
    latency = L.copy()
    bounds = np.cumsum((0,) + waves)
    done = np.zeros(L.shape[0])
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        latency[:, a:b] += done[:, None]
        done = done + L[:, b - 1]  # a wave's last finisher is its longest sample
    return tokens, latency


def credit(counts: np.ndarray, class_correct: np.ndarray) -> np.ndarray:
    """Majority credit of each vote: the share of right classes among the leaders (0 before any vote)."""
    top = counts.max(axis=-1, keepdims=True)
    leaders = (counts == top) & (top > 0)
    right = (leaders * class_correct[:, None, :]).sum(axis=-1)
    n = leaders.sum(axis=-1)
    return np.where(n > 0, right / np.maximum(n, 1), 0.0)
