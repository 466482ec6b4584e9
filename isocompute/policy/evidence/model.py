"""An evidence-aware plan fitted on an outcome table, and what it serves at each budget.

:func:`fit_evidence` does the whole job on a table with token counts:

1. the fixed plans' exact values per prompt (:func:`isocompute.solver.plans.estimates.estimate_table`,
   the menu ``default_plans() + parallel_plans()`` within the table's samples per prompt unless given): utility, tokens, latency;
2. the learned continuation's out-of-fold values at every price (:func:`~isocompute.policy.evidence.crossfit.crossfit_values`);
3. the chain per budget (:func:`~isocompute.policy.evidence.chain.chain_entry`) on a grid of token budgets
   × latency budgets (none, and :data:`LATENCY_LEVELS` where reachable);
4. the heads refitted on every prompt: those serve.

:class:`EvidenceModel` holds the result and is JSON (``evidence.json`` in a policy directory: the heads
as LightGBM text). :meth:`EvidenceModel.entry_at` gives a request's chain entry (the largest grid budget
≤ the request's, the largest latency level ≤ its latency budget); :meth:`EvidenceModel.plan_at` the plan
to run there, or None where the fixed plan serves.

Units: the typical length ``unit`` (the table's median completion tokens) inside; budgets and the
entries' tokens and latency as :meth:`entry_at` reads them are in the same unit (``tokens_per_sample``, the
mean, converts to "x" budgets).

Worked example: a gpt-oss-20b MATH-500 table, schedule 4s,8s: unit 763 tokens; at a budget of 4x (6,940
tokens = 9.1 units) with latency ≤ 1.0 sample the entry may say ``evidence`` at λ = 0.004, μ = 0 — play
``evidence:lam=0.004,mu=0@4s,8s`` — or ``fixed_plan`` with the mixture to serve instead.

Ignores: prompt text (the policy's chain handles it) and waiting waves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from isocompute.errors import InputError
from isocompute.policy.evidence.chain import ChainEntry, chain_entry
from isocompute.policy.evidence.continuation import HORIZONS, Heads
from isocompute.policy.evidence.crossfit import Values, crossfit_values, train_heads, walks_of
from isocompute.policy.evidence.rule import EvidenceRule
from isocompute.solver.plans.estimates import estimate_table
from isocompute.solver.plans.plan import PARALLEL, Plan, default_plans, parallel_plans

__all__ = ["EvidenceModel", "fit_evidence", "fixed_values"]

LATENCY_LEVELS = (0.75, 1.0, 1.5, 2.0)  # in mean sample lengths
N_BUDGETS = 13
SCHEMA = 1


@dataclass(eq=False)
class EvidenceModel:
    waves: tuple[int, ...]
    unit: float
    tokens_per_sample: float
    heads: Heads
    entries: list[ChainEntry]
    menu: tuple[str, ...]
    level: float = 0.95
    values: Values | None = field(default=None, repr=False)  # out-of-fold values (not saved)

    def plan(self, lam: float, mu: float) -> Plan:
        return Plan(self.waves, EvidenceRule(lam, mu, self.unit, self.heads), (PARALLEL,) * len(self.waves))

    def entry_at(self, budget: float, latency_budget: float | None = None) -> ChainEntry | None:
        """The chain entry serving a request at ``budget`` tokens (and ``latency_budget`` in mean sample
        lengths), or None below the grid."""
        b = budget / self.unit
        levels = sorted({e.latency_budget for e in self.entries if e.latency_budget is not None})
        if latency_budget is None:
            lv = None
        else:
            under = [x for x in levels if x * self.unit / self.tokens_per_sample <= latency_budget + 1e-12]
            if not under:
                return None
            lv = under[-1]
        rows = [e for e in self.entries if e.latency_budget == lv and e.budget <= b * (1 + 1e-9)]
        return max(rows, key=lambda e: e.budget) if rows else None

    def plan_at(self, budget: float, latency_budget: float | None = None) -> tuple[Plan | None, ChainEntry | None]:
        e = self.entry_at(budget, latency_budget)
        if e is None or e.rule != "evidence":
            return None, e
        return self.plan(e.lam, e.mu), e  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "waves": list(self.waves), "unit": self.unit,
                "tokens_per_sample": self.tokens_per_sample, "level": self.level, "menu": list(self.menu),
                "entries": [e.to_dict() for e in self.entries], "heads": self.heads.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EvidenceModel:
        if d.get("schema") != SCHEMA:
            raise InputError(f"evidence.json has schema {d.get('schema')!r}; this isocompute reads {SCHEMA}. Refit it.")
        return cls(tuple(int(w) for w in d["waves"]), float(d["unit"]), float(d["tokens_per_sample"]),
                   Heads.from_dict(d["heads"]), [ChainEntry.from_dict(e) for e in d["entries"]],
                   tuple(d["menu"]), float(d.get("level", 0.95)))


def fixed_values(table, menu: list[Plan], unit: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(U, T, L) per prompt and plan of ``menu``, tokens and latency in ``unit``."""
    est = estimate_table(table, menu)
    return est.utility, est.tokens / unit, est.latency / unit


def _budgets(values: Values, fixed: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    lo = max(float(values.tokens.mean(axis=0).min()), float(fixed[1].mean(axis=0).min()))
    hi = float(values.tokens.mean(axis=0).max())
    return np.geomspace(lo, max(hi, lo * 1.01), N_BUDGETS)


def fit_evidence(table, waves: tuple[int, ...] = (4, 8), *, menu: list[Plan] | None = None, folds: int = 5,
                 draws: int = 16, eval_draws: int = 16, seed: int = 0, level: float = 0.95,
                 horizons: tuple[int, ...] = HORIZONS, use_confidence: bool = False) -> EvidenceModel:
    """Fit the evidence-aware plan on ``table`` (module docstring). ``use_confidence`` (off by default) lets
    the heads read the samples' confidence where the table has it (``Heads.confidence``): the gateway then
    streams those plans' waves with logprobs (``EvidenceRule.needs_confidence``), which a tokens budget pays
    at ``isocompute.flops.logprobs.LOGPROB_COST_FACTOR``."""
    if not table.has_token_counts and np.isnan(table.completion_tokens[table.mask]).any():
        raise InputError(f"evidence plans need completion_tokens on every sample; {table.source} lacks some.")
    lengths = table.completion_tokens[table.mask]
    unit, per_sample = float(np.median(lengths)), float(np.mean(lengths))
    if menu is None:  # the fixed plans the table can price: at most its fewest samples per prompt
        menu = [p for p in default_plans() + parallel_plans() if p.max_samples <= int(table.n_samples.min())]
    menu = list(menu)
    fixed = fixed_values(table, menu, unit)
    values = crossfit_values(table, tuple(waves), unit=unit, folds=folds, draws=draws, eval_draws=eval_draws,
                             seed=seed, horizons=horizons, use_confidence=use_confidence)
    entries = []
    for lv in (None, *LATENCY_LEVELS):
        lv_units = None if lv is None else lv * per_sample / unit
        for b in _budgets(values, fixed):
            entries.append(chain_entry(values, fixed, float(b), lv_units, level=level, seed=seed))
    w, conf = walks_of(table, tuple(waves), np.arange(len(table)), unit=unit, draws=draws, seed=seed + 99)
    heads = train_heads(w, seed=seed, horizons=horizons, confidence=conf if use_confidence else None)
    return EvidenceModel(tuple(waves), unit, per_sample, heads, entries, tuple(p.name for p in menu), level, values)
