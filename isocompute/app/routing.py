"""A routed request: what the client asked (:class:`Ask`) and what the gateway decided for each of its
prompts (:class:`Routing`), before anything is sampled.

:class:`Routing` gathers the priced budget (:class:`~isocompute.app.accounting.pricing.BudgetPlan`), the policy's
decision read through the :class:`~isocompute.app.serving_policy.PolicyDecision` contract, and each
prompt's plan cut to the request's caps: ``Plan.capped(max_samples=cap, max_waves=wave cap)``. A policy
whose actions are "k samples at once" may leave ``plans`` empty; its prompts then run the one-wave
plans ``none@k``.

Worked example: the policy chooses ``lead:m=2@1x2,2,4`` (at most 8 samples) and the request sends
``max_samples = 3`` → the plan run is ``lead:m=2@1x3`` (``ks = [3]``, ``policy_ks = [8]``).

:class:`Ask` is a generation request's options once the route has validated them (sampling resolved by
``Gateway.sampling``, the pinned model by ``Gateway.check_model``): what every step after validation reads.

Ignores: running the plans (:mod:`isocompute.app.runner.plan_run`) and the controller's arithmetic
(:mod:`isocompute.app.accounting.budget_control`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from isocompute.app.accounting.budget_control import BudgetController
from isocompute.app.accounting.latency_control import LatencyRoute
from isocompute.app.accounting.pricing import BudgetPlan
from isocompute.app.accounting.quotas import Hold
from isocompute.app.runner.extras import FeatureCall, ProbeCall
from isocompute.app.schemas import ChatMessage
from isocompute.app.serving_policy import PolicyDecision
from isocompute.solver.models.actions import Action
from isocompute.solver.plans.plan import Plan

__all__ = ["Ask", "Routing"]


@dataclass(frozen=True, slots=True)
class Ask:
    """A validated generation (or route) request's options: the budget as sent and its unit, the caps,
    the sampling (``max_tokens``, ``temperature``, ``seed`` reduced mod 2³¹), the answer ``strategy``, the
    latency budget, the model it pins (None: the policy chooses), the prompts' token counts (when a
    tokenizer is known), the text the policy reads (a chat's question without its template; None: the
    prompts) and a chat's messages (each model's stage renders them in its own template)."""

    budget: float | str | None
    unit: str | None
    max_samples: int | None
    max_waves: int | None
    max_tokens: int
    temperature: float
    seed: int | None = None
    strategy: str = "majority"
    latency_budget: float | None = None
    model: str | None = None
    prompt_tokens: list[int] | None = None
    policy_prompts: list[str] | None = None
    messages: Sequence[ChatMessage] | None = None


def _floats(x: Any, n: int) -> list[float] | None:
    return None if x is None else [float(v) for v in np.asarray(x, dtype=float).reshape(-1)][:n]


@dataclass(frozen=True, slots=True)
class Routing:
    """The decision for one request: its priced budget; per prompt the plan to run (the policy's, cut to
    the caps) and the policy's own, their most samples (``ks``, ``policy_ks``), the action, its expected
    cost (policy unit, probe included where read), samples and waves; λ (None for a classifier policy,
    whose knob is the internal budget); the rule of the never-worse chain that decided and its evidence;
    the internal budget handed to the policy and the key's controller; the probe call and the extra
    features when the serving rule reads them; a multi-model policy's action per prompt (``model_actions``,
    empty for a single-model policy, whose prompts run ``plans``; an action's caps apply across its
    stages, :mod:`isocompute.app.runner.action_run`); under a latency budget the request's (served through
    the internal latency budget of ``latency_control``, the key's μ controller) and each prompt's expected
    latency (sample lengths; None without one); the key's spend-quota reservation (``quota``, None for a key
without quotas and for a dry run)."""

    plan: BudgetPlan
    plans: list[Plan]
    policy_plans: list[Plan]
    ks: list[int]
    policy_ks: list[int]
    actions: list[int]
    costs: list[float]
    expected_samples: list[float] | None
    expected_waves: list[float] | None
    lam: float | None
    expected_cost: float
    rule: str | None
    rule_evidence: dict[str, Any] | None
    internal_budget: float
    controller: BudgetController
    probe: ProbeCall | None = None
    features: FeatureCall | None = None
    model_actions: tuple[Action, ...] = ()
    latency_budget: float | None = None
    expected_latency: list[float] | None = None
    latency_control: LatencyRoute | None = None
    quota: Hold | None = None
    explore: list[bool] | None = None  # per prompt: drawn in full for capture after its answer (app.runner.capture)

    @classmethod
    def of(cls, decision: PolicyDecision, plan: BudgetPlan, n: int, *, multi_model: bool = False,
           **rest: Any) -> Routing:
        """``multi_model``: the policy has ``models`` (only then does its decision carry ``model_actions``)."""
        policy_ks = [int(k) for k in np.asarray(decision.k).reshape(-1)]
        actions = [int(a) for a in np.asarray(decision.action_index).reshape(-1)]
        costs = [float(c) for c in np.asarray(decision.costs, dtype=float).reshape(-1)]
        # a policy whose actions are "k samples at once" may leave plans empty: the one-wave plans none@k
        policy_plans = list(decision.plans) or [Plan((k,)) for k in policy_ks]
        model_actions = tuple(decision.model_actions) if multi_model else ()
        if not (len(policy_ks) == len(actions) == len(costs) == len(policy_plans) == n) or (
                model_actions and len(model_actions) != n):
            raise RuntimeError(f"policy returned {len(policy_ks)} decisions for {n} prompts")
        plans = [p.capped(max_samples=plan.cap, max_waves=plan.wave_cap) for p in policy_plans]
        lam = None if decision.lam is None else float(decision.lam)
        served = getattr(decision, "latency_budget", None)  # absent on a decision without latency budgets
        if served is not None and plan.latency_budget is not None:
            served = plan.latency_budget  # the request's; the policy served the internal one
        return cls(plan, plans, policy_plans, [p.max_samples for p in plans], policy_ks, actions, costs,
                   _floats(decision.expected_samples, n), _floats(decision.expected_waves, n), lam,
                   float(decision.expected_cost), decision.rule, decision.rule_evidence, **rest,
                   model_actions=model_actions, latency_budget=None if served is None else float(served),
                   expected_latency=_floats(getattr(decision, "expected_latency", None), n))
