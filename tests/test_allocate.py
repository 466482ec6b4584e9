"""The Lagrangian oracle: a hand-worked case, agreement with scipy's LP/MILP (HiGHS) and brute force,
and invariants (exact budget, monotone cost in λ, strong duality, inputs untouched)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import LinearConstraint, linprog, milp

from isocompute.errors import BudgetError, InputError
from isocompute.solver.allocate import STATUS_NOT_BINDING, STATUS_OK, _price, allocate, lagrangian_actions
from isocompute.solver.frontier import frontier

# The docstring example: prompt 0's k=4 is dominated, prompt 1's k=2 lies under its hull.
U_EX = np.array([[0.5, 0.9, 0.9], [0.2, 0.3, 0.8]])
C_EX = np.array([[1.0, 2.0, 4.0], [1.0, 2.0, 4.0]])


def lp_value(U, C, budget, *, integral=False):
    """Optimal mean utility of the (relaxed or integer) multiple-choice knapsack, by HiGHS.

    Posed in sums with costs scaled to O(1): mean-form coefficients U/N can fall below HiGHS's 1e-7
    dual tolerance and stop it short of the optimum."""
    n, a = U.shape
    scale = max(float(np.abs(C).max()), 1e-12)
    one_each = np.kron(np.eye(n), np.ones(a))
    if integral:
        res = milp(-U.ravel(), integrality=np.ones(n * a), bounds=(0, 1),
                   constraints=[LinearConstraint(one_each, 1, 1),
                                LinearConstraint(C.ravel()[None] / scale, -np.inf, n * budget / scale)])
    else:
        res = linprog(-U.ravel(), A_ub=C.ravel()[None] / scale, b_ub=[n * budget / scale], A_eq=one_each,
                      b_eq=np.ones(n), bounds=(0, 1), method="highs")
    assert res.status == 0, res.message
    return -res.fun / n


def random_instance(rng, n, a, *, kind):
    """Utilities with ties, dominated and non-concave actions; costs sorted, sometimes tied."""
    if kind == "ties":
        U = rng.integers(0, 4, (n, a)) / 4
        C = np.sort(rng.integers(1, 4, (n, a)), axis=1).astype(float)
    elif kind == "passk":  # pass@k-like: concave-ish with noise, cost = k × tokens
        ks = 2.0 ** np.arange(a)
        U = 1 - (1 - rng.beta(0.5, 0.5, (n, 1))) ** ks + rng.normal(0, 0.02, (n, a))
        C = ks * rng.integers(50, 500, (n, 1))
    else:
        U = rng.random((n, a))
        C = np.sort(rng.random((n, a)) * 10, axis=1)
    return U, C


def budget_in(rng, C):
    lo, hi = C[:, 0].mean(), C[:, -1].mean()
    return lo + (hi - lo) * rng.random()


def utility_gap(U):
    return float((U.max(axis=1) - U.min(axis=1)).max()) / U.shape[0]


def test_hand_worked_example():
    res = allocate(U_EX, C_EX, 2.0)
    assert res.status == STATUS_OK
    assert res.lam == pytest.approx(0.2)
    assert res.actions.tolist() == [1, 0] and res.actions_hi.tolist() == [1, 2]
    assert res.mixed.tolist() == [1]
    assert res.mix_prob == pytest.approx(1 / 3)
    assert res.mean_cost == pytest.approx(2.0) and res.mean_utility == pytest.approx(0.65)
    np.testing.assert_allclose(res.action_probs(), [[0, 1, 0], [2 / 3, 0, 1 / 3]])

    det = allocate(U_EX, C_EX, 2.0, rounding="deterministic")
    assert det.actions.tolist() == [1, 0] and det.mixed.size == 0 and det.mix_prob == 0
    assert det.mean_cost == pytest.approx(1.5) and det.mean_utility == pytest.approx(0.55)
    assert det.lp_utility == pytest.approx(0.65)
    assert lp_value(U_EX, C_EX, 2.0) == pytest.approx(0.65)
    assert lp_value(U_EX, C_EX, 2.0, integral=True) == pytest.approx(0.6)


@pytest.mark.parametrize("kind", ["ties", "passk", "uniform"])
@pytest.mark.parametrize("seed", range(8))
def test_matches_linprog(kind, seed):
    rng = np.random.default_rng(seed)
    U, C = random_instance(rng, int(rng.integers(1, 40)), int(rng.integers(1, 6)), kind=kind)
    for budget in [budget_in(rng, C), C[:, 0].mean(), C[:, -1].mean(), C[:, C.shape[1] // 2].mean()]:
        res = allocate(U, C, budget)
        ref = lp_value(U, C, budget)
        assert res.mean_utility == pytest.approx(ref, rel=1e-9, abs=1e-12)
        assert res.lp_utility == res.mean_utility
        # the reported numbers are those of the reported actions
        probs = res.action_probs()
        assert (probs * C).sum() / len(C) == pytest.approx(res.mean_cost, rel=1e-12)
        assert (probs * U).sum() / len(U) == pytest.approx(res.mean_utility, rel=1e-12, abs=1e-15)
        if res.status == STATUS_OK:
            assert res.mean_cost == pytest.approx(budget, rel=1e-9)
        else:
            assert res.mean_cost < budget and res.lam == 0


@pytest.mark.parametrize("kind", ["ties", "passk", "uniform"])
def test_large_instances_agree_with_the_sorted_frontier(kind):
    """Above 65,536 edges λ* comes from a sampled band plus quickselect; the frontier sorts every edge."""
    rng = np.random.default_rng(7)
    U, C = random_instance(rng, 30_000, 5, kind=kind)
    f = frontier(U, C)
    picks = rng.choice(f.cost.size, size=min(8, f.cost.size), replace=False)
    budgets = np.r_[rng.uniform(f.min_cost, f.cost[-1], 8), f.cost[picks]]
    for b in budgets:
        res = allocate(U, C, b)
        assert res.mean_utility == pytest.approx(f.utility_at(b), rel=1e-9)
        assert res.lam == pytest.approx(f.lam_at(b), rel=1e-9)
        assert res.mean_cost == pytest.approx(b, rel=1e-9)


def brute_prices(slopes, weights, rooms):
    """Largest slope t with Σ weights[slopes ≥ t] > room, per room, by a full sort: W(≥ t) at group ends."""
    order = np.argsort(-slopes, kind="stable")
    s, cum = slopes[order], np.cumsum(weights[order])
    ends = np.flatnonzero(np.r_[s[1:] != s[:-1], True])
    return [s[ends][np.argmax(cum[ends] > room)] for room in rooms]


@pytest.mark.parametrize("case", ["continuous", "ties", "misleading_sample", "zero_weight_sample"])
def test_price_selection_matches_brute_force(case):
    """The selection behind λ*, including samples that guess the band wrong (which must cost only time)."""
    rng = np.random.default_rng(11)
    n = 100_000  # above the 65,536 edges where the sampled band kicks in
    slopes = rng.random(n) if case != "ties" else rng.integers(0, 50, n) / 7
    weights = rng.random(n)
    if case == "misleading_sample":  # the strided sample sees light high slopes, the rest is heavy
        sampled = np.arange(n) % (n >> 12) == 0
        slopes[sampled] = 2 + rng.random(sampled.sum())
        weights[~sampled] *= 1000
    if case == "zero_weight_sample":
        weights[np.arange(n) % (n >> 12) == 0] = 0.0
    rooms = weights.sum() * np.array([0.0, 1e-6, 0.01, 0.3, 0.5, 0.77, 0.999, 1 - 1e-9])
    assert [_price(slopes, weights, room) for room in rooms] == brute_prices(slopes, weights, rooms)


@pytest.mark.parametrize("kind", ["ties", "passk", "uniform"])
@pytest.mark.parametrize("seed", range(6))
def test_deterministic_rounding_within_one_gap_of_milp(kind, seed):
    rng = np.random.default_rng(100 + seed)
    U, C = random_instance(rng, int(rng.integers(2, 15)), int(rng.integers(2, 6)), kind=kind)
    budget = budget_in(rng, C)
    det = allocate(U, C, budget, rounding="deterministic")
    assert det.mean_cost <= budget * (1 + 1e-12)
    assert det.mean_utility == pytest.approx(U[np.arange(len(U)), det.actions].mean())
    best = lp_value(U, C, budget, integral=True)
    assert det.mean_utility <= best + 1e-9  # the MILP is optimal among deterministic allocations
    assert det.mean_utility >= best - utility_gap(U) - 1e-12
    assert det.mean_utility >= det.lp_utility - utility_gap(U) - 1e-12


instances = st.builds(
    lambda seed, n, a, kind: random_instance(np.random.default_rng(seed), n, a, kind=kind),
    st.integers(0, 2**32 - 1), st.integers(1, 12), st.integers(1, 5), st.sampled_from(["ties", "passk", "uniform"]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inst=instances, frac=st.floats(0, 1))
def test_expected_cost_hits_budget_exactly(inst, frac):
    U, C = inst
    budget = C[:, 0].mean() + frac * (C[:, -1].mean() - C[:, 0].mean())
    res = allocate(U, C, budget)
    best_cost = C[np.arange(len(C)), lagrangian_actions(U, C, 0.0)].mean()
    if budget <= best_cost * (1 - 1e-12):
        assert res.status == STATUS_OK
        assert res.mean_cost == pytest.approx(budget, rel=1e-9, abs=1e-12)
    else:
        assert res.status in (STATUS_OK, STATUS_NOT_BINDING)
        assert res.mean_cost == pytest.approx(best_cost, rel=1e-9)
    # the cheap side is the Lagrangian solution at λ*, and it fits; the dear side does not
    assert np.array_equal(res.actions, lagrangian_actions(U, C, res.lam))
    assert C[np.arange(len(C)), res.actions].mean() <= budget * (1 + 1e-9) + 1e-12
    assert set(res.mixed.tolist()) == set(np.flatnonzero(res.actions != res.actions_hi).tolist())
    assert 0 <= res.mix_prob <= 1


@settings(max_examples=150, deadline=None)
@given(inst=instances, lams=st.lists(st.floats(0, 10), min_size=2, max_size=6))
def test_cost_and_utility_non_increasing_in_lambda(inst, lams):
    U, C = inst
    rows = np.arange(len(U))
    lams = sorted(lams)
    costs = [C[rows, lagrangian_actions(U, C, lam)].sum() for lam in lams]
    utils = [U[rows, lagrangian_actions(U, C, lam)].sum() for lam in lams]
    assert all(a >= b for a, b in zip(costs, costs[1:], strict=False))
    assert all(a >= b for a, b in zip(utils, utils[1:], strict=False))


@settings(max_examples=100, deadline=None)
@given(inst=instances, frac=st.floats(0, 1))
def test_strong_duality_certificate(inst, frac):
    """LP value = λ*·B + mean_i max_a (U − λ*C): λ* is an optimal dual price (independent of linprog)."""
    U, C = inst
    budget = C[:, 0].mean() + frac * (C[:, -1].mean() - C[:, 0].mean())
    res = allocate(U, C, budget)
    dual = res.lam * budget + (U - res.lam * C).max(axis=1).mean()
    assert res.mean_utility == pytest.approx(dual, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_lagrangian_actions_match_brute_force_argmax(seed):
    rng = np.random.default_rng(seed)
    U, C = random_instance(rng, 200, 5, kind="uniform" if seed % 2 else "passk")
    for lam in rng.exponential(0.1, 20):
        score = U - lam * C
        top2 = np.sort(score, axis=1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > 1e-9  # away from exact ties, where rounding decides
        expect = score.argmax(axis=1)
        assert np.array_equal(lagrangian_actions(U, C, lam)[clear], expect[clear])


def test_ties_go_to_the_cheaper_action():
    U = np.array([[0.5, 0.5, 0.7], [0.1, 0.3, 0.3]])
    C = np.array([[1.0, 1.0, 2.0], [1.0, 2.0, 2.0]])
    assert lagrangian_actions(U, C, np.inf).tolist() == [0, 0]
    assert lagrangian_actions(U, C, 0.0).tolist() == [2, 1]
    assert lagrangian_actions(U, C, 0.2).tolist() == [0, 0]  # exactly on both slopes (0.2)
    assert lagrangian_actions(U, C, 0.19).tolist() == [2, 1]


def test_budget_not_binding():
    res = allocate(U_EX, C_EX, 3.5)
    assert res.status == STATUS_NOT_BINDING and "not binding" in res.message
    assert res.lam == 0 and res.actions.tolist() == [1, 2] and res.mixed.size == 0
    assert res.mean_cost == pytest.approx(3.0) and res.mean_utility == pytest.approx(0.85)


def test_breakpoint_budget_needs_no_mixing():
    res = allocate(U_EX, C_EX, 1.5)  # the cheap side of the example spends exactly 1.5
    assert res.mixed.size == 0 and res.mix_prob == 0
    assert res.lam == pytest.approx(0.2) and res.mean_utility == pytest.approx(0.55)


def test_sample_mixes_only_mixed_prompts_with_the_right_rate():
    rng = np.random.default_rng(0)
    U, C = random_instance(rng, 2000, 5, kind="ties")
    best_cost = C[np.arange(len(C)), lagrangian_actions(U, C, 0.0)].mean()
    res = allocate(U, C, 0.6 * C[:, 0].mean() + 0.4 * best_cost)
    assert res.mixed.size > 100
    draw = res.sample(seed=1)
    assert np.array_equal(draw, res.sample(seed=1))
    others = np.setdiff1d(np.arange(len(U)), res.mixed)
    assert np.array_equal(draw[others], res.actions[others])
    up = (draw[res.mixed] == res.actions_hi[res.mixed]).mean()
    assert up == pytest.approx(res.mix_prob, abs=4 * np.sqrt(0.25 / res.mixed.size))


def test_inputs_are_not_mutated():
    rng = np.random.default_rng(3)
    U, C = random_instance(rng, 50, 5, kind="ties")
    U0, C0 = U.copy(), C.copy()
    allocate(U, C, budget_in(rng, C), rounding="deterministic")
    allocate(U, C, budget_in(rng, C))
    lagrangian_actions(U, C, 0.1)
    assert np.array_equal(U, U0) and np.array_equal(C, C0)


def test_accepts_lists_and_single_action():
    res = allocate([[0.3], [0.6]], [[2.0], [4.0]], 3.0)
    assert res.actions.tolist() == [0, 0] and res.mean_utility == pytest.approx(0.45)


@pytest.mark.parametrize(
    ("U", "C", "kwargs", "error", "match"),
    [
        (U_EX, C_EX, {"budget": 0.5}, BudgetError, r"outside the feasible range \[1, 4\]"),
        (U_EX, C_EX, {"budget": 4.5}, BudgetError, r"outside the feasible range \[1, 4\]"),
        (U_EX, C_EX, {"budget": float("nan")}, BudgetError, "feasible range"),
        (U_EX, C_EX, {"budget": "four"}, BudgetError, "must be a number"),
        (U_EX, C_EX[:, :2], {"budget": 2}, InputError, "same shape"),
        (U_EX[0], C_EX[0], {"budget": 2}, InputError, "2-D"),
        (np.empty((0, 3)), np.empty((0, 3)), {"budget": 2}, InputError, "at least one prompt"),
        (np.where(U_EX > 0.8, np.nan, U_EX), C_EX, {"budget": 2}, InputError, "finite"),
        (U_EX, C_EX[:, ::-1], {"budget": 2}, InputError, "sorted ascending.*prompt 0"),
        (U_EX, C_EX, {"budget": 2, "rounding": "floor"}, InputError, "rounding must be"),
    ],
)
def test_errors(U, C, kwargs, error, match):
    with pytest.raises(error, match=match):
        allocate(U, C, **kwargs)


@pytest.mark.parametrize(("lam", "match"), [(-0.1, "must be ≥ 0"), (float("nan"), "must be ≥ 0")])
def test_lagrangian_actions_rejects_bad_price(lam, match):
    with pytest.raises(InputError, match=match):
        lagrangian_actions(U_EX, C_EX, lam)
