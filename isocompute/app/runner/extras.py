"""What a policy pays for before it decides: the probe call and the extra feature blocks, priced.

* **probe** (:func:`probe_call`): one cheap model call per prompt — the engine answers the policy text
  greedily (:func:`isocompute.engines.probe.probe_entropy`, in the probe spec's prompt format, so the
  model sees what it saw at fit time) and the mean token entropy becomes a feature. It goes upstream
  through the request's :class:`~isocompute.app.runner.execute.Backend`, within the request's deadline.
* **extra feature blocks** (:func:`feature_call`), e.g. the minilm sentence embedding: computed inside
  ``decide`` on this machine; here only their FLOPs and cost are read.

Each is priced per prompt in the request's budget unit with :meth:`~isocompute.app.accounting.pricing.BudgetPlan.charge`:
its analytic FLOPs for a FLOP budget when the model's config is known, the probe's generated tokens for a
tokens budget, else its declared cost (in the policy's unit, converted). Example: a declared probe cost of
0.25 samples under a 2e9-FLOP budget with 5e8 FLOPs per sample and no model config → 1.25e8 FLOPs.

Ignores: reusing the probe's greedy answer as a sample (it is not), and itemising the extra feature
blocks in the response (only their FLOPs and cost are counted).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from isocompute.app.accounting.pricing import BudgetPlan
from isocompute.app.runner.execute import Backend, Deadline
from isocompute.app.serving_policy import ProbeFeature, ServingPolicy
from isocompute.errors import EngineUnavailable

__all__ = ["FeatureCall", "ProbeCall", "feature_call", "probe_call"]


@dataclass(frozen=True, slots=True)
class ProbeCall:
    """The probe feature's call for a request's prompts: per prompt its value, generated tokens, FLOPs
    (None without the model's config) and cost in the request's budget unit; the spec's declared cost."""

    name: str
    values: list[float]
    tokens: list[int]
    flops: list[float | None]
    costs: list[float]
    declared_cost: float


@dataclass(frozen=True, slots=True)
class FeatureCall:
    """The policy's extra feature blocks for a request's prompts: their names, per prompt the encoder's
    FLOPs and the cost in the request's budget unit; the policy's declared cost per request."""

    names: tuple[str, ...]
    flops: list[float]
    costs: list[float]
    declared_cost: float


async def probe_call(backend: Backend, texts: list[str], spec: ProbeFeature, plan: BudgetPlan, deadline: Deadline,
                     *, tokenizer: Any, model_flops: Any) -> ProbeCall:
    """Run the policy's probe on ``texts`` upstream and price each call (module docstring)."""
    from isocompute.app.runner.batching import BatchingEngine
    from isocompute.engines.probe import probe_entropy, probe_flops

    if spec.prompt_format == "chat":
        if tokenizer is None:
            raise EngineUnavailable("this policy's probe runs on the chat template and this gateway has no "
                                    "tokenizer; start it with --model DIR (the checkpoint the upstream serves)")
        from isocompute.engines.transformers_engine import apply_chat_template

        shown = [apply_chat_template(tokenizer, t) for t in texts]
    else:
        shown = [t + "\n" for t in texts]
    engine = backend.engine.engine if isinstance(backend.engine, BatchingEngine) else backend.engine
    res = await backend.call(probe_entropy(engine, shown, spec.max_tokens), deadline=deadline, what="the probe call")
    flops: list[float | None] = [None] * len(texts)
    if model_flops is not None:
        flops = [float(f) for f in probe_flops(model_flops, res.prompt_tokens, res.completion_tokens)]
    declared, tokens = float(spec.cost), [int(m) for m in res.completion_tokens]
    return ProbeCall(spec.name, [float(v) for v in res.values], tokens, flops,
                     [plan.charge(declared, f, m) for f, m in zip(flops, tokens, strict=True)], declared)


def feature_call(policy: ServingPolicy, texts: list[str], plan: BudgetPlan) -> FeatureCall | None:
    """The extra feature blocks' FLOPs per prompt and their cost in the request's unit (None without)."""
    if not policy.feature_extras:
        return None
    flops = [float(f) for f in policy.extra_flops(texts)]
    declared = policy.feature_cost
    return FeatureCall(policy.feature_extras, flops, [plan.charge(declared, f) for f in flops], declared)
