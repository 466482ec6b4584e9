"""The two-budget oracle: the docstring's hand-worked case, agreement with scipy's LP (HiGHS) with both
constraints, reduction to allocate when the latency budget is slack, errors, and invariants (budgets met,
value monotone in Λ, strong duality, at most two prompts mixing in general position, inputs untouched)."""

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from isocompute.errors import BudgetError, InputError
from isocompute.solver.allocate import STATUS_NOT_BINDING, STATUS_OK, allocate
from isocompute.solver.allocate_two import STATUS_MAX_ITER, _purify, allocate_two, lagrangian_actions_two

# The docstring example: one sample (C 1, L 1), two sequential samples (C 2, L 2), four in parallel (C 4, L 1).
U_EX = np.array([[0.6, 0.8, 0.8], [0.2, 0.5, 0.6]])
C_EX = np.array([[1.0, 2.0, 4.0], [1.0, 2.0, 4.0]])
L_EX = np.array([[1.0, 2.0, 1.0], [1.0, 2.0, 1.0]])


def lp_value(U, C, L, budget, latency_budget):
    """Optimal mean utility of the LP relaxation with both budgets, by HiGHS: posed in sums with the rows scaled
    to O(1) (mean-form coefficients can fall below HiGHS's tolerances), and at its tightest feasibility
    tolerances (at the default 1e-7 it may overspend a budget by ~1e-9 and "beat" the optimum by as much)."""
    n, a = U.shape
    cs, ls = max(float(np.abs(C).max()), 1e-12), max(float(np.abs(L).max()), 1e-12)
    res = linprog(-U.ravel(), A_ub=np.vstack([C.ravel() / cs, L.ravel() / ls]),
                  b_ub=[n * budget / cs, n * latency_budget / ls], A_eq=np.kron(np.eye(n), np.ones(a)),
                  b_eq=np.ones(n), bounds=(0, 1), method="highs",
                  options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10})
    assert res.status == 0, res.message
    return -res.fun / n


def random_instance(rng, n, a, *, kind):
    """U in [0, 1], costs sorted and positive, latencies positive in any order; "ties" and "same" are degenerate
    (values on a grid; identical rows), "uniform" is in general position."""
    if kind == "ties":
        U = rng.integers(0, 4, (n, a)) / 4
        C = np.sort(rng.integers(1, 4, (n, a)), axis=1).astype(float)
        L = rng.integers(1, 4, (n, a)).astype(float)
    elif kind == "same":
        U = np.repeat(rng.random((1, a)), n, axis=0)
        U[: n // 2] *= 0.5
        C = np.repeat(np.sort(rng.random((1, a)), axis=1) + 0.01, n, axis=0)
        L = np.repeat(rng.random((1, a)) + 0.01, n, axis=0)
    else:
        U = rng.random((n, a))
        C = np.sort(rng.random((n, a)) * 10, axis=1) + 0.01
        L = rng.random((n, a)) * 3 + 0.01
    return U, C, L


def latency_range(U, C, L, budget):
    """(least mean latency within the cost budget — allocate on −L is exact —, mean latency of allocate's
    answer to the cost budget alone: above it the latency budget is slack)."""
    least = -allocate(-L, C, budget).mean_utility
    alone = (allocate(U, C, budget).action_probs() * L).sum() / len(L)
    return least, alone


def budgets(U, C, L, frac_b, frac_l):
    budget = C[:, 0].mean() + frac_b * (C[:, -1].mean() - C[:, 0].mean())
    least, alone = latency_range(U, C, L, budget)
    return budget, least + frac_l * (alone - least)


def dual(U, C, L, lam, mu, budget, latency_budget):
    return (U - lam * C - mu * L).max(axis=1).mean() + lam * budget + mu * latency_budget


def test_hand_worked_example():
    alone = allocate(U_EX, C_EX, 2.0)
    assert alone.actions.tolist() == [1, 1] and alone.mean_utility == pytest.approx(0.65)
    assert alone.lam == pytest.approx(0.05) and (alone.action_probs() * L_EX).sum() / 2 == pytest.approx(2.0)
    res = allocate_two(U_EX, C_EX, L_EX, 2.0, 1.5)
    assert res.status == STATUS_OK and res.allocation is None
    assert res.lam == pytest.approx(0.1) and res.mu == pytest.approx(0.1)
    np.testing.assert_allclose(res.action_probs(), [[2 / 3, 1 / 3, 0], [0, 2 / 3, 1 / 3]], atol=1e-12)
    assert res.mean_utility == pytest.approx(0.6) and res.dual_value == pytest.approx(0.6)
    assert res.mean_cost == pytest.approx(2.0) and res.mean_latency == pytest.approx(1.5)
    assert res.mixed.tolist() == [0, 1] and res.weights.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(U_EX - 0.1 * C_EX - 0.1 * L_EX, [[0.4, 0.4, 0.3], [0.0, 0.1, 0.1]], atol=1e-12)
    assert lp_value(U_EX, C_EX, L_EX, 2.0, 1.5) == pytest.approx(0.6)


def check_against_lp(U, C, L, budget, latency_budget):
    res = allocate_two(U, C, L, budget, latency_budget)
    n = len(U)
    probs = res.action_probs()
    assert probs.min() >= 0 and np.allclose(probs.sum(axis=1), 1.0)
    cost, latency, utility = ((probs * T).sum() / n for T in (C, L, U))
    assert res.mean_utility == pytest.approx(lp_value(U, C, L, budget, latency_budget), rel=1e-9, abs=1e-9)
    assert cost <= budget + 1e-9 * max(1.0, budget)
    assert latency <= latency_budget + 1e-9 * max(1.0, latency_budget)
    # the reported numbers are those of the reported mixture, and the duals certify it
    assert (res.mean_cost, res.mean_latency) == (pytest.approx(cost, rel=1e-12), pytest.approx(latency, rel=1e-12))
    assert res.mean_utility == pytest.approx(utility, rel=1e-12, abs=1e-15)
    assert res.lam >= 0 and res.mu >= 0
    g = dual(U, C, L, res.lam, res.mu, budget, latency_budget)
    assert res.dual_value == pytest.approx(g, rel=1e-9, abs=1e-9)
    assert res.mean_utility == pytest.approx(g, rel=1e-9, abs=1e-9)
    if res.lam > 1e-9:  # complementary slackness: a priced budget is met exactly in expectation
        assert cost == pytest.approx(budget, rel=1e-9)
    if res.mu > 1e-9:
        assert latency == pytest.approx(latency_budget, rel=1e-9)
    if res.allocation is None:  # a basic solution: at most two prompts fractional, even among ties
        assert res.mixed.size <= 2 and ((probs > 0).sum(axis=1) > 1).sum() <= 2
    return res


instances = st.builds(
    lambda seed, n, a, kind: random_instance(np.random.default_rng(seed), n, a, kind=kind),
    st.integers(0, 2**32 - 1), st.integers(1, 30), st.integers(1, 6), st.sampled_from(["ties", "same", "uniform"]),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inst=instances, frac_b=st.floats(0, 1), frac_l=st.floats(0, 1))
def test_matches_linprog_with_both_budgets(inst, frac_b, frac_l):
    U, C, L = inst
    check_against_lp(U, C, L, *budgets(U, C, L, frac_b, frac_l))


@pytest.mark.parametrize("kind", ["ties", "same", "uniform"])
@pytest.mark.parametrize("seed", range(6))
def test_matches_linprog_on_the_edges_of_the_feasible_region(kind, seed):
    rng = np.random.default_rng(seed)
    U, C, L = random_instance(rng, int(rng.integers(2, 30)), int(rng.integers(2, 7)), kind=kind)
    for frac_b, frac_l in [(0, 0), (1, 0), (0.5, 0), (0.5, 1), (rng.random(), rng.random()), (0.3, 0.999)]:
        check_against_lp(U, C, L, *budgets(U, C, L, frac_b, frac_l))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 40), a=st.integers(2, 8), frac_b=st.floats(0.05, 0.95),
       frac_l=st.floats(0.05, 0.95))
def test_at_most_two_prompts_mix_in_general_position(seed, n, a, frac_b, frac_l):
    """The LP's optimum is then unique and basic (N + 2 rows): at most two prompts fractional."""
    U, C, L = random_instance(np.random.default_rng(seed), n, a, kind="uniform")
    res = allocate_two(U, C, L, *budgets(U, C, L, frac_b, frac_l))
    assert res.mixed.size <= 2 and res.plays.shape[0] <= 3
    fractional = ((res.action_probs() > 1e-12).sum(axis=1) > 1).sum()
    assert fractional == res.mixed.size


@pytest.mark.parametrize("kind", ["ties", "same"])
@pytest.mark.parametrize("seed", range(4))
def test_ties_shared_by_many_prompts_end_basic(kind, seed):
    """Hundreds of identical rows tie at (λ*, μ*); the master's plays split them, the purification leaves two
    fractional, with the LP's value and both budgets as they were."""
    rng = np.random.default_rng(seed)
    U, C, L = random_instance(rng, 400, 5, kind=kind)
    res = check_against_lp(U, C, L, *budgets(U, C, L, 0.3, 0.4))
    assert res.allocation is None and res.mixed.size <= 2


@pytest.mark.parametrize("seed", range(4))
def test_purify_keeps_both_means_and_never_lowers_utility(seed):
    rng = np.random.default_rng(seed)
    U, C, L = random_instance(rng, 500, 6, kind="uniform")
    plays = rng.integers(0, 6, (3, 500))
    weights = rng.dirichlet(np.ones(3))
    out, w = _purify(plays, weights, U, C, L)
    before, after = (np.stack([sum(wk * T[np.arange(500), pk] for pk, wk in zip(P, W, strict=True)) for T in (C, L, U)])
                     for P, W in ((plays, weights), (out, w)))
    np.testing.assert_allclose(after[:2].mean(axis=1), before[:2].mean(axis=1), rtol=1e-12)
    assert after[2].mean() >= before[2].mean() - 1e-12
    assert w.min() > 0 and w.sum() == pytest.approx(1.0)
    assert ((out != out[0]).any(axis=0)).sum() <= 2


@pytest.mark.parametrize("kind", ["ties", "same", "uniform"])
@pytest.mark.parametrize("seed", range(4))
def test_slack_latency_budget_is_allocate_itself(kind, seed):
    rng = np.random.default_rng(20 + seed)
    U, C, L = random_instance(rng, int(rng.integers(1, 30)), int(rng.integers(1, 6)), kind=kind)
    budget = C[:, 0].mean() + rng.random() * (C[:, -1].mean() - C[:, 0].mean())
    _, alone = latency_range(U, C, L, budget)
    ref = allocate(U, C, budget)
    for latency_budget in (alone, alone * 1.5 + 1.0, None):
        res = allocate_two(U, C, L, budget, latency_budget)
        assert res.allocation is not None and res.mu == 0 and res.n_iter == 0
        assert np.array_equal(res.plays, np.stack([ref.actions, ref.actions_hi]))
        assert res.weights.tolist() == [1 - ref.mix_prob, ref.mix_prob]
        assert np.array_equal(res.mixed, ref.mixed) and np.array_equal(res.action_probs(), ref.action_probs())
        assert (res.lam, res.mean_utility, res.mean_cost, res.status) == (ref.lam, ref.mean_utility, ref.mean_cost,
                                                                          ref.status)
        assert res.mean_latency == pytest.approx(alone, rel=1e-12)
    assert np.isnan(allocate_two(U, C, None, budget).mean_latency)


def test_neither_budget_binding():
    res = allocate_two(U_EX, C_EX, L_EX, 4.0, 1.5)
    assert res.status == STATUS_NOT_BINDING and res.lam == 0 and res.mu == 0
    assert res.action_probs().argmax(axis=1).tolist() == [1, 2] and res.mean_latency == pytest.approx(1.5)


def test_value_is_monotone_in_the_latency_budget_and_below_the_cost_budget_alone():
    rng = np.random.default_rng(5)
    U, C, L = random_instance(rng, 300, 6, kind="uniform")
    budget = float(C[:, 2].mean())
    least, alone = latency_range(U, C, L, budget)
    values = [allocate_two(U, C, L, budget, lat).mean_utility for lat in np.linspace(least, alone, 7)]
    assert all(a <= b + 1e-12 for a, b in zip(values, values[1:], strict=False))
    assert values[-1] == pytest.approx(allocate(U, C, budget).mean_utility, rel=1e-12)


def test_plays_are_closed_forms_at_the_optimal_prices():
    rng = np.random.default_rng(8)
    U, C, L = random_instance(rng, 500, 6, kind="uniform")
    res = allocate_two(U, C, L, *budgets(U, C, L, 0.4, 0.3))
    assert res.lam > 0 and res.mu > 0
    best = lagrangian_actions_two(U, C, L, res.lam, res.mu)
    others = np.setdiff1d(np.arange(len(U)), res.mixed)
    assert np.array_equal(res.plays[:, others], np.broadcast_to(best[others], (res.plays.shape[0], others.size)))


@pytest.mark.parametrize("seed", range(3))
def test_lagrangian_actions_two_is_the_first_argmax(seed):
    rng = np.random.default_rng(seed)
    U, C, L = random_instance(rng, 200, 5, kind="ties" if seed else "uniform")
    for lam, mu in rng.exponential(0.2, (10, 2)):
        assert np.array_equal(lagrangian_actions_two(U, C, L, lam, mu), np.argmax(U - lam * C - mu * L, axis=1))
    ties = lagrangian_actions_two(np.ones((1, 3)), [[1.0, 1.0, 2.0]], [[1.0, 1.0, 1.0]], 0.0, 0.0)
    assert ties.tolist() == [0]  # exact ties go to the lowest index, the cheapest action


def test_sample_draws_each_prompt_at_its_probabilities():
    res = allocate_two(U_EX, C_EX, L_EX, 2.0, 1.5)
    assert np.array_equal(res.sample(seed=1), res.sample(seed=1))
    draws = np.stack([res.sample(seed) for seed in range(4000)])
    freq = np.stack([(draws == a).mean(axis=0) for a in range(3)], axis=1)
    np.testing.assert_allclose(freq, res.action_probs(), atol=4 * np.sqrt(0.25 / 4000))
    rng = np.random.default_rng(2)
    U, C, L = random_instance(rng, 300, 4, kind="uniform")
    res = allocate_two(U, C, L, *budgets(U, C, L, 0.4, 0.3))
    others = np.setdiff1d(np.arange(len(U)), res.mixed)
    assert np.array_equal(res.sample(seed=3)[others], res.actions[others])


def test_inputs_are_not_mutated():
    rng = np.random.default_rng(3)
    U, C, L = random_instance(rng, 50, 5, kind="ties")
    U0, C0, L0 = U.copy(), C.copy(), L.copy()
    allocate_two(U, C, L, *budgets(U, C, L, 0.5, 0.5))
    lagrangian_actions_two(U, C, L, 0.1, 0.2)
    assert np.array_equal(U, U0) and np.array_equal(C, C0) and np.array_equal(L, L0)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((U_EX, C_EX, L_EX, 2.0, 0.9), BudgetError,
         r"latency budget 0.9 is infeasible with the cost budget 2: the least mean latency within that cost "
         r"budget is 1, .*Raise latency_budget to at least 1, or raise budget"),
        ((U_EX, C_EX, L_EX * [[1, 1, 0.5]], 1.0, 0.9), BudgetError,
         r"least mean latency within that cost budget is 1.*fastest action everywhere has mean latency 0.5 at "
         r"mean cost 4"),
        ((U_EX, C_EX, L_EX, 0.5, 1.5), BudgetError, r"outside the feasible range \[1, 4\]"),
        ((U_EX, C_EX, L_EX, 4.5, 1.5), BudgetError, r"outside the feasible range \[1, 4\]"),
        ((U_EX, C_EX, L_EX, 2.0, -1.0), BudgetError, r"latency_budget must be a finite number ≥ 0.*least mean "
                                                     r"latency is 1"),
        ((U_EX, C_EX, L_EX, 2.0, float("nan")), BudgetError, "latency_budget must be a finite number"),
        ((U_EX, C_EX, L_EX, 2.0, "fast"), BudgetError, "latency_budget must be a finite number"),
        ((U_EX, C_EX, L_EX[:, :2], 2.0, 1.5), InputError, "latencies must have the utilities' shape"),
        ((U_EX, C_EX, None, 2.0, 1.5), InputError, "latencies must have the utilities' shape"),
        ((U_EX, C_EX, -L_EX, 2.0, 1.5), InputError, "finite and ≥ 0"),
        ((U_EX, C_EX[:, ::-1], L_EX, 2.0, 1.5), InputError, "sorted ascending"),
    ],
)
def test_errors(args, error, match):
    with pytest.raises(error, match=match):
        allocate_two(*args)


def test_max_iter_returns_a_feasible_mixture_with_a_warning_that_names_the_fix():
    rng = np.random.default_rng(8)
    U, C, L = random_instance(rng, 500, 6, kind="uniform")
    budget, latency_budget = budgets(U, C, L, 0.4, 0.6)
    with pytest.warns(RuntimeWarning, match="raise max_iter"):
        res = allocate_two(U, C, L, budget, latency_budget, max_iter=5)
    assert res.status == STATUS_MAX_ITER and res.n_iter == 5
    assert res.mean_cost <= budget * (1 + 1e-12) and res.mean_latency <= latency_budget * (1 + 1e-12)
    assert res.mean_utility < res.dual_value  # the gap the message reports
    with pytest.raises(BudgetError, match="raise max_iter"):
        allocate_two(U, C, L, budget, latency_budget, max_iter=1)  # phase one has not met Λ yet


@pytest.mark.parametrize(("lam", "mu"), [(-0.1, 0.0), (0.0, -1.0), (float("nan"), 0.0)])
def test_lagrangian_actions_two_rejects_bad_prices(lam, mu):
    with pytest.raises(InputError, match="must be ≥ 0"):
        lagrangian_actions_two(U_EX, C_EX, L_EX, lam, mu)


@pytest.mark.slow
def test_ten_thousand_prompts_by_sixty_actions_in_well_under_a_second_or_two():
    rng = np.random.default_rng(0)
    U, C, L = random_instance(rng, 10_000, 60, kind="uniform")
    budget, latency_budget = float(C.mean()), 1.0
    best = np.inf
    for _ in range(2):
        t = time.perf_counter()
        res = allocate_two(U, C, L, budget, latency_budget)
        best = min(best, time.perf_counter() - t)
    assert res.status == STATUS_OK and res.mu > 0 and res.mixed.size <= 2
    assert res.mean_latency == pytest.approx(latency_budget, rel=1e-12)
    assert best < 2.0, f"{best:.2f} s (≈ 0.2 s on the 2-core dev machine)"
