"""GSM8K / MATH loaders and the load_task registry, on the real files and on broken ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from isocompute.errors import InputError
from isocompute.tasks import gsm8k, math
from isocompute.tasks.base import Problem
from isocompute.tasks.registry import TASKS, load_task, subset

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def _data(name: str) -> Path:
    path = DATA / name
    if not path.is_file():
        pytest.skip(f"{path} not present (real data lives in <repo>/../shared/data)")
    return path


def _write(tmp_path: Path, lines: list[str], name: str = "d.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


GSM = json.dumps({"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"})
MATH = json.dumps({"problem": "What is 1 + 1?", "solution": "$\\boxed{2}$", "answer": "2", "level": 1})


# ------------------------------------------------------------------------------------ real files
@pytest.mark.data
def test_gsm8k_test_file() -> None:
    problems = gsm8k.load(_data("gsm8k_test.jsonl"))
    assert len(problems) == 1319
    first = problems[0]
    assert first == Problem(id="gsm8k-0", prompt=first.prompt, gold="18", task="gsm8k", meta=first.meta)
    assert "Janet’s ducks lay 16 eggs per day" in first.prompt and "The answer is" in first.prompt
    assert first.meta["index"] == 0 and first.meta["solution"].endswith("every day at the farmer’s market.")
    assert problems[2].gold == "70000"  # "#### 70000" in the file; ids are unique and in order
    assert [p.id for p in problems] == [f"gsm8k-{i}" for i in range(1319)]
    assert all(p.gold and "," not in p.gold for p in problems)
    assert all(float(p.gold) == float(p.gold) for p in problems)  # every GSM8K gold is a number


@pytest.mark.data
def test_math500_file() -> None:
    problems = math.load(_data("math500_test.jsonl"))
    assert len(problems) == 500
    first = problems[0]
    assert first.id == "math-test/precalculus/807.json"
    assert first.gold == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert first.task == "math" and "\\boxed{}" in first.prompt and "(0,3)" in first.prompt
    assert first.meta["level"] == 2 and first.meta["subject"] == "Precalculus"
    assert len({p.id for p in problems}) == 500
    assert {p.meta["level"] for p in problems} == {1, 2, 3, 4, 5}
    assert len({p.meta["subject"] for p in problems}) == 7


@pytest.mark.data
def test_registry_reads_files_and_subsets_reproducibly() -> None:
    path = _data("gsm8k_test.jsonl")
    a = load_task("gsm8k", path, limit=50, seed=3)
    b = load_task("GSM8K", str(path), limit=50, seed=3)
    c = load_task("gsm8k", path, limit=50, seed=4)
    assert a == b and a != c and len(a) == 50
    ids = [int(p.id.split("-")[1]) for p in a]
    assert ids == sorted(ids)  # a subset keeps file order
    assert len(load_task("math500", _data("math500_test.jsonl"))) == 500


# ------------------------------------------------------------------------------------ synthetic files
def test_original_math_layout_takes_gold_from_last_box(tmp_path: Path) -> None:
    line = json.dumps(
        {
            "problem": "p",
            "solution": "first \\boxed{1}, finally $\\boxed{\\frac{1}{2}}$.",
            "level": "Level 4",
            "type": "Algebra",
        }
    )
    (p,) = math.load(_write(tmp_path, [line]))
    assert p.id == "math-0" and p.gold == "\\frac{1}{2}"
    assert p.meta["level"] == 4 and p.meta["subject"] == "Algebra" and p.meta["unique_id"] is None


def test_blank_lines_are_skipped_and_ids_count_records(tmp_path: Path) -> None:
    problems = gsm8k.load(_write(tmp_path, [GSM, "", "   ", GSM.replace("#### 2", "#### 1,234")]))
    assert [(p.id, p.gold) for p in problems] == [("gsm8k-0", "2"), ("gsm8k-1", "1234")]


BAD_FILES = [
    (gsm8k.load, ["{not json"], r"d\.jsonl:1: not valid JSON"),
    (gsm8k.load, [GSM, "[1, 2]"], r"d\.jsonl:2: expected a JSON object"),
    (gsm8k.load, [GSM, json.dumps({"question": "q", "answer": ""})], r"d\.jsonl:2: missing or empty field"),
    (
        gsm8k.load,
        [json.dumps({"question": "q", "answer": "no marker"})],
        r"d\.jsonl:1: the answer has no '####",
    ),
    (gsm8k.load, [json.dumps({"question": "q", "answer": 5})], r"d\.jsonl:1: missing or empty"),
    (gsm8k.load, ["", "  "], r"no GSM8K records found"),
    (math.load, [json.dumps({"solution": "x"})], r"d\.jsonl:1: missing or empty field\(s\) \['problem'\]"),
    (math.load, [MATH, json.dumps({"problem": "p", "solution": "no box"})], r"d\.jsonl:2: no final answer"),
    (
        math.load,
        [json.dumps({"problem": "p", "answer": "1", "unique_id": "a"})] * 2,
        r"d\.jsonl:2: id 'math-a' repeats line 1",
    ),
]


@pytest.mark.parametrize(("loader", "lines", "match"), BAD_FILES)
def test_bad_files_name_the_line(tmp_path: Path, loader, lines: list[str], match: str) -> None:
    with pytest.raises(InputError, match=match):
        loader(_write(tmp_path, lines))


def test_missing_and_non_utf8_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist; pass the path"):
        gsm8k.load(tmp_path / "nope.jsonl")
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b"\xff\xfe{}")
    with pytest.raises(InputError, match="not UTF-8"):
        math.load(bad)


# ------------------------------------------------------------------------------------ registry
REGISTRY_ERRORS = [
    (dict(name="mmlu"), "unknown task 'mmlu'; choose one of arith, gsm8k, math, math500"),
    (dict(name="gsm8k"), "read from a JSONL file; pass path="),
    (dict(name="arith", path="x.jsonl"), "generated, not read from a file"),
    (dict(name="arith", limit=0), "limit must be a positive integer"),
    (dict(name="arith", limit=2.5), "limit must be a positive integer"),
]


@pytest.mark.parametrize(("kwargs", "match"), REGISTRY_ERRORS)
def test_registry_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(InputError, match=match):
        load_task(**kwargs)


def test_registry_dispatches_arith_to_its_generator() -> None:
    from isocompute.tasks import arith

    problems = load_task("arith", limit=7, seed=5)
    assert problems == arith.generate(7, 5)
    assert all(p.task == "arith" for p in problems)
    assert TASKS == ("arith", "gsm8k", "math", "math500")


def test_subset_hand_case_and_invariants() -> None:
    items = [Problem(str(i), "", "", "t") for i in range(5)]
    assert [p.id for p in subset(items, 2, seed=0)] == ["3", "4"]  # random.Random(0).sample(range(5), 2)
    for seed in range(20):
        picked = subset(items, 3, seed)
        assert len(picked) == 3 and len({p.id for p in picked}) == 3
        assert [int(p.id) for p in picked] == sorted(int(p.id) for p in picked)
    assert subset(items, None, 0) == items and subset(items, 99, 0) == items
