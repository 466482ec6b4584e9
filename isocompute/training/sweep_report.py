"""The IsoCompute / RACE sweep report: analysis of finished runs, plots (matplotlib Agg) and markdown.

:func:`analyse` is pure (:mod:`isocompute.training.sweep` does the maths); :func:`write_report` renders
``report.md``, ``report.json``, ``best_n.png`` (reward against n, one line per compute level, best n
marked) and ``race.png`` (reward against log ρ per band with the quadratic and the recommendation).
Ignores: styling beyond legibility.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from isocompute.artifacts import atomic_write_text
from isocompute.training.sweep import (
    FAMILIES,
    BestN,
    FamilyFit,
    RaceFit,
    SweepRun,
    best_n_per_level,
    compare_families,
    n_trend,
    race_by_band,
)


@dataclass(frozen=True)
class SweepAnalysis:
    """Best n per compute level and its trend, RACE per band, response families per band."""

    metric: str
    best: list[BestN]
    trend: str
    race: list[RaceFit]
    families: dict[str, list[FamilyFit]]
    runs: int

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "runs": self.runs, "trend": self.trend,
                "best_n": [asdict(b) for b in self.best], "race": [asdict(r) for r in self.race],
                "families": {b: [asdict(f) for f in fs] for b, fs in self.families.items()}}


def analyse(runs: Sequence[SweepRun], *, metric: str = "reward", **race_options: Any) -> SweepAnalysis:
    best = best_n_per_level(runs)
    race = race_by_band(runs, **race_options)
    families: dict[str, list[FamilyFit]] = {}
    for fit in race:
        members = [r for r in runs if (r.band or f"{r.rollouts:g} rollouts") == fit.band and np.isfinite(r.rho)]
        families[fit.band] = compare_families([r.rho for r in members], [r.reward for r in members], FAMILIES)
    return SweepAnalysis(metric, best, n_trend(best), race, families, len(runs))


def markdown(a: SweepAnalysis) -> str:
    lines = [f"# IsoCompute / RACE sweep ({a.runs} runs, metric `{a.metric}`)", "",
             "## Best n per compute level (n · B_p · M fixed)", "",
             "| rollouts | best n | reward | runs |", "|---:|---:|---:|---:|"]
    lines += [f"| {b.level:g} | {b.n} | {b.reward:.4f} | {b.candidates} |" for b in a.best]
    lines += ["", f"Best n with compute: **{a.trend}**.", "", "## RACE (reward vs log ρ per band)", "",
              "| band | runs | decision | validate at ρ | direction | reason |", "|---|---:|---|---:|---|---|"]
    lines += [f"| {r.band} | {r.n_points} | {r.decision} | {r.rho_star:.3f} | {r.direction or ''} | {r.reason} |"
              for r in a.race]
    lines += ["", "## Response families (leave-one-out RMSE, lower is better)", ""]
    for band, fits in a.families.items():
        if not fits:
            continue
        lines += [f"**{band}**", "", "| family | params | LOO RMSE | LOO MAE | BIC |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {f.family} | {f.params} | {f.loo_rmse:.4g} | {f.loo_mae:.4g} | {f.bic:.2f} |" for f in fits]
        lines.append("")
    lines += ["RACE is a diagnostic for choosing validation runs, not a guarantee of held-out improvement.", ""]
    return "\n".join(lines)


def write_report(a: SweepAnalysis, runs: Sequence[SweepRun], out_dir: str | Path) -> list[Path]:
    """Write report.md, report.json, best_n.png and race.png into ``out_dir``; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "report.md", markdown(a))
    atomic_write_text(out / "report.json", json.dumps(a.to_dict(), indent=2, default=float) + "\n")
    return [out / "report.md", out / "report.json", _plot_best_n(a, runs, out / "best_n.png"),
            _plot_race(a, runs, out / "race.png")]


def _plot_best_n(a: SweepAnalysis, runs: Sequence[SweepRun], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for b in a.best:
        rs = sorted((r for r in runs if r.rollouts == b.level), key=lambda r: r.n)
        ns = sorted({r.n for r in rs})
        best_at = [max(r.reward for r in rs if r.n == n) for n in ns]
        line, = ax.plot(ns, best_at, marker="o", label=f"C = {b.level:g}")
        ax.plot([b.n], [b.reward], marker="*", markersize=14, color=line.get_color())
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rollouts per problem n")
    ax.set_ylabel(a.metric)
    ax.set_title(f"IsoCompute: best n {a.trend}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_race(a: SweepAnalysis, runs: Sequence[SweepRun], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for fit in a.race:
        rs = [r for r in runs if (r.band or f"{r.rollouts:g} rollouts") == fit.band and np.isfinite(r.rho)]
        pts = ax.scatter([r.rho for r in rs], [r.reward for r in rs], label=f"{fit.band}: {fit.decision}")
        if fit.coef is not None:
            xs = np.linspace(np.log(fit.rho_range[0]), np.log(fit.rho_range[1]), 50)
            a2, b1, c0 = fit.coef
            ax.plot(np.exp(xs), a2 * xs**2 + b1 * xs + c0, color=pts.get_facecolor()[0])
        ax.axvline(fit.rho_star, linestyle=":", color=pts.get_facecolor()[0])
    ax.set_xscale("log")
    ax.set_xlabel("update fraction ρ = F_update / F_total")
    ax.set_ylabel(a.metric)
    ax.set_title("RACE: reward vs log ρ per compute band (dotted: where to validate)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
