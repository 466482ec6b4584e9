"""LightGBM prediction: the fast path equals Booster.predict bit for bit, and a fast path that disagrees
(or breaks) is caught when the model is built or loaded, with a warning, and Booster.predict used instead."""

import warnings

import numpy as np
import pytest

from isocompute.policy.learn import booster_predict
from isocompute.policy.learn.booster_predict import BoosterPredictor, FastPredictWarning, probe_rows
from isocompute.policy.learn.learners import (
    OracleClassifier,
    UtilityRegressor,
    _booster_from_string,
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


@pytest.fixture(scope="module")
def utility(data):
    X, U, _ = data
    return UtilityRegressor(n_rounds=8, min_data_in_leaf=5).fit(X, U, np.array([1, 2, 4]))


def _boosters(model):
    yield model.booster_
    yield _booster_from_string(model.booster_.model_to_string())  # as a loaded artifact has it


def test_utility_regressor_predictions_equal_booster_predict(data, utility):
    X, _, _ = data
    m = utility
    assert m.predictor_.fast
    Xs = np.column_stack([np.repeat(X, 3, axis=0), np.tile(m.ks_, len(X))])
    for b in _boosters(m):
        p = BoosterPredictor(b)
        assert p.fast and p.n_out == 1
        ref = b.predict(Xs, num_threads=1)
        assert np.array_equal(p(Xs), ref)
        assert np.array_equal(p(Xs[:3]), ref[:3])  # one prompt's rows
        assert np.array_equal(p(np.asfortranarray(Xs[::2])), ref[::2])  # any layout in
    assert np.array_equal(m.predict_utilities(X), ref.reshape(len(X), 3))
    u = np.linspace(0, 1, len(X), endpoint=False)
    assert np.array_equal(m.predict(X, 0.05, np.array([1.0, 2.0, 4.0]), u),
                          price(ref.reshape(len(X), 3), 0.05, np.array([1.0, 2.0, 4.0]), u))


def test_classifier_probabilities_equal_booster_predict(data):
    X, U, C = data
    m = OracleClassifier(n_rounds=6, min_data_in_leaf=5, n_budget_grid=9).fit(X, U, C, (1.0, 4.0))
    Xb = np.column_stack([X, np.full(len(X), 2.0)])
    for b in _boosters(m):
        p = BoosterPredictor(b)
        assert p.fast and p.n_out == 3
        ref = b.predict(Xb, num_threads=1)
        assert ref.shape == (len(X), 3)
        assert np.array_equal(p(Xb), ref.ravel())
    assert np.array_equal(m.predict_proba(X, 2.0), ref)


def test_probe_rows_span_the_training_range_and_reach_many_leaves(data, utility):
    import lightgbm as lgb

    X, U, _ = data
    P = probe_rows(utility.booster_)
    assert P.shape == (booster_predict.PROBE_ROWS, 7) and np.isnan(P[-1]).all()
    assert (P[:-1, :6].min(axis=0) < X.min(axis=0)).all() and (P[:-1, :6].max(axis=0) > X.max(axis=0)).all()
    # a feature constant in training has no recorded range; the others keep theirs, column by column
    Xc = X.copy()
    Xc[:, 1] = 5.0
    b = lgb.train({"verbose": -1, "num_threads": 1, "min_data_in_leaf": 5}, lgb.Dataset(Xc, U[:, 0]), 3)
    Pc = probe_rows(b)[:-1]
    assert (Pc[:, 1] >= -0.05).all() and (Pc[:, 1] <= 1.05).all()
    assert Pc[:, 2].min() < X[:, 2].min() and Pc[:, 2].max() > X[:, 2].max()
    leaves = utility.booster_.predict(P, pred_leaf=True)  # (rows, trees): the leaf each row ends in
    assert all(len(np.unique(leaves[:, t])) >= 4 for t in range(leaves.shape[1]))


def _off_by_a_bit(booster, X, n_out):
    out = ORIGINAL_FAST(booster, X, n_out)
    out[len(out) // 2] = np.nextafter(out[len(out) // 2], np.inf)  # one value, one ulp: still caught
    return out


def _raises(booster, X, n_out):
    raise OSError("undefined symbol: LGBM_BoosterPredictForMat")


ORIGINAL_FAST = booster_predict._fast_predict


@pytest.mark.parametrize(
    ("fake", "why"),
    [
        (_off_by_a_bit, r"returned other numbers than Booster.predict on 256 probe rows"),
        (_raises, r"it raised OSError: undefined symbol"),
        (None, r"lacks the internals it calls"),  # a LightGBM without basic._LIB & co.
    ],
    ids=["disagrees", "raises", "missing"],
)
def test_a_disagreeing_fast_path_warns_at_load_and_booster_predict_is_used(
        data, utility, monkeypatch, fake, why):
    X, _, _ = data
    if fake is None:
        monkeypatch.setattr(booster_predict, "_c_api", lambda: None)
    else:
        monkeypatch.setattr(booster_predict, "_fast_predict", fake)
    with pytest.warns(FastPredictWarning, match=why):
        loaded = UtilityRegressor.from_state(utility.state(), utility.booster_.model_to_string())
    assert not loaded.predictor_.fast
    Xs = np.column_stack([np.repeat(X, 3, axis=0), np.tile(utility.ks_, len(X))])
    ref = loaded.booster_.predict(Xs, num_threads=1)
    assert np.array_equal(loaded.predict_utilities(X), ref.reshape(len(X), 3))


def test_an_agreeing_fast_path_loads_without_a_warning(utility):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FastPredictWarning)
        loaded = UtilityRegressor.from_state(utility.state(), utility.booster_.model_to_string())
    assert loaded.predictor_.fast


def test_empty_batch(data):
    X, U, _ = data
    m = UtilityRegressor(n_rounds=2, min_data_in_leaf=5).fit(X, U, np.array([1, 2, 4]))
    assert m.predictor_(np.zeros((0, 7))).shape == (0,)
    assert m.predict_utilities(np.zeros((0, 6))).shape == (0, 3)


def test_wrong_feature_count_is_refused(data):
    from lightgbm.basic import LightGBMError

    X, U, _ = data
    m = UtilityRegressor(n_rounds=2, min_data_in_leaf=5).fit(X, U, np.array([1, 2, 4]))
    with pytest.raises(LightGBMError, match="number of features"):
        m.predictor_(np.zeros((2, 3)))
