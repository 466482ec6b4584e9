"""``isocompute vote``: fit a weighted vote on an outcome table at one k and write ``vote.json`` for serving.

The work is :func:`isocompute.solver.votes.fit.fit_vote`: the weight w = (len/T)^−β · exp(γ·z(confidence))
(γ only where every sample carries ``confidence_min_window`` or ``logprob_mean``) cross-fitted over prompt
folds on shared random k-subsets, kept only where a one-sided paired bootstrap of its out-of-fold gain over
plain majority supports it at ``--level``; otherwise the file holds β = γ = 0 (plain majority). The printed
summary gives both out-of-fold accuracies and the gain's 95% CI; ``isocompute serve --vote vote.json`` then
answers ``strategy: "weighted"`` with it — by length only, as its engines return no logprobs: ``--no-confidence``
fits that (γ = 0), so what is served is what was validated. Example::

    isocompute vote runs/real/math500_gpt-oss-20b.jsonl --k 8 --out runs/vote.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("vote", help="fit a weighted vote (length, confidence) and write vote.json",
                              description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("table", type=Path, help="outcome table (JSONL)")
    p.add_argument("--k", type=int, required=True, help="samples per vote the weighting is fitted for")
    p.add_argument("--out", type=Path, required=True, help="where to write vote.json")
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--draws", type=int, default=256, help="random k-subsets per prompt")
    p.add_argument("--level", type=float, default=0.95, help="one-sided bootstrap level to keep the weighting")
    p.add_argument("--no-confidence", action="store_true",
                   help="fit the length weight alone (γ = 0): what the gateway applies, its engines return no logprobs")
    p.add_argument("--json", action="store_true", help="print the fit record as one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from isocompute.errors import InputError
    from isocompute.solver.outcomes import read_outcomes
    from isocompute.solver.votes.fit import fit_vote

    if not 0.5 <= args.level < 1 or args.folds < 2 or args.draws < 1:
        raise InputError("--level must be in [0.5, 1), --folds ≥ 2 and --draws ≥ 1")
    fit = fit_vote(read_outcomes(args.table), args.k, folds=args.folds, seed=args.seed, draws=args.draws,
                   level=args.level, use_confidence=not args.no_confidence)
    path = fit.weights.save(args.out)
    rec = fit.weights.fit or {}
    if args.json:
        print(json.dumps({**rec, "beta": fit.weights.beta, "gamma": fit.weights.gamma, "out": str(path)}))
        return 0
    lo, hi = rec["gain_ci95"]
    print(f"k = {args.k}: majority {rec['majority_oof']:.4f}, weighted {rec['weighted_oof']:.4f} out of fold "
          f"({100 * rec['gain']:+.2f} pt, 95% CI [{100 * lo:+.2f}, {100 * hi:+.2f}])")
    verdict = "kept" if fit.kept else f"not supported at {args.level:g}: plain majority"
    print(f"weighting (β, γ) = {fit.candidate} {verdict} → {path} serves β = {fit.weights.beta:g}, "
          f"γ = {fit.weights.gamma:g}")
    return 0
