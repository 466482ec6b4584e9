"""The report's ``reach`` block: the fewest tokens at which the policy as served reaches uniform@k's accuracy
without waiting longer than uniform@k.

For each reference ``uniform@k`` (k = 4, 8, 16: the one-wave plan ``none@k`` everywhere, where the menu
has it) the table gives its accuracy A_k, mean tokens T_k and mean latency L_k (sample lengths, wave
overhead included, as the report's latency). Every cross-validation refit is evaluated on its held-out
part at the latency budget L_k as that refit measures it — uniform@k's mean latency on its own training
part (:func:`fold_latencies`), clipped into the policy's trained ``latency_range``; a policy fitted
without latency budgets is evaluated without one — with its cost budgets swept over :data:`N_SWEEP`
geometric steps of the trained range. Pooled over folds and averaged over seeds, that gives per budget
the accuracy, tokens and latency of the policy as served (its never-worse chain included).

A last entry asks the same of uniform@4's accuracy within one sample's wait (``max_latency`` 1.0, the
policy served at latency budget 1.0). The entry's ``policy_tokens`` is the least mean tokens at which
accuracy ≥ A_k − :data:`TOLERANCE` with realised latency ≤ its ``max_latency`` (L_k, or 1.0): over the
budgets of the sweep that get there, the one with the fewest tokens, linearly interpolated in (tokens, accuracy, latency) from the budget
before it when that one also kept the latency (a hashed mix of the two budgets' decisions spends and
scores in between); ``best_accuracy`` is the sweep's highest accuracy within that latency. ``ratio`` = policy_tokens / T_k, null when
not reached; ``ratio_ci95`` is a paired bootstrap over prompts (the reference's numbers resampled with
the policy's; a resample that does not reach counts as ∞, and a bound at ∞ is null).

Worked example: uniform@16 scores 0.9800 at 27,800 tokens and latency 2.31; at latency budget 2.31 the
policy scores 0.9775 at 6,100 tokens (budget 3.5x) and 0.9790 at 7,000 (4x): the target 0.9780 is
crossed at 6,100 + (0.9780 − 0.9775)/(0.9790 − 0.9775) · 900 = 6,400 tokens, ratio 0.23.

Ignores: references the menu lacks (skipped) and tables without token counts (no block).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from isocompute.policy.fallback import LEARNED
from isocompute.policy.learn.learners import budget_grid

REFERENCES = (4, 8, 16)
TOLERANCE = 0.002  # accuracy within 0.2 pt of the reference's
N_SWEEP = 17  # cost budgets swept per reference latency budget
ONE_SAMPLE = 1.0  # the last entry's latency cap: waiting for one sample
CHANNELS = ("utility", "tokens", "latency", "cost")


def reach_references(plans: Sequence[Any], tokens: np.ndarray, latency: np.ndarray,
                     U: np.ndarray) -> list[dict[str, Any]]:
    """The references the menu has: ``{"reference", "column", "accuracy", "tokens", "latency"}`` each."""
    names = [p.name for p in plans]
    out = []
    for k in REFERENCES:
        if f"none@{k}" in names:
            j = names.index(f"none@{k}")
            lat = float(latency[:, j].mean())
            out.append({"reference": f"uniform@{k}", "column": j, "accuracy": float(U[:, j].mean()),
                        "tokens": float(tokens[:, j].mean()), "latency": lat, "max_latency": lat})
    if out and out[0]["reference"] == f"uniform@{REFERENCES[0]}":  # uniform@4's accuracy in one sample's wait
        out.append({**out[0], "max_latency": ONE_SAMPLE})
    return out


def sweep_budgets(budget_range: tuple[float, float]) -> np.ndarray:
    """The cost budgets every reference's latency budget is swept over."""
    return budget_grid(budget_range[0], budget_range[1], N_SWEEP)


def served_actions(policy: Any, X: np.ndarray, u: np.ndarray, route: np.ndarray, budget: float,
                   latency_budget: float | None) -> np.ndarray:
    """The plan each prompt gets from ``policy`` as served at (budget, latency_budget) (its chain
    included); without latency tables the latency budget is ignored (the policy prices cost only)."""
    from isocompute.policy.latency import latency_actions

    b = policy.check_budget(min(max(float(budget), policy.budget_range[0]), policy.budget_range[1]))
    tables = getattr(policy, "latency_", None)
    if tables is not None and latency_budget is not None:
        return latency_actions(policy, X, u, route, b, tables.check(min(max(latency_budget, tables.range[0]),
                                                                       tables.range[1])))[0]
    rule = policy.rule_at(b).rule
    if rule != LEARNED:
        return policy.fallback_actions(rule, u, b)
    return policy.decide_features(X, u, route, b)[0]


def fold_latencies(references: list[dict], train_latency: np.ndarray) -> list[float]:
    """The latency budget each reference is served at by a refit: uniform@k's mean latency on the refit's
    own training prompts (what its user would ask for as "uniform@k's latency"; the whole table's mean is
    out of reach on a fold whose training part waits longer, issue 36), and the fixed caps (1.0) as they are."""
    return [float(train_latency[:, r["column"]].mean()) if r["max_latency"] == r["latency"] else float(r["max_latency"])
            for r in references]


def reach_scores(policy: Any, prompts: Sequence[str], arrays: dict[str, np.ndarray], references: list[dict],
                 budgets: np.ndarray, probe: np.ndarray | None = None,
                 latencies: Sequence[float] | None = None) -> dict[str, np.ndarray]:
    """Per channel (:data:`CHANNELS`), (R, B, n): each held-out prompt's expected value under the served
    plan at reference r's latency budget (``latencies[r]``, default its ``max_latency``) and budget b;
    ``arrays`` holds the held-out (n, P) arrays."""
    latencies = [r["max_latency"] for r in references] if latencies is None else list(latencies)
    X = policy.features(prompts, probe)
    u, route = policy.prompt_keys(prompts)
    rows = np.arange(len(prompts))
    out = {c: np.empty((len(references), budgets.size, rows.size)) for c in CHANNELS}
    for r, lat in enumerate(latencies):
        for bi, b in enumerate(budgets):
            a = served_actions(policy, X, u, route, float(b), lat)
            for c in CHANNELS:
                out[c][r, bi] = arrays[c][rows, a]
    return out


def _reach_point(acc: np.ndarray, tok: np.ndarray, lat: np.ndarray, target: float,
                 max_latency: float) -> tuple[float, float] | None:
    """(tokens, latency) of the fewest tokens at which the sweep reaches ``target`` within ``max_latency``
    (each budget that does, or the crossing from the budget before it), or None. Not simply the first budget
    that does: where a lower budget overspends (a rule served on a fold whose held-out prompts are long),
    tokens are not monotone in the budget."""
    ok = lat <= max_latency * (1 + 1e-9)
    best: tuple[float, float] | None = None
    for j in np.flatnonzero(ok & (acc >= target)):
        if j > 0 and ok[j - 1] and acc[j - 1] < target and acc[j] > acc[j - 1]:
            w = (target - acc[j - 1]) / (acc[j] - acc[j - 1])
            hit = float(tok[j - 1] + w * (tok[j] - tok[j - 1])), float(lat[j - 1] + w * (lat[j] - lat[j - 1]))
        else:
            hit = float(tok[j]), float(lat[j])
        if best is None or hit[0] < best[0]:
            best = hit
    return best


def _best_within(acc: np.ndarray, lat: np.ndarray, max_latency: float) -> float | None:
    ok = lat <= max_latency * (1 + 1e-9)
    return float(acc[ok].max()) if ok.any() else None


def reach_block(scores: dict[str, np.ndarray], references: list[dict], ref_arrays: dict[str, np.ndarray],
                budgets: np.ndarray, latency_budgets: list[float | None], *, n_boot: int = 1000,
                seed: int = 0) -> list[dict[str, Any]]:
    """report.json's ``reach`` entries from pooled ``scores`` ((S, R, B, N) per channel), the references,
    ``ref_arrays`` (N, P) utility / tokens / latency of the whole table, and the latency budget each
    reference was served at (module docstring)."""
    per = {c: scores[c].mean(axis=0) for c in CHANNELS}  # (R, B, N), seeds averaged
    N = per["utility"].shape[-1]
    idx = np.random.default_rng(seed).integers(0, N, size=(n_boot, N))
    out = []
    for r, ref in enumerate(references):
        col = ref["column"]
        curves = [per[c][r].mean(axis=1) for c in ("utility", "tokens", "latency")]
        cap = ref["max_latency"]
        hit = _reach_point(*curves, ref["accuracy"] - TOLERANCE, cap)
        ratios = []
        for rows in idx:
            ra, rt, rl = (float(ref_arrays[c][rows, col].mean()) for c in ("utility", "tokens", "latency"))
            h = _reach_point(*(per[c][r][:, rows].mean(axis=1) for c in ("utility", "tokens", "latency")),
                             ra - TOLERANCE, rl if cap == ref["latency"] else cap)
            ratios.append(np.inf if h is None else h[0] / rt)
        capped = np.minimum(np.asarray(ratios), 1e300)  # ∞ (not reached) sorts last without NaNs
        lo, hi = (float(x) if x < 1e299 else np.inf for x in np.percentile(capped, (2.5, 97.5)))
        out.append({
            "reference": ref["reference"], "accuracy": ref["accuracy"], "tokens": ref["tokens"],
            "latency": ref["latency"], "max_latency": cap, "latency_budget": latency_budgets[r],
            "policy_tokens": None if hit is None else hit[0], "policy_latency": None if hit is None else hit[1],
            "ratio": None if hit is None else hit[0] / ref["tokens"],
            "ratio_ci95": [None if not np.isfinite(lo) else lo, None if not np.isfinite(hi) else hi],
            "best_accuracy": _best_within(curves[0], curves[2], cap),
            "sweep": {"budgets": budgets.tolist(), "accuracy": curves[0].tolist(), "tokens": curves[1].tolist(),
                      "latency": curves[2].tolist()}})
    return out


def reach_setup(config: Any, plans: Sequence[Any], U: np.ndarray, C: np.ndarray,
                channels: dict[str, np.ndarray]) -> dict[str, Any] | None:
    """What every CV fold needs for the reach block (None without a plan menu or token counts): the
    references, the sweep's budgets, each reference's latency budget (clipped into the config's
    ``latency_range``; None without one) and the (N, P) arrays the served plans are scored on."""
    if not config.plans or "tokens" not in channels or "latency" not in channels:
        return None
    arrays = {"utility": U, "tokens": channels["tokens"], "latency": channels["latency"], "cost": C}
    refs = reach_references(plans, channels["tokens"], channels["latency"], U)
    if not refs:
        return None
    lo_hi = config.latency_range
    latency_budgets = [None if lo_hi is None else float(np.clip(r["max_latency"], *lo_hi)) for r in refs]
    return {"references": refs, "budgets": sweep_budgets(config.budget_range), "arrays": arrays,
            "latency_budgets": latency_budgets}


def pooled_reach(setup: dict[str, Any] | None, parts: Sequence[tuple[int, np.ndarray]],
                 scores: Sequence[dict[str, Any]], n_seeds: int, n: int) -> dict[str, Any] | None:
    """The folds' reach scores put together, (S, R, B, N) per channel, with the setup (for
    :func:`reach_block`); ``parts``: (seed index, held-out rows) of each fold, in ``scores``' order."""
    if setup is None:
        return None
    R, B = len(setup["references"]), setup["budgets"].size
    pooled = {c: np.full((n_seeds, R, B, n), np.nan) for c in CHANNELS}
    for (si, test), sc in zip(parts, scores, strict=True):
        for c in CHANNELS:
            pooled[c][si][:, :, test] = sc["reach"][c]
    return {**setup, "scores": pooled}


def reach_section(report: dict[str, Any]) -> list[str]:
    """report.md's lines for the reach block (none without one)."""
    entries = report.get("reach")
    if not entries:
        return []
    lines = ["## Reach: uniform@k's accuracy for fewer tokens, no slower", "",
             f"Least mean tokens at which the policy as served reaches the reference's accuracy (within "
             f"{100 * TOLERANCE:.1f} pt) with mean latency ≤ the reference's, evaluated at that latency budget over "
             f"{N_SWEEP} budgets (latency in sample lengths).", "",
             "| reference | accuracy | tokens | latency | latency ≤ | policy tokens | policy latency | ratio "
             "[95% CI] |", "|---|---:|---:|---:|---:|---:|---:|---|"]

    def num(x: Any, fmt: str) -> str:
        return "—" if x is None else format(x, fmt)

    for e in entries:
        lo, hi = e["ratio_ci95"]
        ratio = "not reached" if e["ratio"] is None else f"{e['ratio']:.3f} [{num(lo, '.3f')}, {num(hi, '.3f')}]"
        lines.append(f"| {e['reference']} | {e['accuracy']:.4f} | {e['tokens']:,.0f} | {e['latency']:.3f} | "
                     f"{e['max_latency']:.3f} | {num(e['policy_tokens'], ',.0f')} | "
                     f"{num(e['policy_latency'], '.3f')} | {ratio} |")
    return [*lines, ""]
