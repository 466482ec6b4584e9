"""The vote lattice: every vote state up to k samples, and how many sample orders a plan stops in each.

A prompt's n samples fall into answer classes (sizes m_g) and nulls (m₀). Drawn in a uniformly random
order, a particular sequence of t class labels with counts x (x_g of class g, ν nulls) has probability

    ∏_g (m_g)_{x_g} · (m₀)_ν / (n)_t                      ((a)_b = a(a−1)…(a−b+1), falling factorial)

whatever the order of the labels. So the chance that a plan stops at x is  a(x) · ∏(m)_x (m₀)_ν / (n)_t,
where a(x) — how many label sequences with counts x stop exactly there — does not depend on the prompt
at all. Rules are blind to class labels, so a(x) depends only on the *type* of x: the partition λ of its
vote counts (sorted descending) and ν. This module enumerates the types and computes a(type) per plan
boundary, once per plan, for every prompt; :mod:`isocompute.solver.plans.vote_polynomials` supplies the
prompt side and :mod:`isocompute.solver.plans.estimates` contracts the two.

Counting. One more sample turns a sequence for x into one for x + e_g, so for a labelled representative

    a_{t+1}(λ', ν) = Σ_{distinct parts p of λ'} mult_{λ'}(p) · a_t(λ' with one p → p−1, ν) + a_t(λ', ν−1),

with a_0(∅, 0) = 1; at each wave boundary the rule's stopping states move from "alive" to "stopped".
ESC's window also needs the order: its states carry the trailing run r (capped at w) and the vote count q
of the run's class, a_t(λ, ν, q, r) counting sequences whose run is one fixed class of count q:

    a(λ', ν, q', r') = Σ_{r: min(r+1, w) = r'} a(λ'↓q', ν, q'−1, r)                       (r' ≥ 2: the run grows)
    a(λ', ν, q', 1)  = tot(λ'↓q', ν) − Σ_{r≥1} a(λ'↓q', ν, q'−1, r)                      (a new run starts)
    a(λ', ν, 0, 0)   = tot(λ', ν−1)                                                      (a null ends the run)

where λ'↓q' lowers one part q' by one and tot sums a state's sequences over its run classes.

Worked example: two samples, no nulls. Type (2): one sequence (a a); type (1, 1): for fixed labelled
classes a, b the sequences ab and ba, so a = 2 — and a prompt with m = (2, 1), n = 3 reaches (1, 1) with
probability 2 · (2·1)/(3·2) = 2/3, as hypergeometric sampling says.

Stop reasons. A cascade moves to the next model only when a plan *ran out* (its rule never fired, not
even after the last wave), so the counts split by reason: ``part="fired"`` keeps the sequences whose
rule fired at some boundary (the last included), and ``"all"`` minus ``"fired"`` is those that ran out.
Example, ``lead:m=2@1x3`` without nulls: type (2) fires at K = 2;
every sequence still going at K = 3 has votes (2, 1) or (1, 1, 1), leads below 2, so it ran out. Under
``lead:m=1@1x3`` every state with a vote fires, and only three nulls run out.

Ignored: states beyond the largest boundary; everything about correctness and cost (the prompt side).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import numpy as np

from isocompute.solver.plans.plan import Plan
from isocompute.solver.plans.rules import VoteStates, stops_unique


def _partitions(k: int) -> list[tuple[int, ...]]:
    """Every partition of every size ≤ k as a descending tuple, ordered by size (stable indices)."""
    out: list[tuple[int, ...]] = [()]

    def rec(prefix: tuple[int, ...], left: int, cap: int) -> None:
        if left == 0:
            out.append(prefix)
            return
        for p in range(min(left, cap), 0, -1):
            rec(prefix + (p,), left - p, p)

    for total in range(1, k + 1):
        rec((), total, total)
    return out


@dataclass(frozen=True, eq=False)
class Partitions:
    """All partitions λ with |λ| ≤ k, index 0 = ∅, ordered by size. Edge arrays, per part value p:

    * ``rm_dst[p]``, ``rm_src[p]``: λ containing p → λ with one p removed; ``rm_keeps_top[p]``: the
      removal leaves the largest part unchanged; ``rm_is_top[p]``: p is λ's largest part;
    * ``dec_dst[p]``, ``dec_src[p]``, ``dec_mult[p]``: λ containing p → λ with one p lowered to p−1,
      and p's multiplicity in λ;
    * ``strip[j]``: for λ with ≥ j ones, the index of λ without j ones (−1 otherwise).
    """

    k: int
    items: list[tuple[int, ...]]
    index: dict[tuple[int, ...], int]
    size: np.ndarray
    top: np.ndarray
    parts: np.ndarray
    rm_dst: list[np.ndarray]
    rm_src: list[np.ndarray]
    rm_keeps_top: list[np.ndarray]
    rm_is_top: list[np.ndarray]
    dec_dst: list[np.ndarray]
    dec_src: list[np.ndarray]
    dec_mult: list[np.ndarray]
    strip: list[np.ndarray]

    def __len__(self) -> int:
        return len(self.items)


@functools.lru_cache(maxsize=8)
def partitions(k: int) -> Partitions:
    """The lattice of partitions of size ≤ k (cached: p(≤16) = 915, p(≤24) = 7,338)."""
    items = _partitions(k)
    index = {lam: i for i, lam in enumerate(items)}
    P = len(items)
    size = np.array([sum(lam) for lam in items], dtype=np.int64)
    top = np.array([lam[0] if lam else 0 for lam in items], dtype=np.int64)
    parts = np.zeros((P, max(k, 1)), dtype=np.int64)
    for i, lam in enumerate(items):
        parts[i, : len(lam)] = lam
    rm = {p: ([], [], [], []) for p in range(k + 1)}
    dec = {p: ([], [], []) for p in range(k + 1)}
    strip = [np.full(P, -1, dtype=np.int64) for _ in range(k + 1)]
    for i, lam in enumerate(items):
        ones = lam.count(1)
        for j in range(ones + 1):
            strip[j][i] = index[lam[: len(lam) - j]]
        for p in sorted(set(lam)):
            at = len(lam) - 1 - lam[::-1].index(p)  # the last occurrence keeps the tuple sorted
            removed = lam[:at] + lam[at + 1:]
            lowered = lam[:at] + ((p - 1,) if p > 1 else ()) + lam[at + 1:]
            d = rm[p]
            d[0].append(i)
            d[1].append(index[removed])
            d[2].append(bool(removed) and removed[0] == lam[0])
            d[3].append(p == lam[0])
            e = dec[p]
            e[0].append(i)
            e[1].append(index[lowered])
            e[2].append(lam.count(p))
    arr = lambda xs, t=np.int64: np.asarray(xs, dtype=t)  # noqa: E731
    return Partitions(
        k=k, items=items, index=index, size=size, top=top, parts=parts,
        rm_dst=[arr(rm[p][0]) for p in range(k + 1)], rm_src=[arr(rm[p][1]) for p in range(k + 1)],
        rm_keeps_top=[arr(rm[p][2], bool) for p in range(k + 1)],
        rm_is_top=[arr(rm[p][3], bool) for p in range(k + 1)],
        dec_dst=[arr(dec[p][0]) for p in range(k + 1)], dec_src=[arr(dec[p][1]) for p in range(k + 1)],
        dec_mult=[arr(dec[p][2], np.float64) for p in range(k + 1)], strip=strip,
    )


def stop_counts(plan: Plan, k: int, part: Literal["all", "fired"] = "all") -> np.ndarray:
    """(P, k+1) array S[λ, ν] over the lattice :func:`partitions(k) <partitions>`: how many sequences per
    labelled representative of type (λ, ν) stop with those votes and nulls, at K = |λ| + ν samples (zero
    unless K is one of the plan's boundaries); k ≥ the plan's samples. ``part="fired"`` counts only the
    stops where the rule fired (module docstring). Cached (read-only; 0.24 MB per plan at k = 16, 3 MB
    at k = 24, both parts): cross-validation asks for the same plans again."""
    if part not in ("all", "fired"):
        raise ValueError(f"part must be 'all' or 'fired', not {part!r}")
    return _both_parts(plan, k)[part == "fired"]


@functools.lru_cache(maxsize=128)
def _both_parts(plan: Plan, k: int) -> tuple[np.ndarray, np.ndarray]:
    if plan.max_samples > k:
        raise ValueError(f"lattice of size {k} is too small for {plan.name}")
    lattice = partitions(k)
    out = _stop_counts_run(plan, lattice) if plan.rule.uses_run else _stop_counts(plan, lattice)
    for x in out:
        x.setflags(write=False)
    return out


def _stop_counts(plan: Plan, lattice: Partitions) -> tuple[np.ndarray, np.ndarray]:
    k, P = lattice.k, len(lattice)
    stop_here = _rule_stops(plan, lattice, 0)  # (P,) bool: a rule reads the counts (and the samples) only
    out = np.zeros((P, k + 1))
    fired = np.zeros((P, k + 1))
    alive = np.zeros((P, k + 1))
    alive[0, 0] = 1.0
    bounds = set(plan.boundaries)
    last = plan.max_samples
    for t in range(1, last + 1):
        nxt = np.zeros_like(alive)
        nxt[:, 1:] = alive[:, :-1]  # one more null
        for p in range(1, t + 1):
            dst = lattice.dec_dst[p]
            if dst.size:
                nxt[dst] += lattice.dec_mult[p][:, None] * alive[lattice.dec_src[p]]
        alive = nxt
        if t in bounds:
            if plan.rule.uses_samples:
                stop_here = _rule_stops(plan, lattice, t)
            firing = alive * stop_here[:, None]
            fired += firing  # states at time t are those with |λ| + ν = t: supports never overlap
            stopping = firing if t < last else alive
            out += stopping
            alive = alive - stopping
    return out, fired


def _stop_counts_run(plan: Plan, lattice: Partitions) -> tuple[np.ndarray, np.ndarray]:
    """:func:`stop_counts` for rules that read the trailing run (ESC's window); see the module doc."""
    k, P = lattice.k, len(lattice)
    w = plan.rule.run_cap
    if plan.rule.uses_samples:
        raise ValueError(f"{plan.name}: a rule may read the run or the samples finished, not both")
    stop_here = _rule_stops(plan, lattice, 0)  # (P, w+1) bool by run length
    # a[λ, ν, q, r]; q = count of the run's class (0 with r = 0: the last sample was null, or none yet)
    a = np.zeros((P, k + 1, k + 1, w + 1))
    a[0, 0, 0, 0] = 1.0
    mult = np.zeros((P, k + 1))
    for p in range(1, k + 1):
        mult[lattice.dec_dst[p], p] = lattice.dec_mult[p]
    out = np.zeros((P, k + 1))
    fired = np.zeros((P, k + 1))
    bounds = set(plan.boundaries)
    last = plan.max_samples

    def total(x: np.ndarray) -> np.ndarray:  # (P, ν) sequences over every run class of each state
        return np.einsum("lq,lnqr->ln", mult, x[:, :, :, 1:]) + x[:, :, 0, 0]

    for t in range(1, last + 1):
        tot = total(a)
        nxt = np.zeros_like(a)
        nxt[:, 1:, 0, 0] = tot[:, :-1]
        for q in range(1, t + 1):
            dst, src = lattice.dec_dst[q], lattice.dec_src[q]
            if not dst.size:
                continue
            prev = a[src, :, q - 1, 1:] if q > 1 else np.zeros((src.size, k + 1, w))  # (E, ν, r=1..w)
            nxt[dst, :, q, 1] = tot[src] - prev.sum(axis=2)
            nxt[dst, :, q, 2:] += prev[:, :, : w - 1] if w > 1 else 0.0
            if w > 1:
                nxt[dst, :, q, w] += prev[:, :, w - 1]
            else:
                nxt[dst, :, q, 1] += prev[:, :, 0]
        a = nxt
        if t in bounds:
            firing = a * np.where(stop_here[:, None, None, :], 1.0, 0.0)
            fired += total(firing)
            stopping = firing if t < last else a
            out += total(stopping)
            a = a - stopping
    return out, fired


def _rule_stops(plan: Plan, lattice: Partitions, t: int) -> np.ndarray:
    """The rule's decision on every vote type after ``t`` samples (read only by rules that count the
    samples finished): (P,) bool, or (P, w+1) by run length for run rules."""
    rule = plan.rule
    counts = lattice.parts[:, : max(rule.width, 1)]
    P = len(lattice)
    if not rule.uses_run:
        return stops_unique(rule, VoteStates(counts=counts, run=np.zeros(P, np.int64), samples=np.full(P, t)))
    w = rule.run_cap
    runs = np.repeat(np.arange(w + 1), P)
    states = VoteStates(counts=np.tile(counts, (w + 1, 1)), run=runs)
    return stops_unique(rule, states).reshape(w + 1, P).T
