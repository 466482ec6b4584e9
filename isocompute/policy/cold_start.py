"""The cold-start policy: what a gateway with no fitted policy yet serves — one fixed plan per budget.

The first run of the learning loop (serve with capture → refit → reload, docs/gateway.md) has no outcome
table of its own traffic to fit on. :data:`COLD_START` maps a budget in multiples of one sample's mean
completion tokens (``4x``) to the parallel-stop plan (or uniform ``none@k``) with the best accuracy, averaged
over the five real tables (MATH-500 × gpt-oss-20b, Qwen3-14B, Phi-4-reasoning; GSM8K Llama-2-13B; Date
GPT-3.5), among the plans whose mean expected tokens fit the budget on every one of them — measured by
``bench/bench_cold_start.py`` (the command and its output are in docs/gateway.md, "Capture and refit").
:class:`ColdStartPolicy` is priced in tokens: ``tokens_per_sample`` T (the gateway's ``cold_start_sample_tokens``,
the served model's mean completion length, which nothing has measured yet) makes budget b worth b/T samples,
and it serves the plan of the largest grid budget ≤ b/T (the smallest one's below the grid) to every prompt.
The gateway's budget controller then steers b so that the realised mean tokens meet the request's budget,
whatever the model's real lengths, as for a fitted policy.

Ignores: anything about the prompt (there is nothing to learn it from yet).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from isocompute.errors import InputError
from isocompute.solver.plans.plan import Plan, parse_plan

__all__ = ["COLD_START", "ColdStartPolicy"]

# budget (x: mean completion tokens over one sample's mean) → (plan, its mean tokens in x on the real tables);
# bench/bench_cold_start.py
COLD_START: dict[float, tuple[str, float]] = {
    1.0: ("none@1", 1.0), 1.5: ("none@1", 1.0), 2.0: ("none@2", 2.0), 3.0: ("none@2", 2.0),
    4.0: ("lead:m=3@4s", 3.769), 6.0: ("lead:m=3@4s", 3.769), 8.0: ("beta:p=0.95@8s", 7.189),
    12.0: ("beta:p=0.9@2s,4s,8s", 8.009), 16.0: ("none@16", 16.0),
}
RULE = "cold_start"


@dataclass(frozen=True, eq=False)
class ColdStartDecision:
    """A decision of :class:`ColdStartPolicy`, in the shape the gateway's ``PolicyDecision`` reads."""

    k: np.ndarray
    action_index: np.ndarray
    plans: tuple[Plan, ...]
    costs: np.ndarray
    expected_cost: float
    lam: float | None = None
    expected_samples: np.ndarray | None = None
    expected_waves: np.ndarray | None = None
    rule: str = RULE
    rule_evidence: dict[str, Any] | None = None
    model_actions: tuple = ()


class ColdStartPolicy:
    """Serves :data:`COLD_START`'s plan for the budget to every prompt (module docstring)."""

    cost_unit = "tokens"
    probe = None
    feature_extras: tuple[str, ...] = ()
    feature_cost = 0.0
    sample_flops = None
    models: tuple[str, ...] = ()
    latency_range = None

    def __init__(self, tokens_per_sample: float, table: dict[float, tuple[str, float]] | None = None) -> None:
        if not tokens_per_sample > 0:
            raise InputError(f"tokens_per_sample must be > 0 (the served model's mean completion tokens); got "
                             f"{tokens_per_sample!r}")
        self.tokens_per_sample = float(tokens_per_sample)
        self.table = dict(sorted((table or COLD_START).items()))
        self.plans = [parse_plan(n) for n in dict.fromkeys(name for name, _ in self.table.values())]
        self.budget_range = (min(self.table) * self.tokens_per_sample, max(self.table) * self.tokens_per_sample)

    def plan_at(self, budget: float) -> tuple[Plan, float]:
        """The plan of the largest grid budget ≤ ``budget`` tokens (the smallest one's below the grid) and its
        expected tokens."""
        x = budget / self.tokens_per_sample
        name, cost = next((self.table[b] for b in reversed(self.table) if b <= x + 1e-9), next(iter(self.table.values())))
        return parse_plan(name), cost * self.tokens_per_sample

    def extra_flops(self, texts: Sequence[str]) -> Sequence[float]:
        return [0.0] * len(texts)

    def needs_features(self, budget: float, **_: Any) -> bool:
        return False

    def decide(self, texts: Sequence[str], budget: float, *, probe: Any = None, **_: Any) -> ColdStartDecision:
        (plan, cost), n = self.plan_at(float(budget)), len(texts)
        index = [p.name for p in self.plans].index(plan.name)
        return ColdStartDecision(
            k=np.full(n, plan.max_samples), action_index=np.full(n, index), plans=(plan,) * n,
            costs=np.full(n, cost), expected_cost=cost,
            rule_evidence={"rule": RULE, "plan": plan.name, "reason": "no policy fitted yet: the cold-start plan for "
                           "this budget, chosen on the real tables (isocompute.policy.cold_start)"})
