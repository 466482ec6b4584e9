"""``isocompute solve --latency-budget``: on a small table with token counts, the two-budget oracle over the
plan menu meets both budgets in expectation and reaches the LP optimum (HiGHS over the same U, C, L); a slack
latency budget gives today's solution; without the flag nothing changes; the errors say what to do."""

import json
import re

import numpy as np
import pytest
from scipy.optimize import linprog

from isocompute.cli import main
from isocompute.errors import InputError
from isocompute.policy.plans.arrays import plan_arrays
from isocompute.policy.plans.menu import resolve_plans
from isocompute.solver.outcomes import read_outcomes
from isocompute.solver.plans.estimates import estimate_table
from isocompute.solver.plans.plan import parallel_plans
from isocompute.stages.solve import SolveConfig, solve

ACTIONS = [1, 2, 4, 8]


def _write(path, tokens=True, n_prompts=24, n_samples=8, seed=3):
    """Prompts of varied difficulty and lengths (wrong answers run longer, as reasoning traces do)."""
    rng = np.random.default_rng(seed)
    with path.open("w") as f:
        for i in range(n_prompts):
            p, scale = rng.beta(0.8, 0.8), rng.uniform(50, 400)
            samples = []
            for _ in range(n_samples):
                ok = bool(rng.random() < p)
                s = {"answer": "42" if ok else str(rng.integers(0, 3)), "correct": ok}
                if tokens:
                    s["completion_tokens"] = int(scale * rng.uniform(0.5, 1.5) * (1.0 if ok else 1.6))
                samples.append(s)
            f.write(json.dumps({"id": f"q{i}", "prompt": f"question {i}", "gold": "42", "prompt_tokens": 20,
                                "samples": samples}) + "\n")
    return path


@pytest.fixture
def table(tmp_path):
    return _write(tmp_path / "outcomes.jsonl")


def _solve(table, out, **kw):
    cfg = SolveConfig(outcomes=table, actions=list(ACTIONS), cost_unit="tokens", plans="default+parallel",
                      out=out, **{"budget": 3.0 * _per_sample(table), **kw})
    summary = solve(cfg)
    rows = [json.loads(line) for line in (out / "solution.jsonl").read_text().splitlines()]
    return summary, rows


def _per_sample(table):
    t = read_outcomes(table)
    return float(np.nanmean(t.mean_completion_tokens))


def _probs(rows, n_plans):
    """Each prompt's plan probabilities from solution.jsonl (either path's fields)."""
    P = np.zeros((len(rows), n_plans))
    for i, r in enumerate(rows):
        for c in r.get("mix") or [{"action": r["action"], "p": r["p"]},
                                  *([{"action": r["action_hi"], "p": r["p_hi"]}] if "action_hi" in r else [])]:
            P[i, c["action"]] += c["p"]
    return P


def lp_two(U, C, L, budget, latency_budget):
    """max mean U s.t. mean C ≤ budget, mean L ≤ latency_budget, one distribution per prompt (HiGHS), in sums
    with O(1) coefficients."""
    n, a = U.shape
    sc, sl = float(np.abs(C).max()), float(np.abs(L).max())
    res = linprog(-U.ravel(), A_ub=np.vstack([C.ravel() / sc, L.ravel() / sl]),
                  b_ub=[n * budget / sc, n * latency_budget / sl], A_eq=np.kron(np.eye(n), np.ones(a)),
                  b_eq=np.ones(n), bounds=(0, 1), method="highs")
    assert res.status == 0, res.message
    return -res.fun / n


def test_plan_arrays_carry_tokens_and_latency(table):
    t = read_outcomes(table)
    plans = resolve_plans("default+parallel", ACTIONS)
    arr = plan_arrays(t, plans, cost_unit="tokens")
    est = estimate_table(t, plans)
    np.testing.assert_allclose(arr.tokens, est.generated_tokens)
    np.testing.assert_allclose(arr.latency, est.latency)
    np.testing.assert_allclose(arr.total_latency(10.0), est.total_latency(10.0))
    np.testing.assert_allclose(arr.cost, est.tokens)  # the tokens unit is the tokens generated
    names = {p.name for p in plans}
    assert {p.name for p in resolve_plans("parallel", [1, 2, 4, 8, 16])} >= {p.name for p in parallel_plans()}
    assert names >= {p.name for p in resolve_plans("default", ACTIONS)} | {p.name for p in resolve_plans("parallel", ACTIONS)}


@pytest.mark.parametrize("overhead", [0.0, 0.25])
def test_binding_latency_budget_meets_both_and_equals_the_lp(table, tmp_path, overhead):
    free, _ = _solve(table, tmp_path / "free", latency_budget=1e6, wave_overhead=overhead)
    lat = 0.85 * free["mean_latency"]
    summary, rows = _solve(table, tmp_path / "two", latency_budget=lat, wave_overhead=overhead)
    U, C, L = (np.array([r[k] for r in rows]) for k in ("utilities", "costs", "latencies"))
    P = _probs(rows, U.shape[1])
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-12)
    budget = summary["budget"]
    assert (P * C).sum(axis=1).mean() <= budget * (1 + 1e-9)
    assert (P * L).sum(axis=1).mean() <= lat + 1e-9
    assert summary["mean_latency"] == pytest.approx((P * L).sum(axis=1).mean(), abs=1e-9)
    assert summary["mean_latency"] <= lat + 1e-9 and summary["mu"] > 0
    assert summary["mean_utility"] == pytest.approx((P * U).sum(axis=1).mean(), abs=1e-9)
    assert summary["mean_utility"] == pytest.approx(lp_two(U, C, L, budget, lat), abs=1e-9)
    assert summary["mean_utility"] < free["mean_utility"]
    # L is latency in sample units: decode length / one sample's mean length + overhead per wave
    t = read_outcomes(table)
    arr = plan_arrays(t, resolve_plans("default+parallel", ACTIONS), cost_unit="tokens")
    per = summary["latency_unit_tokens"]
    assert per == pytest.approx(_per_sample(table))
    np.testing.assert_allclose(L, arr.latency / per + overhead * arr.waves, rtol=1e-12)
    for u in summary["uniform"]:
        j = summary["plans"].index(u["plan"])
        assert u["mean_latency"] == pytest.approx(L[:, j].mean()) and u["mean_tokens"] == pytest.approx(C[:, j].mean())
    assert summary["uniform"][0]["mean_latency"] == pytest.approx(1.0 + overhead)  # none@1 waits one sample


def test_slack_latency_budget_gives_todays_solution(table, tmp_path):
    today, rows0 = _solve(table, tmp_path / "today")
    slack, rows1 = _solve(table, tmp_path / "slack", latency_budget=1e6)
    for k in ("budget", "lambda", "mean_cost", "mean_utility", "plan_share", "k_share", "expected_samples"):
        assert slack[k] == today[k]
    assert slack["mu"] == 0.0
    n = len(today["plans"])
    np.testing.assert_allclose(_probs(rows1, n), _probs(rows0, n), atol=1e-15)
    for key in ("mean_latency", "mean_tokens", "latency_budget"):
        assert key not in today and all(key not in u for u in today["uniform"])
    assert all("latencies" not in r for r in rows0)
    params = json.loads((tmp_path / "today" / "manifest.json").read_text())["params"]
    assert "latency_budget" not in params


def test_infeasible_latency_budget_names_the_least(table, tmp_path):
    with pytest.raises(InputError, match="infeasible") as e:
        _solve(table, tmp_path / "x", latency_budget=0.01)
    least = float(re.search(r"Pass --latency-budget ([0-9.e+-]+) or more", str(e.value)).group(1))
    assert 0.01 < least < 1.0  # first:m=1 finishes before a sample's mean wait
    summary, _ = _solve(table, tmp_path / "ok", latency_budget=least * 1.001)
    assert summary["mean_latency"] <= least * 1.001 + 1e-9


@pytest.mark.parametrize(("argv", "message"), [
    (["--latency-budget", "-1"], "--latency-budget must be a finite number ≥ 0"),
    (["--latency-budget", "1", "--rounding", "deterministic"], "drop --rounding deterministic"),
    (["--latency-budget", "1", "--wave-overhead", "-0.5"], "--wave-overhead must be"),
    (["--latency-budget", "1", "--decode-speed", "0"], "--decode-speed must be a finite number of tokens per second > 0"),
    (["--latency-budget", "1", "--decode-speed", "-50"], "--decode-speed must be a finite number"),
    (["--latency-budget", "1", "--decode-speed", "nan"], "--decode-speed must be a finite number"),
    (["--decode-speed", "50"], "only --latency-budget computes; add --latency-budget"),
])
def test_bad_options(table, tmp_path, capsys, argv, message):
    assert main(["solve", str(table), "--budget", "2", "--out", str(tmp_path / "o"), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_table_without_token_counts(tmp_path):
    t = _write(tmp_path / "bare.jsonl", tokens=False)
    for plans in ("default", "none", "parallel"):  # parallel-stop plans need the lengths even to be estimated
        with pytest.raises(InputError, match="completion_tokens"):
            solve(SolveConfig(outcomes=t, actions=list(ACTIONS), plans=plans, budget=2.0, latency_budget=1.0,
                              out=tmp_path / "o"))
    assert not (tmp_path / "o").exists()


def test_cli_prints_latency_and_plays_the_ladder_with_plans_none(table, tmp_path, capsys):
    out = tmp_path / "cli"
    assert main(["solve", str(table), "--actions", "1,2,4,8", "--plans", "none", "--cost-unit", "tokens",
                 "--budget", "2x", "--latency-budget", "1.2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "mean latency / tokens" in printed and "mean latency" in printed and "μ*" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["plans"] == [f"none@{k}" for k in ACTIONS] and summary["mean_latency"] <= 1.2 + 1e-9


@pytest.mark.parametrize("overhead", [0.0, 0.25])
def test_decode_speed_gives_the_mean_latency_in_seconds(table, tmp_path, overhead):
    plain, _ = _solve(table, tmp_path / "plain", latency_budget=1.5, wave_overhead=overhead)
    timed, rows = _solve(table, tmp_path / "timed", latency_budget=1.5, wave_overhead=overhead, decode_speed=50.0)
    per = timed["latency_unit_tokens"]
    assert timed["decode_speed"] == 50.0 and "decode_speed" not in plain and "mean_latency_s" not in plain
    assert {k: v for k, v in timed.items() if k not in ("decode_speed", "mean_latency_s", "uniform", "out")} == {
        k: v for k, v in plain.items() if k not in ("uniform", "out")}  # seconds only add keys
    assert timed["mean_latency_s"] == pytest.approx(timed["mean_latency"] * per / 50.0, rel=1e-12)
    for u in timed["uniform"]:
        assert u["mean_latency_s"] == pytest.approx(u["mean_latency"] * per / 50.0, rel=1e-12)
    # none@1 waits one sample's mean length plus one wave's overhead: (1 + O) · per / speed seconds
    assert timed["uniform"][0]["mean_latency_s"] == pytest.approx((1.0 + overhead) * per / 50.0)
    params = json.loads((tmp_path / "timed" / "manifest.json").read_text())["params"]
    assert params["decode_speed"] == 50.0 and "decode_speed" not in json.loads(
        (tmp_path / "plain" / "manifest.json").read_text())["params"]


def test_cli_prints_seconds_with_decode_speed(table, tmp_path, capsys):
    out = tmp_path / "cli"
    assert main(["solve", str(table), "--actions", "1,2,4,8", "--plans", "none", "--cost-unit", "tokens",
                 "--budget", "2x", "--latency-budget", "1.2", "--decode-speed", "50", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert f"{summary['mean_latency_s']:.4g} s at 50 tokens/s" in printed and "mean latency (s)" in printed


@pytest.mark.parametrize("argv", [["--latency-budget", "1"], ["--wave-overhead", "0.1"], ["--decode-speed", "50"]])
def test_several_models_refuse_latency_options(table, tmp_path, capsys, argv):
    out = tmp_path / "o"
    code = main(["solve", "--outcomes", f"a={table}", "--outcomes", f"b={table}", "--budget", "1e12", "--out", str(out),
                 *argv])
    assert code == 2 and "without latency; drop --latency-budget" in capsys.readouterr().err
    assert not out.exists()
