"""Why do prompt features fail on real tables? How much of a prompt's difficulty is signal, how much of
that the features predict, and whether word-problem features or the problem's metadata add any.

Per outcome table, the target is each prompt's single-sample accuracy p̂_i = c_i / n_i (what the
policy's decisions hinge on: a prompt at 0 or 1 needs one sample, one near ½ may need many). Its
variance across prompts splits into sampling noise — mean_i p̂_i(1 − p̂_i)/(n_i − 1), the unbiased
binomial variance of each estimate — and signal, the rest. A LightGBM regressor is cross-validated
(5 folds × ``--seeds``) on p̂ with four inputs; printed is the out-of-fold R² and the share of the
*signal* variance it explains (R² × total / signal):

* ``policy features`` — :class:`~isocompute.policy.features.prompt.PromptFeatures` (hand counts + n-gram SVD),
  the named baseline;
* ``+ word problem`` — plus counts that describe a word problem: sentences, distinct numbers, decimals
  and fractions, percent and money signs, units of time, rate words (each, per, every, times, twice,
  half, total, remaining) and comparison words (more, less, than, left);
* ``+ metadata`` — plus what the source knows about the problem and a request does not carry: the
  MATH subject and level from the problem file (``--problems``), or nothing for other tables;
* ``metadata only``.

    .venv/bin/python bench/bench_feature_signal.py TABLE.jsonl [...] [--problems ../shared/data/math500_test.jsonl]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

from isocompute.policy.features.prompt import PromptFeatures
from isocompute.stages.inputs import read_table

RATE = ("each", "per", "every", "times", "twice", "half", "total", "remaining", "average")
COMPARE = ("more", "less", "than", "left", "fewer", "difference")
TIME = ("hour", "hours", "minute", "minutes", "day", "days", "week", "weeks", "year", "years")


def word_problem_features(prompts: list[str]) -> np.ndarray:
    rows = []
    for p in prompts:
        words = re.findall(r"[a-z]+", p.lower())
        nums = re.findall(r"\d+(?:\.\d+)?", p)
        rows.append([
            len(re.findall(r"[.!?](?:\s|$)", p)), len(set(nums)), sum("." in x for x in nums),
            len(re.findall(r"\d+/\d+|\\frac", p)), p.count("%") + words.count("percent"), p.count("$"),
            sum(w in TIME for w in words), sum(w in RATE for w in words), sum(w in COMPARE for w in words),
        ])
    return np.asarray(rows, dtype=np.float64)


def metadata(table, problems: Path | None) -> np.ndarray | None:
    """MATH subject (one-hot) and level per prompt, joined on the problem text; None without a problem file."""
    if problems is None:
        return None
    info = {}
    for line in problems.read_text().splitlines():
        r = json.loads(line)
        info[r["problem"].strip()] = (r.get("subject", ""), int(r.get("level", 0)))
    got = [info.get(p.strip()) for p in table.prompts]
    if sum(g is not None for g in got) < 0.9 * len(got):
        return None
    subjects = sorted({g[0] for g in got if g})
    return np.array([[float(g is not None and g[0] == s) for s in subjects] + [g[1] if g else 0.0]
                     for g in got])


def cv_r2(X: np.ndarray, y: np.ndarray, seeds: int) -> float:
    import lightgbm as lgb

    preds, ys = [], []
    for seed in range(seeds):
        parts = np.array_split(np.random.default_rng(seed).permutation(len(y)), 5)
        for f, te in enumerate(parts):
            tr = np.concatenate(parts[:f] + parts[f + 1:])
            m = lgb.LGBMRegressor(n_estimators=100, num_leaves=7, learning_rate=0.05, min_child_samples=20,
                                  subsample=0.8, subsample_freq=1, colsample_bytree=0.8, random_state=seed,
                                  verbose=-1, n_jobs=1).fit(X[tr], y[tr])
            preds.append(m.predict(X[te]))
            ys.append(y[te])
    p, t = np.concatenate(preds), np.concatenate(ys)
    return float(1 - ((t - p) ** 2).sum() / ((t - t.mean()) ** 2).sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tables", nargs="+", type=Path)
    ap.add_argument("--problems", type=Path, help="MATH problem file with subject and level (boinf tables)")
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    print("| table | prompts | n | total var | noise share | input | R² | of the signal |")
    print("|---|---:|---:|---:|---:|---|---:|---:|")
    for path in args.tables:
        t = read_table(path)
        n = t.n_samples.astype(float)
        y = t.n_correct / n
        total = float(y.var())
        noise = float(np.mean(y * (1 - y) / np.maximum(n - 1, 1)))
        signal = max(total - noise, 1e-12)
        X = PromptFeatures(n_components=16, seed=0).fit(t.prompts).transform(t.prompts)
        W = word_problem_features(t.prompts)
        M = metadata(t, args.problems)
        inputs = {"policy features": X, "+ word problem": np.column_stack([X, W])}
        if M is not None:
            inputs["+ metadata"] = np.column_stack([X, W, M])
            inputs["metadata only"] = M
        for name, Z in inputs.items():
            r2 = cv_r2(Z, y, args.seeds)
            print(f"| {path.parent.name if path.name == 'outcomes.jsonl' else path.stem} | {len(t)} | "
                  f"{int(n.mean())} | {total:.4f} | {noise / total:.2f} | {name} | {r2:+.3f} | "
                  f"{r2 * total / signal:+.2f} |", flush=True)


if __name__ == "__main__":
    main()
