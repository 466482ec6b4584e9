"""The fitted policy: prompt features → a learner → an action (a plan) per prompt at a requested budget.

How it is fitted (cross-fitted members, budget calibration, the never-worse chain), what it costs (plans,
FLOPs, the probe and extra feature blocks) and how it decides: ``docs/policy.md``. ``Policy.decide(prompts,
budget)`` is pure and fast; a budget outside the trained range raises :class:`~isocompute.errors.BudgetError`.
Artifact (``save``/``load``; manifest kind ``policy``, schema 1): :mod:`isocompute.policy.persistence`.
Ignores: per-request caps (``max_samples`` is the gateway's), and how probe values are computed (the
engines' job; the spec only records name, tokens, prompt format, model and cost).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from isocompute.errors import BudgetError, InputError
from isocompute.policy import latency as latency_budgets
from isocompute.policy.config import (  # noqa: F401  (re-exported: the policy's public names)
    COST_UNITS,
    EXTRA_PACKAGES,
    LEARNERS,
    PROBE_FORMATS,
    PROBES,
    PolicyConfig,
    ProbeSpec,
    probe_column,
)
from isocompute.policy.decision import Decision, make_decision, predicted_costs  # noqa: F401  (Decision: re-exported)
from isocompute.policy.fallback import (
    FIXED_PLAN,
    LEARNED,
    UNIFORM,
    RuleChain,
    RuleChoice,
    choose_rules,
    mix_actions,
    uniform_mix,
    uniform_oof_costs,
    uniform_utilities,
)
from isocompute.policy.features.prompt import PromptFeatures
from isocompute.policy.learn.crossfit import (
    N_CALIBRATION,
    CrossFit,
    FittedLearner,
    crossfit_folds,
    fit_learner,
    select_learner,
)
from isocompute.policy.learn.learners import MIX_SEED, ROUTE_SEED, budget_grid, prompt_uniforms
from isocompute.policy.learn.members import batch_knob, member_actions
from isocompute.policy.persistence import KIND, SCHEMA_VERSION, load_policy, save_policy  # noqa: F401
from isocompute.policy.plans.arrays import allocate_plans, plan_stats
from isocompute.policy.plans.fixed_rule import fixed_plan_at, fixed_plan_oof
from isocompute.policy.plans.heldout import budget_table, internal_budget
from isocompute.policy.plans.menu import ladder_columns, menu_of
from isocompute.policy.table_prep import check_arrays, prepare_table, task_groups  # noqa: F401  (task_groups: re-exported)
from isocompute.solver.allocate import feasible_range
from isocompute.solver.plans.plan import Plan


class Policy:
    """A fitted allocation policy (see the module docstring). Construct with a :class:`PolicyConfig`
    (or its fields as keywords), then :meth:`fit` or :meth:`load`."""

    def __init__(self, config: PolicyConfig | None = None, **kwargs: Any) -> None:
        self.config = config if config is not None else PolicyConfig(**kwargs)

    # ------------------------------------------------------------------------------------------ fitting
    def fit(self, table: Any, *, costs: np.ndarray | None = None, model_flops: Any = None,
            probe: np.ndarray | None = None, sample_flops: np.ndarray | None = None,
            progress: bool = False, arrays: Any = None) -> Policy:
        """Fit on an :class:`~isocompute.solver.outcomes.OutcomeTable`; ``costs`` overrides the cost table;
        ``probe``: the probe's value per prompt (required exactly when the config has a probe).
        ``model_flops`` (``isocompute.flops.load_model_flops``) prices the flops unit and, with extra features
        in samples, one sample's FLOPs per prompt, unless ``sample_flops`` gives them. With a plan menu every
        plan is estimated on every prompt (:func:`~isocompute.policy.plans.arrays.table_arrays`; ``arrays``: its
        result, when the caller has it). A ragged table is kept as ``min_samples`` / ``ragged`` say
        (:mod:`isocompute.solver.ragged`); what was dropped is in :attr:`training_data_`."""
        prep, costs, probe, sample_flops, labels = prepare_table(self.config, table, costs=costs, probe=probe,
                                                                 sample_flops=sample_flops, model_flops=model_flops,
                                                                 arrays=arrays)
        full, table = len(table), prep.table
        self.tokens_per_sample_ = latency_budgets.tokens_per_sample(table)
        latency = None if self.config.latency_range is None else latency_budgets.latency_units(
            prep, self.config.wave_overhead)
        self.fit_arrays(table.prompts, prep.utility, costs, samples=prep.samples, waves=prep.waves, probe=probe,
                        sample_flops=sample_flops, labels=labels, latency=latency, progress=progress)
        self.training_data_ = {"prompts_in_table": full, "dropped": len(prep.dropped),
                               "dropped_ids": prep.dropped[:20], "min_samples": prep.min_samples,
                               "ragged_prompts": prep.n_ragged, "summary": prep.summary()}
        return self

    def fit_arrays(self, prompts: Sequence[str], U: np.ndarray, C: np.ndarray, *, samples: np.ndarray | None = None,
                   waves: np.ndarray | None = None, probe: np.ndarray | None = None,
                   sample_flops: np.ndarray | None = None, labels: np.ndarray | None = None,
                   latency: np.ndarray | None = None, progress: bool = False) -> Policy:
        """Fit from prompts and their utility and cost tables (N × P each, P = ``len(self.plans)``);
        ``progress`` shows a bar. ``samples`` / ``waves``: each plan's expected samples and waves per
        prompt (:func:`~isocompute.policy.plans.arrays.plan_arrays`), needed for adaptive plans. ``C`` is what
        the samples cost; the probe's declared cost and the extra features' cost (``feature_cost_``) are added
        to every entry here. ``sample_flops``: one sample's FLOPs per
        training prompt, needed only to price extra features in samples (unless the config declares
        ``feature_cost``). ``labels``: the utilities the learners imitate (N × A, default ``U``; e.g.
        shrunk ones, :mod:`isocompute.policy.learn.shrinkage`) — calibration, the learner choice and the
        never-worse chain always score ``U``. ``latency``: each plan's expected latency per prompt in sample
        lengths, wave overhead included — required exactly when the config has a ``latency_range``
        (:mod:`isocompute.policy.latency`).
        """
        cfg = self.config
        prompts, U, C = check_arrays(cfg, len(self.plans), prompts, U, C)
        S, W = plan_stats(self.plans, U.shape, samples, waves)
        labels = U if labels is None else np.asarray(labels, dtype=np.float64)
        if labels.shape != U.shape:
            raise InputError(f"labels must have the utilities' shape {U.shape}; got {labels.shape}.")
        n = len(prompts)
        probe_col = self._probe_column(n, probe)
        self._fit_features(prompts, sample_flops)
        C = C + self.probe_cost + self.feature_cost_
        self._check_reach(C)
        latency_budgets.check_latency(cfg, latency, U.shape)
        X = self._with_probe(self.features_.transform(prompts), probe_col)
        self.action_costs_ = C.mean(axis=0)
        self.plan_utility_, self.plan_samples_, self.plan_waves_ = U.mean(axis=0), S.mean(axis=0), W.mean(axis=0)
        self.n_train_ = n
        self.train_lengths_ = np.sort(np.array([len(p) for p in prompts], dtype=np.int64))
        requested = budget_grid(*cfg.budget_range, N_CALIBRATION)
        targets = (np.array([allocate_plans(U, C, float(b), rounding="mix").mean_cost for b in requested]) if
                   cfg.calibrate_to == "oracle" else requested.copy())  # oracle: less where samples buy nothing
        job = CrossFit(X, U, C, prompt_uniforms(prompts), crossfit_folds(n, cfg.calibration_folds, cfg.seed),
                       requested, targets, labels, plans=self.plans if self.has_menu else None,
                       samples=S if self.has_menu else None, paid=self.paid_per_request)
        names = LEARNERS if cfg.learner == "auto" else (cfg.learner,)
        from tqdm.auto import tqdm

        self.learners_: dict[str, FittedLearner] = {}
        held_out: dict[str, Callable[[float], np.ndarray]] = {}  # budget → out-of-fold actions
        with tqdm(total=len(names) * len(job.folds), desc="fit: members", unit="model", disable=not progress) as bar:
            for name in names:
                self.learners_[name], held_out[name] = fit_learner(name, job, cfg, self.action_costs_, bar.update)
        self.default_learner_, self.selection_ = select_learner(held_out, U, C, cfg)
        Cs = C - self.paid_per_request  # the fixed plan pays neither probe nor features
        self.fixed_budgets_ = (budget_table(U, Cs, requested, seed=cfg.seed, unit=Cs[:, self.ladder[0]])
                               if cfg.heldout_fixed else None)
        self.fallback_ = {name: self._choose_rules(job, oof) for name, oof in held_out.items()}
        self.latency_ = None if latency is None else latency_budgets.fit_latency(self, job, latency)
        return self

    def _choose_rules(self, job: CrossFit, oof: Callable[[float], np.ndarray]) -> RuleChain:
        """The never-worse chain at every calibration budget: a learner's out-of-fold scores against the
        rules after it (:mod:`isocompute.policy.fallback`)."""
        cfg = self.config
        if not cfg.fallback:
            return RuleChain.single(LEARNED, job.requested)
        acts = [oof(float(b)) for b in job.requested]
        scores = {LEARNED: np.stack([job.U[job.rows, a] for a in acts])}
        costs = {LEARNED: np.stack([job.C[job.rows, a] for a in acts])}
        if FIXED_PLAN in cfg.fallback:
            C = job.C - self.paid_per_request
            kw = dict(seed=cfg.seed, heldout=cfg.heldout_fixed, unit=C[:, self.ladder[0]])
            scores[FIXED_PLAN], costs[FIXED_PLAN] = fixed_plan_oof(job.U, C, job.folds, job.requested, **kw)
        if UNIFORM in cfg.fallback:
            lad = self.ladder
            scores[UNIFORM] = uniform_utilities(job.U[:, lad], self.sample_action_costs[lad], job.requested)
            costs[UNIFORM] = uniform_oof_costs(job.C[:, lad] - self.paid_per_request, job.folds, job.requested)
        levels = {FIXED_PLAN: cfg.fixed_plan_level} if FIXED_PLAN in scores else None
        # the spend check (issue 32) where the fixed plan is served at its held-out-searched budget
        return choose_rules(scores, job.requested, level=cfg.fallback_level, margin=cfg.fallback_margin,
                            seed=cfg.seed, rule_levels=levels, costs=costs if cfg.heldout_fixed else None)

    def _fit_features(self, prompts: list[str], sample_flops: np.ndarray | None) -> None:
        """Fit the features first: the extra blocks' cost is what their encoder spends on these prompts."""
        cfg = self.config
        measure = bool(cfg.feature_extras) and cfg.feature_cost is None and cfg.cost_unit == "samples"
        if measure and sample_flops is None:  # before the (slow) encoder runs
            raise InputError(f"the extra features {list(cfg.feature_extras)} are paid in samples, which needs one "
                             "sample's FLOPs per training prompt: pass model_flops= (the served model's config) "
                             "or sample_flops=, or declare feature_cost= in the config.")
        self.features_ = PromptFeatures(n_components=cfg.n_components, seed=cfg.seed, extras=cfg.feature_extras,
                                        extra_components=cfg.extra_components).fit(prompts)
        self.feature_cost_ = (cfg.feature_cost if cfg.feature_cost is not None
                              else self.features_.feature_cost_per_prompt(cfg.cost_unit, sample_flops))

    def _check_reach(self, C: np.ndarray) -> None:
        """BudgetError unless the actions (paid costs included) can spend the whole budget range on C."""
        lo, hi = feasible_range(C)
        b_lo, b_hi = self.config.budget_range
        if b_lo < lo * (1 - 1e-9) or b_hi > hi * (1 + 1e-9):
            paid = self._paid_note()
            raise BudgetError(f"budget range [{b_lo:g}, {b_hi:g}] is outside what the "
                              f"{self._menu_note()} can spend on this table, [{lo:.6g}, {hi:.6g}] mean "
                              f"{self.config.cost_unit} per prompt{f' (each action includes {paid})' if paid else ''}; "
                              "pass --budgets within it.")

    # ------------------------------------------------------------------------------------------ serving
    def _check_fitted(self) -> None:
        if not hasattr(self, "learners_"):
            raise InputError("the policy is not fitted; call fit(table) or Policy.load(dir).")

    @cached_property
    def plans(self) -> tuple[Plan, ...]:
        """The plan menu (action a is ``plans[a]``): ``config.plans``, or ``none@k`` for k ∈ actions."""
        return menu_of(self.config.plans, self.config.actions)

    @property
    def has_menu(self) -> bool:
        """Whether the columns are a menu the learner reads by descriptors (plans; a multi-model policy's
        actions), not k samples at once."""
        return bool(self.config.plans)

    @property
    def models(self) -> tuple[str, ...]:
        """The model names a multi-model policy serves, cheapest first; () for a single-model policy."""
        return ()

    @cached_property
    def ladder(self) -> np.ndarray:
        """Indices into :attr:`plans` of the uniform ladder ``none@k``, k ∈ ``config.actions``."""
        return ladder_columns(self.plans, self.config.actions)

    @property
    def actions(self) -> tuple[int, ...]:
        """Each action's k: its plan's maximum samples (``config.actions`` for a one-wave menu)."""
        return tuple(p.max_samples for p in self.plans)

    def _menu_note(self) -> str:
        cfg = self.config
        if not cfg.plans:
            return f"actions {list(cfg.actions)}"
        return f"{len(self.plans)} plans (up to {max(self.actions)} samples)"

    def fixed_plan_at(self, budget: float) -> Any:
        """The fixed-plan rule's choice at ``budget`` (:func:`isocompute.policy.plans.fixed_rule.fixed_plan_at`)."""
        g = internal_budget(getattr(self, "fixed_budgets_", None), budget)  # held-out search (issue 32)
        return fixed_plan_at(self.plan_utility_, self.sample_action_costs, g)

    def fallback_mix(self, rule: str, budget: float) -> tuple[int, int, float]:
        """(lo, hi, q): the plans a fallback rule (``fixed_plan`` or ``uniform``) mixes at ``budget``, q the dearer's share."""
        if rule == UNIFORM:
            lo, hi, q = uniform_mix(self.sample_action_costs[self.ladder], budget)
            return int(self.ladder[lo]), int(self.ladder[hi]), q
        c = self.fixed_plan_at(budget)
        return int(c.lo), int(c.hi), float(c.mix)

    def fallback_actions(self, rule: str, u: np.ndarray, budget: float, *, match: str = "calibrated") -> np.ndarray:
        """Plan index per prompt under a fallback rule's mix, drawn by the prompts' mixing uniforms ``u``."""
        return mix_actions(u, *self.fallback_mix(rule, budget), match=match)

    @property
    def budget_range(self) -> tuple[float, float]:
        return self.config.budget_range

    @property
    def sample_action_costs(self) -> np.ndarray:
        """Mean training cost of each action without what every request pays first: the uniform rule's."""
        return self.action_costs_ - self.paid_per_request

    def rule_at(self, budget: float, learner: str | None = None) -> RuleChoice:
        """Which rule of the never-worse chain serves at ``budget`` (the nearest grid budget's choice) for
        ``learner`` (default: the default learner), and why."""
        self._check_fitted()
        name = learner or self.default_learner_
        if name not in self.learners_:
            raise InputError(f"learner {name!r} is not in this policy; it has {', '.join(self.learners_)}.")
        return self.fallback_[name].at(self.check_budget(budget))

    def needs_features(self, budget: float, learner: str | None = None, latency_budget: float | None = None) -> bool:
        """Whether a decision at ``budget`` (and ``latency_budget``) reads the prompt features (and the
        probe): only where the learned rule serves (the fixed plan and uniform read none)."""
        if latency_budget is not None:
            return latency_budgets.rule_at(self, self.check_budget(budget), latency_budget) == LEARNED
        return self.rule_at(budget, learner).rule == LEARNED

    @property
    def probe_cost(self) -> float:
        """The probe's declared cost per request in ``cost_unit`` (0 without a probe)."""
        return 0.0 if self.config.probe is None else self.config.probe.cost

    @property
    def feature_names(self) -> list[str]:
        """Names of the columns of :meth:`features`: the text features, then the probe's."""
        self._check_fitted()
        probe = [] if self.config.probe is None else [f"probe_{self.config.probe.name}"]
        return list(self.features_.feature_names_) + probe

    @property
    def paid_per_request(self) -> float:
        """What every request pays before sampling, in ``cost_unit``: the probe's and the extra features' costs."""
        return self.probe_cost + getattr(self, "feature_cost_", 0.0)

    def _paid_note(self) -> str:
        """"the probe's 0.43 and the extra features' 3.2 per request" (empty without either)."""
        parts = []
        if self.config.probe is not None:
            parts.append(f"the probe's {self.probe_cost:.4g}")
        if self.config.feature_extras:
            parts.append(f"the extra features' ({', '.join(self.config.feature_extras)}) "
                         f"{getattr(self, 'feature_cost_', 0.0):.4g}")
        return " and ".join(parts) + " per request" if parts else ""

    def _probe_column(self, n: int, probe: Any) -> np.ndarray | None:
        """The probe values as an (n,) float column, or InputError saying what to pass."""
        return probe_column(self.config.probe, n, probe)

    @staticmethod
    def _with_probe(X: np.ndarray, col: np.ndarray | None) -> np.ndarray:
        return X if col is None else np.column_stack([X, col])

    def features(self, prompts: Sequence[str], probe: np.ndarray | None = None) -> np.ndarray:
        """The learners' input matrix: text features of ``prompts``, then the probe column if the policy
        has one (``probe`` required exactly then; InputError otherwise). Used by decide and evaluation."""
        self._check_fitted()
        col = self._probe_column(len(prompts), probe)
        return self._with_probe(self.features_.transform(prompts), col)

    def check_budget(self, budget: float) -> float:
        """The budget as a float, or BudgetError naming the trained range."""
        lo, hi = self.config.budget_range
        try:
            b = float(budget)
        except (TypeError, ValueError):
            raise BudgetError(f"budget must be a number, not {budget!r}; pick one in [{lo:g}, {hi:g}].") from None
        if not (np.isfinite(b) and lo * (1 - 1e-12) <= b <= hi * (1 + 1e-12)):
            paid = self._paid_note()
            raise BudgetError(f"budget {b:g} is outside the range [{lo:g}, {hi:g}] mean {self.config.cost_unit} "
                              f"per request{f' ({paid} included)' if paid else ''} that this policy was trained for; request a budget in "
                              "that range or re-fit with a wider --budgets.")
        return min(max(b, lo), hi)

    def prompt_keys(self, prompts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Per prompt: the mixing uniform u and the member that serves it (both hashes of the text)."""
        k = self.config.calibration_folds
        route = np.minimum((prompt_uniforms(prompts, ROUTE_SEED) * k).astype(np.intp), k - 1)
        return prompt_uniforms(prompts, MIX_SEED), route

    def decide_features(self, X: np.ndarray, u: np.ndarray, route: np.ndarray, budget: float,
                        learner: str | None = None, *, match: str = "calibrated") -> tuple[np.ndarray, float]:
        """(action index per prompt, knob) from precomputed features and :meth:`prompt_keys`
        (:func:`isocompute.policy.learn.members.member_actions`; ``match="batch"`` solves the knob on the batch)."""
        return member_actions(self, X, u, route, budget, learner or self.default_learner_, match=match)

    def batch_knob(self, X: np.ndarray, u: np.ndarray, route: np.ndarray, budget: float, learner: str) -> float:
        """The knob at which *this batch's* mean expected cost is nearest ``budget``
        (:func:`isocompute.policy.learn.members.batch_knob`)."""
        return batch_knob(self, X, u, route, budget, learner)

    def decide(self, prompts: Sequence[str], budget: float, *, probe: np.ndarray | None = None,
               learner: str | None = None, match: str = "calibrated", model: str | None = None,
               latency_budget: float | None = None) -> Decision:
        """Plans for ``prompts`` at mean cost ``budget`` per request (pure; features included).

        ``match="calibrated"`` (default): each prompt's action depends only on its text and the budget,
        through the calibration table (what a single request gets). ``match="batch"``: the knob is solved
        on the batch so its mean expected cost is the budget (offline batch jobs; see :meth:`batch_knob`).
        ``probe``: the probe's value per prompt, required exactly when the policy has a probe; the costs
        reported then include the probe's. ``model`` pins a model: a single-model policy serves none by
        name (:attr:`models` is empty), so any name is an InputError; a multi-model policy
        (:class:`~isocompute.policy.multi.policy.MultiPolicy`) restricts its actions to that model.
        ``latency_budget``: the mean latency per request in sample lengths, within the policy's
        ``latency_range`` (:func:`isocompute.policy.latency.decide_latency`; the utility learner decides).
        """
        self._check_fitted()
        if model is not None:
            raise InputError(f"this policy serves one model and names none, so it cannot be pinned to {model!r}; "
                             "drop the model, or fit a multi-model policy (isocompute fit --outcomes NAME=TABLE …).")
        b = self.check_budget(budget)
        if latency_budget is not None:
            return latency_budgets.decide_latency(self, prompts, b, latency_budget, probe=probe, match=match)
        name = learner or self.default_learner_
        if name not in self.learners_:
            raise InputError(f"learner {name!r} is not in this policy; it has {', '.join(self.learners_)}.")
        choice = self.fallback_[name].at(b)
        if choice.rule != LEARNED:
            u, _ = self.prompt_keys(prompts)
            a = self.fallback_actions(choice.rule, u, b, match=match)
            return make_decision(self, a, b, name, rule=choice.rule, evidence=choice.evidence(), match=match)
        X = self.features(prompts, probe)
        u, route = self.prompt_keys(prompts)
        a, knob = self.decide_features(X, u, route, b, name, match=match)
        return make_decision(self, a, b, name, rule=LEARNED, evidence=choice.evidence(), match=match, knob=knob,
                             knob_name=self.learners_[name].calibration.knob,
                             predicted=predicted_costs(self, X, route, a, name))

    # -------------------------------------------------------------------------------------- persistence
    def save(self, out_dir: str | Path, *, inputs: dict[str, str] | None = None,
             extra_files: Mapping[str, bytes] | None = None) -> Path:
        """Write the artifact directory atomically (:mod:`isocompute.policy.persistence`);
        ``extra_files`` (name → bytes) are added to it and checksummed like the rest."""
        self._check_fitted()
        return save_policy(self, out_dir, inputs=inputs, extra_files=extra_files)

    @classmethod
    def load(cls, artifact_dir: str | Path) -> Policy:
        """Read a policy artifact; raises :class:`ArtifactError` on a kind/schema/checksum mismatch."""
        return load_policy(cls, artifact_dir)
