"""The budget → utility frontier: the hand-worked case, agreement with allocate() at every breakpoint
and with scipy's LP at random budgets, brute force over every integral allocation, and shape invariants."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from isocompute.errors import BudgetError, InputError
from isocompute.solver.allocate import allocate
from isocompute.solver.frontier import frontier

U_EX = np.array([[0.5, 0.9, 0.9], [0.2, 0.3, 0.8]])
C_EX = np.array([[1.0, 2.0, 4.0], [1.0, 2.0, 4.0]])


def lp_value(U, C, budget):
    """LP optimum by HiGHS, posed in sums with O(1) costs (mean-form coefficients U/N can fall below
    HiGHS's 1e-7 dual tolerance)."""
    n, a = U.shape
    scale = max(float(np.abs(C).max()), 1e-12)
    res = linprog(-U.ravel(), A_ub=C.ravel()[None] / scale, b_ub=[n * budget / scale],
                  A_eq=np.kron(np.eye(n), np.ones(a)), b_eq=np.ones(n), bounds=(0, 1), method="highs")
    assert res.status == 0, res.message
    return -res.fun / n


def random_instance(seed, n, a, kind):
    rng = np.random.default_rng(seed)
    if kind == "ties":  # many equal slopes across prompts: groups of collinear increments
        return rng.integers(0, 4, (n, a)) / 4, np.tile(np.arange(1.0, a + 1), (n, 1))
    if kind == "passk":
        ks = 2.0 ** np.arange(a)
        U = 1 - (1 - rng.beta(0.5, 0.5, (n, 1))) ** ks + rng.normal(0, 0.02, (n, a))
        return U, ks * rng.integers(50, 500, (n, 1))
    return rng.random((n, a)), np.sort(rng.random((n, a)) * 10, axis=1)


def test_hand_worked_example():
    f = frontier(U_EX, C_EX)
    np.testing.assert_allclose(f.cost, [1.0, 1.5, 3.0])
    np.testing.assert_allclose(f.utility, [0.35, 0.55, 0.85])
    np.testing.assert_allclose(f.lam, [0.4, 0.2, 0.0])
    assert f.utility_at(2.0) == pytest.approx(0.65)
    assert f.utility_at(3.7) == pytest.approx(0.85)  # flat beyond the last breakpoint
    assert f.lam_at(2.0) == pytest.approx(0.2) and f.lam_at(3.5) == 0
    assert f.min_cost == 1.0 and f.max_cost == 4.0 and f.n_prompts == 2
    np.testing.assert_allclose(f.utility_at(np.array([1.0, 1.25])), [0.35, 0.45])


@pytest.mark.parametrize("kind", ["ties", "passk", "uniform"])
@pytest.mark.parametrize("seed", range(6))
def test_agrees_with_allocate_at_every_breakpoint_and_between(kind, seed):
    U, C = random_instance(seed, 30, 5, kind)
    f = frontier(U, C)
    for j, (b, u, lam) in enumerate(zip(f.cost, f.utility, f.lam, strict=True)):
        res = allocate(U, C, b)
        assert res.mean_utility == pytest.approx(u, rel=1e-9)
        assert res.lam == pytest.approx(lam, rel=1e-9, abs=1e-15)
        assert res.mixed.size == 0  # a breakpoint is a deterministic allocation
        if j + 1 < f.cost.size:
            mid = (b + f.cost[j + 1]) / 2
            res = allocate(U, C, mid)
            assert res.mean_utility == pytest.approx(f.utility_at(mid), rel=1e-9)
            assert res.lam == pytest.approx(lam, rel=1e-9)


@pytest.mark.parametrize("kind", ["ties", "passk", "uniform"])
@pytest.mark.parametrize("seed", range(4))
def test_matches_linprog_at_random_budgets(kind, seed):
    U, C = random_instance(100 + seed, 25, 4, kind)
    f = frontier(U, C)
    budgets = np.random.default_rng(seed).uniform(f.min_cost, f.max_cost, 6)
    got = f.utility_at(budgets)
    for b, g in zip(budgets, got, strict=True):
        assert g == pytest.approx(lp_value(U, C, b), rel=1e-9)


@pytest.mark.parametrize("seed", range(5))
def test_dominates_every_integral_allocation_and_breakpoints_are_integral(seed):
    """Brute force over all A**N allocations: none lies above the frontier, and each breakpoint is one."""
    U, C = random_instance(seed, 4, 4, "ties" if seed % 2 else "uniform")
    f = frontier(U, C)
    rows = np.arange(4)
    points = np.array([(C[rows, a].mean(), U[rows, a].mean())
                       for a in itertools.product(range(4), repeat=4)])
    assert (points[:, 1] <= f.utility_at(points[:, 0]) + 1e-12).all()
    for b, u in zip(f.cost, f.utility, strict=True):
        assert np.isclose(points, [b, u], rtol=1e-12, atol=1e-12).all(axis=1).any()


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 15), a=st.integers(1, 5),
       kind=st.sampled_from(["ties", "passk", "uniform"]))
def test_shape_invariants(seed, n, a, kind):
    U, C = random_instance(seed, n, a, kind)
    f = frontier(U, C)
    assert f.cost.shape == f.utility.shape == f.lam.shape
    assert (np.diff(f.cost) > 0).all() and (np.diff(f.utility) > 0).all()
    assert (np.diff(f.lam) < 0).all() and f.lam[-1] == 0  # concave: prices fall along the curve
    np.testing.assert_allclose(np.diff(f.utility) / np.diff(f.cost), f.lam[:-1], rtol=1e-6)
    assert f.cost[0] == pytest.approx(C[:, 0].mean()) and f.cost[-1] <= f.max_cost * (1 + 1e-12)
    assert f.utility[-1] == pytest.approx(U.max(axis=1).mean())


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda f: f.utility_at(0.5), BudgetError, r"outside the feasible range \[1, 4\]"),
        (lambda f: f.utility_at([2.0, 4.5]), BudgetError, r"budget 4.5 is outside"),
        (lambda f: f.lam_at(float("nan")), BudgetError, "feasible range"),
        (lambda f: frontier(U_EX, C_EX[:, ::-1]), InputError, "sorted ascending"),
        (lambda f: frontier(U_EX, C_EX[:1]), InputError, "same shape"),
    ],
)
def test_errors(call, error, match):
    with pytest.raises(error, match=match):
        call(frontier(U_EX, C_EX))
