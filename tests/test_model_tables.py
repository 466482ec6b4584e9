"""Tables of several models: the join by id (order, missing prompts, disagreeing texts and golds), classes
aligned across models over the union of answers (the module's worked examples, math-verify for real,
the cache), and the aligned views (class values, partition changes, subsets)."""

import json

import numpy as np
import pytest

from isocompute.errors import InputError
from isocompute.solver.models.tables import check_model_name, join_tables
from isocompute.solver.outcomes import NULL_CODE, from_records
from isocompute.tasks.answers.class_alignment import align_answers


def table(rows, task="arith", source="t"):
    """rows: (id, prompt, gold, [(answer, correct), …])."""
    return from_records([{"id": i, "prompt": p, "gold": g,
                          "samples": [{"answer": a, "correct": c, "completion_tokens": 5} for a, c in s],
                          "meta": {"task": task, "answer_kind": "number"}} for i, p, g, s in rows], source=source)


A = table([("p1", "2+2?", "4", [("4", True), ("4", True), ("5", False)]),
           ("p2", "3+3?", "6", [("6", True), (None, False)])], source="A")
B = table([("p2", "3+3?", "6", [("6.0", True), ("7", False), ("6", True)]),
           ("p1", "2+2?", "4", [("5", False), ("4", True)])], source="B")


def test_join_reorders_to_the_first_table_and_worked_example_alignment():
    mt = join_tables({"A": A, "B": B})
    assert mt.names == ("A", "B") and mt.ids == ["p1", "p2"] and mt.tables["B"].ids == ["p1", "p2"]
    assert not mt.aligned
    # the module docstring's example: B's own codes number 5 first, so they are not comparable to A's
    assert mt.codes["B"][0].tolist() == [0, 1, -2]
    al = align_answers(mt.answers(), mt.kind, golds=mt.golds)
    assert al.classes[0] == [[0, 0, 1], [0, None]] and al.classes[1] == [[1, 0], [0, 1, 0]]
    assert al.correct[1] == [[False, True], [True, False, True]] and al.n_classes == [2, 2]
    mt = mt.with_classes(al.classes)
    assert mt.aligned and mt.codes["B"][0].tolist() == [1, 0, -2] and mt.codes["A"][1].tolist() == [0, NULL_CODE, -2]
    np.testing.assert_array_equal(mt.class_values(), [[1, 0], [1, 0]])
    # B's table has no classes, so its own codes split "6.0" from "6"; the union joins them
    assert mt.mixed_classes() == 0 and mt.partition_changes() == {"A": 0, "B": 1}
    sub = mt.subset([1])
    assert sub.ids == ["p2"] and sub.aligned and sub.codes["B"].tolist() == [[0, 1, 0]]


def test_class_alignment_docstring_example():
    al = align_answers([[["18", "18.0", None]], [["17", "18"]]], "number", golds=["18"])
    assert al.classes == [[[0, 0, None]], [[1, 0]]]
    assert al.correct == [[[True, True, False]], [[False, True]]]


def test_math_classes_across_models_with_math_verify():
    # \frac12 and 0.5 are one answer although each model wrote it its own way
    al = align_answers([[["\\frac{1}{2}", "\\frac{1}{3}"]], [["0.5", "1/3"]]], "math", golds=["\\frac12"])
    assert al.classes == [[[0, 1]], [[0, 1]]] and al.correct == [[[True, False]], [[True, False]]]
    assert al.complete


def test_alignment_cache_round_trip_and_staleness(tmp_path):
    cache = tmp_path / "align.json"
    ans = [[["4", "5"]], [["4.0"]]]
    first = align_answers(ans, "number", golds=["4"], cache=cache)
    assert not first.cached and cache.exists()
    again = align_answers(ans, "number", golds=["4"], cache=cache)
    assert again.cached and again.classes == first.classes and again.fingerprint == first.fingerprint
    other = align_answers([[["4", "6"]], [["4.0"]]], "number", golds=["4"], cache=cache)  # new answers: recompute
    assert not other.cached and json.loads(cache.read_text())["fingerprint"] == other.fingerprint
    cache.write_text("{not json")
    assert not align_answers(ans, "number", golds=["4"], cache=cache).cached


def test_missing_prompts_error_names_counts_examples_and_the_fix():
    C = table([("p1", "2+2?", "4", [("4", True)])], source="C")
    with pytest.raises(InputError, match=r"1 of 2 prompt ids are missing from some table — C lacks 1 \(e.g. 'p2'\)"
                                         r".*missing='drop'"):
        join_tables({"A": A, "C": C})
    mt = join_tables({"A": A, "C": C}, missing="drop")
    assert mt.ids == ["p1"] and len(mt.tables["A"]) == 1


@pytest.mark.parametrize(("other", "kwargs", "match"), [
    (table([("p1", "2+2?", "5", [("4", True)]), ("p2", "3+3?", "6", [("6", True)])]), {},
     r"1 of 2 prompts have a different gold in B than in A \(e.g. 'p1'"),
    (table([("p1", "2 + 2?", "4", [("4", True)]), ("p2", "3+3?", "6", [("6", True)])]), {},
     r"different prompt .* check='gold'"),
    (table([("q1", "x", "4", [("4", True)])]), {"missing": "drop"}, "no prompt id in common"),
    (A, {"missing": "maybe"}, "missing must be"),
    (A, {"check": "all"}, "check must be"),
])
def test_join_errors(other, kwargs, match):
    with pytest.raises(InputError, match=match):
        join_tables({"A": A, "B": other}, **kwargs)


def test_check_levels_and_single_table():
    spaced = table([("p1", "2 + 2?", "4", [("4", True)]), ("p2", "3+3?", "6", [("6", True)])])
    assert join_tables({"A": A, "B": spaced}, check="gold").ids == ["p1", "p2"]
    solo = join_tables({"A": A})
    assert solo.aligned  # one table's own classes are trivially shared


@pytest.mark.parametrize("name", ["", "a b", "x/y", "-lead", "m=1", "a>b"])
def test_bad_model_names(name):
    with pytest.raises(InputError, match="bad model name"):
        check_model_name(name)
    with pytest.raises(InputError, match="bad model name"):
        join_tables({name: A})


def test_with_classes_validation():
    mt = join_tables({"A": A, "B": B})
    good = align_answers(mt.answers(), "number", golds=mt.golds).classes
    with pytest.raises(InputError, match="needs classes for the models"):
        mt.with_classes({"A": good[0]})
    with pytest.raises(InputError, match="2 classes for 3 samples"):
        mt.with_classes([good[0], [[1, 0], [0, 1]]])
    with pytest.raises(InputError, match="None exactly where the answer is null"):
        mt.with_classes([[[0, 0, 1], [0, 1]], good[1]])
    with pytest.raises(InputError, match="align them first"):
        mt.class_values()
    # a union that joins two of a model's own classes is counted
    joined = mt.with_classes([[[0, 0, 0], [0, None]], good[1]])
    assert joined.partition_changes() == {"A": 1, "B": 1} and joined.mixed_classes() == 1


def test_kind_needs_agreeing_meta():
    other = from_records([{"id": "p1", "prompt": "2+2?", "gold": "4", "samples": [{"answer": "4", "correct": True}],
                           "meta": {"task": "gsm8k"}}])
    with pytest.raises(InputError, match="same meta.answer_kind"):
        _ = join_tables({"A": A, "B": other}, missing="drop").kind
