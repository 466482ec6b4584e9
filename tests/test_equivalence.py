"""Answer equivalence: pairs that vote together, grading through classes, votes over classes equal brute force,
the gateway's timed vote, the math-verify pool, and the constant-value shortcut checked on real dumps."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isocompute.errors import InputError
from isocompute.solver.estimators import utilities
from isocompute.solver.outcomes import from_records
from isocompute.tasks.answers.equivalence import (
    answer_classes,
    canonical_key,
    classify,
    kind_of,
    vote_classes,
)
from isocompute.tasks.answers.math_forms import math_key, values_differ
from isocompute.tasks.grading import Grader, map_in_process

REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "real"


@pytest.fixture(scope="module")
def grader() -> Iterator[Grader]:
    with Grader(workers=2, timeout=5.0) as g:
        yield g


# ------------------------------------------------------------------------------ pairs that vote together
SAME = [
    ("math", "(3,\\pi/2)", "(3,\\frac{\\pi}{2})"),  # both in the Phi-4 dump: 52 + 23 votes
    ("math", "\\frac12", "0.5"),
    ("math", "\\frac{17}{21}", "17/21"),
    ("math", "1+2\\sqrt{3}", "2\\sqrt{3}+1"),
    ("math", "11(1+\\sqrt{5})", "11+11\\sqrt{5}"),
    ("number", "18", "18.0"),
    ("number", "85.75000000000001", "85.75"),  # a program-of-thought float
    ("number", "1,000", "1000"),
    ("number", "3/4", "0.75"),
    ("date", "5/1/2021", "05/01/2021"),
    ("date", "May 1, 2021", "05/01/2021"),
    ("date", "2021-05-01", "5/1/2021"),
    ("date", "04/22/2021\n'''\n# part 2", "4/22/2021"),  # a dump's result with text after its line
    ("choice", "(b)", "B"),
    ("choice", "B. the second", "B"),
    ("exact", " Tuesday ", "Tuesday"),
]
APART = [
    ("math", "(1,2)", "(2,1)"),
    ("math", "18", "4\\sqrt{2}"),
    ("number", "419.9999", "420"),
    ("number", "eighteen", "18"),
    ("date", "5/1/2021", "5/2/2021"),
    ("choice", "A", "B"),
    ("exact", "Tuesday", "tuesday"),
]


@pytest.mark.parametrize(("kind", "a", "b"), SAME)
def test_equivalent_answers_share_a_class(kind, a, b):
    assert answer_classes([a, b], kind) == [0, 0]
    votes = vote_classes([a, "zzz", b], kind, timeout_s=10.0)
    assert votes.counts == [2, 1] and votes.answer == a and votes.complete


@pytest.mark.parametrize(("kind", "a", "b"), APART)
def test_different_answers_stay_apart(kind, a, b):
    assert answer_classes([a, b], kind) == [0, 1]


def test_classes_are_dense_in_first_appearance_order_and_nulls_have_none():
    assert answer_classes(["5/2/2021", None, "", "5/1/2021", "05/02/2021", "05/01/2021"], "date") == \
        [0, None, None, 1, 0, 1]
    assert answer_classes([None, None], "math") == [None, None]


def test_grading_is_membership_of_the_gold_class():
    res = classify([["(3,\\pi/2)", "", "(3,\\frac{\\pi}{2})", "(0,3)"]], "math",
                   golds=["\\left( 3, \\frac{\\pi}{2} \\right)"])
    assert res.classes == [[0, None, 0, 1]]
    assert res.correct == [[True, False, True, False]]
    assert (res.distinct, res.n_classes, res.gold_unreadable) == ([3], [2], [])


def test_unreadable_gold_is_listed_not_graded():
    res = classify([["18", "19"], ["7"]], "number", golds=["eighteen", "7.0"])
    assert res.gold_unreadable == [0] and res.correct == [None, [True]]
    assert res.classes == [[0, 1], [0]], "classes are still given"


def test_kinds_and_keys():
    assert kind_of("gsm8k") == "number" and kind_of("MATH500") == "math" and kind_of("choice") == "choice"
    assert canonical_key("18.0", "number") == canonical_key("18", "number") == "num:18"
    assert canonical_key("13/40/2021", "date") == "date:13/40/2021", "an impossible date still compares by digits"
    assert canonical_key("not a date", "date") is None
    with pytest.raises(InputError, match="unknown task or answer kind 'poetry'"):
        kind_of("poetry")
    with pytest.raises(InputError, match="classify got 2 records but 1 gold"):
        classify([["1"], ["2"]], "number", golds=["1"])


# ------------------------------------------------------------------------------ pool = in-process
def test_pool_agrees_with_in_process(grader):
    rows = [[a, b, "7", None] for _, a, b in SAME + APART if _ == "math"]
    golds = ["(3,\\frac{\\pi}{2})"] * len(rows)
    local = classify(rows, "math", golds=golds)
    pooled = classify(rows, "math", golds=golds, grader=grader)
    assert (local.classes, local.correct) == (pooled.classes, pooled.correct)
    assert pooled.timed_out == 0 and pooled.complete


def test_a_runaway_parse_times_out_in_the_pool_and_stays_a_string():
    with Grader(workers=1, timeout=1.0) as g:
        start = time.monotonic()
        res = classify([["10^{10^{8}}+1", "10^{10^{8}}+1", "3"]], "math", golds=["3"], grader=g)
    assert time.monotonic() - start < 30
    assert res.classes == [[0, 0, 1]] and res.correct == [[False, False, True]]
    assert res.timed_out >= 1 and not res.complete


def test_map_in_process_skips_items_after_the_deadline():
    result = map_in_process("math_key", ["1", "2"], deadline=time.monotonic() - 1)
    assert result.values == [None, None] and result.timed_out == [0, 1]
    with pytest.raises(InputError, match="map_in_process runs one of"):
        map_in_process("eval", [])


# ------------------------------------------------------------------------------ the gateway's vote
def test_vote_counts_classes_and_breaks_ties_by_first_appearance():
    v = vote_classes(["0.5", None, "7", "\\frac12", "7", "x"], "math", timeout_s=10.0)
    assert v.classes == [0, None, 1, 0, 1, 2]
    assert v.counts == [2, 2, 1] and v.winner == 0 and v.answer == "0.5" and v.first_index == [0, 2, 5]
    assert v.as_dict() == {"0.5": 2, "7": 2, "x": 1} and v.n_valid == 5
    empty = vote_classes([None, ""], "number", timeout_s=1.0)
    assert empty.winner is None and empty.answer is None and empty.counts == []


def test_vote_within_a_spent_time_limit_splits_but_never_joins():
    answers = [f"\\frac{{{i}}}{{{2 * i}}}" for i in range(1000, 1030)]  # all 1/2, none parsed before
    v = vote_classes(answers, "math", timeout_s=1e-6)
    assert not v.complete and v.seconds < 5
    assert len(set(v.classes)) == len(answers), "nothing merged once the time is up"
    assert vote_classes(answers, "math", timeout_s=30.0).counts == [30], "with time, they are one answer"
    with pytest.raises(InputError, match="timeout_s must be > 0"):
        vote_classes(["1"], "math", timeout_s=0)


def test_vote_through_the_pool(grader):
    v = vote_classes(["(3,\\pi/2)", "(0,3)", "(3,\\frac{\\pi}{2})"], "math", timeout_s=30.0, grader=grader)
    assert v.counts == [2, 1] and v.complete


# ------------------------------------------------------------------------------ maj@k over merged classes
def brute_majority_over_classes(classes, correct, k):
    """Plurality over each k-subset's classes; t tied classes share credit 1/t; nulls never vote."""
    total = Fraction(0)
    subsets = list(itertools.combinations(range(len(classes)), k))
    for sub in subsets:
        votes: dict[int, list[int]] = {}
        for i in sub:
            if classes[i] is not None:
                votes.setdefault(classes[i], []).append(i)
        if not votes:
            continue
        top = max(map(len, votes.values()))
        winners = [v for v in votes.values() if len(v) == top]
        for v in winners:
            total += Fraction(sum(correct[i] for i in v), len(v)) / len(winners)
    return total / len(subsets)


POOL = ["\\frac12", "0.5", "1/2", "\\frac{2}{4}", "3", "3.0", "x=3", None, "7"]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.sampled_from(POOL), min_size=1, max_size=7), min_size=1, max_size=4),
       st.sampled_from(["\\frac{1}{2}", "3"]))
def test_majority_over_a_merged_table_equals_brute_force_over_classes(rows, gold):
    res = classify(rows, "math", golds=[gold] * len(rows))
    records = [{"id": f"p{r}", "prompt": "q", "gold": gold,
                "samples": [{"answer": a, "class": c, "correct": ok}
                            for a, c, ok in zip(row, res.classes[r], res.correct[r], strict=True)]}
               for r, row in enumerate(rows)]
    table = from_records(records)
    for r, row in enumerate(rows):
        n = len(row)
        got = utilities(table.subset([r]), list(range(1, n + 1)), "majority")[0]
        want = [float(brute_majority_over_classes(res.classes[r], res.correct[r], k)) for k in range(1, n + 1)]
        np.testing.assert_allclose(got, want, atol=1e-12)


def test_merging_changes_the_vote_where_strings_split_it():
    # 3 correct strings of one class against 2 wrong identical strings: by string "7" wins maj@5.
    row = ["\\frac12", "0.5", "1/2", "7", "7"]
    res = classify([row], "math", golds=["\\frac{1}{2}"])
    merged = from_records([{"id": "p", "prompt": "q", "gold": "1/2", "samples": [
        {"answer": a, "class": c, "correct": ok} for a, c, ok in zip(row, res.classes[0], res.correct[0], strict=True)]}])
    by_string = from_records([{"id": "p", "prompt": "q", "gold": "1/2", "samples": [
        {"answer": a, "correct": ok} for a, ok in zip(row, res.correct[0], strict=True)]}])
    assert utilities(merged, [5], "majority")[0, 0] == 1.0
    assert utilities(by_string, [5], "majority")[0, 0] == 0.0


# ------------------------------------------------------------------------------ the shortcut on real data
@pytest.mark.data
@pytest.mark.slow
def test_values_differ_never_contradicts_math_verify_on_a_real_dump(grader):
    """Values that cannot match (constants far apart, sets or tuples of them) are ruled unequal without
    math-verify; on every such pair of the Qwen3 dump's first 250 problems (answers of one problem and its
    gold), math-verify agrees. (This loop over all three whole dumps: 5,459 such pairs, 428 of them sets
    or tuples, none verified equal.)"""
    path = REAL / "boinf" / "analysis_math500_Qwen3-14B.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} is absent (shared data not mounted)")
    rows = []
    for line in path.read_text().splitlines()[:250]:
        rec = json.loads(line)
        rows.append(list(dict.fromkeys([rec["gold_answer"], *(a for a, _ in rec["all_answers"] if a)])))
    strings = sorted({s for row in rows for s in row})
    keys = dict(zip(strings, grader.map("math_key", strings).values, strict=True))
    pairs = sorted({(a, b) for row in rows for i, a in enumerate(row) for b in row[i + 1:]
                    if keys[a] and keys[b] and keys[a][0] != keys[b][0] and values_differ(keys[a][1], keys[b][1])})
    assert len(pairs) > 250
    verdicts = grader.map("verify", pairs)
    assert not any(verdicts.values), [p for p, v in zip(pairs, verdicts.values, strict=True) if v][:5]


def test_math_key_of_constants_and_expressions():
    key, value = math_key("2\\sqrt{2}")
    assert value == pytest.approx(2 * 2 ** 0.5) and key.startswith("Mul")
    assert math_key("x^2+1")[1] is None and math_key("") is None
    assert not values_differ(0.5, 0.50000001) and values_differ(1, 2) and not values_differ(None, 2)
    assert math_key("3,5,7")[1] == (3, 5, 7) and math_key("(1, x)")[1] is None
    assert values_differ((3, 5, 7), 357) and not values_differ((5,), 5.0) and values_differ((5,), 6)
    assert not values_differ((1, 2), (2, 1)) and values_differ((1, 2), (1, 3)) and not values_differ((1, 2), (1, 2, 3))
