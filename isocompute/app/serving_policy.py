"""The serving-policy contract: everything the gateway may read from, or call on, a policy.

:class:`ServingPolicy` is the whole of it, a structural :class:`~typing.Protocol`: the budgets the policy
was calibrated for and their unit, the probe feature and extra feature blocks it needs (and their
declared costs), one sample's FLOPs for unit conversion, and ``decide``. The gateway calls nothing else,
so any object with these members can serve — a test's fake, a policy from another library.

``decide(texts, budget, probe=…)`` returns a :class:`PolicyDecision`: per prompt an action index, its
**plan** (:class:`isocompute.solver.plans.plan.Plan`: a schedule of waves and a stopping rule checked on the
vote between waves; "k samples at once" is the one-wave plan ``none@k``), the most samples k the plan
may draw, the samples and waves it is expected to draw, and its expected cost in
:attr:`ServingPolicy.cost_unit` (probe and extra features included where they are read), plus λ
(``None`` for a classifier, whose knob is the budget itself) and which rule of the never-worse chain
decided (``learned`` | ``fixed_plan`` | ``uniform``) with its evidence. :mod:`isocompute.app.runner.plan_run`
runs the plans; pricing and budget control do not depend on them.

``needs_features(budget)`` says beforehand whether a decision at that budget reads the prompt features
(and the probe): where a fallback rule serves it does not, and the gateway then neither calls the probe
nor pays for it.

**Latency budgets**: a policy fitted with them (``fit --latency-budgets LO:HI``) has a
:attr:`ServingPolicy.latency_range` (mean latency per request in sample lengths, 1.0 = waiting for one
sample; None: it serves none); ``decide(…, latency_budget=L)`` serves ``L`` beside the cost budget, and
its decision's ``latency_budget`` (the one served) and ``expected_latency`` (per prompt) are set (None, or
absent, otherwise). The gateway passes ``latency_budget`` to ``decide`` and ``needs_features`` only when
a request sends one, so a policy without latency budgets needs no such parameter.
:attr:`ServingPolicy.tokens_per_sample` is one sample's mean completion tokens on the training table:
what a budget ``"4x"`` means for a tokens-unit policy, and the samples ↔ tokens conversion. An optional
``wave_overhead`` (not part of the contract; 0 when absent) is each wave's overhead in sample lengths
that the policy's latencies include: the latency controller adds it to a prompt's realised latency.

:class:`FittedPolicy` adapts the project's own :class:`isocompute.policy.policy.Policy` (whose facts
live on ``config`` and on fitted attributes) to the contract; :func:`as_serving_policy` picks the
adapter, or accepts an object that already implements the contract, and says what is missing otherwise.

**Several models**: :attr:`ServingPolicy.models` names the models a policy's actions run on (``()`` for a
single-model policy, whose prompts run ``plans`` on the gateway's one pool). A multi-model policy's
decision carries ``model_actions``: per prompt an :class:`isocompute.solver.models.actions.Action` (a
chain of stages, each a plan on one model: single, cascade or ensemble), run across the gateway's
model pools by :mod:`isocompute.app.runner.action_run`; ``plans`` is then not read. ``decide(…, model=NAME)``
restricts the choice to actions whose every stage is on that model (a request's ``model`` field pins it).
The gateway reads ``model_actions`` only from a policy whose ``models`` is not empty (a single-model
policy's decision need not carry it).

Ignores: how a policy decides (LightGBM, a table, a rule).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from isocompute.errors import InputError
from isocompute.solver.models.actions import Action
from isocompute.solver.plans.plan import Plan

__all__ = ["FittedPolicy", "PolicyDecision", "ProbeFeature", "ServingPolicy", "as_serving_policy"]


class ProbeFeature(Protocol):
    """A probe feature's spec as the gateway reads it (:class:`isocompute.policy.config.ProbeSpec`)."""

    name: str
    max_tokens: int
    cost: float  # declared, per request, in the policy's cost unit
    prompt_format: str  # "chat" (the model's chat template) or "plain" (prompt + newline)


class PolicyDecision(Protocol):
    """What ``decide`` returns for N prompts (:class:`isocompute.policy.policy.Decision` is one)."""

    k: np.ndarray  # (N,) the most samples each prompt's plan may draw
    action_index: np.ndarray  # (N,) index of the action (plan) chosen
    plans: tuple[Plan, ...]  # (N,) each prompt's plan
    expected_samples: np.ndarray | None  # (N,) samples each plan is expected to draw here (None: unknown)
    expected_waves: np.ndarray | None  # (N,) waves (upstream calls) it is expected to run
    costs: np.ndarray  # (N,) expected cost, in the policy's unit, probe and extra features included
    lam: float | None  # λ of the decision; None when the knob is the budget itself
    expected_cost: float
    rule: str  # the never-worse chain's rule that decided: learned | fixed_plan | uniform
    rule_evidence: dict[str, Any] | None  # why that rule serves at this budget (JSON-able)
    model_actions: tuple[Action, ...]  # (N,) each prompt's multi-model action (read only when policy.models)
    latency_budget: float | None  # the latency budget served (sample lengths); None (or absent) without one
    expected_latency: np.ndarray | None  # (N,) each plan's expected latency under it; None (or absent) otherwise


@runtime_checkable
class ServingPolicy(Protocol):
    """Everything the gateway may read from or call on a policy (see the module docstring)."""

    @property
    def budget_range(self) -> tuple[float, float]:
        """Per-request budgets it was calibrated for, in :attr:`cost_unit`."""
        ...

    @property
    def cost_unit(self) -> str:
        """``samples``, ``tokens`` or ``flops``: the unit of its budgets and costs."""
        ...

    @property
    def tokens_per_sample(self) -> float | None:
        """One sample's mean completion tokens on its training table (a budget ``"4x"`` of a tokens policy
        is 4 of them); None when unknown."""
        ...

    @property
    def latency_range(self) -> tuple[float, float] | None:
        """Mean latency budgets (sample lengths) it serves; None when fitted without latency budgets."""
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

    @property
    def models(self) -> tuple[str, ...]:
        """The models its actions run on (each needs a pool: ``--upstream NAME=URL`` or ``--model NAME=DIR``);
        ``()`` for a single-model policy."""
        ...

    def extra_flops(self, texts: Sequence[str]) -> Sequence[float]:
        """The extra feature blocks' FLOPs for each text."""
        ...

    def needs_features(self, budget: float, *, latency_budget: float | None = None) -> bool:
        """Whether ``decide`` at ``budget`` (and ``latency_budget``, when sent) reads the prompt features
        and the probe (False where a fallback rule serves: then no probe is called and its cost is not paid)."""
        ...

    def decide(self, texts: Sequence[str], budget: float, *, probe: np.ndarray | None = None,
               model: str | None = None, latency_budget: float | None = None) -> PolicyDecision:
        """Actions for ``texts`` at mean cost ``budget``; ``probe`` holds the probe's value per text
        exactly when :attr:`probe` is set; ``model`` (one of :attr:`models`) keeps only the actions whose
        every stage is on that model; ``latency_budget`` (within :attr:`latency_range`) the mean latency."""
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
        # a Policy from before several models has no models: it is a single-model policy
        self.models: tuple[str, ...] = tuple(policy.models) if hasattr(policy, "models") else ()
        # a multi-model policy, or one from before latency budgets, has neither
        tps = getattr(policy, "tokens_per_sample_", None)
        self.tokens_per_sample = None if tps is None else float(tps)
        latency = getattr(policy, "latency_", None)
        self.latency_range = None if latency is None else (float(latency.range[0]), float(latency.range[1]))
        self.wave_overhead = float(getattr(config, "wave_overhead", 0.0) or 0.0)  # optional (latency control)
        # optional: the most samples any of its plans draws, which sizes a request's quota reservation (None:
        # unknown, the request's cap is reserved) — a multi-model policy's actions sum stages: not known here
        acts = getattr(policy, "actions", None)
        self.max_plan_samples = int(max(acts)) if acts and not self.models else None

    def _sample_flops(self) -> float:
        # the probe's and the extra features' costs are in every action's cost, not in a sample's
        paid = (0.0 if self.probe is None else float(self.probe.cost)) + self.feature_cost
        per = ((np.asarray(self.policy.action_costs_, dtype=float) - paid)
               / np.asarray(self.policy.actions, dtype=float))
        return float(per.mean())

    def extra_flops(self, texts: Sequence[str]) -> Sequence[float]:
        return [float(f) for f in self.policy.features_.extra_flops(list(texts))]

    def needs_features(self, budget: float, *, latency_budget: float | None = None) -> bool:
        # under a latency budget the chain of that latency level decides (a single-model policy's only)
        if latency_budget is None:
            return bool(self.policy.needs_features(budget))
        return bool(self.policy.needs_features(budget, latency_budget=latency_budget))

    def decide(self, texts: Sequence[str], budget: float, *, probe: np.ndarray | None = None,
               model: str | None = None, latency_budget: float | None = None) -> PolicyDecision:
        kw: dict[str, Any] = {} if probe is None else {"probe": probe}
        if model is not None:  # only a multi-model Policy takes it (the gateway pins only to its models)
            kw["model"] = model
        if latency_budget is not None:  # only a Policy fitted with latency budgets serves one
            kw["latency_budget"] = latency_budget
        return self.policy.decide(texts, budget, **kw)


_CONTRACT = ("budget_range", "cost_unit", "tokens_per_sample", "latency_range", "probe", "feature_extras",
             "feature_cost", "sample_flops", "models", "extra_flops", "needs_features", "decide")
_POLICY_MEMBERS = ("config", "budget_range", "feature_cost_", "action_costs_", "actions", "features_",
                   "needs_features", "decide")


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
                         "with isocompute.policy.loading.load_policy(DIR) or implement isocompute.app.serving_policy.ServingPolicy")
    return FittedPolicy(policy)


def load_policy(path: Path) -> Any:
    """The fitted policy in ``path``, whichever kind it holds (raises ``ArtifactError`` with the fix when it
    is not one); the gateway loads through this function at start-up and on ``POST /admin/reload``."""
    from isocompute.policy.loading import load_policy as load_artifact

    return load_artifact(path)
