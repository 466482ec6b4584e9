"""Outcome tables' optional per-sample evidence, ``logprob_mean`` and ``confidence_min_window``: round trip
through the writer and reader, the (N, n_max) views, subsets, and validation errors naming record and field."""

from __future__ import annotations

import json

import numpy as np
import pytest

from isocompute.errors import InputError
from isocompute.solver.outcomes import (
    OutcomeRecord,
    OutcomeWriter,
    Sample,
    from_records,
    read_outcomes,
    record_to_dict,
    record_to_json,
)


def records():
    return [
        OutcomeRecord("a", "What is 1+1?", "2", (
            Sample("2", True, 5, logprob_mean=-0.25, confidence_min_window=3.5),
            Sample("3", False, 9, logprob_mean=-1.5, confidence_min_window=0.75),
        ), prompt_tokens=7),
        OutcomeRecord("b", "What is 2+2?", "4", (Sample("4", True, 4, logprob_mean=0.0, confidence_min_window=0.0),)),
        OutcomeRecord("c", "What is 3+3?", "6", (Sample("6", True, 6),)),  # a sample without evidence
    ]


def test_round_trip_through_the_writer_and_the_views(tmp_path):
    path = tmp_path / "t.jsonl"
    with OutcomeWriter(path) as w:
        for r in records():
            w.write(r)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["samples"][1] == {"answer": "3", "correct": False, "completion_tokens": 9,
                                      "logprob_mean": -1.5, "confidence_min_window": 0.75}
    assert "logprob_mean" not in lines[2]["samples"][0]  # absent stays absent
    t = read_outcomes(path)
    np.testing.assert_array_equal(t.logprob_mean, [[-0.25, -1.5], [0.0, np.nan], [np.nan, np.nan]])
    np.testing.assert_array_equal(t.confidence_min_window, [[3.5, 0.75], [0.0, np.nan], [np.nan, np.nan]])
    sub = t.subset([2, 0])
    np.testing.assert_array_equal(sub.logprob_mean, [[np.nan, np.nan], [-0.25, -1.5]])
    assert t.records[0]["samples"][0]["confidence_min_window"] == 3.5
    # the dataclasses and their JSON lines agree
    assert [record_to_dict(r) for r in records()] == lines


def test_a_table_without_evidence_has_none_views():
    t = from_records([OutcomeRecord("a", "p", "1", (Sample("1", True, 3),))])
    assert t.logprob_mean is None and t.confidence_min_window is None
    assert t.subset([0]).logprob_mean is None
    # one field without the other: the other view is None
    t = from_records([{"id": "a", "prompt": "p", "gold": "1",
                       "samples": [{"answer": "1", "correct": True, "logprob_mean": -0.5}]}])
    assert t.logprob_mean.tolist() == [[-0.5]] and t.confidence_min_window is None


@pytest.mark.parametrize("field, value, why", [
    ("logprob_mean", 0.5, "<= 0"),
    ("logprob_mean", "-0.5", "<= 0"),
    ("logprob_mean", True, "<= 0"),
    ("confidence_min_window", -0.1, ">= 0"),
    ("confidence_min_window", [1.0], ">= 0"),
])
def test_the_reader_names_the_line_the_sample_and_the_field(tmp_path, field, value, why):
    good = {"answer": "1", "correct": True}
    line = {"id": "a", "prompt": "p", "gold": "1", "samples": [good, {**good, field: value}]}
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"id": "z", "prompt": "p", "gold": "1", "samples": [good]}) + "\n"
                    + json.dumps(line) + "\n")
    with pytest.raises(InputError, match=rf"t.jsonl, line 2: samples\[1\]\.{field} must be a finite number {why}"):
        read_outcomes(path)


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_values_are_refused(tmp_path, token):
    path = tmp_path / "t.jsonl"
    path.write_text('{"id":"a","prompt":"p","gold":"1","samples":[{"answer":"1","correct":true,'
                    f'"confidence_min_window":{token}}}]}}\n')
    with pytest.raises(InputError, match=r"line 1: samples\[0\]\.confidence_min_window must be a finite"):
        read_outcomes(path)


def test_the_writer_refuses_a_bad_record_naming_it():
    bad = OutcomeRecord("q7", "p", "1", (Sample("1", True, 3, logprob_mean=0.1),))
    with pytest.raises(InputError, match=r"record 'q7': samples\[0\]\.logprob_mean must be a finite number <= 0"):
        record_to_json(bad)
    with pytest.raises(InputError, match=r"samples\[0\]\.confidence_min_window"):
        from_records([OutcomeRecord("q8", "p", "1", (Sample("1", True, 3, confidence_min_window=float("nan")),))])
