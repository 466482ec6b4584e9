"""Exact k-sample estimators: hand-worked cases, brute force over all k-subsets, invariants, errors."""

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isocompute.errors import InputError
from isocompute.solver.estimators import STRATEGIES, best_of_k, majority_at_k, pass_at_k, utilities
from isocompute.solver.outcomes import PAD_CODE, from_records

# ------------------------------------------------------------------ brute force (exact fractions)


def brute_majority(codes, correct, k):
    tot = Fraction(0)
    subsets = list(itertools.combinations(range(len(codes)), k))
    for s in subsets:
        votes = {}
        for i in s:
            if codes[i] >= 0:
                votes.setdefault(codes[i], []).append(i)
        if not votes:
            continue
        top = max(map(len, votes.values()))
        winners = [v for v in votes.values() if len(v) == top]
        for v in winners:  # the answer's samples in the subset; one of them is reported
            tot += Fraction(sum(bool(correct[i]) for i in v), len(v)) / len(winners)
    return tot / len(subsets)


def brute_best_of(scores, correct, k):
    tot = Fraction(0)
    subsets = list(itertools.combinations(range(len(scores)), k))
    for s in subsets:
        top = max(scores[i] for i in s)
        tied = [i for i in s if scores[i] == top]
        tot += Fraction(sum(bool(correct[i]) for i in tied), len(tied))
    return tot / len(subsets)


def brute_pass(correct, k):
    subsets = list(itertools.combinations(range(len(correct)), k))
    return Fraction(sum(any(correct[i] for i in s) for s in subsets), len(subsets))


def multinomial_majority(m, c, nulls, k):
    """Independent exact maj@k for larger n: enumerate the subset's count per answer group
    (multivariate hypergeometric) instead of the subsets themselves."""
    n = sum(m) + nulls
    tot = Fraction(0)
    for xs in itertools.product(*[range(min(mg, k) + 1) for mg in m]):
        rest = k - sum(xs)
        if rest < 0 or rest > nulls or max(xs) == 0:
            continue
        ways = math.comb(nulls, rest) * math.prod(math.comb(mg, x) for mg, x in zip(m, xs, strict=True))
        top = max(xs)
        win = [g for g, x in enumerate(xs) if x == top]
        tot += ways * sum(Fraction(c[g], m[g]) for g in win) / len(win)
    return tot / math.comb(n, k)


# ------------------------------------------------------------------ hand-worked cases


def test_hand_worked_majority_with_tie():
    # answers a a b b c, a correct, k = 4: drop an a -> b wins (0, x2); drop a b -> a wins (1, x2);
    # drop c -> a and b tie (1/2). U = 2.5 / 5.
    assert majority_at_k([0, 0, 1, 1, 2], [True, True, False, False, False], 4) == pytest.approx(0.5)


def test_hand_worked_majority_nulls_never_win():
    # [a, null, null], a correct, k = 2: {a,null} x2 -> a wins; {null,null} -> nobody: 2/3.
    assert majority_at_k([0, -1, -1], [True, False, False], 2) == pytest.approx(2 / 3)
    # a null marked correct still never scores
    assert majority_at_k([-1, -1], [True, True], 1) == 0.0


def test_hand_worked_best_of():
    # scores .9 .5 .5 .1, correct F T F T, k = 2: max is .5 in 3 of 6 pairs, then a coin flip
    # between the two .5 samples (one correct): 3/6 * 1/2.
    assert best_of_k([0.9, 0.5, 0.5, 0.1], [False, True, False, True], 2) == pytest.approx(0.25)


def test_hand_worked_pass():
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    np.testing.assert_allclose(pass_at_k([5, 5, 3], [0, 5, 1], [1, 3]), [[0, 0], [1, 1], [1 / 3, 1]])


# ------------------------------------------------------------------ agreement with brute force

rows = st.integers(1, 10).flatmap(lambda n: st.tuples(
    st.lists(st.integers(-1, 3), min_size=n, max_size=n),       # answer codes, -1 = null
    st.lists(st.booleans(), min_size=n, max_size=n),            # correct
    st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=n, max_size=n),  # scores with ties
))


@settings(max_examples=150, deadline=None)
@given(rows, st.booleans())
def test_majority_equals_brute_force(row, consistent):
    codes, correct, _ = row
    if consistent:  # the usual case: one answer string is the correct one
        correct = [c == 0 for c in codes]
    ks = list(range(1, len(codes) + 1))
    got = majority_at_k(codes, correct, ks)
    want = [float(brute_majority(codes, correct, k)) for k in ks]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


@settings(max_examples=150, deadline=None)
@given(rows)
def test_best_of_equals_brute_force(row):
    _, correct, scores = row
    ks = list(range(1, len(scores) + 1))
    got = best_of_k(scores, correct, ks)
    np.testing.assert_allclose(got, [float(brute_best_of(scores, correct, k)) for k in ks], atol=1e-12)


@settings(max_examples=100, deadline=None)
@given(rows)
def test_pass_equals_brute_force(row):
    _, correct, _ = row
    ks = list(range(1, len(correct) + 1))
    got = pass_at_k(len(correct), sum(correct), ks)
    np.testing.assert_allclose(got, [float(brute_pass(correct, k)) for k in ks], atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_majority_large_n_equals_count_enumeration(seed):
    # n = 48, k up to 16: too many subsets to list, so compare with an enumeration of group counts.
    rng = np.random.default_rng(seed)
    m = [int(x) for x in rng.multinomial(44, rng.dirichlet(np.ones(4)))]
    c = [m[0], 0, 0, m[3] // 2]  # group 3 graded inconsistently: half its samples correct
    nulls = 4
    codes = np.repeat(np.r_[0:4, -1], m + [nulls])
    correct = np.concatenate([np.ones(c[g], bool).tolist() + [False] * (m[g] - c[g]) for g in range(4)]
                             + [[False] * nulls]).astype(bool)
    perm = rng.permutation(48)
    ks = [1, 2, 4, 8, 16]
    got = majority_at_k(codes[perm], correct[perm], ks)
    want = [float(multinomial_majority(m, c, nulls, k)) for k in ks]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_batch_with_ragged_rows_equals_row_by_row():
    rng = np.random.default_rng(7)
    lengths = [3, 10, 7, 10, 5]
    codes = np.full((5, 10), PAD_CODE)
    correct = np.zeros((5, 10), bool)
    scores = np.full((5, 10), np.nan)
    for i, n in enumerate(lengths):
        codes[i, :n] = rng.integers(-1, 3, n)
        correct[i, :n] = codes[i, :n] == 0
        scores[i, :n] = rng.integers(0, 3, n)
    ks = [1, 2, 3]
    maj = majority_at_k(codes, correct, ks)
    best = best_of_k(scores, correct, ks, mask=codes != PAD_CODE)
    for i, n in enumerate(lengths):
        np.testing.assert_allclose(maj[i], majority_at_k(codes[i, :n], correct[i, :n], ks), atol=1e-14)
        np.testing.assert_allclose(best[i], best_of_k(scores[i, :n], correct[i, :n], ks), atol=1e-14)


# ------------------------------------------------------------------ invariants


def random_table(n_prompts=40, n=12, seed=0):
    rng = np.random.default_rng(seed)
    recs = []
    for i in range(n_prompts):
        p = rng.random()
        samples = []
        for _ in range(n):
            r = rng.random()
            ans = None if r < 0.1 else ("7" if r < 0.1 + 0.9 * p else str(rng.integers(1, 4)))
            samples.append({"answer": ans, "correct": ans == "7", "score": float(rng.integers(0, 5))})
        recs.append({"id": f"p{i}", "prompt": "q", "gold": "7", "samples": samples})
    return from_records(recs)


def test_maj1_is_mean_correctness_with_nulls_wrong():
    t = random_table()
    voting = t.answer_codes >= 0
    want = (t.correct & voting).sum(1) / t.n_samples
    np.testing.assert_allclose(utilities(t, [1], "majority")[:, 0], want, atol=1e-14)
    np.testing.assert_allclose(utilities(t, [1], "best_of")[:, 0], t.n_correct / t.n_samples, atol=1e-14)


def test_pass_monotone_and_dominates_other_strategies():
    t = random_table(seed=3)
    ks = list(range(1, t.n_max + 1))
    u_pass = utilities(t, ks, "pass")
    assert (np.diff(u_pass, axis=1) >= -1e-15).all()
    for strategy in ("majority", "best_of"):  # every subset's credit is <= "some sample correct"
        assert (utilities(t, ks, strategy) <= u_pass + 1e-12).all()
    u = utilities(t, ks, "majority")
    assert ((u >= 0) & (u <= 1)).all()


def test_best_of_full_subset_picks_top_score():
    rng = np.random.default_rng(1)
    scores = rng.permutation(48).astype(float)[None]
    correct = rng.random((1, 48)) < 0.5
    assert best_of_k(scores, correct, 48)[0] == correct[0, np.argmax(scores)]


def test_inputs_not_mutated():
    t = random_table(seed=5)
    before = (t.answer_codes.copy(), t.correct.copy(), t.scores.copy())
    for s in STRATEGIES:
        utilities(t, [1, 4], s)
    for a, b in zip(before, (t.answer_codes, t.correct, t.scores), strict=True):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------ errors


def _table(scores=True):
    s = {"answer": "1", "correct": True, **({"score": 0.5} if scores else {})}
    return from_records([{"id": "a", "prompt": "q", "gold": "1", "samples": [s, s, s, s]},
                         {"id": "b", "prompt": "q", "gold": "1", "samples": [s, s]}])


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: utilities(_table(), [1, 4], "majority"), r"only 2 samples per prompt for prompt 'b'.*Feasible actions: \[1\]"),
        (lambda: utilities(_table(), [1], "vote"), r"unknown strategy 'vote'; valid strategies: pass, majority, best_of"),
        (lambda: utilities(_table(scores=False), [1], "best_of"), r"prompt 'a'.*without 'score'"),
        (lambda: utilities(_table(), [0, 1], "pass"), "positive integers"),
        (lambda: utilities(_table(), [1.5], "pass"), "positive integers"),
        (lambda: utilities(_table(), [], "pass"), "positive integers"),
        (lambda: pass_at_k(3, 4, 1), "0 <= c <= n"),
        (lambda: pass_at_k(3, 1, 4), "use k <= 3"),
        (lambda: majority_at_k([0, 1], [True, False], 3), "use k <= 2"),
        (lambda: best_of_k([0.1, np.nan], [True, False], 1), "verifier score on every sample"),
    ],
)
def test_errors(call, match):
    with pytest.raises(InputError, match=match):
        call()
