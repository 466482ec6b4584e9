"""Request pricing (app/pricing.py) and the serving-policy contract (app/serving_policy.py): worked
examples, unit round trips, the error table, and the contract over a real fitted Policy."""

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


def test_an_object_implementing_the_contract_is_used_as_it_is():
    from app_fakes import FakePolicy

    fake = FakePolicy()
    assert as_serving_policy(fake) is fake


def test_an_object_that_is_no_policy_is_refused_with_what_is_missing():
    with pytest.raises(InputError, match=r"neither a fitted isocompute Policy.*nor a ServingPolicy \(no budget_range"):
        as_serving_policy(object())
