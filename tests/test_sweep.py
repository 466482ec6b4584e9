"""IsoCompute grids, best-n trends, leave-one-out fits and the RACE decision rule on synthetic curves;
the report and the `isocompute sweep` CLI on synthetic runs."""

import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isocompute.cli import main
from isocompute.errors import InputError
from isocompute.training.sweep import (
    FAMILIES,
    BestN,
    SweepRun,
    _design,
    best_n_per_level,
    compare_families,
    in_flop_band,
    iso_grid,
    loo_residuals,
    n_trend,
    race_by_band,
    race_diagnostic,
)
from isocompute.training.sweep_report import analyse, markdown, write_report

# ------------------------------------------------------------------ grids and best n


@settings(max_examples=40, deadline=None)
@given(budgets=st.lists(st.integers(1, 300), min_size=1, max_size=3),
       ns=st.lists(st.integers(1, 12), min_size=1, max_size=4),
       bps=st.lists(st.integers(1, 12), min_size=1, max_size=4))
def test_iso_grid_is_every_exact_factorisation(budgets, ns, bps):
    want = {(c, n, b) for c in budgets for n in ns for b in bps if c % (n * b) == 0}
    try:
        grid = iso_grid(budgets, ns, bps)
    except InputError:
        assert not want
        return
    assert {(p.rollouts, p.n, p.prompts_per_step) for p in grid} == want
    assert all(p.steps >= 1 and p.n * p.prompts_per_step * p.steps == p.rollouts for p in grid)


def test_flop_band():
    assert in_flop_band([0.92e15, 1.05e15, 1.2e15, 0.8e15], 1e15, 0.1).tolist() == [True, True, False, False]


def synthetic_isocompute(levels, ns, optimum, noise=0.0, seed=0):
    """reward(n, C) peaks at n = optimum(C) on a log2 scale and grows with C."""
    rng = np.random.default_rng(seed)
    runs = []
    for c in levels:
        for n in ns:
            r = 0.1 * np.log2(c) - 0.05 * (np.log2(n) - np.log2(optimum(c))) ** 2 + noise * rng.normal()
            runs.append(SweepRun(n, 2, c // (2 * n), float(r), float(c)))
    return runs


def test_best_n_grows_then_saturates_on_a_playbook_curve():
    ns = [2, 4, 8, 16, 32]
    runs = synthetic_isocompute([256, 512, 1024, 2048, 4096], ns, lambda c: min(c / 128, 16))
    best = best_n_per_level(runs)
    assert [b.n for b in best] == [2, 4, 8, 16, 16] and all(b.candidates == 5 for b in best)
    assert n_trend(best) == "grows then saturates"


@pytest.mark.parametrize(
    ("ns", "trend"),
    [([2, 4, 8, 8], "grows then saturates"), ([2, 4, 8, 16], "grows"), ([4, 4, 4], "flat"), ([8, 4, 2], "shrinks"),
     ([2, 8, 4], "non-monotone"), ([4], "flat"), ([2, 4, 4, 8], "grows"), ([2, 2], "flat")],
)
def test_n_trend_table(ns, trend):
    assert n_trend([BestN(2**i, n, 0.0, 1) for i, n in enumerate(ns)]) == trend


# ------------------------------------------------------------------ fits


@settings(max_examples=40, deadline=None)
@given(m=st.integers(4, 10), family=st.sampled_from(sorted(FAMILIES)), seed=st.integers(0, 99))
def test_loo_residuals_match_explicit_refits(m, family, seed):
    rng = np.random.default_rng(seed)
    rho = np.sort(rng.uniform(0.05, 1.0, m))
    y = rng.normal(size=m)
    X = _design(rho, family)
    if X.shape[1] >= m or np.linalg.matrix_rank(X) < X.shape[1]:
        return
    # A point with leverage h ≈ 1 amplifies rounding by 1/(1 − h) in both the identity and the explicit
    # refit (seen: h = 1 − 1e-5 gave residuals of 8e4 differing in the 6th digit); compare where it is sane.
    h = np.einsum("ij,ji->i", X, np.linalg.pinv(X))
    if h.max() > 1 - 1e-4:
        return
    want = []
    for i in range(m):
        keep = np.arange(m) != i
        beta = np.linalg.lstsq(X[keep], y[keep], rcond=None)[0]
        want.append(y[i] - X[i] @ beta)
    np.testing.assert_allclose(loo_residuals(X, y), want, rtol=1e-6, atol=1e-8)


def test_compare_families_picks_the_generating_family():
    rng = np.random.default_rng(1)
    rho = np.linspace(0.1, 0.9, 12)
    x = np.log(rho)
    quad_log = 0.6 - 0.3 * (x + 0.8) ** 2 + 0.002 * rng.normal(size=rho.size)
    assert compare_families(rho, quad_log)[0].family == "quadratic log rho"
    lin = 0.2 + 0.5 * rho + 0.002 * rng.normal(size=rho.size)
    assert compare_families(rho, lin)[0].family in ("linear rho", "quadratic rho")
    # pure noise: no family predicts held-out runs better than the mean in most draws (25 of 40 here)
    wins = sum(compare_families(rho, 0.5 + 0.01 * np.random.default_rng(s).normal(size=rho.size))[0].family
               == "constant" for s in range(40))
    assert wins >= 20
    assert len(compare_families(rho[:3], lin[:3])) == 3  # families need more points than parameters


# ------------------------------------------------------------------ RACE


def test_race_interior_worked_example():
    fit = race_diagnostic([0.15, 0.25, 0.35, 0.5, 0.65, 0.8], [0.483, 0.562, 0.596, 0.595, 0.589, 0.565])
    assert fit.decision == "interior" and fit.direction is None
    assert fit.rho_star == pytest.approx(0.45, abs=0.01)
    assert max(abs(p - fit.position) for p in fit.loo_positions) < 0.05


@settings(max_examples=30, deadline=None)
@given(opt=st.floats(0.2, 0.6), seed=st.integers(0, 50))
def test_race_recovers_an_interior_optimum(opt, seed):
    rng = np.random.default_rng(seed)
    rho = np.geomspace(0.08, 0.95, 9)
    y = 0.6 - 0.1 * (np.log(rho) - np.log(opt)) ** 2 + 0.001 * rng.normal(size=rho.size)
    fit = race_diagnostic(rho, y)
    assert fit.decision == "interior"
    assert abs(np.log(fit.rho_star) - np.log(opt)) < 0.1


@pytest.mark.parametrize(("sign", "direction"), [(1, "higher"), (-1, "lower")])
def test_race_boundary_points_beyond_the_edge(sign, direction):
    rho = np.array([0.2, 0.3, 0.4, 0.5, 0.6, 0.7])
    fit = race_diagnostic(rho, 0.5 + sign * 0.2 * np.log(rho))
    assert fit.decision == "boundary" and fit.direction == direction
    assert (fit.rho_star > 0.7) if sign > 0 else (fit.rho_star < 0.2)


def test_race_falls_back_to_the_best_pilot_point():
    rng = np.random.default_rng(3)
    rho = np.array([0.2, 0.3, 0.4, 0.5, 0.6, 0.7])
    noisy = rng.permutation([0.50, 0.58, 0.41, 0.62, 0.47, 0.55])
    fit = race_diagnostic(rho, noisy)
    assert fit.decision == "fallback" and "unstable" in fit.reason
    assert fit.rho_star == fit.best_rho == rho[int(np.argmax(noisy))]
    assert race_diagnostic(rho[:3], noisy[:3]).reason.startswith("3 runs < 4")
    assert race_diagnostic([0.5] * 5, [0.1, 0.2, 0.3, 0.4, 0.5]).reason == "all runs have the same rho"
    # full fine-tuning sweeps: ρ differs only in the 4th digit
    narrow = race_diagnostic([0.7498, 0.75, 0.7499, 0.7500], [0.15, 0.24, 0.21, 0.25])
    assert narrow.decision == "fallback" and narrow.reason.startswith("rho spans only 0.0%")


def test_race_by_band_groups_runs():
    runs = [SweepRun(2, 2, 1, r, 64.0, rho=rho, band=b) for b, (rho, r) in itertools.product(
        ["C1", "C2"], zip([0.2, 0.3, 0.4, 0.5, 0.6], [0.1, 0.2, 0.3, 0.4, 0.5], strict=True))]
    runs.append(SweepRun(2, 2, 1, 0.9, 64.0))  # no ledger: ignored
    fits = race_by_band(runs)
    assert [f.band for f in fits] == ["C1", "C2"] and all(f.n_points == 5 for f in fits)


# ------------------------------------------------------------------ report and CLI


def synthetic_runs():
    runs = synthetic_isocompute([256, 512, 1024], [2, 4, 8, 16], lambda c: min(c / 128, 4))
    rho = np.geomspace(0.3, 0.9, len(runs) // 3)
    out = []
    for i, r in enumerate(runs):
        j = i % len(rho)
        bonus = -0.05 * (np.log(rho[j]) - np.log(0.6)) ** 2
        out.append({"n": r.n, "prompts_per_step": r.prompts_per_step, "steps": r.steps, "rollouts": r.rollouts,
                    "rho": float(rho[j]), "reward": r.reward + bonus, "band": f"C={int(r.rollouts)}"})
    return out


@pytest.mark.slow
def test_report_files_and_markdown(tmp_path):
    runs = [SweepRun.from_dict(d) for d in synthetic_runs()]
    a = analyse(runs)
    assert a.trend == "grows then saturates" and len(a.race) == 3
    md = markdown(a)
    assert "grows then saturates" in md and "| C=256 |" in md and "LOO RMSE" in md
    paths = write_report(a, runs, tmp_path)
    assert [p.name for p in paths] == ["report.md", "report.json", "best_n.png", "race.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    assert json.loads((tmp_path / "report.json").read_text())["trend"] == "grows then saturates"


@pytest.mark.slow
def test_cli_grid_and_report(tmp_path, capsys):
    grid = tmp_path / "grid.jsonl"
    assert main(["sweep", "grid", "--budgets", "32,64", "--n", "2,4", "--prompts-per-step", "2,4",
                 "--out", str(grid)]) == 0
    points = [json.loads(line) for line in grid.read_text().splitlines()]
    assert len(points) == 8 and all(p["n"] * p["prompts_per_step"] * p["steps"] == p["rollouts"] for p in points)
    runs = tmp_path / "runs.jsonl"
    runs.write_text("".join(json.dumps(d) + "\n" for d in synthetic_runs()))
    assert main(["sweep", "report", "--runs", str(runs), "--out", str(tmp_path / "report")]) == 0
    out = capsys.readouterr().out
    assert "best n with compute: grows then saturates" in out and "RACE C=256" in out
    assert (tmp_path / "report" / "race.png").exists()


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: iso_grid([10], [3], [3]), "no \\(n, B_p\\) divides"),
        (lambda: iso_grid([10], [], [3]), "non-empty n and B_p"),
        (lambda: in_flop_band([1.0], 0.0), "center > 0"),
        (lambda: SweepRun.from_dict({"n": 2, "steps": 1, "reward": 0.1}), "prompts_per_step"),
        (lambda: race_diagnostic([0.2, 1.5], [0.1, 0.2]), "rho must lie in"),
        (lambda: race_diagnostic([0.2, 0.3], [0.1]), "same length"),
        (lambda: compare_families([0.2, 0.3], [0.1, 0.2], ["spline"]), "unknown response family"),
    ],
)
def test_errors(call, match):
    with pytest.raises(InputError, match=match):
        call()


def test_cli_errors(tmp_path, capsys):
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    assert main(["sweep", "report", "--runs", str(tmp_path / "bad.jsonl"), "--out", str(tmp_path)]) == 2
    assert "not JSON" in capsys.readouterr().err
    assert main(["sweep", "report", "--runs", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path)]) == 2
