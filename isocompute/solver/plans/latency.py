"""Tokens generated and latency of plans: exact where order statistics give them, else Monte Carlo.

Definitions (per prompt, expectations over random sample orders and, inside parallel-stop waves, the
length order with ties broken uniformly at random; :mod:`~isocompute.solver.plans.waves`):

* **tokens generated** — every finished sample's completion tokens plus, for each sample aborted when a
  parallel-stop wave's rule fired at a finish of length ℓ, min(its length, ℓ) = ℓ (lock-step decoding);
  for waiting waves, every drawn sample's tokens;
* **latency** — in tokens of decode time: the sum over the waves started of the decode length until the
  wave ended (its longest sample; the length of the finish at which the rule fired, if it fired
  mid-wave). A per-wave overhead is not included: add ``overhead · waves`` (the plan's expected waves).

Exact (standard error 0), with L_(1) ≤ … ≤ L_(n) a prompt's lengths sorted and L̄ their mean. The i-th
smallest of a uniformly random w-subset is L_(p) with probability C(p−1, i−1) C(n−p, w−i) / C(n, w)
(ties do not matter: tied lengths are equal numbers), so E[max of w] = Σ_p L_(p) C(p−1, w−1) / C(n, w).

* plans whose rule never fires (``none``, either mode) run every wave, and wave l holds a uniformly
  random w_l-subset: latency = Σ_l E[max of w_l]; tokens = Σ_l w_l L̄;
* waiting plans on the exact lattice: tokens = the completion-token channel (exact,
  :mod:`~isocompute.solver.plans.exact`) and latency = tokens − Σ_{l started} (Σ_{W_l} L − max_{W_l} L).
  Wave 1 always starts and holds a random w₁-subset, so its term is w₁ L̄ − E[max of w₁]; a later wave of
  one sample adds 0. Plans of single-sample waves after the first (``lead:m=2@1x16``, ``none@8``) are
  therefore exact; for the others the later waves' terms come from the engine (``gap``) — a control
  variate: only those terms carry Monte Carlo error, not the whole latency;
* short-m@k, ``first:m=M@Ks`` with M ≤ K: it stops at the M-th finish in every order, so latency =
  E[L_(M)] and tokens = Σ_{i≤M} E[L_(i)] + (K − M) E[L_(M)] over a random K-subset (its utility stays
  Monte Carlo: which answers finish first depends on how lengths and answers go together).

Monte Carlo (the engine's means and standard errors): every other parallel-stop plan, whose stop depends
on lengths and answers jointly, and waiting plans beyond the exact lattice. The fired parts
E[X·1{fired}] (``split``) follow the same cases: exact for ``none`` (never fires), short-m@k (always fires)
and plans of single-sample waves (latency = tokens); else tokens' fired part minus the engine's
E[(tokens − latency)·1{fired}] for exact waiting plans, the engine's own for the rest.

Example: lengths (2, 3, 3, 5, 5, 5), ``none@2``: E[max of 2] = (1·3 + 2·3 + 3·5 + 4·5 + 5·5)/15 = 69/15 = 4.6
(pairs with p as the larger: p − 1 of them); ``first:m=1@2s``: E[min of 2] = (5·2 + 4·3 + 3·3 + 2·5 + 1·5)/15
= 46/15, tokens 2 · 46/15.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from isocompute.solver.outcomes import PAD_CODE
from isocompute.solver.plans.plan import Plan
from isocompute.solver.plans.rules import FirstRule, NoRule
from isocompute.solver.plans.waves import WaveEstimates, simulate_waves


@dataclass(frozen=True, eq=False)
class TokensLatency:
    """(N, P) expected tokens generated and latency, their standard errors, the same for the fired part
    (None without ``split``), and per plan ``method``: ``"exact"`` or ``"monte-carlo"`` (the latency's)."""

    tokens: np.ndarray
    tokens_se: np.ndarray
    latency: np.ndarray
    latency_se: np.ndarray
    fired_tokens: np.ndarray | None
    fired_tokens_se: np.ndarray | None
    fired_latency: np.ndarray | None
    fired_latency_se: np.ndarray | None
    method: tuple[str, ...]


def order_stat_means(lengths: np.ndarray, w: int, i: int) -> np.ndarray:
    """(N,) E[the i-th smallest length of a uniformly random w-subset of each row's samples]; ``lengths``
    (N, n_max) with NaN for padding (rows hold ≥ w samples)."""
    return _OrderStats(lengths)(w, i)


class _OrderStats:
    """:func:`order_stat_means` for one table, its lengths sorted once and each (w, i) computed once."""

    def __init__(self, lengths: np.ndarray) -> None:
        self.L = np.sort(np.where(np.isnan(lengths), np.inf, lengths), axis=1)
        n = np.isfinite(self.L).sum(axis=1)
        self.groups = [(n == size, int(size)) for size in np.unique(n)]
        self.memo: dict[tuple[int, int], np.ndarray] = {}

    def __call__(self, w: int, i: int) -> np.ndarray:
        if (w, i) not in self.memo:
            out = np.zeros(self.L.shape[0])
            for rows, size in self.groups:
                out[rows] = self.L[rows, :size] @ _weights(size, w, i)
            self.memo[w, i] = out
        return self.memo[w, i]


@functools.lru_cache(maxsize=1024)
def _weights(n: int, w: int, i: int) -> np.ndarray:
    """P(the i-th smallest of a random w-subset of n sorted items is item p), p = 1…n, exactly rounded."""
    total = math.comb(n, w)
    return np.array([math.comb(p - 1, i - 1) * math.comb(n - p, w - i) / total for p in range(1, n + 1)])


def is_short_mk(plan: Plan) -> bool:
    """One parallel-stop wave of K under ``first:m=M`` with M ≤ K: it stops at the M-th finish, always."""
    return isinstance(plan.rule, FirstRule) and plan.parallel == (True,) and plan.rule.m <= plan.waves[0]


def engine_keys(plan: Plan, kind: str, split: bool) -> tuple[str, ...]:
    """What :func:`price` and the caller need from the wave engine's run of ``plan`` (``kind``: how its
    utility is estimated, ``"exact"``, ``"monte-carlo"`` or ``"waves"``); () for none."""
    if kind == "waves":
        keys = ("u", "s", "w", "ch", "fin") + (() if is_short_mk(plan) else ("gen", "lat"))
        return keys + tuple("f" + k for k in keys) + ("f",) if split else keys
    if isinstance(plan.rule, NoRule):
        return ()
    if kind == "monte-carlo":
        return ("lat", "flat") if split else ("lat",)
    later = any(w > 1 for w in plan.waves[1:])
    return (("gap",) if later else ()) + (("fdef",) if split and (later or plan.waves[0] > 1) else ())


def price(plans: Sequence[Plan], kinds: Sequence[str], lengths: np.ndarray, tokens: np.ndarray,
          tokens_se: np.ndarray, fired_tokens: np.ndarray | None, fired_tokens_se: np.ndarray | None,
          engine: WaveEstimates | None, engine_col: dict[int, int]) -> TokensLatency:
    """Tokens and latency of every plan (module docstring). ``lengths`` (N, n_max), NaN for padding;
    ``tokens``/``fired_tokens`` (N, P) the completion-token channel of waiting plans (ignored for
    ``"waves"`` plans); ``engine`` the wave engine's estimates of the plans ``engine_col`` maps to its
    columns."""
    N, P = tokens.shape
    split = fired_tokens is not None
    z = np.zeros(N)
    gen, gen_se, lat, lat_se = (np.zeros((N, P)) for _ in range(4))
    fgen, fgen_se, flat, flat_se = (np.zeros((N, P)) for _ in range(4))
    mean_len = np.nanmean(lengths, axis=1)
    order_stat = _OrderStats(lengths)
    method = []
    for j, (plan, kind) in enumerate(zip(plans, kinds, strict=True)):
        e = engine_col.get(j)

        def eng(key: str, e: int | None = e) -> tuple[np.ndarray, np.ndarray]:
            assert engine is not None and e is not None  # engine_keys asked for it
            return engine.mean[key][:, e], engine.se[key][:, e]

        exact = True
        if is_short_mk(plan):
            m, k = plan.rule.m, plan.waves[0]  # type: ignore[attr-defined]
            lat[:, j] = order_stat(k, m)
            gen[:, j] = sum(order_stat(k, i) for i in range(1, m + 1)) + (k - m) * lat[:, j]
            fgen[:, j], flat[:, j] = gen[:, j], lat[:, j]
        elif kind == "waves":
            (gen[:, j], gen_se[:, j]), (lat[:, j], lat_se[:, j]) = eng("gen"), eng("lat")
            if split:
                (fgen[:, j], fgen_se[:, j]), (flat[:, j], flat_se[:, j]) = eng("fgen"), eng("flat")
            exact = False
        else:
            gen[:, j], gen_se[:, j] = tokens[:, j], tokens_se[:, j]
            if split:
                fgen[:, j], fgen_se[:, j] = fired_tokens[:, j], fired_tokens_se[:, j]  # type: ignore[index]
            if isinstance(plan.rule, NoRule):
                lat[:, j] = sum(order_stat(w, w) for w in plan.waves)
            elif kind == "monte-carlo":
                (lat[:, j], lat_se[:, j]) = eng("lat")
                if split:
                    flat[:, j], flat_se[:, j] = eng("flat")
                exact = False
            else:
                w1, exact = plan.waves[0], not any(w > 1 for w in plan.waves[1:])
                gap, gap_se = (z, z) if exact else eng("gap")
                lat[:, j] = tokens[:, j] - (w1 * mean_len - order_stat(w1, w1)) - gap
                lat_se[:, j] = gap_se
                if split:
                    fdef, fdef_se = (z, z) if exact and w1 == 1 else eng("fdef")
                    flat[:, j], flat_se[:, j] = fgen[:, j] - fdef, fdef_se
        method.append("exact" if exact else "monte-carlo")
    return TokensLatency(tokens=gen, tokens_se=gen_se, latency=lat, latency_se=lat_se,
                         fired_tokens=fgen if split else None, fired_tokens_se=fgen_se if split else None,
                         fired_latency=flat if split else None, fired_latency_se=flat_se if split else None,
                         method=tuple(method))


@dataclass(frozen=True, eq=False)
class Columns:
    """The arrays :func:`~isocompute.solver.plans.estimates.estimate_plans` fills — (N, P) ``out`` and
    ``fired`` (None without split) by key, (N, P, C) channels — and the token channel's index."""

    out: dict[str, np.ndarray]
    ch: np.ndarray
    ch_se: np.ndarray
    fired: dict[str, np.ndarray] | None
    fch: np.ndarray
    fch_se: np.ndarray
    tokens: int


def price_estimates(plans: Sequence[Plan], kinds: Sequence[str], codes: np.ndarray, labels: np.ndarray,
                    values: np.ndarray, lengths: np.ndarray, per_sample: np.ndarray, cols: Columns, *,
                    n_orders: int, seed: int, split: bool) -> TokensLatency:
    """Runs the wave engine where needed, fills in the plans that stop mid-wave, prices tokens and latency;
    prompts with an unknown length get NaN wherever lengths matter."""
    real = codes != PAD_CODE
    unknown = (real & np.isnan(lengths)).any(axis=1)
    known = np.where(real, np.nan_to_num(lengths), np.nan)  # NaN marks padding from here on
    wants = [engine_keys(p, k, split) for p, k in zip(plans, kinds, strict=True)]
    need = [j for j, w in enumerate(wants) if w]
    t = cols.tokens
    others = [c for c in range(per_sample.shape[2]) if c != t]  # the token channel is the engine's "fin"
    engine = simulate_waves(labels, values, np.nan_to_num(known), per_sample[:, :, others], [plans[j] for j in need],
                            n_orders=n_orders, seed=seed, split=split, wants=[wants[j] for j in need]) if need else None
    col = {j: c for c, j in enumerate(need)}
    waves = [j for j in range(len(plans)) if kinds[j] == "waves"]
    if engine is not None and waves:
        e = [col[j] for j in waves]
        pairs = [(cols.out, k, k) for k in ("u", "s", "w")]
        if cols.fired is not None:
            pairs += [(cols.fired, k, src) for k, src in (("p", "f"), ("u", "fu"), ("s", "fs"), ("w", "fw"))]
        for target, key, src in pairs:
            target[key][:, waves], target[key + "_se"][:, waves] = engine.mean[src][:, e], engine.se[src][:, e]
        for ch, ch_se, prefix in ((cols.ch, cols.ch_se, ""), (cols.fch, cols.fch_se, "f")):
            if prefix and cols.fired is None:
                continue
            ch[np.ix_(np.arange(ch.shape[0]), waves, others)] = engine.mean[prefix + "ch"][:, e]
            ch_se[np.ix_(np.arange(ch.shape[0]), waves, others)] = engine.se[prefix + "ch"][:, e]
            ch[:, waves, t], ch_se[:, waves, t] = engine.mean[prefix + "fin"][:, e], engine.se[prefix + "fin"][:, e]
        for a in (*cols.out.values(), cols.ch, cols.ch_se, *(cols.fired or {}).values(), cols.fch, cols.fch_se):
            a[np.ix_(unknown, waves)] = np.nan
    tl = price(plans, kinds, known, cols.ch[:, :, t], cols.ch_se[:, :, t], cols.fch[:, :, t] if split else None,
               cols.fch_se[:, :, t] if split else None, engine, col)
    for a in (tl.tokens, tl.tokens_se, tl.latency, tl.latency_se, tl.fired_tokens, tl.fired_tokens_se,
              tl.fired_latency, tl.fired_latency_se):
        if a is not None:
            a[unknown] = np.nan
    return tl
