"""Monte Carlo plan estimates: run each plan on random orders of each prompt's samples.

For every prompt, ``n_orders`` uniformly random orders of its n samples (without replacement, as the
gateway sees them; one seeded generator, so results are reproducible) are drawn; every plan is played
on each order — the rule checked on the vote after each wave, exactly as :meth:`Plan.step` does — and
the per-prompt means over orders estimate utility, samples, waves and channel totals, each with its
standard error s/√R (orders are independent). This is the estimator for plans beyond the exact
lattice (:mod:`isocompute.solver.plan_estimates` uses it for them) and the cross-check of the exact one.

Example: a prompt with answers [a, a, b] (a correct) under ``lead:m=2@1x3``: the orders aab, aba, baa,
… stop after 2 samples when the first two agree (a a: 2 of the 6 orders) and otherwise run to 3,
where a wins 2–1; U = 1, E[samples] = (2·2 + 4·3)/6 = 8/3. 100 orders estimate 8/3 with SE ≈ 0.05.

Ignored: nothing the exact estimator counts — ties get fractional credit, nulls never vote.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from isocompute.solver.plans import Plan
from isocompute.solver.rules import VoteStates, stops_unique


@dataclass(frozen=True, eq=False)
class MonteCarloEstimates:
    """Per-prompt means and standard errors, each (N, P); ``channels`` (N, P, C)."""

    utility: np.ndarray
    samples: np.ndarray
    waves: np.ndarray
    channels: np.ndarray
    utility_se: np.ndarray
    samples_se: np.ndarray
    waves_se: np.ndarray
    channels_se: np.ndarray


def simulate_plans(labels: np.ndarray, values: np.ndarray, channels: np.ndarray, plans: Sequence[Plan], *,
                   n_orders: int, seed: int, chunk: int = 512) -> MonteCarloEstimates:
    """``labels`` (N, n_max): class index ≥ 0, −1 null, −2 padding; ``values`` (N, G) per-class
    value; ``channels`` (N, n_max, C) per-sample channel values."""
    N, n_max = labels.shape
    C = channels.shape[2]
    P = len(plans)
    rng = np.random.default_rng(seed)
    sums = {k: np.zeros((N, P) if k != "ch" else (N, P, C)) for k in ("u", "s", "w", "ch")}
    sq = {k: np.zeros_like(v) for k, v in sums.items()}
    k_max = max(p.max_samples for p in plans)
    for lo in range(0, N, chunk):
        hi = min(lo + chunk, N)
        keys = rng.random((hi - lo, n_orders, n_max))
        keys[np.broadcast_to((labels[lo:hi] == -2)[:, None, :], keys.shape)] = np.inf
        order = np.argsort(keys, axis=2)[:, :, :k_max]
        rows = np.arange(hi - lo)[:, None, None]
        seq = labels[lo:hi][rows, order].reshape(-1, k_max)  # ((hi-lo)·R, k_max)
        chan = np.cumsum(channels[lo:hi][rows, order].reshape((hi - lo) * n_orders, k_max, C), axis=1)
        vals = np.repeat(values[lo:hi], n_orders, axis=0)
        prefix = _prefix_states(seq, vals, k_max)
        for j, plan in enumerate(plans):
            res = _play(plan, prefix, chan)
            for key, x in res.items():
                x = x.reshape((hi - lo, n_orders) + x.shape[1:])
                sums[key][lo:hi, j] = x.mean(axis=1)
                sq[key][lo:hi, j] = x.std(axis=1, ddof=1) / np.sqrt(n_orders) if n_orders > 1 else np.nan
    return MonteCarloEstimates(utility=sums["u"], samples=sums["s"], waves=sums["w"], channels=sums["ch"],
                               utility_se=sq["u"], samples_se=sq["s"], waves_se=sq["w"], channels_se=sq["ch"])


@dataclass(frozen=True, eq=False)
class _Prefix:
    """Per row and prefix length t = 1..k: the vote (sorted counts), the run, and the majority credit."""

    counts: list[np.ndarray]  # [t] (rows, G) sorted descending
    run: np.ndarray  # (rows, k+1)
    credit: np.ndarray  # (rows, k+1)


def _prefix_states(seq: np.ndarray, vals: np.ndarray, k: int) -> _Prefix:
    rows, G = seq.shape[0], vals.shape[1]
    counts = np.zeros((rows, G), dtype=np.int64)
    run = np.zeros((rows, k + 1), dtype=np.int64)
    credit = np.zeros((rows, k + 1))
    sorted_counts: list[np.ndarray] = [np.zeros((rows, 1), dtype=np.int64)]
    r = np.arange(rows)
    for t in range(1, k + 1):
        lab = seq[:, t - 1]
        voting = lab >= 0
        counts[r[voting], lab[voting]] += 1
        same = voting & (t > 1) & (lab == seq[:, t - 2]) if t > 1 else np.zeros(rows, bool)
        run[:, t] = np.where(same, run[:, t - 1] + 1, voting.astype(np.int64))
        top = counts.max(axis=1)
        at_top = (counts == top[:, None]) & (top[:, None] > 0)
        n_top = at_top.sum(axis=1)
        credit[:, t] = np.where(n_top > 0, (at_top * vals).sum(axis=1) / np.maximum(n_top, 1), 0.0)
        sorted_counts.append(-np.sort(-counts, axis=1))
    return _Prefix(counts=sorted_counts, run=run, credit=credit)


def _play(plan: Plan, prefix: _Prefix, chan: np.ndarray) -> dict[str, np.ndarray]:
    rows = chan.shape[0]
    alive = np.ones(rows, dtype=bool)
    out = {"u": np.zeros(rows), "s": np.zeros(rows), "w": np.zeros(rows), "ch": np.zeros((rows, chan.shape[2]))}
    bounds = plan.boundaries
    for wave, K in enumerate(bounds, start=1):
        if wave < len(bounds):
            idx = np.flatnonzero(alive)
            states = VoteStates(counts=prefix.counts[K][idx], run=prefix.run[idx, K])
            stop = np.zeros(rows, dtype=bool)
            stop[idx] = stops_unique(plan.rule, states)
        else:
            stop = alive.copy()
        out["u"][stop] = prefix.credit[stop, K]
        out["s"][stop] = K
        out["w"][stop] = wave
        out["ch"][stop] = chan[stop, K - 1]
        alive &= ~stop
    return out
