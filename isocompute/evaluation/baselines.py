"""The report's fixed-plan baselines: the best fixed plan of each stopping-rule family, chosen out of fold.

What a user would run instead of a learned policy is one stopping rule for every prompt: ESC's window
(Li et al. 2024), Adaptive-Consistency's Beta or Dirichlet criterion (Aggarwal et al. 2023), the
Best-of-∞ Bayes factor (Komiyama et al.), or a lead rule, each with its threshold and its most samples
tuned. For each family (:data:`isocompute.policy.plans.menu.FAMILY_BASELINES`, plus the uniform ladder
``none@k`` so every budget is reachable) and for all of them together (``fixed_best``, with the policy's
own menu), the report's cross-validation chooses on each training part the best budget-matched mix of
two of the family's plans (:func:`isocompute.policy.plans.fixed.choose_fixed_plan`) and scores it on the
held-out part: accuracy, realised cost and expected waves per prompt, and with token counts expected
tokens and latency (``channels``, :mod:`isocompute.evaluation.channels`).

Worked example: on a training part where ``lead:m=2@1x5`` averages (3.6 samples, 0.318) and
``lead:m=2@1x6`` (4.2, 0.322), the lead baseline at budget 4 plays the first with probability 1/3 and
the second with 2/3; a held-out prompt scores ⅓·U[i, first] + ⅔·U[i, second].

Ignores: the policy (the baselines read no features) and what it pays per request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from isocompute.policy.plans.fixed import choose_fixed_plan
from isocompute.policy.plans.menu import (
    FAMILY_BASELINES,
    PARALLEL_BASELINES,
    family_plans,
    ladder,
    parallel_family_plans,
)
from isocompute.solver.plans.plan import Plan

BEST = "best"


@dataclass(frozen=True, eq=False)
class FixedBaselines:
    """Plan arrays of every baseline plan over all prompts — ``utility``, ``cost``, ``waves`` (N, Q) —
    and per baseline (``lead`` … ``bayes``, ``best``) its columns; ``channels``: more (N, Q) per-plan
    arrays by name (``tokens``, ``latency``; empty without token counts)."""

    plans: tuple[Plan, ...]
    utility: np.ndarray
    cost: np.ndarray
    waves: np.ndarray
    columns: Mapping[str, np.ndarray]
    channels: Mapping[str, np.ndarray] = field(default_factory=dict)


def baseline_plans(menu: Sequence[Plan], actions: Sequence[int]) -> tuple[tuple[Plan, ...], dict[str, np.ndarray]]:
    """(every plan any baseline uses, columns per baseline): each family with the ladder ``none@k``,
    k ∈ actions, capped at the largest k — and, when the ``menu`` holds parallel-stop plans, each family
    in that mode and short-m@k (:data:`~isocompute.policy.plans.menu.PARALLEL_BASELINES`); ``best`` = all
    of them and the policy's ``menu``."""
    k_max = int(max(actions))
    index: dict[str, int] = {}
    plans: list[Plan] = []

    def cols(ps: Sequence[Plan]) -> np.ndarray:
        for p in ps:
            if p.name not in index:
                index[p.name] = len(plans)
                plans.append(p)
        return np.array(sorted({index[p.name] for p in ps}), dtype=np.intp)

    lad = ladder(actions)
    out = {fam: cols([*lad, *family_plans(fam, k_max)]) for fam in FAMILY_BASELINES}
    if any(any(p.parallel) for p in menu):  # parallel-stop baselines where the policy may play such plans
        out.update({name: cols([*lad, *parallel_family_plans(name, k_max)]) for name in PARALLEL_BASELINES})
    out[BEST] = cols([*lad, *menu, *plans])
    return tuple(plans), out


def method_name(baseline: str) -> str:
    """``lead`` → ``fixed_lead``: the baseline's method name in an evaluation."""
    return f"fixed_{baseline}"


def score_baselines(baselines: FixedBaselines, train: np.ndarray, test: np.ndarray, budgets: np.ndarray,
                    scores: dict[str, Any], methods: Sequence[str]) -> None:
    """Fill ``scores`` (the arrays of one held-out part, :func:`isocompute.evaluation.evaluate._score`) with
    every baseline's held-out utility, cost and waves (and each channel ``scores`` holds) at each budget,
    chosen on ``train``."""
    M = {m: j for j, m in enumerate(methods)}
    for name, cols in baselines.columns.items():
        U, C, W = (x[:, cols] for x in (baselines.utility, baselines.cost, baselines.waves))
        u_bar, c_bar = U[train].mean(axis=0), C[train].mean(axis=0)
        m = M[method_name(name)]
        for bi, b in enumerate(budgets):
            choice = choose_fixed_plan(u_bar[None], c_bar[None], max(float(b), float(c_bar.min())))
            scores["utility"][m, bi] = choice.utility(U[test])
            scores["cost"][m, bi] = choice.cost(C[test])
            scores["waves"][m, bi] = choice.cost(W[test])
            for k, X in baselines.channels.items():
                if k in scores:
                    scores[k][m, bi] = choice.cost(X[test][:, cols])


def describe_choices(baselines: FixedBaselines, budget: float) -> dict[str, str]:
    """Each baseline's choice at ``budget`` on every prompt (what the report names), e.g.
    ``{"lead": "0.844·lead:m=2@1x5 + 0.156·lead:m=2@1x6", …}``."""
    out = {}
    for name, cols in baselines.columns.items():
        U, C = baselines.utility[:, cols], baselines.cost[:, cols]
        c_bar = C.mean(axis=0)
        choice = choose_fixed_plan(U.mean(axis=0)[None], c_bar[None], max(float(budget), float(c_bar.min())))
        out[name] = choice.describe([baselines.plans[j].name for j in cols])
    return out


def baseline_choices(baselines: FixedBaselines | None, budgets: Sequence[float]) -> list[dict[str, Any]] | None:
    """What each baseline plays at each budget when chosen on every prompt (report.json's
    ``baseline_choices``); None without baselines."""
    if baselines is None:
        return None
    return [{"budget": float(b), "plays": describe_choices(baselines, float(b))} for b in budgets]


def length_rule(train_lengths: np.ndarray, lengths: np.ndarray, share: float) -> np.ndarray:
    """Probability that each prompt takes the dearer action when the longest ``share`` of the training
    prompts do: 1 above the threshold length, 0 below, and a split at it so the training share is exact."""
    t = np.sort(np.asarray(train_lengths))
    m = share * t.size  # training prompts to upgrade
    if m <= 0:
        return np.zeros(len(lengths))
    if m >= t.size:
        return np.ones(len(lengths))
    thr = t[t.size - int(np.ceil(m))]
    above = int((t > thr).sum())
    at = int((t == thr).sum())
    r = (m - above) / at
    lengths = np.asarray(lengths)
    return np.where(lengths > thr, 1.0, np.where(lengths == thr, r, 0.0))
