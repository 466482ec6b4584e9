"""The gateway's cold-start plans: for each budget B (mean completion tokens per prompt, in multiples of one
sample's mean: ``4x``), the fixed plan of the parallel-stop menu (with the uniform ladder ``none@k``) with the
best accuracy, averaged over the real tables, among those whose mean expected tokens fit B on every table
(``isocompute.policy.cold_start.COLD_START``). Parallel-stop plans run one or two streamed waves, so the
cold start adds no sequential-wave latency.

Baseline in the same run: uniform ``none@k`` at the largest k within the budget; the printed ratio is the
chosen plan's tokens over uniform's and its accuracy gain, per table (gold, exact plan estimators).

    PYTHONPATH=. python bench/bench_cold_start.py /work/tables/*.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from isocompute.policy.plans.arrays import plan_arrays
from isocompute.solver.outcomes import read_outcomes
from isocompute.solver.plans.plan import default_plans, parallel_plans

BUDGETS = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tables", nargs="+", type=Path)
    ap.add_argument("--json", type=Path, help="write the per-table arrays' summary here")
    args = ap.parse_args(argv)
    ladder = [p for p in default_plans() if p.rule.kind == "none"]
    menu = list({p.name: p for p in [*ladder, *parallel_plans()] if p.max_samples <= 16}.values())
    names = [p.name for p in menu]
    acc, smp, tok = [], [], []
    for path in args.tables:
        t = read_outcomes(path)
        arr = plan_arrays(t, menu, cost_unit="samples")
        unit = float(np.nanmean(t.mean_completion_tokens))
        acc.append(arr.utility.mean(axis=0))
        smp.append(arr.samples.mean(axis=0))
        tok.append(arr.tokens.mean(axis=0) / unit)
        print(f"{path.name}: {len(t)} prompts × {int(t.n_samples.min())} samples", file=sys.stderr)
    A, S, T = np.array(acc), np.array(smp), np.array(tok)
    rows = {}
    for b in BUDGETS:
        ok = (T <= b + 1e-9).all(axis=0)
        j = int(np.flatnonzero(ok)[np.argmax(A.mean(axis=0)[ok])])
        k = max(k for k in (1, 2, 4, 8, 16) if k <= b)
        u = names.index(f"none@{k}")
        rows[b] = names[j]
        per = "  ".join(f"{path.stem}: {100 * (A[t, j] - A[t, u]):+.2f} pt, tokens ×{T[t, j] / T[t, u]:.2f}"
                        for t, path in enumerate(args.tables))
        print(f"budget {b:>4g}: {names[j]:<28} acc {A[:, j].mean():.4f} (uniform none@{k} {A[:, u].mean():.4f}), "
              f"samples {S[:, j].mean():.2f}, tokens {T[:, j].mean():.2f}x | {per}")
    print("COLD_START = " + json.dumps({str(b): [n, round(float(T[:, names.index(n)].mean()), 3)]
                                        for b, n in rows.items()}))
    if args.json:
        args.json.write_text(json.dumps({"plans": names, "accuracy": A.tolist(), "samples": S.tolist(),
                                         "tokens_x": T.tolist(), "tables": [p.name for p in args.tables],
                                         "choice": {str(b): n for b, n in rows.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
