"""LightGBM prediction for small batches: a fast path checked against ``Booster.predict`` at load time.

``Booster.predict`` spends ~60 µs of Python per call (parameter copies, a predictor object, input
checks) around ~20 µs of C, a large share of a one-prompt decision (~0.3 ms in all). The fast path
calls the same C function, ``LGBM_BoosterPredictForMat``, with the same arguments directly: float64
C-ordered rows, normal (not raw) scores, the booster's best iteration, one thread (a request batch is
small, and thread start-up would dominate a single-row call). Its result is the same bit for bit.

It rests on LightGBM internals (``basic._LIB``, ``basic._safe_call``, the ``_C_API_*`` constants,
``Booster._handle``), which a LightGBM release may change without notice, and a changed signature
would not necessarily raise: it could return other numbers. So :class:`BoosterPredictor` checks the
fast path against ``Booster.predict`` when it is built (after ``fit`` and when a policy is loaded), on
probe rows spread over the range of every feature the model was trained on, and uses ``Booster.predict``
— with a :class:`FastPredictWarning` that says so — when they differ in any bit, the fast path raises,
or the internals are missing.

Ignores: raw scores, SHAP contributions, leaf indices, sparse input, more than one thread.

>>> import lightgbm as lgb
>>> X = np.random.default_rng(0).normal(size=(200, 3))
>>> booster = lgb.train({"verbose": -1, "num_threads": 1}, lgb.Dataset(X, X[:, 0] > 0), 5)
>>> p = BoosterPredictor(booster)
>>> p.fast, np.array_equal(p(X[:4]), booster.predict(X[:4]))
(True, True)
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np

__all__ = ["BoosterPredictor", "FastPredictWarning"]

PROBE_ROWS = 256
PROBE_SEED = 0


class FastPredictWarning(RuntimeWarning):
    """The fast prediction path disagreed with ``Booster.predict``, which is used instead."""


class BoosterPredictor:
    """``predictor(X)`` = ``booster.predict(X, num_threads=1).reshape(-1)``, through the fast path when
    it agreed with ``Booster.predict`` on this booster's probe rows (see the module docstring).

    ``fast`` tells which path is in use; ``n_out`` is the number of values per row (classes of a
    multiclass model, else 1).
    """

    def __init__(self, booster: Any) -> None:
        self.booster = booster
        self.n_out = int(booster.num_model_per_iteration())
        self.fast = _fast_path_agrees(booster, self.n_out)

    def __call__(self, X: np.ndarray) -> np.ndarray:
        X = np.ascontiguousarray(X, dtype=np.float64)
        if X.ndim == 2 and X.shape[0] == 0:
            return np.empty(0, dtype=np.float64)
        if self.fast and X.ndim == 2:
            return _fast_predict(self.booster, X, self.n_out)
        return _public_predict(self.booster, X)


def _public_predict(booster: Any, X: np.ndarray) -> np.ndarray:
    return np.asarray(booster.predict(X, num_threads=1)).reshape(-1)


def probe_rows(booster: Any, n: int = PROBE_ROWS, seed: int = PROBE_SEED) -> np.ndarray:
    """(n, d) rows uniform over each feature's training range widened by 5% on each side (LightGBM records
    the range in the model as ``feature_infos``; [0, 1] for a feature that was constant), the last row all
    missing values: the check should reach many leaves."""
    infos = booster.dump_model(num_iteration=1)["feature_infos"]  # one iteration: the header is what counts
    names = booster.feature_name()
    lo, hi = np.zeros(len(names)), np.ones(len(names))
    for j, name in enumerate(names):
        info = infos.get(name)  # absent for a feature that was constant in training
        if isinstance(info, dict) and "min_value" in info:
            lo[j], hi[j] = info["min_value"], info["max_value"]
    d = len(names)
    width = np.maximum(hi - lo, 1e-12)
    rows = lo - 0.05 * width + 1.1 * width * np.random.default_rng(seed).random((n - 1, d))
    return np.vstack([rows, np.full((1, d), np.nan)])


def _fast_path_agrees(booster: Any, n_out: int) -> bool:
    """Do the fast path and ``Booster.predict`` give identical numbers on the probe rows? Warns when not."""
    if _c_api() is None or not hasattr(booster, "_handle"):
        why = "this LightGBM lacks the internals it calls"
    else:
        X = probe_rows(booster)
        ref = _public_predict(booster, X)
        try:
            got = _fast_predict(booster, X, n_out)
        except Exception as e:  # noqa: BLE001 - any failure of the private path means: do not use it
            why = f"it raised {type(e).__name__}: {e}"
        else:
            if got.shape == ref.shape and np.array_equal(got, ref, equal_nan=True):
                return True
            diff = np.abs(got - ref).max() if got.shape == ref.shape else float("nan")
            why = f"it returned other numbers than Booster.predict on {len(X)} probe rows (max |diff| {diff:.3g})"
    import lightgbm

    warnings.warn(
        f"LightGBM {lightgbm.__version__}: the fast prediction path is off because {why}; predictions use "
        "Booster.predict (the same numbers, ~60 µs more per call). If this LightGBM is new, pin the version "
        "the project was tested with, or report it.",
        FastPredictWarning,
        stacklevel=3,
    )
    return False


def _fast_predict(booster: Any, X: np.ndarray, n_out: int) -> np.ndarray:
    """``LGBM_BoosterPredictForMat`` on float64 C-ordered rows ``X`` (see the module docstring)."""
    api = _c_api()
    ct = api.ctypes
    out = np.empty(X.shape[0] * n_out, dtype=np.float64)
    n = ct.c_int64(0)
    api.safe_call(api.lib.LGBM_BoosterPredictForMat(  # (ndarray.ctypes.data_as costs ~10 µs a call)
        booster._handle, ct.c_void_p(X.__array_interface__["data"][0]), api.float64, ct.c_int32(X.shape[0]),
        ct.c_int32(X.shape[1]), api.row_major, api.normal, api.zero, ct.c_int(booster.best_iteration),
        api.one_thread, ct.byref(n), ct.c_void_p(out.__array_interface__["data"][0])))
    if n.value != out.size:
        raise ValueError(f"LightGBM returned {n.value} predictions for {X.shape[0]} rows × {n_out}; the model "
                         "does not match the learner's state: re-create the policy with `isocompute fit`.")
    return out


@functools.cache
def _c_api() -> Any:
    """LightGBM's C library, its error check and the constant arguments of a prediction, or None when
    this LightGBM lacks them."""
    import ctypes
    from types import SimpleNamespace

    try:
        from lightgbm import basic

        return SimpleNamespace(
            lib=basic._LIB, safe_call=basic._safe_call, ctypes=ctypes,
            float64=ctypes.c_int(basic._C_API_DTYPE_FLOAT64), row_major=ctypes.c_int(basic._C_API_IS_ROW_MAJOR),
            normal=ctypes.c_int(basic._C_API_PREDICT_NORMAL), zero=ctypes.c_int(0),
            one_thread=ctypes.c_char_p(b"num_threads=1"))
    except (ImportError, AttributeError):
        return None
