"""Expected utility and cost of multi-model actions, per prompt: the columns of U and C for the solver.

For every model the plans its stages use are estimated once (:func:`~isocompute.solver.plans.estimates.estimate_plans`
with ``split=True``: exact over random orders of that model's samples), giving per prompt and plan the
utility U, the probability P_F that the rule fired and the fired part U_F = E[U·1{fired}], and the
expected samples, completion tokens, FLOPs (decode of the drawn samples plus the prefill, once per plan
with prefix caching, once per wave without) and waves. Different models' samples are drawn
independently, so a cascade of stages 1 … L, each reached only when all before it ran out, has

    reach_1 = 1,   reach_{s+1} = reach_s · (1 − P_F,s)
    E[cost of model m_s] = reach_s · E[C_s]           (samples, tokens, FLOPs; waves alike)
    vote "last":  U = Σ_{s<L} reach_s · U_F,s + reach_L · U_L         (exact)
    vote "all":   U = U_F,1 + (1 − P_F,1) · V          (V = E[credit | stage 1 ran out] by Monte Carlo,
                                                          :mod:`~isocompute.solver.models.montecarlo`)

A single-model action is the L = 1 case (U = U_L), so its columns equal that model's plan estimates.
Worked example (:mod:`isocompute.solver.models.actions`): A = a, a, b; B = b, b, a, b, ``A/lead:m=2@2 >
B/none@1``: P_F = 1/3, U_F = 1/3, U_B = 1/4 → U = 1/3 + 2/3 · 1/4 = 1/2; A draws 2 samples, B 2/3.

Costs are exact for every action (stopping never depends on the vote across models); so is the utility
of single plans and of last-stage votes — standard errors 0 — while votes over all samples carry the
Monte Carlo standard error (1 − P_F,1) · SE(V). Cascade stages must be plans the exact method covers (≤ 24 samples).

The solver is unchanged: ``U = est.utility`` and ``C = est.cost`` (FLOPs) are its columns, sorted per
prompt by :meth:`ActionEstimates.cost_order`; :func:`oracle` runs :func:`~isocompute.solver.allocate.allocate`
on them and maps the choice back to actions. :func:`fit_vote_weights` keeps, of actions that differ only in their weights, the one whose weights give
the highest mean utility on the given (training) prompts. Ignores: verifier scores, and everything the
plan estimators ignore.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from isocompute.errors import InputError
from isocompute.flops import ModelFlops
from isocompute.solver.allocate import Allocation, allocate
from isocompute.solver.models.actions import Action, MenuConfig, default_actions, parse_action
from isocompute.solver.models.costs import sample_flops
from isocompute.solver.models.montecarlo import VoteGroup, simulate_votes
from isocompute.solver.models.tables import ModelTables
from isocompute.solver.plans.estimates import CostOrder, by_cost, estimate_plans
from isocompute.solver.plans.plan import Plan

EXACT_MAX_SAMPLES = 24


@dataclass(frozen=True, eq=False)
class ActionEstimates:
    """(N, A) ``utility`` (its ``utility_se``) and ``waves``; (N, A, M) expected ``samples``, ``tokens``
    and ``flops`` of each of the M ``models``; ``method[a]`` ``"exact"`` or ``"monte-carlo"``;
    ``completion_only[m]`` whether model m's FLOPs leave the prompt out (no prompt token counts)."""

    models: tuple[str, ...]
    actions: tuple[Action, ...]
    ids: list[str]
    utility: np.ndarray
    utility_se: np.ndarray
    samples: np.ndarray
    tokens: np.ndarray
    flops: np.ndarray
    waves: np.ndarray
    method: tuple[str, ...]
    n_orders: int
    seed: int
    completion_only: dict[str, bool]
    prefix_caching: bool

    @property
    def names(self) -> list[str]:
        return [a.name for a in self.actions]

    @property
    def cost(self) -> np.ndarray:
        """(N, A) expected FLOPs over all models: the solver's C."""
        return self.flops.sum(axis=2)

    def cost_order(self) -> CostOrder:
        """U and C sorted per prompt by cost, as :func:`~isocompute.solver.allocate.allocate` needs them."""
        return by_cost(self.utility, self.cost)

    def index(self, name: str | Action) -> int:
        key = name if isinstance(name, Action) else parse_action(name)
        try:
            return self.actions.index(key)
        except ValueError:
            raise InputError(f"action {key.name!r} is not in this menu of {len(self.actions)} actions.") from None

    def columns(self, *, kind: str | Sequence[str] | None = None, model: str | None = None) -> np.ndarray:
        """Indices of the actions of ``kind`` (single, cascade, ensemble) and/or using only ``model``."""
        kinds = (kind,) if isinstance(kind, str) else kind
        return np.array([j for j, a in enumerate(self.actions)
                         if (kinds is None or a.kind in kinds) and (model is None or a.models == (model,))],
                        dtype=np.int64)

    def select(self, cols: Sequence[int] | np.ndarray) -> ActionEstimates:
        c = np.asarray(cols, dtype=np.int64)
        return replace(self, actions=tuple(self.actions[j] for j in c), utility=self.utility[:, c],
                       utility_se=self.utility_se[:, c], samples=self.samples[:, c], tokens=self.tokens[:, c],
                       flops=self.flops[:, c], waves=self.waves[:, c], method=tuple(self.method[j] for j in c))

    def subset(self, rows: Sequence[int] | np.ndarray) -> ActionEstimates:
        r = np.asarray(rows)
        r = np.flatnonzero(r) if r.dtype == bool else r.astype(np.int64)
        return replace(self, ids=[self.ids[i] for i in r], utility=self.utility[r], utility_se=self.utility_se[r],
                       samples=self.samples[r], tokens=self.tokens[r], flops=self.flops[r], waves=self.waves[r])


@dataclass(frozen=True, eq=False)
class _Model:
    """One model's plan estimates: column ``index[plan]``; (N, P) arrays."""

    index: dict[Plan, int]
    u: np.ndarray
    u_se: np.ndarray
    uf: np.ndarray
    pf: np.ndarray
    samples: np.ndarray
    tokens: np.ndarray
    flops: np.ndarray
    waves: np.ndarray
    exact: tuple[bool, ...]


def models_by_cost(tables: ModelTables, flops: Mapping[str, ModelFlops]) -> list[str]:
    """Model names, cheapest mean FLOPs per sample first (the order cascades escalate in)."""
    mean = {}
    for name in tables.names:
        t = tables.tables[name]
        sf = sample_flops(t, flops[name])
        mean[name] = float((sf.decode.sum() + (sf.prefill * t.n_samples).sum()) / t.n_samples.sum())
    return sorted(tables.names, key=mean.__getitem__)


def estimate_actions(tables: ModelTables, flops: Mapping[str, ModelFlops], actions: Sequence[Action | str], *,
                     n_orders: int = 200, seed: int = 0, prefix_caching: bool = True,
                     method: str = "auto") -> ActionEstimates:
    """Per prompt and action, expected utility and costs (module docstring). ``flops[name]`` each model's
    FLOP shape (:func:`~isocompute.solver.models.costs.resolve_model_flops`). ``method="monte-carlo"``
    estimates last-stage votes of cascades by Monte Carlo too (the cross-check of the exact formula; it
    values a class by all models' samples in it, the exact formula by the last model's, which agree
    wherever the verdicts do: :meth:`ModelTables.mixed_classes` = 0)."""
    acts = tuple(a if isinstance(a, Action) else parse_action(a) for a in actions)
    if not acts:
        raise InputError("estimate_actions needs at least one action (e.g. default_actions(models)).")
    if method not in ("auto", "monte-carlo"):
        raise InputError(f"method must be 'auto' or 'monte-carlo', not {method!r}.")
    names = tables.names
    for a in acts:
        for m in a.models:
            if m not in names:
                raise InputError(f"action {a.name!r} uses model {m!r}, which is not among the joined models {list(names)}.")
    mixing = [a for a in acts if (a.vote == "all" or method == "monte-carlo") and len(a.stages) > 1]
    if mixing and not tables.aligned:
        raise InputError(f"{len(mixing)} actions vote over several models' samples (e.g. {mixing[0].name!r}); they need "
                         "answer classes aligned across models: ModelTables.with_classes(align_answers(...).classes).")
    missing = [m for m in names if m not in flops and any(m in a.models for a in acts)]
    if missing:
        raise InputError(f"no FLOP shape for {missing}; resolve_model_flops(tables, params=..., configs=...) gives one per model.")
    per = {m: _estimate_model(tables, m, flops[m], acts, n_orders, seed, prefix_caching) for m in names
           if any(m in a.models for a in acts)}
    N, A, M = len(tables), len(acts), len(names)
    U, U_se, W = np.zeros((N, A)), np.zeros((N, A)), np.zeros((N, A))
    S, T, F = np.zeros((N, A, M)), np.zeros((N, A, M)), np.zeros((N, A, M))
    how = ["exact"] * A
    groups: dict[tuple, list[int]] = {}
    for j, a in enumerate(acts):
        groups.setdefault((a.models, a.vote), []).append(j)
    mc_groups, mc_cols = [], []
    for (models, vote), cols in groups.items():
        L = len(models)
        idx = [np.array([per[m].index[acts[j].stages[s].plan] for j in cols]) for s, m in enumerate(models)]
        if L > 1:
            for s, m in enumerate(models):
                bad = [acts[j].stages[s].plan.name for j, i in zip(cols, idx[s], strict=True) if not per[m].exact[i]]
                if bad:
                    raise InputError(f"cascade stage plan {bad[0]} on {m} is beyond the exact estimator's "
                                     f"{EXACT_MAX_SAMPLES} samples; use plans of at most {EXACT_MAX_SAMPLES} samples in cascades.")
        reach = np.ones((N, len(cols)))
        u = np.zeros((N, len(cols)))
        for s, m in enumerate(models):
            e, i, mi = per[m], idx[s], names.index(m)
            S[:, cols, mi], T[:, cols, mi], F[:, cols, mi] = (reach * e.samples[:, i], reach * e.tokens[:, i],
                                                              reach * e.flops[:, i])
            W[:, cols] += reach * e.waves[:, i]
            u += reach * (e.u[:, i] if s == L - 1 else e.uf[:, i])
            if L == 1:
                U_se[:, cols] = e.u_se[:, i]
                how_j = ["exact" if e.exact[k] else "monte-carlo" for k in i]
                for j, h in zip(cols, how_j, strict=True):
                    how[j] = h
            reach = reach * (1.0 - e.pf[:, i])
        U[:, cols] = u
        if L > 1 and (vote == "all" or method == "monte-carlo"):
            weights = np.array([acts[j].weights or (1.0,) * L for j in cols])
            mc_groups.append(VoteGroup(models=tuple(names.index(m) for m in models),
                                       plans=tuple(tuple(s.plan for s in acts[j].stages) for j in cols),
                                       weights=weights, vote=vote))
            mc_cols.append(cols)
    if mc_groups:
        values = tables.class_values()
        codes = [tables.codes[m] for m in names]
        res = simulate_votes(codes, values, mc_groups, n_orders=n_orders, seed=seed)
        for cols, g, (mean, se) in zip(mc_cols, mc_groups, res, strict=True):
            first = per[names[g.models[0]]]
            i = np.array([first.index[acts[j].stages[0].plan] for j in cols])
            U[:, cols] = first.uf[:, i] + (1.0 - first.pf[:, i]) * mean
            U_se[:, cols] = (1.0 - first.pf[:, i]) * se
            for j in cols:
                how[j] = "monte-carlo"
    completion_only = {m: sample_flops(tables.tables[m], flops[m]).completion_only for m in per}
    return ActionEstimates(models=names, actions=acts, ids=list(tables.ids), utility=U, utility_se=U_se, samples=S,
                           tokens=T, flops=F, waves=W, method=tuple(how), n_orders=n_orders, seed=seed,
                           completion_only=completion_only, prefix_caching=prefix_caching)


def _estimate_model(tables: ModelTables, m: str, model: ModelFlops, acts: Sequence[Action], n_orders: int,
                    seed: int, prefix_caching: bool) -> _Model:
    plans = list(dict.fromkeys(s.plan for a in acts for s in a.stages if s.model == m))
    t = tables.tables[m]
    sf = sample_flops(t, model)
    ct = np.where(t.mask, t.completion_tokens, 0.0)
    pe = estimate_plans(tables.codes[m], t.correct, plans, channels={"tokens": ct, "flops": sf.decode},
                        split=True, n_orders=n_orders, seed=seed, exact_max_samples=EXACT_MAX_SAMPLES)
    assert pe.fired is not None  # split=True
    prefill = sf.prefill[:, None] * (1.0 if prefix_caching else pe.waves)
    return _Model(index={p: j for j, p in enumerate(plans)}, u=pe.utility, u_se=pe.utility_se, uf=pe.fired.utility,
                  pf=pe.fired.prob, samples=pe.samples, tokens=pe.channels["tokens"],
                  flops=pe.channels["flops"] + prefill, waves=pe.waves,
                  exact=tuple(x == "exact" for x in pe.method))


def estimate_menu(tables: ModelTables, flops: Mapping[str, ModelFlops], cfg: MenuConfig | None = None, *,
                  prefix_caching: bool = True) -> ActionEstimates:
    """:func:`estimate_actions` on :func:`~isocompute.solver.models.actions.default_actions` for these models,
    cheapest first (:func:`models_by_cost`)."""
    cfg = cfg or MenuConfig()
    acts = default_actions(models_by_cost(tables, flops), cfg)
    return estimate_actions(tables, flops, acts, n_orders=cfg.n_orders, seed=cfg.seed, prefix_caching=prefix_caching)


def fit_vote_weights(est: ActionEstimates, rows: Sequence[int] | np.ndarray | None = None) -> ActionEstimates:
    """Of each set of actions that differ only in their vote weights, keep the one with the highest mean
    utility over ``rows`` (e.g. the training folds; default all prompts); on a tie, the weights closest
    to equal (smallest Σ|log w|). Other actions are kept as they are, in their order."""
    r = np.arange(est.utility.shape[0]) if rows is None else np.asarray(rows)
    mean = est.utility[r].mean(axis=0)
    best: dict[tuple, int] = {}
    for j, a in enumerate(est.actions):
        key = (a.stages, a.vote)
        k = best.get(key)
        if k is None or (mean[j], -_spread(a)) > (mean[k], -_spread(est.actions[k])):
            best[key] = j
    return est.select(sorted(best.values()))


def _spread(a: Action) -> float:
    return float(np.abs(np.log(np.asarray(a.weights or (1.0,)))).sum())


@dataclass(frozen=True, eq=False)
class MenuOracle:
    """The hindsight oracle over a menu at one budget: the solver's ``allocation`` (on cost-sorted
    columns), ``probs`` (N, A) the probability of each action (menu order) per prompt, and per prompt the
    expected ``utility`` and ``cost`` under it (means: :attr:`accuracy`, :attr:`mean_cost`); ``binding``
    False when every prompt's best action fits the budget (the rest of it buys nothing)."""

    allocation: Allocation
    probs: np.ndarray
    utility: np.ndarray
    cost: np.ndarray
    binding: bool

    @property
    def accuracy(self) -> float:
        return float(self.utility.mean())

    @property
    def mean_cost(self) -> float:
        return float(self.cost.mean())


def oracle(est: ActionEstimates, budget: float) -> MenuOracle:
    """:func:`~isocompute.solver.allocate.allocate` over every action of ``est`` at a mean-FLOPs ``budget``
    (above the dearest choice everywhere it does not bind: the best actions are taken).

    The solver's hulls cost O(A²) per prompt, so each prompt's columns are first cut to its Pareto set
    (cost ascending, utility strictly rising: no other column can be on the hull) and padded with
    copies of its last one; the optimum is unchanged."""
    order = est.cost_order()
    U, C, idx = _pareto(order.utility, order.cost)
    top = float(C[:, -1].mean())  # every prompt on its best column: spending more buys nothing
    alloc = allocate(U, C, min(float(budget), top))
    compact = alloc.action_probs()
    probs = np.zeros_like(est.utility)
    rows = np.arange(U.shape[0])[:, None]
    np.add.at(probs, (rows, order.order[rows, idx]), compact)  # padding copies add up on one column
    return MenuOracle(allocation=alloc, probs=probs, utility=(probs * est.utility).sum(axis=1),
                      cost=(probs * est.cost).sum(axis=1), binding=budget < top and alloc.status == 0)


def _pareto(U: np.ndarray, C: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Columns (cost-sorted per row) kept where utility beats every cheaper column's, left-packed and
    padded with the row's last kept column; ``idx`` (N, A') the kept columns' positions."""
    prev = np.maximum.accumulate(np.concatenate([np.full((U.shape[0], 1), -np.inf), U[:, :-1]], axis=1), axis=1)
    keep = U > prev
    width = int(keep.sum(axis=1).max())
    pos = np.argsort(~keep, axis=1, kind="stable")[:, :width]  # kept columns first, in cost order
    n_kept = keep.sum(axis=1)
    last = np.take_along_axis(pos, (n_kept - 1)[:, None], axis=1)
    pos = np.where(np.arange(width)[None, :] < n_kept[:, None], pos, last)
    return np.take_along_axis(U, pos, 1), np.take_along_axis(C, pos, 1), pos
