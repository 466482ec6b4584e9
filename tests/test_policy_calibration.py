"""Budget calibration: hand-worked tables, brute-force agreement, monotonicity invariants."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from isocompute.policy.learn.calibration import (
    Calibration,
    calibrate_by_bisection,
    calibrate_mixed_grid,
    grid_budget,
    grid_position,
    mixed_grid_index,
)


def test_mixed_grid_hand_worked():
    # Grid budgets 1, 2, 4; two prompts whose decision at grid j costs grid[j]; u = (0.25, 0.75).
    # Prompt i moves up at x = j + 1 − u_i: prompt 1 at 0.25 and 1.25, prompt 0 at 0.75 and 1.75, so
    # c(x) = 1, 1.5 (x ≥ .25), 2 (≥ .75), 3 (≥ 1.25), 4 (≥ 1.75).
    grid = np.array([1.0, 2.0, 4.0])
    costs = np.array([[1.0, 1.0], [2.0, 2.0], [4.0, 4.0]])
    u = np.array([0.25, 0.75])
    cal = calibrate_mixed_grid(np.array([1.0, 1.5, 2.5, 3.0]), np.array([1.0, 1.5, 2.5, 3.0]), grid, costs, u,
                               n_validation=2)
    # Entries sit mid-step: c = 1 on [0, .25), 1.5 on [.25, .75), 3 on [1.25, 1.75).
    np.testing.assert_allclose(grid_position(cal.values, grid), [0.125, 0.5, 1.5, 1.5])
    np.testing.assert_allclose(cal.realised, [1.0, 1.5, 3.0, 3.0])  # 2.5 ties 2 vs 3: the step reaching it
    assert cal.values[1] == pytest.approx(2**0.5)


def test_mixed_grid_index_interpolates_shares():
    u = (np.arange(1000) + 0.5) / 1000
    for x, share in [(0.0, 0.0), (2.3, 0.3), (2.75, 0.75), (4.0, 0.0)]:
        j = mixed_grid_index(x, u, 5)
        base = int(np.floor(x))
        assert set(np.unique(j)) <= {base, min(base + 1, 4)}
        assert np.mean(j > base) == pytest.approx(share, abs=1e-9)


def test_grid_position_roundtrip():
    grid = np.geomspace(1, 16, 9)
    np.testing.assert_allclose(grid_position(grid, grid), np.arange(9), atol=1e-12)
    np.testing.assert_allclose(grid_budget(np.arange(9), grid), grid)
    lin = np.linspace(0, 8, 5)
    np.testing.assert_allclose(grid_budget(grid_position(3.0, lin), lin), 3.0)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 8), st.integers(1, 30), st.integers(0, 10_000))
def test_mixed_grid_agrees_with_brute_force_and_is_monotone(G, n, seed):
    rng = np.random.default_rng(seed)
    grid = np.geomspace(1, 8, G)
    # Arbitrary (not necessarily monotone) decision costs per grid budget and prompt.
    costs = rng.choice([1.0, 2.0, 4.0, 8.0], size=(G, n))
    if seed % 2:  # half the cases: each prompt's cost grows with the budget, as a good imitator's does
        costs = np.sort(costs, axis=0)
    u = rng.random(n)
    targets = np.sort(rng.uniform(1, 8, size=7))
    cal = calibrate_mixed_grid(targets, targets, grid, costs, u, n_validation=n)
    assert np.all(np.diff(cal.values) >= 0)
    # Brute force: the realised cost at each calibrated knob, computed prompt by prompt.
    for x, real in zip(grid_position(cal.values, grid), cal.realised, strict=True):
        j = mixed_grid_index(x, u, G)
        assert real == pytest.approx(costs[j, np.arange(n)].mean())
    # No knob on a fine scan gets nearer a target than the first crossing does, unless cost is non-monotone.
    if np.all(np.diff(costs, axis=0) >= 0):
        xs = np.linspace(0, G - 1, 801)
        scan = np.array([costs[mixed_grid_index(x, u, G), np.arange(n)].mean() for x in xs])
        for t, real in zip(targets, cal.realised, strict=True):
            assert abs(real - t) <= np.min(np.abs(scan - t)) + 1e-9


def test_bisection_hand_worked():
    # cost(λ) = 3 for λ < 0.1, 2 for λ < 0.3, 1 after.
    def cost(lam):
        return 3.0 if lam < 0.1 else 2.0 if lam < 0.3 else 1.0

    targets = np.array([1.5, 2.6, 3.0])
    cal = calibrate_by_bisection(targets, targets, cost, lam_max=1.0, n_validation=1)
    # 1.5 is as near 2 as 1: the cheaper side wins; 2.6 is nearer 3 (below λ = 0.1); 3 is met by the
    # dearest decisions, at the lowest price searched (−lam_max).
    # Entries sit mid-step: cost 1 on [0.3, 1] → 0.65; cost 3 on [−1, 0.1) → −0.45.
    np.testing.assert_allclose(cal.realised, [1.0, 3.0, 3.0])
    np.testing.assert_allclose(cal.values[:2], [0.65, -0.45], atol=1e-9)
    assert cal.values[2] == -1.0
    assert np.all(np.diff(cal.values) <= 0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.01, 1.0), min_size=1, max_size=6, unique=True), st.integers(0, 1000))
def test_bisection_monotone_and_nearest(breaks, seed):
    breaks = np.sort(np.array(breaks))
    # a cost level that holds only on a λ interval a few ulps wide is below what bisection in float64
    # can land in (hypothesis found breaks 0.01 and 0.01 + 1 ulp); real price steps are far wider
    assume(breaks.size < 2 or np.diff(breaks).min() > 1e-9)
    levels = np.sort(np.random.default_rng(seed).uniform(1, 10, breaks.size + 1))[::-1]

    def cost(lam):
        return float(levels[np.searchsorted(breaks, lam, side="right")])

    targets = np.linspace(levels[-1] - 0.5, levels[0] + 0.5, 9)
    cal = calibrate_by_bisection(targets, targets, cost, lam_max=2.0, n_validation=1)
    assert np.all(np.diff(cal.values) <= 1e-15)
    for t, real in zip(targets, cal.realised, strict=True):
        assert abs(real - t) <= np.min(np.abs(levels - t)) + 1e-9


def test_calibration_roundtrip_and_interpolation():
    cal = Calibration("lam", np.array([1.0, 2.0, 4.0]), np.array([1.0, 2.0, 3.5]), np.array([0.3, 0.1, 0.0]),
                      np.array([1.0, 2.1, 3.4]), 10)
    back = Calibration.from_dict(cal.to_dict())
    assert back.knob == "lam" and back.n_validation == 10
    np.testing.assert_array_equal(back.values, cal.values)
    assert back(3.0) == pytest.approx(0.05) and back.expected_cost(3.0) == pytest.approx(2.75)
    assert back.max_relative_error() == pytest.approx(0.1 / 2.0)
