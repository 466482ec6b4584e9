"""The multi-model policy: per prompt, an action over several models — a plan on one model, a cascade
from cheap to strong, or an ensemble vote — under one average FLOP budget, never worse than one model.

:class:`MultiPolicy` is the single-model :class:`~isocompute.policy.policy.Policy` (features, cross-fitted
members, budget calibration, cost head, the never-worse tests) whose columns are the actions of
:mod:`isocompute.solver.models.actions` instead of plans. The learner sees each action through
:class:`ActionView`, the few numbers a plan gives it: its most samples (summed over stages), its waves
and the samples it always draws (every stage before the first stopping rule, and that rule's first
wave). Columns: U = :attr:`ActionEstimates.utility`, C = :attr:`ActionEstimates.cost` (FLOPs summed over
models), expected samples summed over models (:mod:`isocompute.policy.multi.fit` builds them).

The never-worse chain is ``learned → escalate → fixed_plan → single_model``:

* ``escalate`` — the fixed action's two-action mix with the dearer action given to the prompts a
  learned headroom score ranks first (:mod:`isocompute.policy.multi.escalate`);
* ``fixed_plan`` — the best fixed *action*: one action, or a budget-matched mix of two, for everyone,
  chosen on the training folds (:mod:`isocompute.policy.plans.fixed_rule` over the action columns);
* ``single_model`` — the best single model with its best fixed plan: for each model, the best
  budget-matched mix of two of its own single-model plans (:func:`single_model_choice`), and of those
  the model with the highest mean utility on the training folds; a model whose cheapest plan costs
  more than the budget on average is not a candidate (if none is, the cheapest model's cheapest plan).

Each rule serves only where the paired bootstrap supports its gain over the next
(:func:`isocompute.policy.fallback.choose_rules`, the same levels as for plans).

Serving (:meth:`MultiPolicy.decide`): the :class:`~isocompute.policy.decision.Decision` carries per
prompt ``model_actions`` (the :class:`~isocompute.solver.models.actions.Action` to run), ``plans = ()``
and ``k`` = each action's most samples summed over its stages. ``decide(..., model="Qwen3-14B")`` pins a
model: only actions whose every stage is on it — served as that model's best fixed plan at the budget
(rule ``single_model``; the learned choice ranges over every model's actions, so it is not used for a
pin). Worked example: at a budget of 2e13 FLOPs a pin on a model whose cheapest plan averages 6.8e13
plays that plan and spends 6.8e13 (the evidence says so).

Ignores: executing actions (the gateway), estimating them (:mod:`isocompute.solver.models.estimates`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from isocompute.errors import InputError
from isocompute.policy.decision import Decision
from isocompute.policy.fallback import FIXED_PLAN, LEARNED, RuleChain, choose_rules
from isocompute.policy.learn.crossfit import CrossFit
from isocompute.policy.multi.escalate import ESCALATE, HeadroomScore
from isocompute.policy.plans.fixed import FixedPlanChoice, choose_fixed_plan
from isocompute.policy.plans.fixed_rule import fixed_actions, fixed_plan_scores
from isocompute.policy.policy import Policy
from isocompute.solver.models.actions import Action, parse_action
from isocompute.solver.plans.rules import NoRule

SINGLE_MODEL = "single_model"


@dataclass(frozen=True)
class ActionView:
    """An :class:`Action` as the plan machinery reads a column: ``name``, ``max_samples`` (summed over
    stages), ``n_waves`` (summed) and ``waves`` whose first entry is the samples always drawn (every
    stage up to the first with a stopping rule, and that stage's first wave)."""

    action: Action

    @property
    def name(self) -> str:
        return self.action.name

    @property
    def max_samples(self) -> int:
        return int(sum(s.plan.max_samples for s in self.action.stages))

    @property
    def n_waves(self) -> int:
        return int(sum(s.plan.n_waves for s in self.action.stages))

    @property
    def waves(self) -> tuple[int, ...]:
        always = 0
        for s in self.action.stages:
            if not isinstance(s.plan.rule, NoRule):
                always += s.plan.waves[0]
                break
            always += s.plan.max_samples
        return (always,)

    @property
    def rule(self) -> Any:
        return self.action.stages[0].plan.rule


def single_model_choice(U: np.ndarray, C: np.ndarray, columns: dict[str, np.ndarray],
                        budget: float) -> tuple[str, FixedPlanChoice]:
    """(model, its choice with ``lo``/``hi`` as indices into the full columns): the model whose best
    budget-matched fixed plan has the highest mean utility on these rows (module docstring)."""
    u_bar, c_bar = U.mean(axis=0), C.mean(axis=0)
    best: tuple[str, FixedPlanChoice] | None = None
    for m, cols in columns.items():
        if c_bar[cols].min() > budget:
            continue
        ch = choose_fixed_plan(u_bar[cols][None], c_bar[cols][None], float(budget))
        ch = dataclasses.replace(ch, lo=int(cols[ch.lo]), hi=int(cols[ch.hi]))
        if best is None or ch.train_utility > best[1].train_utility:
            best = (m, ch)
    if best is None:  # the budget is below every model's cheapest plan: the cheapest one
        m = min(columns, key=lambda name: c_bar[columns[name]].min())
        j = int(columns[m][np.argmin(c_bar[columns[m]])])
        best = (m, FixedPlanChoice(j, j, 0.0, float(budget), float(c_bar[j]), float(u_bar[j])))
    return best


def single_model_scores(U: np.ndarray, C: np.ndarray, columns: dict[str, np.ndarray],
                        folds: Sequence[tuple[np.ndarray, np.ndarray]], budgets: Sequence[float]) -> np.ndarray:
    """(B, N) out-of-fold utility under the single-model rule chosen on the other folds at each budget."""
    out = np.empty((len(budgets), U.shape[0]))
    for tr, ho in folds:
        for bi, b in enumerate(budgets):
            out[bi, ho] = single_model_choice(U[tr], C[tr], columns, float(b))[1].utility(U[ho])
    return out


class MultiPolicy(Policy):
    """A fitted multi-model policy (module docstring); fit with :func:`isocompute.policy.multi.fit.fit_multi_policy`."""

    MULTI_MODEL = True  # persistence.load_policy reads a multi-model artifact into this class only

    @cached_property
    def plans(self) -> tuple[ActionView, ...]:  # type: ignore[override]
        if not self.config.model_actions:
            raise InputError("a MultiPolicy needs config.model_actions (fit it with fit_multi_policy).")
        return tuple(ActionView(parse_action(n)) for n in self.config.model_actions)

    @property
    def model_actions(self) -> tuple[Action, ...]:
        """The menu: column a is ``model_actions[a]``."""
        return tuple(v.action for v in self.plans)

    @property
    def models(self) -> tuple[str, ...]:
        """The model names, cheapest first."""
        return self.config.models

    @property
    def has_menu(self) -> bool:
        return True

    @cached_property
    def model_columns(self) -> dict[str, np.ndarray]:
        """Per model, the columns of its single-model actions."""
        return {m: np.array([j for j, a in enumerate(self.model_actions) if a.models == (m,)], dtype=np.intp)
                for m in self.models}

    def _menu_note(self) -> str:
        return f"{len(self.plans)} actions over {', '.join(self.models)}"

    def _choose_rules(self, job: CrossFit, oof: Any) -> RuleChain:
        cfg = self.config
        if not cfg.fallback:
            return RuleChain.single(LEARNED, job.requested)
        C = job.C - self.paid_per_request
        scores = {LEARNED: np.stack([job.U[job.rows, oof(float(b))] for b in job.requested])}
        if ESCALATE in cfg.fallback:
            if getattr(self, "escalate_", None) is None:  # one score for every learner's chain
                self.escalate_ = HeadroomScore(n_rounds=cfg.n_rounds, num_leaves=cfg.num_leaves,
                                               learning_rate=cfg.learning_rate, min_data_in_leaf=cfg.min_data_in_leaf,
                                               seed=cfg.seed).fit(job.X, job.U, C, job.folds, job.u)
            scores[ESCALATE] = self.escalate_.oof_scores(job.U, C, job.folds, job.requested)
        if FIXED_PLAN in cfg.fallback:
            scores[FIXED_PLAN] = fixed_plan_scores(job.U, C, job.folds, job.requested)
        if SINGLE_MODEL in cfg.fallback:
            scores[SINGLE_MODEL] = single_model_scores(job.U, C, self.model_columns, job.folds, job.requested)
        levels = {FIXED_PLAN: cfg.fixed_plan_level} if FIXED_PLAN in scores else None
        return choose_rules(scores, job.requested, level=cfg.fallback_level, margin=cfg.fallback_margin,
                            seed=cfg.seed, rule_levels=levels)

    def single_model_at(self, budget: float, model: str | None = None) -> tuple[str, FixedPlanChoice]:
        """The single-model rule's (model, choice) at ``budget`` from the training means; ``model`` pins it."""
        self._check_fitted()
        cols = self.model_columns if model is None else {model: self.model_columns[self._known(model)]}
        return single_model_choice(self.plan_utility_[None], self.sample_action_costs[None], cols, float(budget))

    def needs_features(self, budget: float, learner: str | None = None) -> bool:
        return self.rule_at(budget, learner).rule in (LEARNED, ESCALATE)

    def escalate_actions(self, prompts: Sequence[str], budget: float) -> np.ndarray:
        """Action index per prompt under the escalate rule at ``budget``."""
        choice = self.fixed_plan_at(budget)
        u, route = self.prompt_keys(prompts)
        g = self.escalate_.score(self.features(prompts), route, u)
        return HeadroomScore.actions(g, choice, self.escalate_.threshold(choice.mix))

    def save(self, out_dir: Any, *, inputs: dict[str, str] | None = None, extra_files: Any = None) -> Any:
        files = dict(extra_files or {})
        if getattr(self, "escalate_", None) is not None:
            files.update(self.escalate_.files())
        return super().save(out_dir, inputs=inputs, extra_files=files)

    def load_extras(self, d: Any) -> None:
        """Read the escalate scores back (:func:`isocompute.policy.persistence.load_policy` calls this)."""
        from pathlib import Path

        self.escalate_ = HeadroomScore.load(d) if (Path(d) / "escalate.json").is_file() else None

    def fallback_actions(self, rule: str, u: np.ndarray, budget: float, *, match: str = "calibrated") -> np.ndarray:
        if rule == SINGLE_MODEL:
            return fixed_actions(u, self.single_model_at(budget)[1], match=match)
        return super().fallback_actions(rule, u, budget, match=match)

    def _known(self, model: str) -> str:
        if model not in self.models:
            raise InputError(f"unknown model {model!r}; this policy serves {', '.join(self.models)}.")
        return model

    def decide(self, prompts: Sequence[str], budget: float, *, probe: np.ndarray | None = None,
               learner: str | None = None, match: str = "calibrated", model: str | None = None) -> Decision:
        """Actions for ``prompts`` at mean FLOPs ``budget`` (:meth:`Policy.decide`); ``model`` pins one
        model (module docstring)."""
        self._check_fitted()
        if model is None and self.rule_at(budget, learner).rule == ESCALATE:
            b = self.check_budget(budget)
            name = learner or self.default_learner_
            from isocompute.policy.decision import make_decision

            d = make_decision(self, self.escalate_actions(prompts, b), b, name, rule=ESCALATE,
                              evidence=self.rule_at(b, name).evidence(), match=match)
        elif model is None:
            d = super().decide(prompts, budget, probe=probe, learner=learner, match=match)
        else:
            b = self.check_budget(budget)
            name = learner or self.default_learner_
            _, choice = self.single_model_at(b, self._known(model))
            u, _ = self.prompt_keys(prompts)
            a = fixed_actions(u, choice, match=match)
            from isocompute.policy.decision import make_decision

            spend = choice.train_cost
            why = (f"pinned to {model}: its best fixed plan at the budget, "
                   f"{choice.describe([p.name for p in self.plans])}, spending {spend:.4g} FLOPs on the training prompts"
                   + (" (its cheapest plan costs more than the budget)" if spend > b * (1 + 1e-9) else ""))
            d = make_decision(self, a, b, name, rule=SINGLE_MODEL, match=match,
                              evidence={"rule": SINGLE_MODEL, "grid_budget": b, "why": why, "tests": [],
                                        "model": model})
        acts = self.model_actions
        return dataclasses.replace(d, plans=(), model_actions=tuple(acts[j] for j in d.action_index))
