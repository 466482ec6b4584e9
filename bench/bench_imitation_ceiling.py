"""Is imitation accuracy limited by the features or by the labels? Oracle labels predicted from ever
better inputs, on an arith outcome table.

The report's imitation accuracy compares the calibrated policy with the hindsight oracle. Here the
question is narrower: how well can *any* classifier predict the oracle's actions from what is known
about a prompt before sampling it? For each budget the oracle's actions over the whole table are the
labels (the solver, deterministic rounding), and a LightGBM classifier is cross-validated on them
(5 folds × ``--seeds``, not calibrated to the budget, so it is free to spend what the oracle spends)
with four inputs:

* ``majority class`` — no input: always the most frequent label (the named baseline);
* ``policy features`` — the policy's prompt-text features (:class:`PromptFeatures`: hand counts, the
  expression block, hashed n-grams reduced by an SVD fitted on each fold's training part);
* ``generator metadata`` — the arith generator's own description of each problem (difficulty level,
  operands, digits, carries/borrows, steps, whether it multiplies): everything that decides how hard a
  problem is, known exactly — more than any prompt feature can know;
* ``both``.

Next to them, the label-noise ceiling of :mod:`isocompute.policy.learn.label_noise` (bootstrap redraws of
each prompt's samples): if even the generator metadata stays near the majority class while the
ceiling is far above, the oracle's labels vary *within* problems of the same kind — set by which
samples the model happened to draw — and no prompt feature can recover them.

    .venv/bin/python bench/bench_imitation_ceiling.py runs/demo/outcomes.jsonl [--budgets 2,4] [--seeds 3]

Needs an arith table whose ids are ``arith-<data seed>-<index>`` (what ``isocompute sample --task
arith`` writes); the metadata is regenerated from them.
"""

from __future__ import annotations

import argparse
import re
import time

import numpy as np

from isocompute.errors import InputError
from isocompute.policy.features.prompt import PromptFeatures
from isocompute.policy.learn.label_noise import oracle_label_agreement
from isocompute.solver.allocate import allocate
from isocompute.solver.estimators import utilities
from isocompute.solver.outcomes import read_outcomes
from isocompute.tasks import arith

META = ("difficulty", "n_operands", "digits", "carries", "steps")
_ID = re.compile(r"^arith-(\d+)-(\d+)$")


def generator_metadata(ids: list[str]) -> np.ndarray:
    """One row per id: :data:`META` and whether the expression multiplies, from the arith generator."""
    keys = []
    for i in ids:
        m = _ID.match(i)
        if not m:
            raise InputError(f"id {i!r} is not an arith id 'arith-<seed>-<index>'; this bench needs a table "
                             "written by `isocompute sample --task arith`.")
        keys.append((int(m[1]), int(m[2])))
    by_seed: dict[int, list] = {}
    for seed in {s for s, _ in keys}:
        by_seed[seed] = arith.generate(1 + max(k for s, k in keys if s == seed), seed)
    rows = []
    for seed, k in keys:
        meta = by_seed[seed][k].meta
        rows.append([float(meta[name]) for name in META] + [float("*" in meta["expression"])])
    return np.asarray(rows)


def fold_text_features(prompts: list[str], seeds: int) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
    """(seed, fold) → the policy's features of that fold's training and held-out prompts, the SVD fitted
    on the training part; computed once and shared by every budget and input set."""
    from sklearn.model_selection import KFold

    out = {}
    for seed in range(seeds):
        for f, (tr, te) in enumerate(KFold(5, shuffle=True, random_state=seed).split(prompts)):
            pf = PromptFeatures(seed=seed).fit([prompts[i] for i in tr])
            out[seed, f] = pf.transform([prompts[i] for i in tr]), pf.transform([prompts[i] for i in te])
    return out


def cross_validated(X: np.ndarray | None, text: dict | None, y: np.ndarray, *, seeds: int) -> float:
    """Mean held-out label accuracy of a LightGBM classifier over 5 folds × ``seeds``, on ``X`` and/or
    the per-fold text features ``text`` (:func:`fold_text_features`)."""
    import lightgbm as lgb
    from sklearn.model_selection import KFold

    scores = []
    for seed in range(seeds):
        pred = np.zeros_like(y)
        for f, (tr, te) in enumerate(KFold(5, shuffle=True, random_state=seed).split(y)):
            parts_tr, parts_te = [], []
            if text is not None:
                parts_tr.append(text[seed, f][0])
                parts_te.append(text[seed, f][1])
            if X is not None:
                parts_tr.append(X[tr])
                parts_te.append(X[te])
            if not parts_tr:  # majority class of the training part
                pred[te] = np.bincount(y[tr]).argmax()
                continue
            clf = lgb.LGBMClassifier(n_estimators=200, learning_rate=0.05, num_leaves=15, min_child_samples=10,
                                     random_state=seed, n_jobs=1, verbose=-1)
            clf.fit(np.hstack(parts_tr), y[tr])
            pred[te] = clf.predict(np.hstack(parts_te))
        scores.append(float((pred == y).mean()))
    return float(np.mean(scores))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("table", help="arith outcome table (JSONL)")
    ap.add_argument("--actions", default="1,2,4,8,16")
    ap.add_argument("--strategy", default="majority")
    ap.add_argument("--budgets", default="2,4")
    ap.add_argument("--seeds", type=int, default=3, help="cross-validation repeats (5 folds each)")
    ap.add_argument("--label-reps", type=int, default=20, help="bootstrap redraws for the label-noise ceiling")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    table = read_outcomes(args.table)
    actions = [int(a) for a in args.actions.split(",")]
    budgets = [float(b) for b in args.budgets.split(",")]
    U = utilities(table, actions, args.strategy)
    C = np.tile(np.asarray(actions, dtype=float), (U.shape[0], 1))
    meta = generator_metadata(list(table.ids))
    prompts = list(table.prompts)
    text_features = fold_text_features(prompts, args.seeds)
    noise = oracle_label_agreement(table, U, C, actions, args.strategy, budgets, reps=args.label_reps)
    print(f"{args.table}: {len(prompts)} prompts, actions {actions}, {args.strategy}; LightGBM classifier, "
          f"5 folds x {args.seeds} seeds, label accuracy on held-out prompts")
    print(f"{'budget':>6} | {'oracle cost':>11} | {'majority class':>14} | {'policy features':>15} | "
          f"{'generator metadata':>18} | {'both':>6} | {'label-noise ceiling':>19}")
    for j, b in enumerate(budgets):
        y = allocate(U, C, b, rounding="deterministic").actions
        cost = float(C[np.arange(len(y)), y].mean())
        base = cross_validated(None, None, y, seeds=args.seeds)
        text = cross_validated(None, text_features, y, seeds=args.seeds)
        gen = cross_validated(meta, None, y, seeds=args.seeds)
        both = cross_validated(meta, text_features, y, seeds=args.seeds)
        print(f"{b:>6g} | {cost:>11.3f} | {base:>14.3f} | {text:>15.3f} | {gen:>18.3f} | {both:>6.3f} | "
              f"{noise['ceiling'][j]:>19.3f}")
    print(f"wall time {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
