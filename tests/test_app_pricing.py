"""Request pricing (app/pricing.py) and the serving-policy contract (app/serving_policy.py): worked
examples, unit round trips (samples, tokens, FLOPs), budgets written as multiples ("4x"), latency budgets,
the error table, and the contract over real fitted Policies (a samples one, and a tokens one with latency
budgets)."""

from __future__ import annotations

import pytest

from isocompute.app.accounting.pricing import budget_unit, price_request
from isocompute.app.serving_policy import FittedPolicy, ServingPolicy, as_serving_policy
from isocompute.app.settings import Settings
from isocompute.errors import BudgetError, InputError

LIMITS = Settings(max_samples=64, max_waves=32, max_budget=64.0, default_budget=4.0)


def price(budget=4.0, unit=None, **kw):
    args = {"caller": "anonymous", "policy_range": (1.0, 16.0), "policy_unit": "samples", "sample_flops": None,
            "limits": LIMITS, "max_samples": None, "temperature": 0.7, "max_tokens": 256} | kw
    return price_request(budget, unit, **args)


def test_worked_example_of_the_module_docstring():
    plan = price(2e9, "flops", sample_flops=5e8)
    assert (plan.samples, plan.policy_budget, plan.cap) == (4.0, 4.0, 64)
    assert plan.key == ("anonymous", 2e9, "flops", 64, 32) and plan.label == "anonymous:2e+09flops"
    capped = price(2e9, "flops", sample_flops=5e8, max_samples=2)
    assert capped.key == ("anonymous", 2e9, "flops", 2, 32) and capped.label == "anonymous:2e+09flops:max2"
    waves = price(2e9, "flops", sample_flops=5e8, max_waves=3)
    assert waves.key == ("anonymous", 2e9, "flops", 64, 3) and waves.label == "anonymous:2e+09flops:waves3"


def test_samples_to_a_flops_policy_and_back():
    plan = price(3.0, "samples", policy_unit="flops", policy_range=(1e8, 1e10), sample_flops=1e9)
    assert (plan.samples, plan.policy_budget) == (3.0, 3e9)
    assert plan.in_request_unit(2e9, "flops") == pytest.approx(2.0)  # a cost in the policy's unit, in samples
    assert plan.charge(0.5e9, flops=7.0) == pytest.approx(0.5)  # samples budget: the declared cost, converted


def test_a_flop_budget_is_charged_measured_flops_when_known():
    plan = price(2e9, "flops", sample_flops=5e8)
    assert plan.charge(0.25, flops=1.5e8) == 1.5e8
    assert plan.charge(0.25, flops=None) == pytest.approx(0.25 * 5e8)  # declared 0.25 samples, in FLOPs


def test_defaults_and_units():
    assert budget_unit(None, None, "flops") == "flops"  # no budget: the default's unit
    assert budget_unit(4.0, None, "flops") == "samples"  # a budget without a unit is in samples
    plan = price(None)
    assert plan.budget == 4.0 and plan.unit == "samples" and plan.sample_flops is None


@pytest.mark.parametrize(
    ("kw", "cap"),
    [({}, 64), ({"max_samples": 3}, 3), ({"max_samples": 100}, 64), ({"temperature": 0.0}, 1),
     ({"temperature": 0.0, "max_samples": 8}, 1)],
)
def test_the_cap_on_samples(kw, cap):
    assert price(**kw).cap == cap


@pytest.mark.parametrize(
    ("kw", "wave_cap"),
    [({}, 32), ({"max_waves": 3}, 3), ({"max_waves": 100}, 32), ({"temperature": 0.0, "max_waves": 8}, 1)],
)
def test_the_cap_on_waves(kw, wave_cap):
    assert price(**kw).wave_cap == wave_cap


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"budget": 1e6, "unit": "flops"}, "needs the model's config"),
        ({"budget": 100.0}, "exceeds this server's max_budget 64"),
        ({"budget": 20.0}, r"outside the policy's calibrated range \[1, 16\] samples"),
        ({"budget": 0.5}, "outside the policy's calibrated range"),
        ({"budget": 1e12, "unit": "flops", "sample_flops": 1e9}, r"≈ 1e\+03 samples of up to 256 tokens"),
    ],
)
def test_pricing_errors(args, match):
    with pytest.raises(BudgetError, match=match):
        price(**args)


def test_a_multiple_is_tokens_of_the_policys_mean_sample_worked_example():
    plan = price("4x", None, policy_unit="tokens", policy_range=(50.0, 800.0), tokens_per_sample=50.0,
                 latency_budget=1.5, latency_range=(1.0, 2.0))
    assert (plan.budget, plan.unit, plan.written, plan.samples, plan.policy_budget) == (200.0, "tokens", "4x", 4.0, 200.0)
    assert plan.key == ("anonymous", 200.0, "tokens", 64, 32, 1.5) and plan.label == "anonymous:200tokens:lat1.5"
    assert plan.latency_budget == 1.5 and plan.sample_flops is None and plan.sample_tokens == 50.0
    same = price(200.0, "tokens", policy_unit="tokens", policy_range=(50.0, 800.0), tokens_per_sample=50.0)
    assert same.key == ("anonymous", 200.0, "tokens", 64, 32) and same.written is None  # no latency: 5-tuple
    assert price(" 2.5X ", None, policy_unit="tokens", policy_range=(50.0, 800.0),
                 tokens_per_sample=50.0).budget == 125.0


def test_samples_and_tokens_convert_through_one_samples_tokens():
    plan = price(3.0, None, policy_unit="tokens", policy_range=(50.0, 800.0), tokens_per_sample=50.0)
    assert (plan.unit, plan.samples, plan.policy_budget) == ("samples", 3.0, 150.0)  # a number is in samples
    assert plan.in_request_unit(100.0, "tokens") == pytest.approx(2.0)
    assert plan.charge(25.0, flops=None, tokens=7) == pytest.approx(0.5)  # samples budget: declared, converted
    tok = price(200.0, "tokens", policy_unit="tokens", policy_range=(50.0, 800.0), tokens_per_sample=50.0)
    assert tok.charge(25.0, flops=1e9, tokens=7) == 7.0  # a tokens budget pays the tokens generated
    assert tok.charge(25.0, flops=None) == 25.0
    # a samples policy that knows no mean sample: one sample is max_tokens tokens (an overestimate)
    assert price(512.0, "tokens").samples == pytest.approx(2.0)
    assert price(512.0, "tokens", tokens_per_sample=128.0).policy_budget == pytest.approx(4.0)


def test_flops_to_a_tokens_policy():
    plan = price(2e9, "flops", policy_unit="tokens", policy_range=(50.0, 800.0), tokens_per_sample=50.0,
                 sample_flops=5e8)
    assert plan.samples == 4.0 and plan.policy_budget == pytest.approx(200.0)
    assert plan.in_request_unit(100.0, "tokens") == pytest.approx(1e9)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"budget": "4x"}, r"'4x' \(a multiple of one sample's mean tokens\) is for a policy whose cost unit is "
                           r"tokens; this policy's budgets are in samples"),
        ({"budget": "4x", "unit": "flops", "policy_unit": "tokens", "tokens_per_sample": 50.0},
         "so it is in tokens; drop budget_unit 'flops'"),
        ({"budget": "4x", "policy_unit": "tokens", "policy_range": (1.0, 1e4)},
         "does not record one sample's mean tokens"),
        ({"budget": "40x", "policy_unit": "tokens", "tokens_per_sample": 50.0, "policy_range": (50.0, 800.0)},
         r"budget 40x = 2000 tokens is outside the policy's calibrated range \[50, 800\] tokens"),
        ({"budget": "100x", "policy_unit": "tokens", "tokens_per_sample": 50.0, "policy_range": (50.0, 1e9)},
         "exceeds this server's max_budget 64 samples"),
    ],
)
def test_multiple_errors_say_what_to_send(args, match):
    with pytest.raises(BudgetError, match=match):
        price(**args)


def test_latency_budget_is_checked_against_the_policys_range():
    with pytest.raises(BudgetError, match="fitted without latency budgets; drop latency_budget") as e:
        price(latency_budget=1.5)
    assert e.value.param == "latency_budget"
    with pytest.raises(BudgetError, match=r"latency budget 3 is outside the range \[1, 2\] mean sample lengths") as e:
        price(latency_budget=3.0, latency_range=(1.0, 2.0))
    assert e.value.param == "latency_budget"
    plan = price(latency_budget=2.0, latency_range=(1.0, 2.0))
    assert plan.latency_budget == 2.0 and plan.key[-1] == 2.0 and plan.label.endswith(":lat2")
    assert price().latency_budget is None


# -------------------------------------------------------------------------------------------- contract


@pytest.fixture(scope="module")
def fitted():
    from isocompute.policy.policy import Policy
    from isocompute.policy.synthetic import synthetic_records
    from isocompute.solver.outcomes import from_records

    return Policy(learner="utility", n_rounds=5, n_components=2, calibration_folds=2).fit(
        from_records(synthetic_records(120, 16, seed=0)))


def test_a_fitted_policy_serves_through_the_contract(fitted):
    sp = as_serving_policy(fitted)
    assert isinstance(sp, FittedPolicy) and isinstance(sp, ServingPolicy)
    assert sp.budget_range == tuple(fitted.budget_range) and sp.cost_unit == fitted.config.cost_unit
    assert sp.probe is None and sp.feature_extras == () and sp.feature_cost == 0.0 and sp.sample_flops is None
    d, ref = sp.decide(["What is 2 + 3?"], 4.0), fitted.decide(["What is 2 + 3?"], 4.0)
    assert d.k.tolist() == ref.k.tolist() and d.expected_cost == ref.expected_cost
    assert sp.models == ()  # a single-model policy: its decisions' plans run, model_actions is not read


def test_a_multi_model_policy_gets_its_models_and_the_pinned_model(fitted):
    class TwoModels:  # a fitted Policy with several models, as issue 15's policy will be
        models = ("a", "b")

        def __getattr__(self, name):
            return getattr(fitted, name)

        def decide(self, texts, budget, *, probe=None, model=None):
            self.pinned = model
            return fitted.decide(texts, budget)

    inner = TwoModels()
    sp = as_serving_policy(inner)
    assert isinstance(sp, FittedPolicy) and sp.models == ("a", "b")
    sp.decide(["What is 2 + 3?"], 4.0, model="b")
    assert inner.pinned == "b"
    sp.decide(["What is 2 + 3?"], 4.0)
    assert inner.pinned is None


def test_a_samples_policy_serves_no_latency_budget_but_knows_its_mean_sample(fitted):
    sp = as_serving_policy(fitted)
    assert sp.latency_range is None and sp.tokens_per_sample == pytest.approx(fitted.tokens_per_sample_)


@pytest.fixture(scope="module")
def tokens_fitted():
    from app_fakes import fit_tokens_policy

    return fit_tokens_policy()


def test_a_tokens_policy_with_latency_budgets_serves_through_the_contract(tokens_fitted):
    p = tokens_fitted
    sp = as_serving_policy(p)
    assert sp.cost_unit == "tokens" and sp.tokens_per_sample == p.tokens_per_sample_
    assert sp.latency_range == (1.0, 2.0) == p.latency_.range
    texts, b = ["What is 12 + 7 * 3?", "What is 2 + 2?"], 4 * p.tokens_per_sample_
    d, ref = sp.decide(texts, b, latency_budget=1.0), p.decide(texts, b, latency_budget=1.0)
    assert d.action_index.tolist() == ref.action_index.tolist() and d.latency_budget == 1.0
    assert d.expected_latency.tolist() == ref.expected_latency.tolist()
    plain = sp.decide(texts, b)
    assert plain.action_index.tolist() == p.decide(texts, b).action_index.tolist() and plain.latency_budget is None
    assert plain.action_index.tolist() != d.action_index.tolist()  # the latency budget changes the plans here
    # under a latency budget that level's chain says whether the learned rule (which reads features) serves
    assert sp.needs_features(b, latency_budget=1.0) is (d.rule == "learned")
    assert sp.needs_features(b, latency_budget=1.0) is (p.latency_.chains[p.latency_.level(1.0)].at(b).rule == "learned")


def test_the_latency_budget_reaches_decide_only_when_sent(tokens_fitted):
    class Spy:
        def __getattr__(self, name):
            return getattr(tokens_fitted, name)

        def decide(self, texts, budget, **kw):
            self.kw = kw
            return tokens_fitted.decide(texts, budget, **kw)

    spy = Spy()
    sp = as_serving_policy(spy)
    sp.decide(["What is 2 + 2?"], 100.0)
    assert spy.kw == {}
    sp.decide(["What is 2 + 2?"], 100.0, latency_budget=1.5)
    assert spy.kw == {"latency_budget": 1.5}


def test_an_object_implementing_the_contract_is_used_as_it_is():
    from app_fakes import FakePolicy

    fake = FakePolicy()
    assert as_serving_policy(fake) is fake


def test_an_object_that_is_no_policy_is_refused_with_what_is_missing():
    with pytest.raises(InputError, match=r"neither a fitted isocompute Policy.*nor a ServingPolicy \(no budget_range"):
        as_serving_policy(object())
