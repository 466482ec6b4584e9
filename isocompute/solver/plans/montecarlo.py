"""Monte Carlo plan estimates: run each plan on random orders of each prompt's samples.

For every prompt, ``n_orders`` uniformly random orders of its n samples (without replacement, as the
gateway sees them; one seeded generator, so results are reproducible) are drawn; every plan is played
on each order — the rule checked on the vote after each wave, exactly as :meth:`Plan.step` does — and
the per-prompt means over orders estimate utility, samples, waves and channel totals, each with its
standard error s/√R (orders are independent). This is the estimator for plans beyond the exact
lattice (:mod:`isocompute.solver.plans.estimates` uses it for them) and the cross-check of the exact one.

Example: a prompt with answers [a, a, b] (a correct) under ``lead:m=2@1x3``: the orders aab, aba, baa,
… stop after 2 samples when the first two agree (a a: 2 of the 6 orders) and otherwise run to 3,
where a wins 2–1; U = 1, E[samples] = (2·2 + 4·3)/6 = 8/3. 100 orders estimate 8/3 with SE ≈ 0.05.

With ``split=True`` the same orders also give the part of each expectation where the plan's rule fired
(E[X·1{fired}], :attr:`MonteCarloEstimates.fired`), the split a cascade needs; :func:`stop_points` says
where a plan stops on given orders, and why, for callers that combine several models' orders.

Ignored: nothing the exact estimator counts — ties get fractional credit, nulls never vote.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from isocompute.solver.plans.plan import Plan
from isocompute.solver.plans.rules import VoteStates, stops_unique


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
    fired: MonteCarloEstimates | None = None  # E[X·1{the rule fired}], ``utility`` … ``channels`` alike
    fired_prob: np.ndarray | None = None  # (N, P) P(the rule fired)
    fired_prob_se: np.ndarray | None = None


def simulate_plans(labels: np.ndarray, values: np.ndarray, channels: np.ndarray, plans: Sequence[Plan], *,
                   n_orders: int, seed: int, chunk: int = 512, split: bool = False) -> MonteCarloEstimates:
    """``labels`` (N, n_max): class index ≥ 0, −1 null, −2 padding; ``values`` (N, G) per-class
    value; ``channels`` (N, n_max, C) per-sample channel values. ``split``: also the fired part."""
    N, n_max = labels.shape
    C = channels.shape[2]
    P = len(plans)
    rng = np.random.default_rng(seed)
    keys_out = ("u", "s", "w", "ch") + (("fu", "fs", "fw", "fch", "f") if split else ())
    sums = {k: np.zeros((N, P, C) if k.endswith("ch") else (N, P)) for k in keys_out}
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
        prefix = prefix_states(seq, vals, k_max)
        for j, plan in enumerate(plans):
            res = _play(plan, prefix, chan, split)
            for key, x in res.items():
                x = x.reshape((hi - lo, n_orders) + x.shape[1:])
                sums[key][lo:hi, j] = x.mean(axis=1)
                sq[key][lo:hi, j] = x.std(axis=1, ddof=1) / np.sqrt(n_orders) if n_orders > 1 else np.nan
    fired = MonteCarloEstimates(
        utility=sums["fu"], samples=sums["fs"], waves=sums["fw"], channels=sums["fch"], utility_se=sq["fu"],
        samples_se=sq["fs"], waves_se=sq["fw"], channels_se=sq["fch"]) if split else None
    return MonteCarloEstimates(utility=sums["u"], samples=sums["s"], waves=sums["w"], channels=sums["ch"],
                               utility_se=sq["u"], samples_se=sq["s"], waves_se=sq["w"], channels_se=sq["ch"],
                               fired=fired, fired_prob=sums["f"] if split else None,
                               fired_prob_se=sq["f"] if split else None)


@dataclass(frozen=True, eq=False)
class Prefix:
    """Per row and prefix length t = 1..k: the vote (sorted counts), the run, and the majority credit."""

    counts: list[np.ndarray]  # [t] (rows, G) sorted descending
    run: np.ndarray  # (rows, k+1)
    credit: np.ndarray  # (rows, k+1)


def prefix_states(seq: np.ndarray, vals: np.ndarray, k: int) -> Prefix:
    """Vote states after each prefix t = 1..k of ``seq`` (rows, ≥ k) labels (class index < G, −1 null),
    with ``vals`` (rows, G) the classes' values for the majority credit."""
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
    return Prefix(counts=sorted_counts, run=run, credit=credit)


@dataclass(frozen=True, eq=False)
class StopPoints:
    """Where a plan stopped on each row's order: ``samples`` drawn, ``waves`` (requests), and whether
    its rule ``fired`` (False: it ran out after its last wave)."""

    samples: np.ndarray
    waves: np.ndarray
    fired: np.ndarray


def stop_points(plan: Plan, prefix: Prefix, *, check_last: bool = True) -> StopPoints:
    """Play ``plan`` on the orders behind ``prefix`` (:func:`prefix_states`). With ``check_last=False``
    the rule is not evaluated after the last wave (``fired`` is then False there, as if it ran out)."""
    rows = prefix.run.shape[0]
    alive = np.ones(rows, dtype=bool)
    out = StopPoints(np.zeros(rows, np.int64), np.zeros(rows, np.int64), np.zeros(rows, bool))
    bounds = plan.boundaries
    for wave, K in enumerate(bounds, start=1):
        last = wave == len(bounds)
        fire = np.zeros(rows, dtype=bool)
        if not last or check_last:
            idx = np.flatnonzero(alive)
            fire[idx] = stops_unique(plan.rule, VoteStates(counts=prefix.counts[K][idx], run=prefix.run[idx, K],
                                                            samples=np.full(idx.size, K)))
        stop = alive.copy() if last else fire
        out.fired[fire] = True
        out.samples[stop] = K
        out.waves[stop] = wave
        alive &= ~stop
    return out


def _play(plan: Plan, prefix: Prefix, chan: np.ndarray, split: bool) -> dict[str, np.ndarray]:
    rows = chan.shape[0]
    at = stop_points(plan, prefix, check_last=split)
    r = np.arange(rows)
    out = {"u": prefix.credit[r, at.samples], "s": at.samples.astype(np.float64), "w": at.waves.astype(np.float64),
           "ch": chan[r, at.samples - 1]}
    if split:
        f = at.fired.astype(np.float64)
        out.update(fu=out["u"] * f, fs=out["s"] * f, fw=out["w"] * f, fch=out["ch"] * f[:, None], f=f)
    return out
