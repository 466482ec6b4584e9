"""The fitted policy: prompt features → a learner → an action (k samples) per prompt at a requested budget.

``Policy(PolicyConfig(...)).fit(table)`` fits the features on the table's prompts, splits the prompts
into ``calibration_folds`` seeded folds and trains one *member* of each learner per fold on the other
folds (cross-fitting). Every training prompt is then decided by the member that never saw it, and the
budget calibration (:mod:`isocompute.policy.calibration`) is measured on those out-of-fold decisions:
the knob for budget B is set so that their mean cost is B (or, with ``calibrate_to="oracle"``, what
the oracle spends at B). At serving time a
prompt is routed to member ``floor(k · h(prompt))`` (h a hash uniform independent of the one used for
mixing), so a new prompt meets exactly the process the calibration measured — what is calibrated is
what is served — at the price of members trained on (k − 1)/k of the data.

With ``learner="auto"`` both learners are fitted and the one with the higher mean out-of-fold accuracy
over the budget range becomes the default (ties go to the classifier, the seed's learner); the reason
is recorded in :attr:`Policy.selection_`.

Never worse than uniform (:mod:`isocompute.policy.fallback`): after the learners, ``fit`` scores each
one's out-of-fold decisions against the budget-matched uniform rule at every calibration budget and
keeps the learned rule only where a paired bootstrap over the training prompts supports its gain
(``fallback_level``, ``fallback_margin``); elsewhere ``decide`` serves uniform — the two actions
adjacent to the budget, mixed per prompt by a hash of its text — and says so on the decision
(``Decision.rule``, ``Decision.rule_evidence``). ``rule_at(budget)`` and ``needs_features(budget)`` tell a
caller beforehand (where uniform serves, no features or probe are needed and none are paid).

``Policy.decide(prompts, budget)`` is pure and fast: features, knob from the calibration table, one
LightGBM call per member present in the batch (single-threaded, no pandas). Decisions depend only on
the prompt text and the budget, so a repeated prompt gets the same k. A budget outside the trained
range raises :class:`~isocompute.errors.BudgetError` naming the range.

Costs: ``cost_unit="samples"`` (default) prices action a at c_a = k_a. With ``"flops"`` the solver's
cost table prices each training prompt from its token counts, and serving prices action a at the mean
training cost of that action (a new prompt's completion length is unknown before it is generated).

Probe feature (optional, ``PolicyConfig(probe=ProbeSpec(...))``): one value per prompt from a cheap
model call (the mean token entropy of a short greedy answer, :mod:`isocompute.engines.probe`) joins the
text features as the last column. The policy cannot call a model, so the caller computes the values
and passes them: ``fit_arrays(prompts, U, C, probe=values)``, ``decide(prompts, B, probe=values)``.
The probe is paid on every request, so its declared cost c_p (``ProbeSpec.cost``, in ``cost_unit``) is
added to every action's cost: the policy fits, calibrates and reports with C + c_p, and a budget of 4
samples buys 4 − c_p samples plus the probe. Example: c_p = 0.43 samples, actions 1…16 → the policy
can serve mean budgets in [1.43, 16.43]; a budget below 1.43 is infeasible (BudgetError).

Extra feature blocks (optional, ``PolicyConfig(feature_extras=("minilm",))``): columns that cost a
model call per prompt (a sentence embedding, :mod:`isocompute.policy.embedding`), computed by the
policy itself in ``decide``. Their cost c_f is paid on every request like the probe's: declared from
the encoder's FLOPs (mean over the training prompts; in samples, over one sample's mean FLOPs on the
served model — ``sample_flops``) or declared outright (``PolicyConfig.feature_cost``), and added to
every action's cost in fit, calibration and decide. Example: minilm on the demo table costs 1.9e8 FLOPs
= 3.2 samples of the tiny model, so actions 1…16 serve mean budgets in [4.2, 19.2]; on a 1.5B model with
300-token answers it is ~0.0002 samples.

Artifact (``save``/``load``; manifest kind ``policy``, schema 1): :mod:`isocompute.policy.persistence`.

Ignores: per-request caps (``max_samples`` is the gateway's), and how probe values are computed (the
engines' job; the spec only records name, tokens, prompt format, model and cost).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from isocompute.errors import BudgetError, InputError
from isocompute.policy.calibration import calibrate_by_bisection, calibrate_mixed_grid
from isocompute.policy.config import (  # noqa: F401  (re-exported: the policy's public names)
    COST_UNITS,
    EXTRA_PACKAGES,
    LEARNERS,
    PROBE_FORMATS,
    PROBES,
    PolicyConfig,
    ProbeSpec,
)
from isocompute.policy.crossfit import (
    N_CALIBRATION,
    CrossFit,
    FittedLearner,
    crossfit_folds,
    fit_learner,
    max_useful_price,
    select_learner,
)
from isocompute.policy.fallback import (
    LEARNED,
    UNIFORM,
    RuleChain,
    RuleChoice,
    choose_rules,
    uniform_actions,
    uniform_utilities,
)
from isocompute.policy.features import PromptFeatures
from isocompute.policy.learners import (
    MIX_SEED,
    ROUTE_SEED,
    OracleClassifier,
    budget_grid,
    price,
    prompt_uniforms,
)
from isocompute.policy.persistence import KIND, SCHEMA_VERSION, load_policy, save_policy  # noqa: F401
from isocompute.solver.allocate import allocate, feasible_range


@dataclass(frozen=True, eq=False)
class Decision:
    """What :meth:`Policy.decide` returns for a batch of N prompts.

    ``k``: (N,) samples to draw per prompt; ``action_index``: (N,) index into ``Policy.actions``;
    ``internal_budget`` (classifier) or ``lam`` (utility learner): the calibrated knob used, the other
    is None; ``costs``: (N,) expected cost per prompt and ``expected_cost`` their mean, in ``cost_unit``,
    the probe's and the extra features' costs included; ``probe_cost`` and ``feature_cost``: those
    costs per prompt (0 without a probe / extra features);
    ``match``: how the knob was set (``calibrated`` table or solved on the ``batch``); ``rule``: which
    rule of the never-worse chain decided (``learned``, or ``uniform`` where the learned rule did not
    beat it out of fold at this budget: then k is the budget-matched uniform mix, the knobs are None and
    nothing is paid for the probe or the extra features, which the uniform rule does not read);
    ``rule_evidence``: why (JSON-able: the rule, the grid budget tested, a sentence, and each test's
    gain, 95% CI and number of prompts — :meth:`isocompute.policy.fallback.RuleChoice.evidence`).
    """

    k: np.ndarray
    action_index: np.ndarray
    budget: float
    learner: str
    internal_budget: float | None
    lam: float | None
    costs: np.ndarray
    expected_cost: float
    cost_unit: str
    match: str = "calibrated"
    probe_cost: float = 0.0
    feature_cost: float = 0.0
    rule: str = LEARNED
    rule_evidence: dict[str, Any] | None = None


class Policy:
    """A fitted allocation policy (see the module docstring). Construct with a :class:`PolicyConfig`
    (or its fields as keywords), then :meth:`fit` or :meth:`load`."""

    def __init__(self, config: PolicyConfig | None = None, **kwargs: Any) -> None:
        self.config = config if config is not None else PolicyConfig(**kwargs)

    # ------------------------------------------------------------------------------------------ fitting
    def fit(self, table: Any, *, costs: np.ndarray | None = None, model_flops: Any = None,
            probe: np.ndarray | None = None, sample_flops: np.ndarray | None = None,
            progress: bool = False) -> Policy:
        """Fit on an :class:`~isocompute.solver.outcomes.OutcomeTable`; ``costs`` overrides the cost table;
        ``probe``: the probe's value per prompt (required exactly when the config has a probe).

        ``model_flops`` (the served model's FLOP shape, ``isocompute.flops.load_model_flops``): prices the
        flops cost unit and, with extra features in the samples unit, one sample's FLOPs per training prompt
        (the k = 1 column of the flops cost table), unless ``sample_flops`` gives those directly.

        A ragged table (prompts with fewer samples than the largest action) is kept as the config says
        (``min_samples``, ``ragged``: :func:`isocompute.solver.ragged.prepare`); what was dropped or marked
        is in :attr:`training_data_`. ``costs``, ``probe`` and ``sample_flops`` are per prompt of ``table``.
        """
        from isocompute.solver.costs import cost_table
        from isocompute.solver.ragged import prepare

        cfg = self.config
        prep = prepare(table, cfg.actions, cfg.strategy, min_samples=cfg.min_samples, ragged=cfg.ragged)
        full, table = len(table), prep.table

        def rows(x: Any) -> Any:
            """A per-prompt array of the input table, cut to the kept prompts (a wrong shape is left for
            fit_arrays to report)."""
            if x is None or not prep.dropped or np.shape(x)[:1] != (full,):
                return x
            return np.asarray(x)[prep.kept]

        costs, probe, sample_flops = rows(costs), rows(probe), rows(sample_flops)
        if costs is None:
            costs = cost_table(table.prompt_tokens, table.mean_completion_tokens, cfg.actions,
                               unit=cfg.cost_unit, model=model_flops)
        if (sample_flops is None and cfg.feature_extras and cfg.cost_unit == "samples"
                and cfg.feature_cost is None and model_flops is not None):
            sample_flops = cost_table(table.prompt_tokens, table.mean_completion_tokens, (1,), unit="flops",
                                      model=model_flops)[:, 0]
        labels = None
        if cfg.shrinkage == "eb":
            from isocompute.policy.shrinkage import sampling_variance, shrink_utilities

            var = sampling_variance(table, cfg.actions, cfg.strategy, seed=cfg.seed)
            labels = shrink_utilities(prep.utilities, var, task_groups(table))
        self.fit_arrays(table.prompts, prep.utilities, costs, probe=probe, sample_flops=sample_flops,
                        labels=labels, progress=progress)
        self.training_data_ = {"prompts_in_table": full, "dropped": len(prep.dropped),
                               "dropped_ids": prep.dropped[:20], "min_samples": prep.min_samples,
                               "ragged_prompts": prep.n_ragged, "summary": prep.summary()}
        return self

    def fit_arrays(self, prompts: Sequence[str], U: np.ndarray, C: np.ndarray, *, probe: np.ndarray | None = None,
                   sample_flops: np.ndarray | None = None, labels: np.ndarray | None = None,
                   progress: bool = False) -> Policy:
        """Fit from prompts and their utility and cost tables (N × A each); ``progress`` shows a bar.

        ``C`` is what the samples cost; the probe's declared cost and the extra features' cost
        (``feature_cost_``) are added to every entry here. ``sample_flops``: one sample's FLOPs per
        training prompt, needed only to price extra features in samples (unless the config declares
        ``feature_cost``). ``labels``: the utilities the learners imitate (N × A, default ``U``; e.g.
        shrunk ones, :mod:`isocompute.policy.shrinkage`) — calibration, the learner choice and the
        never-worse chain always score ``U``.
        """
        cfg = self.config
        prompts, U, C = self._check_arrays(prompts, U, C)
        labels = U if labels is None else np.asarray(labels, dtype=np.float64)
        if labels.shape != U.shape:
            raise InputError(f"labels must have the utilities' shape {U.shape}; got {labels.shape}.")
        n = len(prompts)
        probe_col = self._probe_column(n, probe)
        self._fit_features(prompts, sample_flops)
        C = C + self.probe_cost + self.feature_cost_
        self._check_reach(C)
        X = self._with_probe(self.features_.transform(prompts), probe_col)
        self.action_costs_ = C.mean(axis=0)
        self.n_train_ = n
        self.train_lengths_ = np.sort(np.array([len(p) for p in prompts], dtype=np.int64))
        requested = budget_grid(*cfg.budget_range, N_CALIBRATION)
        if cfg.calibrate_to == "oracle":  # B where the budget binds, less where extra samples buy nothing
            targets = np.array([allocate(U, C, float(b), rounding="mix").mean_cost for b in requested])
        else:
            targets = requested.copy()
        job = CrossFit(X, U, C, prompt_uniforms(prompts), crossfit_folds(n, cfg.calibration_folds, cfg.seed),
                        requested, targets, labels)
        names = LEARNERS if cfg.learner == "auto" else (cfg.learner,)
        from tqdm.auto import tqdm

        self.learners_: dict[str, FittedLearner] = {}
        held_out: dict[str, Callable[[float], np.ndarray]] = {}  # budget → out-of-fold actions
        with tqdm(total=len(names) * len(job.folds), desc="fit: members", unit="model", disable=not progress) as bar:
            for name in names:
                self.learners_[name], held_out[name] = fit_learner(name, job, cfg, self.action_costs_, bar.update)
        self.default_learner_, self.selection_ = select_learner(held_out, U, C, cfg)
        self.fallback_ = {name: self._choose_rules(job, oof) for name, oof in held_out.items()}
        return self

    def _choose_rules(self, job: CrossFit, oof: Callable[[float], np.ndarray]) -> RuleChain:
        """The never-worse chain at every calibration budget: a learner's out-of-fold scores against the
        rules after it (:mod:`isocompute.policy.fallback`)."""
        cfg = self.config
        if not cfg.fallback:
            return RuleChain.single(LEARNED, job.requested)
        scores = {LEARNED: np.stack([job.U[job.rows, oof(float(b))] for b in job.requested])}
        if UNIFORM in cfg.fallback:
            scores[UNIFORM] = uniform_utilities(job.U, self.sample_action_costs, job.requested)
        return choose_rules(scores, job.requested, level=cfg.fallback_level, margin=cfg.fallback_margin,
                            seed=cfg.seed)

    def _check_arrays(self, prompts: Sequence[str], U: Any, C: Any) -> tuple[list[str], np.ndarray, np.ndarray]:
        """Prompts as a list and U, C as float arrays of shape (prompts × actions), or InputError."""
        cfg = self.config
        U, C = np.asarray(U, dtype=np.float64), np.asarray(C, dtype=np.float64)
        prompts = list(prompts)
        n = len(prompts)
        if U.shape != (n, len(cfg.actions)) or C.shape != U.shape:
            raise InputError(f"utilities and costs must be (prompts × actions) = ({n}, {len(cfg.actions)}); got "
                             f"{U.shape} and {C.shape}.")
        if n < 4 * cfg.calibration_folds:
            raise InputError(f"a policy with {cfg.calibration_folds} calibration folds needs at least "
                             f"{4 * cfg.calibration_folds} prompts; the table has {n}. Sample more prompts.")
        return prompts, U, C

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
            raise BudgetError(f"budget range [{b_lo:g}, {b_hi:g}] is outside what the actions "
                              f"{list(self.config.actions)} can spend on this table, [{lo:.6g}, {hi:.6g}] mean "
                              f"{self.config.cost_unit} per prompt{f' (each action includes {paid})' if paid else ''}; "
                              "pass --budgets within it.")

    # ------------------------------------------------------------------------------------------ serving
    def _check_fitted(self) -> None:
        if not hasattr(self, "learners_"):
            raise InputError("the policy is not fitted; call fit(table) or Policy.load(dir).")

    @property
    def actions(self) -> tuple[int, ...]:
        return self.config.actions

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

    def needs_features(self, budget: float, learner: str | None = None) -> bool:
        """Whether a decision at ``budget`` reads the prompt features (and the probe): not where uniform serves."""
        return self.rule_at(budget, learner).rule != UNIFORM

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
        spec = self.config.probe
        if spec is None:
            if probe is not None:
                raise InputError("this policy has no probe feature, but probe values were passed; drop probe= "
                                 "or refit with a probe (isocompute fit --probe-model DIR).")
            return None
        if probe is None:
            raise InputError(f"this policy uses the probe feature {spec.name!r} ({spec.max_tokens} greedy tokens "
                             f"of {spec.model or 'its model'}); pass probe= one value per prompt, from "
                             f"isocompute.engines.probe.probe_entropy(engine, prompts, {spec.max_tokens}).")
        try:
            col = np.asarray(probe, dtype=np.float64)
        except (TypeError, ValueError):
            raise InputError("probe values must be numbers, one per prompt.") from None
        if col.shape != (n,):
            raise InputError(f"probe values must be one number per prompt, shape ({n},); got shape {col.shape}.")
        if not np.isfinite(col).all():
            raise InputError(f"probe values must be finite; {int((~np.isfinite(col)).sum())} are not. Recompute "
                             "them with isocompute.engines.probe.probe_entropy.")
        return col

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
        """(action index per prompt, knob) from precomputed features and :meth:`prompt_keys`.

        Member j serves the prompts routed to it. During fitting member j scored exactly the calibration
        fold it did not see, so a new prompt meets the same process the calibration measured. With
        ``match="batch"`` the knob is instead solved on this batch (:meth:`batch_knob`).
        """
        name = learner or self.default_learner_
        f = self.learners_[name]
        if match == "batch":
            knob = self.batch_knob(X, u, route, budget, name)
        elif match == "calibrated":
            knob = f.calibration(budget)
        else:
            raise InputError(f"match must be 'calibrated' or 'batch'; you passed {match!r}.")
        a = np.zeros(X.shape[0], dtype=np.intp)
        for j, model in enumerate(f.models):
            sel = np.flatnonzero(route == j)
            if sel.size == 0:
                continue
            if isinstance(model, OracleClassifier):
                a[sel] = model.predict(X[sel], knob, u[sel])
            else:
                a[sel] = model.predict(X[sel], knob, self.action_costs_, u[sel])
        return a, knob

    def batch_knob(self, X: np.ndarray, u: np.ndarray, route: np.ndarray, budget: float, learner: str) -> float:
        """The knob at which *this batch's* mean expected cost is nearest ``budget``.

        The same search the calibration runs on out-of-fold decisions (bisection on λ for the utility
        learner, the mixed-grid step search for the classifier), run on the batch's own decisions; the
        batch then spends the budget up to one prompt's step, ``max_a Δc_a / N``, instead of up to the
        sampling noise of which prompts happen to arrive. Decisions then depend on the whole batch.
        Example: 1,024 prompts at budget 4 with actions 1…16 spend within 8/1024 = 0.2% of 4.
        """
        f = self.learners_[learner]
        n = X.shape[0]
        b = np.array([float(budget)])
        if n == 0:
            return f.calibration(budget)
        if f.calibration.knob == "lam":
            Uh = np.empty((n, len(self.config.actions)))
            for j, model in enumerate(f.models):
                sel = np.flatnonzero(route == j)
                if sel.size:
                    Uh[sel] = model.predict_utilities(X[sel])
            costs = self.action_costs_

            def cost_at(lam: float) -> float:
                return float(costs[price(Uh, lam, costs, u)].mean())

            cal = calibrate_by_bisection(b, b, cost_at, max_useful_price(Uh, costs), n_validation=n)
        else:
            grid = f.models[0].budget_grid_
            grid_act = np.empty((grid.size, n), dtype=np.intp)
            for j, model in enumerate(f.models):
                sel = np.flatnonzero(route == j)
                if sel.size:
                    grid_act[:, sel] = model.grid_actions(X[sel])
            cal = calibrate_mixed_grid(b, b, grid, self.action_costs_[grid_act], u, n_validation=n)
        return float(cal.values[0])

    def decide(self, prompts: Sequence[str], budget: float, *, probe: np.ndarray | None = None,
               learner: str | None = None, match: str = "calibrated") -> Decision:
        """Actions for ``prompts`` at mean cost ``budget`` per request (pure; features included).

        ``match="calibrated"`` (default): each prompt's action depends only on its text and the budget,
        through the calibration table (what a single request gets). ``match="batch"``: the knob is solved
        on the batch so its mean expected cost is the budget (offline batch jobs; see :meth:`batch_knob`).
        ``probe``: the probe's value per prompt, required exactly when the policy has a probe; the costs
        reported then include the probe's.
        """
        self._check_fitted()
        b = self.check_budget(budget)
        name = learner or self.default_learner_
        if name not in self.learners_:
            raise InputError(f"learner {name!r} is not in this policy; it has {', '.join(self.learners_)}.")
        choice = self.fallback_[name].at(b)
        if choice.rule == UNIFORM:
            u, _ = self.prompt_keys(prompts)
            a = uniform_actions(u, self.sample_action_costs, b, match=match)
            costs = self.sample_action_costs[a]
            return Decision(
                k=np.asarray(self.config.actions, dtype=np.int64)[a], action_index=a, budget=b, learner=name,
                internal_budget=None, lam=None, costs=costs, expected_cost=float(costs.mean()) if costs.size else 0.0,
                cost_unit=self.config.cost_unit, match=match, rule=UNIFORM, rule_evidence=choice.evidence())
        X = self.features(prompts, probe)
        u, route = self.prompt_keys(prompts)
        a, knob = self.decide_features(X, u, route, b, name, match=match)
        costs = self.action_costs_[a]
        is_budget = self.learners_[name].calibration.knob == "internal_budget"
        return Decision(
            k=np.asarray(self.config.actions, dtype=np.int64)[a], action_index=a, budget=b, learner=name,
            internal_budget=knob if is_budget else None, lam=None if is_budget else knob,
            costs=costs, expected_cost=float(costs.mean()) if costs.size else 0.0,
            cost_unit=self.config.cost_unit, match=match, probe_cost=self.probe_cost,
            feature_cost=self.feature_cost_, rule=LEARNED, rule_evidence=choice.evidence(),
        )

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


def task_groups(table: Any) -> list[str]:
    """Each prompt's task (its meta's ``task``, else one group): what shrinkage shrinks toward."""
    return [str(m.get("task", "")) for m in table.metas]
