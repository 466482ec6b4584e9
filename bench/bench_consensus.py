"""Labels cost little where the vote is a good label: a policy fitted under the consensus target, scored on gold.

For every real table with gold, at budgets 2x/4x/8x (tokens, in multiples of one sample's mean completion
tokens), 5-fold cross-validation (the same folds for both):

* **consensus-fitted** — the policy (the default plan menu, ``--parallel``: with the parallel-stop plans; tokens
  unit; the never-worse chain; 20 LightGBM rounds, 2 calibration folds, both fits alike) fitted on
  utilities under the consensus target (a sample credited by agreement with its prompt's plurality class:
  ``isocompute.solver.votes.consensus``), scored on the held-out fold under **gold**;
* **gold-fitted** — the same recipe fitted on gold utilities (the named baseline), scored on gold;
* **uniform** — maj@k at the budget (adjacent k mixed), on gold.

Prints per table and budget each one's gold accuracy, realised tokens (x) and latency (sample lengths), the gap
consensus − gold-fitted with a paired bootstrap 95% CI over prompts, and consensus − uniform; targets: the gap
≥ −0.2 pt on the MATH-500 tables, consensus-fitted ≥ uniform everywhere (MISS otherwise).

    PYTHONPATH=. OMP_NUM_THREADS=1 python bench/bench_consensus.py /work/tables/*.jsonl --out /tmp/consensus.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

from isocompute.evaluation.channels import latency_channel
from isocompute.evaluation.evaluate import cross_validate
from isocompute.evaluation.summary import METHODS
from isocompute.policy.plans.arrays import plan_arrays
from isocompute.policy.policy import PolicyConfig
from isocompute.solver.costs import token_multiple_of
from isocompute.solver.outcomes import read_outcomes
from isocompute.solver.votes.consensus import agreement, with_target
from isocompute.stages.parsing import parse_plans

ACTIONS = (1, 2, 4, 8, 16)
MATH = ("gpt-oss-20b", "Qwen3-14B", "Phi-4-reasoning")


def one_table(path: Path, budgets_x: list[float], folds: int, seed: int, n_boot: int, parallel: bool = False,
              n_rounds: int = 20) -> dict:
    gold_t = read_outcomes(path)
    cons_t = with_target(gold_t, "consensus")
    names = parse_plans(None, ACTIONS, "majority", parallel=parallel)
    from isocompute.solver.plans.plan import parse_plan

    menu = [parse_plan(n) for n in names]
    unit = token_multiple_of(gold_t.mean_completion_tokens)
    g = plan_arrays(gold_t, menu, cost_unit="tokens")
    c = plan_arrays(cons_t, menu, cost_unit="tokens")
    lat = latency_channel(g.latency, g.waves, unit)
    budgets = [b * unit for b in budgets_x]
    base = PolicyConfig(actions=ACTIONS, plans=names, cost_unit="tokens", seed=seed, n_rounds=n_rounds,
                        calibration_folds=2,
                        budget_range=(float(g.cost.min(axis=1).mean()) * 1.001, 16 * unit))
    common = dict(folds=folds, seeds=(seed,), samples=g.samples, waves=g.waves, tokens=g.tokens, latency=lat)
    ev_c = cross_validate(gold_t.prompts, c.utility, c.cost, dataclasses.replace(base, target="consensus"), budgets,
                          gold=g.utility, **common)
    ev_g = cross_validate(gold_t.prompts, g.utility, g.cost, dataclasses.replace(base, target="gold"), budgets,
                          **common)
    L, U = METHODS.index("learned"), METHODS.index("uniform")
    rng = np.random.default_rng(0)
    N = len(gold_t)
    idx = rng.integers(0, N, size=(n_boot, N))
    out = {"table": path.stem, "prompts": N, "agreement": agreement(gold_t).as_dict(), "budgets": []}
    for bi, bx in enumerate(budgets_x):
        cg = ev_c.gold[0, L, bi]  # consensus-fitted, scored on gold (per prompt)
        gg = ev_g.utility[0, L, bi]  # gold-fitted, on gold
        ug = ev_g.utility[0, U, bi]  # uniform, on gold
        gap, vs_u = cg - gg, cg - ug
        row = {"budget_x": bx,
               "consensus_fitted": {"gold": float(cg.mean()), "consensus": float(ev_c.utility[0, L, bi].mean()),
                                    "tokens_x": float(ev_c.tokens[0, L, bi].mean() / unit),
                                    "latency": float(ev_c.latency[0, L, bi].mean())},
               "gold_fitted": {"gold": float(gg.mean()), "tokens_x": float(ev_g.tokens[0, L, bi].mean() / unit),
                               "latency": float(ev_g.latency[0, L, bi].mean())},
               "uniform": {"gold": float(ug.mean()), "tokens_x": float(ev_g.tokens[0, U, bi].mean() / unit),
                           "latency": float(ev_g.latency[0, U, bi].mean())},
               "gap_pt": 100 * float(gap.mean()),
               "gap_ci95_pt": [100 * float(np.percentile(gap[idx].mean(axis=1), q)) for q in (2.5, 97.5)],
               "vs_uniform_pt": 100 * float(vs_u.mean()),
               "vs_uniform_ci95_pt": [100 * float(np.percentile(vs_u[idx].mean(axis=1), q)) for q in (2.5, 97.5)]}
        out["budgets"].append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tables", nargs="+", type=Path)
    ap.add_argument("--budgets", default="2,4,8")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bootstrap", type=int, default=2000)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--parallel", action="store_true", help="add the parallel-stop plans to the default menu")
    ap.add_argument("--n-rounds", type=int, default=20, help="LightGBM rounds per member (both fits alike)")
    args = ap.parse_args(argv)
    budgets = [float(b) for b in args.budgets.split(",")]
    results, misses = [], []
    for path in args.tables:
        t0 = time.perf_counter()
        r = one_table(path, budgets, args.folds, args.seed, args.bootstrap, args.parallel, args.n_rounds)
        r["seconds"] = time.perf_counter() - t0
        results.append(r)
        ag = r["agreement"]
        print(f"\n{r['table']} ({r['prompts']} prompts, {r['seconds']:.0f} s): consensus flips {100 * ag['sample_flip']:.1f}% of samples, "
              f"plurality right on {100 * ag['plurality_right']:.1f}% of prompts")
        for row in r["budgets"]:
            cf, gf, un = row["consensus_fitted"], row["gold_fitted"], row["uniform"]
            math = any(m in r["table"] for m in MATH)
            miss = []
            if math and row["gap_pt"] < -0.2:
                miss.append("gap < -0.2 pt")
            if row["vs_uniform_pt"] < 0:
                miss.append("below uniform")
            misses += [f"{r['table']} {row['budget_x']:g}x: {m}" for m in miss]
            lo, hi = row["gap_ci95_pt"]
            print(f"  {row['budget_x']:g}x: consensus-fitted {cf['gold']:.4f} on gold ({cf['tokens_x']:.2f}x, "
                  f"lat {cf['latency']:.2f}) | gold-fitted {gf['gold']:.4f} ({gf['tokens_x']:.2f}x, lat "
                  f"{gf['latency']:.2f}) | uniform {un['gold']:.4f} | gap {row['gap_pt']:+.2f} pt [{lo:+.2f}, "
                  f"{hi:+.2f}] | vs uniform {row['vs_uniform_pt']:+.2f} pt" + (f"  MISS: {', '.join(miss)}" if miss else ""))
        sys.stdout.flush()
        if args.out:
            args.out.write_text(json.dumps({"results": results, "misses": misses}, indent=1))
    print("\n" + ("targets met" if not misses else "MISSES: " + "; ".join(misses)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
