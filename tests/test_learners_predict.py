"""learners._predict calls LightGBM's C predictor directly: same numbers as Booster.predict, bit for bit."""

import numpy as np
import pytest

from isocompute.policy.learners import (
    OracleClassifier,
    UtilityRegressor,
    _booster_from_string,
    _predict,
    price,
)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 6))
    z = X[:, 0] - 0.5 * X[:, 1]
    U = np.clip(np.stack([1 / (1 + np.exp(-(z + k))) for k in (0.0, 0.5, 1.0)], axis=1), 0, 1)
    C = np.tile([1.0, 2.0, 4.0], (120, 1))
    return X, U, C


def _boosters(model):
    yield model.booster_
    yield _booster_from_string(model.booster_.model_to_string())  # as a loaded artifact has it


def test_utility_regressor_predictions_equal_booster_predict(data):
    X, U, _ = data
    m = UtilityRegressor(n_rounds=8, min_data_in_leaf=5).fit(X, U, np.array([1, 2, 4]))
    Xs = np.column_stack([np.repeat(X, 3, axis=0), np.tile(m.ks_, len(X))])
    for b in _boosters(m):
        ref = b.predict(Xs, num_threads=1)
        assert np.array_equal(_predict(b, Xs), ref)
        assert np.array_equal(_predict(b, Xs[:3]), ref[:3])  # one prompt's rows
        assert np.array_equal(_predict(b, np.asfortranarray(Xs[::2])), ref[::2])  # any layout in
    assert np.array_equal(m.predict_utilities(X), ref.reshape(len(X), 3))
    u = np.linspace(0, 1, len(X), endpoint=False)
    assert np.array_equal(m.predict(X, 0.05, np.array([1.0, 2.0, 4.0]), u),
                          price(ref.reshape(len(X), 3), 0.05, np.array([1.0, 2.0, 4.0]), u))


def test_classifier_probabilities_equal_booster_predict(data):
    X, U, C = data
    m = OracleClassifier(n_rounds=6, min_data_in_leaf=5, n_budget_grid=9).fit(X, U, C, (1.0, 4.0))
    Xb = np.column_stack([X, np.full(len(X), 2.0)])
    for b in _boosters(m):
        ref = b.predict(Xb, num_threads=1)
        assert ref.shape == (len(X), 3)
        assert np.array_equal(_predict(b, Xb, 3), ref.ravel())
    assert np.array_equal(m.predict_proba(X, 2.0), ref)


def test_empty_batch(data):
    X, U, _ = data
    m = UtilityRegressor(n_rounds=2, min_data_in_leaf=5).fit(X, U, np.array([1, 2, 4]))
    assert _predict(m.booster_, np.zeros((0, 7))).shape == (0,)
    assert m.predict_utilities(np.zeros((0, 6))).shape == (0, 3)


def test_wrong_feature_count_is_refused(data):
    from lightgbm.basic import LightGBMError

    X, U, _ = data
    m = UtilityRegressor(n_rounds=2, min_data_in_leaf=5).fit(X, U, np.array([1, 2, 4]))
    with pytest.raises(LightGBMError, match="number of features"):
        _predict(m.booster_, np.zeros((2, 3)))
