"""fit_policy (the library behind `isocompute fit`): default budget range, errors; the probe cache."""

import json

import numpy as np
import pytest

from isocompute.engines.probe import ProbeResult
from isocompute.engines.probe_cache import load_probe_cache, probe_cache_files, probe_key
from isocompute.errors import InputError
from isocompute.policy.config import PolicyConfig, ProbeSpec
from isocompute.policy.fitting import default_budget_range, fit_policy
from isocompute.policy.synthetic import synthetic_records
from isocompute.solver.outcomes import from_records

SMALL = dict(actions=(1, 2, 4, 8, 16), n_rounds=10, n_budget_grid=9, calibration_folds=2, n_components=4)


@pytest.fixture(scope="module")
def table():
    return from_records(synthetic_records(60, 16, seed=3, noise=0.3))


def test_default_budget_range_worked_example(table):
    """Actions 1…16 in samples with a probe of 0.4321 samples: [1.4321, 16.4321] rounded inwards to 4
    significant digits of the upper end (step 0.01) → [1.44, 16.43]."""
    cfg = PolicyConfig(**SMALL, probe=ProbeSpec(cost=0.4321))
    assert default_budget_range(table, cfg) == (1.44, 16.43)
    assert default_budget_range(table, PolicyConfig(**SMALL)) == (1.0, 16.0)


def test_fit_policy_serves_what_the_actions_can_spend(table):
    pol = fit_policy(table, PolicyConfig(**SMALL, budget_range=(2.0, 4.0)), feasible_budgets=True)
    assert pol.config.budget_range == (1.0, 16.0)
    pol = fit_policy(table, PolicyConfig(**SMALL, budget_range=(2.0, 4.0)))
    assert pol.config.budget_range == (2.0, 4.0)
    assert pol.decide(table.prompts, 3.0).k.shape == (len(table),)


def test_fit_policy_needs_the_table_model_to_price_extras_in_samples(table, monkeypatch):
    import isocompute.policy.config as config

    monkeypatch.setattr(config.importlib.util, "find_spec", lambda name: object())  # no encoder is run
    with pytest.raises(InputError, match="needs the table's model.*--feature-cost"):
        fit_policy(table, PolicyConfig(**SMALL, feature_extras=("minilm",)))


def test_probe_cache_answers_only_its_own_key(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"hidden_size": 8}))
    prompts = ["a", "b", "c"]
    key = probe_key(prompts, model, 8, "plain")
    res = ProbeResult(np.array([0.1, 0.2, 0.3]), np.array([3, 4, 5]), np.array([8, 2, 8]), "exact")
    for name, data in probe_cache_files(res, key, model).items():
        (tmp_path / name).write_bytes(data)
    got = load_probe_cache(tmp_path, key)
    assert got is not None and np.array_equal(got.values, res.values) and got.method == "exact"
    assert np.array_equal(got.completion_tokens, res.completion_tokens)
    assert load_probe_cache(tmp_path, probe_key(prompts, model, 4, "plain")) is None  # other token count
    assert load_probe_cache(tmp_path, probe_key(["a", "b", "d"], model, 8, "plain")) is None  # other prompts
    (model / "config.json").write_text(json.dumps({"hidden_size": 16}))
    assert load_probe_cache(tmp_path, probe_key(prompts, model, 8, "plain")) is None  # other model
    assert load_probe_cache(tmp_path / "absent", key) is None
