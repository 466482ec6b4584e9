"""Vote aggregation: the docstring's worked example, agreement with a brute-force plurality, invariants."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from isocompute.app.runner.aggregate import best_of, majority_vote


def test_worked_example():
    v = majority_vote(["12", None, "7", "12", "7"])
    assert (v.answer, v.index, v.counts, v.n_valid, v.tied) == ("12", 0, {"12": 2, "7": 2}, 4, True)


def test_no_answer_at_all():
    v = majority_vote([None, None])
    assert (v.answer, v.index, v.counts, v.n_valid) == (None, 0, {}, 0)


answers = st.lists(st.one_of(st.none(), st.sampled_from(["1", "2", "3", "4"])), min_size=1, max_size=12)


@given(answers)
def test_agrees_with_brute_force_plurality(xs):
    valid = [a for a in xs if a is not None]
    v = majority_vote(xs)
    if not valid:
        assert v.answer is None
        return
    # Brute force: every answer's count; the winner has the top count and the earliest first occurrence.
    best = max(set(valid), key=lambda a: (valid.count(a), -xs.index(a)))
    assert v.answer == best and xs[v.index] == best and v.index == xs.index(best)
    assert sum(v.counts.values()) == v.n_valid == len(valid)


@given(answers, st.integers(0, 2**32 - 1))
def test_seeded_ties_are_reproducible_and_among_the_tied(xs, seed):
    a = majority_vote(xs, tie_break="seeded", seed=seed)
    b = majority_vote(list(xs), tie_break="seeded", seed=seed)
    assert a == b
    if a.answer is not None:
        assert a.counts[a.answer] == max(a.counts.values())


def test_best_of_takes_the_first_highest_score():
    v = best_of(["3", None, "5", "5"], [0.2, 0.9, 0.9, 0.1])
    assert (v.answer, v.index, v.counts, v.tied) == (None, 1, {"3": 1, "5": 2}, True)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: majority_vote([]), "at least one sample"),
        (lambda: majority_vote(["1"], tie_break="random"), "tie_break must be"),
        (lambda: best_of(["1", "2"], [0.5]), "one score per sample"),
        (lambda: best_of(["1"], [float("nan")]), "finite"),
    ],
)
def test_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()
