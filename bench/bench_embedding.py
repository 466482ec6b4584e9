"""What the optional ``minilm`` prompt feature costs and whether it pays on the demo table.

Cost: the encoder's FLOPs per prompt (analytic, :func:`isocompute.policy.features.embedding.encoder_flops`), the
same in samples of the table's model (its FLOPs per sample from the outcome table's token counts and
model config), and CPU time per prompt (batches of 64, and one prompt alone; 1 torch thread).

Value: ``Policy(learner="utility")`` fitted on the table with the plain text features and with
``extras=("minilm",)``; the number compared is the policy's own selection score, the mean out-of-fold
accuracy over 9 budgets (3-fold cross-fit, each prompt decided by the member that never saw it). Twice:

* ``free``: the embedding's cost not charged, budgets 1…16 samples — what the feature *knows*;
* ``charged``: every action of the minilm policy costs k + c_e (c_e its cost in samples), both policies
  at the same total budgets (1 + c_e)…16 — what it is worth at equal compute.

    .venv/bin/python bench/bench_embedding.py [--table runs/demo/outcomes.jsonl] [--components 8]

Needs the embed extra (``pip install 'isocompute[embed]'``). The policy has no option naming feature
extras yet, so this script hands the policy a PromptFeatures with extras (a stand-in for that option).
"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path

import numpy as np

import isocompute.policy.policy as policy_module
from isocompute.flops import ModelFlops
from isocompute.policy.features.embedding import MiniLM
from isocompute.policy.features.prompt import PromptFeatures
from isocompute.policy.policy import Policy, PolicyConfig
from isocompute.solver.costs import cost_table
from isocompute.solver.estimators import utilities
from isocompute.solver.outcomes import read_outcomes

ROOT = Path(__file__).resolve().parents[1]


def fit(prompts, U, C, budget_range, extras, components, seed):
    policy_module.PromptFeatures = functools.partial(PromptFeatures, extras=extras, extra_components=components)
    try:
        cfg = PolicyConfig(learner="utility", budget_range=budget_range, seed=seed)
        return Policy(cfg).fit_arrays(prompts, U, C)
    finally:
        policy_module.PromptFeatures = PromptFeatures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", type=Path, default=ROOT / "runs" / "demo" / "outcomes.jsonl")
    ap.add_argument("--components", type=int, default=8, help="embedding columns (PCA on the training prompts)")
    ap.add_argument("--seeds", type=int, default=1, help="policy seeds (folds, LightGBM) to average over")
    args = ap.parse_args()

    table = read_outcomes(args.table)
    prompts = list(table.prompts)
    actions = PolicyConfig().actions
    U = utilities(table, actions, "majority")
    C = cost_table(table.prompt_tokens, table.mean_completion_tokens, actions, unit="samples")
    print(f"{args.table.relative_to(ROOT)}: {len(prompts)} prompts, actions {list(actions)}, majority vote")

    enc = MiniLM()
    flops = enc.flops(prompts)
    t0 = time.process_time()
    enc.encode(prompts)
    batch_ms = (time.process_time() - t0) / len(prompts) * 1e3
    t0 = time.process_time()
    for p in prompts[:100]:
        enc.encode([p])
    one_ms = (time.process_time() - t0) / 100 * 1e3
    cfg = (table.meta or {}).get("model_config")
    print(f"\nminilm cost per prompt: {flops.mean():.4g} FLOPs (wordpieces {enc.token_counts(prompts).mean():.1f} "
          f"on average); CPU {batch_ms:.2f} ms in batches of 64, {one_ms:.2f} ms alone (1 thread)")
    if cfg:
        model = ModelFlops.from_config(cfg)
        sample = cost_table(table.prompt_tokens, table.mean_completion_tokens, (1,), unit="flops", model=model)[:, 0]
        c_e = float(flops.mean() / sample.mean())
        print(f"one sample of the table's model ({model.n_params:,} parameters) costs {sample.mean():.4g} FLOPs: "
              f"the embedding costs c_e = {c_e:.3g} samples per request")
    else:
        c_e = None
        print("the table names no model config: the cost in samples is unknown; 'charged' is skipped")

    rows = [("free", (1.0, 16.0), 0.0)]
    if c_e is not None and 1 + c_e < 16:
        rows.append(("charged", (1.0 + c_e, 16.0), c_e))
    print(f"\nmean out-of-fold accuracy over 9 budgets, {args.seeds} seed(s) (per-seed differences in brackets)")
    print(f"{'':8} {'budgets':>14} {'text features':>14} {'+ minilm':>9} {'difference':>10}")
    for name, rng, charge in rows:
        diffs, acc = [], []
        for seed in range(args.seeds):
            plain = fit(prompts, U, C, rng, (), args.components, seed).selection_["scores"]["utility"]
            emb = fit(prompts, U, C + charge, rng, ("minilm",), args.components, seed).selection_["scores"]["utility"]
            acc.append((plain["heldout_accuracy"], emb["heldout_accuracy"]))
            diffs.append(emb["heldout_accuracy"] - plain["heldout_accuracy"])
        a, b = np.mean(acc, axis=0)
        print(f"{name:8} {rng[0]:6.3g}…{rng[1]:<6.3g} {a:>14.4f} {b:>9.4f} {b - a:>+10.4f}  "
              f"[{', '.join(f'{d:+.4f}' for d in diffs)}]")
    if c_e is not None and 1 + c_e >= 16:
        print(f"charged: not run — the embedding alone costs {c_e:.3g} samples, beyond the 16-sample budget")


if __name__ == "__main__":
    main()
