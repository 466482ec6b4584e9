"""The report's numbers from per-prompt scores: per budget and method, accuracy and cost with bootstrap
CIs, the gain over uniform, imitation, regret and its bound; across budgets, "same accuracy for less".

:class:`Evaluation` holds what :mod:`isocompute.evaluation.evaluate` measured: per (seed, method, budget,
prompt) the expected correctness and realised cost of every method in :data:`METHODS`.
:func:`summarise` pools them into JSON-able numbers.

Per budget the report carries, pooled over folds and seeds: accuracy (mean utility) and realised mean
cost per method; imitation accuracy (learned action = oracle action); regret = oracle − learned
accuracy and the bound (1 − imitation) × max_i gap_i with gap_i = U[i, o_i] − min_a U[i, a] — it holds
per fold by construction (a mismatched prompt loses at most its gap), so a violation flags a bug; the
relative gain over uniform with a paired bootstrap 95% CI over prompts (per-prompt utilities averaged
over seeds, prompts resampled with replacement), and the same for ``learned_no_fallback``; the share of
the refitted policies whose chain served each rule; and APGR = (learned − uniform)/(oracle − uniform),
the share of the uniform→oracle gap recovered (None when that gap is 0). With plans, also each method's
expected waves (upstream requests per prompt: latency; with token counts also its expected tokens and
latency, :mod:`isocompute.evaluation.channels`) and the gain of the policy as served over the best fixed
plan (``gain_vs_fixed``: its own fixed-plan rule, and ``fixed_best``, the best fixed plan of every rule
family, each chosen on the training part), with paired CIs. Across budgets, "same accuracy
for less" (:func:`same_accuracy`): per method the realised cost, in the cost unit and (with ``C_alt``) in
FLOPs, at which it reaches the accuracy of uniform at the largest action.

Worked example (:func:`cost_to_reach`): a method at (cost 2, accuracy 0.80) and (4, 0.90) reaches a
target of 0.85 at cost 3 — a hashed half-and-half mix of its two budgets' decisions realises that point.

Ignores: uncertainty in the cost to reach (a point estimate from the pooled accuracies).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from isocompute.evaluation.channels import method_means
from isocompute.evaluation.reach import reach_block
from isocompute.policy.config import LEARNERS
from isocompute.policy.plans.menu import FAMILY_BASELINES, PARALLEL_BASELINES

BASE_METHODS = ("oracle", "learned", "uniform", "heuristic", "random")
FIXED_METHODS = ("fixed_plan", *(f"fixed_{f}" for f in (*FAMILY_BASELINES, *PARALLEL_BASELINES)), "fixed_best")
METHODS = (*BASE_METHODS, "oracle_lp", "learned_batch", *(f"learned_{name}" for name in LEARNERS),
           "learned_no_fallback", *FIXED_METHODS, "learned_mix")


@dataclass(frozen=True, eq=False)
class Evaluation:
    """Per-prompt scores of every method: arrays indexed (seed, method, budget, prompt).

    ``utility``/``cost``: (S, M, B, N) with methods in :data:`METHODS` (NaN for a learner the policy
    lacks); ``oracle_actions``/``learned_actions``: (S, B, N) action indices, ``learner_actions``: (S, L, B, N)
    per learner in :data:`LEARNERS` order (−1 where the policy lacks it); ``gap``: (S, B, N)
    U[i, o_i] − min_a U[i, a]; ``fold``: (S, N) held-out fold of each prompt; ``default_learner``:
    per (seed, fold) the learner ``learned`` used; ``rules``: per (seed, fold, budget) the rule of the
    never-worse chain that ``learned`` served (``learned_no_fallback`` is the learner everywhere);
    ``cost_alt``: (S, M, B, N) the same costs in ``alt_unit`` (FLOPs; None without a FLOP model);
    ``reference``: the uniform rule at the largest action on all N prompts — ``accuracy``, ``cost``,
    ``cost_alt`` and ``k`` — the accuracy "same accuracy for less" is measured against; ``waves``:
    (S, M, B, N) expected waves per prompt (None: one wave everywhere); ``plans``: the action menu's plan
    names (``actions`` then holds each plan's maximum samples); ``tokens`` / ``latency``: (S, M, B, N)
    expected tokens generated and latency per prompt (:mod:`isocompute.evaluation.channels`; None without
    token counts); ``reach``: the policy as served at each reference's latency budget over a sweep of
    budgets (:mod:`isocompute.evaluation.reach`; None without token counts or a plan menu); ``gold`` /
    ``consensus``: (S, M, B, N) expected accuracy under the other target (None: not asked or no gold).
    """

    mode: str
    budgets: np.ndarray
    actions: tuple[int, ...]
    seeds: tuple[int, ...]
    n_folds: int
    utility: np.ndarray
    cost: np.ndarray
    oracle_actions: np.ndarray
    learned_actions: np.ndarray
    learner_actions: np.ndarray
    gap: np.ndarray
    fold: np.ndarray
    default_learner: list[list[str]]
    selection: list[list[dict[str, Any]]]
    rules: list[list[list[str]]] | None = None
    cost_alt: np.ndarray | None = None
    alt_unit: str | None = None
    reference: dict[str, Any] | None = None
    waves: np.ndarray | None = None
    plans: tuple[str, ...] | None = None
    tokens: np.ndarray | None = None
    latency: np.ndarray | None = None
    reach: dict[str, Any] | None = None
    gold: np.ndarray | None = None
    consensus: np.ndarray | None = None


def bootstrap_indices(n: int, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, n) prompt indices drawn with replacement (shared by all methods: a paired bootstrap)."""
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def _ci(samples: np.ndarray) -> list[float]:
    return [float(np.percentile(samples, 2.5)), float(np.percentile(samples, 97.5))]


def summarise(ev: Evaluation, *, n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """The report's numbers (JSON-able): per budget, per method, gains, CIs, imitation, regret, bound."""
    S, M, B, N = ev.utility.shape
    idx = bootstrap_indices(N, n_boot, seed)
    mi = {m: j for j, m in enumerate(METHODS)}
    per_prompt = ev.utility.mean(axis=0)  # (M, B, N): averaged over seeds, so prompts are the unit
    A = len(ev.actions)
    entries = []
    for bi, b in enumerate(ev.budgets):
        methods = _methods_at(ev, per_prompt, bi, idx)
        uU = per_prompt[mi["uniform"], bi]
        rel, ci = _paired_gain(per_prompt[mi["learned"], bi], uU, idx)
        match = ev.oracle_actions[:, bi] == ev.learned_actions[:, bi]  # (S, N)
        imitation = float(match.mean())
        regret = methods["oracle"]["accuracy"] - methods["learned"]["accuracy"]
        gap_max = float(ev.gap[:, bi].max())
        per_fold = _per_fold(ev, bi, match)
        gap_uo = methods["oracle"]["accuracy"] - methods["uniform"]["accuracy"]
        confusion = np.zeros((A, A), dtype=np.int64)
        np.add.at(confusion, (ev.learned_actions[:, bi].ravel(), ev.oracle_actions[:, bi].ravel()), 1)
        learners = _learner_entries(ev, methods, bi)
        uL = per_prompt[mi["learned"], bi]
        entries.append({
            "budget": float(b),
            "methods": {m: methods[m] for m in METHODS if m in methods},
            "gain_vs_uniform": {"relative": float(rel), "absolute": float(uL.mean() - uU.mean()), "ci95": ci,
                                "significant": bool(ci[0] > 0 or ci[1] < 0)},
            "rules": _rule_shares(ev, bi),
            "gain_no_fallback": _gain_entry(per_prompt[mi["learned_no_fallback"], bi], uU, idx),
            "gain_vs_fixed": {m: g for m in ("fixed_plan", "fixed_best")
                              if (g := _gain_entry(uL, per_prompt[mi[m], bi], idx)) is not None},
            "gain_vs_uniform_by_method": {m: g for m in FIXED_METHODS
                                          if (g := _gain_entry(per_prompt[mi[m], bi], uU, idx)) is not None},
            "imitation_accuracy": imitation,
            "regret": float(regret),
            "bound": float((1 - imitation) * gap_max),
            "regret_le_bound_all_folds": all(p["regret_le_bound"] for p in per_fold),
            "apgr": float((methods["learned"]["accuracy"] - methods["uniform"]["accuracy"]) / gap_uo)
            if gap_uo > 1e-12 else None,
            "cost_error": float(methods["learned"]["cost"] / b - 1) if b > 0 else None,
            "cost_error_batch": float(methods["learned_batch"]["cost"] / b - 1)
            if b > 0 and "learned_batch" in methods else None,
            "oracle_budget_binding": bool(methods["oracle_lp"]["cost"] >= b * (1 - 1e-6)),
            "learners": learners,
            "action_histogram": {
                "oracle": np.bincount(ev.oracle_actions[:, bi].ravel(), minlength=A).tolist(),
                "learned": np.bincount(ev.learned_actions[:, bi].ravel(), minlength=A).tolist(),
            },
            "confusion_learned_vs_oracle": confusion.tolist(),
            "per_fold": per_fold,
        })
    return {"budgets": entries, "n_prompts": N, "bootstrap": n_boot, "bootstrap_seed": seed,
            "learner_comparison": compare_learners(entries),
            "same_accuracy": same_accuracy(entries, ev.reference, ev.alt_unit) if ev.reference else None,
            **({} if ev.reach is None else {"reach": reach_block(
                ev.reach["scores"], ev.reach["references"], ev.reach["arrays"], ev.reach["budgets"],
                ev.reach["latency_budgets"], n_boot=min(n_boot, 1000), seed=seed)})}


def _methods_at(ev: Evaluation, per_prompt: np.ndarray, bi: int, idx: np.ndarray) -> dict[str, Any]:
    """Per method scored at budget ``bi``: mean accuracy and cost with bootstrap CIs (and FLOP cost, waves)."""
    mi = {m: j for j, m in enumerate(METHODS)}
    methods: dict[str, Any] = {}
    for m in METHODS:
        u = per_prompt[mi[m], bi]
        if np.isnan(u).any():
            continue
        boot = u[idx].mean(axis=1)
        cboot = ev.cost[:, mi[m], bi].mean(axis=0)[idx].mean(axis=1)
        methods[m] = {"accuracy": float(ev.utility[:, mi[m], bi].mean()),
                      "cost": float(ev.cost[:, mi[m], bi].mean()), "ci95": _ci(boot), "cost_ci95": _ci(cboot)}
        if ev.cost_alt is not None:
            methods[m]["cost_alt"] = float(ev.cost_alt[:, mi[m], bi].mean())
        if ev.waves is not None:
            methods[m]["waves"] = float(ev.waves[:, mi[m], bi].mean())
        methods[m].update(method_means(ev, mi[m], bi))
    return methods


def _per_fold(ev: Evaluation, bi: int, match: np.ndarray) -> list[dict[str, Any]]:
    """Oracle, learned and uniform accuracy, cost, imitation and regret against its bound, per seed and fold."""
    mi = {m: j for j, m in enumerate(METHODS)}
    S = ev.utility.shape[0]
    per_fold = []
    for s in range(S):
        for f in range(ev.n_folds):
            sel = ev.fold[s] == f
            o = ev.utility[s, mi["oracle"], bi, sel].mean()
            lrn = ev.utility[s, mi["learned"], bi, sel].mean()
            imit = float(match[s, sel].mean())
            bound = (1 - imit) * float(ev.gap[s, bi, sel].max())
            per_fold.append({"seed": ev.seeds[s], "fold": f, "n": int(sel.sum()),
                             "oracle": float(o), "learned": float(lrn),
                             "uniform": float(ev.utility[s, mi["uniform"], bi, sel].mean()),
                             "cost": float(ev.cost[s, mi["learned"], bi, sel].mean()),
                             "imitation_accuracy": imit, "regret": float(o - lrn), "bound": bound,
                             "regret_le_bound": bool(o - lrn <= bound + 1e-12),
                             "learner": ev.default_learner[s][f]})
    return per_fold


def _learner_entries(ev: Evaluation, methods: dict[str, Any], bi: int) -> dict[str, Any]:
    """Each learner's own numbers at budget ``bi`` (where scored): its method's, imitation, gain vs uniform."""
    learners = {}
    for name in LEARNERS:
        m = f"learned_{name}"
        if m in methods:
            la = ev.learner_actions[:, LEARNERS.index(name), bi]
            learners[name] = {**methods[m], "imitation_accuracy": float((la == ev.oracle_actions[:, bi]).mean()),
                              "gain_vs_uniform": float(
                (methods[m]["accuracy"] - methods["uniform"]["accuracy"]) / methods["uniform"]["accuracy"])
                if methods["uniform"]["accuracy"] > 0 else None}
    return learners


def _paired_gain(a: np.ndarray, base: np.ndarray, idx: np.ndarray) -> tuple[float, list[float]]:
    """Relative gain of per-prompt scores ``a`` over ``base`` and its paired bootstrap 95% CI (NaN if base is 0)."""
    rel = (a.mean() - base.mean()) / base.mean() if base.mean() > 0 else float("nan")
    ba, bb = a[idx].mean(axis=1), base[idx].mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        boot_rel = np.where(bb > 0, (ba - bb) / bb, np.nan)
    ci = _ci(boot_rel[np.isfinite(boot_rel)]) if np.isfinite(boot_rel).any() else [float("nan")] * 2
    return float(rel), ci


def _gain_entry(a: np.ndarray, base: np.ndarray, idx: np.ndarray) -> dict[str, Any] | None:
    if np.isnan(a).any() or np.isnan(base).any():
        return None
    rel, ci = _paired_gain(a, base, idx)
    return {"relative": rel, "ci95": ci, "significant": bool(ci[0] > 0 or ci[1] < 0)}


def _rule_shares(ev: Evaluation, bi: int) -> dict[str, float] | None:
    """Share of the (seed, fold) policies whose never-worse chain served each rule at budget ``bi``."""
    if ev.rules is None:
        return None
    served = [fold[bi] for seed in ev.rules for fold in seed]
    return {r: served.count(r) / len(served) for r in sorted(set(served))}


def cost_to_reach(points: Sequence[tuple[float, float, float | None]], target: float) -> dict[str, Any] | None:
    """The least cost at which a method's accuracy reaches ``target``, from its (cost, alt cost, accuracy)
    points at increasing budgets: the first point at or above the target, interpolated linearly from the
    point before it (a hashed mix of the two budgets' decisions realises every point on that segment,
    so the interpolated cost is achievable). None when no point reaches it; ``at_lowest`` when the
    first point already does (the true cost may be lower).

    Example: points (2, ·, 0.80), (4, ·, 0.90) and target 0.85 → cost 3.
    """
    prev = None
    for c, c_alt, acc in points:
        if acc >= target - 1e-12:
            if prev is None:
                return {"cost": c, "cost_alt": c_alt, "at_lowest": True}
            t = (target - prev[2]) / (acc - prev[2])
            alt = None if c_alt is None or prev[1] is None else prev[1] + t * (c_alt - prev[1])
            return {"cost": prev[0] + t * (c - prev[0]), "cost_alt": alt, "at_lowest": False}
        prev = (c, c_alt, acc)
    return None


def same_accuracy(entries: list[dict[str, Any]], reference: dict[str, Any], alt_unit: str | None) -> dict[str, Any]:
    """Per method: the cost to reach the accuracy of uniform at the largest action (k = 16 for actions
    1…16), in the cost unit and in ``alt_unit``, and how many times less that is than the reference's."""
    target = reference["accuracy"]
    out: dict[str, Any] = {"reference": reference, "alt_unit": alt_unit, "methods": {}}
    for m in ("oracle", "learned", "learned_no_fallback", *FIXED_METHODS, "uniform", "heuristic", "random"):
        if not all(m in e["methods"] for e in entries):
            continue
        pts = [(e["methods"][m]["cost"], e["methods"][m].get("cost_alt"), e["methods"][m]["accuracy"])
               for e in entries]
        hit = cost_to_reach(pts, target)
        if hit is not None:
            hit["times_less"] = reference["cost"] / hit["cost"] if hit["cost"] > 0 else None
            hit["times_less_alt"] = (reference["cost_alt"] / hit["cost_alt"]
                                     if hit["cost_alt"] and reference.get("cost_alt") else None)
        out["methods"][m] = hit
    return out


def compare_learners(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Which learner did better on held-out prompts, averaged over the budgets both were scored at."""
    acc = {name: [e["learners"][name]["accuracy"] for e in entries if name in e["learners"]] for name in LEARNERS}
    acc = {k: float(np.mean(v)) for k, v in acc.items() if len(v) == len(entries) and v}
    if len(acc) < 2:
        return {"scores": acc, "better": next(iter(acc), None), "why": "only one learner was scored"}
    c, u = acc["classifier"], acc["utility"]
    better = "utility" if u > c + 1e-12 else "classifier"
    return {"scores": acc, "better": better,
            "why": f"{better}: mean held-out accuracy {max(c, u):.4f} vs {min(c, u):.4f} over {len(entries)} budgets"
                   + (" (tie → classifier, the seed's learner)" if abs(u - c) <= 1e-12 else "")}


def check_targets(summary: dict[str, Any], budget: float = 4.0) -> dict[str, Any] | None:
    """The issue's targets at ``budget`` (None when it was not evaluated): imitation ≥ 91%, gain over
    uniform ≥ 5% relative with a CI excluding 0, realised cost within ±2%."""
    entry = next((e for e in summary["budgets"] if abs(e["budget"] - budget) < 1e-9), None)
    if entry is None:
        return None
    g = entry["gain_vs_uniform"]
    return {
        "budget": budget,
        "imitation_ge_91pct": {"value": entry["imitation_accuracy"], "pass": entry["imitation_accuracy"] >= 0.91,
                               "ceiling": entry.get("imitation_ceiling")},
        "gain_ge_5pct_ci_excludes_0": {"value": g["relative"], "ci95": g["ci95"],
                                       "pass": bool(g["relative"] >= 0.05 and g["ci95"][0] > 0)},
        "cost_within_2pct": {"value": entry["cost_error"],
                             "pass": entry["cost_error"] is not None and abs(entry["cost_error"]) <= 0.02},
        "batch_cost_within_2pct": {"value": entry["cost_error_batch"],
                                   "pass": entry["cost_error_batch"] is not None
                                   and abs(entry["cost_error_batch"]) <= 0.02},
    }
