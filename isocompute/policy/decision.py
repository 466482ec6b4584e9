"""What a policy decides for a batch of prompts: :class:`Decision`, the object the gateway reads.

One decision per batch, arrays indexed by prompt. The action is a **plan** (:mod:`isocompute.solver.plans.plan`):
a schedule of waves and a stopping rule the gateway checks on the vote between waves. A policy fitted
without plans (``--plans none``) chooses one-wave plans ``none@k``, i.e. k samples at once, and its
decisions read as before (``k`` samples, one wave).

Worked example: a prompt decided ``lead:m=2@1x8`` has ``k = 8`` (the most it may draw), and over the
training prompts that plan drew ``expected_samples = 3.1`` samples in ``expected_waves = 3.1`` requests
on average (one sample per wave); the gateway draws one sample, then another, and stops as soon as the
leading answer leads by 2, or at 8.

Ignores: executing plans (the gateway's ``app/`` does that) and how the rule was chosen
(:mod:`isocompute.policy.fallback`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from isocompute.policy.fallback import LEARNED
from isocompute.solver.models.actions import Action
from isocompute.solver.plans.plan import Plan


@dataclass(frozen=True, eq=False)
class Decision:
    """What :meth:`isocompute.policy.policy.Policy.decide` returns for a batch of N prompts.

    Per prompt (arrays of length N):

    * ``plans``: the plan to run, a :class:`~isocompute.solver.plans.plan.Plan` (``plan_names`` gives the
      stable names, ``RULE@SCHEDULE``, that ``parse_plan`` reads back); ``action_index``: its index
      into ``Policy.plans``;
    * ``k``: the plan's **maximum** samples (``Plan.max_samples``) — the samples drawn only for a
      one-wave plan; an adaptive plan may stop earlier;
    * ``expected_samples``: the samples the plan is expected to draw on this prompt — the utility
      learner's cost-head prediction where it decided (:mod:`isocompute.policy.learn.cost_head`), else the
      plan's mean over the training prompts (exact expectations over sample orders; k for ``none@k``);
    * ``expected_waves``: the waves (upstream requests) the plan is expected to run on this prompt: the
      plan's mean over the training prompts, scaled by the cost head's samples where it predicted them
      (1 for ``none@k``; equal to ``expected_samples`` for one sample per wave);
    * ``costs``: the expected cost in ``cost_unit``, on the same footing as ``expected_samples`` (the
      probe's and the extra features' costs included where the learned rule serves), ``expected_cost``
      their mean.

    Per batch: ``budget``; ``learner``; ``internal_budget`` (classifier) or ``lam`` (utility learner):
    the calibrated knob used, the other None (both None where a fallback rule serves); ``match``: how
    the knob was set (``calibrated`` table or solved on the ``batch``); ``probe_cost`` and
    ``feature_cost``: those costs per prompt (0 without a probe / extra features, and 0 where a fallback
    rule serves, which reads no features); ``rule``: which rule of the never-worse chain decided —
    ``learned`` (the learner's per-prompt choice), ``fixed_plan`` (one plan, or a hashed mix of two, for
    every prompt, budget-matched) or ``uniform`` (the budget-matched mix of two ``none@k``);
    ``rule_evidence``: why (JSON-able: the rule, the grid budget tested, a sentence, and each test's
    gain, 95% CI and number of prompts — :meth:`isocompute.policy.fallback.RuleChoice.evidence`).

    Several models (:mod:`isocompute.policy.multi.policy`): ``model_actions`` gives per prompt the
    :class:`~isocompute.solver.models.actions.Action` to run (stages of (model, plan): one plan, a cascade
    or an ensemble; ``Action.name`` / ``parse_action`` for its stable name), ``plans`` is then ``()``, ``k``
    each action's most samples summed over its stages, costs in FLOPs, and ``rule`` may also be
    ``escalate`` (the fixed action's mix, the dearer action to the prompts a learned score ranks first)
    or ``single_model`` (the best single model's best fixed plan, or a pinned model's). ``model_actions`` is
    ``()`` for a single-model policy.

    Under a latency budget (:mod:`isocompute.policy.latency`): ``latency_budget`` the one served (sample
    lengths, 1.0 = waiting for one sample) and ``expected_latency`` per prompt its plan's mean training
    latency; both None otherwise.
    """

    k: np.ndarray
    action_index: np.ndarray
    budget: float
    learner: str
    internal_budget: float | None
    lam: float | None
    costs: np.ndarray
    expected_cost: float
    cost_unit: str
    match: str = "calibrated"
    probe_cost: float = 0.0
    feature_cost: float = 0.0
    rule: str = LEARNED
    rule_evidence: dict[str, Any] | None = None
    plans: tuple[Plan, ...] = ()
    expected_samples: np.ndarray | None = None
    expected_waves: np.ndarray | None = None
    model_actions: tuple[Action, ...] = ()
    latency_budget: float | None = None
    expected_latency: np.ndarray | None = None

    @property
    def plan_names(self) -> list[str]:
        """Each prompt's plan by its stable name, e.g. ``lead:m=2@1x8``."""
        return [p.name for p in self.plans]


def make_decision(policy: Any, a: np.ndarray, budget: float, learner: str, *, rule: str, evidence: dict[str, Any],
                  match: str, knob: float | None = None, knob_name: str | None = None,
                  predicted: tuple[np.ndarray, np.ndarray] | None = None) -> Decision:
    """The :class:`Decision` for plan indices ``a`` of ``policy``: costs and expected samples are the
    plans' means over the training prompts (paid costs included only where the learned rule serves),
    or ``predicted`` (cost, samples) per prompt (:func:`predicted_costs`)."""
    a = np.asarray(a, dtype=np.intp)
    menu = policy.plans
    learned = rule == LEARNED
    costs = (policy.action_costs_ if learned else policy.sample_action_costs)[a]
    samples, waves = policy.plan_samples_[a], policy.plan_waves_[a]
    if predicted is not None:
        costs, s_hat = predicted
        # waves scale with samples as on the training prompts (equal for one sample per wave)
        n_waves = np.array([menu[j].n_waves for j in a], dtype=np.float64)
        waves = np.clip(waves * s_hat / np.maximum(samples, 1e-300), 1.0, np.minimum(n_waves, s_hat))
        samples = s_hat
    return Decision(
        k=np.array([menu[j].max_samples for j in a], dtype=np.int64), action_index=a, budget=budget,
        learner=learner, internal_budget=knob if knob_name == "internal_budget" else None,
        lam=knob if knob_name == "lam" else None, costs=costs,
        expected_cost=float(costs.mean()) if costs.size else 0.0, cost_unit=policy.config.cost_unit, match=match,
        probe_cost=policy.probe_cost if learned else 0.0, feature_cost=policy.feature_cost_ if learned else 0.0,
        rule=rule, rule_evidence=evidence, plans=tuple(menu[j] for j in a),
        expected_samples=samples, expected_waves=waves)


def predicted_costs(policy: Any, X: np.ndarray, route: np.ndarray, a: np.ndarray,
                    learner: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(cost, samples) per prompt of its chosen plan ``a`` as the serving member's cost head predicts
    them (:mod:`isocompute.policy.learn.cost_head`), or None when the learner has no cost head (then a
    decision reports the plans' mean training costs)."""
    models = policy.learners_[learner].models
    if not all(getattr(m, "cost_head_", None) is not None for m in models):
        return None
    n = X.shape[0]
    cost, samples = np.empty(n), np.empty(n)
    for j, m in enumerate(models):
        sel = np.flatnonzero(route == j)
        if sel.size:
            s_hat = m.cost_head_.predict_samples(X[sel])
            rows = np.arange(sel.size)
            samples[sel] = s_hat[rows, a[sel]]
            cost[sel] = m.cost_head_.paid_ + samples[sel] * m.cost_head_.ratio_[a[sel]]
    return cost, samples
