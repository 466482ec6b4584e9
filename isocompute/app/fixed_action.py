"""A serving policy that needs no fit: one fixed multi-model action for every prompt.

``isocompute serve --action "tiny-s/lead:m=2@1x2 > tiny-l/none@4" --upstream tiny-s=URL --upstream
tiny-l=URL`` serves a cascade (or an ensemble, or one plan on one model) for every request — the
fixed baseline a fitted multi-model policy must beat, and a useful gateway on its own: cheap model
first, the strong one only when the cheap one's samples disagree. It implements
:class:`~isocompute.app.serving_policy.ServingPolicy`; the budget does not change its choice (every
budget is accepted; ``max_samples`` / ``max_waves`` still cap it, across its stages).

**Costs** come from each model's config (:func:`isocompute.flops.request_flops`): the action's cost is
the most it may spend — every stage run to its plan's end — for a nominal prompt of ``prompt_tokens``
and completions of ``completion_tokens``::

    cost = Σ_s request_flops(model_s, P, [M] · k_s)        k_s: stage s's plan's most samples

in FLOPs when every model's config is known (then ``sample_flops``, one sample of the first model,
converts a budget in samples), else in samples (Σ_s k_s). Worked example: ``a/none@2 > b/none@4`` with
a's one sample 1e9 FLOPs and b's 4e9 (prefill neglected) → cost 2·1e9 + 4·4e9 = 1.8e10 FLOPs, or 6
samples without the configs.

**Pinning** (a request's ``model``): the stage on that model alone, e.g. ``tiny-l/none@4`` for
``model = "tiny-l"``.

Ignores: expected (rather than worst-case) costs, which need an outcome table (``isocompute fit``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from isocompute.errors import InputError
from isocompute.solver.models.actions import Action
from isocompute.solver.plans.plan import Plan

__all__ = ["ActionDecision", "FixedActionPolicy"]

RULE = "fixed_action"


@dataclass(frozen=True, eq=False)
class ActionDecision:
    """A decision of :class:`FixedActionPolicy`, in the shape the gateway's ``PolicyDecision`` reads."""

    k: np.ndarray
    action_index: np.ndarray
    plans: tuple[Plan, ...]
    costs: np.ndarray
    expected_cost: float
    model_actions: tuple[Action, ...]
    lam: float | None = None
    expected_samples: np.ndarray | None = None
    expected_waves: np.ndarray | None = None
    rule: str = RULE
    rule_evidence: dict[str, Any] | None = None


class FixedActionPolicy:
    """Serves ``action`` for every prompt (module docstring). ``model_flops``: each model's FLOP model
    (:class:`isocompute.flops.ModelFlops`, None when its config is unknown)."""

    probe = None
    feature_extras: tuple[str, ...] = ()
    feature_cost = 0.0
    budget_range = (0.0, math.inf)
    tokens_per_sample = None  # no outcome table: no "4x" budgets
    latency_range = None  # and no latency budgets

    def __init__(self, action: Action, model_flops: Mapping[str, Any], *, prompt_tokens: int = 64,
                 completion_tokens: int = 256) -> None:
        self.action = action
        self.models: tuple[str, ...] = action.models
        flops = {m: model_flops.get(m) for m in self.models}
        self.cost_unit = "flops" if all(f is not None for f in flops.values()) else "samples"
        self._flops, self._p, self._m = flops, prompt_tokens, completion_tokens
        self.sample_flops = self._stage_cost(self.models[0], 1) if self.cost_unit == "flops" else None
        # the menu: the action, then each stage alone (what a request pinning that model runs)
        self.menu: tuple[Action, ...] = (action, *(Action((st,)) for st in action.stages)) if len(
            action.stages) > 1 else (action,)
        self.max_plan_samples = sum(st.plan.max_samples for st in action.stages)  # sizes quota reservations

    def _stage_cost(self, model: str, k: int) -> float:
        if self.cost_unit == "samples":
            return float(k)
        from isocompute.flops import request_flops

        return float(request_flops(self._flops[model], self._p, [self._m] * k))

    def cost(self, action: Action) -> float:
        """The most ``action`` may cost, in :attr:`cost_unit` (module docstring)."""
        return sum(self._stage_cost(st.model, st.plan.max_samples) for st in action.stages)

    def extra_flops(self, texts: Sequence[str]) -> Sequence[float]:
        return [0.0] * len(texts)

    def needs_features(self, budget: float) -> bool:
        return False

    def decide(self, texts: Sequence[str], budget: float, *, probe: np.ndarray | None = None,
               model: str | None = None) -> ActionDecision:
        index = 0 if model is None else self._pinned(model)
        action, n = self.menu[index], len(texts)
        cost = self.cost(action)
        return ActionDecision(
            k=np.full(n, sum(st.plan.max_samples for st in action.stages)), action_index=np.full(n, index),
            plans=(action.stages[0].plan,) * n, costs=np.full(n, cost), expected_cost=cost,
            model_actions=(action,) * n,
            rule_evidence={"rule": RULE, "action": action.name,
                           "reason": "the server serves one fixed action (--action); its cost is the most it may "
                                     f"spend, every stage to its end, with {self._p}-token prompts and "
                                     f"{self._m}-token completions"})

    def _pinned(self, model: str) -> int:
        for j, a in enumerate(self.menu):
            if a.models == (model,):
                return j
        raise InputError(f"the action {self.action.name} has no stage on model {model!r}; pin one of "
                         f"{', '.join(self.models)}")
