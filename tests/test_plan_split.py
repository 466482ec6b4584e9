"""Plan estimates split by stop reason (rule fired vs ran out): brute force over ALL sample orders through
Plan.step's reason (the gateway's path), a hand-worked prompt, Monte Carlo within its standard errors, and
backward compatibility (split=False is unchanged, split parts add up)."""

import functools
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from isocompute.solver.plans.estimates import estimate_plans
from isocompute.solver.plans.plan import parse_plan
from isocompute.solver.plans.vote_lattice import stop_counts

PLANS = ["none@3", "lead:m=2@1x5", "lead:m=1@1x3", "lead:m=2@4", "window:w=2@1x5", "window:w=2@2x2,1",
         "beta:p=0.75@1x5", "dirichlet:p=0.6,top=3@1x5", "bayes:B=2,alpha=0.5,top=3@1x2,2,1", "lead:m=2@2,3"]


def brute_fired(codes, correct, tokens, plan):
    """Over all n! orders: P(fired), E[U·1F], E[samples·1F], E[waves·1F], E[tokens·1F]."""
    n = len(codes)
    answers = [None if c < 0 else int(c) for c in codes]

    @functools.cache
    def stop_point(labels):
        for K in plan.boundaries:
            step = plan.step(list(labels[:K]))
            if step.stop:
                return K, step.waves_done, step.reason == "rule"
        raise AssertionError("a plan always stops at its last wave")

    def value(drawn):
        votes = {}
        for i in drawn:
            if answers[i] is not None:
                votes.setdefault(answers[i], []).append(i)
        if not votes:
            return Fraction(0)
        top = max(map(len, votes.values()))
        win = [v for v in votes.values() if len(v) == top]
        return sum(Fraction(sum(bool(correct[i]) for i in v), len(v)) for v in win) / len(win)

    acc = [Fraction(0)] * 5
    count = 0
    for perm in itertools.permutations(range(n)):
        K, waves, fired = stop_point(tuple(answers[i] for i in perm[: plan.max_samples]))
        count += 1
        if fired:
            drawn = perm[:K]
            for i, x in enumerate((1, value(drawn), K, waves, sum(tokens[i] for i in drawn))):
                acc[i] += x
    return [float(a / count) for a in acc]


def fired_tuple(est, j):
    f = est.fired
    return [f.prob[0, j], f.utility[0, j], f.samples[0, j], f.waves[0, j], f.channels["t"][0, j]]


def test_hand_worked_prompt():
    # [a, a, b], a correct, lead 2 by ones: fires only in the 2 orders a a … (of 6)
    est = estimate_plans([[0, 0, 1]], [[True, True, False]], ["lead:m=2@1x3"], split=True)
    np.testing.assert_allclose([est.fired.prob[0, 0], est.fired.utility[0, 0], est.fired.samples[0, 0]],
                               [1 / 3, 1 / 3, 2 / 3])


@pytest.mark.parametrize(("codes", "correct"), [
    ([0, 0, 1, 1, 2, -1], [1, 1, 0, 0, 0, 0]),
    ([0, 0, 0, 1, -1, -1], [0, 0, 0, 1, 0, 0]),
    ([0, 1, 2, 3, 0, 1], [1, 0, 0, 0, 1, 0]),
    ([0, 0, 0, 0, 0, 1], [1, 1, 1, 1, 1, 0]),
    ([-1, -1, -1, 0, 0, 1], [0, 0, 0, 0, 0, 1]),
])
def test_fired_part_equals_brute_force(codes, correct):
    tokens = [3, 5, 7, 11, 13, 17]
    est = estimate_plans(np.array([codes]), np.array([correct], bool), PLANS,
                         channels={"t": np.array([tokens], float)}, split=True)
    for j, plan in enumerate(est.plans):
        np.testing.assert_allclose(fired_tuple(est, j), brute_fired(codes, correct, tokens, plan),
                                   rtol=1e-12, atol=1e-12, err_msg=plan.name)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(-1, 3), min_size=5, max_size=6), st.data())
def test_fired_part_property(codes, data):
    correct = [c == 0 for c in codes]
    tokens = data.draw(st.lists(st.integers(0, 50), min_size=len(codes), max_size=len(codes)))
    plan = parse_plan(data.draw(st.sampled_from(PLANS)))
    est = estimate_plans(np.array([codes]), np.array([correct]), [plan], channels={"t": np.array([tokens], float)},
                         split=True)
    want = brute_fired(codes, correct, tokens, plan)
    np.testing.assert_allclose(fired_tuple(est, 0), want, rtol=1e-10, atol=1e-12)
    # the fired part never exceeds the whole
    assert est.fired.prob[0, 0] <= 1 + 1e-12 and est.fired.samples[0, 0] <= est.samples[0, 0] + 1e-12


def test_split_is_backward_compatible_and_parts_add_up():
    rng = np.random.default_rng(3)
    codes = rng.integers(-1, 4, (40, 16))
    correct = codes == 0
    plain = estimate_plans(codes, correct, PLANS)
    split = estimate_plans(codes, correct, PLANS, split=True)
    assert plain.fired is None
    for k in ("utility", "samples", "waves"):
        np.testing.assert_array_equal(getattr(plain, k), getattr(split, k))
    f = split.fired
    assert (f.prob >= -1e-12).all() and (f.prob <= 1 + 1e-12).all()
    # none@3 never fires; lead:m=1 fires unless every sample drawn is null
    np.testing.assert_array_equal(f.prob[:, 0], 0)
    j = PLANS.index("lead:m=1@1x3")
    all_null3 = np.array([math.comb(int((r == -1).sum()), 3) / math.comb(16, 3) for r in codes])
    np.testing.assert_allclose(f.prob[:, j], 1 - all_null3, atol=1e-12)
    sub = split.subset([3, 1])
    np.testing.assert_array_equal(sub.fired.prob, f.prob[[3, 1]])


def test_monte_carlo_fired_part_within_three_standard_errors():
    rng = np.random.default_rng(7)
    codes = rng.integers(-1, 3, (30, 10))
    correct = codes == 0
    tokens = rng.integers(1, 100, codes.shape).astype(float)
    plans = ["lead:m=2@1x6", "window:w=2@2x3", "beta:p=0.75@1x2,2,4"]
    ex = estimate_plans(codes, correct, plans, channels={"t": tokens}, split=True)
    mc = estimate_plans(codes, correct, plans, channels={"t": tokens}, split=True, method="monte-carlo",
                        n_orders=400, seed=1)
    for k in ("prob", "utility", "samples", "waves"):
        e, m, se = getattr(ex.fired, k), getattr(mc.fired, k), getattr(mc.fired, k + "_se")
        z = np.abs(m - e)[se > 0] / se[se > 0]
        assert (z < 4.5).all() and np.mean(z < 3) > 0.97, k
        assert (np.abs(m - e)[se == 0] < 0.05).all(), k  # a rare event no order happened to show
    assert mc.method == ("monte-carlo",) * 3


def test_stop_counts_parts():
    # lead:m=2@1x3: every sequence reaching K = 3 ran out (see vote_lattice's docstring)
    plan = parse_plan("lead:m=2@1x3")
    all_, fired = stop_counts(plan, 3), stop_counts(plan, 3, "fired")
    assert fired.sum() > 0 and np.all(fired <= all_)
    from isocompute.solver.plans.vote_lattice import partitions
    lat = partitions(3)
    three = [i for i, lam in enumerate(lat.items) if sum(lam) == 3]
    np.testing.assert_array_equal(fired[three, 0], 0)
    with pytest.raises(ValueError, match="part must be"):
        stop_counts(plan, 3, "ran_out")
