"""The solve stage's solutions: the plan oracle under a mean cost and a mean latency budget
(``solve --latency-budget``), and the writers of ``solution.jsonl`` for both paths.

Latency is in units of one sample's mean completion length on the table (``per_sample`` tokens,
:func:`isocompute.solver.costs.token_multiple_of`; 1.0 = waiting for one sample). A plan's latency on a
prompt is its expected decode length until each wave ends (its longest sample, or the finish at which the
rule fired), summed over waves, plus ``overhead`` (same units) per wave::

    L[i, p] = latency_tokens[i, p] / per_sample + overhead · E[waves[i, p]]

With ``decode_speed`` (``solve --decode-speed``, tokens per second) the summary also gives the mean latency
in seconds, ``mean_latency_s = mean_latency · per_sample / decode_speed`` (the overhead counts as that many
sample lengths of decode time), for the solution and every uniform none@k.

:func:`latency_oracle` sorts each prompt's plans by its own cost (as
:func:`~isocompute.policy.plans.arrays.allocate_plans` does), solves both budgets exactly with
:func:`isocompute.solver.allocate_two.allocate_two` and maps the mixture back to plan indices. Before it,
the least mean latency within the cost budget (an LP: :func:`~isocompute.solver.allocate.allocate` on −L)
is computed, so an infeasible latency budget fails with the least feasible value.

Example: none@1 has latency ≈ 1.0 on average (each prompt's mean length over the table's mean), none@16
the expected longest of 16 samples (≈ 2–3 on reasoning traces), ``first:m=1@4s`` (the first of 4 to
finish) less than 1. Ignores: deterministic rounding (the result is a randomised mixture; both budgets hold
in expectation) and the cost-only frontier (``--budgets`` still writes the frontier without latency).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from isocompute.errors import InputError

if TYPE_CHECKING:
    import numpy as np


def check_latency_options(latency_budget: float | None, rounding: str, wave_overhead: float,
                          decode_speed: float | None = None) -> None:
    """solve's checks of ``--latency-budget``, ``--wave-overhead`` and ``--decode-speed`` (InputError with the fix)."""
    if latency_budget is not None and not (math.isfinite(latency_budget) and latency_budget >= 0):
        raise InputError(f"--latency-budget must be a finite number ≥ 0; you passed {latency_budget!r}.")
    if latency_budget is not None and rounding != "mix":
        raise InputError("--latency-budget mixes plans at the boundary; drop --rounding deterministic.")
    check_latency_units(wave_overhead, decode_speed)
    if decode_speed is not None and latency_budget is None:
        raise InputError("--decode-speed gives the solution's mean latency in seconds, which only --latency-budget "
                         "computes; add --latency-budget (a large one, e.g. 1e9, leaves the solution as without it) "
                         "or drop --decode-speed.")


def check_latency_units(wave_overhead: float, decode_speed: float | None) -> None:
    """``--wave-overhead`` (finite, ≥ 0, sample units per wave) and ``--decode-speed`` (finite tokens per
    second > 0, or None), as solve and report take them (InputError with the fix)."""
    if not (math.isfinite(wave_overhead) and wave_overhead >= 0):
        raise InputError(f"--wave-overhead must be a finite number ≥ 0 (one sample's mean completion length per "
                         f"wave); you passed {wave_overhead!r}.")
    if decode_speed is not None and not (math.isfinite(decode_speed) and decode_speed > 0):
        raise InputError(f"--decode-speed must be a finite number of tokens per second > 0; you passed "
                         f"{decode_speed!r}.")


@dataclass(frozen=True, eq=False)
class LatencySolution:
    """The two-budget oracle's result on plan columns: ``res`` (an
    :class:`~isocompute.solver.allocate_two.Allocation2` on the cost-sorted columns), ``order`` (N, P) the
    plan of each sorted column, ``probs`` (N, P) each plan's probability per prompt, ``latency`` (N, P) in
    sample units, ``tokens`` (N, P) expected tokens generated, ``per_sample`` tokens per latency unit."""

    res: Any
    order: np.ndarray
    probs: np.ndarray
    latency: np.ndarray
    tokens: np.ndarray
    per_sample: float
    latency_budget: float
    overhead: float

    def head(self) -> dict[str, Any]:
        """The summary's first fields, as the cost-only path writes them (``lp_utility`` is the dual bound
        g(λ*, μ*); ``mix_prob`` the weight off the first allocation)."""
        r = self.res
        return {"budget": r.budget, "lambda": r.lam, "mean_cost": r.mean_cost, "mean_utility": r.mean_utility,
                "lp_utility": r.dual_value, "n_prompts": r.n_prompts, "n_mixed": int(r.mixed.size),
                "mix_prob": float(1.0 - r.weights[0]), "status": r.status, "message": r.message}

    def fields(self, speed: float | None = None) -> dict[str, Any]:
        """The latency fields of the summary: budget, overhead, μ*, and the solution's mean latency and tokens
        (with ``speed`` tokens per second also ``decode_speed`` and the mean latency in seconds)."""
        out = {"latency_budget": self.latency_budget, "wave_overhead": self.overhead, "mu": self.res.mu,
               "latency_unit_tokens": self.per_sample,
               "mean_latency": float((self.probs * self.latency).sum(axis=1).mean()),
               "mean_tokens": float((self.probs * self.tokens).sum(axis=1).mean())}
        return out if speed is None else {**out, "decode_speed": speed, **self._seconds(out, speed)}

    def uniform(self, column: int, speed: float | None = None) -> dict[str, float]:
        """Mean latency and tokens of one plan played everywhere (the uniform ladder's none@k)."""
        out = {"mean_latency": float(self.latency[:, column].mean()),
               "mean_tokens": float(self.tokens[:, column].mean())}
        return out if speed is None else {**out, **self._seconds(out, speed)}

    def _seconds(self, out: dict[str, float], speed: float) -> dict[str, float]:
        """``mean_latency_s``: the mean latency in seconds at ``speed`` decode tokens per second."""
        return {"mean_latency_s": out["mean_latency"] * self.per_sample / speed}


def latency_columns(arr: Any, overhead: float, per_sample: float) -> tuple[np.ndarray, np.ndarray]:
    """(L in sample units, expected tokens) of a :class:`~isocompute.policy.plans.arrays.PlanArrays`;
    InputError when the table has no token counts."""
    import numpy as np

    if arr.latency is None or arr.tokens is None or not (np.isfinite(arr.latency).all()):
        raise InputError("--latency-budget needs completion_tokens on every sample of the outcome table (a plan's "
                         "latency is the decode length of its waves); this table has none. Re-import it with "
                         "token counts, or drop --latency-budget.")
    return arr.total_latency(overhead * per_sample) / per_sample, arr.tokens


def latency_oracle(arr: Any, budget: float, latency_budget: float, overhead: float,
                   per_sample: float) -> LatencySolution:
    """Solve ``arr``'s plan menu under mean cost ``budget`` and mean latency ``latency_budget`` (module
    docstring); InputError when the latency budget is below the least mean latency within the cost budget."""
    import numpy as np

    from isocompute.solver.allocate import allocate
    from isocompute.solver.allocate_two import allocate_two
    from isocompute.solver.plans.estimates import by_cost

    L, T = latency_columns(arr, overhead, per_sample)
    order = by_cost(arr.utility, arr.cost)
    Ls = np.take_along_axis(L, order.order, axis=1)
    least = -allocate(-Ls, order.cost, budget).lp_utility  # min mean latency s.t. mean cost ≤ budget (an LP)
    if latency_budget < least * (1 - 1e-9):
        raise InputError(f"--latency-budget {latency_budget:g} is infeasible at --budget {budget:g}: the least mean "
                         f"latency within that cost budget is {least:.6g} (units of one sample's mean completion "
                         f"length, {per_sample:.6g} tokens; wave overhead {overhead:g}). Pass --latency-budget "
                         f"{least:.4g} or more, or raise --budget.")
    res = allocate_two(order.utility, order.cost, Ls, budget, max(latency_budget, least))
    probs = np.zeros_like(L)
    np.put_along_axis(probs, order.order, res.action_probs(), axis=1)
    return LatencySolution(res, order.order, probs, L, T, float(per_sample), float(latency_budget), float(overhead))


def write_mixture(path: Path, ids: list[str], sol: LatencySolution, ks: Any, names: Any, U: Any, C: Any) -> None:
    """solution.jsonl for the two-budget oracle: per prompt its most likely plan (``action``, ``plan``, ``k``,
    ``p``); a prompt that mixes also has the next (``action_hi``, ``plan_hi``, ``k_hi``, ``p_hi``) and, when it
    mixes over more than two, ``mix`` (every plan with its probability); then its rows of U, C and L."""
    import numpy as np

    with open(path, "w", encoding="utf-8") as f:
        for i, rid in enumerate(ids):
            cols = np.flatnonzero(sol.probs[i] > 0)
            cols = cols[np.argsort(-sol.probs[i, cols], kind="stable")].tolist()
            a = cols[0]
            row: dict[str, Any] = {"id": rid, "action": a, "k": int(ks[a]), "p": float(sol.probs[i, a]),
                                   "plan": names[a]}
            if len(cols) > 1:
                b = cols[1]
                row.update(action_hi=b, k_hi=int(ks[b]), p_hi=float(sol.probs[i, b]), plan_hi=names[b])
            if len(cols) > 2:
                row["mix"] = [{"action": c, "plan": names[c], "p": float(sol.probs[i, c])} for c in cols]
            row.update(utilities=U[i].tolist(), costs=C[i].tolist(), latencies=sol.latency[i].tolist())
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_solution(path: Path, ids: list[str], res: Any, ks: Any, U: Any, C: Any, order: Any = None,
                    names: Any = None) -> None:
    """One line per prompt; with plans (``order``: each prompt's cost-sorted columns → plan indices,
    ``names``) the actions are plan indices and each line names its plan."""
    mixed = set(res.mixed.tolist())
    p = res.mix_prob
    with open(path, "w", encoding="utf-8") as f:
        for i, (rid, a, a_hi) in enumerate(zip(ids, res.actions.tolist(), res.actions_hi.tolist(), strict=True)):
            if order is not None:
                a, a_hi = int(order[i, a]), int(order[i, a_hi])
            row: dict[str, Any] = {"id": rid, "action": a, "k": int(ks[a]), "p": 1.0 - p if i in mixed else 1.0}
            if names is not None:
                row["plan"] = names[a]
            if i in mixed:
                row.update(action_hi=a_hi, k_hi=int(ks[a_hi]), p_hi=p)
                if names is not None:
                    row["plan_hi"] = names[a_hi]
            row.update(utilities=U[i].tolist(), costs=C[i].tolist())
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
