"""Cross-fitting a policy's learners: k members per learner, each calibrated on the prompts it never saw.

The training prompts are split into ``calibration_folds`` seeded folds (:func:`crossfit_folds`); member j
of a learner is trained on every fold but j and decides fold j. Those out-of-fold decisions are what
the budget calibration inverts (:mod:`isocompute.policy.learn.calibration`) and what the learner choice
(:func:`select_learner`) and the never-worse chain (:mod:`isocompute.policy.fallback`) score, because
they are the process a new prompt meets: at serving time a prompt is routed to one member by a hash of
its text, and that member never saw it either.

* :func:`fit_learner` ``("classifier", …)`` — :class:`~isocompute.policy.learn.learners.OracleClassifier`
  members; each decides its fold at every grid budget, and the mixed-grid calibration maps a requested
  budget to an internal budget b'.
* :func:`fit_learner` ``("utility", …)`` — :class:`~isocompute.policy.learn.learners.UtilityRegressor`
  members; each predicts its fold's utilities Û, and bisection on λ maps a budget to a price. With a
  plan menu (``job.plans``) the action column is each plan's descriptors, computed on the member's own
  training prompts (:func:`~isocompute.policy.plans.menu.plan_descriptors`), and each member has a cost
  head (:mod:`isocompute.policy.learn.cost_head`, ``plan_costs="predicted"``) that prices adaptive plans per
  prompt: decisions are ``argmax Û − λĈ``, while the calibration measures the *true* cost C of those
  decisions on the fold, as for k samples.

Both return the fitted learner and ``oof(b)``: the out-of-fold action of every training prompt at
budget b. Example: 800 prompts, 3 folds → 3 members per learner trained on 533–534 prompts each, and
``oof(4.0)`` is 800 actions, each from the member that did not see that prompt.

Ignores: how the features are made (:mod:`isocompute.policy.features.prompt`) and what is paid per request
(the caller adds it to C before calling).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from isocompute.policy.config import PolicyConfig
from isocompute.policy.learn.calibration import (
    Calibration,
    calibrate_by_bisection,
    calibrate_mixed_grid,
    grid_position,
    mixed_grid_index,
)
from isocompute.policy.learn.learners import OracleClassifier, UtilityRegressor, budget_grid, price

N_CALIBRATION = 65  # entries of the calibration table over the budget range
OutOfFold = Callable[[float], np.ndarray]  # budget → out-of-fold action index per training prompt


@dataclass
class FittedLearner:
    """One learner: its cross-fitted members (member j never saw calibration fold j) and its table."""

    models: list[OracleClassifier] | list[UtilityRegressor]
    calibration: Calibration


@dataclass(frozen=True, eq=False)
class CrossFit:
    """What every learner's cross-fit shares: features X, U and C (paid costs included), the mixing
    uniforms u, the calibration folds, the calibration grid's requested budgets and spend targets, and
    the learners' training labels (U itself, its shrunk version: :mod:`isocompute.policy.learn.shrinkage`, or U
    with the columns the learners may not choose set to 0: :mod:`isocompute.policy.multi.fit`; the plan
    descriptors are computed on them);
    with a plan menu, the ``plans``, their expected ``samples`` (N, P) and what every request pays first
    (``paid``: probe and extra features, already in C)."""

    X: np.ndarray
    U: np.ndarray
    C: np.ndarray
    u: np.ndarray
    folds: list[tuple[np.ndarray, np.ndarray]]
    requested: np.ndarray
    targets: np.ndarray
    labels: np.ndarray
    plans: tuple[Any, ...] | None = None
    samples: np.ndarray | None = None
    paid: float = 0.0

    @property
    def rows(self) -> np.ndarray:
        return np.arange(self.U.shape[0])


def crossfit_folds(n: int, k: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Seeded k-fold split of ``range(n)``: a list of (train, held-out) sorted index arrays."""
    perm = np.random.default_rng(seed).permutation(n)
    parts = np.array_split(perm, k)
    return [(np.sort(np.concatenate(parts[:j] + parts[j + 1:])), np.sort(parts[j])) for j in range(k)]


def _hyper(cfg: PolicyConfig) -> dict[str, Any]:
    return {"n_rounds": cfg.n_rounds, "num_leaves": cfg.num_leaves, "learning_rate": cfg.learning_rate,
            "min_data_in_leaf": cfg.min_data_in_leaf, "seed": cfg.seed}


def fit_learner(name: str, job: CrossFit, cfg: PolicyConfig, action_costs: np.ndarray,
                tick: Callable[[int], Any] = lambda _: None) -> tuple[FittedLearner, OutOfFold]:
    """Fit learner ``name`` (``classifier`` or ``utility``) on ``job``: its members, its calibration and
    its out-of-fold actions; ``tick(1)`` after each member (a progress bar's ``update``)."""
    if name == "classifier":
        return _fit_classifier(job, cfg, tick)
    return _fit_utility(job, cfg, action_costs, tick)


def _fit_classifier(job: CrossFit, cfg: PolicyConfig, tick: Callable[[int], Any]) -> tuple[FittedLearner, OutOfFold]:
    clfs = []
    for tr, _ in job.folds:
        clfs.append(OracleClassifier(n_budget_grid=cfg.n_budget_grid, **_hyper(cfg)).fit(
            job.X[tr], job.labels[tr], job.C[tr], cfg.budget_range))
        tick(1)
    grid = clfs[0].budget_grid_
    n = job.rows.size
    grid_act = np.empty((grid.size, n), dtype=np.intp)
    for m, (_, ho) in zip(clfs, job.folds, strict=True):
        grid_act[:, ho] = m.grid_actions(job.X[ho])
    cal = calibrate_mixed_grid(job.requested, job.targets, grid, job.C[job.rows[None, :], grid_act], job.u,
                               n_validation=n)

    def oof(b: float) -> np.ndarray:
        return grid_act[mixed_grid_index(grid_position(cal(b), grid), job.u, grid.size), job.rows]

    return FittedLearner(clfs, cal), oof


def _utility_member(job: CrossFit, cfg: PolicyConfig, tr: np.ndarray) -> UtilityRegressor:
    """One utility member trained on rows ``tr``: on k's, or on plan descriptors with a cost head."""
    if job.plans is None or job.samples is None:
        return UtilityRegressor(**_hyper(cfg)).fit(job.X[tr], job.labels[tr], np.asarray(cfg.actions))
    from isocompute.policy.learn.cost_head import SampleCostRegressor
    from isocompute.policy.plans.menu import plan_descriptors

    desc = plan_descriptors(job.plans, job.labels[tr], job.samples[tr])  # = U[tr] unless labels mask columns
    head = None
    if cfg.plan_costs == "predicted":
        head = SampleCostRegressor(**_hyper(cfg)).fit(
            job.X[tr], job.samples[tr], job.C[tr], desc, np.array([p.waves[0] for p in job.plans]),
            np.array([p.max_samples for p in job.plans]), paid=job.paid)
    return UtilityRegressor(**_hyper(cfg)).fit(job.X[tr], job.labels[tr], desc, cost_head=head)


def _fit_utility(job: CrossFit, cfg: PolicyConfig, costs: np.ndarray,
                 tick: Callable[[int], Any]) -> tuple[FittedLearner, OutOfFold]:
    models = []
    for tr, _ in job.folds:
        models.append(_utility_member(job, cfg, tr))
        tick(1)
    Uh = np.empty_like(job.U)
    Ch = np.empty_like(job.U)  # the costs each prompt is priced at: Ĉ, or the actions' mean costs
    for m, (_, ho) in zip(models, job.folds, strict=True):
        Uh[ho] = m.predict_utilities(job.X[ho])
        Ch[ho] = m.predict_costs(job.X[ho], costs)

    def cost_at(lam: float) -> float:
        return float(job.C[job.rows, price(Uh, lam, Ch, job.u)].mean())

    cal = calibrate_by_bisection(job.requested, job.targets, cost_at, max_useful_price(Uh, Ch),
                                 n_validation=job.rows.size)

    def oof(b: float) -> np.ndarray:
        return price(Uh, cal(b), Ch, job.u)

    return FittedLearner(models, cal), oof


def max_useful_price(U_hat: np.ndarray, action_costs: np.ndarray) -> float:
    """A price at which every prompt takes its cheapest action: above every pairwise utility slope.
    ``action_costs``: (A,) per action, or (N, A) per prompt; the smallest positive cost step counts."""
    du = float(U_hat.max() - U_hat.min()) if U_hat.size else 0.0
    c = np.asarray(action_costs, dtype=np.float64)
    steps = np.diff(np.sort(c.reshape(-1, c.shape[-1]) if c.size else c.reshape(1, -1), axis=1), axis=1)
    steps = steps[steps > 0]
    dc = float(steps.min()) if steps.size else 1.0
    return (du + 1.0) / max(dc, 1e-300)


def select_learner(held_out: dict[str, OutOfFold], U: np.ndarray, C: np.ndarray,
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
