"""A policy that serves evidence-aware plans where its chain keeps them: :class:`EvidencePolicy`.

``isocompute evidence TABLE --policy DIR --out DIR2`` fits an :class:`~isocompute.policy.evidence.model.EvidenceModel`
on the table and writes the policy again with ``evidence.json`` beside it;
:func:`isocompute.policy.loading.load_policy` then returns an :class:`EvidencePolicy`: the fitted policy
with one more link at the head of its never-worse chain. For a request at budget B (tokens) and latency
budget Lb it looks up the evidence chain's entry (:meth:`EvidenceModel.entry_at`):

* ``evidence`` — every prompt gets the plan ``evidence:lam=…,mu=…@4s,8s`` (the learned continuation at
  the entry's prices); the decision's ``rule`` is ``evidence`` and ``rule_evidence`` says why (the gain
  over the best fixed mixture within the same budgets and its one-sided bootstrap bound);
* ``fixed_plan`` or no entry (a budget below the grid) — the policy decides as it did without evidence
  (its own chain: learned from prompt text → best fixed plan → uniform).

Everything else (budget range, cost unit, features, persistence) is the wrapped policy's.

Worked example: a tokens-unit policy for gpt-oss-20b with evidence fitted on the same table; a request at
``"budget": "3x"`` and ``"latency_budget": 0.75`` finds an ``evidence`` entry and runs the learned
continuation; the same request without a latency budget finds ``fixed_plan`` and is served by the policy.

Ignores: multi-model policies (evidence plans run on one model) and budgets in samples or FLOPs.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from isocompute.errors import InputError
from isocompute.policy.evidence.model import EvidenceModel

__all__ = ["EVIDENCE_FILE", "EVIDENCE_RULE", "EvidencePolicy", "read_evidence"]

EVIDENCE_FILE = "evidence.json"
EVIDENCE_RULE = "evidence"


def read_evidence(artifact_dir: str | Path) -> EvidenceModel | None:
    """The evidence model saved in a policy directory, or None when it has none."""
    path = Path(artifact_dir) / EVIDENCE_FILE
    if not path.exists():
        return None
    try:
        return EvidenceModel.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(f"{path} is not a readable evidence model ({e}); refit it with isocompute evidence.") from e


class EvidencePolicy:
    """``policy`` with the evidence chain at the head of its own (module docstring)."""

    def __init__(self, policy: Any, evidence: EvidenceModel) -> None:
        if getattr(policy.config, "cost_unit", None) != "tokens":
            raise InputError("evidence plans are priced in tokens: fit the policy with --cost-unit tokens.")
        if getattr(policy, "models", ()):
            raise InputError("evidence plans run on one model; this policy serves several.")
        self.policy = policy
        self.evidence = evidence

    def __getattr__(self, name: str) -> Any:  # everything but decide and save is the policy's
        policy = self.__dict__.get("policy")
        if policy is None:  # not set up yet (e.g. while unpickling): no attribute to delegate
            raise AttributeError(name)
        return getattr(policy, name)

    def decide(self, prompts: Sequence[str], budget: float, **kw: Any) -> Any:
        """The policy's decision, or the evidence plan for every prompt where the chain keeps it."""
        base = self.policy.decide(prompts, budget, **kw)
        plan, entry = self.evidence.plan_at(float(base.budget), kw.get("latency_budget"))
        if plan is None or entry is None:
            return base
        n = len(base.k)
        cost = np.full(n, entry.tokens * self.evidence.unit)
        why = {"rule": EVIDENCE_RULE, "budget": entry.budget * self.evidence.unit,
               "latency_budget": None if entry.latency_budget is None
               else entry.latency_budget * self.evidence.unit / self.evidence.tokens_per_sample,
               "gain": entry.gain, "gain_lower_bound": entry.gain_low, "level": entry.level, "prompts": entry.prompts,
               "why": "the learned continuation beat the best fixed mixture within the same budgets out of fold "
                      f"(one-sided paired bootstrap at {entry.level:g})"}
        return dataclasses.replace(
            base, k=np.full(n, plan.max_samples, dtype=np.int64), plans=(plan,) * n, costs=cost,
            expected_cost=float(cost.mean()) if n else 0.0, rule=EVIDENCE_RULE, rule_evidence=why, lam=entry.lam,
            internal_budget=None, expected_samples=None, expected_waves=None, probe_cost=0.0, feature_cost=0.0,
            expected_latency=None if base.expected_latency is None
            else np.full(n, entry.latency * self.evidence.unit / self.evidence.tokens_per_sample))

    def save(self, out_dir: str | Path, **kw: Any) -> Path:
        extra = dict(kw.pop("extra_files", None) or {})
        extra[EVIDENCE_FILE] = json.dumps(self.evidence.to_dict()).encode()
        return self.policy.save(out_dir, extra_files=extra, **kw)
