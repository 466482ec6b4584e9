"""Monte Carlo over sample orders and finish orders: plans that stop mid-wave, and every plan's tokens
generated and latency.

The model. A uniformly random order of a prompt's n samples (without replacement; one seeded generator)
fills the waves in turn. Inside a parallel-stop wave the samples are re-sorted by length (completion
tokens), stably — so samples of equal length finish in the order the random order gave them, which is
uniformly random: ties are broken uniformly at random. The finish sequence is the waves' samples in
turn, each parallel-stop wave in length order, each waiting wave in the random order. The rule is
checked at every finish of a parallel-stop wave and at the end of a waiting wave, on the vote of
everything finished so far. Where it first fires, at the t-th finish, in wave l (or where the plan runs
out: t = its last sample), with b_l the samples of waves 1…l and L_t the t-th finisher's length:

    utility   majority credit of the t finished samples (ties split, nulls never vote)
    samples   b_l — the samples started (every sample of a started wave)
    waves     l
    channels  the channel totals of the t finished samples
    tokens    Σ_{s ≤ t} L_s + (b_l − t) · L_t        (in lock-step, an aborted sample generated L_t tokens:
                                                     it is at least as long as the last finisher)
    latency   Σ_{l' < l} max_{W_l'} L + (L_t if wave l is parallel-stop, else max_{W_l} L)

A waiting wave is checked only at its end, so t = b_l there and the two latency terms agree with "the
longest sample of the wave". Per order and plan the engine also returns ``gap`` = tokens − latency −
(Σ_{W₁} L − max_{W₁} L) — zero for plans of single-sample waves after the first, the control variate
:mod:`~isocompute.solver.plans.latency` uses to price waiting plans' latency from their exact tokens.

Vote bookkeeping costs O(1) per order and finish: the vote type (the partition of the counts) moves
along the lattice's edges (:mod:`~isocompute.solver.plans.vote_lattice`: one part c → c + 1), the rule's
decision is a table over types (× run, × samples finished) computed once per rule, and the majority
credit follows the leading count (a class reaching it joins the leaders, one passing it leads alone).
Plans beyond :data:`LATTICE_MAX` samples sort the counts instead (:func:`montecarlo.prefix_states`).
Means over ``n_orders`` orders per prompt, standard errors s/√R.

Worked example: samples (answer, length) (a, 300), (b, 120), (a, 200), (a, 900) under ``lead:m=1@4s``:
every order finishes b first, the lead is 1, the rule fires: utility = [b correct], samples 4, tokens
4 · 120, latency 120 — in every order, so the standard errors are 0.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from isocompute.solver.plans.montecarlo import Prefix, prefix_states
from isocompute.solver.plans.plan import Plan
from isocompute.solver.plans.rules import StoppingRule, VoteStates, stops_unique
from isocompute.solver.plans.vote_lattice import partitions

LATTICE_MAX = 24
KEYS = ("u", "s", "w", "ch", "gen", "lat", "gap")
FIRED_KEYS = ("f", "fu", "fs", "fw", "fch", "fgen", "flat", "fdef")  # E[X·1{fired}]; fdef: (tokens − latency)·1{fired}


@dataclass(frozen=True, eq=False)
class WaveEstimates:
    """Per-prompt means over orders and their standard errors: ``mean[key]`` (N, P), (N, P, C) for the
    channels ``"ch"``/``"fch"``; keys :data:`KEYS` (and :data:`FIRED_KEYS` with ``split``)."""

    mean: dict[str, np.ndarray]
    se: dict[str, np.ndarray]


def random_orders(labels: np.ndarray, k: int, n_orders: int, rng: np.random.Generator) -> np.ndarray:
    """(N, n_orders, k): the first k samples of uniformly random orders of each row's real samples
    (``labels`` −2 marks padding, never drawn)."""
    keys = rng.random((labels.shape[0], n_orders, labels.shape[1]))
    keys[np.broadcast_to((labels == -2)[:, None, :], keys.shape)] = np.inf
    return np.argsort(keys, axis=2)[:, :, :k]


def simulate_waves(labels: np.ndarray, values: np.ndarray, lengths: np.ndarray, channels: np.ndarray,
                   plans: Sequence[Plan], *, n_orders: int = 100, seed: int = 0, chunk: int = 512,
                   split: bool = False, orders: np.ndarray | None = None) -> WaveEstimates:
    """``labels`` (N, n_max) class index ≥ 0, −1 null, −2 padding; ``values`` (N, G) per-class value;
    ``lengths`` (N, n_max) completion tokens; ``channels`` (N, n_max, C). ``orders`` (N, R, ≥ k): given
    sample orders instead of random ones (e.g. all permutations, for an exact average)."""
    N, P, C = labels.shape[0], len(plans), channels.shape[2]
    k = max(p.max_samples for p in plans)
    rng = np.random.default_rng(seed)
    keys = KEYS + (FIRED_KEYS if split else ())
    mean = {key: np.zeros((N, P, C) if key.endswith("ch") else (N, P)) for key in keys}
    se = {key: np.zeros_like(v) for key, v in mean.items()}
    for lo in range(0, N, chunk):
        hi = min(lo + chunk, N)
        o = orders[lo:hi] if orders is not None else random_orders(labels[lo:hi], k, n_orders, rng)
        R = o.shape[1]
        per_order = play_orders(labels[lo:hi], values[lo:hi], lengths[lo:hi], channels[lo:hi], plans, o, split)
        for key, x in per_order.items():  # (rows, P[, C]) → per-prompt means and standard errors
            x = x.reshape((hi - lo, R) + x.shape[1:])
            mean[key][lo:hi] = x.mean(axis=1)
            se[key][lo:hi] = x.std(axis=1, ddof=1) / np.sqrt(R) if R > 1 else np.nan
    return WaveEstimates(mean=mean, se=se)


def play_orders(labels: np.ndarray, values: np.ndarray, lengths: np.ndarray, channels: np.ndarray,
                plans: Sequence[Plan], orders: np.ndarray, split: bool) -> dict[str, np.ndarray]:
    """Per order (N·R rows, prompt-major) and plan: the values of :data:`KEYS` (and
    :data:`FIRED_KEYS`) where the plan stops on that order."""
    N, R = orders.shape[:2]
    rows, P, C = N * R, len(plans), channels.shape[2]
    k = max(p.max_samples for p in plans)
    keys = KEYS + (FIRED_KEYS if split else ())
    out = {key: np.zeros((rows, P, C) if key.endswith("ch") else (rows, P)) for key in keys}
    lattice_k = k if k <= LATTICE_MAX else None
    schedules = itertools.groupby(sorted(range(P), key=lambda j: (plans[j].waves, plans[j].modes)),
                                  key=lambda j: (plans[j].waves, plans[j].modes))
    for (waves, modes), group in schedules:
        walk = _walk(labels, values, lengths, channels, orders, Plan(waves, modes=modes), lattice_k)
        r = np.arange(rows)
        for j in group:
            at, fired = _stops(plans[j].rule, walk, lattice_k)
            u, ch = walk.credit[r, at], walk.cumch[r, at]
            gen, lat = walk.tokens[r, at], walk.latency[r, at]
            vals = {"u": u, "s": walk.bound_of[at], "w": walk.wave_of[at], "ch": ch, "gen": gen, "lat": lat,
                    "gap": gen - lat - walk.first_gap}
            if split:
                f = fired.astype(np.float64)
                vals.update(f=f, fu=u * f, fs=vals["s"] * f, fw=vals["w"] * f, fch=ch * f[:, None],
                            fgen=gen * f, flat=lat * f, fdef=(gen - lat) * f)
            for key, x in vals.items():
                out[key][:, j] = x
    return out


@dataclass(frozen=True, eq=False)
class _Walk:
    """One schedule played on every order: per row and finish t = 0…K, the vote type ``lam`` (lattice
    index; None beyond :data:`LATTICE_MAX`, then ``prefix`` holds the sorted counts), the ``run``, the
    majority ``credit``, channel totals ``cumch``, and ``tokens``/``latency`` if the plan stopped at t;
    per t: ``check`` (the rule is looked at), ``wave_of``, ``bound_of`` (samples started)."""

    lam: np.ndarray | None
    prefix: Prefix | None
    run: np.ndarray
    credit: np.ndarray
    cumch: np.ndarray
    tokens: np.ndarray
    latency: np.ndarray
    first_gap: np.ndarray
    check: np.ndarray
    wave_of: np.ndarray
    bound_of: np.ndarray


def _walk(labels: np.ndarray, values: np.ndarray, lengths: np.ndarray, channels: np.ndarray,
          orders: np.ndarray, schedule: Plan, lattice_k: int | None) -> _Walk:
    N, R = orders.shape[:2]
    K = schedule.max_samples
    idx = orders[:, :, :K].copy()
    prompt = np.arange(N)[:, None, None]
    L = lengths[prompt, idx]
    lo = 0
    for w, par in zip(schedule.waves, schedule.parallel, strict=True):
        if par and w > 1:  # finish in length order; the stable sort keeps the random order among ties
            perm = np.argsort(L[:, :, lo:lo + w], axis=2, kind="stable")
            idx[:, :, lo:lo + w] = np.take_along_axis(idx[:, :, lo:lo + w], perm, 2)
            L[:, :, lo:lo + w] = np.take_along_axis(L[:, :, lo:lo + w], perm, 2)
        lo += w
    rows = N * R
    seq = labels[prompt, idx].reshape(rows, K)
    L = L.reshape(rows, K)
    cumch = np.zeros((rows, K + 1, channels.shape[2]))
    cumch[:, 1:] = np.cumsum(channels[prompt, idx].reshape(rows, K, -1), axis=1)
    cumlen = np.zeros((rows, K + 1))
    cumlen[:, 1:] = np.cumsum(L, axis=1)
    tokens, latency = np.zeros((rows, K + 1)), np.zeros((rows, K + 1))
    check = np.zeros(K + 1, dtype=bool)
    wave_of, bound_of = np.zeros(K + 1), np.zeros(K + 1)
    before, lo = np.zeros(rows), 0
    for wave, (w, par) in enumerate(zip(schedule.waves, schedule.parallel, strict=True), start=1):
        hi = lo + w
        top = L[:, lo:hi].max(axis=1)
        t = np.arange(lo + 1, hi + 1)
        tokens[:, lo + 1:hi + 1] = cumlen[:, lo + 1:hi + 1] + (hi - t)[None, :] * L[:, lo:hi]
        latency[:, lo + 1:hi + 1] = before[:, None] + (L[:, lo:hi] if par else top[:, None])
        check[lo + 1:hi + 1] = par
        check[hi] = True
        wave_of[lo + 1:hi + 1], bound_of[lo + 1:hi + 1] = wave, hi
        before = before + top
        lo = hi
    b1 = schedule.waves[0]
    first_gap = cumlen[:, b1] - L[:, :b1].max(axis=1)
    if lattice_k is None:
        prefix = prefix_states(seq, np.repeat(values, R, axis=0), K)
        return _Walk(None, prefix, prefix.run, prefix.credit, cumch, tokens, latency, first_gap, check, wave_of,
                     bound_of)
    lam, run, credit = _votes(seq, values, R, K, lattice_k)
    return _Walk(lam, None, run, credit, cumch, tokens, latency, first_gap, check, wave_of, bound_of)


def _votes(seq: np.ndarray, values: np.ndarray, R: int, K: int, lattice_k: int) -> tuple[np.ndarray, ...]:
    """Per row and t = 0…K: the vote type's lattice index, the run, the majority credit (module doc)."""
    rows, G = seq.shape[0], values.shape[1]
    raise_part = _raise_table(lattice_k)
    counts = np.zeros(rows * G, dtype=np.int32)
    row_base = np.arange(rows) * G
    val_base = np.repeat(np.arange(values.shape[0]) * G, R)
    flat_vals = values.ravel()
    lam = np.zeros((rows, K + 1), dtype=np.int32)
    run = np.zeros((rows, K + 1), dtype=np.int32)
    credit = np.zeros((rows, K + 1))
    lead = np.zeros(rows, dtype=np.int32)  # the leading count, how many classes hold it, their values' sum
    n_top = np.zeros(rows, dtype=np.int32)
    top_sum = np.zeros(rows)
    cur_lam = np.zeros(rows, dtype=np.int32)
    cur_run = np.zeros(rows, dtype=np.int32)
    prev = np.full(rows, -1)
    for t in range(1, K + 1):
        lab = seq[:, t - 1]
        vote = lab >= 0
        g = np.where(vote, lab, 0)
        c = counts[row_base + g]
        cur_lam = np.where(vote, raise_part[cur_lam, c], cur_lam)
        counts[row_base + g] = c + vote
        v = flat_vals[val_base + g]
        alone = vote & (c + 1 > lead)
        joins = vote & (c + 1 == lead)
        lead = np.where(alone, c + 1, lead)
        n_top = np.where(alone, 1, n_top + joins)
        top_sum = np.where(alone, v, top_sum + joins * v)
        credit[:, t] = np.where(n_top > 0, top_sum / np.maximum(n_top, 1), 0.0)
        cur_run = np.where(vote, np.where(lab == prev, cur_run + 1, 1), 0)
        prev = lab
        lam[:, t], run[:, t] = cur_lam, cur_run
    return lam, run, credit


@functools.lru_cache(maxsize=4)
def _raise_table(k: int) -> np.ndarray:
    """(P, k+1): the lattice index of λ with one part c raised to c + 1 (c = 0: a new part 1); −1 past k."""
    lattice = partitions(k)
    out = np.full((len(lattice), k + 1), -1, dtype=np.int32)
    for p in range(1, k + 1):
        out[lattice.dec_src[p], p - 1] = lattice.dec_dst[p]
    return out


@functools.lru_cache(maxsize=256)
def _rule_table(rule: StoppingRule, k: int) -> np.ndarray:
    """The rule's decision on every vote type of the lattice of k, flattened over (type, run, samples):
    run only for rules that read it (0…run_cap), samples only for rules that read them (0…k)."""
    lattice = partitions(k)
    P = len(lattice)
    n_run = rule.run_cap + 1 if rule.uses_run else 1
    n_t = k + 1 if rule.uses_samples else 1
    lam, run, t = (a.ravel() for a in np.meshgrid(np.arange(P), np.arange(n_run), np.arange(n_t), indexing="ij"))
    states = VoteStates(counts=lattice.parts[lam, : max(rule.width, 1)], run=run, samples=t)
    out = stops_unique(rule, states)
    out.setflags(write=False)
    return out


def _stops(rule: StoppingRule, walk: _Walk, lattice_k: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(rows,) the finish at which the plan stops and whether its rule fired there."""
    rows, K1 = walk.run.shape
    t = np.arange(K1)
    if walk.lam is not None and lattice_k is not None:
        index = walk.lam
        if rule.uses_run:
            index = index * (rule.run_cap + 1) + np.minimum(walk.run, rule.run_cap)
        if rule.uses_samples:
            index = index * (lattice_k + 1) + t[None, :]
        fire = _rule_table(rule, lattice_k)[index]
    else:
        fire = np.zeros((rows, K1), dtype=bool)
        assert walk.prefix is not None  # the walk kept the sorted counts
        for K in np.flatnonzero(walk.check):
            states = VoteStates(counts=walk.prefix.counts[K], run=walk.run[:, K], samples=np.full(rows, K))
            fire[:, K] = stops_unique(rule, states)
    fire &= walk.check[None, :]
    fired = fire.any(axis=1)
    at = np.where(fired, fire.argmax(axis=1), K1 - 1)
    return at, fired
