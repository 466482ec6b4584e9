"""Plans as the policy's actions: menus, plan arrays and the plan oracle, the cost head, the fixed-plan rule,
Decision's plan fields, the artifact, and cross-validation over plans (small synthetic tables, seconds)."""

import json

import numpy as np
import pytest
from scipy.optimize import linprog

from isocompute.errors import InputError
from isocompute.evaluation.baselines import FixedBaselines, baseline_plans
from isocompute.policy.fallback import FIXED_PLAN, LEARNED, UNIFORM
from isocompute.policy.learn.cost_head import SampleCostRegressor
from isocompute.policy.plans.arrays import allocate_plans, plan_arrays, table_arrays
from isocompute.policy.plans.fixed import choose_fixed_plan
from isocompute.policy.plans.fixed_rule import fixed_actions, fixed_plan_at, fixed_plan_scores
from isocompute.policy.plans.menu import default_menu, ladder_columns, resolve_plans, split_plan_names
from isocompute.policy.policy import Policy, PolicyConfig
from isocompute.policy.synthetic import synthetic_records
from isocompute.solver.costs import cost_table
from isocompute.solver.estimators import utilities
from isocompute.solver.outcomes import from_records
from isocompute.solver.plans.plan import default_plans, parse_plan

ACTIONS = (1, 2, 4, 8)
SMALL = dict(actions=ACTIONS, budget_range=(1.0, 8.0), n_rounds=10, n_budget_grid=17, calibration_folds=2,
             n_components=4)


def _names(spec: str = "default", actions=ACTIONS) -> tuple[str, ...]:
    return tuple(p.name for p in resolve_plans(spec, actions))


@pytest.fixture(scope="module")
def signal():
    return from_records(synthetic_records(240, 8, seed=4, noise=0.0))


@pytest.fixture(scope="module")
def no_signal():
    """Prompts shuffled against their samples: the text predicts nothing, but a stopping rule still helps."""
    recs = synthetic_records(300, 8, seed=5, noise=0.3)
    order = np.random.default_rng(5).permutation(len(recs))
    return from_records([{**r, "prompt": recs[j]["prompt"]} for r, j in zip(recs, order, strict=True)])


# --------------------------------------------------------------------------------------------- menus


def test_menus_hold_the_ladder_are_capped_and_have_no_duplicates():
    assert _names("none") == ("none@1", "none@2", "none@4", "none@8")
    lead = resolve_plans("lead", ACTIONS)
    assert [p.name for p in lead[:4]] == ["none@1", "none@2", "none@4", "none@8"]
    assert len(lead) == 4 + 5 * 7 and max(p.max_samples for p in lead) == 8  # the module docstring's example
    assert len({p.name for p in lead}) == len(lead)
    full = _names("default", (1, 2, 4, 8, 16))
    assert {p.name for p in default_plans()} <= set(full) and "lead:m=1@1x16" in full
    assert len(default_menu(8)) < len(default_menu(16))
    mine = _names("lead:m=2@1x8,window:w=3@3x2,2")
    assert mine[-2:] == ("lead:m=2@1x8", "window:w=3@3x2,2") and mine[:4] == _names("none")


def test_plan_names_split_where_a_new_rule_starts():
    assert split_plan_names("window:w=3@3x5,1,lead:m=2@1x8,bayes:B=10,alpha=0.3,top=5@1x2,2,4,8") == [
        "window:w=3@3x5,1", "lead:m=2@1x8", "bayes:B=10,alpha=0.3,top=5@1x2,2,4,8"]


@pytest.mark.parametrize(("call", "match"), [
    (lambda: resolve_plans("everything", ACTIONS), "--plans must be one of none, default"),
    (lambda: resolve_plans("lead:m=two@1x4", ACTIONS), "must be a number"),
    (lambda: ladder_columns([parse_plan("none@1")], ACTIONS), "lacks the uniform ladder's none@2"),
    (lambda: PolicyConfig(**SMALL, plans=("none@1", "none@2", "none@4", "none@8", "none@8")), "names none@8 twice"),
    (lambda: PolicyConfig(**SMALL, plans=("none@1", "lead:m=2@1x8")), "lacks the uniform ladder"),
    (lambda: PolicyConfig(**SMALL, plans=_names(), strategy="pass"), "plans vote by majority"),
    (lambda: PolicyConfig(**SMALL, fallback=("fixed_plan", "uniform")), "needs a plan menu"),
    (lambda: PolicyConfig(**SMALL, plans=_names(), plan_costs="guess"), "plan_costs must be one of"),
])
def test_menu_and_config_errors(call, match):
    with pytest.raises(InputError, match=match):
        call()


def test_the_default_chain_follows_the_menu():
    assert PolicyConfig(**SMALL).fallback == ("uniform",)
    assert PolicyConfig(**SMALL, plans=_names()).fallback == ("fixed_plan", "uniform")
    assert PolicyConfig.from_dict(PolicyConfig(**SMALL, plans=_names()).to_dict()).plans == _names()


# --------------------------------------------------------------------------------- plan arrays, oracle


def test_one_wave_plans_are_k_samples_at_once(signal):
    arr = plan_arrays(signal, resolve_plans("none", ACTIONS))
    np.testing.assert_allclose(arr.utility, utilities(signal, list(ACTIONS), "majority"), atol=1e-12)
    assert (arr.samples == np.array(ACTIONS)).all() and (arr.waves == 1).all() and (arr.cost == arr.samples).all()
    legacy = table_arrays(signal, PolicyConfig(**SMALL))  # the policy before plans: prepare + cost_table
    np.testing.assert_array_equal(legacy.cost, cost_table(signal.prompt_tokens, None, ACTIONS, unit="samples"))
    np.testing.assert_allclose(legacy.utility, arr.utility, atol=1e-12)


def test_a_plan_too_large_for_a_short_prompt_is_dominated_and_never_chosen():
    recs = synthetic_records(30, 8, seed=1, noise=0.3)
    for r in recs[::3]:
        r["samples"] = r["samples"][:5]
    table = from_records(recs)
    menu = [parse_plan(n) for n in ("none@1", "none@4", "lead:m=2@1x8")]
    with pytest.raises(InputError, match="--ragged infeasible"):
        plan_arrays(table, menu)
    arr = plan_arrays(table, menu, ragged="infeasible")
    short = table.n_samples < 8
    assert arr.n_ragged == int(short.sum()) and "marked infeasible" in arr.summary()
    np.testing.assert_array_equal(arr.utility[short, 2], arr.utility[short, 1])
    assert (arr.cost[short, 2] == 8).all() and (arr.samples[short, 2] == 8).all()  # none@4's vote at 8 samples
    for b in np.linspace(1.0, 5.0, 9):
        probs = allocate_plans(arr.utility, arr.cost, float(b)).action_probs()
        assert (probs[short, 2] == 0).all()


def lp_value(U, C, budget):
    n, a = U.shape
    res = linprog(-U.ravel(), A_ub=C.ravel()[None] / C.max(), b_ub=[n * budget / C.max()],
                  A_eq=np.kron(np.eye(n), np.ones(a)), b_eq=np.ones(n), bounds=(0, 1), method="highs")
    assert res.status == 0
    return -res.fun / n


@pytest.mark.parametrize("seed", range(4))
def test_the_plan_oracle_is_the_lp_optimum_on_unsorted_columns(seed):
    rng = np.random.default_rng(seed)
    U, C = rng.random((12, 5)), rng.uniform(1, 8, (12, 5))  # every prompt its own cost order
    lo, hi = C.min(axis=1).mean(), C.max(axis=1).mean()
    for b in (lo + 0.3 * (hi - lo), lo + 0.7 * (hi - lo)):
        res = allocate_plans(U, C, b)
        probs = res.action_probs()
        assert probs.sum(axis=1) == pytest.approx(np.ones(12))
        spent = (probs * C).sum(axis=1).mean()
        assert spent == pytest.approx(b, rel=1e-9) if res.allocation.status == 0 else spent < b
        assert (probs * U).sum(axis=1).mean() == pytest.approx(lp_value(U, C, b), rel=1e-9)
        det = allocate_plans(U, C, b, rounding="deterministic").actions
        assert C[np.arange(12), det].mean() <= b + 1e-9


# ------------------------------------------------------------------------------------------ cost head


def test_the_cost_head_learns_which_prompts_stop_early():
    """Easy prompts (x = 0) stop after 2 of up to 10 samples, hard ones (x = 1) after 9; one-wave plans
    cost exactly their k. The head predicts each group, where the plan's mean (5.5) fits neither."""
    rng = np.random.default_rng(0)
    x = (rng.random(400) < 0.5).astype(float)
    X = np.column_stack([x, rng.random(400)])
    S = np.column_stack([np.full(400, 4.0), np.where(x > 0, 9.0, 2.0)])
    head = SampleCostRegressor(n_rounds=30, min_data_in_leaf=5).fit(
        X, S, 2 * S + 0.5, np.array([[4, 1], [10, 10]]), first_wave=np.array([4, 1]), max_samples=np.array([4, 10]),
        paid=0.5)
    s_hat = head.predict_samples(np.array([[0.0, 0.5], [1.0, 0.5]]))
    assert (s_hat[:, 0] == 4).all()  # one wave: no model, exact
    assert s_hat[0, 1] == pytest.approx(2.0, abs=0.3) and s_hat[1, 1] == pytest.approx(9.0, abs=0.3)
    # Ĉ = paid + Ŝ · r with r = mean(C − paid) / mean(S) = 2
    np.testing.assert_allclose(head.predict_costs(np.array([[1.0, 0.5]])), 0.5 + 2 * s_hat[1:], rtol=1e-12)
    back = SampleCostRegressor.from_state(json.loads(json.dumps(head.state())), head.booster_.model_to_string())
    np.testing.assert_array_equal(back.predict_samples(X[:7]), head.predict_samples(X[:7]))


# -------------------------------------------------------------------------------------- fixed-plan rule


def test_fixed_rule_worked_example_and_exact_budget():
    u_bar, c_bar = np.array([0.50, 0.62, 0.60]), np.array([1.0, 3.0, 4.0])
    choice = fixed_plan_at(u_bar, c_bar, 2.0)
    assert (choice.lo, choice.hi, choice.mix) == (0, 1, pytest.approx(0.5))
    np.testing.assert_array_equal(fixed_actions(np.array([0.3, 0.7]), choice), [1, 0])
    u = (np.arange(1000) + 0.5) / 1000  # hashes spread evenly: the share playing hi is q
    for match in ("calibrated", "batch"):
        a = fixed_actions(u, choice, match=match)
        assert c_bar[a].mean() == pytest.approx(2.0, abs=1e-9)
    assert fixed_plan_at(u_bar, c_bar, 0.5).mix == 0 and fixed_plan_at(u_bar, c_bar, 0.5).lo == 0  # clipped


def test_fixed_plan_scores_are_out_of_fold(no_signal):
    arr = plan_arrays(no_signal, resolve_plans("default", ACTIONS))
    n = len(no_signal)
    folds = [(np.arange(n)[np.arange(n) % 2 != j], np.arange(n)[np.arange(n) % 2 == j]) for j in range(2)]
    S = fixed_plan_scores(arr.utility, arr.samples, folds, [2.0, 4.0])
    for bi, b in enumerate((2.0, 4.0)):
        for tr, ho in folds:
            ch = choose_fixed_plan(arr.utility[tr], arr.samples[tr], b)
            np.testing.assert_allclose(S[bi, ho], ch.utility(arr.utility[ho]), atol=1e-12)


# --------------------------------------------------------------------------------------- the policy


@pytest.fixture(scope="module")
def plan_policy(signal):
    return Policy(PolicyConfig(**SMALL, plans=_names())).fit(signal)


def test_decisions_carry_plans_samples_and_waves(plan_policy, signal):
    pol = plan_policy
    assert len(pol.plans) == len(_names()) and pol.actions == tuple(p.max_samples for p in pol.plans)
    for b in (1.5, 3.0, 6.0):
        d = pol.decide(signal.prompts, b)
        assert d.rule in (LEARNED, FIXED_PLAN, UNIFORM)
        assert len(d.plans) == len(signal) and d.plan_names == [pol.plans[a].name for a in d.action_index]
        np.testing.assert_array_equal(d.k, [p.max_samples for p in d.plans])
        assert ((1 <= d.expected_samples) & (d.expected_samples <= d.k + 1e-9)).all()
        assert ((1 <= d.expected_waves) & (d.expected_waves <= d.expected_samples + 1e-9)).all()
        assert d.expected_cost == pytest.approx(d.costs.mean())
    # the learned rule on a table with signal; its out-of-fold realised cost is on budget
    d = pol.decide(signal.prompts, 3.0)
    assert d.rule == LEARNED and d.rule_evidence["tests"][-1]["accepted"]
    cal = pol.learners_[pol.default_learner_].calibration
    assert cal.max_relative_error(within_reach=True) <= 0.02


def test_the_utility_learner_prices_adaptive_plans_per_prompt(plan_policy, signal):
    pol = plan_policy
    member = pol.learners_["utility"].models[0]
    assert member.cost_head_ is not None and member.ks_.shape == (len(pol.plans), 4)
    C_hat = member.predict_costs(pol.features(signal.prompts[:50]), pol.action_costs_)
    adaptive = [j for j, p in enumerate(pol.plans) if p.n_waves > 1]
    assert np.ptp(C_hat[:, adaptive], axis=0).max() > 0.5  # the cost of an adaptive plan differs per prompt
    lad = pol.ladder
    np.testing.assert_allclose(C_hat[:, lad], np.broadcast_to(np.array(ACTIONS, float), (50, 4)))
    mean = Policy(PolicyConfig(**SMALL, plans=_names(), learner="utility", plan_costs="mean")).fit(signal)
    assert mean.learners_["utility"].models[0].cost_head_ is None


def test_without_signal_the_fixed_plan_serves_and_spends_the_budget(no_signal):
    pol = Policy(PolicyConfig(**SMALL, plans=_names())).fit(no_signal)
    d = pol.decide(no_signal.prompts, 3.0)
    assert d.rule == FIXED_PLAN and d.lam is None and d.internal_budget is None and not pol.needs_features(3.0)
    assert len(set(d.plan_names)) <= 2 and "fixed_plan beats uniform" in d.rule_evidence["why"]
    choice = pol.fixed_plan_at(3.0)
    spend = (1 - choice.mix) * pol.sample_action_costs[choice.lo] + choice.mix * pol.sample_action_costs[choice.hi]
    assert spend == pytest.approx(3.0, rel=1e-9)  # exact in expectation over the training prompts
    batch = pol.decide(no_signal.prompts, 3.0, match="batch")
    assert batch.expected_cost == pytest.approx(3.0, abs=8 / len(no_signal))


def test_the_artifact_stores_plans_by_name_and_old_artifacts_load_as_one_wave_plans(plan_policy, signal, tmp_path):
    from isocompute.artifacts import artifact_writer

    plan_policy.save(tmp_path / "p")
    meta = json.loads((tmp_path / "p" / "policy.json").read_text())
    assert meta["plans"] == list(_names()) and len(meta["plan_samples"]) == len(_names())
    back = Policy.load(tmp_path / "p")
    for b in (1.5, 3.0, 6.0):
        d0, d1 = plan_policy.decide(signal.prompts, b), back.decide(signal.prompts, b)
        assert d0.plan_names == d1.plan_names and d0.rule == d1.rule
        np.testing.assert_array_equal(d0.expected_samples, d1.expected_samples)
    # a policy written before plans: integer actions, no plan fields
    old_pol = Policy(PolicyConfig(**SMALL)).fit(signal)
    old_pol.save(tmp_path / "q")
    meta = json.loads((tmp_path / "q" / "policy.json").read_text())
    for key in ("plans", "plan_utility", "plan_samples", "plan_waves"):
        del meta[key]
    del meta["config"]["plans"], meta["config"]["plan_costs"]
    with artifact_writer(tmp_path / "old", kind="policy", schema_version=1, params=meta["config"]) as d:
        for f in (tmp_path / "q").rglob("*"):
            if f.is_file() and f.name != "manifest.json":
                (d / f.relative_to(tmp_path / "q")).parent.mkdir(parents=True, exist_ok=True)
                (d / f.relative_to(tmp_path / "q")).write_bytes(f.read_bytes())
        (d / "policy.json").write_text(json.dumps(meta))
    legacy = Policy.load(tmp_path / "old")
    assert [p.name for p in legacy.plans] == ["none@1", "none@2", "none@4", "none@8"]
    d = legacy.decide(signal.prompts, 3.0)
    np.testing.assert_array_equal(d.expected_samples, d.k)
    assert (d.expected_waves == 1).all()
    np.testing.assert_array_equal(d.k, old_pol.decide(signal.prompts, 3.0).k)


# ----------------------------------------------------------------------------------- cross-validation


def test_cross_validation_over_plans_scores_every_baseline(no_signal):
    from isocompute.evaluation.evaluate import METHODS, cross_validate, summarise

    cfg = PolicyConfig(**SMALL, plans=_names())
    arr = table_arrays(no_signal, cfg)
    plans, cols = baseline_plans(resolve_plans("default", ACTIONS), ACTIONS)
    b = plan_arrays(no_signal, plans)
    base = FixedBaselines(plans, b.utility, b.cost, b.waves, cols)
    ev = cross_validate(no_signal.prompts, arr.utility, arr.cost, cfg, [2.0, 4.0], folds=3, seeds=(0,),
                        samples=arr.samples, waves=arr.waves, baselines=base)
    m = {k: j for j, k in enumerate(METHODS)}
    for name in ("fixed_plan", "fixed_lead", "fixed_window", "fixed_beta", "fixed_dirichlet", "fixed_bayes",
                 "fixed_best"):
        assert not np.isnan(ev.utility[0, m[name]]).any()
    assert ev.waves[0, m["uniform"]].max() == 1 and ev.waves[0, m["fixed_lead"]].max() > 1
    for bi, bud in enumerate((2.0, 4.0)):
        assert ev.cost[0, m["uniform"], bi].mean() == pytest.approx(bud)
        assert ev.cost[0, m["oracle"], bi].mean() <= bud + 1e-9
    s = summarise(ev, n_boot=200)
    for e in s["budgets"]:
        assert set(e["gain_vs_fixed"]) == {"fixed_plan", "fixed_best"}
        assert e["methods"]["fixed_best"]["waves"] >= 1
        assert e["methods"]["learned"]["accuracy"] >= e["methods"]["uniform"]["accuracy"]  # never worse
