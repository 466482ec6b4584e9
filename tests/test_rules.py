"""Stopping rules: hand-worked votes, closed forms against quadrature and Dirichlet draws, invariants
(labels and, except for the window, order do not matter; nulls never vote), names and errors."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate
from scipy.stats import beta

from isocompute.errors import InputError
from isocompute.solver.plans.dirichlet import leader_max_prob
from isocompute.solver.plans.rules import (
    RULES,
    BayesFactorRule,
    BetaRule,
    DirichletRule,
    LeadRule,
    VoteStates,
    WindowRule,
    parse_rule,
    stops_unique,
    vote_state,
)

ALL = ["none", "lead:m=2", "window:w=2", "beta:p=0.9", "dirichlet:p=0.9,top=4", "bayes:B=5,alpha=0.5,top=4",
       "boinf:B=5,alpha=0.5"]


def test_hand_worked_votes():
    answers = ["a", "a", "b", "a"]  # counts (3, 1), the last two differ
    lead = LeadRule(2).should_stop(answers)
    assert lead.stop and lead.most_common == "a" and lead.prob == 2
    win = WindowRule(2).should_stop(answers)
    assert not win.stop and win.prob == 1
    b = BetaRule(0.9).should_stop(answers)
    assert not b.stop and b.prob == pytest.approx(0.8125)  # P(Beta(4, 2) > 1/2) = 13/16
    assert BetaRule(0.8).should_stop(answers).stop
    assert WindowRule(3).should_stop(["b", "a", "a", "a"]).stop


def test_beta_equals_adaptive_consistency_quadrature():
    # Adaptive-Consistency integrates x^a (1-x)^b over [1/2, 1] and divides by the full integral
    for a, b in [(0, 0), (1, 0), (3, 1), (5, 4), (12, 3)]:
        f = lambda x, a=a, b=b: x**a * (1 - x) ** b  # noqa: E731
        want = integrate.quad(f, 0.5, 1)[0] / integrate.quad(f, 0, 1)[0]
        got = BetaRule(0.9).statistic(VoteStates(np.array([[a, b]]), np.array([0])))[0]
        assert got == pytest.approx(want, rel=1e-10)


def test_leader_max_prob_two_classes_is_the_beta_tail():
    a1, a2 = np.array([1, 3, 5, 9, 2]), np.array([[1], [2], [5], [4], [7]])
    np.testing.assert_allclose(leader_max_prob(a1, a2), beta.sf(0.5, a1, a2[:, 0]), rtol=1e-13)
    assert leader_max_prob([3], [[2]])[0] == pytest.approx(11 / 16)  # the module's worked example


@pytest.mark.parametrize(("lead", "others", "alpha"), [
    (5, [3, 2, 1], None), (4, [4, 1, 0], 0.3), (2, [1, 1, 1, 1], 1.0), (7, [2], 0.5), (1, [0], 0.3), (6, [5, 5, 5], None),
])
def test_leader_max_prob_matches_dirichlet_draws(lead, others, alpha):
    rng = np.random.default_rng(0)
    shapes = [lead] + [o for o in others if o] + ([alpha] if alpha else [])
    x = rng.dirichlet(shapes, size=400_000)
    mc = (x[:, 0] > x[:, 1:].max(axis=1)).mean() if x.shape[1] > 1 else 1.0
    got = leader_max_prob([lead], [others], alpha)[0]
    assert got == pytest.approx(mc, abs=4 * math.sqrt(0.25 / x.shape[0]))


def test_leader_max_prob_rows_do_not_depend_on_the_batch():
    rng = np.random.default_rng(1)
    lead = rng.integers(1, 12, 40)
    others = np.where(rng.random((40, 4)) < 0.3, 0, rng.integers(1, 12, (40, 4)))
    batch = leader_max_prob(lead, others, 0.3)
    alone = np.array([leader_max_prob(lead[i:i + 1], others[i:i + 1], 0.3)[0] for i in range(40)])
    assert np.array_equal(batch, alone)  # bitwise: a threshold decision never flips with batching


def test_bayes_single_class_closed_form():
    # one class of c votes, alpha = 1: P(Beta(c, 1) > 1/2) = 1 - 2^-c, odds 2^c - 1
    for c in (1, 3, 6):
        d = BayesFactorRule(B=7, alpha=1.0).should_stop(["x"] * c)
        assert d.prob == pytest.approx(2.0**c - 1) and d.stop == (c >= 3)


def test_dirichlet_falls_back_to_beta_below_three_classes():
    for answers in (["a"] * 4, ["a", "b", "a"], ["a", "a", "b", "b", "b"]):
        assert DirichletRule(0.9).should_stop(answers).prob == BetaRule(0.9).should_stop(answers).prob
    three = DirichletRule(0.9).should_stop(list("aaaabc"))
    assert three.prob == pytest.approx(leader_max_prob([5], [[2, 2]])[0])


@pytest.mark.parametrize("name", ALL)
def test_nulls_never_vote(name):
    rule = parse_rule(name)
    d = rule.should_stop([None, None, None])
    assert not d.stop and d.most_common is None
    with_nulls = rule.should_stop(["a", None, "a", None, "a"])
    assert with_nulls.most_common == "a"
    if name.startswith("window"):
        assert not with_nulls.stop  # a null ends the run
    else:
        assert with_nulls.stop == rule.should_stop(["a", "a", "a"]).stop


answer_lists = st.lists(st.one_of(st.none(), st.sampled_from("abcd")), min_size=1, max_size=12)


@settings(max_examples=80, deadline=None)
@given(answer_lists, st.permutations("abcd"), st.randoms(use_true_random=False))
def test_labels_and_order_do_not_matter(answers, perm, rnd):
    relabel = dict(zip("abcd", perm, strict=True))
    shuffled = list(answers)
    rnd.shuffle(shuffled)
    for name in ALL:
        rule = parse_rule(name)
        d = rule.should_stop(answers)
        assert rule.should_stop([relabel.get(a) for a in answers]).stop == d.stop
        if not rule.uses_run:
            assert rule.should_stop(shuffled).stop == d.stop


@settings(max_examples=40, deadline=None)
@given(st.lists(answer_lists, min_size=1, max_size=20))
def test_stops_unique_equals_stops(lists):
    states = [vote_state(a)[0] for a in lists]
    w = max(s.counts.shape[1] for s in states)
    counts = np.vstack([np.pad(s.counts, ((0, 0), (0, w - s.counts.shape[1]))) for s in states])
    batch = VoteStates(counts=counts, run=np.concatenate([s.run for s in states]))
    for name in ALL:
        rule = parse_rule(name)
        assert np.array_equal(stops_unique(rule, batch), rule.stops(batch))


@pytest.mark.parametrize("name", ALL + ["lead:m=5", "beta:p=0.975", "bayes:B=0.5,alpha=2,top=2"])
def test_names_round_trip(name):
    rule = parse_rule(name)
    assert parse_rule(rule.name) == rule and parse_rule(rule.name).name == rule.name
    assert rule.kind in RULES


def test_omitted_parameters_take_defaults():
    assert parse_rule("bayes").name == "bayes:B=10,alpha=0.3,top=5"
    assert parse_rule("dirichlet:p=0.8").name == "dirichlet:p=0.8,top=5"


@pytest.mark.parametrize(("text", "match"), [
    ("vote", r"unknown stopping rule 'vote'.*kinds: none, lead"),
    ("lead:m=0", "m must be an integer >= 1"),
    ("lead:m=1.5", "must be a number"),
    ("lead:q=2", "lead takes m"),
    ("window:w", "bad parameter 'w'"),
    ("beta:p=0.5", r"probability in \(0.5, 1\)"),
    ("dirichlet:p=1", r"probability in \(0.5, 1\)"),
    ("dirichlet:top=1", "top must be an integer >= 2"),
    ("bayes:B=-3", "B must be a positive number"),
    ("bayes:alpha=inf", "alpha must be a positive number"),
])
def test_errors(text, match):
    with pytest.raises(InputError, match=match):
        parse_rule(text)
