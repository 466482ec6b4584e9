"""Several models' outcome tables → the action estimates → a fitted multi-model policy.

:func:`isocompute.stages.inputs.model_estimates` is the pipeline ``fit``, ``solve`` and ``report --outcomes
NAME=TABLE …`` run (in the stages: it grades, which a policy does not):

    join_tables (same prompt ids, else an InputError naming the missing ones)
    → align_answers (one answer-class set over every model's samples, math-verify, cached at --align-cache)
    → ModelTables.with_classes → resolve_model_flops (--model-params NAME=ACTIVE_PARAMS, a config, or the
      table's meta.model_config) → estimate_menu (U and C in FLOPs per prompt and action)

and returns a :class:`ModelEstimates` (the joined tables, the FLOP shapes, the models cheapest first and
the menu's estimates). :func:`fit_multi_policy` fits a :class:`~isocompute.policy.multi.policy.MultiPolicy`
on rows of it: vote weights fitted on those rows (:func:`~isocompute.solver.models.estimates.fit_vote_weights`),
the menu pruned on them (:func:`isocompute.policy.multi.menu.prune_menu`), the learners trained toward the
kept actions on the hull of their mean (cost, utility) on those rows (``learn_on="hull"``: labels 0 off
it; every model's other plans stay in the menu for the single-model rule and a model pin — a soft
restriction: the classifier's oracle labels never name an off-hull column, but the utility learner's Û
of one can still win, e.g. ``Qwen3-14B/none@16`` for 0.4–6% of MATH-500 prompts), the budget range — by default
everything the kept actions can spend, rounded inwards to 4 significant digits as
:func:`isocompute.policy.fitting.default_budget_range` does — and the policy fitted on the kept columns.
Example: three MATH-500 models, 3,150 actions → 40 kept, budgets [1.2e13, 4.6e14] FLOPs.

Ignores: reading files (the CLI), and prompt features beyond the text (a probe or extra features are a
single-model policy's; a multi-model config refuses none, but this pipeline passes neither).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from isocompute.errors import InputError
from isocompute.policy.config import PolicyConfig
from isocompute.policy.multi.menu import MAX_ACTIONS, hull_columns, prune_menu
from isocompute.policy.multi.policy import MultiPolicy
from isocompute.solver.allocate import feasible_range
from isocompute.solver.models.estimates import (
    ActionEstimates,
    fit_vote_weights,
)
from isocompute.solver.models.tables import ModelTables

LEARN_ON = ("hull", "menu")


@dataclass(frozen=True, eq=False)
class ModelEstimates:
    """The joined, aligned ``tables``, each model's FLOP shape ``flops``, the ``models`` cheapest first,
    and the menu's ``estimates`` (every prompt, every action)."""

    tables: ModelTables
    flops: dict[str, Any]
    models: tuple[str, ...]
    estimates: ActionEstimates

    @property
    def prompts(self) -> list[str]:
        return self.tables.prompts


def budget_range_of(C: np.ndarray) -> tuple[float, float]:
    """What the columns can spend on average, rounded inwards to 4 significant digits of the upper end."""
    lo, hi = feasible_range(C)
    step = 10.0 ** (math.floor(math.log10(hi)) - 3) if hi > 0 else 1.0
    lo, hi = math.ceil(lo / step - 1e-9) * step, math.floor(hi / step + 1e-9) * step
    return float(lo), float(hi)


def fit_multi_policy(me: ModelEstimates, config: PolicyConfig, *, rows: Sequence[int] | np.ndarray | None = None,
                     max_actions: int = MAX_ACTIONS, feasible_budgets: bool = True, learn_on: str = "hull",
                     fallback: Sequence[str] | None = None, progress: bool = False) -> MultiPolicy:
    """Fit a multi-model policy on ``rows`` of ``me`` (default all prompts; module docstring). ``config``
    gives everything but the menu (its ``models``/``model_actions`` are set here; cost unit flops).
    ``learn_on``: the columns the learners are trained toward — ``hull`` (default) the vertices of the
    upper concave hull of the kept actions' mean (cost, utility) on these rows, ``menu`` every kept action.
    ``fallback``: the never-worse chain after the learned rule (default ``escalate, fixed_plan,
    single_model``; ``()`` when ``config.fallback`` is empty, i.e. ``--no-fallback``)."""
    if learn_on not in LEARN_ON:
        raise InputError(f"learn_on must be one of {', '.join(LEARN_ON)}; got {learn_on!r}.")
    r = np.arange(len(me.prompts)) if rows is None else np.asarray(rows, dtype=np.int64)
    est = me.estimates.subset(r)
    est = fit_vote_weights(est)
    est = est.select(prune_menu(est, me.models, max_actions=max_actions))
    if config.probe is not None or config.feature_extras:
        raise InputError("a multi-model policy reads the prompt text only; drop --probe-model and --features.")
    cfg = dataclasses.replace(config, cost_unit="flops", plans=(), models=me.models,
                              model_actions=tuple(a.name for a in est.actions),
                              fallback=(tuple(fallback) if fallback is not None
                                        else None if config.fallback else ()))
    if feasible_budgets:
        cfg = dataclasses.replace(cfg, budget_range=budget_range_of(est.cost))
    prompts = [me.prompts[i] for i in r]
    labels = est.utility
    learnable = np.arange(len(est.actions))
    if learn_on == "hull":  # the learners' labels are 0 off the hull (a soft restriction, module docstring)
        learnable = hull_columns(est.utility.mean(axis=0), est.cost.mean(axis=0))
        labels = np.zeros_like(est.utility)
        labels[:, learnable] = est.utility[:, learnable]
    policy = MultiPolicy(cfg)
    policy.fit_arrays(prompts, est.utility, est.cost, samples=est.samples.sum(axis=2), waves=est.waves,
                      labels=labels, progress=progress)
    policy.training_data_ = {"prompts_in_table": len(me.prompts), "dropped": 0, "dropped_ids": [], "min_samples": 0,
                             "ragged_prompts": 0, "summary": "", "menu_actions": len(me.estimates.actions),
                             "kept_actions": len(est.actions), "learn_on": learn_on,
                             "learnable_actions": len(learnable)}
    return policy


def policy_columns(policy: MultiPolicy, est: ActionEstimates) -> np.ndarray:
    """Column of ``est`` for each of the policy's actions (InputError naming one the estimates lack)."""
    index = {a: j for j, a in enumerate(est.actions)}
    missing = [a.name for a in policy.model_actions if a not in index]
    if missing:
        raise InputError(f"the policy's action {missing[0]!r} is not in this menu ({len(missing)} missing); estimate "
                         "the menu the policy was fitted with (same models and menu settings).")
    return np.array([index[a] for a in policy.model_actions], dtype=np.int64)
