"""Evaluation maths (hand-worked and invariants), cross-validation, and the fit/report CLI end to end."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from isocompute.artifacts import load_manifest
from isocompute.cli import main
from isocompute.evaluation.evaluate import (
    METHODS,
    Evaluation,
    check_targets,
    cost_to_reach,
    cross_validate,
    default_budgets,
    length_rule,
    same_accuracy,
    summarise,
    uniform_mix,
)
from isocompute.policy.policy import PolicyConfig
from isocompute.policy.synthetic import synthetic_records, write_synthetic_outcomes
from isocompute.solver.estimators import utilities
from isocompute.solver.outcomes import from_records

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
ACTIONS = (1, 2, 4, 8)
SMALL = dict(actions=ACTIONS, budget_range=(1.0, 8.0), n_rounds=10, n_budget_grid=17, calibration_folds=2,
             n_components=4)
FIT_FLAGS = ["--actions", "1,2,4,8", "--budgets", "1:8", "--n-rounds", "10", "--svd-components", "4",
             "--calibration-folds", "2"]


# ---------------------------------------------------------------------------------------------- maths


@pytest.mark.parametrize(("budget", "expected"), [(3.0, (1, 2, 0.5)), (8.0, (2, 3, 1.0)), (1.0, (0, 1, 0.0)),
                                                    (1.5, (0, 1, 0.5)), (6.0, (2, 3, 0.5))])
def test_uniform_mix(budget, expected):
    lo, hi, q = uniform_mix(np.array([1.0, 2.0, 4.0, 8.0]), budget)
    assert (lo, hi) == expected[:2] and q == pytest.approx(expected[2])
    assert (1 - q) * [1, 2, 4, 8][lo] + q * [1, 2, 4, 8][hi] == pytest.approx(budget)


def test_length_rule_hand_worked():
    # Upgrade the longest half of training lengths [1, 2, 2, 3]: all of length 3 and half of length 2.
    p = length_rule(np.array([1, 2, 2, 3]), np.array([3, 2, 1, 5]), 0.5)
    np.testing.assert_allclose(p, [1.0, 0.5, 0.0, 1.0])
    assert length_rule([1, 2], [1, 2], 0.0).tolist() == [0, 0] and length_rule([1, 2], [1, 2], 1.0).tolist() == [1, 1]


@pytest.mark.parametrize("share", [0.0, 0.1, 0.33, 0.5, 0.9, 1.0])
def test_length_rule_hits_the_training_share(share):
    train = np.random.default_rng(0).integers(10, 20, size=97)
    assert length_rule(train, train, share).mean() == pytest.approx(share)


def test_default_budgets():
    assert default_budgets(1, 16) == sorted({1.0, 1.414214, 2.0, 2.828427, 4.0, 5.656854, 8.0, 11.313708, 16.0})
    b = default_budgets(1, 8)
    assert {1.0, 2.0, 4.0, 8.0} <= set(b) and len(b) == 11


def _hand_evaluation():
    """S = 1 seed, one budget 1.5, N = 4 prompts, actions (1, 2); numbers worked by hand below."""
    N = 4
    util = np.full((1, len(METHODS), 1, N), np.nan)
    cost = np.full_like(util, np.nan)
    rows = {"oracle": [1, 1, 0, 0], "learned": [1, 0, 0, 0], "uniform": [0.5, 0.25, 0, 0],
            "heuristic": [0.5, 0.5, 0, 0], "random": [0.5, 0.5, 0, 0], "oracle_lp": [1, 1, 0, 0],
            "learned_classifier": [1, 0, 0, 0]}
    costs = {"oracle": [2, 2, 1, 1], "learned": [2, 1, 1, 1], "uniform": [1.5] * 4, "heuristic": [1.5] * 4,
             "random": [1.5] * 4, "oracle_lp": [2, 2, 1, 1], "learned_classifier": [2, 1, 1, 1]}
    for m, v in rows.items():
        util[0, METHODS.index(m), 0] = v
        cost[0, METHODS.index(m), 0] = costs[m]
    oracle_actions = np.array([[[1, 1, 0, 0]]])
    learned = np.array([[[1, 0, 0, 0]]])
    per_learner = np.full((1, 2, 1, N), -1)
    per_learner[0, 0] = learned[0]
    return Evaluation("holdout", np.array([1.5]), (1, 2), (0,), 1, util, cost, oracle_actions, learned,
                      per_learner, np.array([[[1.0, 1.0, 0.0, 0.0]]]), np.zeros((1, N), dtype=int),
                      [["classifier"]], [[{}]])


def test_cost_to_reach_worked_example():
    """(2, 0.80) then (4, 0.90), target 0.85 → cost 3 (and alt cost halfway too); reached at the first point → ≤."""
    hit = cost_to_reach([(1.0, 10.0, 0.5), (2.0, 20.0, 0.80), (4.0, 40.0, 0.90)], 0.85)
    assert hit == {"cost": pytest.approx(3.0), "cost_alt": pytest.approx(30.0), "at_lowest": False}
    assert cost_to_reach([(2.0, None, 0.9), (4.0, None, 0.95)], 0.85) == {"cost": 2.0, "cost_alt": None,
                                                                           "at_lowest": True}
    assert cost_to_reach([(2.0, None, 0.5), (4.0, None, 0.6)], 0.85) is None
    entries = [{"methods": {m: {"cost": c, "accuracy": a} for m in ("oracle", "uniform")}}
               for c, a in ((2.0, 0.8), (4.0, 0.9))]
    entries[0]["methods"]["oracle"]["accuracy"] = 0.9
    out = same_accuracy(entries, {"k": 4, "accuracy": 0.9, "cost": 4.0, "cost_alt": None}, None)
    assert out["methods"]["oracle"]["times_less"] == pytest.approx(2.0)  # 0.9 already at cost 2
    assert out["methods"]["uniform"]["times_less"] == pytest.approx(1.0)


def test_summarise_hand_worked():
    e = summarise(_hand_evaluation(), n_boot=500, seed=0)["budgets"][0]
    assert e["methods"]["oracle"]["accuracy"] == 0.5 and e["methods"]["learned"]["accuracy"] == 0.25
    assert e["methods"]["uniform"]["accuracy"] == pytest.approx(0.1875)
    assert e["gain_vs_uniform"]["relative"] == pytest.approx(1 / 3)  # (0.25 − 0.1875) / 0.1875
    assert e["imitation_accuracy"] == 0.75  # prompt 1: learned k = 1, oracle k = 2
    assert e["regret"] == pytest.approx(0.25) and e["bound"] == pytest.approx(0.25)  # (1 − 0.75) × gap 1
    assert e["regret_le_bound_all_folds"]
    assert e["apgr"] == pytest.approx(0.2)  # 0.0625 / 0.3125
    assert e["cost_error"] == pytest.approx(1.25 / 1.5 - 1)
    assert e["confusion_learned_vs_oracle"] == [[2, 1], [0, 1]]
    assert e["action_histogram"] == {"oracle": [2, 2], "learned": [3, 1]}
    assert "utility" not in e["learners"] and e["learners"]["classifier"]["imitation_accuracy"] == 0.75
    lo, hi = e["gain_vs_uniform"]["ci95"]
    assert lo <= 1 / 3 <= hi


def test_paired_bootstrap_of_a_proportional_gain_is_degenerate():
    ev = _hand_evaluation()
    rng = np.random.default_rng(1)
    base = rng.uniform(0.2, 0.8, size=(1, 1, 200))
    util = np.repeat(np.repeat(base[:, None], len(METHODS), axis=1), 1, axis=2)
    util[0, METHODS.index("learned")] = 1.1 * base[0]
    cost = np.ones_like(util)
    n = 200
    ev = Evaluation("holdout", np.array([1.5]), (1, 2), (0,), 1, util, cost, np.zeros((1, 1, n), int),
                    np.zeros((1, 1, n), int), np.zeros((1, 2, 1, n), int), np.ones((1, 1, n)),
                    np.zeros((1, n), int), [["classifier"]], [[{}]])
    g = summarise(ev, n_boot=300)["budgets"][0]["gain_vs_uniform"]
    assert g["relative"] == pytest.approx(0.1) and g["ci95"] == pytest.approx([0.1, 0.1])
    assert g["significant"]


# ---------------------------------------------------------------------------------------------- cross-validation


@pytest.mark.slow
def test_cross_validate_invariants():
    table = from_records(synthetic_records(90, 8, seed=2, noise=0.3))
    U = utilities(table, ACTIONS, "majority")
    C = np.broadcast_to(np.asarray(ACTIONS, float), U.shape).copy()
    budgets = [1.0, 2.0, 3.0, 8.0]
    ev = cross_validate(table.prompts, U, C, PolicyConfig(**SMALL), budgets, folds=3, seeds=(0, 1))
    assert ev.utility.shape == (2, len(METHODS), 4, 90)
    for s in range(2):  # every prompt is held out exactly once per seed
        assert sorted(np.bincount(ev.fold[s]).tolist()) == [30, 30, 30]
    assert not np.isnan(ev.utility[:, METHODS.index("learned_utility")]).any()
    m = {name: i for i, name in enumerate(METHODS)}
    for s in range(2):
        for f in range(3):
            sel = ev.fold[s] == f
            for bi, b in enumerate(budgets):
                lp = ev.utility[s, m["oracle_lp"], bi, sel].mean()
                # The LP optimum dominates every allocation that spends no more: uniform and random.
                assert lp >= ev.utility[s, m["uniform"], bi, sel].mean() - 1e-9
                assert lp >= ev.utility[s, m["random"], bi, sel].mean() - 1e-9
                assert ev.cost[s, m["uniform"], bi, sel].mean() == pytest.approx(b)
                assert ev.cost[s, m["oracle"], bi, sel].mean() <= b + 1e-9
    summary = summarise(ev, n_boot=200)
    for e in summary["budgets"]:
        assert e["regret_le_bound_all_folds"]
        assert e["regret"] <= e["bound"] + 1e-12
        assert len(e["per_fold"]) == 6
    assert summary["budgets"][0]["imitation_accuracy"] == 1.0  # budget 1: everyone gets k = 1
    assert check_targets(summary) is None  # budget 4 not evaluated


# ---------------------------------------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A policy over plans (the default menu, capped at 8 samples) and one with ``--plans none``."""
    d = tmp_path_factory.mktemp("cli")
    train = write_synthetic_outcomes(d / "train.jsonl", 120, 8, seed=0, noise=0.3)
    other = write_synthetic_outcomes(d / "other.jsonl", 60, 8, seed=9, noise=0.3)
    assert main(["fit", str(train), "--out", str(d / "pol"), *FIT_FLAGS]) == 0
    assert main(["fit", str(train), "--out", str(d / "pol1"), *FIT_FLAGS, "--plans", "none"]) == 0
    return d, train, other


REPORT_FILES = {"report.json", "report.md", "accuracy.png", "accuracy_cost.png", "actions.png", "confusion.png"}


@pytest.mark.slow
def test_cli_fit_then_cv_report_over_plans(fitted):
    """The default: plans. The report scores the policy as served against its fixed plan, every rule
    family's best fixed plan and uniform, with waves, and draws accuracy against realised cost."""
    d, train, _ = fitted
    pol = json.loads((d / "pol" / "policy.json").read_text())
    assert len(pol["plans"]) > 30 and pol["config"]["fallback"] == ["fixed_plan", "uniform"]
    out = d / "rep-plans"
    assert main(["report", "--policy", str(d / "pol"), str(train), "--out", str(out), "--folds", "3",
                 "--seeds", "1", "--budgets", "1,2,4,8", "--bootstrap", "200"]) == 0
    m = load_manifest(out, kind="report", schema_version=1)
    assert set(m["files"]) == REPORT_FILES
    rep = json.loads((out / "report.json").read_text())
    assert rep["plans"] == pol["plans"] and rep["actions"] == [1, 2, 4, 8]
    fixed = ("fixed_plan", "fixed_lead", "fixed_window", "fixed_beta", "fixed_dirichlet", "fixed_bayes", "fixed_best")
    for e in rep["budgets"]:
        assert set(e["methods"]) >= {"oracle", "learned", "uniform", *fixed}
        assert all(e["methods"][k]["waves"] >= 1 for k in fixed) and e["methods"]["uniform"]["waves"] == 1
        assert e["methods"]["uniform"]["cost"] == pytest.approx(e["budget"])
        assert e["methods"]["oracle"]["cost"] <= e["budget"] + 1e-9
        assert {"relative", "ci95", "significant"} <= set(e["gain_vs_fixed"]["fixed_best"])
        assert set(e["rules"]) <= {"learned", "fixed_plan", "uniform"} and sum(e["rules"].values()) == pytest.approx(1)
        assert "imitation_ceiling" not in e  # k-sample label redraws do not apply to plans
    assert [c["budget"] for c in rep["baseline_choices"]] == [1.0, 2.0, 4.0, 8.0]
    assert set(rep["baseline_choices"][0]["plays"]) == {"lead", "window", "beta", "dirichlet", "bayes", "best"}
    md = (out / "report.md").read_text()
    assert "## Plans: fixed stopping rules and latency" in md and "best ESC window" in md
    assert "## Never worse than the fixed plan and uniform" in md and "![accuracy vs realised cost" in md
    same = rep["same_accuracy"]
    assert same["reference"]["k"] == 8 and same["methods"]["uniform"]["cost"] == pytest.approx(8.0)
    assert (out / "accuracy_cost.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_cli_fit_then_cv_report(fitted):
    """``--plans none``: k samples at once, the report as before plans."""
    d, train, _ = fitted
    load_manifest(d / "pol1", kind="policy", schema_version=1)
    out = d / "rep"
    assert main(["report", "--policy", str(d / "pol1"), str(train), "--out", str(out), "--folds", "3",
                 "--seeds", "1", "--budgets", "1,2,4,8", "--bootstrap", "200"]) == 0
    m = load_manifest(out, kind="report", schema_version=1)
    assert set(m["files"]) == REPORT_FILES
    rep = json.loads((out / "report.json").read_text())
    assert [e["budget"] for e in rep["budgets"]] == [1.0, 2.0, 4.0, 8.0]
    for e in rep["budgets"]:
        assert set(e["methods"]) >= {"oracle", "learned", "uniform", "heuristic", "random"}
        assert {"accuracy", "cost"} <= set(e["methods"]["learned"])
        assert {"relative", "ci95"} <= set(e["gain_vs_uniform"])
        assert {"imitation_accuracy", "regret", "bound"} <= set(e)
    assert rep["seeds"] == [0] and rep["inputs"]["outcomes"] == m["inputs"]["outcomes"]
    assert rep["targets"]["budget"] == 4.0
    md = (out / "report.md").read_text()
    assert "Small sample (120 prompts)" in md and "| 4 |" in md
    assert (out / "accuracy.png").read_bytes()[:4] == b"\x89PNG"
    # the never-worse chain and "same accuracy for less" (synthetic tables carry no model config: samples only)
    assert "## Never worse than uniform" in md and "## Same accuracy for less" in md
    assert all(set(e["rules"]) <= {"learned", "uniform"} and sum(e["rules"].values()) == pytest.approx(1)
               for e in rep["budgets"])
    same = rep["same_accuracy"]
    assert same["reference"]["k"] == 8 and same["alt_unit"] is None
    assert same["methods"]["uniform"]["cost"] == pytest.approx(8.0)  # uniform reaches uniform k = 8 at k = 8
    assert rep["policy"]["fallback"]["ranges"][0][1] == 1.0
    assert rep["plans"] is None and all("fixed_best" not in e["methods"] for e in rep["budgets"])


@pytest.mark.slow
def test_cli_holdout_report(fitted, capsys):
    d, _, other = fitted
    out = d / "hold"
    assert main(["report", "--policy", str(d / "pol1"), str(other), "--out", str(out), "--holdout",
                 "--bootstrap", "100"]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["mode"] == "holdout" and rep["folds"] == 1
    assert all(len(e["per_fold"]) == 1 for e in rep["budgets"])
    # stdout is not a terminal here (as in a CI log): the ten-column table prints every number in full
    printed = capsys.readouterr().out
    assert "…" not in printed
    for e in rep["budgets"]:
        row = next(line for line in printed.splitlines()
                   if line.startswith("│") and line.split("│")[1].strip() == f"{e['budget']:.3g}")
        assert all(f"{e['methods'][m]['accuracy']:.4f}" in row for m in ("oracle", "learned", "uniform"))
        assert f"{e['imitation_ceiling']:.3f}" in row
    # a plan policy's holdout: its own table, with the fixed plan and the waves
    out = d / "hold-plans"
    assert main(["report", "--policy", str(d / "pol"), str(other), "--out", str(out), "--holdout",
                 "--bootstrap", "100"]) == 0
    rep = json.loads((out / "report.json").read_text())
    printed = capsys.readouterr().out
    for e in rep["budgets"]:
        row = next(line for line in printed.splitlines()
                   if line.startswith("│") and line.split("│")[1].strip() == f"{e['budget']:.3g}")
        assert all(f"{e['methods'][m]['accuracy']:.4f}" in row for m in ("oracle", "learned", "fixed_plan", "uniform"))
        assert f"{e['methods']['learned']['waves']:.2f}" in row
        assert "fixed_best" not in e["methods"]  # the families' baselines need training prompts: none in a holdout


def _schema_2(d):
    m = json.loads((d / "pol" / "manifest.json").read_text())
    m["schema_version"] = 2
    (d / "pol2").mkdir(exist_ok=True)
    for p in (d / "pol").rglob("*"):
        if p.is_file():
            dest = d / "pol2" / p.relative_to(d / "pol")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(p.read_bytes())
    (d / "pol2" / "manifest.json").write_text(json.dumps(m))
    return str(d / "pol2")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (lambda d, t, o: ["fit", str(t), "--out", "{out}", "--actions", "1,x"], "comma list"),
        (lambda d, t, o: ["fit", str(t), "--out", "{out}", "--actions", "4"], "at least two distinct"),
        (lambda d, t, o: ["fit", str(t), "--out", "{out}", "--actions", "1,2,4,16"], "infeasible"),
        (lambda d, t, o: ["fit", str(t), "--out", "{out}", "--actions", "1,2,4,8", "--budgets", "8:1"], "--budgets"),
        (lambda d, t, o: ["fit", str(d / "missing.jsonl"), "--out", "{out}"], "does not exist"),
        (lambda d, t, o: ["fit", str(t), "--out", "{out}", "--plans", "everything"], "--plans must be one of"),
        (lambda d, t, o: ["fit", str(t), "--out", "{out}", "--plans", "default", "--strategy", "pass"],
         "plans vote by majority"),
        (lambda d, t, o: ["fit", str(t), "--out", "{out}", "--actions", "1,2,4,8", "--plans", "lead:m=2@1x16"],
         "infeasible"),
        (lambda d, t, o: ["report", "--policy", str(d / "pol"), str(t), "--out", "{out}", "--budgets", "0.5,2"],
         r"outside the range \[1, 8\]"),
        (lambda d, t, o: ["report", "--policy", str(d / "pol"), str(o), "--out", "{out}", "--folds", "40"],
         "folds over 60 prompts"),
        (lambda d, t, o: ["report", "--policy", str(d / "pol"), str(t), "--out", "{out}", "--holdout"], "never saw"),
        (lambda d, t, o: ["report", "--policy", _schema_2(d), str(o), "--out", "{out}", "--holdout"],
         "schema version 2"),
        (lambda d, t, o: ["report", "--policy", str(d), str(o), "--out", "{out}"], "manifest.json is missing"),
    ],
)
def test_cli_errors_are_clear_and_leave_nothing(fitted, capsys, argv, match):
    d, train, other = fitted
    out = d / "err-out"
    args = [a.replace("{out}", str(out)) for a in argv(d, train, other)]
    assert main(args) == 2
    assert re.search(match, capsys.readouterr().err)
    assert not out.exists()
    assert not [p for p in d.iterdir() if p.name.startswith(".err-out")]


@pytest.mark.slow
@pytest.mark.data
def test_qwen_table_end_to_end(tmp_path):
    path = DATA / "qwen_math_cot_100.jsonl"
    if not path.exists():
        pytest.skip("shared data absent")
    assert main(["fit", str(path), "--out", str(tmp_path / "pol"), *FIT_FLAGS]) == 0
    assert main(["report", "--policy", str(tmp_path / "pol"), str(path), "--out", str(tmp_path / "rep"),
                 "--folds", "3", "--seeds", "1", "--budgets", "1,2,4", "--bootstrap", "200"]) == 0
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert rep["n_prompts"] == 100
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "Small sample (100 prompts)" in md
    # Honest about significance: every gain whose CI contains 0 is labelled so.
    for e in rep["budgets"]:
        lo, hi = e["gain_vs_uniform"]["ci95"]
        assert e["gain_vs_uniform"]["significant"] == (lo > 0 or hi < 0)
    assert ("not significant" in md) == any(not e["gain_vs_uniform"]["significant"] for e in rep["budgets"])
