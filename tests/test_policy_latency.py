"""Latency budgets in the policy (isocompute.policy.latency) and the report's reach block
(isocompute.evaluation.reach): decisions as the tables say, fallbacks that never wait longer than asked,
nothing moves without a latency budget, persistence, clear errors, and the reach arithmetic by hand."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isocompute.errors import BudgetError, InputError
from isocompute.evaluation.evaluate import default_budgets
from isocompute.evaluation.reach import TOLERANCE, _reach_point, reach_block
from isocompute.policy.fallback import FIXED_PLAN, LEARNED, UNIFORM
from isocompute.policy.latency import NUS, latency_units, quick_ladder, quick_plans
from isocompute.policy.learn.learners import price
from isocompute.policy.plans.arrays import table_arrays
from isocompute.policy.plans.fixed import choose_fixed_plan, choose_fixed_plans
from isocompute.policy.plans.menu import resolve_plans
from isocompute.policy.policy import Policy, PolicyConfig
from isocompute.policy.synthetic import synthetic_records
from isocompute.solver.outcomes import from_records

ACTIONS = (1, 2, 4, 8)
MENU = tuple(p.name for p in resolve_plans("lead+parallel", ACTIONS))


def _records(n: int = 120, seed: int = 3) -> list[dict]:
    """Synthetic outcomes whose sample lengths vary per prompt (50–500 tokens) and per sample (±50%)."""
    recs = synthetic_records(n, 8, seed=seed, noise=0.3)
    rng = np.random.default_rng(seed)
    for r in recs:
        base = int(rng.integers(50, 500))
        for s in r["samples"]:
            s["completion_tokens"] = int(base * rng.uniform(0.5, 1.5))
    return recs


def _table(n: int = 120, seed: int = 3):
    return from_records(_records(n, seed))


def _config(**kw) -> PolicyConfig:
    base = dict(actions=ACTIONS, plans=MENU, cost_unit="tokens", budget_range=(300.0, 1800.0), n_rounds=8,
                calibration_folds=2, n_components=4, latency_range=(1.0, 2.0), seed=1)
    base.update(kw)
    return PolicyConfig(**base)


@pytest.fixture(scope="module")
def fitted():
    table = _table()
    return table, Policy(_config()).fit(table)


def test_config_refuses_what_latency_cannot_serve():
    with pytest.raises(InputError, match="plan menu"):
        PolicyConfig(actions=ACTIONS, latency_range=(1.0, 2.0))
    with pytest.raises(InputError, match="utility learner"):
        _config(learner="classifier")
    with pytest.raises(InputError, match="0 < lo < hi"):
        _config(latency_range=(2.0, 1.0))
    with pytest.raises(InputError, match="wave_overhead"):
        _config(wave_overhead=-0.1)
    assert PolicyConfig.from_dict(_config().to_dict()) == _config()


def test_latency_range_below_the_quickest_plan_names_it():
    table = _table(60)
    with pytest.raises(BudgetError, match=r"quickest plan's mean latency \d"):
        Policy(_config(latency_range=(0.05, 2.0))).fit(table)


def test_fit_arrays_needs_latency_exactly_with_a_range():
    table = _table(60)
    cfg = _config()
    arr = table_arrays(table, cfg)
    with pytest.raises(InputError, match="latency="):
        Policy(cfg).fit_arrays(table.prompts, arr.utility, arr.cost, samples=arr.samples, waves=arr.waves)


def test_learned_decisions_are_the_priced_argmax_of_the_tables(fitted):
    table, pol = fitted
    t = pol.latency_
    X = pol.features(table.prompts)
    u, route = pol.prompt_keys(table.prompts)
    checked = 0
    for b in (400.0, 900.0, 1500.0):
        for L in (1.0, 1.3, 2.0):
            d = pol.decide(table.prompts, b, latency_budget=L)
            assert d.latency_budget == pytest.approx(L)
            np.testing.assert_allclose(d.expected_latency, t.plan_latency[d.action_index])
            if d.rule != LEARNED:
                continue
            v = t.price_index(b, L)
            assert d.lam == pytest.approx(t.calibrations[v](b))
            for j, m in enumerate(pol.learners_["utility"].models):
                sel = route == j
                Ut = m.predict_utilities(X[sel]) - NUS[v] * t.plan_latency[None, :]
                want = price(Ut, d.lam, m.predict_costs(X[sel], pol.action_costs_), u[sel])
                np.testing.assert_array_equal(d.action_index[sel], want)
            checked += 1
    assert checked, "the learned rule served nowhere on this grid; the test checks nothing"


def test_price_index_is_the_smallest_price_within_the_latency_budget(fitted):
    _, pol = fitted
    t = pol.latency_
    for b in t.calibrations[0].budgets[::8]:
        lat = np.array([np.interp(b, c.budgets, t.latency[v]) for v, c in enumerate(t.calibrations)])
        for L in (0.9, 1.2, 1.6, 2.0):
            v = t.price_index(float(b), L)
            ok = np.flatnonzero(lat <= L * (1 + 1e-9))
            assert v == (ok[0] if ok.size else lat.size - 1)


def test_fallback_rules_never_play_a_plan_slower_than_the_level(fitted):
    table, pol = fitted
    t = pol.latency_
    seen = set()
    for b in np.geomspace(300, 1800, 9):
        for L in np.linspace(1.0, 2.0, 7):
            d = pol.decide(table.prompts, float(b), latency_budget=float(L))
            seen.add(d.rule)
            if d.rule in (FIXED_PLAN, UNIFORM):
                level = t.levels[t.level(float(L))]
                assert d.expected_latency.max() <= level * (1 + 1e-9) or d.expected_latency.max() == pytest.approx(
                    t.plan_latency.min())
    assert seen & {FIXED_PLAN, UNIFORM}, f"no fallback served ({seen}); the test checks nothing"


def test_quick_helpers():
    lat = np.array([1.0, 3.0, 0.5, 2.0])
    assert quick_plans(lat, 1.0).tolist() == [0, 2]
    assert quick_plans(lat, 0.1).tolist() == [2]  # the quickest when none fits
    ladder = np.array([0, 3, 1])
    assert quick_ladder(ladder, lat, 2.5).tolist() == [0, 3]
    assert quick_ladder(ladder, lat, 1.0).tolist() == [0, 0]  # uniform mixes two: none@1 twice


def test_nothing_moves_without_a_latency_budget():
    table = _table()
    with_lat = Policy(_config()).fit(table)
    without = Policy(_config(latency_range=None)).fit(table)
    for b in (300.0, 700.0, 1800.0):
        a, c = with_lat.decide(table.prompts, b), without.decide(table.prompts, b)
        np.testing.assert_array_equal(a.action_index, c.action_index)
        assert a.latency_budget is None and a.expected_latency is None
    with pytest.raises(BudgetError, match="without latency budgets"):
        without.decide(table.prompts, 700.0, latency_budget=1.5)


def test_latency_budget_outside_the_range_says_so(fitted):
    table, pol = fitted
    with pytest.raises(BudgetError, match=r"\[1, 2\]"):
        pol.decide(table.prompts[:3], 700.0, latency_budget=5.0)
    with pytest.raises(BudgetError, match="must be a number"):
        pol.decide(table.prompts[:3], 700.0, latency_budget="soon")
    with pytest.raises(InputError, match="calibrated"):
        pol.decide(table.prompts[:3], 700.0, latency_budget=1.5, match="batch")


def test_round_trip_keeps_latency_decisions(fitted, tmp_path):
    table, pol = fitted
    pol.save(tmp_path / "p")
    back = Policy.load(tmp_path / "p")
    assert back.tokens_per_sample_ == pytest.approx(pol.tokens_per_sample_)
    for L in (1.0, 1.5, 2.0):
        a = pol.decide(table.prompts, 900.0, latency_budget=L)
        c = back.decide(table.prompts, 900.0, latency_budget=L)
        np.testing.assert_array_equal(a.action_index, c.action_index)
        assert a.rule == c.rule


def test_latency_units_add_the_overhead_per_wave():
    table = _table(40)
    arr = table_arrays(table, _config())
    per = float(np.mean(table.mean_completion_tokens))
    L0, L1 = latency_units(arr, 0.0), latency_units(arr, 0.25)
    np.testing.assert_allclose(L0, arr.latency / per)
    np.testing.assert_allclose(L1 - L0, 0.25 * arr.waves)
    j = [p.name for p in arr.plans].index("none@1")
    assert L0[:, j].mean() == pytest.approx(1.0)  # waiting for one sample is one sample length


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 9))
def test_fixed_plans_on_one_hull_equal_one_at_a_time(seed, P):
    rng = np.random.default_rng(seed)
    U, C = rng.random((1, P)), rng.random((1, P)) * 10 + 1
    budgets = list(np.linspace(C.min(), C.max() * 1.2, 7))
    for got, b in zip(choose_fixed_plans(U, C, budgets), budgets, strict=True):
        want = choose_fixed_plan(U, C, b)
        assert (got.lo, got.hi) == (want.lo, want.hi) and got.mix == pytest.approx(want.mix)


def test_default_budgets_keep_the_range_ends_exact():
    lo, hi = 1735.3194444, 27765.111111
    grid = default_budgets(lo, hi)
    assert grid[0] == lo and grid[-1] == hi


def test_reach_point_by_hand():
    # the module docstring's example: crossed between 6,100 and 7,000 tokens
    acc = np.array([0.97, 0.9775, 0.9790])
    tok = np.array([5000.0, 6100.0, 7000.0])
    lat = np.array([2.0, 2.2, 2.3])
    t, lt = _reach_point(acc, tok, lat, 0.9780, 2.31)
    assert t == pytest.approx(6100 + (0.9780 - 0.9775) / (0.9790 - 0.9775) * 900)
    assert lt == pytest.approx(2.2 + (1 / 3) * 0.1)
    assert _reach_point(acc, tok, lat, 0.9780, 2.25) is None  # the reaching budget waits too long
    assert _reach_point(acc, tok, lat, 0.99, 3.0) is None


def test_reach_block_against_a_direct_computation():
    rng = np.random.default_rng(0)
    N, B = 50, 5
    U = rng.random((N, 3))
    tokens = rng.random((N, 3)) * 100
    latency = rng.random((N, 3)) + 1
    scores = {"utility": np.sort(rng.random((1, 1, B, N)), axis=2),
              "tokens": np.sort(rng.random((1, 1, B, N)) * 100, axis=2),
              "latency": np.full((1, 1, B, N), 0.5), "cost": np.zeros((1, 1, B, N))}
    ref = {"reference": "uniform@4", "column": 1, "accuracy": float(U[:, 1].mean()),
           "tokens": float(tokens[:, 1].mean()), "latency": float(latency[:, 1].mean())}
    ref["max_latency"] = ref["latency"]
    out = reach_block(scores, [ref], {"utility": U, "tokens": tokens, "latency": latency}, np.arange(1, B + 1.0),
                      [1.5], n_boot=50)
    e = out[0]
    acc = scores["utility"][0, 0].mean(axis=1)
    tok = scores["tokens"][0, 0].mean(axis=1)
    hit = _reach_point(acc, tok, np.full(B, 0.5), ref["accuracy"] - TOLERANCE, ref["latency"])
    assert (e["policy_tokens"] is None) == (hit is None)
    if hit is not None:
        assert e["ratio"] == pytest.approx(hit[0] / ref["tokens"])
    assert e["latency_budget"] == 1.5 and len(e["sweep"]["accuracy"]) == B


@pytest.mark.slow
def test_fit_and_report_write_latency_tables_and_the_reach_block(tmp_path):
    from isocompute.cli import main

    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _records(90)))
    assert main(["fit", str(path), "--out", str(tmp_path / "pol"), "--actions", "1,2,4,8", "--n-rounds", "8",
                 "--svd-components", "4", "--calibration-folds", "2", "--plans", "lead+parallel", "--cost-unit",
                 "tokens", "--budgets", "1x:6x", "--latency-budgets", "1:2", "--wave-overhead", "0.05"]) == 0
    meta = json.loads((tmp_path / "pol" / "policy.json").read_text())
    assert meta["latency"]["levels"][0] == 1.0 and meta["config"]["wave_overhead"] == 0.05
    assert main(["report", "--policy", str(tmp_path / "pol"), str(path), "--out", str(tmp_path / "rep"),
                 "--folds", "3", "--seeds", "1", "--bootstrap", "100"]) == 0
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert rep["wave_overhead"] == 0.05  # the policy's own overhead, by default
    names = [e["reference"] for e in rep["reach"]]
    assert names == ["uniform@4", "uniform@8", "uniform@4"]  # the last within one sample's wait
    assert [e["max_latency"] for e in rep["reach"]][-1] == 1.0
    for e in rep["reach"]:
        assert set(e) >= {"reference", "accuracy", "tokens", "latency", "policy_tokens", "policy_latency", "ratio"}
        assert 1.0 <= e["latency_budget"] <= 2.0 and e["latency_budget"] == pytest.approx(
            min(max(e["max_latency"], 1.0), 2.0))
        if e["ratio"] is not None:
            assert e["ratio"] == pytest.approx(e["policy_tokens"] / e["tokens"])
            assert e["policy_latency"] <= e["max_latency"] * (1 + 1e-9)
    assert "## Reach" in (tmp_path / "rep" / "report.md").read_text()
    methods = rep["budgets"][0]["methods"]
    assert {"fixed_lead_par", "fixed_short", "fixed_lead"} <= set(methods)  # both modes, and short-m@k


def test_default_menu_holds_parallel_stop_plans_where_they_are_not_dominated():
    from isocompute.policy.plans.menu import PARALLEL_BASELINES, parallel_family_plans
    from isocompute.solver.plans.plan import parallel_plans
    from isocompute.stages.parsing import parse_plans

    plain_plans = resolve_plans("default", (1, 2, 4, 8, 16))
    assert not any(any(p.parallel) for p in plain_plans)  # in samples they are dominated: none
    plain = {p.name for p in plain_plans}
    par = {p.name for p in resolve_plans("default", (1, 2, 4, 8, 16), parallel=True)}
    assert par == plain | {p.name for p in parallel_plans()}
    assert set(parse_plans(None, (1, 2, 4, 8, 16), "majority", parallel=True)) == par
    for name in PARALLEL_BASELINES:
        ps = parallel_family_plans(name, 8)
        assert ps and all(all(p.parallel) and p.max_samples <= 8 for p in ps), name
