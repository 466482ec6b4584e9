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
Schedules that re-sort the same stretches of the order (all waiting ones, say) share one walk. Means
over ``n_orders`` orders per prompt (the same orders for every plan), standard errors s/√R.

Worked example: samples (answer, length) (a, 300), (b, 120), (a, 200), (a, 900) under ``lead:m=1@4s``:
every order finishes b first, the lead is 1, the rule fires: utility = [b correct], samples 4, tokens
4 · 120, latency 120 — in every order, so the standard errors are 0.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from isocompute.solver.plans.montecarlo import Prefix, prefix_states
from isocompute.solver.plans.plan import Plan
from isocompute.solver.plans.rules import StoppingRule, VoteStates, stops_unique
from isocompute.solver.plans.vote_lattice import partitions

LATTICE_MAX = 24
KEYS = ("u", "s", "w", "ch", "fin", "gen", "lat", "gap")  # fin: the finished samples' tokens
FIRED_KEYS = ("f", "fu", "fs", "fw", "fch", "ffin", "fgen", "flat", "fdef")  # E[X·1{fired}]; fdef: (gen − lat)·1{fired}


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
                   plans: Sequence[Plan], *, n_orders: int = 100, seed: int = 0, chunk: int = 128,
                   split: bool = False, orders: np.ndarray | None = None,
                   wants: Sequence[Collection[str]] | None = None) -> WaveEstimates:
    """``labels`` (N, n_max) class index ≥ 0, −1 null, −2 padding; ``values`` (N, G) per-class value;
    ``lengths`` (N, n_max) completion tokens; ``channels`` (N, n_max, C). ``orders`` (N, R, ≥ k): given
    sample orders instead of random ones (e.g. all permutations, for an exact average). ``wants[j]``: the
    keys plan j needs (default: all); the others stay 0, and a schedule none of whose plans wants the
    utility skips the majority credit."""
    N, P, C = labels.shape[0], len(plans), channels.shape[2]
    k = max(p.max_samples for p in plans)
    rng = np.random.default_rng(seed)
    keys = KEYS + (FIRED_KEYS if split else ())
    want = [set(keys) if wants is None else set(wants[j]) & set(keys) for j in range(P)]
    mean = {key: np.zeros((N, P, C) if key.endswith("ch") else (N, P)) for key in keys}
    se = {key: np.zeros_like(v) for key, v in mean.items()}
    small = max((p.max_samples for p in plans if p.max_samples <= LATTICE_MAX), default=None)
    by_schedule = itertools.groupby(sorted(range(P), key=lambda j: (plans[j].waves, plans[j].modes)),
                                    key=lambda j: (plans[j].waves, plans[j].modes))
    groups = [(Plan(w, modes=m), list(js)) for (w, m), js in by_schedule]
    # schedules that sort the same stretches of the order finish alike: one walk serves them (the longest)
    alike: dict[tuple, list[tuple[Plan, list[int]]]] = {}
    for schedule, js in groups:
        alike.setdefault((_sorted_stretches(schedule), schedule.max_samples > LATTICE_MAX), []).append((schedule, js))
    integral = bool(np.all(lengths == np.round(lengths))) and float(np.max(lengths, initial=0)) < 2.0**40
    for lo in range(0, N, chunk):
        hi = min(lo + chunk, N)
        o = orders[lo:hi] if orders is not None else random_orders(labels[lo:hi], k, n_orders, rng)
        for (stretches, _), members in alike.items():
            K = max(sched.max_samples for sched, _ in members)
            lattice_k = small if K <= LATTICE_MAX else None
            js = [j for _, jj in members for j in jj]
            rules = [plans[j].rule for j in js]
            needs = set().union(*(want[j] for j in js))
            seq = _sequence(labels[lo:hi], values[lo:hi], lengths[lo:hi], channels[lo:hi], o[:, :, :K], stretches,
                            lattice_k, integral, with_run=any(r.uses_run for r in rules),
                            with_credit=bool(needs & {"u", "fu"}), with_counts=any(r.width > 0 for r in rules))
            for schedule, jj in members:
                walk = _schedule_walk(seq, schedule)
                for j in jj:
                    for key, x in _outcomes(walk, plans[j].rule, lattice_k, want[j]).items():
                        mean[key][lo:hi, j], se[key][lo:hi, j] = _mean_se(x, hi - lo, o.shape[1])
    return WaveEstimates(mean=mean, se=se)


def _sorted_stretches(schedule: Plan) -> tuple[tuple[int, int], ...]:
    """The stretches [lo, hi) of the order a schedule re-sorts by length: its parallel-stop waves of ≥ 2."""
    out, lo = [], 0
    for w, par in zip(schedule.waves, schedule.parallel, strict=True):
        if par and w > 1:
            out.append((lo, lo + w))
        lo += w
    return tuple(out)


def _mean_se(x: np.ndarray, n: int, R: int) -> tuple[np.ndarray, np.ndarray]:
    """Means over each prompt's R orders (rows prompt-major) and their standard errors s/√R."""
    x = x.reshape((n, R) + x.shape[1:])
    d = x - x[:, :1]  # shifted: a constant has exactly zero spread
    s1, s2 = d.sum(axis=1), (d * d).sum(axis=1)
    if R < 2:
        return x[:, 0], np.full(s1.shape, np.nan)
    var = np.maximum(s2 - s1 * s1 / R, 0.0) / (R - 1)
    return x[:, 0] + s1 / R, np.sqrt(var / R)


def _outcomes(walk: _Walk, rule: StoppingRule, lattice_k: int | None, keys: set[str]) -> dict[str, np.ndarray]:
    """Per order, the values of ``keys`` (of :data:`KEYS`, :data:`FIRED_KEYS`) where the plan stops."""
    at, fired = _stops(rule, walk, lattice_k)
    rows, K1 = walk.cumlen.shape
    flat = np.arange(rows) * K1 + at
    f = fired.astype(np.float64)
    base = {"u": lambda: walk.credit.take(flat), "s": lambda: walk.bound_of[at], "w": lambda: walk.wave_of[at],
            "ch": lambda: walk.cumch.reshape(rows * K1, -1)[flat], "fin": lambda: walk.cumlen.take(flat),
            "gen": lambda: walk.tokens.take(flat), "lat": lambda: walk.latency.take(flat)}
    got: dict[str, np.ndarray] = {}

    def get(key: str) -> np.ndarray:
        if key not in got:
            got[key] = base[key]()
        return got[key]

    out = {}
    for key in keys:
        if key == "gap":
            out[key] = get("gen") - get("lat") - walk.first_gap
        elif key == "fdef":
            out[key] = (get("gen") - get("lat")) * f
        elif key == "f":
            out[key] = f
        elif key == "fch":
            out[key] = get("ch") * f[:, None]
        elif key in FIRED_KEYS:
            out[key] = get(key[1:]) * f
        else:
            out[key] = get(key)
    return out


@dataclass(frozen=True, eq=False)
class _Sequence:
    """One finish order on every order (rows), t = 0…K: the lengths ``L`` (rows, K) in finish order, the
    vote type ``lam`` (lattice index; None beyond :data:`LATTICE_MAX`, then ``prefix`` holds the sorted
    counts), the ``run`` (None when no rule reads it), the majority ``credit``, and the finished
    samples' channel totals ``cumch`` and tokens ``cumlen``."""

    L: np.ndarray
    lam: np.ndarray | None
    prefix: Prefix | None
    run: np.ndarray | None
    credit: np.ndarray
    cumch: np.ndarray
    cumlen: np.ndarray


@dataclass(frozen=True, eq=False)
class _Walk:
    """One schedule on its finish order (:class:`_Sequence`, cut to its K): per row and t, ``tokens`` and
    ``latency`` if the plan stopped at t, ``first_gap`` per row; per t ``check`` (the rule is looked at),
    ``wave_of``, ``bound_of`` (the samples started)."""

    lam: np.ndarray | None
    prefix: Prefix | None
    run: np.ndarray | None
    credit: np.ndarray
    cumch: np.ndarray
    cumlen: np.ndarray
    tokens: np.ndarray
    latency: np.ndarray
    first_gap: np.ndarray
    check: np.ndarray
    wave_of: np.ndarray
    bound_of: np.ndarray


def _sequence(labels: np.ndarray, values: np.ndarray, lengths: np.ndarray, channels: np.ndarray,
              orders: np.ndarray, stretches: tuple[tuple[int, int], ...], lattice_k: int | None, integral: bool, *,
              with_run: bool, with_credit: bool, with_counts: bool) -> _Sequence:
    N, R, K = orders.shape
    idx = orders + (np.arange(N) * labels.shape[1])[:, None, None]  # flat sample indices
    L = lengths.take(idx)
    for lo, hi in stretches:
        _finish_order(idx[:, :, lo:hi], L[:, :, lo:hi], integral)
    rows = N * R
    idx = idx.reshape(rows, K)
    L = L.reshape(rows, K)
    C = channels.shape[2]
    cumch = np.zeros((rows, K + 1, C))
    if C:
        cumch[:, 1:] = np.cumsum(channels.reshape(-1, C)[idx], axis=1)
    cumlen = np.zeros((rows, K + 1))
    cumlen[:, 1:] = np.cumsum(L, axis=1)
    seq = labels.ravel()[idx]
    if lattice_k is None:
        prefix = prefix_states(seq, np.repeat(values, R, axis=0), K)
        return _Sequence(L, None, prefix, prefix.run, prefix.credit, cumch, cumlen)
    if with_credit or with_counts:
        lam, run, credit = _votes(seq, values, R, lattice_k, with_run, with_credit)
    else:  # the rules read no counts but whether there is a vote (type (1,) stands for every voted type)
        lam = np.zeros((rows, K + 1), dtype=np.int32)
        lam[:, 1:] = np.maximum.accumulate(seq >= 0, axis=1)
        run, credit = _runs(seq) if with_run else None, np.zeros((rows, K + 1))
    return _Sequence(L, lam, None, run, credit, cumch, cumlen)


def _schedule_walk(seq: _Sequence, schedule: Plan) -> _Walk:
    K = schedule.max_samples
    L, cumlen = seq.L[:, :K], seq.cumlen[:, : K + 1]
    rows = L.shape[0]
    tokens = cumlen.copy() if any(schedule.parallel) else cumlen  # aborted samples' tokens go on top
    latency = np.zeros((rows, K + 1))
    check = np.zeros(K + 1, dtype=bool)
    wave_of, bound_of = np.zeros(K + 1), np.zeros(K + 1)
    before, lo = np.zeros(rows), 0
    first_gap = np.zeros(rows)
    for wave, (w, par) in enumerate(zip(schedule.waves, schedule.parallel, strict=True), start=1):
        hi = lo + w
        top = L[:, hi - 1]  # sorted: the last finisher is the longest
        for c in range(lo, hi - 1) if not par else ():
            top = np.maximum(top, L[:, c])
        if wave == 1:
            first_gap = tokens[:, hi] - top
        if par:
            tokens[:, lo + 1:hi] += (hi - np.arange(lo + 1, hi))[None, :] * L[:, lo:hi - 1]
            latency[:, lo + 1:hi + 1] = before[:, None] + L[:, lo:hi]
        else:
            latency[:, hi] = before + top
        check[lo + 1:hi + 1] = par
        check[hi] = True
        wave_of[lo + 1:hi + 1], bound_of[lo + 1:hi + 1] = wave, hi
        before = before + top
        lo = hi
    cut = slice(0, K + 1)
    return _Walk(None if seq.lam is None else seq.lam[:, cut], seq.prefix, None if seq.run is None else seq.run[:, cut],
                 seq.credit[:, cut], seq.cumch[:, cut], cumlen, tokens, latency, first_gap, check, wave_of, bound_of)


def _finish_order(idx: np.ndarray, L: np.ndarray, integral: bool) -> None:
    """Sort one parallel-stop wave's samples (``idx``, lengths ``L``; (…, w), in place) into finish order:
    by length, ties kept in the random order (a stable sort). Integer lengths (< 2⁴⁰) sort as one integer
    key, length · 2^b + position (several times faster than a stable argsort)."""
    w = L.shape[-1]
    if integral:
        shift = int(w - 1).bit_length()
        key = np.sort((L.astype(np.int64) << shift) | np.arange(w), axis=-1)
        idx[...] = np.take_along_axis(idx, key & ((1 << shift) - 1), -1)
        L[...] = key >> shift
        return
    perm = np.argsort(L, axis=-1, kind="stable")
    idx[...] = np.take_along_axis(idx, perm, -1)
    L[...] = np.take_along_axis(L, perm, -1)


def _votes(seq: np.ndarray, values: np.ndarray, R: int, lattice_k: int, with_run: bool,
           with_credit: bool) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """Per row and t = 0…K: the vote type's lattice index, the run and the majority credit (if asked)."""
    rows, K = seq.shape
    G = values.shape[1] + 1  # one more slot per row, for nulls: its count stays −2, which no count equals
    raise_part = _raise_table(lattice_k).ravel()
    counts = np.zeros((rows, G), dtype=np.int8)  # small: the row's counts stay in cache (≤ LATTICE_MAX)
    counts[:, -1] = -2
    counts = counts.ravel()
    cls = np.where(seq >= 0, seq, G - 1)
    slot = (cls + (np.arange(rows) * G)[:, None]).T.copy()  # time-major: (K, rows)
    if with_credit:
        vals = np.hstack([values, np.zeros((values.shape[0], 1))]).ravel()
        v_all = vals.take(cls + np.repeat(np.arange(values.shape[0]) * G, R)[:, None]).T.copy()
    lam = np.zeros((K + 1, rows), dtype=np.int32)
    credit = np.zeros((K + 1, rows) if with_credit else (1, 1))
    lead = np.zeros(rows, dtype=np.int32)  # the leading count, how many classes hold it, their values' sum
    n_top = np.zeros(rows)
    top_sum = np.zeros(rows)
    cur = np.zeros(rows, dtype=np.int32)
    width = lattice_k + 3  # raise-table columns: c + 2 for c = −2 (null: unchanged), 0, 1, …
    for t in range(1, K + 1):
        at = slot[t - 1]
        c = counts.take(at)
        cur = raise_part.take(cur * width + (c + 2))
        counts[at] = c + (c >= 0)  # nulls stay −2
        lam[t] = cur
        if not with_credit:
            continue
        alone = c + 1 > lead
        joins = c + 1 == lead
        v = v_all[t - 1]
        lead = np.maximum(lead, c + 1)
        n_top = np.where(alone, 1.0, n_top + joins)
        top_sum = np.where(alone, v, top_sum + joins * v)
        np.divide(top_sum, np.maximum(n_top, 1.0), out=credit[t])
    lam, credit = lam.T.copy(), credit.T.copy() if with_credit else np.zeros((rows, K + 1))
    run = _runs(seq) if with_run else None
    return lam, run, credit


def _runs(seq: np.ndarray) -> np.ndarray:
    """(rows, K+1) the trailing run of one non-null class after each finish: t − (where it started) + 1,
    the start being the latest finish that did not repeat the previous answer."""
    rows, K = seq.shape
    vote = seq >= 0
    same = np.zeros((rows, K), dtype=bool)
    same[:, 1:] = vote[:, 1:] & (seq[:, 1:] == seq[:, :-1])
    t = np.arange(1, K + 1)
    start = np.maximum.accumulate(np.where(same, 0, t[None, :]), axis=1)
    run = np.zeros((rows, K + 1), dtype=np.int64)
    run[:, 1:] = (t[None, :] - start + 1) * vote
    return run


@functools.lru_cache(maxsize=4)
def _raise_table(k: int) -> np.ndarray:
    """(P, k+3): column c + 2 holds the lattice index of λ with one part c raised to c + 1 (c = 0: a new
    part 1; −1 past k); column 0 (c = −2, a null) λ itself."""
    lattice = partitions(k)
    out = np.full((len(lattice), k + 3), -1, dtype=np.int32)
    out[:, 0] = np.arange(len(lattice))
    for p in range(1, k + 1):
        out[lattice.dec_src[p], p + 1] = lattice.dec_dst[p]
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
    rows, K1 = walk.cumlen.shape
    cols = np.flatnonzero(walk.check)  # the finishes the rule looks at (never t = 0)
    if walk.lam is not None and lattice_k is not None:
        index = walk.lam[:, cols] if cols.size < K1 - 1 else walk.lam[:, 1:]
        if rule.uses_run:
            assert walk.run is not None  # walked with runs: a rule reads them
            index = index * (rule.run_cap + 1) + np.minimum(walk.run[:, cols], rule.run_cap)
        if rule.uses_samples:
            index = index * (lattice_k + 1) + cols[None, :]
        fire = _rule_table(rule, lattice_k).take(index)
    else:
        fire = np.zeros((rows, cols.size), dtype=bool)
        assert walk.prefix is not None and walk.run is not None  # the walk kept the sorted counts
        for i, K in enumerate(cols):
            states = VoteStates(counts=walk.prefix.counts[K], run=walk.run[:, K], samples=np.full(rows, K))
            fire[:, i] = stops_unique(rule, states)
    first = fire.argmax(axis=1)
    fired = fire.ravel().take(np.arange(rows) * fire.shape[1] + first)
    return np.where(fired, cols[first], K1 - 1), fired
