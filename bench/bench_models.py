"""Benchmark: several models under one FLOP budget — oracle, best fixed cascade, best single model, uniform.

On outcome tables of the same prompts, one per model (the three MATH-500 dumps: gpt-oss-20b, Phi-4-reasoning,
Qwen3-14B; import commands in docs/import-and-formats.md), joined by id with answer classes
aligned across models (math-verify over the union of each prompt's answers, cached), the menu of
multi-model actions (:func:`isocompute.solver.models.estimates.estimate_menu`: every model × the 30 default
plans, cascades cheap → dear with last-stage vote, weighted cascades and ensembles over all samples) is
estimated once. Then, per budget on a log grid of mean FLOPs per prompt from the cheapest model's
1-sample cost to the dearest model's 16-sample cost:

* **oracle** — the Lagrangian oracle over every action, in hindsight (an upper bound, not a method); it
  also picks Monte Carlo noise where columns carry it, so **oracle (exact)**, over the actions whose
  utility is exact (single plans, last-stage-vote cascades), is printed beside it, and **oracle (one
  model)**, the best of the per-model oracles — the headroom that several models add is the difference;
* **fixed cascade** — one cascade (or a budget-matched mix of two) for every prompt, chosen on 4/5 of the
  prompts and scored on the other fifth (5 folds × ``--seeds`` splits, averaged); vote weights are fitted
  by that choice on the training folds; **fixed action** the same over the whole menu;
* **best single model** — the named baseline: each model's best fixed plan chosen the same way, and the
  model with the best held-out accuracy picked in hindsight (the most favourable choice for it);
* **uniform maj@k** of each model at the budget (adjacent k mixed to match the mean FLOPs).

Printed: accuracy and realised mean FLOPs of each, the gain over the best single model with a 95%
paired-bootstrap CI over prompts; then, for each model, its uniform maj@16 accuracy and FLOPs and the
FLOPs at which the fixed cascade (held out) first reaches that accuracy on a fine budget grid, as a
fraction of maj@16's FLOPs with a bootstrap CI (target: ≤ 1/4).

FLOPs: 2 · active parameters per generated token (``--model-params``; MoE: active). The dumps have no
prompt token counts, so the prompt's prefill is left out (completion tokens only) — the bench says so.

    .venv/bin/python bench/bench_models.py gpt-oss-20b=runs/real/math500_gpt-oss-20b.jsonl \\
        Phi-4-reasoning=runs/real/math500_Phi-4-reasoning.jsonl Qwen3-14B=runs/real/math500_Qwen3-14B.jsonl \\
        --model-params gpt-oss-20b=3.6e9 Phi-4-reasoning=14e9 Qwen3-14B=14.8e9 --align-cache runs/real/align.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from isocompute.evaluation.model_baselines import (
    HeldOut,
    best_fixed,
    best_single_model,
    uniform_at_budget,
    uniform_columns,
)
from isocompute.solver.models.actions import MenuConfig
from isocompute.solver.models.costs import parse_model_params, resolve_model_flops
from isocompute.solver.models.estimates import ActionEstimates, estimate_menu, oracle
from isocompute.solver.models.tables import join_tables
from isocompute.solver.outcomes import read_outcomes
from isocompute.tasks.answers.class_alignment import align_answers
from isocompute.tasks.grading import Grader


def averaged(est: ActionEstimates, cols: np.ndarray, budget: float, seeds: int, method: str) -> HeldOut | None:
    runs = [best_fixed(est, cols, budget, folds=5, seed=s, method=method) for s in range(seeds)]
    if any(r is None for r in runs):
        return None
    return HeldOut(method, np.mean([r.utility for r in runs], axis=0), np.mean([r.cost for r in runs], axis=0),
                   runs[0].choices)


def best_single(est: ActionEstimates, budget: float, seeds: int) -> HeldOut | None:
    """Each model's best fixed plan (held out, averaged over fold splits); the best model in hindsight."""
    per: dict[str, list[HeldOut]] = {}
    for s in range(seeds):
        for m, h in best_single_model(est, budget, folds=5, seed=s)[1].items():
            if h is not None:
                per.setdefault(m, []).append(h)
    scored = [HeldOut(f"fixed plan {m}", np.mean([h.utility for h in hs], axis=0),
                      np.mean([h.cost for h in hs], axis=0), hs[0].choices) for m, hs in per.items() if len(hs) == seeds]
    return max(scored, key=lambda h: h.accuracy) if scored else None


def gain_ci(method: np.ndarray, base: np.ndarray, rng: np.random.Generator, n_boot: int = 2000) -> tuple[float, ...]:
    idx = rng.integers(0, base.size, (n_boot, base.size))
    boot = method[idx].mean(1) / base[idx].mean(1) - 1
    return float(method.mean() / base.mean() - 1), float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975))


def reach(curve: list[HeldOut | None], budgets: np.ndarray, target_u: np.ndarray, rng: np.random.Generator,
          n_boot: int = 1000) -> tuple[float, float, float]:
    """Smallest budget whose held-out accuracy ≥ the target's mean, and a bootstrap 95% CI (nan: never)."""
    ok = [(b, h) for b, h in zip(budgets, curve, strict=True) if h is not None]
    U = np.array([h.utility for _, h in ok])  # (B, N)
    bs = np.array([b for b, _ in ok])

    def first(u_mean: np.ndarray, t: float) -> float:
        hit = np.flatnonzero(u_mean >= t - 1e-12)
        return float(bs[hit[0]]) if hit.size else np.nan

    point = first(U.mean(axis=1), float(target_u.mean()))
    idx = rng.integers(0, U.shape[1], (n_boot, U.shape[1]))
    boot = np.array([first(U[:, i].mean(axis=1), float(target_u[i].mean())) for i in idx])
    lo, hi = (np.nanquantile(boot, 0.025), np.nanquantile(boot, 0.975)) if np.isfinite(boot).any() else (np.nan, np.nan)
    return point, float(lo), float(hi)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tables", nargs="+", help="NAME=TABLE.jsonl, one per model")
    ap.add_argument("--model-params", nargs="+", required=True, help="NAME=ACTIVE_PARAMS per model")
    ap.add_argument("--align-cache", type=Path, default=None)
    ap.add_argument("--budgets", type=int, default=10, help="budget points in the printed table")
    ap.add_argument("--fine", type=int, default=60, help="budget points for the cost-to-reach search")
    ap.add_argument("--seeds", type=int, default=3, help="fold splits averaged")
    ap.add_argument("--orders", type=int, default=200, help="Monte Carlo orders for votes across models")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args()
    rng = np.random.default_rng(0)

    t0, c0 = time.perf_counter(), time.process_time()
    paths = dict(item.split("=", 1) for item in args.tables)
    mt = join_tables({name: read_outcomes(p) for name, p in paths.items()})
    with Grader(workers=2) as grader:
        al = align_answers(mt.answers(), mt.kind, golds=mt.golds, grader=grader, cache=args.align_cache)
    mt = mt.with_classes(al.classes)
    t1, c1 = time.perf_counter(), time.process_time()
    flops = resolve_model_flops(mt, params=parse_model_params(args.model_params))
    est = estimate_menu(mt, flops, MenuConfig(n_orders=args.orders))
    t2, c2 = time.perf_counter(), time.process_time()
    kinds = {k: len(est.columns(kind=k)) for k in ("single", "cascade", "ensemble")}
    print(f"{len(mt)} prompts × {list(mt.names)}; classes aligned in {t1 - t0:.1f} s ({c1 - c0:.1f} s CPU here"
          f"{', from cache' if al.cached else ''}); partition changes {mt.partition_changes()}, mixed classes "
          f"{mt.mixed_classes()}")
    print(f"menu: {len(est.actions)} actions {kinds} estimated in {t2 - t1:.1f} s ({c2 - c1:.1f} s CPU); "
          f"Monte Carlo ({est.n_orders} orders) on {est.method.count('monte-carlo')}, mean SE "
          f"{est.utility_se[:, [j for j, m in enumerate(est.method) if m == 'monte-carlo']].mean():.4f} per prompt")
    if all(est.completion_only.values()):
        print("FLOPs: completion tokens only (no prompt token counts in these tables), 2 · active params per token")

    singles = {m: uniform_columns(est, m) for m in est.models}
    cost1 = {m: float(est.cost[:, c[0]].mean()) for m, (k, c) in singles.items()}
    cost16 = {m: float(est.cost[:, c[k == 16][0]].mean()) for m, (k, c) in singles.items()}
    acc16 = {m: est.utility[:, c[k == 16][0]] for m, (k, c) in singles.items()}
    lo, hi = min(cost1.values()), max(cost16.values())
    grid = np.geomspace(lo, hi, args.budgets)
    cascades = est.columns(kind="cascade")
    everything = np.arange(len(est.actions))
    exact_cols = np.array([j for j, m in enumerate(est.method) if m == "exact"])
    rows, figures = [], {"budgets": [], "reach": {}}
    for b in grid:
        base = best_single(est, b, args.seeds)
        orc = oracle(est, b)
        orc_x = oracle(est.select(exact_cols), b)
        solo = [oracle(est.select(est.columns(model=m)), b) for m in est.models
                if b >= est.cost[:, est.columns(model=m)].min(axis=1).mean()]
        orc_1 = max(solo, key=lambda o: o.accuracy)
        cas = averaged(est, cascades, b, args.seeds, "fixed cascade")
        anyf = averaged(est, everything, b, args.seeds, "fixed action")
        uni = {m: uniform_at_budget(est, m, b) for m in est.models}
        rows.append((b, base, orc, orc_x, orc_1, cas, anyf, uni))
        figures["budgets"].append({
            "budget": b, "oracle": [orc.accuracy, orc.mean_cost], "oracle_exact": [orc_x.accuracy, orc_x.mean_cost],
            "oracle_one_model": [orc_1.accuracy, orc_1.mean_cost],
            **{k: (None if h is None else [h.accuracy, h.mean_cost, h.choices[0]])
               for k, h in (("best_single", base), ("fixed_cascade", cas), ("fixed_action", anyf))},
            **{f"uniform {m}": (None if h is None else [h.accuracy, h.mean_cost]) for m, h in uni.items()}})

    def cell(h: HeldOut | None, base: HeldOut | None) -> str:
        if h is None:
            return "—"
        if base is None:
            return f"{h.accuracy:.4f} ({h.mean_cost:.2e})"
        g = gain_ci(h.utility, base.utility, rng)
        return f"{h.accuracy:.4f} ({h.mean_cost:.2e}; {100 * g[0]:+.2f}% [{100 * g[1]:+.2f}, {100 * g[2]:+.2f}])"

    print("\nAccuracy (realised mean FLOPs; gain vs the best single model's best fixed plan [95% paired-bootstrap CI])")
    print("| budget FLOPs | best single model (fixed plan) | oracle (hindsight) | oracle (exact) | oracle (one model) | "
          "fixed cascade | fixed action | " + " | ".join(f"uniform {m}" for m in est.models) + " |")
    print("|---" * (7 + len(est.models)) + "|")
    for b, base, orc, orc_x, orc_1, cas, anyf, uni in rows:
        orcs = [HeldOut(n, o.utility, o.cost, ()) for n, o in (("oracle", orc), ("exact", orc_x), ("one", orc_1))]
        name = "—" if base is None else f"{base.accuracy:.4f} ({base.mean_cost:.2e}, {base.method[11:]})"
        print(f"| {b:.2e} | {name} | " + " | ".join(cell(o, base) for o in orcs) + f" | {cell(cas, base)} | "
              f"{cell(anyf, base)} | " + " | ".join(cell(uni[m], None) for m in est.models) + " |")
    print("(—: the budget is below the cheapest candidate's mean FLOPs on some training split, or outside uniform's range)")
    print("\nFixed cascade choices at each budget (fold 1):")
    for b, _, _, _, _, cas, _, _ in rows:
        print(f"  {b:.2e}: {'—' if cas is None else cas.choices[0]}")

    fine = np.geomspace(lo, hi, args.fine)
    curves = {"fixed cascade": [averaged(est, cascades, b, args.seeds, "fixed cascade") for b in fine],
              "fixed action": [averaged(est, everything, b, args.seeds, "fixed action") for b in fine]}
    print(f"\nCost to reach each model's uniform maj@16 accuracy, held out ({args.fine} log-spaced budgets: "
          f"a factor {fine[1] / fine[0]:.3f} apart; nan: never reached)")
    print("| model | maj@16 accuracy | maj@16 FLOPs | method | reaches it at | fraction of maj@16 FLOPs [95% CI] | "
          "target ≤ 1/4 |")
    print("|---|---|---|---|---|---|---|")
    for m in est.models:
        for method, curve in curves.items():
            point, clo, chi = reach(curve, fine, acc16[m], rng)
            frac = point / cost16[m]
            met = "met" if frac <= 0.25 and chi / cost16[m] <= 0.25 else ("met (point)" if frac <= 0.25 else "missed")
            print(f"| {m} | {acc16[m].mean():.4f} | {cost16[m]:.2e} | {method} | {point:.2e} | {frac:.3f} "
                  f"[{clo / cost16[m]:.3f}, {chi / cost16[m]:.3f}] | {met} |")
            figures["reach"][f"{m} / {method}"] = {"maj16": float(acc16[m].mean()), "maj16_flops": cost16[m],
                                                   "reach_flops": point, "ci": [clo, chi]}
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1, default=float))


if __name__ == "__main__":
    main()
