"""Held-out evaluation of a multi-model policy: every method at matched realised FLOPs, across models.

:func:`evaluate_models` cross-validates (``folds``-fold, for each seed): on each fold's training part
a :class:`~isocompute.policy.multi.policy.MultiPolicy` is fitted with the given config
(:func:`~isocompute.policy.multi.fit.fit_multi_policy`: vote weights and the pruned menu from those rows
only), and decides the held-out prompts at every budget of the grid, as served (calibrated knob, the
never-worse chain's rule). Per budget, the methods:

* **oracle** — the Lagrangian oracle over every action of the full menu, in hindsight (a bound);
* **learned** — the policy as served, with the share of prompts each rule served;
* **best single model** — each model's best fixed plan (one of its plans, or a budget-matched mix of
  two) chosen on the training folds and scored held out on a fine grid of budgets (``n_fine``, the same
  fold splits), its curve of (mean realised FLOPs, per-prompt utility) interpolated at the learned
  policy's mean *realised* FLOPs — a mix of two neighbouring grid points, itself a fixed policy — and of
  the models the one with the best accuracy there, picked in hindsight (the choice most favourable to
  the baseline); a model whose curve starts more than 5% above that cost is no candidate (at the grid's
  cheapest budget the cheapest model's cheapest plan is compared, spending what it spends). Matching
  each fold's realised cost instead would hand the baseline the folds' prompt-length noise (a fold of
  long answers buys it more samples);
* **uniform maj@k** of each model (adjacent k mixed to the budget; None outside its range);
* **fixed cascade** — one cascade (or a mix of two) for everyone, chosen on the training folds
  (:func:`isocompute.evaluation.model_baselines.best_fixed`, the same folds).

Utilities are expectations per prompt, averaged over seeds; the learned policy's gain over the best
single model carries a paired bootstrap 95% CI over prompts. **Reach**: for each model, the smallest
budget (of the shown grid and ``n_reach`` more log-spaced ones, where the learned policy also decides)
at which a method's held-out accuracy reaches that model's uniform maj@16 accuracy, its
realised FLOPs, and that as a fraction of maj@16's FLOPs (target ≤ 1/4).

Worked example: at a budget of 2.5e13 FLOPs the learned policy realises 2.47e13 on average; the best
single model's curve has held-out points (2.40e13, 0.9700) and (2.55e13, 0.9730), so its matched point
is 0.9714 at 2.47e13 (t = 0.47 of the way).

Ignores: serving latency, and Monte Carlo noise in the weighted votes' columns (taken as estimated).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from isocompute.evaluation.model_baselines import best_fixed, uniform_at_budget, uniform_columns
from isocompute.policy.config import PolicyConfig
from isocompute.policy.multi.fit import ModelEstimates, fit_multi_policy, policy_columns
from isocompute.policy.plans.fixed import choose_fixed_plan, fold_assignment
from isocompute.solver.models.estimates import oracle

REACH_TOLERANCE = 0.05  # a model is a baseline candidate where its curve reaches the cost within 5%

def budget_grid(me: ModelEstimates, n: int, k_top: int = 16) -> np.ndarray:
    """``n`` log-spaced mean-FLOPs budgets from the cheapest model's 1-sample cost to the dearest
    model's ``k_top``-sample cost (its largest uniform k when it has fewer)."""
    est = me.estimates
    one, top = [], []
    for m in me.models:
        ks, cols = uniform_columns(est, m)
        one.append(float(est.cost[:, cols[0]].mean()))
        j = cols[ks == k_top][0] if (ks == k_top).any() else cols[-1]
        top.append(float(est.cost[:, j].mean()))
    return np.geomspace(min(one), max(top), n)


def _gain(method: np.ndarray, base: np.ndarray, rng: np.random.Generator, n_boot: int) -> dict[str, float]:
    idx = rng.integers(0, base.size, (n_boot, base.size))
    boot = method[idx].mean(axis=1) / np.maximum(base[idx].mean(axis=1), 1e-300) - 1
    return {"relative": float(method.mean() / max(base.mean(), 1e-300) - 1),
            "ci95": [float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975))]}


def evaluate_models(me: ModelEstimates, config: PolicyConfig, budgets: Sequence[float], *, folds: int = 5,
                    seeds: Sequence[int] = (0, 1, 2), max_actions: int = 40, learn_on: str = "hull",
                    fallback: Sequence[str] | None = None, n_fine: int = 60, n_reach: int = 30, n_boot: int = 2000,
                    seed: int = 0,
                    progress: bool = False) -> dict[str, Any]:
    """The report's figures (module docstring) as a JSON-able dict."""
    from tqdm.auto import tqdm

    est = me.estimates
    shown = np.asarray(budgets, dtype=np.float64)
    budgets = np.unique(np.concatenate([shown, np.geomspace(shown.min(), shown.max(), n_reach)])) if n_reach else shown
    rows_at = np.searchsorted(budgets, shown)  # the shown budgets' places in the evaluated grid
    N, B = len(me.prompts), len(budgets)
    model_cols = {m: est.columns(model=m) for m in me.models}
    S = len(seeds)
    learned_u, learned_c = np.zeros((S, B, N)), np.zeros((S, B, N))
    rules: list[dict[str, int]] = [{} for _ in range(B)]
    kept = []
    with tqdm(total=S * folds, desc="report: fold fits", unit="fit", disable=not progress) as bar:
        for si, s in enumerate(seeds):
            fold = fold_assignment(N, folds, s)
            for f in range(folds):
                tr, ho = np.flatnonzero(fold != f), np.flatnonzero(fold == f)
                pol = fit_multi_policy(me, dataclasses.replace(config, seed=s), rows=tr, max_actions=max_actions,
                                       learn_on=learn_on, fallback=fallback)
                kept.append(len(pol.plans))
                cols = policy_columns(pol, est)
                lo, hi = pol.budget_range
                prompts = [me.prompts[i] for i in ho]
                for bi, b in enumerate(budgets):
                    d = pol.decide(prompts, float(np.clip(b, lo, hi)))
                    a = cols[d.action_index]
                    learned_u[si, bi, ho], learned_c[si, bi, ho] = est.utility[ho, a], est.cost[ho, a]
                    rules[bi][d.rule] = rules[bi].get(d.rule, 0) + len(ho)
                bar.update(1)
    rng = np.random.default_rng(seed)
    lu, lc = learned_u.mean(axis=0), learned_c.mean(axis=0)
    curves = {m: single_model_curve(est, model_cols[m], folds, seeds, n_fine) for m in me.models}
    cascades = est.columns(kind="cascade")
    cascade_u = [_fixed_over_seeds(est, cascades, float(b), folds, seeds) for b in budgets]
    rows = []
    for bi in rows_at:
        b = budgets[bi]
        orc = oracle(est, float(b))
        target = float(lc[bi].mean())
        at = {m: curve.at(target) for m, curve in curves.items()}
        cands = [m for m in me.models if at[m][1] <= target * (1 + REACH_TOLERANCE)] or [me.models[0]]
        best_m = max(cands, key=lambda m: at[m][0].mean())
        base_u, base_c = at[best_m]
        cas = cascade_u[bi]
        uni = {m: uniform_at_budget(est, m, float(b)) for m in me.models}
        rows.append({
            "budget": float(b),
            "methods": {
                "oracle": {"accuracy": orc.accuracy, "cost": orc.mean_cost},
                "learned": {"accuracy": float(lu[bi].mean()), "cost": float(lc[bi].mean()),
                            "rules": {r: n / (S * N) for r, n in sorted(rules[bi].items())}},
                "best_single": {"accuracy": float(base_u.mean()), "cost": base_c, "model": best_m},
                "fixed_cascade": None if cas is None else {"accuracy": float(cas[0].mean()), "cost": float(cas[1].mean()),
                                                           "plays": cas[2]},
                **{f"uniform {m}": None if h is None else {"accuracy": h.accuracy, "cost": h.mean_cost,
                                                           "plays": h.choices[0]} for m, h in uni.items()},
            },
            "gain_vs_best_single": _gain(lu[bi], base_u, rng, n_boot),
        })
    reach = _reach(me, budgets, lu, lc, [None if c is None else c[0] for c in cascade_u])
    return {"models": list(me.models), "n_prompts": N, "folds": folds, "seeds": list(seeds), "cost_unit": "flops",
            "menu_actions": len(est.actions), "kept_actions": [int(min(kept)), int(max(kept))],
            "completion_only": all(est.completion_only.values()), "budgets": rows, "reach": reach}


@dataclass(frozen=True, eq=False)
class Curve:
    """A method's held-out curve: per budget of a fine grid, the per-prompt utility (B, N) and the mean
    realised cost (B,), averaged over fold splits; :meth:`at` interpolates it at a mean cost."""

    utility: np.ndarray
    cost: np.ndarray

    def at(self, cost: float) -> tuple[np.ndarray, float]:
        """(per-prompt utility, mean cost) of the budget-matched mix of the two grid points whose mean
        costs bracket ``cost`` (an achievable point: play one with probability 1 − t, the other with t);
        the cheapest point below the curve, the best point above it."""
        order = np.argsort(self.cost, kind="stable")
        c, u = self.cost[order], self.utility[order]
        if cost <= c[0]:
            return u[0], float(c[0])
        if cost >= c[-1]:
            j = int(np.argmax(u.mean(axis=1)))
            return u[j], float(c[j])
        k = int(np.searchsorted(c, cost))
        t = (cost - c[k - 1]) / max(c[k] - c[k - 1], 1e-300)
        return (1 - t) * u[k - 1] + t * u[k], float(cost)


def single_model_curve(est: Any, cols: np.ndarray, folds: int, seeds: Sequence[int], n_fine: int) -> Curve:
    """One model's best fixed plan on a fine log grid from its cheapest plan's to its dearest plan's mean
    cost, chosen on each split's training folds and scored on the held-out one, averaged over seeds."""
    c_bar = est.cost[:, cols].mean(axis=0)
    grid = np.geomspace(c_bar.min(), c_bar.max(), n_fine)
    U, C = est.utility[:, cols], est.cost[:, cols]
    N = U.shape[0]
    util, cost = np.zeros((len(seeds), n_fine, N)), np.zeros((len(seeds), n_fine, N))
    for si, s in enumerate(seeds):
        fold = fold_assignment(N, folds, s)
        for f in range(folds):
            tr, ho = fold != f, fold == f
            floor = float(C[tr].mean(axis=0).min())
            for gi, b in enumerate(grid):
                ch = choose_fixed_plan(U[tr], C[tr], max(float(b), floor))
                util[si, gi, ho], cost[si, gi, ho] = ch.utility(U[ho]), ch.cost(C[ho])
    return Curve(util.mean(axis=0), cost.mean(axis=0).mean(axis=1))


def _fixed_over_seeds(est: Any, cols: np.ndarray, budget: float, folds: int,
                      seeds: Sequence[int]) -> tuple[np.ndarray, np.ndarray, str] | None:
    if cols.size == 0:
        return None
    runs = [best_fixed(est, cols, budget, folds=folds, seed=s, method="fixed cascade") for s in seeds]
    if any(r is None for r in runs):
        return None
    return (np.mean([r.utility for r in runs], axis=0), np.mean([r.cost for r in runs], axis=0),  # type: ignore[union-attr]
            runs[0].choices[0])  # type: ignore[union-attr]


def _reach(me: ModelEstimates, budgets: np.ndarray, lu: np.ndarray, lc: np.ndarray,
           cascade_u: list[np.ndarray | None]) -> list[dict[str, Any]]:
    """Per model: its maj@16 accuracy and FLOPs, and the first grid budget where the learned policy (and
    the fixed cascade) reach that accuracy, with the learned policy's realised FLOPs there (``budgets``: the shown grid and ``n_reach`` more log-spaced ones)."""
    est = me.estimates
    out = []
    for m in me.models:
        ks, cols = uniform_columns(est, m)
        j = cols[ks == 16][0] if (ks == 16).any() else cols[-1]
        acc, flops = float(est.utility[:, j].mean()), float(est.cost[:, j].mean())
        hit = np.flatnonzero(lu.mean(axis=1) >= acc - 1e-12)
        row: dict[str, Any] = {"model": m, "k": int(ks[cols == j][0]), "accuracy": acc, "flops": flops,
                               "learned_budget": None, "learned_flops": None, "learned_fraction": None,
                               "cascade_budget": None, "cascade_fraction": None}
        if hit.size:
            c = float(lc[hit[0]].mean())
            row.update(learned_budget=float(budgets[hit[0]]), learned_flops=c, learned_fraction=c / flops)
        ch = [bi for bi, u in enumerate(cascade_u) if u is not None and u.mean() >= acc - 1e-12]
        if ch:
            row.update(cascade_budget=float(budgets[ch[0]]), cascade_fraction=float(budgets[ch[0]]) / flops)
        out.append(row)
    return out


def render_markdown(report: dict[str, Any]) -> str:
    """report.md: the per-budget table, the gains with CIs, and the reach table."""
    models = report["models"]
    lines = [f"# Several models, one budget: {', '.join(models)}", "",
             f"{report['n_prompts']} prompts, {report['folds']}-fold cross-validation × seeds {report['seeds']}; "
             f"menu of {report['menu_actions']} actions, {report['kept_actions'][0]}–{report['kept_actions'][1]} "
             "kept per fold. Accuracy at realised mean FLOPs per prompt"
             + (" (completion tokens only: the tables have no prompt token counts)" if report["completion_only"] else "")
             + "; gain = learned vs the best single model's best fixed plan at the learned policy's realised FLOPs, "
             "95% paired bootstrap CI.", "",
             "| budget | oracle | learned (rules) | best single model | gain [95% CI] | fixed cascade | "
             + " | ".join(f"uniform {m}" for m in models) + " |",
             "|---" * (6 + len(models)) + "|"]

    def cell(x: dict[str, Any] | None) -> str:
        return "—" if x is None else f"{x['accuracy']:.4f} ({x['cost']:.3g})"

    for e in report["budgets"]:
        m = e["methods"]
        g = e["gain_vs_best_single"]
        rules = ", ".join(f"{r} {100 * s:.0f}%" for r, s in m["learned"]["rules"].items())
        lines.append(f"| {e['budget']:.3g} | {cell(m['oracle'])} | {cell(m['learned'])} ({rules}) | "
                     f"{cell(m['best_single'])} {m['best_single']['model']} | {100 * g['relative']:+.2f}% "
                     f"[{100 * g['ci95'][0]:+.2f}, {100 * g['ci95'][1]:+.2f}] | {cell(m['fixed_cascade'])} | "
                     + " | ".join(cell(m[f"uniform {x}"]) for x in models) + " |")
    lines += ["", "Cost to reach each model's uniform maj@16 accuracy (first grid budget; MISS: never reached):", "",
              "| model | maj@k accuracy | its FLOPs | learned reaches at (realised) | fraction | fixed cascade at | fraction |",
              "|---|---|---|---|---|---|---|"]
    for r in report["reach"]:
        def frac(x: float | None) -> str:
            return "MISS" if x is None else f"{x:.3f}" + (" (target ≤ 0.25 missed)" if x > 0.25 else "")
        lines.append(f"| {r['model']} | {r['accuracy']:.4f} (k={r['k']}) | {r['flops']:.3g} | "
                     f"{'—' if r['learned_flops'] is None else format(r['learned_flops'], '.3g')} | "
                     f"{frac(r['learned_fraction'])} | "
                     f"{'—' if r['cascade_budget'] is None else format(r['cascade_budget'], '.3g')} | "
                     f"{frac(r['cascade_fraction'])} |")
    return "\n".join(lines) + "\n"


def plot_accuracy_flops(report: dict[str, Any], path: Any) -> None:
    """Accuracy against realised mean FLOPs (log axis) of every method and every model's uniform maj@k."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    names = ["oracle", "learned", "best_single", "fixed_cascade", *(f"uniform {m}" for m in report["models"])]
    labels = {"oracle": "oracle (hindsight)", "learned": "learned policy (as served)",
              "best_single": "best single model, fixed plan", "fixed_cascade": "best fixed cascade"}
    for name in names:
        pts = [(e["methods"][name]["cost"], e["methods"][name]["accuracy"]) for e in report["budgets"]
               if e["methods"].get(name) is not None]
        if pts:
            xs, ys = zip(*sorted(pts), strict=True)
            ax.plot(xs, ys, marker="o", ms=3, label=labels.get(name, name + " maj@k"),
                    ls="--" if name.startswith("uniform") else "-")
    ax.set_xscale("log")
    ax.set_xlabel("realised mean FLOPs per prompt")
    ax.set_ylabel("accuracy (held out)")
    ax.set_title("Several models under one FLOP budget")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
