"""The policy: learners, Policy.fit/decide/save/load, budget errors, bad input. Real LightGBM throughout."""

import json
import shutil

import numpy as np
import pytest

from isocompute.errors import ArtifactError, BudgetError, InputError
from isocompute.policy.learn.learners import OracleClassifier, UtilityRegressor, price, prompt_uniforms
from isocompute.policy.policy import Decision, Policy, PolicyConfig
from isocompute.policy.synthetic import synthetic_records
from isocompute.solver.allocate import allocate
from isocompute.solver.estimators import utilities
from isocompute.solver.outcomes import from_records

ACTIONS = (1, 2, 4, 8)
# fallback=(): these tests exercise the learned rule itself (the never-worse chain: test_policy_fallback.py)
SMALL = dict(actions=ACTIONS, budget_range=(1.0, 8.0), n_rounds=20, n_budget_grid=17, calibration_folds=2,
             n_components=4, fallback=())


@pytest.fixture(scope="module")
def train_table():
    return from_records(synthetic_records(200, 8, seed=0, noise=0.3))


@pytest.fixture(scope="module")
def test_table():
    return from_records(synthetic_records(400, 8, seed=1, noise=0.3), source="test")


@pytest.fixture(scope="module")
def policy(train_table):
    return Policy(PolicyConfig(**SMALL)).fit(train_table)


# ---------------------------------------------------------------------------------------------- learners


def test_price_worked_example():
    U_hat = np.array([[0.50, 0.62, 0.70]])
    c = np.array([1.0, 2.0, 4.0])
    u = np.array([0.5])  # the jitter factor is exactly 1 at u = ½
    assert [int(price(U_hat, lam, c, u)[0]) for lam in (0.05, 0.1, 0.2)] == [1, 1, 0]
    assert int(price(U_hat, 0.0, c, u)[0]) == 2
    # ties go to the cheaper action
    assert int(price(np.array([[0.5, 0.5]]), 0.0, np.array([1.0, 2.0]), u)[0]) == 0


def test_price_cost_is_monotone_in_lambda():
    rng = np.random.default_rng(0)
    U_hat = np.sort(rng.random((300, 4)), axis=1)
    c = np.array([1.0, 2.0, 4.0, 8.0])
    u = rng.random(300)
    costs = [c[price(U_hat, lam, c, u)].mean() for lam in np.linspace(-0.5, 0.5, 101)]
    assert np.all(np.diff(costs) <= 1e-12)


def test_prompt_uniforms_deterministic_and_uniform():
    prompts = [f"What is {i} + {2 * i}?" for i in range(4000)]
    u = prompt_uniforms(prompts)
    np.testing.assert_array_equal(u, prompt_uniforms(prompts))
    assert u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.02 and abs(np.mean(u < 0.25) - 0.25) < 0.03
    assert not np.allclose(u, prompt_uniforms(prompts, seed=11))


def test_classifier_labels_are_the_oracle(train_table):
    U = utilities(train_table, ACTIONS, "majority")
    C = np.broadcast_to(np.asarray(ACTIONS, float), U.shape)
    grid = np.array([1.0, 2.5, 6.0])
    labels = OracleClassifier().oracle_labels(U, C, grid)
    for g, b in enumerate(grid):
        np.testing.assert_array_equal(labels[g], allocate(U, C, b, rounding="deterministic").actions)


def test_classifier_imitates_a_predictable_oracle():
    # Noise 0 and many samples: difficulty is a function of the text, so the oracle is learnable.
    table = from_records(synthetic_records(600, 16, seed=3, noise=0.0))
    U = utilities(table, ACTIONS, "majority")
    C = np.broadcast_to(np.asarray(ACTIONS, float), U.shape)
    from isocompute.policy.features.prompt import PromptFeatures

    X = PromptFeatures(n_components=0).fit(table.prompts).transform(table.prompts)
    clf = OracleClassifier(n_rounds=40, n_budget_grid=17).fit(X[:400], U[:400], C[:400], (1.0, 8.0))
    oracle = allocate(U[400:], C[400:], 4.0, rounding="deterministic").actions
    pred = clf.predict_proba(X[400:], 4.0).argmax(axis=1)
    majority = np.mean(oracle == np.bincount(oracle).argmax())
    assert np.mean(pred == oracle) > 0.7 and np.mean(pred == oracle) > majority + 0.15


def test_utility_regressor_predicts_in_unit_interval(train_table):
    U = utilities(train_table, ACTIONS, "majority")
    from isocompute.policy.features.prompt import PromptFeatures

    X = PromptFeatures(n_components=0).fit(train_table.prompts).transform(train_table.prompts)
    reg = UtilityRegressor(n_rounds=30).fit(X, U, np.asarray(ACTIONS))
    Uh = reg.predict_utilities(X)
    assert Uh.shape == U.shape and (Uh > 0).all() and (Uh < 1).all()
    assert np.corrcoef(Uh.ravel(), U.ravel())[0, 1] > 0.6


# ---------------------------------------------------------------------------------------------- policy


@pytest.mark.slow
def test_decide_shapes_and_purity(policy, test_table):
    prompts = test_table.prompts[:50]
    d = policy.decide(prompts, 4.0)
    assert isinstance(d, Decision) and d.k.shape == (50,) and d.action_index.shape == (50,)
    assert set(d.k.tolist()) <= set(ACTIONS)
    np.testing.assert_array_equal(d.k, np.asarray(ACTIONS)[d.action_index])
    assert d.expected_cost == pytest.approx(d.k.mean()) and d.cost_unit == "samples"
    assert (d.lam is None) != (d.internal_budget is None)
    again = policy.decide(prompts, 4.0)
    np.testing.assert_array_equal(again.k, d.k)
    singles = [int(policy.decide([p], 4.0).k[0]) for p in prompts[:10]]
    assert singles == d.k[:10].tolist()  # a prompt's decision does not depend on its batch
    assert policy.decide([], 4.0).k.shape == (0,)


@pytest.mark.slow
def test_both_learners_fitted_and_default_recorded(policy):
    assert set(policy.learners_) == {"classifier", "utility"}
    assert policy.default_learner_ in policy.learners_
    sel = policy.selection_
    assert set(sel["scores"]) == {"classifier", "utility"} and policy.default_learner_ in sel["why"]
    c, u = (sel["scores"][k]["heldout_accuracy"] for k in ("classifier", "utility"))
    assert policy.default_learner_ == ("utility" if u > c else "classifier")


@pytest.mark.slow
@pytest.mark.parametrize("learner", ["classifier", "utility"])
def test_calibration_meets_the_budget_out_of_fold(policy, learner):
    cal = policy.learners_[learner].calibration
    np.testing.assert_allclose(cal.targets, cal.budgets)  # calibrate_to="budget"
    assert cal.max_relative_error(within_reach=True) < 0.03  # measured on the cross-fitted members
    knob = cal.values
    assert np.all(np.diff(knob) >= 0) if cal.knob == "internal_budget" else np.all(np.diff(knob) <= 0)
    if learner == "utility":  # negative prices let it spend any budget, useful or not
        assert cal.max_relative_error() < 0.03


def test_calibrate_to_oracle_targets_the_oracle_spend():
    table = from_records(synthetic_records(60, 8, seed=5))
    pol = Policy(PolicyConfig(**dict(SMALL, learner="utility", n_rounds=5, calibrate_to="oracle"))).fit(table)
    cal = pol.learners_["utility"].calibration
    U = utilities(table, ACTIONS, "majority")
    C = np.broadcast_to(np.asarray(ACTIONS, float), U.shape)
    for b, t in zip(cal.budgets[::16], cal.targets[::16], strict=True):
        assert t == pytest.approx(allocate(U, C, b).mean_cost) and t <= b + 1e-9
    assert cal.targets[-1] < cal.budgets[-1]  # at budget 8 extra samples buy nothing on some prompts


@pytest.mark.slow
@pytest.mark.parametrize("learner", ["classifier", "utility"])
def test_heldout_cost_tracks_budget_and_beats_uniform(policy, test_table, learner):
    U = utilities(test_table, ACTIONS, "majority")
    rows = np.arange(len(test_table))
    cal = policy.learners_[learner].calibration
    for b, uniform in [(2.0, U[:, 1].mean()), (4.0, U[:, 2].mean())]:
        d = policy.decide(test_table.prompts, b, learner=learner)
        # New prompts spend what the calibration measured out of fold (loosely: 200 training prompts).
        assert d.expected_cost == pytest.approx(cal.expected_cost(b), rel=0.15)
        assert d.expected_cost <= b * 1.05
        assert U[rows, d.action_index].mean() > uniform


@pytest.mark.slow
@pytest.mark.parametrize("learner", ["classifier", "utility"])
def test_batch_match_spends_the_budget_on_the_batch(policy, test_table, learner):
    """match="batch" solves the knob on the batch: mean cost within one prompt's largest step of B
    (actions 1..16 → 8 / N), where the calibrated per-prompt rule is only as close as the batch's luck."""
    n = len(test_table)
    step = np.diff(np.asarray(ACTIONS, float)).max() / n
    for b in (1.5, 2.0, 3.0, 4.0, 6.0):
        d = policy.decide(test_table.prompts, b, learner=learner, match="batch")
        assert d.match == "batch"
        if learner == "classifier" and b > policy.learners_[learner].calibration.realised.max():
            continue  # beyond what the classifier ever spends: it under-spends by design
        assert abs(d.expected_cost - b) <= step + 1e-9, (b, d.expected_cost)
    # one prompt's decision in a batch depends on the batch; alone it is a batch of one
    assert policy.decide(test_table.prompts[:1], 4.0, learner=learner, match="batch").k.shape == (1,)
    assert policy.decide([], 4.0, learner=learner, match="batch").k.shape == (0,)
    with pytest.raises(InputError, match="match must be"):
        policy.decide(test_table.prompts[:3], 4.0, learner=learner, match="stream")


@pytest.mark.slow
def test_utility_learner_spend_is_monotone_per_prompt(policy, test_table):
    ks = np.array([policy.decide(test_table.prompts[:100], b, learner="utility").k for b in (1, 1.5, 2, 3, 4, 6, 8)])
    assert np.all(np.diff(ks, axis=0) >= 0)


@pytest.mark.slow
def test_save_load_roundtrip(policy, test_table, tmp_path):
    out = policy.save(tmp_path / "pol", inputs={"outcomes": "abc"})
    back = Policy.load(out)
    for learner in ("classifier", "utility"):
        for b in (1.0, 3.3, 8.0):
            np.testing.assert_array_equal(back.decide(test_table.prompts, b, learner=learner).k,
                                          policy.decide(test_table.prompts, b, learner=learner).k)
    assert back.default_learner_ == policy.default_learner_ and back.config == policy.config
    files = json.loads((out / "manifest.json").read_text())["files"]
    assert {"policy.json", "features.json", "features_svd.npz", "classifier/model_0.txt",
            "utility/state.json"} <= set(files)
    assert not any(name.endswith(".pkl") for name in files)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("tamper", "match"),
    [
        (lambda d: (d / "classifier" / "model_0.txt").write_text("tree\n"), "checksum of classifier/model_0.txt"),
        (lambda d: _edit_manifest(d, schema_version=2), "schema version 2"),
        (lambda d: _edit_manifest(d, kind="report"), "expected 'policy'"),
        (lambda d: (d / "policy.json").unlink(), "policy.json listed in the manifest is missing"),
    ],
)
def test_load_refuses_tampered_or_foreign_artifacts(policy, tmp_path, tamper, match):
    out = policy.save(tmp_path / "pol")
    tamper(out)
    with pytest.raises(ArtifactError, match=match):
        Policy.load(out)


def _edit_manifest(d, **changes):
    m = json.loads((d / "manifest.json").read_text())
    m.update(changes)
    (d / "manifest.json").write_text(json.dumps(m))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("budget", "match"),
    [(0.5, r"outside the range \[1, 8\]"), (9, r"outside the range \[1, 8\]"), (float("nan"), "outside"),
     ("four", "must be a number")],
)
def test_budget_outside_trained_range(policy, budget, match):
    with pytest.raises(BudgetError, match=match):
        policy.decide(["What is 1 + 1?"], budget)


@pytest.mark.slow
def test_failed_save_leaves_nothing_and_keeps_old(policy, tmp_path, monkeypatch):
    out = policy.save(tmp_path / "pol")
    before = (out / "manifest.json").read_text()

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(policy.features_, "save", boom)
    with pytest.raises(RuntimeError):
        policy.save(tmp_path / "pol")
    assert (out / "manifest.json").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pol"]
    shutil.rmtree(out)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(actions=(1,)), "at least two strictly increasing"),
        (dict(actions=(2, 1, 4)), "strictly increasing"),
        (dict(actions=(0, 1)), "k ≥ 1"),
        (dict(actions=(1, 1, 2)), "strictly increasing"),
        (dict(learner="forest"), "unknown learner"),
        (dict(strategy="vote"), "unknown strategy"),
        (dict(cost_unit="dollars"), "unknown cost unit"),
        (dict(budget_range=(8.0, 1.0)), "lo < hi"),
        (dict(calibration_folds=1), "calibration_folds"),
        (dict(calibrate_to="everything"), "calibrate_to"),
    ],
)
def test_config_errors(kwargs, match):
    with pytest.raises(InputError, match=match):
        PolicyConfig(**kwargs)


@pytest.mark.parametrize(
    ("n_prompts", "config", "error", "match"),
    [
        (40, dict(SMALL, actions=(1, 2, 4, 16)), InputError, "infeasible"),  # k = 16 > 8 samples per prompt
        (6, SMALL, InputError, "needs at least 8 prompts"),
        (40, dict(SMALL, budget_range=(1.0, 12.0)), BudgetError, r"outside what the actions"),
    ],
)
def test_fit_errors(n_prompts, config, error, match):
    table = from_records(synthetic_records(n_prompts, 8, seed=0))
    with pytest.raises(error, match=match):
        Policy(PolicyConfig(**config)).fit(table)


def test_decide_before_fit_and_unknown_learner(policy_small_single):
    with pytest.raises(InputError, match="not fitted"):
        Policy(PolicyConfig(**SMALL)).decide(["x"], 2.0)
    with pytest.raises(InputError, match="not in this policy"):
        policy_small_single.decide(["x"], 2.0, learner="utility")


@pytest.fixture(scope="module")
def policy_small_single():
    table = from_records(synthetic_records(40, 8, seed=5))
    return Policy(PolicyConfig(**dict(SMALL, learner="classifier", n_rounds=5))).fit(table)


@pytest.mark.slow
def test_flops_cost_unit(train_table, test_table):
    from isocompute.flops import ModelFlops
    from isocompute.solver.costs import cost_table

    model = ModelFlops(body_params=73_728, head_params=8_192, n_layers=2, d_attn=96, n_params=90_432)
    C = cost_table(train_table.prompt_tokens, train_table.mean_completion_tokens, ACTIONS, unit="flops", model=model)
    lo, hi = C[:, 0].mean(), C[:, -1].mean()
    pol = Policy(PolicyConfig(**dict(SMALL, cost_unit="flops", budget_range=(lo, hi)))).fit(
        train_table, model_flops=model)
    np.testing.assert_allclose(pol.action_costs_, C.mean(axis=0))
    b = lo + 0.3 * (hi - lo)
    d = pol.decide(test_table.prompts, b)
    assert d.cost_unit == "flops" and d.expected_cost == pytest.approx(pol.action_costs_[d.action_index].mean())
    Ct = cost_table(test_table.prompt_tokens, test_table.mean_completion_tokens, ACTIONS, unit="flops", model=model)
    assert Ct[np.arange(len(test_table)), d.action_index].mean() == pytest.approx(b, rel=0.2)
    with pytest.raises(BudgetError, match="flops"):
        pol.decide(["x"], hi * 2)
