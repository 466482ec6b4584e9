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

Artifact (``save``/``load``; manifest kind ``policy``, schema 1): ``policy.json`` (config — with the
probe spec or null —, actions, action costs (probe and extra features included), the extra
features' cost per request ``feature_cost``, budget range, default learner and why,
feature names, the training prompt lengths the heuristic baseline uses), ``features.json`` +
``features_svd.npz``, and per learner ``<learner>/model_<j>.txt`` (LightGBM text, one per member) +
``<learner>/state.json`` (hyper-parameters, calibration table), plus any ``extra_files`` the caller
adds (``isocompute fit`` caches the training prompts' probe values there). No pickle. ``load``
refuses another kind, schema or a checksum mismatch; artifacts written before the probe or the extra
features existed load with ``probe=None``, ``feature_extras=()`` and ``feature_cost_ = 0``.

Ignores: per-request caps (``max_samples`` is the gateway's), and how probe values are computed (the
engines' job; the spec only records name, tokens, prompt format, model and cost).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from isocompute.artifacts import artifact_writer, load_manifest
from isocompute.errors import ArtifactError, BudgetError, InputError
from isocompute.policy.calibration import (
    Calibration,
    calibrate_by_bisection,
    calibrate_mixed_grid,
    grid_position,
    mixed_grid_index,
)
from isocompute.policy.config import (  # noqa: F401  (re-exported: the policy's public names)
    COST_UNITS,
    EXTRA_PACKAGES,
    LEARNERS,
    PROBE_FORMATS,
    PROBES,
    PolicyConfig,
    ProbeSpec,
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
    UtilityRegressor,
    budget_grid,
    price,
    prompt_uniforms,
)
from isocompute.solver.allocate import allocate, feasible_range

KIND = "policy"
SCHEMA_VERSION = 1
N_CALIBRATION = 65  # entries of the calibration table over the budget range


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


@dataclass
class _Fitted:
    """One learner: its cross-fitted members (member j never saw calibration fold j) and its table."""

    models: list[OracleClassifier] | list[UtilityRegressor]
    calibration: Calibration


@dataclass(frozen=True, eq=False)
class _CrossFit:
    """What every learner's cross-fit shares: features X, U and C (paid costs included), the learners'
    training labels (U itself, or its shrunk version: :mod:`isocompute.policy.shrinkage`), the mixing
    uniforms u, the calibration folds, and the calibration grid's requested budgets and spend targets."""

    X: np.ndarray
    U: np.ndarray
    C: np.ndarray
    u: np.ndarray
    folds: list[tuple[np.ndarray, np.ndarray]]
    requested: np.ndarray
    targets: np.ndarray
    labels: np.ndarray

    @property
    def rows(self) -> np.ndarray:
        return np.arange(self.U.shape[0])


def _tick(bar: Any, model: Any) -> Any:
    bar.update(1)
    return model


def crossfit_folds(n: int, k: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Seeded k-fold split of ``range(n)``: a list of (train, held-out) sorted index arrays."""
    perm = np.random.default_rng(seed).permutation(n)
    parts = np.array_split(perm, k)
    return [(np.sort(np.concatenate(parts[:j] + parts[j + 1:])), np.sort(parts[j])) for j in range(k)]


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
        job = _CrossFit(X, U, C, prompt_uniforms(prompts), crossfit_folds(n, cfg.calibration_folds, cfg.seed),
                        requested, targets, labels)
        names = LEARNERS if cfg.learner == "auto" else (cfg.learner,)
        from tqdm.auto import tqdm

        self.learners_: dict[str, _Fitted] = {}
        held_out: dict[str, Callable[[float], np.ndarray]] = {}  # budget → out-of-fold actions
        with tqdm(total=len(names) * len(job.folds), desc="fit: members", unit="model", disable=not progress) as bar:
            for name in names:
                fit_one = self._fit_classifier if name == "classifier" else self._fit_utility
                self.learners_[name], held_out[name] = fit_one(job, bar)
        self.default_learner_, self.selection_ = _select(held_out, U, C, cfg)
        self.fallback_ = {name: self._choose_rules(job, oof) for name, oof in held_out.items()}
        return self

    def _choose_rules(self, job: _CrossFit, oof: Callable[[float], np.ndarray]) -> RuleChain:
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

    def _hyper(self) -> dict[str, Any]:
        cfg = self.config
        return {"n_rounds": cfg.n_rounds, "num_leaves": cfg.num_leaves, "learning_rate": cfg.learning_rate,
                "min_data_in_leaf": cfg.min_data_in_leaf, "seed": cfg.seed}

    def _fit_classifier(self, job: _CrossFit, bar: Any) -> tuple[_Fitted, Callable[[float], np.ndarray]]:
        """The classifier's members, its mixed-grid calibration and its out-of-fold actions per budget."""
        cfg = self.config
        clfs = [_tick(bar, OracleClassifier(n_budget_grid=cfg.n_budget_grid, **self._hyper()).fit(
            job.X[tr], job.labels[tr], job.C[tr], cfg.budget_range)) for tr, _ in job.folds]
        grid = clfs[0].budget_grid_
        n = job.rows.size
        grid_act = np.empty((grid.size, n), dtype=np.intp)
        for m, (_, ho) in zip(clfs, job.folds, strict=True):
            grid_act[:, ho] = m.grid_actions(job.X[ho])
        cal = calibrate_mixed_grid(job.requested, job.targets, grid, job.C[job.rows[None, :], grid_act], job.u,
                                   n_validation=n)

        def oof(b: float) -> np.ndarray:
            return grid_act[mixed_grid_index(grid_position(cal(b), grid), job.u, grid.size), job.rows]

        return _Fitted(clfs, cal), oof

    def _fit_utility(self, job: _CrossFit, bar: Any) -> tuple[_Fitted, Callable[[float], np.ndarray]]:
        """The utility learner's members, its bisection calibration of λ and its out-of-fold actions."""
        ks = np.asarray(self.config.actions)
        models = [_tick(bar, UtilityRegressor(**self._hyper()).fit(job.X[tr], job.labels[tr], ks))
                  for tr, _ in job.folds]
        Uh = np.empty_like(job.U)
        for m, (_, ho) in zip(models, job.folds, strict=True):
            Uh[ho] = m.predict_utilities(job.X[ho])
        costs = self.action_costs_

        def cost_at(lam: float) -> float:
            return float(job.C[job.rows, price(Uh, lam, costs, job.u)].mean())

        cal = calibrate_by_bisection(job.requested, job.targets, cost_at, _max_useful_price(Uh, costs),
                                     n_validation=job.rows.size)

        def oof(b: float) -> np.ndarray:
            return price(Uh, cal(b), costs, job.u)

        return _Fitted(models, cal), oof

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

            cal = calibrate_by_bisection(b, b, cost_at, _max_useful_price(Uh, costs), n_validation=n)
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
        """Write the artifact directory atomically (see the module docstring for its files);
        ``extra_files`` (name → bytes) are added to it and checksummed like the rest."""
        self._check_fitted()
        with artifact_writer(out_dir, kind=KIND, schema_version=SCHEMA_VERSION, inputs=inputs,
                             params=self.config.to_dict()) as d:
            self.features_.save(d)
            meta = {
                "config": self.config.to_dict(),
                "actions": list(self.config.actions),
                "action_costs": self.action_costs_.tolist(),
                "cost_unit": self.config.cost_unit,
                "budget_range": list(self.config.budget_range),
                "default_learner": self.default_learner_,
                "selection": self.selection_,
                "learners": sorted(self.learners_),
                "n_train": self.n_train_,
                "probe": None if self.config.probe is None else asdict(self.config.probe),
                "feature_cost": self.feature_cost_,
                "feature_names": self.feature_names,
                "heuristic": {"train_prompt_lengths": self.train_lengths_.tolist()},
                "fallback": {name: chain.to_dict() for name, chain in self.fallback_.items()},
                "training_data": getattr(self, "training_data_", None),
            }
            (d / "policy.json").write_text(json.dumps(meta, indent=2) + "\n")
            for name, f in self.learners_.items():
                (d / name).mkdir()
                for j, model in enumerate(f.models):
                    (d / name / f"model_{j}.txt").write_text(model.booster_.model_to_string())
                state = {"models": [m.state() for m in f.models], "calibration": f.calibration.to_dict()}
                (d / name / "state.json").write_text(json.dumps(state, indent=2) + "\n")
            for fname, data in (extra_files or {}).items():
                if Path(fname).name != fname or (d / fname).exists():
                    raise InputError(f"extra file {fname!r} must be a new plain file name in the artifact.")
                (d / fname).write_bytes(data)
        return Path(out_dir)

    @classmethod
    def load(cls, artifact_dir: str | Path) -> Policy:
        """Read a policy artifact; raises :class:`ArtifactError` on a kind/schema/checksum mismatch."""
        d = Path(artifact_dir)
        manifest = load_manifest(d, kind=KIND, schema_version=SCHEMA_VERSION)
        try:
            meta = json.loads((d / "policy.json").read_text())
            obj = cls(PolicyConfig.from_dict(meta["config"]))
            obj.features_ = PromptFeatures.load(d)
            obj.action_costs_ = np.asarray(meta["action_costs"], dtype=np.float64)
            obj.feature_cost_ = float(meta.get("feature_cost", 0.0))  # absent before the extra features
            obj.default_learner_ = meta["default_learner"]
            obj.selection_ = meta["selection"]
            obj.n_train_ = meta["n_train"]
            obj.train_lengths_ = np.asarray(meta["heuristic"]["train_prompt_lengths"], dtype=np.int64)
            grid = budget_grid(*obj.config.budget_range, N_CALIBRATION)
            chains = meta.get("fallback") or {}  # absent before the fallback: the learned rule everywhere
            obj.fallback_ = {name: RuleChain.from_dict(chains[name]) if name in chains else RuleChain.single(LEARNED, grid)
                             for name in meta["learners"]}
            obj.learners_ = {}
            for name in meta["learners"]:
                state = json.loads((d / name / "state.json").read_text())
                model_cls = OracleClassifier if name == "classifier" else UtilityRegressor
                models = [model_cls.from_state(st, (d / name / f"model_{j}.txt").read_text())
                          for j, st in enumerate(state["models"])]
                if len(models) != obj.config.calibration_folds:
                    raise ValueError(f"{name} has {len(models)} members, the config says "
                                     f"{obj.config.calibration_folds}")
                obj.learners_[name] = _Fitted(models, Calibration.from_dict(state["calibration"]))
        except (OSError, KeyError, TypeError, ValueError, InputError) as e:
            raise ArtifactError(f"{d}: the policy artifact is incomplete or malformed ({type(e).__name__}: {e}); "
                                "re-create it with `isocompute fit`.") from e
        obj.manifest_ = manifest
        return obj


def task_groups(table: Any) -> list[str]:
    """Each prompt's task (its meta's ``task``, else one group): what shrinkage shrinks toward."""
    return [str(m.get("task", "")) for m in table.metas]


def _max_useful_price(U_hat: np.ndarray, action_costs: np.ndarray) -> float:
    """A price at which every prompt takes its cheapest action: above every pairwise utility slope."""
    du = float(U_hat.max() - U_hat.min()) if U_hat.size else 0.0
    dc = float(np.diff(action_costs).min()) if action_costs.size > 1 else 1.0
    return (du + 1.0) / max(dc, 1e-300)


def _select(held_out: dict[str, Callable[[float], np.ndarray]], U: np.ndarray, C: np.ndarray,
            cfg: PolicyConfig) -> tuple[str, dict[str, Any]]:
    """The default learner: higher mean out-of-fold accuracy at calibrated budgets (ties → classifier)."""
    budgets = budget_grid(*cfg.budget_range, 9)
    rows = np.arange(U.shape[0])
    scores: dict[str, dict[str, float]] = {}
    for name, oof in held_out.items():
        acc, err = [], []
        for b in budgets:
            a = oof(float(b))
            acc.append(float(U[rows, a].mean()))
            err.append(abs(float(C[rows, a].mean()) - b) / b if b > 0 else 0.0)
        scores[name] = {"heldout_accuracy": float(np.mean(acc)), "heldout_cost_error": float(np.mean(err))}
    names = list(held_out)
    if len(names) == 1:
        return names[0], {"rule": f"learner {names[0]!r} was requested", "scores": scores}
    c, u = scores["classifier"]["heldout_accuracy"], scores["utility"]["heldout_accuracy"]
    best = "utility" if u > c + 1e-12 else "classifier"
    why = (f"{best}: mean out-of-fold accuracy {max(c, u):.4f} vs {min(c, u):.4f} over {budgets.size} budgets in "
           f"[{budgets[0]:g}, {budgets[-1]:g}] ({cfg.calibration_folds}-fold cross-fit on {U.shape[0]} prompts)"
           + (" (tie: the classifier, the seed's learner, wins)" if abs(u - c) <= 1e-12 else ""))
    return best, {"rule": "higher mean out-of-fold accuracy at calibrated budgets; ties → classifier",
                  "why": why, "scores": scores}
