"""The report stage: held-out evaluation of a policy against the oracle and baselines at matched budgets.

By default k-fold cross-validation over the outcome table's prompts, for several seeds, refitting the
policy's configuration on each fold's training part (both learners); with ``holdout`` the fitted policy is
scored as it is on a table it never saw. :func:`report` writes a ``report`` artifact: report.json, report.md
and PNG plots (see :mod:`isocompute.evaluation.report` and :mod:`isocompute.evaluation.evaluate`).

A policy with a probe feature needs the probe's values on the table's prompts: they come from the policy
artifact's cache when it holds this table's prompts (the fit stage on the same table), else the probe runs
on ``probe_model`` (default: the model the policy's probe spec names). The cross-validation refits with the
same probe spec (same declared cost), and the learned methods pay it. A policy with extra feature blocks
(``fit --features minilm``) is refitted with them at the fitted policy's declared cost per request
(``feature_cost`` in its artifact: re-measuring it on each training part would move it by a fraction of a
percent and could push the policy's budget range out of a fold's reach), and the learned methods pay it.

A policy over plans (the default) is scored on its menu's plan arrays (:mod:`isocompute.policy.plans.arrays`:
every plan's utility, cost and waves per prompt); the report then also carries the best fixed plan of every
stopping-rule family chosen on each training part (:mod:`isocompute.evaluation.baselines`: lead, ESC window,
Adaptive-Consistency Beta and Dirichlet, Best-of-∞ Bayes factor, and the best of all), each method's
expected waves, and the policy's gain over the best fixed plan. With token counts on the table every method
also has its expected ``tokens`` generated and ``latency`` per prompt (:mod:`isocompute.evaluation.channels`),
latency in units of one sample's mean completion length on the kept prompts (report.json's
``latency_unit_tokens``; 1.0 = waiting for one sample): decode time plus ``wave_overhead`` O (prefill and
queueing, in the same unit, as ``solve --wave-overhead``) per expected wave, L = decode + O × waves, for
the policy, the oracle, uniform and every fixed-plan baseline alike; report.json records ``wave_overhead``.
O may be measured: ``wave_overhead`` a gateway's metrics scrape (path or URL), turned into samples by
:mod:`isocompute.evaluation.wave_overhead` at this table's unit, recorded as ``wave_overhead_source``.
With ``decode_speed`` (tokens per second) every row also has ``latency_s`` = L × latency_unit_tokens /
decode_speed (e.g. decode latency 1.2, 2.5 waves, O = 0.1: L = 1.45; at 1,735 tokens per sample, 50 tokens/s:
50.3 s). Blocks: ``reach`` (:mod:`isocompute.evaluation.reach`); ``evidence`` for a policy with evidence plans
(:mod:`isocompute.evaluation.evidence_report`); the imitation ceiling (``label_reps``, one-wave actions only).

A multi-model policy (``--outcomes NAME=TABLE … --policy DIR``): the tables go through the fit stage's
pipeline (:func:`~isocompute.stages.inputs.load_estimates`) with the menu the policy was fitted on (stored
in policy.json's ``training_data.menu``); :func:`isocompute.evaluation.report_models.evaluate_models` refits
on each fold's training part and scores every method at every budget, on a grid from the cheapest model's
1-sample cost to the dearest model's 16-sample cost (``n_budgets`` log-spaced points), or ``budgets``; the
artifact holds report.json, report.md and accuracy_flops.png. It always cross-validates and has no probe.

Ignores: measured serving latency (``bench/bench_policy.py``); latency here is the plans' expectation.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from isocompute.errors import InputError
from isocompute.evaluation.evidence_report import model_block
from isocompute.evaluation.wave_overhead import overhead_arg, resolve_overhead
from isocompute.stages.inputs import (
    ModelInputs,
    load_estimates,
    model_flops_for,
    read_raw,
    several,
    target_option,
)
from isocompute.stages.options import group, option
from isocompute.stages.parsing import parse_budget_range, parse_seeds
from isocompute.stages.report_arrays import alt_costs, baselines, other_target, target_info
from isocompute.stages.solutions import check_latency_units

__all__ = ["ReportConfig", "ReportResult", "report"]


@dataclasses.dataclass(kw_only=True)
class ReportConfig:
    """One report: the options of ``isocompute report`` (each documented on its field). ``seeds`` and
    ``budgets`` keep their command-line spelling, which decides what they mean (``lo:hi`` is a grid)."""

    outcomes: Path | None = option(None, flag="outcomes", type=Path, nargs="?",
                                   help="outcome table to evaluate on (.jsonl); or --outcomes NAME=TABLE per model")
    label_reps: int = option(50, type=int, help="bootstrap redraws of each prompt's samples for the imitation "
                                                "ceiling (policy.label_noise; one-wave actions only)")
    policy: Path = option(type=Path, help="policy artifact directory (from isocompute fit)")
    out: Path = option(type=Path, help="report artifact directory to write")
    folds: int = option(5, type=int, help="cross-validation folds over prompts")
    seeds: str = option("3", help="number of CV seeds (e.g. 3) or a comma list of seeds")
    workers: int = option(1, type=int, help="processes the cross-validation folds run in (0: one per CPU core); "
                                            "the same report, sooner")
    budgets: str | None = option(None, help="budgets to evaluate: a list (1,2,4,8), start:stop:step, or lo:hi for "
                                            "the default grid in that range; when omitted, the default grid over "
                                            "the policy's trained range")
    holdout: bool = option(False, action="store_true",
                           help="score the fitted policy on this table (one it never saw) instead of cross-validating")
    bootstrap: int = option(2000, type=int, help="bootstrap resamples for the CIs")
    seed: int = option(0, type=int, help="bootstrap seed")
    model_config: Path | None = option(None, type=Path, help="config.json or model directory (cost unit flops)")
    probe_model: Path | None = option(
        None, type=Path, help="checkpoint for a probe policy's values when the policy's cache does not hold this "
                              "table (default: the model its probe spec names)")
    target: str | None = target_option()
    models: ModelInputs = group(ModelInputs)
    n_budgets: int = option(10, type=int, help="several models: log-spaced budgets from the cheapest model's 1-sample "
                                               "cost to the dearest model's 16-sample cost")
    wave_overhead: float | str | None = option(
        None, parse=overhead_arg, metavar="O|SCRAPE", help="latency added per wave (prefill, queueing) to every "
        "method's decode latency, in units of one sample's mean completion length, as solve's (needs token "
        "counts); or a gateway's metrics scrape (file, - for stdin, or its /metrics URL) to measure it from; "
        "default: the policy's own (fit --wave-overhead), else 0")
    decode_speed: float | None = option(
        None, type=float, metavar="TOKENS_PER_S", help="decode tokens per second: every method's latency also in "
        "seconds (latency_s = latency × latency_unit_tokens / speed; needs token counts)")

    def __post_init__(self) -> None:
        self.out, self.policy = Path(self.out), Path(self.policy)
        check_latency_units(0.0 if isinstance(self.wave_overhead, str) else self.wave_overhead or 0.0, self.decode_speed)
        if several(self.outcomes, self.models) and (self.wave_overhead or self.decode_speed is not None):
            raise InputError("a multi-model report has no latency; drop --wave-overhead and --decode-speed.")


@dataclasses.dataclass
class ReportResult:
    """The report (report.json's), the policy scored, prompts scored, mode, and (several models) the markdown."""

    out: Path
    report: dict[str, Any]
    policy: Any
    n_prompts: int
    mode: str
    markdown: str | None = None


@dataclasses.dataclass
class _Data:
    """The table's prompts the policy keeps, with every array the evaluation takes."""
    table: Any
    inputs: dict[str, str]
    prep: Any
    alt: dict[str, Any]
    plan_kw: dict[str, Any]
    probe: Any
    probe_info: dict[str, Any] | None
    latency_unit: float | None = None
    overhead_source: dict[str, Any] | None = None  # a measured --wave-overhead (wave_overhead.resolve_overhead)
    target: dict[str, Any] | None = None  # the target scored on, the other one shown, consensus vs gold


def report(cfg: ReportConfig) -> ReportResult:
    """Evaluate the policy of ``cfg`` and write the report artifact (module docstring)."""
    if cfg.models.model_outcomes:
        return _report_models(cfg)
    from isocompute.evaluation.evaluate import check_targets, default_budgets, summarise
    from isocompute.evaluation.report import write_report
    from isocompute.policy.loading import load_policy

    policy = load_policy(cfg.policy)
    pc = policy.config
    cfg = dataclasses.replace(cfg, wave_overhead=pc.wave_overhead if cfg.wave_overhead is None else cfg.wave_overhead)
    if cfg.budgets is None:
        budgets = default_budgets(*pc.budget_range)
    else:
        spec = parse_budget_range(cfg.budgets)
        budgets = default_budgets(*spec) if cfg.budgets.count(":") == 1 else spec
    for b in budgets:
        policy.check_budget(b)  # fail before any fitting, naming the trained range
    data = _data(cfg, policy)
    ev, seeds = _evaluate(cfg, policy, data, budgets)
    summary = summarise(ev, n_boot=cfg.bootstrap, seed=cfg.seed)
    if cfg.decode_speed is not None:
        from isocompute.evaluation.channels import add_seconds

        add_seconds(summary["budgets"], data.latency_unit, cfg.decode_speed)
    if not pc.plans:
        _add_label_noise(cfg, policy, data, budgets, summary)
    rep = _assemble(cfg, policy, data, ev, seeds, budgets, summary)
    rep["targets"] = check_targets(summary)
    if hasattr(policy, "evidence"):  # evidence plans (isocompute evidence): evaluation.evidence_report
        rep["evidence"] = model_block(policy.evidence, data.table, seed=cfg.seed)
    params = {"folds": ev.n_folds, "seeds": list(seeds), "budgets": [float(b) for b in budgets],
              "holdout": bool(cfg.holdout), "bootstrap": cfg.bootstrap, "bootstrap_seed": cfg.seed,
              "wave_overhead": cfg.wave_overhead, "decode_speed": cfg.decode_speed,
              "target": data.table.target}
    write_report(cfg.out, rep, inputs=data.inputs, params=params)
    return ReportResult(cfg.out, rep, policy, len(data.table), ev.mode)


def _data(cfg: ReportConfig, policy: Any) -> _Data:
    """Read the table and build the arrays the evaluation takes: utilities and costs, the second cost unit,
    the plan arrays and baselines, and the probe's values."""
    from isocompute.artifacts import sha256_file
    from isocompute.policy.plans.arrays import table_arrays
    from isocompute.solver.votes.consensus import with_target

    pc = policy.config
    raw = read_raw(cfg.outcomes)
    table = with_target(raw, cfg.target or pc.target)  # default: what the policy was fitted under
    inputs = {"outcomes": table.sha256, "policy_manifest": sha256_file(cfg.policy / "manifest.json")}
    if cfg.holdout and table.sha256 == policy.manifest_["inputs"].get("outcomes"):
        raise InputError(f"{cfg.outcomes} is the table the policy was fitted on; --holdout needs a table it never "
                         "saw. Drop --holdout to cross-validate on this table instead.")
    model = None
    if pc.cost_unit == "flops":
        model, extra = model_flops_for(table, cfg.model_config)
        inputs.update(extra)
    prep = table_arrays(table, pc, model=model)
    other = other_target(raw, table.target)
    table = prep.table  # the prompts the policy's config keeps (ragged tables: solver.ragged)
    alt = alt_costs(cfg.model_config, table, policy, model, inputs, prep)
    plan_kw: dict[str, Any] = {"waves": prep.waves}
    unit = source = None
    if pc.plans:
        from isocompute.evaluation.channels import latency_channel

        plan_kw = {"samples": prep.samples, "waves": prep.waves}
        if prep.tokens is not None and prep.latency is not None:
            from isocompute.solver.costs import token_multiple_of

            unit = token_multiple_of(table.mean_completion_tokens)
            cfg.wave_overhead, source = resolve_overhead(cfg.wave_overhead, unit)  # cfg: report()'s copy
            plan_kw.update(tokens=prep.tokens, latency=latency_channel(prep.latency, prep.waves, unit,
                                                                       cfg.wave_overhead))
    _check_timed(cfg, pc, unit)
    if other is not None:  # every method's accuracy under the other target too (evaluation.channels)
        plan_kw[other.target] = table_arrays(other, dataclasses.replace(pc, target=other.target),
                                             model=model).utility
    if pc.plans and not cfg.holdout:
        plan_kw["baselines"] = baselines(policy, table, model, unit, cfg.wave_overhead, other)
    probe, probe_info = None, None
    if pc.probe is not None:
        probe, probe_info = _probe_values(cfg, pc.probe, table.prompts, prep.utility)
        inputs["probe_model"] = probe_info["model_sha256"]
    elif cfg.probe_model is not None:
        raise InputError(f"the policy {cfg.policy} has no probe feature; drop --probe-model (or refit with it).")
    return _Data(table, inputs, prep, alt, plan_kw, probe, probe_info, unit, source, target_info(raw, table, other))



def _check_timed(cfg: ReportConfig, pc: Any, unit: float | None) -> None:
    """InputError when --wave-overhead > 0 or --decode-speed asks for a latency this report has not."""
    if unit is None and (cfg.wave_overhead or cfg.decode_speed is not None):
        why = (f"{cfg.policy} has one-wave actions (fit --plans none), whose report has no latency; refit with "
               "plans" if not pc.plans else f"it needs completion_tokens on every sample of {cfg.outcomes}, and "
               "this table has none; re-import it with token counts")
        raise InputError(f"--wave-overhead and --decode-speed apply to the report's latency: {why}, or drop them.")


def _evaluate(cfg: ReportConfig, policy: Any, data: _Data, budgets: Any) -> tuple[Any, tuple[int, ...]]:
    """(the evaluation, its seeds): the fitted policy on held-out prompts, or cross-validated refits."""
    from isocompute.evaluation.evaluate import cross_validate, holdout

    pc = policy.config
    U, C = data.prep.utility, data.prep.cost
    if cfg.holdout:
        ev = holdout(policy, data.table.prompts, U, C, budgets, probe=data.probe, **data.alt, **data.plan_kw)
        return ev, (pc.seed,)
    cv_cfg = pc
    if pc.feature_extras and pc.feature_cost is None:  # refits pay what the fitted policy declared
        cv_cfg = dataclasses.replace(pc, feature_cost=policy.feature_cost_)
    seeds = parse_seeds(cfg.seeds)
    shrink = {}
    if pc.shrinkage == "eb":
        from isocompute.policy.learn.shrinkage import sampling_variance
        from isocompute.policy.policy import task_groups

        shrink = {"label_var": sampling_variance(data.table, pc.actions, pc.strategy, seed=pc.seed),
                  "groups": task_groups(data.table)}
    ev = cross_validate(data.table.prompts, U, C, cv_cfg, budgets, folds=cfg.folds, seeds=seeds, probe=data.probe,
                        progress=True, workers=cfg.workers, **data.alt, **shrink, **data.plan_kw)
    return ev, seeds


def _add_label_noise(cfg: ReportConfig, policy: Any, data: _Data, budgets: Any, summary: dict[str, Any]) -> None:
    """Each budget's imitation ceiling and label agreement (one-wave actions), into ``summary``."""
    import numpy as np

    from isocompute.policy.learn.label_noise import oracle_label_agreement
    from isocompute.solver.allocate import feasible_range

    pc = policy.config
    U, C = data.prep.utility, data.prep.cost
    # The oracle labels imitation is scored against: at each budget clipped to what the samples alone can
    # spend (a probe policy's range reaches past it by the probe's cost), as evaluate's oracle is.
    f_lo, f_hi = feasible_range(C)
    noise = oracle_label_agreement(data.table, U, C, pc.actions, pc.strategy,
                                   [float(np.clip(b, f_lo, f_hi)) for b in budgets], reps=cfg.label_reps,
                                   seed=cfg.seed)
    for j, e in enumerate(summary["budgets"]):
        e["imitation_ceiling"], e["label_agreement"] = noise["ceiling"][j], noise["agreement"][j]


def _assemble(cfg: ReportConfig, policy: Any, data: _Data, ev: Any, seeds: tuple[int, ...], budgets: Any,
              summary: dict[str, Any]) -> dict[str, Any]:
    """report.json's content (before its targets)."""
    from isocompute.evaluation.baselines import baseline_choices

    pc = policy.config
    prep = data.prep
    return {
        "mode": ev.mode, "folds": ev.n_folds, "seeds": list(seeds), "actions": list(pc.actions),
        "plans": [p.name for p in policy.plans] if pc.plans else None,
        "plan_stats": {"samples": policy.plan_samples_.tolist(), "waves": policy.plan_waves_.tolist()},
        "baseline_choices": baseline_choices(data.plan_kw.get("baselines"), budgets),
        "strategy": pc.strategy, "cost_unit": pc.cost_unit, "inputs": data.inputs, "target": data.target,
        "policy": {"path": str(cfg.policy), "default_learner": policy.default_learner_,
                   "selection": policy.selection_, "config": pc.to_dict(),
                   "fallback": {"ranges": [list(r) for r in policy.fallback_[policy.default_learner_].ranges()],
                                "at_budgets": [policy.rule_at(b).evidence() for b in budgets]}},
        "probe": data.probe_info,
        "ragged": {"dropped": len(prep.dropped), "min_samples": prep.min_samples, "ragged_prompts": prep.n_ragged,
                   "summary": prep.summary()},
        "fixed_plans": [{"budget": float(b), "plays": policy.fixed_plan_at(float(b)).describe(
            [p.name for p in policy.plans])} for b in budgets] if pc.plans else None,
        "features": None if not pc.feature_extras else {
            "extras": list(pc.feature_extras), "extra_components": pc.extra_components,
            "fitted_policy_cost": policy.feature_cost_, "declared": pc.feature_cost,
            "flops_per_request": policy.features_.extra_flops_per_prompt_},
        **({} if data.latency_unit is None else {"latency_unit_tokens": data.latency_unit,
                                                 "wave_overhead": float(cfg.wave_overhead)}),
        **({} if data.overhead_source is None else {"wave_overhead_source": data.overhead_source}),
        **({} if cfg.decode_speed is None else {"decode_speed": float(cfg.decode_speed)}),
        **summary,
    }


def _probe_values(cfg: ReportConfig, spec: Any, prompts: list[str], U: Any) -> tuple[Any, dict[str, Any]]:
    """The probe's values on ``prompts`` (policy cache, else computed) and what the report says about them."""
    from scipy.stats import spearmanr

    from isocompute.engines.probe_cache import compute_probe

    model_dir = Path(cfg.probe_model or spec.model)
    if not (model_dir / "config.json").is_file():
        raise InputError(f"this policy's probe ran on {spec.model!r}, which is not a checkpoint directory here; pass "
                         "--probe-model DIR with that model.")
    result, key, how = compute_probe(prompts, model_dir, spec.max_tokens, spec.prompt_format,
                                     cache_dirs=[cfg.policy])
    rho = spearmanr(result.values, U[:, 0]).statistic if len(prompts) > 2 else float("nan")
    info = {**dataclasses.asdict(spec), "source": how, "method": result.method, "model_sha256": key["model_sha256"],
            "mean": float(result.values.mean()), "std": float(result.values.std()),
            "mean_probe_tokens": float(result.completion_tokens.mean()),
            "spearman_vs_accuracy_k1": float(rho)}
    return result.values, info


def _report_models(cfg: ReportConfig) -> ReportResult:
    """A multi-model policy's held-out report (module docstring)."""
    import json

    from isocompute.artifacts import artifact_writer, sha256_file
    from isocompute.evaluation.report import KIND, SCHEMA_VERSION, _finite
    from isocompute.evaluation.report_models import (
        budget_grid,
        evaluate_models,
        plot_accuracy_flops,
        render_markdown,
    )
    from isocompute.policy.loading import load_policy

    policy = load_policy(cfg.policy)
    if not policy.models:
        raise InputError(f"{cfg.policy} is a single-model policy; report it on its one table (positional), or fit a "
                         "multi-model policy with isocompute fit --outcomes NAME=TABLE ….")
    if cfg.holdout:
        raise InputError("a multi-model report cross-validates on the tables; drop --holdout.")
    menu = (getattr(policy, "training_data_", None) or {}).get("menu") or {}
    me, inputs = load_estimates(cfg.models, policy.config.actions, menu.get("plans"),
                                int(menu.get("orders", cfg.models.orders)))
    if set(me.models) != set(policy.models):
        raise InputError(f"the policy was fitted on the models {list(policy.models)}; --outcomes names {list(me.models)}.")
    inputs["policy_manifest"] = sha256_file(cfg.policy / "manifest.json")
    budgets = parse_budget_range(cfg.budgets) if cfg.budgets is not None else budget_grid(me, cfg.n_budgets).tolist()
    rep = evaluate_models(me, policy.config, budgets, folds=cfg.folds, seeds=parse_seeds(cfg.seeds),
                          max_actions=int(menu.get("max_actions", len(policy.plans))),
                          learn_on=menu.get("learn_on", "hull"), fallback=policy.config.fallback,
                          n_boot=cfg.bootstrap, seed=cfg.seed, progress=True)
    rep["policy"] = {"path": str(cfg.policy), "default_learner": policy.default_learner_,
                     "config": policy.config.to_dict(), "menu": menu}
    rep = _finite(rep)
    markdown = render_markdown(rep)
    with artifact_writer(cfg.out, kind=KIND, schema_version=SCHEMA_VERSION, inputs=inputs,
                         params={"folds": cfg.folds, "seeds": cfg.seeds, "budgets": budgets,
                                 "bootstrap": cfg.bootstrap, "seed": cfg.seed}) as d:
        (d / "report.json").write_text(json.dumps(rep, indent=2, allow_nan=False) + "\n")
        (d / "report.md").write_text(markdown)
        plot_accuracy_flops(rep, d / "accuracy_flops.png")
    return ReportResult(cfg.out, rep, policy, len(me.prompts), "cross-validation", markdown)
