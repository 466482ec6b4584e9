"""The serving-policy contract: everything the gateway may read from, or call on, a policy.

:class:`ServingPolicy` is the whole of it, a structural :class:`~typing.Protocol`: the budgets the policy
was calibrated for and their unit, the probe feature and extra feature blocks it needs (and their
declared costs), one sample's FLOPs for unit conversion, and ``decide``. The gateway calls nothing else,
so any object with these members can serve — a test's fake, a policy from another library.

``decide(texts, budget, probe=…)`` returns a :class:`PolicyDecision`: per prompt an action index, the
number of samples k it means, and its expected cost in :attr:`ServingPolicy.cost_unit` (probe and extra
features included), plus λ (``None`` for a classifier, whose knob is the budget itself). Today an action
is "k samples at once"; when a policy returns a plan (waves of samples and a stopping rule), the plan
joins this decision and :mod:`isocompute.app.execute` runs it — the gateway's pricing and budget
control do not change.

:class:`FittedPolicy` adapts the project's own :class:`isocompute.policy.policy.Policy` (whose facts
live on ``config`` and on fitted attributes) to the contract; :func:`as_serving_policy` picks the
adapter, or accepts an object that already implements the contract, and says what is missing otherwise.

Ignores: how a policy decides (LightGBM, a table, a rule), and policies with several models (a later
issue adds the model to the decision).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from isocompute.errors import InputError

__all__ = ["FittedPolicy", "PolicyDecision", "ProbeFeature", "ServingPolicy", "as_serving_policy"]


class ProbeFeature(Protocol):
    """A probe feature's spec as the gateway reads it (:class:`isocompute.policy.config.ProbeSpec`)."""

    name: str
    max_tokens: int
    cost: float  # declared, per request, in the policy's cost unit
    prompt_format: str  # "chat" (the model's chat template) or "plain" (prompt + newline)


class PolicyDecision(Protocol):
    """What ``decide`` returns for N prompts (:class:`isocompute.policy.policy.Decision` is one)."""

    k: np.ndarray  # (N,) samples per prompt
    action_index: np.ndarray  # (N,) index of the action chosen
    costs: np.ndarray  # (N,) expected cost, in the policy's unit, probe and extra features included
    lam: float | None  # λ of the decision; None when the knob is the budget itself
    expected_cost: float


@runtime_checkable
class ServingPolicy(Protocol):
    """Everything the gateway may read from or call on a policy (see the module docstring)."""

    @property
    def budget_range(self) -> tuple[float, float]:
        """Per-request budgets it was calibrated for, in :attr:`cost_unit`."""
        ...

    @property
    def cost_unit(self) -> str:
        """``samples`` or ``flops``: the unit of its budgets and costs."""
        ...

    @property
    def probe(self) -> ProbeFeature | None:
        """The probe feature it needs before deciding, or None."""
        ...

    @property
    def feature_extras(self) -> tuple[str, ...]:
        """Names of the extra feature blocks ``decide`` computes on this machine (e.g. ``("minilm",)``)."""
        ...

    @property
    def feature_cost(self) -> float:
        """Declared cost per request of the extra feature blocks, in :attr:`cost_unit` (0 without)."""
        ...

    @property
    def sample_flops(self) -> float | None:
        """FLOPs of one sample on its training traffic (a FLOPs policy's unit conversion); None for a
        samples policy."""
        ...

    def extra_flops(self, texts: Sequence[str]) -> Sequence[float]:
        """The extra feature blocks' FLOPs for each text."""
        ...

    def decide(self, texts: Sequence[str], budget: float, *, probe: np.ndarray | None = None) -> PolicyDecision:
        """Actions for ``texts`` at mean cost ``budget``; ``probe`` holds the probe's value per text
        exactly when :attr:`probe` is set."""
        ...


class FittedPolicy:
    """:class:`isocompute.policy.policy.Policy` (or an object delegating to one) under the contract."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        config = policy.config
        self.budget_range = (float(policy.budget_range[0]), float(policy.budget_range[1]))
        self.cost_unit = str(config.cost_unit)
        self.probe = config.probe
        self.feature_extras = tuple(config.feature_extras)
        self.feature_cost = float(policy.feature_cost_)
        self.sample_flops = self._sample_flops() if self.cost_unit == "flops" else None

    def _sample_flops(self) -> float:
        # the probe's and the extra features' costs are in every action's cost, not in a sample's
        paid = (0.0 if self.probe is None else float(self.probe.cost)) + self.feature_cost
        per = ((np.asarray(self.policy.action_costs_, dtype=float) - paid)
               / np.asarray(self.policy.actions, dtype=float))
        return float(per.mean())

    def extra_flops(self, texts: Sequence[str]) -> Sequence[float]:
        return [float(f) for f in self.policy.features_.extra_flops(list(texts))]

    def decide(self, texts: Sequence[str], budget: float, *, probe: np.ndarray | None = None) -> PolicyDecision:
        if probe is None:
            return self.policy.decide(texts, budget)
        return self.policy.decide(texts, budget, probe=probe)


_CONTRACT = ("budget_range", "cost_unit", "probe", "feature_extras", "feature_cost", "sample_flops", "extra_flops",
             "decide")
_POLICY_MEMBERS = ("config", "budget_range", "feature_cost_", "action_costs_", "actions", "features_", "decide")


def as_serving_policy(policy: Any) -> ServingPolicy:
    """``policy`` under the contract: itself when it implements :class:`ServingPolicy`, a
    :class:`FittedPolicy` around a fitted ``Policy``; raises :class:`InputError` naming what is missing."""
    if isinstance(policy, ServingPolicy):
        return policy
    missing = [m for m in _POLICY_MEMBERS if not hasattr(policy, m)]
    if missing:
        contract = [m for m in _CONTRACT if not hasattr(policy, m)]
        raise InputError(f"{type(policy).__name__} cannot serve: it is neither a fitted isocompute Policy (no "
                         f"{', '.join(missing)}) nor a ServingPolicy (no {', '.join(contract)}); load one "
                         "with Policy.load(DIR) or implement isocompute.app.serving_policy.ServingPolicy")
    return FittedPolicy(policy)
