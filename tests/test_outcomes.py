"""Outcome tables: reading, validation errors, vectorised views, subsets and the resumable writer."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isocompute.artifacts import sha256_file
from isocompute.errors import InputError
from isocompute.solver.outcomes import (
    NULL_CODE,
    PAD_CODE,
    OutcomeRecord,
    OutcomeWriter,
    Sample,
    completed_ids,
    from_records,
    read_outcomes,
    record_to_json,
)


def rec(rid="p0", samples=None, **extra):
    samples = samples if samples is not None else [{"answer": "18", "correct": True}]
    return {"id": rid, "prompt": "What is 9+9?", "gold": "18", "samples": samples, **extra}


def write_lines(path, objs):
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs))
    return path


def test_views_of_a_ragged_table(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", [
        rec("a", [{"answer": "18", "correct": True, "completion_tokens": 10, "score": 0.5},
                  {"answer": "17", "correct": False, "completion_tokens": 30, "score": 0.1},
                  {"answer": None, "correct": False, "completion_tokens": 20, "score": 0.2},
                  {"answer": "18", "correct": True, "completion_tokens": 40, "score": 0.9}],
            prompt_tokens=91, meta={"task": "gsm8k", "temperature": 0.7}),
        "",  # blank lines are skipped
        rec("b", [{"answer": 3, "correct": False}, {"answer": "3", "correct": False}],
            meta={"task": "gsm8k", "temperature": 1.0}),
    ])
    t = read_outcomes(path)
    assert t.ids == ["a", "b"] and len(t) == 2 and t.n_max == 4 and t.is_ragged
    np.testing.assert_array_equal(t.n_samples, [4, 2])
    np.testing.assert_array_equal(t.mask, [[1, 1, 1, 1], [1, 1, 0, 0]])
    np.testing.assert_array_equal(t.correct, [[1, 0, 0, 1], [0, 0, 0, 0]])
    np.testing.assert_array_equal(t.n_correct, [2, 0])
    c = t.answer_codes
    assert c[0, 0] == c[0, 3] != c[0, 1] and c[0, 2] == NULL_CODE
    assert c[1, 0] == c[1, 1] == 0, "a JSON number answer is read as its string"
    assert (c[1, 2:] == PAD_CODE).all()
    np.testing.assert_array_equal(t.scores[0], [0.5, 0.1, 0.2, 0.9])
    assert np.isnan(t.scores[1]).all() and not t.has_scores
    np.testing.assert_allclose(t.mean_completion_tokens, [25.0, np.nan])
    assert t.prompt_tokens[0] == 91 and np.isnan(t.prompt_tokens[1]) and not t.has_token_counts
    assert t.meta == {"task": "gsm8k"}, "table meta keeps only what every record shares"
    assert t.metas[1]["temperature"] == 1.0
    assert t.sha256 == sha256_file(path) and t.source == str(path)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.one_of(st.none(), st.sampled_from(["1", "2", "x", "1.0"])), min_size=1, max_size=8),
                min_size=1, max_size=6))
def test_answer_codes_factorise_each_row(answer_rows):
    t = from_records([rec(f"p{i}", [{"answer": a, "correct": False} for a in row])
                      for i, row in enumerate(answer_rows)])
    for i, row in enumerate(answer_rows):
        codes = t.answer_codes[i, : len(row)]
        distinct = {a for a in row if a is not None}
        assert set(codes[codes >= 0]) == set(range(len(distinct))), "codes are dense per row"
        for j, a in enumerate(row):
            assert (codes[j] == NULL_CODE) == (a is None)
            for m, b in enumerate(row):
                if a is not None and b is not None:
                    assert (codes[j] == codes[m]) == (a == b)
        assert (t.answer_codes[i, len(row):] == PAD_CODE).all()


def test_subset_keeps_rows_order_and_checksum(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", [
        rec("a", [{"answer": "1", "correct": True}] * 3),
        rec("b", [{"answer": "2", "correct": False}]),
        rec("c", [{"answer": "3", "correct": True}, {"answer": None, "correct": False}]),
    ])
    t = read_outcomes(path)
    s = t.subset([2, 1])
    assert s.ids == ["c", "b"] and s.n_max == 2 and s.sha256 == t.sha256
    np.testing.assert_array_equal(s.correct, [[1, 0], [0, 0]])
    np.testing.assert_array_equal(s.answer_codes, [[0, NULL_CODE], [0, PAD_CODE]])
    assert t.subset(np.array([True, False, True])).ids == ["a", "c"]
    with pytest.raises(InputError, match="at least one row"):
        t.subset([])


def test_from_records_accepts_dataclasses_and_matches_json_roundtrip(tmp_path):
    r = OutcomeRecord("x-1", "p", "4", (Sample("4", True, 12, 0.3), Sample(None, False)), prompt_tokens=5,
                      meta={"task": "arith"})
    line = record_to_json(r)
    assert json.loads(line) == {"id": "x-1", "prompt": "p", "gold": "4", "prompt_tokens": 5,
                                "samples": [{"answer": "4", "correct": True, "completion_tokens": 12, "score": 0.3},
                                            {"answer": None, "correct": False}],
                                "meta": {"task": "arith"}}
    a = from_records([r])
    b = read_outcomes(write_lines(tmp_path / "t.jsonl", [line]))
    for name in ("correct", "answer_codes", "n_samples", "mask"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    np.testing.assert_array_equal(a.scores, b.scores)


def test_classes_drive_answer_codes_and_roundtrip(tmp_path):
    r = OutcomeRecord("m-0", "p", "1/2", (Sample("\\frac12", True, answer_class=0), Sample(None, False),
                                          Sample("0.5", True, answer_class=0), Sample("7", False, answer_class=1)))
    line = record_to_json(r)
    assert [s.get("class", "absent") for s in json.loads(line)["samples"]] == [0, None, 0, 1]
    old = rec("s", [{"answer": "\\frac12", "correct": True}, {"answer": "0.5", "correct": True}])
    t = read_outcomes(write_lines(tmp_path / "t.jsonl", [line, old]))
    np.testing.assert_array_equal(t.answer_codes, [[0, NULL_CODE, 0, 1], [0, 1, PAD_CODE, PAD_CODE]])
    assert t.records[0]["samples"][2]["class"] == 0
    # a record without classes keeps today's string codes, so tables written before classes read as before
    no_class = OutcomeRecord("x", "p", "1", (Sample("1", True), Sample(None, False)))
    assert "class" not in record_to_json(no_class)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.one_of(st.none(), st.sampled_from(["1", "2", "x", "1.0"])), min_size=1, max_size=8),
                min_size=1, max_size=6))
def test_answer_codes_are_the_given_classes(answer_rows):
    """Classes that merge "1" with "1.0" replace the string codes exactly."""
    records = []
    for i, row in enumerate(answer_rows):
        dense: dict[str, int] = {}
        samples = [{"answer": a, "class": None if a is None else dense.setdefault(a.replace(".0", ""), len(dense)),
                    "correct": False} for a in row]
        records.append(rec(f"p{i}", samples))
    t = from_records(records)
    for i, r in enumerate(records):
        want = [NULL_CODE if s["class"] is None else s["class"] for s in r["samples"]]
        np.testing.assert_array_equal(t.answer_codes[i, :len(want)], want)


def test_writer_resumes_after_a_truncated_line(tmp_path):
    path = tmp_path / "runs" / "out.jsonl"
    with OutcomeWriter(path) as w:
        assert w.completed == set()
        w.write(rec("a"))
        w.write(OutcomeRecord("b", "p", "1", (Sample("1", True),)))
    with path.open("a") as f:  # a run killed in the middle of writing "c"
        f.write(json.dumps(rec("c"))[:25])
    assert completed_ids(path) == {"a", "b"}, "a line without its newline is not finished"
    with pytest.raises(InputError, match="line 3: bad JSON.*interrupted"):
        read_outcomes(path)
    with OutcomeWriter(path) as w:
        assert w.completed == {"a", "b"}
        with pytest.raises(InputError, match="already holds a record with id 'a'"):
            w.write(rec("a"))
        w.write(rec("c"))
    assert read_outcomes(path).ids == ["a", "b", "c"]
    assert completed_ids(tmp_path / "missing.jsonl") == set()


def test_writer_flushes_each_line(tmp_path):
    path = tmp_path / "out.jsonl"
    with OutcomeWriter(path) as w:
        w.write(rec("a"))
        assert completed_ids(path) == {"a"}, "a finished prompt is on disk before the writer closes"


def test_writer_refuses_an_invalid_record_and_a_damaged_file(tmp_path):
    with OutcomeWriter(tmp_path / "out.jsonl") as w:
        with pytest.raises(InputError, match=r"samples\[0\].correct must be true or false"):
            w.write(rec("a", [{"answer": "1", "correct": 1}]))
    damaged = write_lines(tmp_path / "damaged.jsonl", [rec("a"), "{not json", rec("b")])
    with pytest.raises(InputError, match="line 2: a complete line that is not an outcome record"):
        completed_ids(damaged)


S = {"answer": "1", "correct": True}


@pytest.mark.parametrize(
    ("lines", "match"),
    [
        (['{"id": "a", '], r"line 1: bad JSON"),
        ([rec("a"), '{"id": "b" "prompt": 1}'], r"t\.jsonl, line 2: bad JSON: Expecting ',' delimiter"),
        ([[1, 2]], r"line 1: expected a JSON object, got list"),
        ([{"prompt": "p", "gold": "1", "samples": [S]}], r"line 1: missing id"),
        ([rec("")], r"line 1: id must be a non-empty string"),
        ([{"id": "a", "gold": "1", "samples": [S]}], r"line 1: missing 'prompt'"),
        ([{"id": "a", "prompt": "p", "gold": "1"}], r"line 1: missing 'samples'"),
        ([rec("a", [])], r"line 1: empty samples"),
        ([rec("a", {"answer": "1"})], r"line 1: samples must be a list"),
        ([rec("a"), rec("b", [S, "x"])], r"line 2: samples\[1\] must be an object"),
        ([rec("a", [S, {"answer": "1", "correct": 1}])], r"line 1: samples\[1\].correct must be true or false, got 1"),
        ([rec("a", [{"correct": True}])], r"line 1: samples\[0\] is missing 'answer' \(null when none"),
        ([rec("a", [S, S, {"answer": "1", "correct": "yes"}])], r"line 1: samples\[2\].correct must be true or false, got 'yes'"),
        ([rec("a", [{"answer": ["1"], "correct": True}])], r"samples\[0\].answer must be a string or null"),
        ([rec("a", [{**S, "score": "high"}])], r"samples\[0\].score must be a number"),
        ([rec("a"), rec("b", [S, {**S, "score": float("inf")}])], r"line 2: samples\[1\].score must be a finite"),
        # json.dumps writes NaN and json.loads reads it back: the reader must not take it for "no score"
        ([rec("a"), rec("b", [{**S, "score": 0.5}, {**S, "score": float("nan")}])], r"line 2: samples\[1\].score must be a finite"),
        ([rec("a", [S, {**S, "score": float("nan")}])], r"line 1: samples\[1\].score must be a finite"),
        ([rec("a", [{**S, "completion_tokens": -3}])], r"samples\[0\].completion_tokens must be an integer >= 0"),
        ([rec("a", [{**S, "completion_tokens": 3.5}])], r"samples\[0\].completion_tokens must be an integer"),
        ([rec("a", prompt_tokens=-1)], r"prompt_tokens must be an integer >= 0"),
        ([rec("a", meta=[1])], r"meta must be an object"),
        ([rec("a"), rec("b"), rec("a")], r"line 3: duplicate id 'a', first seen at .*line 1"),
        ([rec("a"), rec("b", [{**S, "class": 0}, S])], r"line 2: samples\[1\] has no 'class' while other samples"),
        ([rec("a", [{**S, "class": None}])], r"samples\[0\].class is None for answer '1'; a class is null exactly"),
        ([rec("a", [{"answer": None, "correct": False, "class": 0}])], r"samples\[0\].class is 0 for answer None"),
        ([rec("a", [{**S, "class": "0"}])], r"samples\[0\].class must be an integer >= 0 or null, got '0'"),
        ([rec("a", [{**S, "class": True}])], r"samples\[0\].class must be an integer"),
        ([rec("a", [{**S, "class": -1}])], r"samples\[0\].class is -1 for answer '1'"),
        ([rec("a", [{**S, "class": 0}, {"answer": "2", "correct": False, "class": 2}])],
         r"samples\[1\].class: the record's classes must be 0 … G-1 with none skipped; it has 2 classes but the largest is 2"),
        ([rec("a"), rec("b", [{**S, "class": 0}, {**S, "class": 1}])],
         r"line 2: samples\[1\]: answer '1' has two different classes in its record"),
        ([], r"no records"),
    ],
)
def test_reader_errors(tmp_path, lines, match):
    path = write_lines(tmp_path / "t.jsonl", lines)
    with pytest.raises(InputError, match=match):
        read_outcomes(path)


def test_reader_errors_for_the_file_itself(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        read_outcomes(tmp_path / "nope.jsonl")
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"id": "\xe9"}\n')
    with pytest.raises(InputError, match="not UTF-8"):
        read_outcomes(bad)
