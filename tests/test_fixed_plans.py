"""The best fixed plan: the hand-worked hull, brute force over all plan pairs, held-out folds that never
see their own prompts, and errors."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isocompute.errors import BudgetError, InputError
from isocompute.policy.plans.fixed import choose_fixed_plan, cross_validate_fixed_plan, fold_assignment
from isocompute.solver.plans.estimates import estimate_plans
from isocompute.solver.plans.plan import plan_family


def test_hand_worked_hull():
    U = np.array([[0.50, 0.60, 0.55, 0.66]])
    C = np.array([[1.0, 2.0, 3.0, 4.0]])
    choice = choose_fixed_plan(U, C, 3.0)
    assert (choice.lo, choice.hi) == (1, 3) and choice.mix == pytest.approx(0.5)
    assert choice.train_utility == pytest.approx(0.63) and choice.train_cost == pytest.approx(3.0)
    assert choice.describe(["a", "b", "c", "d"]) == "0.500·b + 0.500·d"
    exact = choose_fixed_plan(U, C, 2.0)
    assert exact.mix == 0.0 and exact.describe(["a", "b", "c", "d"]) == "b"


def test_budget_above_every_plan_does_not_bind():
    U, C = np.array([[0.5, 0.7, 0.6]]), np.array([[1.0, 2.0, 3.0]])
    choice = choose_fixed_plan(U, C, 10.0)
    assert (choice.lo, choice.mix) == (1, 0.0) and choice.train_cost == 2.0 and choice.train_utility == 0.7


def brute_best(U, C, budget):
    """Best mean utility at mean cost <= budget: a single plan that fits, or two mixed to cost the budget."""
    u, c = U.mean(0), C.mean(0)
    best = u[c <= budget + 1e-12].max(initial=-np.inf)
    for j, k in itertools.product(range(u.size), repeat=2):
        if c[j] <= budget + 1e-12 and c[k] >= budget - 1e-12:
            p = 0.0 if c[k] == c[j] else (budget - c[j]) / (c[k] - c[j])
            best = max(best, (1 - p) * u[j] + p * u[k])
    return best


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 6), st.integers(1, 8), st.floats(0, 1))
def test_equals_the_best_pair_by_brute_force(seed, n, a, frac):
    rng = np.random.default_rng(seed)
    U, C = rng.random((n, a)), rng.integers(1, 6, (n, a)).astype(float)
    lo, hi = C.mean(0).min(), C.mean(0).max()
    budget = lo + frac * (hi - lo)
    choice = choose_fixed_plan(U, C, budget)
    assert choice.train_utility == pytest.approx(brute_best(U, C, budget), abs=1e-12)
    assert choice.utility(U).mean() == pytest.approx(choice.train_utility, abs=1e-12)
    assert choice.cost(C).mean() <= budget + 1e-9  # exact when the budget binds, below when it cannot buy more


def test_held_out_folds_never_see_their_prompts():
    rng = np.random.default_rng(0)
    codes = np.where(rng.random((60, 16)) < rng.beta(1, 1, (60, 1)), 0, rng.integers(1, 4, (60, 16)))
    est = estimate_plans(codes, codes == 0, plan_family("lead", m=[1, 2, 3], k_max=[2, 4, 8]) + plan_family("uniform", k=[1, 8]))
    U, C = est.utility, est.samples
    cv = cross_validate_fixed_plan(U, C, 4.0, folds=5, seed=3)
    assert np.bincount(cv.fold).tolist() == [12] * 5
    for f, choice in enumerate(cv.choices):
        test = cv.fold == f
        assert choice == choose_fixed_plan(U[~test], C[~test], 4.0)
        np.testing.assert_allclose(cv.utility[test], choice.utility(U[test]))
        U2 = U.copy()
        U2[test] = rng.random((test.sum(), U.shape[1]))  # the fold's own outcomes cannot move its choice
        assert cross_validate_fixed_plan(U2, C, 4.0, folds=5, seed=3).choices[f] == choice
    assert cv.mean_cost == pytest.approx(4.0, rel=0.1)
    again = cross_validate_fixed_plan(U, C, 4.0, folds=5, seed=3)
    np.testing.assert_array_equal(again.utility, cv.utility)
    assert cv.accuracy == pytest.approx(cv.utility.mean())


def test_fold_assignment_is_balanced_and_seeded():
    a = fold_assignment(23, 5, 1)
    assert sorted(np.bincount(a).tolist()) == [4, 4, 5, 5, 5]
    assert np.array_equal(a, fold_assignment(23, 5, 1)) and not np.array_equal(a, fold_assignment(23, 5, 2))


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: choose_fixed_plan(np.ones((3, 2)), np.array([[1.0, 2]] * 3), 0.5), BudgetError,
     "below the cheapest plan's mean cost 1"),
    (lambda: choose_fixed_plan(np.ones((3, 2)), np.ones((3, 3)), 1.0), InputError, "one shape"),
    (lambda: choose_fixed_plan(np.ones((3, 2)), np.full((3, 2), np.nan), 1.0), InputError, "'samples' cost unit"),
    (lambda: cross_validate_fixed_plan(np.ones((3, 2)), np.ones((3, 2)), 1.0, folds=4), InputError,
     r"folds must be an integer in \[2, 3\]"),
])
def test_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()
