"""How well a sample's own evidence separates right from wrong samples, read off an outcome table written by
``isocompute sample --logprobs K``: per-sample accuracy, mean completion tokens, how many samples carry
``logprob_mean`` / ``confidence_min_window``, and the ROC AUC (sklearn ``roc_auc_score``, correct = positive)
of ``logprob_mean``, of ``confidence_min_window`` and of ``−completion_tokens`` (shorter = more likely
right, the usual direction), over every sample that has the field; with a 95% bootstrap interval over
prompts (samples of one prompt move together), 2,000 resamples. An AUC of 0.5 separates nothing; below
0.5 the field points the other way.

    .venv/bin/python bench/bench_confidence_auc.py /tmp/smol/arith_logprobs.jsonl [--json OUT]

Ignores: within-prompt ranking (what a vote would use; the AUC here pools every prompt's samples).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from sklearn.metrics import roc_auc_score

from isocompute.solver.outcomes import read_outcomes


def auc_with_interval(score: np.ndarray, correct: np.ndarray, mask: np.ndarray, seed: int = 0,
                      rounds: int = 2000) -> tuple[float, float, float]:
    """AUC over the masked entries of (N, n) arrays, and a percentile bootstrap over the N prompts (NaNs
    when the samples are all right or all wrong: nothing to separate)."""
    if correct[mask].all() or not correct[mask].any():
        return float("nan"), float("nan"), float("nan")
    auc = float(roc_auc_score(correct[mask], score[mask]))
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(rounds):
        rows = rng.integers(0, score.shape[0], score.shape[0])
        y, m = correct[rows], mask[rows]
        if y[m].all() or not y[m].any():
            continue
        boots.append(roc_auc_score(y[m], score[rows][m]))
    return auc, float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))


def _mean(x: np.ndarray) -> float:
    return float(x.mean()) if x.size else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("table")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    t = read_outcomes(args.table)
    correct, mask = t.correct, t.mask
    out: dict = {"prompts": len(t), "samples": int(mask.sum()), "accuracy": float(correct[mask].mean()),
                 "mean_completion_tokens": float(np.nanmean(t.completion_tokens[mask])), "meta": {
                     k: t.meta.get(k) for k in ("model", "engine", "temperature", "max_tokens", "logprobs",
                                                "confidence_window")}}
    fields = {"logprob_mean": t.logprob_mean, "confidence_min_window": t.confidence_min_window,
              "-completion_tokens": -t.completion_tokens}
    for name, x in fields.items():
        if x is None:
            out[name] = {"samples_with_it": 0}
            continue
        have = mask & ~np.isnan(x)
        auc, lo, hi = auc_with_interval(np.nan_to_num(x), correct, have)
        out[name] = {"samples_with_it": int(have.sum()), "auc": auc, "auc_95": [lo, hi],
                     "mean_right": _mean(x[have & correct]), "mean_wrong": _mean(x[have & ~correct])}
    print(f"{out['prompts']} prompts × {out['samples'] / out['prompts']:.0f} samples; per-sample accuracy "
          f"{out['accuracy']:.4f}; mean completion tokens {out['mean_completion_tokens']:.1f}; meta {out['meta']}")
    for name in fields:
        f = out[name]
        if not f["samples_with_it"]:
            print(f"{name}: no sample has it")
            continue
        print(f"{name}: {f['samples_with_it']} samples; AUC {f['auc']:.3f} (95% {f['auc_95'][0]:.3f}–"
              f"{f['auc_95'][1]:.3f}); mean right {f['mean_right']:.3f}, wrong {f['mean_wrong']:.3f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
