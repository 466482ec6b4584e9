"""The never-worse chain with evidence: learned-from-evidence → the best fixed plan, kept per budget only
where a one-sided paired bootstrap over prompts supports it.

The comparison is at matched tokens *and* latency. For a budget (B tokens, latency budget Lb, both in
units of the typical length) the learned rule plays the price whose out-of-fold mean tokens are ≤ B and
mean latency ≤ Lb with the highest out-of-fold utility (:func:`choose_price`). Its rival is the best
mixture of fixed plans within the same budgets (any rule, any schedule of the menu; :func:`best_fixed_mix`,
an LP solved by HiGHS: max Σ p_j Ū_j s.t. Σ p_j T̄_j ≤ B, Σ p_j L̄_j ≤ Lb, Σ p_j = 1), chosen on the same
prompts — tuned in hindsight, which favours it — and what the chain serves otherwise. The learned rule
is kept at the budget iff the bootstrap's lower bound of its mean per-prompt gain over the rival (at
``level``, one-sided) is above 0 *held out* — both rules chosen on four inner folds of these prompts and
scored on the fifth — and its held-out tokens are within :data:`SPEND_TOLERANCE` of the budget; its price
is chosen at the internal budget whose held-out tokens are the budget (:func:`heldout_price_budget`,
issue 32: the same prompts must not both pick a price and certify its cost), and so is the fixed mixture's
LP (:func:`heldout_mix_budget`). (The bench compares the served chain at its *realised* tokens and
latency too: ``bench/bench_evidence.py``.)

Worked example: at B = 3.0 (median lengths) and Lb = 0.75 the learned price realises 2.83 tokens and
latency 0.74 with utility 0.9682; the fixed mixture within (3.0, 0.75) scores 0.9631; the per-prompt gains'
5% bootstrap quantile is +0.0023 > 0 → kept.

Ignores: prompt text (the policy's own chain serves that, :mod:`isocompute.policy.fallback`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from isocompute.policy.evidence.mix_lp import MixLP

__all__ = ["ChainEntry", "best_fixed_mix", "choose_price", "chain_entry"]

BOOTSTRAP = 2000
INNER_FOLDS = 5
SPEND_TOLERANCE = 0.05  # the kept price's held-out mean tokens may exceed the budget by this much at most
HELDOUT_MIX = True  # the fixed mixture at its held-out-searched budget (off: its LP at the budget, as before)


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
    return MixLP(U, T, L, l_max).solve(t_max)


def choose_price(U: np.ndarray, T: np.ndarray, L: np.ndarray, budget: float, latency_budget: float | None) -> int | None:
    """The price (column) with the best mean utility among those within both budgets, or None."""
    ok = T.mean(axis=0) <= budget
    if latency_budget is not None:
        ok &= L.mean(axis=0) <= latency_budget
    if not ok.any():
        return None
    u = np.where(ok, U.mean(axis=0), -np.inf)
    return int(np.argmax(u))


def _inner_folds(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed + 4242).permutation(n) % INNER_FOLDS


def heldout_price_budget(values, budget: float, latency_budget: float | None, *, seed: int = 0) -> float:
    """The internal token budget g at which the price chosen on inner folds (best utility within g) spends
    ``budget`` on the inner fold left out, on average (a grid of g from 0.6 to 1.4 × the budget; the
    issue-32 winner's curse: among 84 prices, those whose tokens came out low are preferred, so the chosen
    price overspends held out). Fewer than 2·folds prompts: the budget itself."""
    n = values.utility.shape[0]
    if n < 2 * INNER_FOLDS:
        return float(budget)
    fold = _inner_folds(n, seed)
    grid = budget * np.geomspace(0.6, 1.4, 33)
    spent = np.zeros(grid.size)
    for f in range(INNER_FOLDS):
        tr, te = fold != f, fold == f
        for k, g in enumerate(grid):
            j = choose_price(values.utility[tr], values.tokens[tr], values.latency[tr], float(g), latency_budget)
            spent[k] += values.tokens[te, j].sum() if j is not None else values.tokens[te].min(axis=1).sum()
    h = np.maximum.accumulate(spent / n)
    return float(np.interp(budget, h, grid)) if h[0] <= budget else float(grid[0])


def _mix_or_cheapest(FU: np.ndarray, FT: np.ndarray, FL: np.ndarray, t_max: float,
                     l_max: float | None) -> tuple[np.ndarray, np.ndarray]:
    mix = best_fixed_mix(FU, FT, FL, t_max, l_max)
    return mix if mix is not None else (np.array([int(np.argmin(FT.mean(axis=0)))]), np.array([1.0]))


def heldout_mix_budget(fixed: tuple[np.ndarray, np.ndarray, np.ndarray], budget: float,
                       latency_budget: float | None, *, seed: int = 0) -> float:
    """The internal token budget g at which the fixed mixture chosen on inner folds (its LP at g) spends
    ``budget`` on the inner fold left out, on average — the fixed mixture's analogue of
    :func:`heldout_price_budget` (a grid of g from 0.6 to 1.4 × the budget). Fewer than 2·folds prompts:
    the budget itself."""
    FU, FT, FL = fixed
    n = FU.shape[0]
    if n < 2 * INNER_FOLDS:
        return float(budget)
    fold = _inner_folds(n, seed)
    grid = budget * np.geomspace(0.6, 1.4, 17)
    spent = np.zeros(grid.size)
    unit = FT[:, int(np.argmin(FT.mean(axis=0)))]  # the cheapest plan's tokens: each prompt's length scale
    for f in range(INNER_FOLDS):
        tr, te = fold != f, fold == f
        scale = float(unit[tr].mean() / unit.mean())  # budgets in x are served in the inner part's own 1x
        lp, cheapest = MixLP(FU[tr], FT[tr], FL[tr], latency_budget), int(np.argmin(FT[tr].mean(axis=0)))
        for k, g in enumerate(grid):  # one LP per inner fold, re-solved warm at each bound
            mix = lp.solve(float(g) * scale)
            p, w = mix if mix is not None else (np.array([cheapest]), np.array([1.0]))
            spent[k] += (FT[te][:, p] @ w).sum()
    h = np.maximum.accumulate(spent / n)
    return float(np.interp(budget, h, grid)) if h[0] <= budget else float(grid[0])


def _nested_gain(values, fixed: tuple[np.ndarray, np.ndarray, np.ndarray], g: float, budget: float,
                 latency_budget: float | None, seed: int) -> tuple[np.ndarray, float]:
    """Per prompt, the learned price's utility minus the fixed mixture's, each chosen on the other inner
    folds (the price at ``g``, the mixture at its internal budget ``budget``) and scored on the prompt's; and the price's
    held-out mean tokens."""
    FU, FT, FL = fixed
    n = FU.shape[0]
    fold = _inner_folds(n, seed)
    d, tok = np.zeros(n), np.zeros(n)
    for f in range(INNER_FOLDS):
        tr, te = fold != f, fold == f
        j = choose_price(values.utility[tr], values.tokens[tr], values.latency[tr], g, latency_budget)
        mix = _mix_or_cheapest(FU[tr], FT[tr], FL[tr], budget, latency_budget)
        rival = FU[te][:, mix[0]] @ mix[1]
        if j is None:  # no price fits on these folds: the fixed mixture serves them
            d[te], tok[te] = 0.0, FT[te][:, mix[0]] @ mix[1]
        else:
            d[te], tok[te] = values.utility[te, j] - rival, values.tokens[te, j]
    return d, float(tok.mean())


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
    g_fix = heldout_mix_budget(fixed, budget, latency_budget, seed=seed) if HELDOUT_MIX else budget
    fallback = _mix_or_cheapest(FU, FT, FL, g_fix, latency_budget)
    fp, fw = fallback

    def fixed_entry(gain: float | None, low: float | None) -> ChainEntry:
        return ChainEntry(budget, latency_budget, "fixed_plan", None, None, None,
                          float((FT[:, fp] @ fw).mean()), float((FL[:, fp] @ fw).mean()),
                          float((FU[:, fp] @ fw).mean()), tuple(int(x) for x in fp), tuple(float(x) for x in fw),
                          gain, low, level, n)

    if j is None:
        return fixed_entry(None, None)
    g = heldout_price_budget(values, budget, latency_budget, seed=seed)
    j = choose_price(values.utility, values.tokens, values.latency, g, latency_budget)
    if j is None:
        return fixed_entry(None, None)
    u, t, lat = values.utility[:, j], values.tokens[:, j], values.latency[:, j]
    rival = fallback
    # the test reads held-out choices: a price and a mixture chosen on inner folds, scored on the inner fold
    # left out, so a price that wins by a cost estimate that does not hold out of fold loses here
    d, spent = _nested_gain(values, fixed, g, g_fix, latency_budget, seed)
    gain, low = float(d.mean()), _lower_bound(d, level, seed)
    if low <= 0 or spent > budget * (1 + SPEND_TOLERANCE):
        return fixed_entry(gain, low)
    lam, mu = values.prices[j]
    return ChainEntry(budget, latency_budget, "evidence", j, float(lam), float(mu), float(t.mean()),
                      float(lat.mean()), float(u.mean()), tuple(int(x) for x in rival[0]),
                      tuple(float(x) for x in rival[1]), gain, low, level, n)
