"""The arrays a report evaluates beside the policy's own: a second cost unit, the rule families' fixed-plan
baselines, and the other target.

:func:`alt_costs` and :func:`baselines` are described in :mod:`isocompute.stages.report`'s docstring.

A report is scored on one target (:mod:`isocompute.solver.votes.consensus`: the policy's, or ``--target``);
every method's accuracy under the other one rides along as a channel (:mod:`isocompute.evaluation.channels`):
gold beside consensus when every sample has a verdict, consensus beside gold always. ``report.json``'s
``target`` block names both and, with gold, how often the consensus label disagrees with it.

Ignores: the evaluation itself (:mod:`isocompute.stages.report`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from isocompute.errors import InputError
from isocompute.stages.inputs import model_flops_for

__all__ = ["alt_costs", "baselines", "other_target", "same_prompts", "target_info"]


def other_target(raw: Any, target: str) -> Any:
    """The table under the target the report is not scored on, where it has one; None otherwise."""
    from isocompute.solver.votes.consensus import with_target

    if target == "consensus":
        return raw if raw.has_gold else None
    return with_target(raw, "consensus")


def same_prompts(other: Any, table: Any) -> Any:
    """``other``'s rows of ``table``'s prompts, in ``table``'s order (the prompts a policy keeps)."""
    if other.ids == table.ids:
        return other
    row = {rid: j for j, rid in enumerate(other.ids)}
    return other.subset([row[i] for i in table.ids])


def target_info(raw: Any, table: Any, other: Any) -> dict[str, Any]:
    """report.json's ``target``: what accuracy is scored on, the channel beside it, and (with gold) how often
    the consensus label and gold disagree (:func:`isocompute.solver.votes.consensus.agreement`)."""
    from isocompute.solver.votes.consensus import agreement

    return {"scored_on": table.target, "also": None if other is None else other.target,
            "agreement": agreement(raw).as_dict() if raw.has_gold else None}


def alt_costs(model_config: Any, table: Any, policy: Any, model: Any, inputs: dict[str, str],
               arrays: Any) -> dict[str, Any]:
    """The cost table in a second unit for "same accuracy for less": FLOPs when the table's model is known
    (``model_config`` or its meta; the probe's and extra features' FLOPs paid per request), samples
    when the policy's unit is FLOPs; {} when neither is known. ``arrays``: the table's plan arrays."""
    from isocompute.policy.plans.arrays import table_arrays

    pc = policy.config
    if pc.cost_unit == "flops":
        return {"C_alt": arrays.samples, "alt_unit": "samples"}
    if model is None:
        try:
            model, extra = model_flops_for(table, model_config)
        except InputError:
            return {}
        inputs.update(extra)
    if not table.has_token_counts:
        return {}
    paid = ((pc.probe.flops or 0.0) if pc.probe is not None else 0.0) + (
        policy.features_.extra_flops_per_prompt_ if pc.feature_extras else 0.0)
    flops = table_arrays(table, dataclasses.replace(pc, cost_unit="flops", min_samples=0), model=model)
    return {"C_alt": flops.cost, "paid_alt": float(paid), "alt_unit": "flops"}


def baselines(policy: Any, table: Any, model: Any, unit: float | None = None, overhead: float = 0.0,
               other: Any = None) -> Any:
    """The rule families' plan arrays on the policy's kept prompts (:mod:`isocompute.evaluation.baselines`),
    with their tokens and latency (in ``unit`` tokens, + ``overhead`` per wave) when ``unit`` is given, and
    their utility under ``other``'s target (a table of the same prompts) when given."""
    from isocompute.evaluation.baselines import FixedBaselines, baseline_plans
    from isocompute.evaluation.channels import latency_channel
    from isocompute.policy.plans.arrays import plan_arrays

    pc = policy.config
    plans, columns = baseline_plans(policy.plans, pc.actions)
    arr = plan_arrays(table, plans, cost_unit=pc.cost_unit, model=model, ragged=pc.ragged)
    channels = {} if unit is None or arr.tokens is None or arr.latency is None else {
        "tokens": arr.tokens, "latency": latency_channel(arr.latency, arr.waves, unit, overhead)}
    if other is not None:
        channels[other.target] = plan_arrays(same_prompts(other, table), plans, cost_unit=pc.cost_unit,
                                             model=model, ragged=pc.ragged).utility
    return FixedBaselines(plans, arr.utility, arr.cost, arr.waves, columns, channels)
