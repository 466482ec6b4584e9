"""``isocompute report --outcomes NAME=TABLE … --policy DIR``: a multi-model policy's held-out report.

The tables go through the same pipeline as ``fit`` (:func:`isocompute.cli.models_input.load_estimates`)
with the menu the policy was fitted on (its ``--actions``, ``--plans``, ``--orders`` and
``--max-actions``, stored in policy.json's ``training_data.menu``); then
:func:`isocompute.evaluation.report_models.evaluate_models` refits the policy's configuration on each fold's
training part and scores every method at every budget. The budget grid runs from the cheapest model's
1-sample cost to the dearest model's 16-sample cost (``--n-budgets`` log-spaced points), or ``--budgets``.
Writes a ``report`` artifact: report.json, report.md and accuracy_flops.png.

Ignores: ``--holdout`` (a multi-model report always cross-validates) and the probe (a multi-model policy
has none).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from isocompute.errors import InputError


def run_models(args: argparse.Namespace) -> int:
    from isocompute.artifacts import artifact_writer, sha256_file
    from isocompute.cli.fit import parse_budgets
    from isocompute.cli.models_input import load_estimates
    from isocompute.cli.report import parse_seeds
    from isocompute.evaluation.report import KIND, SCHEMA_VERSION, _finite
    from isocompute.evaluation.report_models import (
        budget_grid,
        evaluate_models,
        plot_accuracy_flops,
        render_markdown,
    )
    from isocompute.policy.policy import Policy

    policy = Policy.load(args.policy)
    if not policy.models:
        raise InputError(f"{args.policy} is a single-model policy; report it on its one table (positional), or fit a "
                         "multi-model policy with isocompute fit --outcomes NAME=TABLE ….")
    if args.holdout:
        raise InputError("a multi-model report cross-validates on the tables; drop --holdout.")
    menu = (getattr(policy, "training_data_", None) or {}).get("menu") or {}
    args.plans, args.orders = menu.get("plans"), int(menu.get("orders", args.orders))
    me, inputs = load_estimates(args, policy.config.actions)
    if set(me.models) != set(policy.models):
        raise InputError(f"the policy was fitted on the models {list(policy.models)}; --outcomes names {list(me.models)}.")
    inputs["policy_manifest"] = sha256_file(Path(args.policy) / "manifest.json")
    budgets = parse_budgets(args.budgets) if args.budgets is not None else budget_grid(me, args.n_budgets).tolist()
    config = policy.config  # fit_multi_policy replaces its menu per fold
    report = evaluate_models(me, config, budgets, folds=args.folds, seeds=parse_seeds(args.seeds),
                             max_actions=int(menu.get("max_actions", len(policy.plans))),
                             learn_on=menu.get("learn_on", "hull"), fallback=policy.config.fallback,
                             n_boot=args.bootstrap,
                             seed=args.seed, progress=True)
    report["policy"] = {"path": str(args.policy), "default_learner": policy.default_learner_,
                        "config": policy.config.to_dict(), "menu": menu}
    report = _finite(report)
    with artifact_writer(args.out, kind=KIND, schema_version=SCHEMA_VERSION, inputs=inputs,
                         params={"folds": args.folds, "seeds": args.seeds, "budgets": budgets,
                                 "bootstrap": args.bootstrap, "seed": args.seed}) as d:
        (d / "report.json").write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
        (d / "report.md").write_text(render_markdown(report))
        plot_accuracy_flops(report, d / "accuracy_flops.png")
    print(render_markdown(report))
    print(f"report → {args.out}")
    return 0


def register_args(p: Any) -> None:
    p.add_argument("--n-budgets", type=int, default=10,
                   help="several models: log-spaced budgets from the cheapest model's 1-sample cost to the dearest "
                        "model's 16-sample cost")
