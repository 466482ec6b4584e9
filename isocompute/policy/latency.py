"""Latency budgets: one policy serves a range of mean latency budgets beside its range of cost budgets.

``fit --latency-budgets LO:HI`` (``PolicyConfig.latency_range``). A plan's latency on a prompt is what
:mod:`isocompute.solver.plans.latency` estimates — the decode length until each wave ends (its longest
sample, or the finish at which a parallel-stop rule fired), summed over waves — in units of one sample's
mean completion length on the training table (1.0 = waiting for one sample), plus ``wave_overhead``
per wave. A request's ``latency_budget`` is a mean over requests, as its ``budget`` is.

**The learned rule** prices latency as it prices cost. At a price ν on latency the utility learner plays

    argmax_a  Û(x, a) − ν·L̄_a − λ_i·Ĉ(x, a)

(L̄_a: plan a's mean training latency; λ_i the prompt's jittered price, :func:`~isocompute.policy.learn.learners.price`).
For each ν of a fixed grid (:data:`NUS`: 0 and 13 prices from 10⁻⁴ to 1 utility per sample length) λ is
calibrated to the cost budgets exactly as without latency (bisection on the out-of-fold decisions:
:mod:`isocompute.policy.learn.calibration`; for fixed ν the cost is non-increasing in λ), and the
out-of-fold mean latency of those decisions is recorded per calibration budget — a table latency(ν, B).
A request at (B, L) takes the smallest ν whose latency at B is ≤ L (the largest ν when none is) and that
ν's λ(B): its cost is calibrated to B at every ν, its latency to at most L.

**The never-worse chain** is chosen again at :data:`N_LEVELS` latency levels spread geometrically over
the range, plus every uniform ``none@k``'s own mean latency (:func:`latency_levels`): the learned rule at (B, level) against the best fixed plan and uniform, both restricted to
the plans whose mean training latency is ≤ the level (a mix of two such plans is too), by the same
paired-bootstrap tests as without latency (:func:`~isocompute.policy.fallback.choose_rules`); at a level that
is ``none@k``'s own latency, from one grid step below its cost up, a rule replaces uniform only at the strict
level (0.99 for the fixed plan too) and by more than :data:`EQUAL_ACCURACY` (issue 36: a request naming
uniform@k's latency and tokens must not get less than uniform@k). A request
at latency L is served by the chain of the largest level ≤ L (so a fallback never waits longer than
asked; it may leave up to one level's step, (HI/LO)^(1/12), unused).

Worked example: plans none@1 (L̄ 1.0), none@16 (L̄ 2.6) and ``lead:m=3@16s`` (one parallel wave of 16
that stops at the third agreeing finish, L̄ 1.3); at ν = 0 a budget of 6x buys none@16 for the hardest
prompts (latency 1.9 out of fold); asked for L ≤ 1.5, the first ν whose latency at 6x is ≤ 1.5 is, say,
ν = 0.01, and its λ(6x) moves those prompts to ``lead:m=3@16s``, which spends the 6x on tokens of
aborted samples instead of waiting for the sixteenth.

Ignores: per-prompt latency predictions (L̄_a is the plan's mean; a cost head predicts cost per prompt)
and ``match="batch"`` decisions under a latency budget.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from isocompute.errors import BudgetError, InputError
from isocompute.policy.fallback import (
    FIXED_PLAN,
    LEARNED,
    UNIFORM,
    RuleChain,
    choose_rules,
    uniform_actions,
    uniform_oof_costs,
    uniform_utilities,
)
from isocompute.policy.learn.calibration import Calibration, calibrate_by_bisection
from isocompute.policy.learn.crossfit import CrossFit, max_useful_price
from isocompute.policy.learn.learners import budget_grid, price
from isocompute.policy.plans.fixed_rule import fixed_actions, fixed_plan_at, fixed_plan_oof
from isocompute.policy.plans.heldout import budget_table, internal_budget

NUS = np.concatenate([[0.0], np.geomspace(1e-4, 1.0, 13)])  # prices on latency: utility per sample length
N_LEVELS = 13  # latency levels the never-worse chain is chosen at
LEARNER = "utility"


@dataclass(frozen=True, eq=False)
class LatencyTables:
    """What a policy fitted with latency budgets adds (module docstring): ``plan_latency`` (P,) each plan's
    mean training latency; ``nus`` (V,) the prices and ``calibrations`` their budget → λ tables;
    ``latency`` (V, R) the out-of-fold mean latency at each calibration budget; ``levels`` (M,) and
    ``chains`` the never-worse chain at each latency level."""

    plan_latency: np.ndarray
    nus: np.ndarray
    calibrations: tuple[Calibration, ...]
    latency: np.ndarray
    levels: np.ndarray
    chains: tuple[RuleChain, ...]
    fixed_budgets: tuple[dict[str, list[float]] | None, ...] = ()

    def fixed_budget(self, m: int, budget: float) -> float:
        """The fixed plan's internal budget at level ``m`` (:mod:`isocompute.policy.plans.heldout`)."""
        return internal_budget(self.fixed_budgets[m] if self.fixed_budgets else None, budget)

    @property
    def range(self) -> tuple[float, float]:
        return float(self.levels[0]), float(self.levels[-1])

    def check(self, latency_budget: Any) -> float:
        """The latency budget as a float, or BudgetError naming the trained range."""
        lo, hi = self.range
        try:
            L = float(latency_budget)
        except (TypeError, ValueError):
            raise BudgetError(f"latency_budget must be a number, not {latency_budget!r}; pick one in "
                              f"[{lo:g}, {hi:g}] sample lengths.") from None
        if not (np.isfinite(L) and lo * (1 - 1e-9) <= L <= hi * (1 + 1e-9)):
            raise BudgetError(f"latency budget {L:g} is outside the range [{lo:g}, {hi:g}] mean sample lengths per "
                              "request that this policy was trained for (1.0 = waiting for one sample); request one "
                              "in that range or re-fit with a wider --latency-budgets.")
        return min(max(L, lo), hi)

    def level(self, latency_budget: float) -> int:
        """Index of the largest level ≤ ``latency_budget`` (the first one at the range's bottom)."""
        return max(int(np.searchsorted(self.levels, latency_budget * (1 + 1e-9), side="right")) - 1, 0)

    def price_index(self, budget: float, latency_budget: float) -> int:
        """The smallest ν whose out-of-fold latency at ``budget`` is ≤ ``latency_budget`` (else the largest)."""
        for v, cal in enumerate(self.calibrations):
            if float(np.interp(budget, cal.budgets, self.latency[v])) <= latency_budget * (1 + 1e-9):
                return v
        return len(self.calibrations) - 1

    def to_dict(self) -> dict[str, Any]:
        return {"plan_latency": self.plan_latency.tolist(), "nus": self.nus.tolist(),
                "calibrations": [c.to_dict() for c in self.calibrations], "latency": self.latency.tolist(),
                "levels": self.levels.tolist(), "chains": [c.to_dict() for c in self.chains],
                "fixed_budgets": list(self.fixed_budgets)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LatencyTables:
        return cls(np.asarray(d["plan_latency"], dtype=np.float64), np.asarray(d["nus"], dtype=np.float64),
                   tuple(Calibration.from_dict(c) for c in d["calibrations"]),
                   np.asarray(d["latency"], dtype=np.float64), np.asarray(d["levels"], dtype=np.float64),
                   tuple(RuleChain.from_dict(c) for c in d["chains"]), tuple(d.get("fixed_budgets") or ()))


def quick_plans(plan_latency: np.ndarray, level: float) -> np.ndarray:
    """Indices of the plans whose mean latency is ≤ ``level`` (the quickest plan when none is)."""
    keep = np.flatnonzero(plan_latency <= level * (1 + 1e-9))
    return keep if keep.size else np.array([int(np.argmin(plan_latency))], dtype=np.intp)


def quick_ladder(ladder: np.ndarray, plan_latency: np.ndarray, level: float) -> np.ndarray:
    """The uniform ladder's plans whose mean latency is ≤ ``level``: at least two entries (none@1 twice
    when only it fits), since the uniform rule mixes two adjacent ones."""
    lad = ladder[plan_latency[ladder] <= level * (1 + 1e-9)]
    if lad.size == 0:
        lad = ladder[:1]
    return np.repeat(lad, 2) if lad.size == 1 else lad


def fit_latency(policy: Any, job: CrossFit, latency: np.ndarray) -> LatencyTables:
    """The latency tables of a fitted ``policy`` (its utility members and chain settings) on the cross-fit
    ``job`` it was fitted on, with ``latency`` (N, P) each plan's expected latency per training prompt in
    sample lengths (overhead included)."""
    cfg = policy.config
    lat = check_latency(cfg, latency, job.U.shape)
    plan_latency = lat.mean(axis=0)
    lo, hi = cfg.latency_range
    Uh, Ch = oof_predictions(policy, job)
    rows = job.rows
    V, R = NUS.size, job.requested.size
    cals, lat_table = [], np.empty((V, R))
    acts = np.empty((V, R, rows.size), dtype=np.intp)
    for v, nu in enumerate(NUS):
        Ut = Uh - nu * plan_latency[None, :]

        def cost_at(lam: float, Ut: np.ndarray = Ut) -> float:
            return float(job.C[rows, price(Ut, lam, Ch, job.u)].mean())

        cal = calibrate_by_bisection(job.requested, job.targets, cost_at, max_useful_price(Ut, Ch),
                                     n_validation=rows.size, iters=40)
        for r, lam in enumerate(cal.values):
            acts[v, r] = price(Ut, float(lam), Ch, job.u)
            lat_table[v, r] = lat[rows, acts[v, r]].mean()
        cals.append(cal)
    levels = latency_levels(lo, hi, plan_latency[policy.ladder])
    tables = LatencyTables(plan_latency, NUS.copy(), tuple(cals), lat_table, levels, ())
    chains = tuple(_chain_at(policy, job, tables, acts, float(level)) for level in levels)
    search = cfg.heldout_fixed and FIXED_PLAN in (cfg.fallback or ())
    paid = policy.paid_per_request
    unit = job.C[:, policy.ladder[0]] - paid
    fixed = tuple(budget_table(job.U[:, keep], job.C[:, keep] - paid, job.requested, seed=cfg.seed, unit=unit)
                  if search else None for keep in (quick_plans(plan_latency, float(level)) for level in levels))
    return LatencyTables(plan_latency, NUS.copy(), tuple(cals), lat_table, levels, chains, fixed)


def latency_levels(lo: float, hi: float, ladder_latency: np.ndarray) -> np.ndarray:
    """The chain's latency levels: :data:`N_LEVELS` geometric over [lo, hi] and every uniform ``none@k``'s
    mean training latency inside the range, so a request at uniform@k's own latency is served by a chain
    whose uniform and fixed rules may play ``none@k`` (issue 36: with the geometric levels alone the
    level below it left ``none@k`` out)."""
    extra = ladder_latency[(ladder_latency >= lo) & (ladder_latency <= hi)]
    return np.unique(np.concatenate([budget_grid(lo, hi, N_LEVELS), extra]))


def check_latency(cfg: Any, latency: Any, shape: tuple[int, int]) -> np.ndarray | None:
    """``latency`` as an (N, P) float array (InputError unless given exactly with ``cfg.latency_range``,
    finite and of the utilities' ``shape``), or BudgetError when the range starts below the quickest plan's
    mean latency."""
    if (cfg.latency_range is None) != (latency is None):
        raise InputError("pass latency= (each plan's expected latency per prompt) exactly when the config has a "
                         "latency_range (fit --latency-budgets).")
    if latency is None:
        return None
    lat = np.asarray(latency, dtype=np.float64)
    if lat.shape != shape or not np.isfinite(lat).all():
        raise InputError(f"latency must be finite, one value per training prompt and plan, shape {shape}; got "
                         f"{lat.shape}. It needs completion_tokens on every sample of the table.")
    quickest = float(lat.mean(axis=0).min())
    lo, hi = cfg.latency_range
    if lo < quickest * (1 - 1e-9):
        raise BudgetError(f"latency range [{lo:g}, {hi:g}] starts below the quickest plan's mean latency "
                          f"{quickest:.4g} sample lengths on this table; pass --latency-budgets from {quickest:.4g}.")
    return lat


def oof_predictions(policy: Any, job: CrossFit) -> tuple[np.ndarray, np.ndarray]:
    """(Û, Ĉ) of every training prompt by the utility member that did not see it."""
    models = policy.learners_[LEARNER].models
    Uh, Ch = np.empty_like(job.U), np.empty_like(job.U)
    for m, (_, ho) in zip(models, job.folds, strict=True):
        Uh[ho] = m.predict_utilities(job.X[ho])
        Ch[ho] = m.predict_costs(job.X[ho], policy.action_costs_)
    return Uh, Ch


def _chain_at(policy: Any, job: CrossFit, tables: LatencyTables, acts: np.ndarray, level: float) -> RuleChain:
    """The never-worse chain at one latency level (module docstring)."""
    cfg = policy.config
    if not cfg.fallback:
        return RuleChain.single(LEARNED, job.requested)
    rows = job.rows
    pick = [tables.price_index(float(b), level) for b in job.requested]
    scores = {LEARNED: np.stack([job.U[rows, acts[v, r]] for r, v in enumerate(pick)])}
    costs = {LEARNED: np.stack([job.C[rows, acts[v, r]] for r, v in enumerate(pick)])}
    if FIXED_PLAN in cfg.fallback:
        keep = quick_plans(tables.plan_latency, level)
        paid = policy.paid_per_request
        kw = dict(heldout=cfg.heldout_fixed, seed=cfg.seed, unit=job.C[:, policy.ladder[0]] - paid)
        scores[FIXED_PLAN], costs[FIXED_PLAN] = fixed_plan_oof(job.U[:, keep], job.C[:, keep] - paid, job.folds,
                                                              job.requested, **kw)
    if UNIFORM in cfg.fallback:
        lad = quick_ladder(policy.ladder, tables.plan_latency, level)
        scores[UNIFORM] = uniform_utilities(job.U[:, lad], policy.sample_action_costs[lad], job.requested)
        costs[UNIFORM] = uniform_oof_costs(job.C[:, lad] - policy.paid_per_request, job.folds, job.requested)
    kw = dict(level=cfg.fallback_level, seed=cfg.seed, costs=costs if cfg.heldout_fixed else None)
    levels = {FIXED_PLAN: cfg.fixed_plan_level} if FIXED_PLAN in scores else None
    chain = choose_rules(scores, job.requested, margin=cfg.fallback_margin, rule_levels=levels, **kw)
    k = ladder_at(level, tables.plan_latency[policy.ladder])
    if k is None:
        return chain
    # uniform@k's own latency, at budgets from one grid step below its own cost up: uniform there is none@k
    # (or all but), and a rule replaces it only by a gain the reach measure can see, at the strict level
    j = policy.ladder[k]
    u_k = float(job.U[rows, j].mean())
    margin = max(cfg.fallback_margin, EQUAL_ACCURACY / u_k) if u_k > 0 else cfg.fallback_margin
    strict = choose_rules(scores, job.requested, margin=margin, rule_levels={r: cfg.fallback_level for r in scores},
                          **kw)
    b = job.requested
    step = float(b[1] / b[0]) if b.size > 1 and b[0] > 0 else 1.0
    at_k = b * step > policy.sample_action_costs[j] * (1 + 1e-9)
    return dataclasses.replace(chain, choices=tuple(s if a else c for s, c, a in
                                                    zip(strict.choices, chain.choices, at_k, strict=True)))


EQUAL_ACCURACY = 0.002  # accuracies within 0.2 pt are equal (the report's reach tolerance)
STRICT_ON_LADDER = True  # issue 36's admission test at uniform@k's own latency (off: the test before it)


def ladder_at(level: float, ladder_latency: np.ndarray) -> int | None:
    """The rung k whose uniform ``none@k`` has mean latency exactly ``level`` (:func:`latency_levels` adds
    each), or None: there a request names uniform@k's latency, and the chain must not serve worse."""
    if not STRICT_ON_LADDER:
        return None
    hit = np.flatnonzero(np.isclose(level, ladder_latency, rtol=1e-9, atol=0.0))
    return int(hit[-1]) if hit.size else None


def latency_actions(policy: Any, X: np.ndarray | None, u: np.ndarray, route: np.ndarray, budget: float,
                    latency_budget: float) -> tuple[np.ndarray, str, float | None, Any]:
    """(plan index per prompt, the rule that served, λ or None, the rule's evidence) at (budget,
    latency_budget), both already checked; ``X``: the features (needed only where the learned rule serves)."""
    t: LatencyTables = policy.latency_
    m = t.level(latency_budget)
    choice = t.chains[m].at(budget)
    if choice.rule == FIXED_PLAN:
        keep = quick_plans(t.plan_latency, float(t.levels[m]))
        fixed = fixed_plan_at(policy.plan_utility_[keep], policy.sample_action_costs[keep], t.fixed_budget(m, budget))
        return keep[fixed_actions(u, fixed)], FIXED_PLAN, None, choice
    if choice.rule == UNIFORM:
        lad = quick_ladder(policy.ladder, t.plan_latency, float(t.levels[m]))
        return lad[uniform_actions(u, policy.sample_action_costs[lad], budget)], UNIFORM, None, choice
    if X is None:
        raise InputError("the learned rule serves at this budget and latency budget: pass the prompts' features.")
    v = t.price_index(budget, latency_budget)
    lam = t.calibrations[v](budget)
    a = np.zeros(u.size, dtype=np.intp)
    for j, model in enumerate(policy.learners_[LEARNER].models):
        sel = np.flatnonzero(route == j)
        if sel.size:
            Ut = model.predict_utilities(X[sel]) - t.nus[v] * t.plan_latency[None, :]
            a[sel] = price(Ut, lam, model.predict_costs(X[sel], policy.action_costs_), u[sel])
    return a, LEARNED, lam, choice


def rule_at(policy: Any, budget: float, latency_budget: Any) -> str:
    """The rule of the never-worse chain that serves at (``budget``, ``latency_budget``)."""
    t: LatencyTables | None = getattr(policy, "latency_", None)
    if t is None:
        raise BudgetError("this policy was fitted without latency budgets; drop latency_budget, or re-fit with "
                          "--latency-budgets LO:HI (sample lengths, e.g. 1:8).")
    L = t.check(latency_budget)
    return t.chains[t.level(L)].at(budget).rule


def decide_latency(policy: Any, prompts: Any, budget: float, latency_budget: Any, *, probe: Any = None,
                   match: str = "calibrated") -> Any:
    """:meth:`Policy.decide <isocompute.policy.policy.Policy.decide>` under a latency budget too: the
    :class:`~isocompute.policy.decision.Decision` of :func:`latency_actions`, with ``latency_budget`` and
    each prompt's ``expected_latency`` (its plan's mean training latency, sample lengths)."""
    import dataclasses

    from isocompute.policy.decision import make_decision, predicted_costs

    t: LatencyTables | None = getattr(policy, "latency_", None)
    if t is None:
        raise BudgetError("this policy was fitted without latency budgets; drop latency_budget, or re-fit with "
                          "--latency-budgets LO:HI (sample lengths, e.g. 1:8).")
    if match != "calibrated":
        raise InputError("a latency budget is served per request through the calibration tables; use "
                         "match='calibrated' (batch matching prices cost only).")
    L = t.check(latency_budget)
    prompts = list(prompts)
    u, route = policy.prompt_keys(prompts)
    learned = rule_at(policy, budget, L) == LEARNED
    X = policy.features(prompts, probe) if learned else None
    a, rule, lam, choice = latency_actions(policy, X, u, route, budget, L)
    d = make_decision(policy, a, budget, LEARNER, rule=rule, evidence=choice.evidence(), match=match, knob=lam,
                      knob_name="lam" if learned else None,
                      predicted=predicted_costs(policy, X, route, a, LEARNER) if learned else None)
    return dataclasses.replace(d, latency_budget=L, expected_latency=t.plan_latency[a])


def latency_units(arrays: Any, overhead: float) -> np.ndarray:
    """(N, P) each plan's expected latency in sample lengths, ``overhead`` sample lengths per wave, from
    plan arrays with token counts (:class:`~isocompute.policy.plans.arrays.PlanArrays`)."""
    per_sample = tokens_per_sample(arrays.table)
    if per_sample is None:
        raise InputError("latency budgets need completion_tokens on every sample of the outcome table (each "
                         "sample's length); this table has none.")
    return arrays.total_latency(overhead * per_sample) / per_sample


def tokens_per_sample(table: Any) -> float | None:
    """One sample's mean completion tokens on ``table`` — the latency unit, and what a budget ``1x`` is
    in the tokens unit — or None without token counts."""
    from isocompute.solver.costs import token_multiple_of

    try:
        return token_multiple_of(table.mean_completion_tokens)
    except InputError:
        return None


def reachable_latency(latency_range: tuple[float, float] | None, latency: np.ndarray) -> tuple[float, float] | None:
    """``latency_range`` with its bottom raised to the quickest plan's mean latency on these prompts: a
    cross-validation refit's training part may wait a little longer than the whole table on its quickest
    plan (as its budget range is clipped to what it can spend)."""
    if latency_range is None:
        return None
    lo, hi = latency_range
    quickest = float(np.asarray(latency).mean(axis=0).min())
    return (max(lo, quickest), hi) if max(lo, quickest) < hi else (quickest, quickest * (1 + 1e-6))
