"""Fitting a policy on an outcome table: the budget range, the extra features' pricing, then the fit.

:func:`fit_policy` is what ``isocompute fit`` runs once it has parsed its flags: it prices what every
request pays before sampling (the probe's declared cost, already in the config's :class:`ProbeSpec`,
and the extra feature blocks' encoder FLOPs, which in samples need one sample's FLOPs per prompt on the
table's model), sets the budget range to everything the actions can spend when asked to
(:func:`default_budget_range`), and fits :class:`~isocompute.policy.policy.Policy`.

Default budget range: with mean action costs c̄_1 < … < c̄_A on the table and a per-request cost p
(probe + extra features), the policy can serve mean budgets [c̄_1 + p, c̄_A + p]; the ends are rounded
*inwards* to 4 significant digits of the upper end, so a report's rounded budget grid stays inside.
Example: actions 1…16 in samples, a probe of 0.4321 samples → [1.433, 16.43].

With a plan menu (``config.plans``) the plans are estimated on the table once
(:func:`isocompute.policy.plans.arrays.table_arrays`) and those arrays give both the default budget range
(what the plans can spend: from every prompt on its cheapest plan to every prompt on its dearest) and
the fit. A ragged table (prompts with fewer samples than the largest action or plan) is first cut to
the prompts the config keeps (:func:`training_table`, :mod:`isocompute.solver.ragged`).

Ignores: computing the probe's values (a model call: :mod:`isocompute.engines.probe_cache`; the
caller passes them) and reading files (the CLI reads the table and the model config).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from isocompute.errors import InputError
from isocompute.policy.config import PolicyConfig
from isocompute.policy.policy import Policy
from isocompute.solver.allocate import feasible_range
from isocompute.solver.costs import cost_table
from isocompute.solver.ragged import drop_short


def sample_flops_for(table: Any, model: Any) -> np.ndarray:
    """One sample's FLOPs per prompt of ``table`` on ``model`` (the flops cost table's k = 1 column)."""
    if not table.has_token_counts:
        raise InputError("pricing the extra features in samples needs the table's prompt_tokens and "
                         "completion_tokens; this table lacks some. Declare the cost with --feature-cost.")
    return cost_table(table.prompt_tokens, table.mean_completion_tokens, (1,), unit="flops", model=model)[:, 0]


def expected_feature_cost(config: PolicyConfig, prompts: Sequence[str], sample_flops: Any) -> float:
    """The extra features' cost per request that fitting on ``prompts`` will declare (their encoders'
    mean FLOPs, in the config's unit), computed from token counts alone — for the default budget range."""
    if not config.feature_extras:
        return 0.0
    if config.feature_cost is not None:
        return float(config.feature_cost)
    from isocompute.policy.features.embedding import EmbeddingBlock, cost_in_samples

    flops = float(sum(np.mean(EmbeddingBlock(name).flops(prompts)) for name in config.feature_extras))
    return flops if config.cost_unit == "flops" else cost_in_samples(flops, sample_flops)


def default_budget_range(table: Any, config: PolicyConfig, *, model_flops: Any = None,
                         sample_flops: Any = None, costs: np.ndarray | None = None) -> tuple[float, float]:
    """Everything the actions can spend on ``table``, the probe and extra features included, rounded
    inwards to 4 significant digits (see the module docstring); ``costs``: the table's (N, P) plan costs
    when already estimated (default: the actions' cost table)."""
    C = costs if costs is not None else cost_table(table.prompt_tokens, table.mean_completion_tokens,
                                                   config.actions, unit=config.cost_unit, model=model_flops)
    paid = ((config.probe.cost if config.probe is not None else 0.0)
            + expected_feature_cost(config, table.prompts, sample_flops))
    lo, hi = feasible_range(C + paid)
    step = 10.0 ** (math.floor(math.log10(hi)) - 3) if hi > 0 else 1.0
    lo, hi = math.ceil(lo / step - 1e-9) * step, math.floor(hi / step + 1e-9) * step
    return round(lo, 12), round(hi, 12)


def training_table(table: Any, config: PolicyConfig) -> tuple[Any, list[str], int]:
    """(the prompts the config keeps, the ids it drops, the threshold): prompts with fewer samples than
    ``config.min_samples`` (or than the smallest action, with ``ragged="infeasible"``) are dropped, and
    a ragged rest without ``ragged="infeasible"`` is an InputError naming both ways to keep it."""
    sub, _, dropped, floor = drop_short(table, sample_counts(config), min_samples=config.min_samples,
                                        ragged=config.ragged)
    return sub, dropped, floor


def sample_counts(config: PolicyConfig) -> list[int]:
    """The sample counts a config's actions may draw, ascending: its actions' k, or its plans' maxima."""
    if not config.plans:
        return list(config.actions)
    from isocompute.solver.plans.plan import parse_plan

    return sorted({parse_plan(n).max_samples for n in config.plans})


def fit_policy(table: Any, config: PolicyConfig, *, feasible_budgets: bool = False, model_flops: Any = None,
               sample_model: Any = None, probe: np.ndarray | None = None, progress: bool = False) -> Policy:
    """Fit ``config`` on an outcome table and return the fitted :class:`Policy`.

    ``feasible_budgets``: serve everything the actions can spend (:func:`default_budget_range`) instead
    of ``config.budget_range``. ``model_flops``: the FLOP shape that prices the ``flops`` cost unit.
    ``sample_model``: the table's model, which prices extra features in samples (default
    ``model_flops``; not needed when the config declares ``feature_cost``). ``probe``: the probe's value
    per prompt the config keeps (:func:`training_table`; every prompt of a table that is not ragged),
    exactly when the config has a probe. What was dropped is in the policy's ``training_data_``.
    """
    from isocompute.solver.votes.consensus import with_target

    table = with_target(table, config.target)
    config = dataclasses.replace(config, target=table.target)
    full = table
    table, dropped, floor = training_table(table, config)
    sample_flops = None
    if config.feature_extras and config.cost_unit == "samples" and config.feature_cost is None:
        model = sample_model if sample_model is not None else model_flops
        if model is None:
            raise InputError("extra features in cost unit samples are priced against one sample's FLOPs, which "
                             "needs the table's model: pass --model-config PATH, or declare the cost per request "
                             "with --feature-cost.")
        sample_flops = sample_flops_for(table, model)
    arrays = None
    if config.plans:
        from isocompute.policy.plans.arrays import table_arrays

        arrays = table_arrays(table, config, model=model_flops if config.cost_unit == "flops" else None)
    if feasible_budgets:
        config = dataclasses.replace(config, budget_range=default_budget_range(
            table, config, model_flops=model_flops, sample_flops=sample_flops,
            costs=None if arrays is None else arrays.cost))
    policy = Policy(config).fit(table, model_flops=model_flops, probe=probe, sample_flops=sample_flops,
                                progress=progress, arrays=arrays)
    policy.training_data_.update(prompts_in_table=len(full), dropped=len(dropped), dropped_ids=dropped[:20],
                                 min_samples=floor)
    if dropped:
        ragged = policy.training_data_["summary"]
        policy.training_data_["summary"] = "; ".join(
            x for x in (f"dropped {len(dropped)} of {len(full)} prompts with fewer than {floor} samples "
                        f"(e.g. {dropped[0]!r})", ragged) if x)
    return policy
