"""Does empirical-Bayes shrinkage of the oracle labels help the learned rule? Raw vs shrunk, same folds.

On each outcome table given, the policy's configuration is cross-validated twice on the same folds and
seeds: learners trained on the raw utilities (the named baseline, ``raw``) and on utilities shrunk
toward the task's mean (``eb``, :mod:`isocompute.policy.learn.shrinkage`). Both are scored on the raw
utilities of held-out prompts, with the fallback off (what the learned rule itself does) and as served
(with the never-worse chain). Printed per table and budget: uniform's accuracy, each variant's gain
over uniform, and the paired difference eb − raw of the learned rule alone (bootstrap 95% CI over
prompts) with the ratio of accuracies.

    .venv/bin/python bench/bench_label_shrinkage.py TABLE.jsonl [TABLE.jsonl …] [--budgets 2,4,8] [--seeds 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np

from isocompute.evaluation.evaluate import METHODS, bootstrap_indices, cross_validate
from isocompute.policy.learn.shrinkage import sampling_variance
from isocompute.policy.policy import PolicyConfig, task_groups
from isocompute.solver.costs import cost_table
from isocompute.solver.estimators import utilities
from isocompute.stages.inputs import read_table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tables", nargs="+", type=Path)
    ap.add_argument("--budgets", default="2,4,8")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--boot", type=int, default=2000)
    args = ap.parse_args()
    budgets = [float(b) for b in args.budgets.split(",")]
    m = {name: j for j, name in enumerate(METHODS)}
    print("| table | budget | uniform | raw alone | eb alone | eb − raw [95% CI] | eb / raw | raw served | eb served |")
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|")
    for path in args.tables:
        table = read_table(path)
        base = PolicyConfig()
        U = utilities(table, base.actions, base.strategy)
        C = cost_table(table.prompt_tokens, None, base.actions, unit="samples")
        t0 = time.process_time()
        var = sampling_variance(table, base.actions, base.strategy)
        groups = task_groups(table)
        evs = {}
        for name in ("raw", "eb"):
            cfg = dataclasses.replace(base, shrinkage="none" if name == "raw" else "eb")
            evs[name] = cross_validate(table.prompts, U, C, cfg, budgets, folds=args.folds,
                                       seeds=tuple(range(args.seeds)), label_var=var, groups=groups)
        idx = bootstrap_indices(len(table), args.boot, 0)
        for bi, b in enumerate(budgets):
            uni = evs["raw"].utility[:, m["uniform"], bi].mean(axis=0)
            alone = {k: ev.utility[:, m["learned_no_fallback"], bi].mean(axis=0) for k, ev in evs.items()}
            served = {k: ev.utility[:, m["learned"], bi].mean(axis=0) for k, ev in evs.items()}
            d = alone["eb"] - alone["raw"]
            lo, hi = np.percentile(d[idx].mean(axis=1), [2.5, 97.5])

            def g(x: np.ndarray, uni: np.ndarray = uni) -> str:
                return f"{100 * (x.mean() / uni.mean() - 1):+.2f}%"

            name = path.parent.name if path.name == "outcomes.jsonl" else path.stem
            print(f"| {name} | {b:g} | {uni.mean():.4f} | {g(alone['raw'])} | {g(alone['eb'])} | "
                  f"{d.mean():+.4f} [{lo:+.4f}, {hi:+.4f}] | {alone['eb'].mean() / alone['raw'].mean():.4f} | "
                  f"{g(served['raw'])} | {g(served['eb'])} |", flush=True)
        print(f"<!-- {path.stem}: {time.process_time() - t0:.0f} s CPU -->", flush=True)


if __name__ == "__main__":
    main()
