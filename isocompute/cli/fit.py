"""``isocompute fit``: learn a budget-conditioned allocation policy from an outcome table.

The options are :class:`isocompute.stages.fit.FitConfig`'s fields (argparse generated from them); the work
is :func:`isocompute.stages.fit.fit`. This module prints what was fitted: the menu, the budget range, each
learner's calibration and the never-worse chain (which rule serves where, with the evidence).
"""

from __future__ import annotations

import argparse
from typing import Any

from isocompute.stages.fit import FitConfig
from isocompute.stages.options import add_arguments, from_namespace


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "fit", help="learn a budget-conditioned allocation policy from an outcome table",
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(p, FitConfig)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from isocompute.stages.fit import fit

    cfg = from_namespace(FitConfig, args)
    res = fit(cfg)
    if cfg.models.model_outcomes:
        _print_models(cfg, res.policy, res.n_prompts)
    else:
        _print_fit(cfg, res.policy, res.n_prompts, res.probe_note)
        print(res.target_note)
    return 0


def _print_models(cfg: FitConfig, policy: Any, n_prompts: int) -> None:
    from isocompute.cli.console import console as make_console

    console = make_console()
    td = policy.training_data_
    console.print(f"policy → {cfg.out}  ({n_prompts} prompts × models {', '.join(policy.models)} (cheapest "
                  f"first); {td['kept_actions']} of {td['menu_actions']} actions kept (hull, each model's plans, "
                  f"the oracle's most used), the learners are trained toward {td['learnable_actions']} ({cfg.learn_on}); "
                  f"budgets [{policy.config.budget_range[0]:.4g}, "
                  f"{policy.config.budget_range[1]:.4g}] FLOPs)")
    console.print(f"default learner: [bold]{policy.default_learner_}[/bold] — "
                  f"{policy.selection_.get('why', policy.selection_['rule'])}")
    _print_chain(console, policy)


def _print_fit(cfg: FitConfig, policy: Any, n_prompts: int, probe_note: str) -> None:
    from isocompute.cli.console import console as make_console

    config = policy.config
    console = make_console()
    menu = (f"{len(policy.plans)} plans up to {max(policy.actions)} samples (uniform ladder k = {list(config.actions)})"
            if config.plans else f"actions k = {list(config.actions)}")
    console.print(f"policy → {cfg.out}  ({n_prompts} prompts, {menu}, "
                  f"budgets [{config.budget_range[0]:g}, {config.budget_range[1]:g}] {config.cost_unit})")
    if policy.training_data_["summary"]:
        console.print(f"ragged table: {policy.training_data_['summary']}")
    if probe_note:
        console.print(probe_note)
    if config.feature_extras:
        console.print(f"extra features {', '.join(config.feature_extras)}: {policy.features_.extra_flops_per_prompt_:.4g} "
                      f"FLOPs per request (mean over the training prompts); cost {policy.feature_cost_:.4g} "
                      f"{config.cost_unit} per request"
                      + (", declared with --feature-cost" if cfg.feature_cost is not None else "")
                      + ", added to every action")
    console.print(f"default learner: [bold]{policy.default_learner_}[/bold] — "
                  f"{policy.selection_.get('why', policy.selection_['rule'])}")
    for name, f in policy.learners_.items():
        cal = f.calibration
        console.print(f"  {name}: knob {cal.knob}; out-of-fold cost within "
                      f"{100 * cal.max_relative_error(within_reach=True):.1f}% of the target up to {cal.realised.max():.4g} "
                      f"(targets to {cal.targets.max():.4g}; {cal.n_validation} prompts)")
    _print_chain(console, policy)


def _print_chain(console: Any, policy: Any) -> None:
    """Which rule serves where (the never-worse chain of the default learner), with the evidence."""
    from rich.markup import escape
    from rich.table import Table

    from isocompute.evaluation.evaluate import default_budgets

    chain = policy.fallback_[policy.default_learner_]
    if not policy.config.fallback:
        console.print("never-worse chain: off (--no-fallback); the learned rule serves every budget")
        return
    spans = ", ".join(f"{rule} on [{lo:.4g}, {hi:.4g}]" for rule, lo, hi in chain.ranges())
    console.print(f"never-worse chain ({' → '.join(('learned', *policy.config.fallback))}): {spans} — a rule "
                  f"serves where the one-sided {100 * chain.level:g}% lower bound of its out-of-fold gain over "
                  f"the next rule exceeds {100 * chain.margin:+g}% ({len(chain.budgets)} grid budgets)")
    t = Table(title="rule per budget (paired bootstrap over the training prompts, each scored out of fold)")
    for col in ("budget", "serves", "plays", "tests: gain vs the rule after it [95% CI]", "n"):
        t.add_column(col, justify="right")
    for b in default_budgets(*policy.config.budget_range):
        c = chain.at(b)
        tests = "; ".join(
            f"{x.rule} vs {x.baseline} " + ("—" if x.gain is None or x.ci95 is None else
                                            f"{100 * x.gain:+.2f}% [{100 * x.ci95[0]:+.2f}, {100 * x.ci95[1]:+.2f}]")
            for x in c.tests) or "—"
        t.add_row(f"{b:.4g}", c.rule, escape(_plays(policy, c.rule, b)), tests, str(c.tests[0].n) if c.tests else "—")
    console.print(t)


def _plays(policy: Any, rule: str, budget: float) -> str:
    """What a rule plays at ``budget``: per prompt (learned), or the plan mix everyone gets."""
    from isocompute.policy.fallback import uniform_mix

    if rule == "learned":
        return "per prompt"
    names = [p.name for p in policy.plans]
    if rule == "fixed_plan":
        return policy.fixed_plan_at(budget).describe(names)
    if rule == "escalate":
        return "ranked by headroom: " + policy.fixed_plan_at(budget).describe(names)
    if rule == "single_model":
        model, choice = policy.single_model_at(budget)
        return f"{model}: {choice.describe(names)}"
    lad = policy.ladder
    lo, hi, q = uniform_mix(policy.sample_action_costs[lad], budget)
    if q <= 0 or q >= 1:
        return names[lad[hi if q >= 1 else lo]]
    return f"{1 - q:.3f}·{names[lad[lo]]} + {q:.3f}·{names[lad[hi]]}"
