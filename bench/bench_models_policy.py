"""Benchmark: the learned multi-model policy against the best single model, at matched realised FLOPs.

Runs what a user runs — ``isocompute fit`` and ``isocompute report`` with ``--outcomes NAME=TABLE`` per
model and ``--model-params`` (MoE: active parameters) — on the three MATH-500 dumps (gpt-oss-20b,
Phi-4-reasoning, Qwen3-14B; import commands in docs/import-and-formats.md), then prints from
the report, per budget (log grid from the cheapest model's 1-sample cost to the dearest model's
16-sample cost; 5-fold CV × ``--seeds``):

* the learned policy as served (and the rules that served) against the named baseline, the best single
  model with its best fixed plan chosen on the training folds at the learned policy's realised FLOPs:
  accuracy, realised FLOPs, the relative gain with its 95% paired-bootstrap CI, and the verdict against
  the targets — never below (CI upper end ≥ 0) and strictly above somewhere (CI lower end > 0);
* each model's uniform maj@16 accuracy, the FLOPs at which the learned policy (and the best fixed
  cascade) first reach it, as a fraction of maj@16's FLOPs (target ≤ 1/4; MISS when never reached).

    nice -n 5 .venv/bin/python bench/bench_models_policy.py \\
        gpt-oss-20b=runs/real/math500_gpt-oss-20b.jsonl Phi-4-reasoning=runs/real/math500_Phi-4-reasoning.jsonl \\
        Qwen3-14B=runs/real/math500_Qwen3-14B.jsonl \\
        --model-params gpt-oss-20b=3.6e9 Phi-4-reasoning=14e9 Qwen3-14B=14.8e9 --align-cache runs/real/align.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from isocompute.errors import IsoComputeError
from isocompute.stages.fit import FitConfig, fit
from isocompute.stages.options import parse_config
from isocompute.stages.report import ReportConfig, report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tables", nargs="+", help="NAME=TABLE.jsonl, one per model")
    ap.add_argument("--model-params", nargs="+", required=True, help="NAME=ACTIVE_PARAMS per model")
    ap.add_argument("--align-cache", type=Path, default=None)
    ap.add_argument("--seeds", default="3", help="CV seeds of the report")
    ap.add_argument("--n-budgets", type=int, default=10)
    ap.add_argument("--fit-args", default="", help="extra flags for isocompute fit, e.g. '--max-actions 20'")
    ap.add_argument("--work", type=Path, default=None, help="directory for the policy and report (default: temp)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_models_policy_"))
    common = [x for t in args.tables for x in ("--outcomes", t)]
    common += [x for p in args.model_params for x in ("--model-params", p)]
    if args.align_cache:
        common += ["--align-cache", str(args.align_cache)]
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        fit(parse_config(FitConfig, [*common, *args.fit_args.split(), "--out", str(work / "policy")],
                         prog="isocompute fit"))
    except IsoComputeError as e:
        raise SystemExit(f"fit failed: {e}") from None
    t1, c1 = time.perf_counter(), time.process_time()
    try:
        res = report(parse_config(ReportConfig, [*common, "--policy", str(work / "policy"), "--out", str(work / "report"),
                                                 "--seeds", args.seeds, "--n-budgets", str(args.n_budgets)],
                                  prog="isocompute report"))
    except IsoComputeError as e:
        raise SystemExit(f"report failed: {e}") from None
    print(res.markdown)
    print(f"report → {res.out}")
    t2, c2 = time.perf_counter(), time.process_time()
    rep = json.loads((work / "report" / "report.json").read_text())
    print(f"\nfit {t1 - t0:.0f} s ({c1 - c0:.0f} s CPU), report {t2 - t1:.0f} s ({c2 - c1:.0f} s CPU) on a shared "
          f"2-core machine; {rep['n_prompts']} prompts, {rep['folds']}-fold CV × seeds {rep['seeds']}; menu "
          f"{rep['menu_actions']} actions, {rep['kept_actions'][0]}–{rep['kept_actions'][1]} kept per fold; artifacts in {work}")
    print("\n| budget FLOPs | learned as served (rules) | best single model, fixed plan, same FLOPs | gain [95% CI] | "
          "never below | strictly above |")
    print("|---|---|---|---|---|---|")
    above = False
    for e in rep["budgets"]:
        m, g = e["methods"], e["gain_vs_best_single"]
        lo, hi = g["ci95"]
        strictly = lo > 0 and g["relative"] >= 1e-4  # a CI above 0 on a gain below 0.01% is no gain
        above |= strictly
        rules = ", ".join(f"{r} {100 * s:.0f}%" for r, s in m["learned"]["rules"].items())
        print(f"| {e['budget']:.3g} | {m['learned']['accuracy']:.4f} at {m['learned']['cost']:.3g} ({rules}) | "
              f"{m['best_single']['accuracy']:.4f} at {m['best_single']['cost']:.3g} ({m['best_single']['model']}) | "
              f"{100 * g['relative']:+.2f}% [{100 * lo:+.2f}, {100 * hi:+.2f}] | {'yes' if hi >= 0 else 'NO (MISS)'} | "
              f"{'yes' if strictly else 'no'} |")
    print(f"\nstrictly above the best single model somewhere (CI excluding 0): {'yes' if above else 'MISS'}")
    print("\n| model | maj@16 accuracy | maj@16 FLOPs | learned reaches it at (realised) | fraction | fixed cascade at | "
          "fraction |")
    print("|---|---|---|---|---|---|---|")
    for r in rep["reach"]:
        def frac(x: float | None) -> str:
            return "MISS (never)" if x is None else f"{x:.3f}" + ("" if x <= 0.25 else " MISS (> 1/4)")
        lf = "—" if r["learned_flops"] is None else f"{r['learned_flops']:.3g}"
        cf = "—" if r["cascade_budget"] is None else f"{r['cascade_budget']:.3g}"
        print(f"| {r['model']} | {r['accuracy']:.4f} | {r['flops']:.3g} | {lf} | {frac(r['learned_fraction'])} | {cf} | "
              f"{frac(r['cascade_fraction'])} |")


if __name__ == "__main__":
    main()
