"""Benchmark: weighted votes and DeepConf's filter against plain majority at matched tokens, out of fold.

Per table and k (default 4, 8, 16), on the same seeded random k-subsets of every prompt's samples (the same
samples drawn and paid for by every method — only the vote differs; `isocompute.solver.votes`), 5-fold
cross-fitted over prompts:

* ``majority``      plain maj@k over answer classes (ties share credit) — the baseline;
* ``length-weighted``  w = (len/T)^−β, β fitted on the training folds (β > 0: shortness; completion tokens);
* ``confidence-weighted``  w = exp(γ·z(conf)), γ fitted (tables with ``confidence_min_window`` or ``logprob_mean``);
* ``length+conf``   both, (β, γ) fitted jointly (tables with confidence);
* ``deepconf-10`` / ``deepconf-90``  DeepConf's offline filter, keep the top η% of the k by confidence (by
  shortness on tables without confidence, labelled so), then majority; ``deepconf-fit``: η fitted;
* ``kept``          what `fit_vote` would serve, nested: per outer fold, the (β, γ) weighting cross-fitted on
  the training prompts and kept only where a one-sided paired bootstrap there supports its gain at 0.95.

Printed: out-of-fold accuracy, the difference vs majority in points with its 95% paired-bootstrap CI over
prompts, the Monte Carlo standard error of the difference (same subsets), and the candidates the folds chose;
then `fit_vote`'s decision on the whole table. ``--save-dir D`` writes D/<table>-k<k>.vote.json (the
``serve --vote`` file). ``--markdown`` prints the rows as a markdown table.

    .venv/bin/python bench/bench_weighted_votes.py /tmp/lat/gpt-oss-20b.jsonl /tmp/lat/Qwen3-14B.jsonl \
        /tmp/lat/Phi-4-reasoning.jsonl [--ks 4,8,16] [--draws 256] [--seed 0] [--markdown]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from isocompute.solver.outcomes import read_outcomes
from isocompute.solver.votes.fit import candidates, fit_vote, study
from isocompute.solver.votes.study import BETAS, ETAS, GAMMAS, Row, VoteStudy


def rows(vs: VoteStudy) -> list[Row]:
    has_conf = vs.ev.confidence is not None
    has_len = bool((~np.isnan(vs.ev.tokens[vs.ev.codes != -2])).any())
    out = [vs.majority]
    if has_len:
        out.append(vs.cross_fit("length-weighted", "weights", [(b, 0.0) for b in BETAS]))
    if has_conf:
        out.append(vs.cross_fit("confidence-weighted", "weights", [(0.0, g) for g in GAMMAS]))
        out.append(vs.cross_fit("length+conf", "weights", candidates(True)))
    by = vs.filter_evidence
    if by is not None:
        tag = "" if has_conf else " (by shortness)"
        out.append(vs.fixed(f"deepconf-10{tag}", "filter", 10.0))
        out.append(vs.fixed(f"deepconf-90{tag}", "filter", 90.0))
        out.append(vs.cross_fit(f"deepconf-fit{tag}", "filter", list(ETAS)))
    out.append(vs.kept("kept", candidates(has_conf)))
    return out


def chosen(r: Row) -> str:
    return " ".join(f"{c[0]:g},{c[1]:g}" if isinstance(c, tuple) else f"{c:g}" for c in r.chosen)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tables", nargs="+", type=Path)
    ap.add_argument("--ks", default="4,8,16")
    ap.add_argument("--draws", type=int, default=256, help="random k-subsets per prompt (shared by all methods)")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save-dir", type=Path, default=None)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    ks = [int(x) for x in args.ks.split(",")]
    md: list[str] = []
    for path in args.tables:
        table = read_outcomes(path)
        name = path.stem
        for k in ks:
            t0 = time.perf_counter()
            vs = study(table, k, folds=args.folds, seed=args.seed, draws=args.draws)
            result = rows(vs)
            fit = fit_vote(table, k, vs=vs)
            secs = time.perf_counter() - t0
            print(f"\n{name}  k={k}  prompts={len(table)}  subsets/prompt={vs.sub.idx.shape[1]}"
                  f"{' (all)' if vs.sub.exact else ''}  seed={args.seed}  {secs:.1f}s")
            print(f"  {'method':<28}{'accuracy':>9}  {'vs majority, pt [95% CI]':<26}{'MC se':>7}  folds chose")
            for r in result:
                b = r.vs_majority
                diff = "" if r is vs.majority else f"{100 * b.mean:+.2f} [{100 * b.low:+.2f}, {100 * b.high:+.2f}]"
                print(f"  {r.name:<28}{r.accuracy:>9.4f}  {diff:<26}{100 * r.mc_se:>7.3f}  {chosen(r)}")
                md.append(f"| {name} | {k} | {r.name} | {r.accuracy:.4f} | {diff or '—'} | {chosen(r)} |")
            rec = fit.record()
            print(f"  fit_vote on the whole table: kept={fit.kept}  candidate (β, γ)={fit.candidate}  "
                  f"gain lower bound {100 * rec['gain_lower_bound']:+.2f} pt → serves β={fit.weights.beta:g}, "
                  f"γ={fit.weights.gamma:g}")
            if args.save_dir is not None:
                args.save_dir.mkdir(parents=True, exist_ok=True)
                print(f"  saved {fit.weights.save(args.save_dir / f'{name}-k{k}.vote.json')}")
    if args.markdown:
        print("\n| table | k | method | accuracy | vs majority, pt [95% CI] | folds chose (β,γ or η) |")
        print("|---|---:|---|---:|---|---|")
        print("\n".join(md))


if __name__ == "__main__":
    main()
