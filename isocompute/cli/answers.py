"""Fits on a table's answers: ``isocompute vote`` (a weighted vote) and ``isocompute evidence`` (evidence plans).

``isocompute vote`` fits a weighted vote on an outcome table at one k and writes ``vote.json`` for serving.

The work is :func:`isocompute.solver.votes.fit.fit_vote`: the weight w = (len/T)^−β · exp(γ·z(confidence))
(γ only where every sample carries ``confidence_min_window`` or ``logprob_mean``) cross-fitted over prompt
folds on shared random k-subsets, kept only where a one-sided paired bootstrap of its out-of-fold gain over
plain majority supports it at ``--level``; otherwise the file holds β = γ = 0 (plain majority). The printed
summary gives both out-of-fold accuracies and the gain's 95% CI; ``isocompute serve --vote vote.json`` then
answers ``strategy: "weighted"`` with it; a fit with γ ≠ 0 makes every wave of such a request ask for logprobs
(1.07× the tokens' price). ``--no-confidence`` fits the length term alone (γ = 0), for upstreams that cannot
return logprobs or traffic that should not pay for them. Example::

    isocompute vote runs/real/math500_gpt-oss-20b.jsonl --k 8 --out runs/vote.json

``isocompute evidence TABLE --policy DIR --out DIR2`` fits the learned continuation of evidence-aware plans
(:func:`isocompute.policy.evidence.model.fit_evidence`: walks of the parallel-stop schedule ``--waves`` drawn
from each prompt's samples, LightGBM heads cross-fitted over ``--folds``, the chain against the best fixed
mixture per budget) and writes the tokens-unit policy in DIR again to DIR2 with ``evidence.json`` beside it,
which ``serve --policy DIR2`` serves (:mod:`isocompute.policy.evidence.serving`). It prints, per budget and
latency level, which rule the chain keeps. Example::

    isocompute evidence runs/real/math500_gpt-oss-20b.jsonl --policy /tmp/pol-tok --out /tmp/pol-ev
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    _register_vote(subparsers)
    e = subparsers.add_parser("evidence", help="fit evidence-aware plans (learned continuation) into a policy",
                              description=__doc__.split("\n\n")[3], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    e.add_argument("table", type=Path, help="outcome table (JSONL) with completion_tokens on every sample")
    e.add_argument("--policy", type=Path, required=True, help="a policy fitted with --cost-unit tokens")
    e.add_argument("--out", type=Path, required=True, help="where to write the policy with evidence.json")
    e.add_argument("--waves", default="4,8", help="the parallel-stop schedule, e.g. 4,8")
    e.add_argument("--folds", type=int, default=5)
    e.add_argument("--draws", type=int, default=16, help="walks per prompt to learn from (and to score)")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--level", type=float, default=0.95, help="one-sided bootstrap level to keep the evidence rule")
    e.add_argument("--confidence", action="store_true",
                   help="the heads also read each sample's confidence (the table's confidence_min_window); the "
                        "gateway then asks its streamed waves for logprobs=5, priced at LOGPROB_COST_FACTOR")
    _target_argument(e)
    e.set_defaults(func=run_evidence)


def _target_argument(p: Any) -> None:
    p.add_argument("--target", choices=("gold", "consensus"), default=None,
                   help="what a sample is credited against: its gold verdict, or agreement with its prompt's "
                        "plurality answer (default: gold when every sample has 'correct', else consensus; evidence: "
                        "the policy's own)")


def run_evidence(args: argparse.Namespace) -> int:
    from isocompute.errors import InputError
    from isocompute.policy.evidence.model import fit_evidence
    from isocompute.policy.evidence.serving import EvidencePolicy
    from isocompute.policy.loading import load_policy
    from isocompute.stages.inputs import read_table, target_line

    try:
        waves = tuple(int(w) for w in args.waves.split(","))
    except ValueError:
        raise InputError(f"--waves must be sample counts separated by commas, e.g. 4,8; got {args.waves!r}") from None
    if not 0.5 <= args.level < 1 or args.folds < 2 or args.draws < 1 or not waves or min(waves) < 1:
        raise InputError("--level must be in [0.5, 1), --folds ≥ 2, --draws ≥ 1 and every wave ≥ 1")
    policy = load_policy(args.policy)
    policy = getattr(policy, "policy", policy)  # refitting evidence on a policy that has some replaces it
    fitted_on = policy.config.target
    if args.target is not None and fitted_on is not None and args.target != fitted_on:
        raise InputError(f"the policy {args.policy} was fitted under target {fitted_on}; fit its evidence plans under "
                         f"the same one (drop --target, or refit the policy with --target {args.target}).")
    table = read_table(args.table, args.target or fitted_on)
    print(target_line(table))
    model = fit_evidence(table, waves, menu=list(policy.plans) or None, folds=args.folds, draws=args.draws, eval_draws=args.draws, seed=args.seed,
                         level=args.level, use_confidence=args.confidence)
    out = EvidencePolicy(policy, model).save(args.out)
    x = model.tokens_per_sample / model.unit
    for e in model.entries:
        lb = "none" if e.latency_budget is None else f"{e.latency_budget / x:.2f}"
        gain = "" if e.gain is None else f"  gain {100 * e.gain:+.2f} pt (bound {100 * e.gain_low:+.2f})"
        print(f"budget {e.budget / x:5.2f}x  latency ≤ {lb:>4}  → {e.rule:10s} tokens {e.tokens / x:.2f}x "
              f"latency {e.latency / x:.3f} accuracy {e.utility:.4f}{gain}")
    print(f"evidence plans ({','.join(f'{w}s' for w in waves)}) → {out}")
    return 0


def _register_vote(subparsers: Any) -> None:
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
                   help="fit the length weight alone (γ = 0): served without logprobs")
    p.add_argument("--json", action="store_true", help="print the fit record as one JSON object")
    _target_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from isocompute.errors import InputError
    from isocompute.solver.votes.fit import fit_vote
    from isocompute.stages.inputs import read_table, target_line

    if not 0.5 <= args.level < 1 or args.folds < 2 or args.draws < 1:
        raise InputError("--level must be in [0.5, 1), --folds ≥ 2 and --draws ≥ 1")
    table = read_table(args.table, args.target)
    fit = fit_vote(table, args.k, folds=args.folds, seed=args.seed, draws=args.draws,
                   level=args.level, use_confidence=not args.no_confidence)
    if fit.weights.fit is not None:
        fit.weights.fit["target"] = table.target  # vote.json records what the fit credited
    path = fit.weights.save(args.out)
    rec = fit.weights.fit or {}
    if args.json:
        print(json.dumps({**rec, "beta": fit.weights.beta, "gamma": fit.weights.gamma, "out": str(path)}))
        return 0
    print(target_line(table))
    lo, hi = rec["gain_ci95"]
    print(f"k = {args.k}: majority {rec['majority_oof']:.4f}, weighted {rec['weighted_oof']:.4f} out of fold "
          f"({100 * rec['gain']:+.2f} pt, 95% CI [{100 * lo:+.2f}, {100 * hi:+.2f}])")
    verdict = "kept" if fit.kept else f"not supported at {args.level:g}: plain majority"
    print(f"weighting (β, γ) = {fit.candidate} {verdict} → {path} serves β = {fit.weights.beta:g}, "
          f"γ = {fit.weights.gamma:g}")
    return 0
