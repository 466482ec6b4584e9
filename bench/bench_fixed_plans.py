"""Benchmark: the best fixed stopping rule, held out, against uniform maj@k at the same budget.

Reproduces issue 14's table: one sample at a time, stop when the leader leads the runner-up by m, or at
k_max; (m, k_max) and the mixing between two such plans chosen on 4/5 of the prompts so the expected
samples on those prompts are exactly the budget, and scored on the other fifth (5 folds; ``--seeds``
fold splits, averaged). Expectations over sample orders are exact (the issue's figures used Monte Carlo
over 100 orders). The baseline, in the same run: uniform maj@k at the budget (adjacent k mixed exactly,
as the report does; at an integer budget that is maj@B). Printed per table and budget: both accuracies,
the relative gain with a 95% paired-bootstrap CI over prompts, the fixed rule's realised held-out cost
and expected waves, and the table's maj@16. A second table gives the best fixed plan of every rule
family (ESC window, Adaptive-Consistency Beta / Dirichlet, Best-of-∞ Bayes factor, lead).

    .venv/bin/python bench/bench_fixed_plans.py TABLE.jsonl ... [--budgets 2,4,8] [--seeds 3]
    # the five real tables: see docs/import-and-formats.md for the `isocompute import` commands

Cost unit: samples.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from isocompute.errors import BudgetError
from isocompute.evaluation.evaluate import uniform_mix
from isocompute.policy.plans.fixed import cross_validate_fixed_plan
from isocompute.solver.outcomes import read_outcomes
from isocompute.solver.plans.estimates import estimate_table
from isocompute.solver.plans.plan import Plan, plan_family

K_MAX = (2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16)


def families() -> dict[str, list[Plan]]:
    ks = (2, 4, 8, 12, 16)
    return {
        "lead": plan_family("lead", m=(1, 2, 3, 4, 5), k_max=K_MAX),
        "window (ESC)": plan_family("window", w=(2, 3, 4), k_max=ks),
        "beta (AC)": plan_family("beta", p=(0.6, 0.75, 0.9, 0.95, 0.99), k_max=ks),
        "dirichlet (AC)": plan_family("dirichlet", p=(0.6, 0.75, 0.9, 0.95), k_max=ks),
        "bayes (BoInf)": plan_family("bayes", B=(1.0, 3.0, 10.0, 30.0, 100.0), k_max=ks),
    }


def held_out(U: np.ndarray, C: np.ndarray, W: np.ndarray, budget: float, seeds: int) -> dict | None:
    """Per-prompt held-out utility, cost and waves of the best fixed plan, averaged over fold seeds."""
    try:
        runs = [cross_validate_fixed_plan(U, C, budget, folds=5, seed=s) for s in range(seeds)]
    except BudgetError:
        return None
    waves = np.mean([np.concatenate([ch.cost(W[r.fold == f]) for f, ch in enumerate(r.choices)]).mean()
                     for r in runs])
    return {"utility": np.mean([r.utility for r in runs], axis=0), "cost": float(np.mean([r.mean_cost for r in runs])),
            "waves": float(waves), "choices": runs[0].choices}


def gain_ci(method: np.ndarray, base: np.ndarray, rng: np.random.Generator, n_boot: int = 2000) -> tuple[float, float, float]:
    idx = rng.integers(0, base.size, (n_boot, base.size))
    boot = (method[idx].mean(1) - base[idx].mean(1)) / base[idx].mean(1)
    return float((method.mean() - base.mean()) / base.mean()), float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tables", nargs="+", type=Path)
    ap.add_argument("--budgets", default="2,4,8")
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    budgets = [float(b) for b in args.budgets.split(",")]
    rng = np.random.default_rng(0)
    fams = families()
    uniform = plan_family("uniform", k=tuple(range(1, 17)))
    rows, fam_rows = [], []
    for path in args.tables:
        t0, c0 = time.perf_counter(), time.process_time()
        table = read_outcomes(path)
        plans = uniform + [p for ps in fams.values() for p in ps]
        est = estimate_table(table, plans)
        secs, cpu = time.perf_counter() - t0, time.process_time() - c0
        U, C, W = est.utility, est.samples, est.waves
        nu = len(uniform)
        cols = {}
        at = nu
        for name, ps in fams.items():
            cols[name] = slice(at, at + len(ps))
            at += len(ps)
        print(f"{path.name}: {len(table)} prompts x {int(table.n_samples.min())}-{table.n_max} samples, "
              f"{len(plans)} plans estimated exactly in {secs:.1f} s ({cpu:.1f} s CPU)")
        for b in budgets:
            j, k, q = uniform_mix(C[:, :nu].mean(0), b)
            base = (1 - q) * U[:, j] + q * U[:, k]
            for name, sl in cols.items():
                res = held_out(U[:, sl], C[:, sl], W[:, sl], b, args.seeds)
                if res is None:
                    fam_rows.append((path.stem, b, name, None))
                    continue
                g = gain_ci(res["utility"], base, rng)
                fam_rows.append((path.stem, b, name, (res, g, base.mean())))
                if name == "lead":
                    names = [p.name for p in fams[name]]
                    rows.append((path.stem, b, base.mean(), res, g, U[:, 15].mean(), res["choices"][0].describe(names)))

    print("\nFixed stopping rule (lead m, k_max; one sample at a time), held out 5-fold, vs uniform maj@k at the budget")
    print("| table | budget | uniform maj@k | fixed rule held out | gain [95% CI] | realised cost | waves | maj@16 | fold 1's choice |")
    print("|---|---|---|---|---|---|---|---|---|")
    for stem, b, base, res, g, m16, choice in rows:
        print(f"| {stem} | {b:g} | {base:.3f} | {res['utility'].mean():.3f} | {100 * g[0]:+.1f}% "
              f"[{100 * g[1]:+.1f}, {100 * g[2]:+.1f}] | {res['cost']:.3f} | {res['waves']:.2f} | {m16:.3f} | {choice} |")
    print("\nBest fixed plan of each rule family, held out (accuracy, gain vs uniform [95% CI], realised cost)")
    print("| table | budget | " + " | ".join(fams) + " |")
    print("|---|---|" + "---|" * len(fams))
    by = {}
    for stem, b, name, r in fam_rows:
        by.setdefault((stem, b), {})[name] = r
    for (stem, b), d in by.items():
        cells = []
        for name in fams:
            r = d.get(name)
            if r is None:
                cells.append("— (below its cheapest plan)")
            else:
                res, g, _ = r
                cells.append(f"{res['utility'].mean():.3f} ({100 * g[0]:+.1f}% [{100 * g[1]:+.1f}, {100 * g[2]:+.1f}], {res['cost']:.2f})")
        print(f"| {stem} | {b:g} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
