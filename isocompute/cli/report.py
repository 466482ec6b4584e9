"""``isocompute report``: held-out evaluation of a policy against the oracle and baselines at matched budgets.

By default k-fold cross-validation over the outcome table's prompts, for several seeds, refitting the
policy's configuration on each fold's training part (both learners); with ``--holdout`` the fitted
policy is scored as it is on a table it never saw. Writes a ``report`` artifact: report.json,
report.md and PNG plots (see :mod:`isocompute.evaluation.report` and :mod:`isocompute.evaluation.evaluate`).

A policy with a probe feature needs the probe's values on the table's prompts: they come from the
policy artifact's cache when it holds this table's prompts (``isocompute fit`` on the same table), else
the probe runs on ``--probe-model`` (default: the model the policy's probe spec names). The
cross-validation refits with the same probe spec (same declared cost), and the learned methods pay it.
A policy with extra feature blocks (``isocompute fit --features minilm``) is refitted with them at the
fitted policy's declared cost per request (``feature_cost`` in its artifact: re-measuring it on each
training part would move it by a fraction of a percent and could push the policy's budget range out
of a fold's reach), and the learned methods pay it.

A policy over plans (``isocompute fit --plans …``, the default) is scored on its menu's plan arrays
(:mod:`isocompute.policy.plans.arrays`: every plan's utility, cost and waves per prompt); the report then
also carries the best fixed plan of every stopping-rule family chosen on each training part
(:mod:`isocompute.evaluation.baselines`: lead, ESC window, Adaptive-Consistency Beta and Dirichlet,
Best-of-∞ Bayes factor, and the best of all), each method's expected waves, and the policy's gain over
the best fixed plan. The imitation ceiling (``--label-reps``) redraws k-sample labels and is computed for
one-wave actions only.

Ignores: serving and latency (``bench/bench_policy.py``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from isocompute.errors import InputError


def parse_seeds(text: str) -> tuple[int, ...]:
    """"3" → (0, 1, 2); "0,5,7" → (0, 5, 7)."""
    try:
        if "," in text:
            seeds = tuple(int(x) for x in text.split(",") if x.strip())
        else:
            seeds = tuple(range(int(text)))
    except ValueError:
        raise InputError(f"--seeds must be a count (e.g. 3) or a comma list (e.g. 0,5,7); got {text!r}.") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise InputError(f"--seeds must name at least one distinct seed; got {text!r} (a single number is a count: "
                         "--seeds 1 runs seed 0; for one specific seed write it with a comma, e.g. --seeds 7,).")
    return seeds


def run(args: argparse.Namespace) -> int:
    from isocompute.cli.models_input import is_multi

    if is_multi(args):  # several models: isocompute.cli.report_models
        from isocompute.cli.report_models import run_models

        return run_models(args)
    import numpy as np

    from isocompute.artifacts import sha256_file
    from isocompute.cli.fit import model_flops_for, parse_budgets, read_table
    from isocompute.evaluation.evaluate import (
        check_targets,
        cross_validate,
        default_budgets,
        holdout,
        summarise,
    )
    from isocompute.evaluation.report import write_report
    from isocompute.policy.plans.arrays import table_arrays
    from isocompute.policy.policy import Policy
    from isocompute.solver.allocate import feasible_range

    policy = Policy.load(args.policy)
    cfg = policy.config
    lo, hi = cfg.budget_range
    if args.budgets is None:
        budgets = default_budgets(lo, hi)
    else:
        spec = parse_budgets(args.budgets)
        budgets = default_budgets(*spec) if ":" in args.budgets and args.budgets.count(":") == 1 else spec
    for b in budgets:
        policy.check_budget(b)  # fail before any fitting, naming the trained range
    table = read_table(args.outcomes)
    inputs = {"outcomes": table.sha256, "policy_manifest": sha256_file(Path(args.policy) / "manifest.json")}
    if args.holdout and table.sha256 == policy.manifest_["inputs"].get("outcomes"):
        raise InputError(f"{args.outcomes} is the table the policy was fitted on; --holdout needs a table it never "
                         "saw. Drop --holdout to cross-validate on this table instead.")
    model = None
    if cfg.cost_unit == "flops":
        model, extra = model_flops_for(table, args.model_config)
        inputs.update(extra)
    prep = table_arrays(table, cfg, model=model)
    table = prep.table  # the prompts the policy's config keeps (ragged tables: solver.ragged)
    C, U = prep.cost, prep.utility
    alt = _alt_costs(args, table, policy, model, inputs, prep)
    plan_kw: dict[str, Any] = {}
    if cfg.plans:
        plan_kw = {"samples": prep.samples, "waves": prep.waves}
        if not args.holdout:
            plan_kw["baselines"] = _baselines(policy, table, model)
    else:
        plan_kw = {"waves": prep.waves}
    probe, probe_info = None, None
    if cfg.probe is not None:
        probe, probe_info = _probe_values(args, cfg.probe, table.prompts, U)
        inputs["probe_model"] = probe_info["model_sha256"]
    elif args.probe_model is not None:
        raise InputError(f"the policy {args.policy} has no probe feature; drop --probe-model (or refit with it).")
    cv_cfg = cfg
    if cfg.feature_extras and cfg.feature_cost is None:  # refits pay what the fitted policy declared
        import dataclasses

        cv_cfg = dataclasses.replace(cfg, feature_cost=policy.feature_cost_)
    if args.holdout:
        ev = holdout(policy, table.prompts, U, C, budgets, probe=probe, **alt, **plan_kw)
        seeds: tuple[int, ...] = (cfg.seed,)
    else:
        seeds = parse_seeds(args.seeds)
        shrink = {}
        if cfg.shrinkage == "eb":
            from isocompute.policy.learn.shrinkage import sampling_variance
            from isocompute.policy.policy import task_groups

            shrink = {"label_var": sampling_variance(table, cfg.actions, cfg.strategy, seed=cfg.seed),
                      "groups": task_groups(table)}
        ev = cross_validate(table.prompts, U, C, cv_cfg, budgets, folds=args.folds, seeds=seeds, probe=probe,
                            progress=True, **alt, **shrink, **plan_kw)
    summary = summarise(ev, n_boot=args.bootstrap, seed=args.seed)
    if not cfg.plans:
        from isocompute.evaluation.label_noise import oracle_label_agreement

        # The oracle labels imitation is scored against: at each budget clipped to what the samples alone can
        # spend (a probe policy's range reaches past it by the probe's cost), as evaluate's oracle is.
        f_lo, f_hi = feasible_range(C)
        noise = oracle_label_agreement(table, U, C, cfg.actions, cfg.strategy,
                                       [float(np.clip(b, f_lo, f_hi)) for b in budgets], reps=args.label_reps,
                                       seed=args.seed)
        for j, e in enumerate(summary["budgets"]):
            e["imitation_ceiling"], e["label_agreement"] = noise["ceiling"][j], noise["agreement"][j]
    report = {
        "mode": ev.mode, "folds": ev.n_folds, "seeds": list(seeds), "actions": list(cfg.actions),
        "plans": [p.name for p in policy.plans] if cfg.plans else None,
        "plan_stats": {"samples": policy.plan_samples_.tolist(), "waves": policy.plan_waves_.tolist()},
        "baseline_choices": _baseline_choices(plan_kw.get("baselines"), budgets),
        "strategy": cfg.strategy, "cost_unit": cfg.cost_unit, "inputs": inputs,
        "policy": {"path": str(args.policy), "default_learner": policy.default_learner_,
                   "selection": policy.selection_, "config": cfg.to_dict(),
                   "fallback": {"ranges": [list(r) for r in policy.fallback_[policy.default_learner_].ranges()],
                                "at_budgets": [policy.rule_at(b).evidence() for b in budgets]}},
        "probe": probe_info,
        "ragged": {"dropped": len(prep.dropped), "min_samples": prep.min_samples, "ragged_prompts": prep.n_ragged,
                   "summary": prep.summary()},
        "fixed_plans": [{"budget": float(b), "plays": policy.fixed_plan_at(float(b)).describe(
            [p.name for p in policy.plans])} for b in budgets] if cfg.plans else None,
        "features": None if not cfg.feature_extras else {
            "extras": list(cfg.feature_extras), "extra_components": cfg.extra_components,
            "fitted_policy_cost": policy.feature_cost_, "declared": cfg.feature_cost,
            "flops_per_request": policy.features_.extra_flops_per_prompt_},
        **summary,
    }
    report["targets"] = check_targets(summary)
    params = {"folds": ev.n_folds, "seeds": list(seeds), "budgets": [float(b) for b in budgets],
              "holdout": bool(args.holdout), "bootstrap": args.bootstrap, "bootstrap_seed": args.seed}
    write_report(args.out, report, inputs=inputs, params=params)

    from rich.table import Table

    from isocompute.cli.console import console

    con = console()
    if cfg.plans:
        _print_plans_table(con, report, ev.mode, len(table), args.out)
    else:
        t = Table(title=f"held-out accuracy ({ev.mode}, {len(table)} prompts) → {args.out}")
        for col in ("budget", "oracle", "learned", "uniform", "heuristic", "random", "cost", "gain vs uniform [CI]",
                    "served learned", "imitation", "ceiling"):
            t.add_column(col, justify="right")
        for e in report["budgets"]:
            m, g = e["methods"], e["gain_vs_uniform"]
            sig = "" if g["significant"] else " n.s."
            t.add_row(f"{e['budget']:.3g}", *(f"{m[k]['accuracy']:.4f}" for k in ("oracle", "learned", "uniform",
                                                                                 "heuristic", "random")),
                      f"{m['learned']['cost']:.4g}",
                      f"{100 * g['relative']:+.1f}% [{100 * g['ci95'][0]:+.1f}, {100 * g['ci95'][1]:+.1f}]{sig}",
                      f"{100 * (e['rules'] or {}).get('learned', 0.0):.0f}%",
                      f"{e['imitation_accuracy']:.3f}", f"{e['imitation_ceiling']:.3f}")
        con.print(t)
    con.print("learned = the policy as served: at each budget its never-worse chain serves the learned rule "
              "only where it beat the next rule out of fold" + (" (the fixed plan, then uniform)" if cfg.plans
                                                                 else ", else uniform")
              + " ('served learned': share of the refitted policies that served the learned rule).")
    con.print(report["learner_comparison"]["why"])
    _print_same_accuracy(con, report["same_accuracy"], cfg.cost_unit)
    if probe_info is not None:
        con.print(f"probe {probe_info['name']} ({probe_info['source']}): the learned policy pays "
                        f"{probe_info['cost']:.4g} {cfg.cost_unit} per request for it in every column above; "
                        f"Spearman ρ with 1-sample accuracy {probe_info['spearman_vs_accuracy_k1']:+.3f}")
    if cfg.feature_extras:
        con.print(f"extra features {', '.join(cfg.feature_extras)}: the learned policy pays "
                        f"{policy.feature_cost_:.4g} {cfg.cost_unit} per request for them in every column above "
                        f"(declared by the fitted policy; every refit pays the same)")
    return 0


def _alt_costs(args: argparse.Namespace, table: Any, policy: Any, model: Any, inputs: dict[str, str],
               arrays: Any) -> dict[str, Any]:
    """The cost table in a second unit for "same accuracy for less": FLOPs when the table's model is known
    (``--model-config`` or its meta; the probe's and extra features' FLOPs paid per request), samples
    when the policy's unit is FLOPs; {} when neither is known. ``arrays``: the table's plan arrays."""
    import dataclasses

    from isocompute.cli.fit import model_flops_for
    from isocompute.policy.plans.arrays import table_arrays

    cfg = policy.config
    if cfg.cost_unit == "flops":
        return {"C_alt": arrays.samples, "alt_unit": "samples"}
    if model is None:
        try:
            model, extra = model_flops_for(table, args.model_config)
        except InputError:
            return {}
        inputs.update(extra)
    if not table.has_token_counts:
        return {}
    paid = ((cfg.probe.flops or 0.0) if cfg.probe is not None else 0.0) + (
        policy.features_.extra_flops_per_prompt_ if cfg.feature_extras else 0.0)
    flops = table_arrays(table, dataclasses.replace(cfg, cost_unit="flops", min_samples=0), model=model)
    return {"C_alt": flops.cost, "paid_alt": float(paid), "alt_unit": "flops"}


def _baselines(policy: Any, table: Any, model: Any) -> Any:
    """The rule families' plan arrays on the policy's kept prompts (:mod:`isocompute.evaluation.baselines`)."""
    from isocompute.evaluation.baselines import FixedBaselines, baseline_plans
    from isocompute.policy.plans.arrays import plan_arrays

    cfg = policy.config
    plans, columns = baseline_plans(policy.plans, cfg.actions)
    arr = plan_arrays(table, plans, cost_unit=cfg.cost_unit, model=model, ragged=cfg.ragged)
    return FixedBaselines(plans, arr.utility, arr.cost, arr.waves, columns)


def _baseline_choices(baselines: Any, budgets: Any) -> list[dict[str, Any]] | None:
    """What each baseline plays at each budget when chosen on every prompt (the report names it)."""
    if baselines is None:
        return None
    from isocompute.evaluation.baselines import describe_choices

    return [{"budget": float(b), "plays": describe_choices(baselines, float(b))} for b in budgets]


def _print_plans_table(con: Any, report: dict[str, Any], mode: str, n: int, out: Any) -> None:
    """The held-out table of a plan policy: the policy as served against its fixed plan, the best fixed
    plan of every rule family and uniform, with costs, waves and the two gains."""
    from rich.table import Table

    t = Table(title=f"held-out accuracy over plans ({mode}, {n} prompts) → {out}")
    for col in ("budget", "oracle", "learned", "fixed plan", "best fixed", "uniform", "cost", "waves",
                "gain vs uniform [CI]", "vs best fixed [CI]", "served learned / fixed"):
        t.add_column(col, justify="right")

    def gain(g: dict[str, Any] | None) -> str:
        if not g:
            return "—"
        return f"{100 * g['relative']:+.2f}% [{100 * g['ci95'][0]:+.2f}, {100 * g['ci95'][1]:+.2f}]"

    for e in report["budgets"]:
        m, rules = e["methods"], e["rules"] or {}
        acc = [f"{m[k]['accuracy']:.4f}" if k in m else "—" for k in ("oracle", "learned", "fixed_plan", "fixed_best",
                                                                       "uniform")]
        t.add_row(f"{e['budget']:.3g}", *acc, f"{m['learned']['cost']:.4g}", f"{m['learned'].get('waves', 1.0):.2f}",
                  gain(e["gain_vs_uniform"]), gain(e["gain_vs_fixed"].get("fixed_best")),
                  f"{100 * rules.get('learned', 0.0):.0f}% / {100 * rules.get('fixed_plan', 0.0):.0f}%")
    con.print(t)


def _print_same_accuracy(con: Any, same: dict[str, Any] | None, unit: str) -> None:
    """"Same accuracy for N× less": each method's cost to reach uniform's accuracy at the largest k."""
    from rich.table import Table

    if not same:
        return
    ref = same["reference"]
    alt = same["alt_unit"]
    t = Table(title=f"cost to reach the accuracy of uniform k = {ref['k']} ({ref['accuracy']:.4f}; costs "
                    f"{ref['cost']:.4g} {unit}" + (f", {ref['cost_alt']:.4g} {alt}" if alt else "") + ")")
    for col in ("method", f"{unit}", "× less", *((alt, "× less") if alt else ())):
        t.add_column(col, justify="right")
    for m, hit in same["methods"].items():
        if hit is None:
            t.add_row(m, "not reached", "—", *(("—", "—") if alt else ()))
            continue
        le = "≤ " if hit["at_lowest"] else ""
        row = [m, f"{le}{hit['cost']:.4g}", f"{hit['times_less']:.2f}×" if hit["times_less"] else "—"]
        if alt:
            row += [f"{le}{hit['cost_alt']:.4g}" if hit["cost_alt"] is not None else "—",
                    f"{hit['times_less_alt']:.2f}×" if hit["times_less_alt"] else "—"]
        t.add_row(*row)
    con.print(t)


def _probe_values(args: argparse.Namespace, spec: Any, prompts: list[str], U: Any) -> tuple[Any, dict[str, Any]]:
    """The probe's values on ``prompts`` (policy cache, else computed) and what the report says about them."""
    from dataclasses import asdict

    from scipy.stats import spearmanr

    from isocompute.engines.probe_cache import compute_probe

    model_dir = Path(args.probe_model or spec.model)
    if not (model_dir / "config.json").is_file():
        raise InputError(f"this policy's probe ran on {spec.model!r}, which is not a checkpoint directory here; pass "
                         "--probe-model DIR with that model.")
    result, key, how = compute_probe(prompts, model_dir, spec.max_tokens, spec.prompt_format,
                                     cache_dirs=[Path(args.policy)])
    rho = spearmanr(result.values, U[:, 0]).statistic if len(prompts) > 2 else float("nan")
    info = {**asdict(spec), "source": how, "method": result.method, "model_sha256": key["model_sha256"],
            "mean": float(result.values.mean()), "std": float(result.values.std()),
            "mean_probe_tokens": float(result.completion_tokens.mean()),
            "spearman_vs_accuracy_k1": float(rho)}
    return result.values, info


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "report", help="held-out regret of a policy vs oracle, uniform, heuristic and random at matched budgets",
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("outcomes", type=Path, nargs="?",
                   help="outcome table to evaluate on (.jsonl); or --outcomes NAME=TABLE per model")
    p.add_argument("--label-reps", type=int, default=50,
                   help="bootstrap redraws of each prompt's samples for the imitation ceiling (policy.label_noise; "
                        "one-wave actions only)")
    p.add_argument("--policy", type=Path, required=True, help="policy artifact directory (from isocompute fit)")
    p.add_argument("--out", type=Path, required=True, help="report artifact directory to write")
    p.add_argument("--folds", type=int, default=5, help="cross-validation folds over prompts")
    p.add_argument("--seeds", default="3", help="number of CV seeds (e.g. 3) or a comma list of seeds")
    p.add_argument("--budgets", help="budgets to evaluate: a list (1,2,4,8), start:stop:step, or lo:hi for the "
                                     "default grid in that range; when omitted, the default grid over the "
                                     "policy's trained range")
    p.add_argument("--holdout", action="store_true",
                   help="score the fitted policy on this table (one it never saw) instead of cross-validating")
    p.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples for the CIs")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument("--model-config", type=Path, help="config.json or model directory (cost unit flops)")
    p.add_argument("--probe-model", type=Path,
                   help="checkpoint for a probe policy's values when the policy's cache does not hold this table "
                        "(default: the model its probe spec names)")
    from isocompute.cli.models_input import add_model_args
    from isocompute.cli.report_models import register_args

    add_model_args(p)
    register_args(p)
    p.set_defaults(func=run)
