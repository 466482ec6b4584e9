"""The oracle (``isocompute solve``, hindsight: it sees every prompt's outcomes) under a token and a latency
budget, against uniform maj@k in the same run, on an outcome table with token counts.

Menu: ``--plans default+parallel`` (sequential plans and parallel-stop waves), cost unit tokens, latency in
units of one sample's mean completion length (1.0 = waiting for one sample), ``--wave-overhead`` per wave.

1. At latency ≤ uniform@16's: the oracle's accuracy at token budgets 1x … 16x, and the fewest mean tokens at
   which it reaches uniform@16's accuracy (within 0.2 pt; bisection between grid points, the frontier being
   nondecreasing in the budget), as a ratio of uniform@16's tokens.
2. At latency ≤ 1.0: the oracle's accuracy at uniform@4's tokens (4x) and at 16x, vs uniform@4's.

The headline point is re-solved through the stage (``solve``, the CLI's code path) as a check. This is the
oracle, not a learned policy: it is an upper bound on what any per-prompt policy reaches with these plans.

    python -m isocompute import boinf analysis_math500_gpt-oss-20b.jsonl --problems math500_test.jsonl \\
        --out /tmp/lat/gpt.jsonl
    python bench/bench_latency_oracle.py /tmp/lat/gpt.jsonl
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from isocompute.policy.plans.arrays import plan_arrays
from isocompute.policy.plans.menu import resolve_plans
from isocompute.solver.costs import token_multiple_of
from isocompute.solver.outcomes import read_outcomes
from isocompute.stages.solutions import latency_columns, latency_oracle
from isocompute.stages.solve import SolveConfig, solve

ACTIONS = [1, 2, 4, 8, 16]
TOL = 0.002  # 0.2 accuracy points


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("table", type=Path)
    ap.add_argument("--plans", default="default+parallel")
    ap.add_argument("--wave-overhead", type=float, default=0.0)
    ap.add_argument("--step", type=float, default=0.5, help="grid of token budgets, in multiples (x)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    table = read_outcomes(args.table)
    per = token_multiple_of(table.mean_completion_tokens)
    plans = resolve_plans(args.plans, ACTIONS)
    arr = plan_arrays(table, plans, cost_unit="tokens")
    L, T = latency_columns(arr, args.wave_overhead, per)
    names = [p.name for p in plans]
    uni = {k: names.index(f"none@{k}") for k in ACTIONS}
    print(f"{args.table.name}: {len(arr.table)} prompts, {len(plans)} plans ({args.plans}), 1x = {per:.1f} tokens, "
          f"wave overhead {args.wave_overhead:g}; estimated in {time.perf_counter() - t0:.1f} s")
    print("uniform maj@k:  k  accuracy  tokens(x)  latency")
    for k, j in uni.items():
        print(f"               {k:2d}  {arr.utility[:, j].mean():.4f}   {T[:, j].mean() / per:6.2f}    "
              f"{L[:, j].mean():.3f}")

    def oracle(bx: float, lat: float):
        s = latency_oracle(arr, bx * per, lat, args.wave_overhead, per)
        return s.res.mean_utility, s.fields()

    j16, j4 = uni[16], uni[4]
    acc16, lat16, tok16 = arr.utility[:, j16].mean(), L[:, j16].mean(), T[:, j16].mean()
    print(f"\n1. latency ≤ uniform@16's ({lat16:.3f}); target uniform@16's accuracy {acc16:.4f} − 0.2 pt")
    grid = np.arange(1.0, 16.0 + 1e-9, args.step)
    prev, hit = None, None
    for bx in grid:
        u, f = oracle(bx, lat16)
        print(f"   {bx:5.2f}x: accuracy {u:.4f}  latency {f['mean_latency']:.3f}  tokens {f['mean_tokens'] / per:.2f}x")
        if u >= acc16 - TOL:
            hit = bx
            break
        prev = bx
    if hit is None:
        print("   not reached within 16x")
    else:
        lo, hi = (prev if prev is not None else hit), hit
        for _ in range(30 if prev is not None else 0):
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if oracle(mid, lat16)[0] >= acc16 - TOL else (mid, hi)
        u, f = oracle(hi, lat16)
        print(f"   reached at {f['mean_tokens']:.0f} tokens ({hi:.3f}x) with accuracy {u:.4f}, latency "
              f"{f['mean_latency']:.3f}: {f['mean_tokens'] / tok16:.3f} of uniform@16's {tok16:.0f} tokens "
              f"(1/{tok16 / f['mean_tokens']:.1f})")
        check = _stage(args, table_path=args.table, budget=hi, latency=lat16)
        print(f"   solve (the stage) at --budget {hi:.4f}x --latency-budget {lat16:.4f}: accuracy "
              f"{check['mean_utility']:.4f}, tokens {check['mean_tokens']:.0f}, latency {check['mean_latency']:.3f}")

    acc4, tok4 = arr.utility[:, j4].mean(), T[:, j4].mean() / per
    print(f"\n2. latency ≤ 1.0 (one sample's wait) vs uniform@4: accuracy {acc4:.4f} at {tok4:.2f}x tokens, "
          f"latency {L[:, j4].mean():.3f}")
    for bx in (tok4, 16.0):
        u, f = oracle(bx, 1.0)
        print(f"   oracle at {bx:5.2f}x: accuracy {u:.4f} ({100 * (u - acc4):+.2f} pt), latency "
              f"{f['mean_latency']:.3f}, tokens {f['mean_tokens'] / per:.2f}x")
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")


def _stage(args: argparse.Namespace, *, table_path: Path, budget: float, latency: float) -> dict:
    from isocompute.stages.parsing import Multiple

    with tempfile.TemporaryDirectory() as d:
        return solve(SolveConfig(outcomes=table_path, actions=list(ACTIONS), cost_unit="tokens", plans=args.plans,
                                 budget=Multiple(budget), latency_budget=latency, wave_overhead=args.wave_overhead,
                                 out=Path(d) / "sol"))


if __name__ == "__main__":
    main()
