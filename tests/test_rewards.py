"""Compute-aligned reward transforms: hand-worked cases, the exact policy gradient by enumeration on a
softmax policy over a handful of answers, the published pass@k closed form, invariants, errors."""

import itertools
import math
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from isocompute.errors import InputError
from isocompute.training.rewards import (
    Objective,
    answer_codes,
    group_advantages,
    group_metrics,
    rollout_weights,
)

# ------------------------------------------------------------------ independent metric definitions


def f_pass(types, correct, scores, codes):
    return float(any(correct[t] for t in types))


def f_maj(types, correct, scores, codes):
    votes = Counter(codes[t] for t in types if codes[t] >= 0)
    if not votes:
        return 0.0
    top = max(votes.values())
    winners = [a for a, v in votes.items() if v == top]
    # an answer's types all share its correctness here (one type per answer)
    return sum(float(correct[[t for t in range(len(codes)) if codes[t] == a][0]]) for a in winners) / len(winners)


def f_bon(types, correct, scores, codes):
    top = max(scores[t] for t in types)
    chosen = [t for t in types if scores[t] == top]  # one entry per sample: ties broken uniformly
    return sum(float(correct[t]) for t in chosen) / len(chosen)


F = {"pass": f_pass, "maj": f_maj, "bon": f_bon, "mean": f_pass}


def exact_gradient(kind, k, theta, correct, scores, codes):
    """∇_θ M_k(θ) with M_k = Σ over ordered k-tuples of answer types of Π p(y_i) · f(tuple), by autograd."""
    th = torch.tensor(theta, dtype=torch.float64, requires_grad=True)
    p = torch.softmax(th, 0)
    m = torch.zeros((), dtype=torch.float64)
    for tup in itertools.product(range(len(theta)), repeat=k):
        m = m + torch.prod(p[list(tup)]) * F[kind](tup, correct, scores, codes)
    m.backward()
    return th.grad.numpy()


def expected_estimate(kind, k, n, theta, correct, scores, codes, weights):
    """E over all n-tuples of (1/n)·Σ_j A_j ∇log p(y_j) (advantages) or Σ_j w_j ∇log p(y_j) (weights)."""
    A = len(theta)
    p = np.exp(theta - np.max(theta))
    p /= p.sum()
    Y = np.array(list(itertools.product(range(A), repeat=n)))  # (T, n)
    prob = p[Y].prod(axis=1)
    corr = np.asarray(correct)[Y]
    cds = np.asarray(codes)[Y]
    # re-code per group the way a trainer would (codes are only compared within a group)
    sc = np.asarray(scores, dtype=float)[Y]
    obj = Objective(kind, k)
    if weights:
        W = rollout_weights(obj, corr, codes=cds, scores=sc)
    else:
        W = group_advantages(obj, corr, codes=cds, scores=sc) / n
    S = np.zeros((len(Y), A))
    np.add.at(S, (np.repeat(np.arange(len(Y)), n), Y.ravel()), W.ravel())
    grad_logp_sum = S - W.sum(axis=1, keepdims=True) * p[None, :]  # Σ_j W_j (e_{y_j} − p)
    return prob @ grad_logp_sum


policy = st.integers(2, 4).flatmap(
    lambda A: st.tuples(
        st.lists(st.floats(-2, 2), min_size=A, max_size=A),
        st.lists(st.booleans(), min_size=A, max_size=A),
        st.lists(st.sampled_from([0.1, 0.5, 0.9]), min_size=A, max_size=A),
        st.lists(st.booleans(), min_size=A, max_size=A),  # null answer?
    )
)


@pytest.mark.parametrize("kind", ["pass", "maj", "bon"])
@pytest.mark.parametrize("weights", [False, True], ids=["advantages", "no-baseline"])
@settings(max_examples=25, deadline=None)
@given(pol=policy, nk=st.sampled_from([(2, 1), (3, 1), (3, 2), (4, 2), (4, 3), (5, 2), (5, 4)]))
def test_expected_gradient_equals_exact_gradient(kind, weights, pol, nk):
    theta, correct, scores, null = pol
    n, k = nk
    if weights and kind == "pass" and n == 5:
        n, k = 5, 5  # the no-baseline form also covers k = n
    codes = [-1 if z else a for a, z in enumerate(null)]
    if kind == "maj":  # a null answer is never correct
        correct = [c and not z for c, z in zip(correct, null, strict=True)]
    theta = np.array(theta)
    want = exact_gradient(kind, k, theta, correct, scores, codes)
    got = expected_estimate(kind, k, n, theta, correct, scores, codes, weights)
    np.testing.assert_allclose(got, want, atol=1e-10)


@pytest.mark.parametrize("kind", ["pass", "maj", "bon"])
def test_expected_gradient_n6_four_answers(kind):
    theta = np.array([0.3, -0.2, 1.1, -0.7])
    correct, scores, codes = [True, False, False, True], [0.9, 0.9, 0.4, 0.1], [0, 1, 2, -1]
    if kind == "maj":
        correct[3] = False
    for k in (1, 2, 4, 5):
        want = exact_gradient(kind, k, theta, correct, scores, codes)
        got = expected_estimate(kind, k, 6, theta, correct, scores, codes, weights=False)
        np.testing.assert_allclose(got, want, atol=1e-10)
    assert np.abs(want).max() > 1e-3  # the case is not degenerate


# ------------------------------------------------------------------ hand-worked cases


def test_pass_at_2_worked_example():
    # docstring: U = 1/2; U_-0 = 0, U_-j = 2/3 for the wrong ones; A = 4·(U − U_-j)
    adv = group_advantages("pass@2", np.array([[1, 0, 0, 0]]))
    np.testing.assert_allclose(adv, [[2.0, -2 / 3, -2 / 3, -2 / 3]])
    np.testing.assert_allclose(group_advantages("mean", np.array([[1, 0, 0, 0]])), [[1.0, -1 / 3, -1 / 3, -1 / 3]])


def test_maj_at_2_worked_example():
    # answers [a, a, b], a correct. Pairs: {a,a} → 1, {a,b} ×2 → tie 1/2: U = 2/3.
    # Drop an a: {a,b} → 1/2; drop b: {a,a} → 1. A = 3·(2/3 − [1/2, 1/2, 1]) = [1/2, 1/2, −1].
    adv = group_advantages("maj@2", np.array([[1, 1, 0]]), codes=np.array([[0, 0, 1]]))
    np.testing.assert_allclose(adv, [[0.5, 0.5, -1.0]])


def test_bon_at_2_worked_example():
    # scores [0.9, 0.5, 0.1], correct [F, T, T], k = 2: pairs {0,1} → F, {0,2} → F, {1,2} → T: U = 1/3.
    # Drop 0: {1,2} → 1; drop 1: {0,2} → 0; drop 2: {0,1} → 0. A = 3·(1/3 − [1, 0, 0]) = [−2, 1, 1].
    adv = group_advantages("bon@2", np.array([[0, 1, 1]]), scores=np.array([[0.9, 0.5, 0.1]]))
    np.testing.assert_allclose(adv, [[-2.0, 1.0, 1.0]])


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 12), data=st.data())
def test_pass_weights_match_published_closed_form(n, data):
    k = data.draw(st.integers(1, n))
    c = data.draw(st.integers(0, n))
    correct = np.array([[1] * c + [0] * (n - c)])
    w = rollout_weights(Objective("pass", k), correct)[0]
    wrong = (k / n) * (1 - math.comb(n - c - 1, k - 1) / math.comb(n - 1, k - 1)) if c < n else None
    for j in range(n):
        want = k / n if j < c else wrong
        assert w[j] == pytest.approx(want, abs=1e-12)


# ------------------------------------------------------------------ invariants


groups = st.integers(2, 7).flatmap(
    lambda n: st.tuples(
        st.just(n),
        st.lists(st.tuples(st.booleans(), st.integers(-1, 3), st.sampled_from([0.0, 0.3, 0.7])),
                 min_size=n, max_size=n),
    )
)


@settings(max_examples=80, deadline=None)
@given(g=groups, kind=st.sampled_from(["pass", "maj", "bon"]), data=st.data())
def test_advantages_sum_to_zero_and_vanish_on_constant_groups(g, kind, data):
    n, rows = g
    k = data.draw(st.integers(1, n - 1))
    correct = np.array([[r[0] for r in rows]])
    codes = np.array([[r[1] for r in rows]])
    correct = correct & (codes >= 0) if kind == "maj" else correct
    scores = np.array([[r[2] for r in rows]])
    adv = group_advantages(Objective(kind, k), correct, codes=codes, scores=scores)
    assert abs(adv.sum()) < 1e-9  # GRPO's group-mean subtraction leaves it unchanged
    for const in (np.ones_like(correct), np.zeros_like(correct)):
        cc = np.where(codes >= 0, 0, -1) if kind == "maj" else codes  # one answer (and nulls)
        if kind == "maj" and const.all():
            cc = np.zeros_like(codes)
        adv0 = group_advantages(Objective(kind, k), const, codes=cc, scores=scores)
        np.testing.assert_allclose(adv0, 0.0, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 9), data=st.data())
def test_k1_reproduces_grpo(n, data):
    r = np.array([data.draw(st.lists(st.booleans(), min_size=n, max_size=n))], dtype=float)
    grpo = r - r.mean(axis=1, keepdims=True)  # Dr. GRPO: centred, no std scaling
    codes = np.arange(n)[None, :]  # every answer distinct: maj@1 reads one sample
    scores = np.linspace(0, 1, n)[None, :]
    for kind in ("mean", "pass", "maj", "bon"):
        adv = group_advantages(Objective(kind, 1), r.astype(bool), codes=codes, scores=scores)
        np.testing.assert_allclose(adv, n / (n - 1) * grpo, atol=1e-12)


def test_larger_k_rewards_rare_successes_more():
    correct = np.array([[1, 0, 0, 0, 0, 0, 0, 0]])
    a = [group_advantages(Objective("pass", k), correct)[0, 0] for k in (1, 2, 4, 7)]
    assert a == sorted(a) and a[0] < a[-1]


def test_groups_are_independent_rows():
    correct = np.array([[1, 0, 0], [1, 1, 0], [0, 0, 0]])
    codes = np.array([[0, 1, 1], [0, 0, 1], [0, 1, 2]])
    both = group_advantages("maj@2", correct, codes=codes)
    for g in range(3):
        np.testing.assert_allclose(both[g], group_advantages("maj@2", correct[g:g + 1], codes=codes[g:g + 1])[0])


# ------------------------------------------------------------------ helpers and errors


def test_answer_codes_and_metrics():
    codes = answer_codes([["3", None, "3", "4"], ["1", "1", "1", "1"]])
    assert codes.tolist() == [[0, -1, 0, 1], [0, 0, 0, 0]]
    m = group_metrics(np.array([[1, 0, 1, 0], [0, 0, 0, 0]]), codes, k=2)
    # group 1: pass@2 = 1 − C(2,2)/C(4,2) = 5/6; maj@2: pairs {3,3} → 1, {3,4} ×2 → 1/2, {3,∅} ×2 → 1,
    # {∅,4} → 0: (1 + 1 + 2)/6 = 2/3. group 2 scores 0.
    assert m.correct == pytest.approx(0.25)
    assert m.pass_at_k == pytest.approx(5 / 12)
    assert m.maj_at_k == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: Objective.parse("maj8"), "cannot read objective"),
        (lambda: Objective.parse("top@3"), "cannot read objective"),
        (lambda: Objective("mean", 2), "k = 1 for 'mean'"),
        (lambda: Objective("pass", 0), "needs k ≥ 1"),
        (lambda: Objective("best", 2), "unknown objective kind"),
        (lambda: group_advantages("pass@4", np.ones((2, 4))), "at least 5 rollouts"),
        (lambda: group_advantages("maj@2", np.ones((1, 4))), "maj@k needs"),
        (lambda: group_advantages("bon@2", np.ones((1, 4))), "bon@k needs"),
        (lambda: group_advantages("pass@2", np.ones(4)), r"\(groups, n\) array"),
        (lambda: group_advantages("pass@2", np.full((1, 4), 0.5)), "must be 0/1"),
        (lambda: group_advantages("maj@2", np.ones((1, 4)), codes=np.zeros((1, 3))), "codes has shape"),
        (lambda: rollout_weights("pass@5", np.ones((1, 4))), "at least k=5"),
        (lambda: answer_codes([["1"], ["1", "2"]]), "same number of answers"),
    ],
)
def test_errors(call, match):
    with pytest.raises(InputError, match=match):
        call()
