"""The never-worse chain with evidence: learned-from-evidence → the best fixed plan, kept per budget only
where a one-sided paired bootstrap over prompts supports it.

The comparison is at matched tokens *and* latency. For a budget (B tokens, latency budget Lb, both in
units of the typical length) the learned rule plays the price whose out-of-fold mean tokens are ≤ B and
mean latency ≤ Lb with the highest out-of-fold utility (:func:`choose_price`). Its rival is the best
mixture of fixed plans within the same budgets (any rule, any schedule of the menu; :func:`best_fixed_mix`,
an LP solved by HiGHS: max Σ p_j Ū_j s.t. Σ p_j T̄_j ≤ B, Σ p_j L̄_j ≤ Lb, Σ p_j = 1), chosen on the same
prompts — tuned in hindsight, which favours it — and what the chain serves otherwise. The learned rule
is kept at the budget iff the bootstrap's lower bound of its mean per-prompt gain over the rival (at
``level``, one-sided) is above 0. (The bench compares the served chain at its *realised* tokens and
latency too: ``bench/bench_evidence.py``.)

Worked example: at B = 3.0 (median lengths) and Lb = 0.75 the learned price realises 2.83 tokens and
latency 0.74 with utility 0.9682; the fixed mixture within (3.0, 0.75) scores 0.9631; the per-prompt gains'
5% bootstrap quantile is +0.0023 > 0 → kept.

Ignores: prompt text (the policy's own chain serves that, :mod:`isocompute.policy.fallback`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy.optimize import linprog

__all__ = ["ChainEntry", "best_fixed_mix", "choose_price", "chain_entry"]

BOOTSTRAP = 2000


@dataclass(frozen=True)
class ChainEntry:
    """One budget of the chain: which rule serves, at what price, and why."""

    budget: float
    latency_budget: float | None
    rule: str  # "evidence" or "fixed_plan"
    price: int | None
    lam: float | None
    mu: float | None
    tokens: float
    latency: float
    utility: float
    fixed_plans: tuple[int, ...]
    fixed_weights: tuple[float, ...]
    gain: float | None
    gain_low: float | None
    level: float
    prompts: int

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ChainEntry:
        d = dict(d)
        d["fixed_plans"] = tuple(int(x) for x in d["fixed_plans"])
        d["fixed_weights"] = tuple(float(x) for x in d["fixed_weights"])
        return cls(**d)


def best_fixed_mix(U: np.ndarray, T: np.ndarray, L: np.ndarray, t_max: float,
                   l_max: float | None) -> tuple[np.ndarray, np.ndarray] | None:
    """(plan indices, weights) of the best mixture of the fixed plans' columns within mean tokens ``t_max``
    and mean latency ``l_max`` (None: unbounded), or None when no mixture fits."""
    P = U.shape[1]
    A = [T.mean(axis=0)]
    b = [t_max]
    if l_max is not None and np.isfinite(l_max):
        A.append(L.mean(axis=0))
        b.append(l_max)
    res = linprog(-U.mean(axis=0), A_ub=np.vstack(A), b_ub=b, A_eq=np.ones((1, P)), b_eq=[1.0], bounds=(0, 1),
                  method="highs")
    if not res.success:
        return None
    keep = np.flatnonzero(res.x > 1e-9)
    w = res.x[keep] / res.x[keep].sum()
    return keep, w


def choose_price(U: np.ndarray, T: np.ndarray, L: np.ndarray, budget: float, latency_budget: float | None) -> int | None:
    """The price (column) with the best mean utility among those within both budgets, or None."""
    ok = T.mean(axis=0) <= budget
    if latency_budget is not None:
        ok &= L.mean(axis=0) <= latency_budget
    if not ok.any():
        return None
    u = np.where(ok, U.mean(axis=0), -np.inf)
    return int(np.argmax(u))


def _lower_bound(d: np.ndarray, level: float, seed: int) -> float:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, d.size, (BOOTSTRAP, d.size))
    return float(np.quantile(d[idx].mean(axis=1), 1.0 - level))


def chain_entry(values, fixed: tuple[np.ndarray, np.ndarray, np.ndarray], budget: float,
                latency_budget: float | None, *, level: float = 0.95, seed: int = 0) -> ChainEntry:
    """The chain's choice at one budget (module docstring); ``values`` the learned rule's out-of-fold
    :class:`~isocompute.policy.evidence.crossfit.Values`, ``fixed`` the fixed plans' (U, T, L) per prompt."""
    FU, FT, FL = fixed
    n = FU.shape[0]
    j = choose_price(values.utility, values.tokens, values.latency, budget, latency_budget)
    fallback = best_fixed_mix(FU, FT, FL, budget, latency_budget)
    if fallback is None:
        fallback = (np.array([int(np.argmin(FT.mean(axis=0)))]), np.array([1.0]))
    fp, fw = fallback

    def fixed_entry(gain: float | None, low: float | None) -> ChainEntry:
        return ChainEntry(budget, latency_budget, "fixed_plan", None, None, None,
                          float((FT[:, fp] @ fw).mean()), float((FL[:, fp] @ fw).mean()),
                          float((FU[:, fp] @ fw).mean()), tuple(int(x) for x in fp), tuple(float(x) for x in fw),
                          gain, low, level, n)

    if j is None:
        return fixed_entry(None, None)
    u, t, lat = values.utility[:, j], values.tokens[:, j], values.latency[:, j]
    rival = fallback
    d = u - FU[:, rival[0]] @ rival[1]
    gain, low = float(d.mean()), _lower_bound(d, level, seed)
    if low <= 0:
        return fixed_entry(gain, low)
    lam, mu = values.prices[j]
    return ChainEntry(budget, latency_budget, "evidence", j, float(lam), float(mu), float(t.mean()),
                      float(lat.mean()), float(u.mean()), tuple(int(x) for x in rival[0]),
                      tuple(float(x) for x in rival[1]), gain, low, level, n)
