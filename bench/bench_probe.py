"""Does the probe feature pay for itself? Text-only policy vs text + probe, in one cross-validation run.

The probe (:mod:`isocompute.engines.probe`) is the mean token entropy of a short greedy answer of the
table's own model. Every variant is cross-validated on the same folds (same seeds) of the outcome table
and scored at the same budgets; the named baseline is ``text`` (the policy without a probe):

* ``text`` — prompt-text features only;
* ``probe`` — text + probe, paying the probe's declared cost (its own prefill + decode, in samples);
* ``probe-shared`` — the same, priced as if the probe's prompt prefill were shared with the samples
  that follow (vLLM's automatic prefix caching): only its decode steps are paid;
* ``probe-free`` — the same features at cost 0: what the feature knows, not whether it is worth it.

Printed per budget and variant: held-out accuracy of the default learner and of each learner,
realised cost (probe included), imitation accuracy against the hindsight oracle, the gain over uniform,
and the paired difference to ``text`` (per-prompt utilities, bootstrap 95% CI over prompts) with the
ratio of accuracies — once for per-prompt decisions through the calibration table (whose realised
spend drifts a few percent from the budget, differently per variant) and once batch-matched
(``learned_batch``: every variant spends the budget to one prompt's step, the fairer comparison).

    .venv/bin/python bench/bench_probe.py [--table runs/demo/outcomes.jsonl] [--model runs/demo/tiny-sft]
        [--tokens 8] [--budgets 2,4,8] [--folds 5] [--seeds 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np

from isocompute.engines.probe import probe_flops
from isocompute.engines.probe_cache import compute_probe
from isocompute.evaluation.evaluate import LEARNERS, METHODS, cross_validate
from isocompute.flops import decode_flops, load_model_flops
from isocompute.policy.policy import PolicyConfig, ProbeSpec
from isocompute.solver.costs import cost_table
from isocompute.solver.estimators import utilities
from isocompute.stages.inputs import read_table

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", type=Path, default=ROOT / "runs/demo/outcomes.jsonl")
    ap.add_argument("--model", type=Path, default=ROOT / "runs/demo/tiny-sft")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--budgets", default="2,4,8")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--boot", type=int, default=2000)
    args = ap.parse_args()

    table = read_table(args.table)
    budgets = [float(b) for b in args.budgets.split(",")]
    t0 = time.perf_counter()
    res, key, how = compute_probe(table.prompts, args.model, args.tokens, "auto", cache_dirs=[])
    t_probe = time.perf_counter() - t0
    model = load_model_flops(args.model)
    p, m = res.prompt_tokens.astype(float), res.completion_tokens.astype(float)
    one = probe_flops(model, table.prompt_tokens, table.mean_completion_tokens)  # a sample: prefill + decode
    cost = float(probe_flops(model, p, m).sum() / one.sum())
    cost_shared = float(np.sum(decode_flops(model, p, m)) / one.sum())
    print(f"table {args.table} ({len(table)} prompts); probe: {args.tokens} greedy tokens of {args.model} "
          f"({key['prompt_format']}, {res.method}) in {t_probe:.1f} s — mean {res.values.mean():.3f} nats, "
          f"{m.mean():.2f} tokens; cost {cost:.4f} samples (prefix shared: {cost_shared:.4f}); "
          f"one sample = {one.mean():.4g} FLOPs")

    acts = (1, 2, 4, 8, 16)
    U = utilities(table, acts, "majority")
    C = cost_table(table.prompt_tokens, table.mean_completion_tokens, acts, unit="samples")
    base = PolicyConfig(actions=acts, budget_range=(1.0, 16.0))

    def with_probe(c: float) -> PolicyConfig:
        spec = ProbeSpec(max_tokens=args.tokens, cost=c, prompt_format=key["prompt_format"], model=str(args.model))
        return dataclasses.replace(base, budget_range=(1.0 + c, 16.0), probe=spec)

    variants = {"text": (base, None), "probe": (with_probe(cost), res.values),
                "probe-shared": (with_probe(cost_shared), res.values), "probe-free": (with_probe(0.0), res.values)}
    mi = {name: j for j, name in enumerate(METHODS)}
    seeds = tuple(range(args.seeds))
    out = {}
    for name, (cfg, probe) in variants.items():
        t0 = time.perf_counter()
        ok = [b for b in budgets if cfg.budget_range[0] <= b <= cfg.budget_range[1]]
        ev = cross_validate(table.prompts, U, C, cfg, ok, folds=args.folds, seeds=seeds, probe=probe)
        out[name] = (ok, ev)
        learners = [d for row in ev.default_learner for d in row]
        print(f"  {name}: {time.perf_counter() - t0:.0f} s; default learner per fold {learners}")

    idx = np.random.default_rng(0).integers(0, len(table), size=(args.boot, len(table)))
    for b in budgets:
        print(f"\nbudget {b:g} (mean samples per request, probe included)")
        print(f"  {'variant':<13} {'learned':>8} {'classif.':>8} {'utility':>8} {'cost':>7} {'imitation':>9} "
              f"{'vs uniform':>10}   {'vs text (paired, 95% CI)':<30} {'ratio':>6}   batch-matched: "
              f"{'acc':>6} {'cost':>6} {'vs text (paired, 95% CI)':<30}")
        ref = ref_b = None
        for name, (ok, ev) in out.items():
            if b not in ok:
                print(f"  {name:<13} (budget below the cheapest action + the probe)")
                continue
            bi = ok.index(b)
            u = ev.utility[:, mi["learned"], bi].mean(axis=0)
            ub = ev.utility[:, mi["learned_batch"], bi].mean(axis=0)
            cb = float(ev.cost[:, mi["learned_batch"], bi].mean())
            acc = float(u.mean())
            per = [ev.utility[:, mi[f"learned_{lrn}"], bi].mean() for lrn in LEARNERS]
            uni = float(ev.utility[:, mi["uniform"], bi].mean())
            imit = float((ev.learned_actions[:, bi] == ev.oracle_actions[:, bi]).mean())
            c = float(ev.cost[:, mi["learned"], bi].mean())
            line = (f"  {name:<13} {acc:8.4f} {per[0]:8.4f} {per[1]:8.4f} {c:7.3f} {imit:9.3f} "
                    f"{100 * (acc / uni - 1):+9.1f}%")
            if name == "text":
                ref, ref_b = u, ub
                line += f"   {'(baseline)':<30} {'':>6}   {'':>14} {float(ub.mean()):6.4f} {cb:6.3f}"
            elif ref is not None and ref_b is not None:
                line += f"   {_paired(u, ref, idx)} {acc / float(ref.mean()):6.3f}   {'':>14} "
                line += f"{float(ub.mean()):6.4f} {cb:6.3f} {_paired(ub, ref_b, idx)}"
            print(line)
        oracle = float(out["text"][1].utility[:, mi["oracle"], out["text"][0].index(b)].mean()) \
            if b in out["text"][0] else float("nan")
        print(f"  oracle {oracle:.4f}, uniform {uni:.4f}")


def _paired(u: np.ndarray, ref: np.ndarray, idx: np.ndarray) -> str:
    """Mean per-prompt difference and its bootstrap 95% CI (prompts resampled, both methods together)."""
    d = (u - ref)[idx].mean(axis=1)
    lo, hi = np.percentile(d, [2.5, 97.5])
    return f"{float((u - ref).mean()):+.4f} [{lo:+.4f}, {hi:+.4f}]{'' if lo > 0 or hi < 0 else ' n.s.':<5}"


if __name__ == "__main__":
    main()
