"""Best-of-∞ as published (``boinf``): the issue's hand-computed counts, the exact P against adaptive
quadrature and Dirichlet draws, monotonicity, no votes, names, every class read, batching, the plan
estimators (exact = brute force over all orders = Monte Carlo within its errors), the menus, speed."""

import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, special, stats
from test_plan_estimates import check_against_brute, random_codes

from isocompute.errors import InputError
from isocompute.policy.plans.menu import FAMILY_BASELINES, resolve_plans
from isocompute.solver.plans.best_of_infinity import bayes_factor, leader_log_probs, leader_max_prob
from isocompute.solver.plans.estimates import estimate_plans
from isocompute.solver.plans.plan import default_plans, parse_plan, plan_family
from isocompute.solver.plans.rules import (
    RULES,
    BestOfInfinityRule,
    VoteStates,
    parse_rule,
    stops_unique,
    vote_state,
)
from isocompute.solver.plans.vote_lattice import _partitions


def quad_probs(counts, alpha):
    """(P, 1 − P) by adaptive quadrature of ∫ f₁ ∏F_j and ∫ f₁ (1 − ∏F_j) over scipy.stats' Gamma densities
    and CDFs (1 − ∏F_j as −expm1 Σ log F_j, log F_j = log1p(−sf), so a tiny 1 − P keeps its digits)."""
    a1 = counts[0] + 1.0
    others = [c + 1.0 for c in counts[1:] if c] + [alpha + 1.0]

    def log_prod(x):
        sf = np.array([stats.gamma.sf(x, a) for a in others])
        return -np.inf if (sf >= 1).any() else np.log1p(-sf).sum()

    top = special.gammainccinv(a1, 1e-20)
    pts = [stats.gamma.ppf(q, a1) for q in (1e-6, 0.01, 0.5, 0.99)] + [a1 / 2]
    kw = dict(epsabs=0, epsrel=1e-12, limit=400, points=sorted(pts))
    p = integrate.quad(lambda x: stats.gamma.pdf(x, a1) * np.exp(log_prod(x)), 0, top, **kw)[0]
    q = integrate.quad(lambda x: stats.gamma.pdf(x, a1) * -np.expm1(log_prod(x)), 0, top, **kw)[0]
    return p, q


def mc_prob(counts, alpha, n, seed=0):
    """The authors' Monte Carlo: Dirichlet(c + 1, α + 1) draws, the leader (index 0) the largest."""
    x = np.random.default_rng(seed).dirichlet(np.array([*counts, alpha], float) + 1.0, n)
    return (x[:, 0] > x[:, 1:].max(axis=1)).mean()


def test_hand_computed_counts():
    # the figures: (4, 2) → ≈ 9.0 and (3, 1, 1) → ≈ 7.9 at α = 0.3 (K = 3 and 4)
    got = bayes_factor([[4, 2, 0], [3, 1, 1]], 0.3)
    np.testing.assert_allclose(got, [9.044950, 7.860973], rtol=1e-6)
    assert got[0] == pytest.approx(9.0, abs=0.05) and got[1] == pytest.approx(7.9, abs=0.05)
    for counts, want_p in (((4, 2), 0.7509330), ((3, 1, 1), 0.6627595)):
        p, q = quad_probs(counts, 0.3)
        assert leader_max_prob([list(counts)], 0.3)[0] == pytest.approx(p, rel=1e-11) == pytest.approx(want_p, abs=1e-7)
        assert np.exp(leader_log_probs([list(counts)], 0.3)[1][0]) == pytest.approx(q, rel=1e-11)
    # 10⁶ draws as the authors' code does them (they use 1,000): within 4 standard errors
    for counts, p in (((4, 2), 0.7509330), ((3, 1, 1), 0.6627595)):
        assert mc_prob(counts, 0.3, 10**6) == pytest.approx(p, abs=4 * math.sqrt(p * (1 - p) / 10**6))
    rule = parse_rule("boinf")
    d = rule.should_stop(list("aabaab"))
    assert d.most_common == "a" and d.prob == pytest.approx(9.044950, rel=1e-6) and not d.stop
    assert parse_rule("boinf:B=9").should_stop(list("aabaab")).stop
    assert rule.should_stop(list("abaca")).prob == pytest.approx(7.860973, rel=1e-6)


@pytest.mark.parametrize("counts", [(1,), (16,), (8, 8), (12, 1), (5, 5, 5, 1), (1,) * 16, (100, 3, 3), (500, 499),
                                    (1000,), (3,) * 20 + (1,) * 10])
@pytest.mark.parametrize("alpha", [0.01, 0.3, 2.0])
def test_exact_against_adaptive_quadrature(counts, alpha):
    log_p, log_q = leader_log_probs([list(counts)], alpha)
    p, q = quad_probs(counts, alpha)
    assert log_p[0] == pytest.approx(math.log(p), abs=1e-10)
    assert log_q[0] == pytest.approx(math.log(q), abs=1e-10)  # 1 − P keeps its relative accuracy


count_vectors = st.lists(st.integers(1, 12), min_size=1, max_size=7).map(lambda c: sorted(c, reverse=True))


@settings(max_examples=40, deadline=None)
@given(count_vectors, st.sampled_from([0.1, 0.3, 1.0, 2.5]))
def test_exact_against_monte_carlo(counts, alpha):
    n = 40_000
    p = leader_max_prob([counts], alpha)[0]
    mc = mc_prob(counts, alpha, n, seed=sum(counts) * 31 + len(counts))
    se = math.sqrt(max(p * (1 - p), 1e-4) / n)
    assert abs(mc - p) <= 5 * se, (counts, alpha, p, mc)


@settings(max_examples=60, deadline=None)
@given(count_vectors, st.sampled_from([0.1, 0.3, 1.0, 2.5]))
def test_a_vote_for_the_leader_never_lowers_the_statistic(counts, alpha):
    more = [counts[0] + 1, *counts[1:]]
    width = len(counts)
    before, after = bayes_factor([counts, more], alpha)
    assert after >= before
    # a new class lowers P (one more competitor) but K grows; a vote for a runner-up never raises it
    if width > 1:
        runner = sorted([counts[0], counts[1] + 1, *counts[2:]], reverse=True)
        if runner[0] == counts[0]:
            assert bayes_factor([runner], alpha)[0] <= before


def test_no_votes_never_stop():
    rule = BestOfInfinityRule(B=1e-9)
    for answers in ([], [None], [None, None, None]):
        d = rule.should_stop(answers)
        assert not d.stop and d.most_common is None and d.prob == 0
    states = VoteStates(counts=np.zeros((3, 4), np.int64), run=np.zeros(3, np.int64))
    assert not rule.stops(states).any() and (rule.statistic(states) == 0).all()
    assert rule.should_stop([None, "a"]).stop  # one vote: 4.06 ≥ 1e-9


@pytest.mark.parametrize("name", ["boinf", "boinf:B=3", "boinf:B=10,alpha=0.3", "boinf:B=2.5,alpha=1.5", "boinf:alpha=2"])
def test_names_round_trip(name):
    rule = parse_rule(name)
    assert isinstance(rule, BestOfInfinityRule) and RULES["boinf"] is BestOfInfinityRule
    assert parse_rule(rule.name) == rule and parse_rule(rule.name).name == rule.name
    assert parse_rule("boinf").name == "boinf:B=10,alpha=0.3"
    plan = parse_plan(f"{rule.name}@1x2,2,4,8")
    assert parse_plan(plan.name) == plan


@pytest.mark.parametrize(("text", "match"), [
    ("boinf:B=0", "B must be a positive number"), ("boinf:alpha=-1", "alpha must be a positive number"),
    ("boinf:top=5", "boinf takes B, alpha"), ("boinf:B=x", "must be a number"),
])
def test_errors(text, match):
    with pytest.raises(InputError, match=match):
        parse_rule(text)


def test_every_seen_class_counts():
    # the 6th, 7th, … classes change K and P: no "top five" cut
    rule = BestOfInfinityRule()
    few, many = rule.should_stop(list("aaaabcdef")).prob, rule.should_stop(list("aaaabcdefgh")).prob
    k = np.array([[4, 1, 1, 1, 1, 1, 0, 0], [4, 1, 1, 1, 1, 1, 1, 1]])
    np.testing.assert_allclose([few, many], bayes_factor(k, 0.3), rtol=1e-14)
    assert few != many
    states = VoteStates(counts=k, run=np.zeros(2, np.int64))
    assert stops_unique(parse_rule("boinf:B=4.5"), states).tolist() == parse_rule("boinf:B=4.5").stops(states).tolist()


answer_lists = st.lists(st.one_of(st.none(), st.sampled_from("abcdefghij")), min_size=0, max_size=16)


@settings(max_examples=40, deadline=None)
@given(st.lists(answer_lists, min_size=1, max_size=20), st.sampled_from([1.0, 3.0, 10.0, 30.0]))
def test_stops_unique_equals_stops_and_rows_ignore_the_batch(lists, B):
    states = [vote_state(a)[0] for a in lists]
    w = max(max(s.counts.shape[1] for s in states), 1)
    counts = np.vstack([np.pad(s.counts, ((0, 0), (0, w - s.counts.shape[1]))) for s in states])
    batch = VoteStates(counts=counts, run=np.concatenate([s.run for s in states]))
    rule = BestOfInfinityRule(B=B)
    assert np.array_equal(stops_unique(rule, batch), rule.stops(batch))
    alone = np.concatenate([rule.statistic(s) for s in states])
    assert np.array_equal(rule.statistic(batch), alone)  # bitwise: a decision never flips with batching


BOINF_PLANS = ["boinf:B=3@1x6", "boinf:B=10,alpha=0.3@1x2,2,2", "boinf:B=2,alpha=1@1x5", "boinf:B=30@2,2,3"]


@pytest.mark.parametrize(("codes", "correct"), [
    ([0, 1, 2, 3, 4, 5, 0], [1, 0, 0, 0, 0, 0, 1]),              # six classes: more than five are read
    ([0, 0, 1, 1, 2, -1, 0, 3], [1, 1, 0, 0, 0, 0, 1, 0]),      # n = 8, nulls, singletons
    ([-1, -1, 0, -1, 0, 1, 1], [0, 0, 1, 0, 1, 0, 0]),           # mostly null
])
def test_exact_estimator_equals_all_orders(codes, correct):
    tokens = [float(10 + 7 * i) for i in range(len(codes))]
    check_against_brute(codes, [bool(c) for c in correct], tokens, BOINF_PLANS + [f"boinf:B=5@1x{len(codes)}"])


def test_exact_estimator_equals_monte_carlo_within_standard_errors():
    rng = np.random.default_rng(12)
    codes, correct = random_codes(rng, 60, 16)
    plans = ["boinf:B=3@1x16", "boinf:B=10@1x2,2,4,8", "boinf:B=30@1x12", "boinf:B=10,alpha=1@4x4"]
    exact = estimate_plans(codes, correct, plans)
    mc = estimate_plans(codes, correct, plans, method="monte-carlo", n_orders=300, seed=3)
    assert exact.method == ("exact",) * 4 and mc.method == ("monte-carlo",) * 4
    for name in ("utility", "samples", "waves"):
        e, m, se = getattr(exact, name), getattr(mc, name), getattr(mc, name + "_se")
        z = (m - e) / np.where(se > 0, se, np.inf)
        assert (np.abs(z) > 3).mean() <= 0.02, name
        spread = np.sqrt((se**2).sum(0)) / len(e)
        assert (np.abs((m - e).mean(0)) <= 3 * spread + 1e-12).all(), name


def test_family_and_menus():
    fam = plan_family("boinf")
    assert [p.name for p in fam] == [f"boinf:B={b},alpha=0.3@1x16" for b in (3, 10, 30, 100)]
    assert plan_family("boinf", B=10, alpha=1.0, k_max=4)[0].name == "boinf:B=10,alpha=1@1x4"
    menu = [p.name for p in resolve_plans("boinf", (1, 2, 4, 8, 16))]
    assert menu[:5] == [f"none@{k}" for k in (1, 2, 4, 8, 16)] and "boinf:B=10,alpha=0.3@1x16" in menu
    assert all(n.startswith(("none@", "boinf:")) for n in menu)
    named = [p.name for p in resolve_plans("boinf:B=10,alpha=0.3@1x16,boinf:B=30,alpha=1@1x2,2,4,8", (1, 4))]
    assert named == ["none@1", "none@4", "boinf:B=10,alpha=0.3@1x16", "boinf:B=30,alpha=1@1x2,2,4,8"]
    # the report's rows and the default menus are unchanged: Best-of-∞ there is the reconstruction
    assert "boinf" not in FAMILY_BASELINES and FAMILY_BASELINES["bayes"][0] == "Best-of-∞ Bayes factor"
    assert not any(p.rule.kind == "boinf" for p in default_plans())
    assert not any(n.startswith("boinf") for n in (p.name for p in resolve_plans("default", (1, 2, 4, 8, 16))))


def test_every_vote_type_of_sixteen_samples_is_fast():
    parts = _partitions(16)
    counts = np.array([[*p, *[0] * (16 - len(p))] for p in parts])
    assert len(counts) == 915  # 914 vote types and the empty one
    start = time.perf_counter()
    stat = bayes_factor(counts, 0.3)
    took = time.perf_counter() - start
    assert took < 0.5, took  # ~15 ms here
    assert stat[0] == 0 and np.isfinite(stat[1:]).all() and (stat[1:] > 0).all()
    start = time.perf_counter()
    estimate_plans(*random_codes(np.random.default_rng(0), 200, 16), plan_family("boinf"))
    assert time.perf_counter() - start < 2.0
