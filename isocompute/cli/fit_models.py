"""``isocompute fit --outcomes NAME=TABLE …``: a multi-model policy from several models' outcome tables.

Reads the tables and runs the pipeline of :mod:`isocompute.cli.models_input` (join by id → aligned
classes → FLOPs → the menu's estimates), fits :func:`isocompute.policy.multi.fit.fit_multi_policy` with
the flags' config (cost unit FLOPs; the menu, learners and chain from ``--max-actions``, ``--learn-on``,
``--fallback-rules``), writes the ``policy`` artifact (the menu settings in ``training_data.menu``, so
``report`` rebuilds the same menu) and prints the chain. Ignores: the single-model flags it refuses
(probe, extra features, shrinkage, ragged tables, strategies other than majority).
"""

from __future__ import annotations

import argparse
from typing import Any

from isocompute.errors import InputError


def base_config(args: argparse.Namespace, *, plans: tuple[str, ...], cost_unit: str) -> Any:
    """The PolicyConfig of the flags (budget range 1:16 unless --budgets)."""
    from isocompute.cli.fit import parse_actions, parse_budgets
    from isocompute.policy.policy import PolicyConfig

    budgets = parse_budgets(args.budgets) if args.budgets is not None else [1.0, 16.0]
    return PolicyConfig(
        actions=parse_actions(args.actions), strategy=args.strategy, budget_range=(min(budgets), max(budgets)),
        learner=args.learner, cost_unit=cost_unit, calibration_folds=args.calibration_folds,
        n_components=args.svd_components, n_rounds=args.n_rounds, calibrate_to=args.calibrate_to, seed=args.seed,
        fallback=() if args.no_fallback else None, plans=plans, plan_costs=args.plan_costs,
        fixed_plan_level=args.fallback_level if args.fixed_plan_level is None else args.fixed_plan_level,
        fallback_level=args.fallback_level,
        fallback_margin=args.fallback_margin)


def run_models(args: argparse.Namespace) -> int:
    """``fit --outcomes NAME=TABLE …``: a multi-model policy (:mod:`isocompute.policy.multi.fit`)."""
    from isocompute.cli.models_input import load_estimates
    from isocompute.policy.multi.fit import fit_multi_policy

    if args.probe_model is not None or args.features or args.shrinkage != "none" or args.min_samples or \
            args.ragged != "error" or args.strategy != "majority":
        raise InputError("with several models (--outcomes) the policy reads the prompt text only and votes by "
                         "majority: drop --probe-model, --features, --shrinkage, --min-samples, --ragged and --strategy.")
    config = base_config(args, plans=(), cost_unit="flops")
    me, inputs = load_estimates(args, config.actions)
    policy = fit_multi_policy(me, config, max_actions=args.max_actions, feasible_budgets=args.budgets is None,
                              learn_on=args.learn_on, fallback=_rules(args.fallback_rules), progress=True)
    policy.training_data_["menu"] = {"plans": args.plans, "orders": args.orders, "max_actions": args.max_actions,
                                     "learn_on": args.learn_on, "fallback": list(policy.config.fallback)}
    policy.save(args.out, inputs=inputs)
    from isocompute.cli.console import console as make_console

    console = make_console()
    td = policy.training_data_
    console.print(f"policy → {args.out}  ({len(me.prompts)} prompts × models {', '.join(policy.models)} (cheapest "
                  f"first); {td['kept_actions']} of {td['menu_actions']} actions kept (hull, each model's plans, "
                  f"the oracle's most used), the learners are trained toward {td['learnable_actions']} ({args.learn_on}); budgets [{policy.config.budget_range[0]:.4g}, "
                  f"{policy.config.budget_range[1]:.4g}] FLOPs)")
    console.print(f"default learner: [bold]{policy.default_learner_}[/bold] — "
                  f"{policy.selection_.get('why', policy.selection_['rule'])}")
    from isocompute.cli.fit import _print_chain

    _print_chain(console, policy)
    return 0


def _rules(text: str | None) -> tuple[str, ...] | None:
    """--fallback-rules "escalate,single_model" → the tuple (None: the default chain)."""
    return None if text is None else tuple(r.strip() for r in text.split(",") if r.strip())
