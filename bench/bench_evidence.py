"""Evidence-aware plans vs the best fixed plan and uniform, at matched tokens and latency, cross-validated.

    python bench/bench_evidence.py /tmp/lat/gpt-oss-20b.jsonl /tmp/lat/Qwen3-14B.jsonl \
        /tmp/lat/Phi-4-reasoning.jsonl [--waves 4,8] [--draws 16] [--eval-draws 32] [--out docs/evidence]

Per table (with token counts): the learned continuation's out-of-fold values at every price
(:func:`isocompute.policy.evidence.crossfit.crossfit_values`, 5 folds by prompt: each fold is played by
heads trained on the other four), the fixed plans' exact values (``default_plans() + parallel_plans()``,
all rule families, waiting and parallel-stop). For every budget — tokens B (x one sample's mean tokens)
× latency budget Lb (none, 0.75, 1.0, 1.5 sample lengths) — and every fold f, the chain
(:func:`isocompute.policy.evidence.chain.chain_entry`) is chosen on the other folds' prompts and served
on fold f: the learned rule at the price chosen there, or the fixed mixture chosen there. Pooled over
folds, the served chain is compared with

* **fixed (CV)** — the best fixed mixture within (B, Lb) chosen on the other folds, served on fold f:
  what a user would deploy instead at the same budgets;
* **fixed (hindsight)** — the best fixed mixture at the chain's *realised* tokens and latency, chosen on
  all prompts (the held-out ones included): the strictest rival at matched realised cost;
* **uniform** — the best mixture of ``none@k`` at the chain's realised tokens (and latency).

Differences are in points with 95% paired-bootstrap CIs over prompts. The ``reach`` line: the fewest
tokens at which the chain, at uniform@16's latency budget, reaches uniform@16's accuracy − 0.2 pt with a
realised latency within 1% of uniform@16's. A calibration
plot (predicted vs realised gain of going to the plan's end, binned) is written per table.

Caveat stated in the docs: the chain's choice on folds ≠ f reads those prompts' out-of-fold values,
whose heads saw fold f's walks in training (not fold f's held-out draws; the served values on fold f come
from heads that never saw fold f).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from isocompute.policy.evidence.chain import best_fixed_mix, chain_entry  # noqa: E402
from isocompute.policy.evidence.crossfit import crossfit_values  # noqa: E402
from isocompute.policy.evidence.model import fixed_values  # noqa: E402
from isocompute.solver.outcomes import read_outcomes  # noqa: E402
from isocompute.solver.plans.plan import default_plans, parallel_plans  # noqa: E402

BUDGETS_X = (2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0)
LATENCIES = (None, 0.75, 1.0, 1.5)
LATENCY_SLACK = 0.01  # the served mix's latency varies a little from fold to fold around its budget


def ci(d: np.ndarray, seed: int = 0) -> tuple[float, float, float]:
    idx = np.random.default_rng(seed).integers(0, d.size, (2000, d.size))
    m = d[idx].mean(axis=1)
    return 100 * d.mean(), 100 * np.quantile(m, 0.025), 100 * np.quantile(m, 0.975)


def served(values, fixed, fold_of, b, lb):
    """Per prompt (U, T, L) of the chain and of the CV fixed plan, each chosen on the other folds."""
    FU, FT, FL = fixed
    N = FU.shape[0]
    chain = np.zeros((3, N))
    cv = np.zeros((3, N))
    rules = []
    for f in np.unique(fold_of):
        tr, te = np.flatnonzero(fold_of != f), np.flatnonzero(fold_of == f)
        e = chain_entry(values.subset(tr), (FU[tr], FT[tr], FL[tr]), b, lb)
        fp, fw = np.array(e.fixed_plans), np.array(e.fixed_weights)
        mix = best_fixed_mix(FU[tr], FT[tr], FL[tr], b, lb)
        if mix is not None and e.rule == "evidence":
            fp, fw = mix
        for k, X in enumerate((FU, FT, FL)):
            cv[k, te] = X[te][:, fp] @ fw
        if e.rule == "evidence":
            for k, X in enumerate((values.utility, values.tokens, values.latency)):
                chain[k, te] = X[te, e.price]
        else:
            chain[:, te] = cv[:, te]
        rules.append(e.rule)
    return chain, cv, rules


def run_table(path: str, waves: tuple[int, ...], draws: int, eval_draws: int, out: Path | None) -> list[dict]:
    t = read_outcomes(path)
    L = t.completion_tokens[t.mask]
    unit, per = float(np.median(L)), float(np.mean(L))
    x = per / unit  # one "x" (a sample's mean tokens) in units
    menu = default_plans() + parallel_plans()
    t0 = time.perf_counter()
    fixed = fixed_values(t, menu, unit)
    values = crossfit_values(t, waves, unit=unit, draws=draws, eval_draws=eval_draws, seed=0)
    print(f"# {Path(path).name}: {len(t)} prompts, 1x = {per:,.0f} tokens, schedule {waves}; "
          f"cross-fit {time.perf_counter() - t0:.0f} s", flush=True)
    FU, FT, FL = fixed
    uni = [j for j, p in enumerate(menu) if p.rule.kind == "none" and p.n_waves == 1]
    rows = []
    for lb in LATENCIES:
        for bx in BUDGETS_X:
            b, lbu = bx * x, None if lb is None else lb * x
            chain, cv, rules = served(values, fixed, values.fold_of, b, lbu)
            T, Lt = chain[1].mean(), chain[2].mean()
            hind = best_fixed_mix(FU, FT, FL, T, Lt)
            umix = best_fixed_mix(FU[:, uni], FT[:, uni], FL[:, uni], T, None)
            row = {"table": Path(path).stem, "budget_x": bx, "latency_budget": lb, "acc": chain[0].mean(),
                   "tokens_x": T / x, "latency": Lt / x, "evidence_folds": rules.count("evidence"),
                   "cv_acc": cv[0].mean(), "cv_tokens_x": cv[1].mean() / x, "cv_latency": cv[2].mean() / x,
                   "vs_cv": ci(chain[0] - cv[0])}
            row["vs_hindsight"] = None if hind is None else ci(chain[0] - FU[:, hind[0]] @ hind[1])
            row["vs_uniform"] = None if umix is None else ci(chain[0] - FU[:, uni][:, umix[0]] @ umix[1])
            rows.append(row)
            print(_fmt(row), flush=True)
    _reach(values, fixed, menu, x, rows)
    if out is not None:
        _plot(values, Path(out) / f"calibration_{Path(path).stem}.png", Path(path).stem)
    return rows


def _fmt(r: dict) -> str:
    def c(v):
        return "—" if v is None else f"{v[0]:+.2f} [{v[1]:+.2f}, {v[2]:+.2f}]"
    lb = "none" if r["latency_budget"] is None else f"{r['latency_budget']:g}"
    return (f"| {r['table']} | {r['budget_x']:g}x | {lb} | {r['acc']:.4f} | {r['tokens_x']:.2f}x | {r['latency']:.3f} | "
            f"{r['evidence_folds']}/5 | {r['cv_acc']:.4f} ({r['cv_tokens_x']:.2f}x, {r['cv_latency']:.3f}) | "
            f"{c(r['vs_cv'])} | {c(r['vs_hindsight'])} | {c(r['vs_uniform'])} |")


def _reach(values, fixed, menu, x, rows) -> None:
    FU, FT, FL = fixed
    j16 = next((j for j, p in enumerate(menu) if p.name == "none@16"), None)
    if j16 is None:
        return
    A16, T16, L16 = FU[:, j16].mean(), FT[:, j16].mean(), FL[:, j16].mean()
    for bx in np.geomspace(1.5, 16, 25):
        chain, _, _ = served(values, fixed, values.fold_of, bx * x, L16)
        if chain[0].mean() >= A16 - 0.002 and chain[2].mean() <= L16 * (1 + LATENCY_SLACK):
            print(f"reach uniform@16 ({A16:.4f} at {T16 / x:.1f}x, latency {L16 / x:.3f}): {chain[0].mean():.4f} at "
                  f"{chain[1].mean() / x:.2f}x tokens = {chain[1].mean() / T16:.3f} of its tokens, latency "
                  f"{chain[2].mean() / x:.3f} (budget {bx:.2f}x)")
            return
    print(f"reach uniform@16 ({A16:.4f}): not reached up to 16x")


def _plot(values, path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p, r = values.calibration
    edges = np.quantile(p, np.linspace(0, 1, 11))
    idx = np.clip(np.searchsorted(edges, p, side="right") - 1, 0, 9)
    px = [p[idx == k].mean() for k in range(10) if (idx == k).any()]
    ry = [r[idx == k].mean() for k in range(10) if (idx == k).any()]
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(4.2, 4))
    lim = max(max(px), max(ry), 1e-3) * 1.1
    ax.plot([min(0, min(px + ry)), lim], [min(0, min(px + ry)), lim], color="grey", lw=0.8, ls="--")
    ax.plot(px, ry, "o-")
    ax.set_xlabel("predicted gain of going to the plan's end")
    ax.set_ylabel("realised gain (held-out draws)")
    ax.set_title(f"{title}: calibration (deciles)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tables", nargs="+")
    ap.add_argument("--waves", default="4,8")
    ap.add_argument("--draws", type=int, default=16)
    ap.add_argument("--eval-draws", type=int, default=32)
    ap.add_argument("--out", default=None, help="folder for the calibration plots")
    a = ap.parse_args()
    print("| table | budget | latency ≤ | chain acc | tokens | latency | evidence kept | fixed (CV) acc (tokens, latency) "
          "| vs fixed (CV), pt | vs fixed (hindsight, matched), pt | vs uniform (matched), pt |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---|---|---|")
    for p in a.tables:
        run_table(p, tuple(int(w) for w in a.waves.split(",")), a.draws, a.eval_draws,
                  None if a.out is None else Path(a.out))


if __name__ == "__main__":
    main()
