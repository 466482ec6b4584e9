"""A table's plan arrays — U, C, expected samples and waves per prompt and plan — and the oracle over them.

:func:`plan_arrays` runs the plan estimators (:func:`isocompute.solver.plans.estimates.estimate_table`,
exact expectations over random orders of each prompt's samples) and prices every plan in the policy's
cost unit: ``samples`` (C = E[samples drawn]) or ``flops`` (prefill once per plan with prefix caching,
plus the expected decode FLOPs of the samples drawn; needs token counts and the model's config). The
arrays are what ``fit``, ``report`` and ``solve`` work on; an adaptive plan's cost differs per prompt
(it stops early where the votes agree), so unlike k samples, C[i, p] is not one number per plan.

Ragged tables, as :mod:`isocompute.solver.ragged` does for k samples: prompts with fewer samples than
``min_samples`` are dropped; with ``ragged="infeasible"`` a plan that can draw more samples than prompt
i has is infeasible for i only — the estimators run per group of equal n on the plans that fit, and an
infeasible plan p gets the utility of the prompt's largest feasible one-wave plan f = ``none@k`` at the
cost of drawing all its samples,

    U[i, p] = U[i, f],   C[i, p] = C[i, f] · max_samples(p) / k,   samples = max_samples(p),

so it is dominated and no budget picks it for that prompt (as an infeasible k is in
:mod:`isocompute.solver.ragged`: in samples it costs its k). Example: a prompt with 5 samples and the
menu none@1, none@4, lead:m=2@1x8 → lead:m=2@1x8 gets none@4's utility at cost 8.

:func:`allocate_plans` is the Lagrangian oracle over plan columns: each prompt's columns sorted by its
own cost (:func:`~isocompute.solver.plans.estimates.by_cost`, as :func:`~isocompute.solver.allocate.allocate`
needs), solved, and mapped back to plan indices. Ignores: how the menu is chosen
(:mod:`isocompute.policy.plans.menu`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from isocompute.errors import InputError
from isocompute.solver.allocate import Allocation, allocate
from isocompute.solver.outcomes import OutcomeTable
from isocompute.solver.plans.estimates import by_cost, estimate_table
from isocompute.solver.plans.plan import Plan
from isocompute.solver.ragged import RaggedTable, count_ragged, drop_short, prepare, ragged_summary


@dataclass(frozen=True, eq=False)
class PlanArrays:
    """(N, P) arrays for the kept prompts of a table and a menu of P plans: expected ``utility``,
    ``cost`` (in ``cost_unit``), ``samples`` and ``waves``; ``feasible`` (N, P) bool; ``table`` the kept
    prompts, ``kept`` their rows in the input table, ``dropped`` the ids dropped with ``min_samples``.
    With token counts on the table, ``tokens`` (expected completion tokens generated, aborted samples'
    partial tokens included) and ``latency`` (expected decode length in tokens until each wave ends,
    summed over waves; :meth:`total_latency` adds a per-wave overhead), else None."""

    plans: tuple[Plan, ...]
    utility: np.ndarray
    cost: np.ndarray
    samples: np.ndarray
    waves: np.ndarray
    feasible: np.ndarray
    table: OutcomeTable
    kept: np.ndarray
    dropped: list[str]
    min_samples: int
    cost_unit: str
    ragged: RaggedTable | None = None
    tokens: np.ndarray | None = None
    latency: np.ndarray | None = None

    def total_latency(self, overhead: float = 0.0) -> np.ndarray:
        """(N, P) expected latency in tokens of decode time, plus ``overhead`` tokens' worth per wave
        (InputError without token counts)."""
        if self.latency is None:
            raise InputError("latency needs completion_tokens in the outcome table (each sample's length); "
                             "this table has none.")
        return self.latency + float(overhead) * self.waves

    @property
    def n_ragged(self) -> int:
        return count_ragged(self.feasible)

    def summary(self) -> str:
        """What a ragged table lost or had marked (empty when nothing)."""
        if self.ragged is not None:
            return self.ragged.summary()
        return ragged_summary(self.dropped, self.min_samples, self.n_ragged, len(self.table),
                              "plan draws; those plans are marked infeasible")

    def subset(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(U, C, samples, waves) of ``rows``."""
        return self.utility[rows], self.cost[rows], self.samples[rows], self.waves[rows]


def plan_arrays(table: OutcomeTable, plans: Sequence[Plan], *, cost_unit: str = "samples", model: Any = None,
                min_samples: int = 0, ragged: str = "error", prefix_caching: bool = True) -> PlanArrays:
    """Estimate ``plans`` on ``table`` (module docstring); ``model``: the FLOP shape (cost unit flops)."""
    plans = tuple(plans)
    if cost_unit not in ("samples", "tokens", "flops"):
        raise InputError(f"unknown cost unit {cost_unit!r}; use samples, tokens or flops.")
    if cost_unit == "flops" and model is None:
        raise InputError("plan costs in FLOPs need the model's config: pass --model-config PATH.")
    maxs = np.array([p.max_samples for p in plans], dtype=np.int64)
    sub, kept, dropped, floor = drop_short(table, sorted(set(maxs.tolist())), min_samples=min_samples, ragged=ragged)
    n = sub.n_samples
    N, P = len(sub), len(plans)
    out = {k: np.empty((N, P)) for k in ("utility", "cost", "samples", "waves", "tokens", "latency")}
    timed = True  # every group has token counts
    feasible = maxs[None, :] <= n[:, None]
    for nn in np.unique(n):
        rows = np.flatnonzero(n == nn)
        feas = np.flatnonzero(maxs <= nn)
        part = sub if rows.size == N else sub.subset(rows)
        est = estimate_table(part, [plans[j] for j in feas], model=model if cost_unit == "flops" else None)
        got = {"utility": est.utility, "samples": est.samples, "waves": est.waves,
               "cost": est.cost(cost_unit, model=model, prefix_caching=prefix_caching)}  # type: ignore[arg-type]
        timed = timed and est.generated_tokens is not None and est.latency is not None
        if timed:
            got.update(tokens=est.generated_tokens, latency=est.latency)
        for k, v in got.items():
            out[k][np.ix_(rows, feas)] = v
        infeasible = np.flatnonzero(maxs > nn)
        if infeasible.size:
            one_wave = np.array([p.n_waves == 1 and p.rule.kind == "none" for p in plans])
            ok = (maxs <= nn) & (one_wave if (one_wave & (maxs <= nn)).any() else True)
            f = int(np.argmax(np.where(ok, maxs, -1)))  # the largest feasible none@k (first of ties)
            scale = maxs[infeasible] / maxs[f]
            out["utility"][np.ix_(rows, infeasible)] = out["utility"][rows, f][:, None]
            out["cost"][np.ix_(rows, infeasible)] = out["cost"][rows, f][:, None] * scale[None, :]
            out["samples"][np.ix_(rows, infeasible)] = maxs[infeasible][None, :].astype(np.float64)
            out["waves"][np.ix_(rows, infeasible)] = np.array([plans[j].n_waves for j in infeasible], float)[None, :]
            if timed:  # dominated in tokens and latency as in cost
                for k in ("tokens", "latency"):
                    out[k][np.ix_(rows, infeasible)] = out[k][rows, f][:, None] * scale[None, :]
    return PlanArrays(plans, out["utility"], out["cost"], out["samples"], out["waves"], feasible, sub, kept,
                      dropped, floor, cost_unit, tokens=out["tokens"] if timed else None,
                      latency=out["latency"] if timed else None)


def table_arrays(table: OutcomeTable, config: Any, *, model: Any = None) -> PlanArrays:
    """A policy config's arrays on ``table``: its plan menu through :func:`plan_arrays`, or — without
    one — the k-sample utilities (:func:`isocompute.solver.ragged.prepare`, every strategy) and cost
    table of its ``actions``, with samples k and one wave (the policy before plans, unchanged)."""
    from isocompute.policy.plans.menu import menu_of
    from isocompute.solver.costs import cost_table

    plans = menu_of(config.plans, config.actions)
    if config.plans:
        return plan_arrays(table, plans, cost_unit=config.cost_unit, model=model, min_samples=config.min_samples,
                           ragged=config.ragged)
    prep = prepare(table, config.actions, config.strategy, min_samples=config.min_samples, ragged=config.ragged)
    sub = prep.table
    C = cost_table(sub.prompt_tokens, sub.mean_completion_tokens, config.actions, unit=config.cost_unit, model=model)
    S = np.broadcast_to(np.asarray(config.actions, dtype=np.float64), C.shape).copy()
    return PlanArrays(plans, prep.utilities, C, S, np.ones_like(C), prep.feasible, sub, prep.kept, prep.dropped,
                      prep.min_samples, config.cost_unit, prep)


@dataclass(frozen=True, eq=False)
class PlanAllocation:
    """:func:`allocate_plans`' result: ``allocation`` on the per-prompt cost-sorted columns, and its
    ``actions`` / ``actions_hi`` (N,) and ``action_probs()`` (N, P) mapped back to plan indices."""

    allocation: Allocation
    order: np.ndarray

    @property
    def actions(self) -> np.ndarray:
        return self.order[np.arange(self.order.shape[0]), self.allocation.actions]

    @property
    def actions_hi(self) -> np.ndarray:
        return self.order[np.arange(self.order.shape[0]), self.allocation.actions_hi]

    @property
    def mean_cost(self) -> float:
        return self.allocation.mean_cost

    @property
    def mean_utility(self) -> float:
        return self.allocation.mean_utility

    def action_probs(self) -> np.ndarray:
        sorted_probs = self.allocation.action_probs()
        out = np.zeros_like(sorted_probs)
        np.put_along_axis(out, self.order, sorted_probs, axis=1)
        return out


def allocate_plans(U: np.ndarray, C: np.ndarray, budget: float, *, rounding: str = "mix") -> PlanAllocation:
    """The oracle over plan columns whose costs differ per prompt (module docstring). For columns already
    sorted by cost in every row this is :func:`~isocompute.solver.allocate.allocate` itself."""
    order = by_cost(np.asarray(U, dtype=np.float64), np.asarray(C, dtype=np.float64))
    return PlanAllocation(allocate(order.utility, order.cost, budget, rounding=rounding),  # type: ignore[arg-type]
                          order.order)


def plan_stats(plans: Sequence[Plan], shape: tuple[int, int], samples: Any, waves: Any) -> tuple[np.ndarray, np.ndarray]:
    """Each plan's expected samples and waves per prompt, (N, P) each: as given, or k and 1 for a menu of
    one-wave plans (InputError when adaptive plans lack them, or a shape is wrong)."""
    out = []
    for name, x, one_wave in (("samples", samples, [p.max_samples for p in plans]), ("waves", waves, [1] * len(plans))):
        if x is None:
            if any(p.n_waves > 1 or p.rule.kind != "none" for p in plans):
                raise InputError(f"adaptive plans need their expected {name} per prompt: pass samples= and waves= "
                                 "(isocompute.policy.plans.arrays.plan_arrays).")
            x = np.broadcast_to(np.asarray(one_wave, dtype=np.float64), shape)
        x = np.asarray(x, dtype=np.float64)
        if x.shape != shape:
            raise InputError(f"{name} must have the utilities' shape {shape}; got {x.shape}.")
        out.append(x)
    return out[0], out[1]
