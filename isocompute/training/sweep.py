"""IsoCompute grids and the RACE diagnostic: where should a fixed post-training budget go?

IsoCompute (seed 000). Sampling compute C = n · B_p · M (rollouts per problem × problems per batch ×
updates). :func:`iso_grid` lists every (n, B_p, M) on a set of compute levels with the product exactly C
(or, with :func:`in_flop_band`, every run whose FLOPs fall in a band). Given finished runs,
:func:`best_n_per_level` picks the best n at each level and :func:`n_trend` says whether the best n grows
with compute and then saturates (the playbook's finding), just grows, stays flat, shrinks, or wanders.

RACE (seed 002, §12–14). Within one compute band, fit reward against the update fraction ρ with

    R̂(ρ) = a·(log ρ)² + b·log ρ + c

and use the fit only as a decision rule (:func:`race_diagnostic`):

* ``interior`` — the fitted maximum over the observed log-ρ range is inside it (farther than
  ``edge_margin`` of the range from either end) and stable: every leave-one-out refit puts it within
  ``max_spread`` of the range of the full fit's → validate near ρ* = exp(−b / 2a);
* ``boundary`` — the stable maximum sits at an edge → validate beyond it, towards ``higher`` ρ (more
  updates) or ``lower`` ρ (more search), one quarter of the log range past the edge;
* ``fallback`` — too few points, ρ spanning less than ``min_log_range`` in log ρ (5 %: full fine-tuning
  runs all sit at ρ ≈ 0.75 in the RACE convention), or leave-one-out refits disagree → validate near the
  best observed pilot run.

:func:`compare_families` ranks low-capacity response families (constant, linear/quadratic in ρ,
linear/quadratic/cubic in log ρ) by leave-one-out RMSE, computed exactly from the hat matrix:
e₋ᵢ = eᵢ / (1 − hᵢᵢ). BIC = m·log(RSS/m) + p·log m is reported beside it.

Worked example: rewards 0.483, 0.562, 0.596, 0.595, 0.589, 0.565 at ρ = 0.15, 0.25, 0.35, 0.5, 0.65, 0.8
(a parabola in log ρ peaking at 0.45, plus ±0.004 noise) fit a concave quadratic whose maximum sits at
0.66 of the log range, and every leave-one-out refit within 0.02 of it: ``interior``, ρ* ≈ 0.450. Rewards
0.40, 0.45, 0.49, 0.53, 0.55, 0.56 on the same ρ keep rising: ``boundary``, direction ``higher``.

Pure numpy; plotting and reports live in :mod:`isocompute.training.sweep_report`. Ignores: noise models
and confidence intervals for ρ* (RACE is a diagnostic, not an estimator), and ρ outside (0, 1].
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from isocompute.errors import InputError

# ------------------------------------------------------------------------------------------- grids


@dataclass(frozen=True)
class GridPoint:
    """One configuration: n rollouts per problem, B_p problems per batch, M updates, LoRA rank (0 = full)."""

    n: int
    prompts_per_step: int
    steps: int
    lora_rank: int = 0

    @property
    def rollouts(self) -> int:
        return self.n * self.prompts_per_step * self.steps


def iso_grid(budgets: Iterable[int], ns: Iterable[int], prompts_per_step: Iterable[int], *,
             lora_ranks: Iterable[int] = (0,)) -> list[GridPoint]:
    """Every (n, B_p, M, rank) with n·B_p·M equal to a budget exactly (M ≥ 1), by budget, n, B_p, rank.

    >>> [(p.n, p.prompts_per_step, p.steps) for p in iso_grid([16], [2, 4, 3], [2, 4])]
    [(2, 2, 4), (2, 4, 2), (4, 2, 2), (4, 4, 1)]
    """
    ns, bps, ranks = sorted(set(ns)), sorted(set(prompts_per_step)), sorted(set(lora_ranks))
    if not ns or not bps or min(ns) < 1 or min(bps) < 1 or not ranks or min(ranks) < 0:
        raise InputError("the grid needs non-empty n and B_p values ≥ 1 and LoRA ranks ≥ 0; check the lists.")
    out = [GridPoint(n, bp, c // (n * bp), r) for c in sorted(set(budgets)) for n in ns for bp in bps
           for r in ranks if c >= n * bp and c % (n * bp) == 0]
    if not out:
        raise InputError("no (n, B_p) divides any budget; choose budgets that are multiples of n·B_p.")
    return out


def in_flop_band(flops: Sequence[float], center: float, rel_width: float = 0.1) -> np.ndarray:
    """Mask of runs whose FLOPs lie within a factor (1 ± rel_width) of ``center`` (on a log scale)."""
    f = np.asarray(flops, dtype=float)
    if center <= 0 or not 0 < rel_width < 1:
        raise InputError(f"a FLOP band needs center > 0 and 0 < rel_width < 1; got {center}, {rel_width}.")
    return np.abs(np.log(f / center)) <= np.log1p(rel_width)


# ------------------------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class SweepRun:
    """A finished run: its configuration, compute (rollouts, FLOPs, ρ), band label and reward."""

    n: int
    prompts_per_step: int
    steps: int
    reward: float
    rollouts: float
    flops: float = float("nan")
    rho: float = float("nan")
    lora_rank: int = 0
    band: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, metric: str = "reward") -> SweepRun:
        try:
            n, bp, m = int(d["n"]), int(d["prompts_per_step"]), int(d["steps"])
            reward = float(d[metric])
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"a sweep run needs integer n, prompts_per_step, steps and a numeric {metric!r} "
                             f"({e!r}); fix the record or pick another --metric.") from None
        known = {"n", "prompts_per_step", "steps", metric, "rollouts", "flops", "rho", "lora_rank", "band"}
        return cls(n, bp, m, reward, float(d.get("rollouts", n * bp * m)), float(d.get("flops", "nan")),
                   float(d.get("rho", "nan")), int(d.get("lora_rank", 0)), str(d.get("band", "")),
                   {k: v for k, v in d.items() if k not in known})


@dataclass(frozen=True)
class BestN:
    """The best run at one compute level."""

    level: float
    n: int
    reward: float
    candidates: int


def best_n_per_level(runs: Sequence[SweepRun]) -> list[BestN]:
    """Per compute level (``rollouts``), the n of the highest-reward run (ties: smaller n), by level."""
    levels: dict[float, list[SweepRun]] = {}
    for r in runs:
        levels.setdefault(r.rollouts, []).append(r)
    out = []
    for level in sorted(levels):
        best = max(levels[level], key=lambda r: (r.reward, -r.n))
        out.append(BestN(level, best.n, best.reward, len(levels[level])))
    return out


TRENDS: tuple[str, ...] = ("grows then saturates", "grows", "flat", "shrinks", "non-monotone")


def n_trend(best: Sequence[BestN]) -> str:
    """How the best n moves with compute: one of :data:`TRENDS`.

    ``grows then saturates`` needs ≥ 3 levels, a non-decreasing best n that rose somewhere and stayed
    equal over the top two levels.

    >>> n_trend([BestN(64, 2, .1, 3), BestN(128, 4, .2, 3), BestN(256, 8, .3, 3), BestN(512, 8, .4, 3)])
    'grows then saturates'
    """
    ns = np.array([b.n for b in best], dtype=float)
    if ns.size < 2 or np.all(ns == ns[0]):
        return "flat"
    d = np.diff(ns)
    if np.all(d >= 0):
        return "grows then saturates" if ns.size >= 3 and d[-1] == 0 else "grows"
    if np.all(d <= 0):
        return "shrinks"
    return "non-monotone"


# ------------------------------------------------------------------------------------------- fits

FAMILIES: dict[str, tuple[str, int]] = {  # name → (variable, polynomial degree)
    "constant": ("rho", 0),
    "linear rho": ("rho", 1),
    "quadratic rho": ("rho", 2),
    "linear log rho": ("log", 1),
    "quadratic log rho": ("log", 2),
    "cubic log rho": ("log", 3),
}


def _design(rho: np.ndarray, family: str) -> np.ndarray:
    var, degree = FAMILIES[family]
    x = np.log(rho) if var == "log" else rho
    return np.vander(x, degree + 1, increasing=True)


def _xy(rho: Sequence[float], reward: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    r, y = np.asarray(rho, dtype=float), np.asarray(reward, dtype=float)
    if r.shape != y.shape or r.ndim != 1:
        raise InputError(f"rho and reward must be 1-D and the same length; got {r.shape} and {y.shape}.")
    if not (np.isfinite(r).all() and np.isfinite(y).all()) or (r <= 0).any() or (r > 1).any():
        raise InputError("rho must lie in (0, 1] and rewards must be finite; drop runs without a FLOP ledger.")
    return r, y


def loo_residuals(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Exact leave-one-out residuals of least squares: e₋ᵢ = eᵢ / (1 − hᵢᵢ), H = X (XᵀX)⁺ Xᵀ."""
    pinv = np.linalg.pinv(X)
    h = np.einsum("ij,ji->i", X, pinv)
    e = y - X @ (pinv @ y)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(h < 1 - 1e-10, e / (1 - h), np.nan)


@dataclass(frozen=True)
class FamilyFit:
    """One response family's fit quality: leave-one-out RMSE and MAE, BIC, parameters p."""

    family: str
    params: int
    loo_rmse: float
    loo_mae: float
    bic: float


def compare_families(rho: Sequence[float], reward: Sequence[float],
                     families: Iterable[str] = FAMILIES) -> list[FamilyFit]:
    """Families with fewer parameters than points, best (lowest LOO RMSE) first."""
    r, y = _xy(rho, reward)
    m = y.size
    out = []
    for fam in families:
        if fam not in FAMILIES:
            raise InputError(f"unknown response family {fam!r}; choose from {sorted(FAMILIES)}.")
        X = _design(r, fam)
        p = X.shape[1]
        if m <= p:
            continue
        loo = loo_residuals(X, y)
        rss = float(np.sum((y - X @ np.linalg.lstsq(X, y, rcond=None)[0]) ** 2))
        bic = m * np.log(max(rss, 1e-300) / m) + p * np.log(m)
        out.append(FamilyFit(fam, p, float(np.sqrt(np.nanmean(loo**2))), float(np.nanmean(np.abs(loo))), float(bic)))
    return sorted(out, key=lambda f: (np.nan_to_num(f.loo_rmse, nan=np.inf), f.params))


# ------------------------------------------------------------------------------------------- RACE


@dataclass(frozen=True)
class RaceFit:
    """RACE's decision for one band (module docstring). ``coef`` = (a, b, c) of a·x² + b·x + c in x = log ρ;
    ``rho_star``: where to validate; ``position``: the fitted maximum's place in the observed log-ρ range
    (0 = lowest ρ, 1 = highest), and ``loo_positions`` the leave-one-out refits'."""

    band: str
    decision: str
    rho_star: float
    direction: str | None
    reason: str
    n_points: int
    coef: tuple[float, float, float] | None = None
    position: float = float("nan")
    loo_positions: tuple[float, ...] = ()
    rho_range: tuple[float, float] = (float("nan"), float("nan"))
    best_rho: float = float("nan")
    best_reward: float = float("nan")


def _argmax_position(coef: np.ndarray, lo: float, hi: float) -> float:
    """Where a·x² + b·x + c peaks on [lo, hi], as a fraction of the range."""
    c0, c1, c2 = coef  # increasing powers
    xs = [lo, hi]
    if c2 < 0:
        xs.append(float(np.clip(-c1 / (2 * c2), lo, hi)))
    vals = [c0 + c1 * x + c2 * x * x for x in xs]
    return (xs[int(np.argmax(vals))] - lo) / (hi - lo)


def race_diagnostic(rho: Sequence[float], reward: Sequence[float], *, band: str = "", min_points: int = 4,
                    edge_margin: float = 0.1, max_spread: float = 0.25, min_log_range: float = 0.05) -> RaceFit:
    """RACE decision for one compute band (see the module docstring).

    >>> fit = race_diagnostic([0.15, 0.25, 0.35, 0.5, 0.65, 0.8], [0.483, 0.562, 0.596, 0.595, 0.589, 0.565])
    >>> fit.decision, round(fit.rho_star, 3)
    ('interior', 0.45)
    """
    r, y = _xy(rho, reward)
    i_best = int(np.argmax(y))
    x = np.log(r)
    lo, hi = float(x.min()), float(x.max())
    base = {"band": band, "n_points": int(y.size), "rho_range": (float(r.min()), float(r.max())),
            "best_rho": float(r[i_best]), "best_reward": float(y[i_best])}

    def fallback(reason: str, **kw: Any) -> RaceFit:
        return RaceFit(decision="fallback", rho_star=float(r[i_best]), direction=None, reason=reason, **base, **kw)

    if y.size < min_points:
        return fallback(f"{y.size} runs < {min_points}: too few to fit a quadratic with a check")
    if hi - lo < 1e-9:
        return fallback("all runs have the same rho")
    if hi - lo < min_log_range:
        return fallback(f"rho spans only {np.exp(hi - lo) - 1:.1%} of itself: vary the LoRA rank, the reward model "
                        "or the rollout/update balance to give RACE a range")
    X = _design(r, "quadratic log rho")
    coef = np.linalg.lstsq(X, y, rcond=None)[0]
    pos = _argmax_position(coef, lo, hi)
    keep = np.ones(y.size, dtype=bool)
    loo = []
    for i in range(y.size):  # a handful of runs: the loop is the clearest form
        keep[i] = False
        loo.append(_argmax_position(np.linalg.lstsq(X[keep], y[keep], rcond=None)[0], lo, hi))
        keep[i] = True
    extra = {"coef": (float(coef[2]), float(coef[1]), float(coef[0])), "position": float(pos),
             "loo_positions": tuple(float(v) for v in loo)}
    spread = max(abs(v - pos) for v in loo)
    if spread > max_spread:
        return fallback(f"unstable: leave-one-out refits move the maximum by {spread:.2f} of the range "
                        f"(> {max_spread})", **extra)
    step = 0.25 * (hi - lo)
    if pos <= edge_margin:
        return RaceFit(decision="boundary", rho_star=float(np.exp(lo - step)), direction="lower",
                       reason="the fitted maximum is at the low-rho edge: try more search, fewer updates",
                       **base, **extra)
    if pos >= 1 - edge_margin:
        return RaceFit(decision="boundary", rho_star=float(min(1.0, np.exp(hi + step))), direction="higher",
                       reason="the fitted maximum is at the high-rho edge: try more updates", **base, **extra)
    return RaceFit(decision="interior", rho_star=float(np.exp(lo + pos * (hi - lo))), direction=None,
                   reason="stable interior maximum of the quadratic in log rho", **base, **extra)


def race_by_band(runs: Sequence[SweepRun], **options: Any) -> list[RaceFit]:
    """:func:`race_diagnostic` per band (a run's ``band``, else its compute level), runs with a known ρ."""
    bands: dict[str, list[SweepRun]] = {}
    for r in runs:
        if np.isfinite(r.rho):
            bands.setdefault(r.band or f"{r.rollouts:g} rollouts", []).append(r)
    return [race_diagnostic([r.rho for r in rs], [r.reward for r in rs], band=b, **options)
            for b, rs in sorted(bands.items())]
