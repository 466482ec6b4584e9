"""Grading: hand cases, in-process vs pool agreement, timeouts that never hang, and real data."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from isocompute.errors import DependencyError, InputError
from isocompute.tasks.answers.extract import extract_boxed
from isocompute.tasks.base import Problem
from isocompute.tasks.grading import Grader, answer_correct, grade, math_equal, numbers_equal

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

# 10^(10^8) is a 100-million-digit integer: sympy grinds on it for minutes when asked to compare it.
PATHOLOGICAL = ("1", "\\boxed{10^{10^{8}}+1}", "math")


def _data(name: str) -> Path:
    path = DATA / name
    if not path.is_file():
        pytest.skip(f"{path} not present (real data lives in <repo>/../shared/data)")
    return path


@pytest.fixture(scope="module")
def grader() -> Iterator[Grader]:
    with Grader(workers=2, timeout=5.0) as g:
        yield g


# ------------------------------------------------------------------------------------ hand-worked
HAND = [
    # (gold, completion, task, correct)
    ("\\frac{1}{2}", "so it is \\boxed{0.5}", "math", True),
    ("\\frac{1}{2}", "so it is \\boxed{\\dfrac12}", "math", True),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "\\boxed{(3, \\pi/2)}", "math", True),
    ("(1, 2)", "\\boxed{(2, 1)}", "math", False),
    ("2\\sqrt{2}", "\\boxed{\\sqrt{8}}", "math", True),
    ("10{,}000", "\\boxed{10000}", "math", True),
    ("x^2+1", "\\boxed{1 + x^{2}}", "math", True),
    ("3", "\\boxed{4}", "math", False),
    ("18", "She makes 9 * 2 = $18.\n#### 18", "gsm8k", True),
    ("18", "The answer is 18.00", "gsm8k", True),
    ("18", "#### 17", "gsm8k", False),
    ("18", "I cannot tell.", "gsm8k", False),
    ("420", "47 + 385 = 432. 432 - 12 = 420. The answer is 420.", "arith", True),
    ("420", "The answer is 420.0", "arith", True),
    ("420", "The answer is 419.9999", "arith", False),
    ("-3", "so -3", "arith", True),
    ("7", "The answer is seven.", "arith", False),
]


@pytest.mark.parametrize(("gold", "completion", "task", "correct"), HAND)
def test_grade_hand_cases(gold: str, completion: str, task: str, correct: bool) -> None:
    assert grade(Problem("p-0", "q", gold, task), completion) is correct


def test_gold_goes_first() -> None:
    """math-verify is not symmetric: a gold assignment accepts its value, the converse need not hold."""
    assert math_equal("x = 3", "3")


def test_numbers_equal_is_exact() -> None:
    assert numbers_equal("3/4", "0.75") and numbers_equal("1,000", "1000")
    assert not numbers_equal("0.3333333", "1/3")
    assert not numbers_equal("abc", "abc")


def test_pool_agrees_with_in_process_rule(grader: Grader) -> None:
    pairs = [(g, c, t) for g, c, t, _ in HAND]
    result = grader.run(pairs)
    assert result.correct == [answer_correct(g, c, t) for g, c, t in pairs]
    assert result.correct == [ok for *_, ok in HAND]
    assert result.timed_out == [] and result.crashed == [] and result.restarts == 0
    assert result.answers[0] == "0.5"


def test_empty_batch_and_reuse(grader: Grader) -> None:
    assert grader.grade_many([]) == []
    # a second call reuses the same pool
    assert grader.grade_many([("2", "\\boxed{2}", "math"), ("2", "\\boxed{3}", "math")]) == [True, False]


# ------------------------------------------------------------------------------------ timeouts
def test_in_process_timeout_marks_incorrect() -> None:
    start = time.monotonic()
    assert answer_correct(*PATHOLOGICAL, timeout=0.5) is False
    assert time.monotonic() - start < 5


def test_soft_timeout_in_pool_keeps_the_worker() -> None:
    g = Grader(workers=2, timeout=0.5, grace=5.0)
    with g:
        pairs = [("2", "\\boxed{2}", "math"), PATHOLOGICAL, ("x+1", "\\boxed{1+x}", "math")]
        start = time.monotonic()
        result = g.run(pairs)
    assert time.monotonic() - start < 10
    assert result.correct == [True, False, True]
    assert result.timed_out == [1]
    assert result.restarts == 0  # the interval timer stopped sympy; no worker had to be killed


@pytest.mark.slow
def test_hung_worker_is_killed_and_pool_rebuilt() -> None:
    """Without the in-worker timer the item truly hangs its worker; the parent kills it, rebuilds the pool,
    finds the culprit by re-running its chunk one item at a time, and grades everything else."""
    good = [("1/2", "\\boxed{0.5}", "math"), ("3", "\\boxed{4}", "math"), ("x+1", "\\boxed{1+x}", "math")]
    pairs = good * 2 + [PATHOLOGICAL] + good
    with Grader(workers=2, timeout=1.0, grace=1.0, chunk_size=3, soft_timeout=False) as g:
        start = time.monotonic()
        result = g.run(pairs)
        elapsed = time.monotonic() - start
        # the rebuilt pool still works
        assert g.grade_many([("2", "\\boxed{2}", "math")]) == [True]
    assert elapsed < 60
    assert result.timed_out == [6]
    assert result.restarts == 2  # once for the chunk, once for the culprit re-run alone
    assert result.correct == [True, False, True] * 2 + [False] + [True, False, True]


@pytest.mark.slow
def test_crashed_worker_does_not_hang_or_lose_items() -> None:
    """A worker killed from outside (as the OOM killer would) breaks the pool; every item is still graded."""
    import os
    import signal
    import threading

    good = [("1/2", "\\boxed{0.5}", "math"), ("3", "\\boxed{4}", "math")]
    pairs = [PATHOLOGICAL] + good * 3
    with Grader(workers=2, timeout=3.0, grace=1.0, chunk_size=1, soft_timeout=False) as g:
        pids = list(g._pool._processes)  # white-box: the pids ProcessPoolExecutor keeps for itself

        def kill_one() -> None:
            time.sleep(0.5)
            os.kill(pids[0], signal.SIGKILL)

        threading.Thread(target=kill_one).start()
        result = g.run(pairs)
    assert result.correct[1:] == [True, False] * 3
    assert result.correct[0] is False
    assert result.restarts >= 1
    assert 0 in result.timed_out + result.crashed


# ------------------------------------------------------------------------------------ a broken install
@pytest.fixture
def fresh_math_verify() -> Iterator[None]:
    """Forget the cached math-verify functions before and after, so a test can break its import."""
    from isocompute.tasks import grading

    grading._math_verify.cache_clear()
    grading._parse_boxed.cache_clear()
    yield
    grading._math_verify.cache_clear()
    grading._parse_boxed.cache_clear()


def _unimportable(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Unload math-verify and what it imports, then make ``import name`` raise ImportError."""
    import sys

    for m in [m for m in sys.modules if m.split(".")[0] in ("math_verify", "latex2sympy2_extended", name)]:
        monkeypatch.delitem(sys.modules, m)
    monkeypatch.setitem(sys.modules, name, None)


def _latex_parser_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """math-verify imports, but its LaTeX converter fails on everything (as with an incompatible sympy):
    math-verify's ``parse`` would log at DEBUG and return "no answer", grading every math answer wrong."""
    import math_verify.parser

    def broken(*args: object, **kwargs: object) -> None:
        raise AttributeError("module 'sympy' has no attribute 'UnevaluatedExpr'")

    math_verify.parser.parse_latex_cached.cache_clear()
    monkeypatch.setattr(math_verify.parser, "latex2sympy", broken)


@pytest.mark.parametrize(
    ("breakage", "match"),
    [
        (lambda mp: _unimportable(mp, "math_verify"), "math-verify is not installed or does not import"),
        (lambda mp: _unimportable(mp, "antlr4"), r"does not import \(import of antlr4 halted"),
        (_latex_parser_raises, "math-verify cannot parse LaTeX: it grades .* as different"),
    ],
    ids=["math_verify-missing", "antlr4-missing", "latex-parser-raises"],
)
def test_a_broken_math_verify_raises_instead_of_grading_wrong(
    monkeypatch: pytest.MonkeyPatch, fresh_math_verify: None, breakage, match: str  # noqa: ANN001
) -> None:
    breakage(monkeypatch)
    with pytest.raises(DependencyError, match=match):
        answer_correct("\\frac{1}{2}", "so \\boxed{0.5}", "math")
    # the pool refuses to start, in the parent, before any item is graded
    with pytest.raises(DependencyError, match=match):
        Grader(workers=1).__enter__()
    # numbers never need math-verify
    assert answer_correct("420", "The answer is 420.0", "arith") is True


ERRORS = [
    (dict(workers=0), "workers must be ≥ 1"),
    (dict(timeout=0), "timeout must be > 0"),
    (dict(chunk_size=0), "chunk_size must be ≥ 1"),
    (dict(grace=-1), "grace must be ≥ 0"),
    (dict(start_method="fork"), "start_method must be 'forkserver' or 'spawn'"),
]


@pytest.mark.parametrize(("kwargs", "match"), ERRORS)
def test_grader_rejects_bad_settings(kwargs: dict, match: str) -> None:
    with pytest.raises(InputError, match=match):
        Grader(**kwargs)


# ------------------------------------------------------------------------------------ real data
@pytest.mark.data
def test_math500_answers_verify_against_their_own_solutions(grader: Grader) -> None:
    rows = [json.loads(line) for line in _data("math500_test.jsonl").read_text().splitlines()]
    assert len(rows) == 500
    result = grader.run([(r["answer"], r["solution"], "math") for r in rows])
    assert all(result.correct), [rows[i]["unique_id"] for i, ok in enumerate(result.correct) if not ok]


@pytest.mark.data
@pytest.mark.slow
def test_math500_math_verify_alone_agrees_without_string_shortcut() -> None:
    """The same 500 checks through math-verify itself (the pool short-cuts identical strings)."""
    rows = [json.loads(line) for line in _data("math500_test.jsonl").read_text().splitlines()]
    from isocompute.tasks.answers.extract import normalize_answer

    failures = [
        r["unique_id"]
        for r in rows
        if not math_equal(normalize_answer(r["answer"]), normalize_answer(extract_boxed(r["solution"]) or ""))
    ]
    assert failures == []


@pytest.mark.data
def test_qwen_completions_agree_with_shipped_scores(grader: Grader) -> None:
    """800 raw Qwen2.5-Math completions graded against ``gt`` agree with the shipped ``score`` on ≥ 799.

    The one measured disagreement: gold ``10{,}000`` vs answer ``10000`` — shipped False, we say True.
    """
    rows = [json.loads(line) for line in _data("qwen_math_cot_100.jsonl").read_text().splitlines()]
    pairs = [(r["gt"], c, "math") for r in rows for c in r["code"]]
    shipped = [bool(s) for r in rows for s in r["score"]]
    assert len(pairs) == 800
    result = grader.run(pairs)
    agree = sum(a == b for a, b in zip(result.correct, shipped, strict=True))
    assert agree >= 799
    assert sum(shipped) == 728  # the file's own accuracy, as a guard that the fields were read right


@pytest.mark.data
@pytest.mark.slow
def test_gsm8k_example_solutions_agree_with_their_labels(grader: Grader) -> None:
    """4 × 1319 GPT-3 solutions ("... A: 18"): our verdict vs the file's ``is_correct``. Measured 100%."""
    from isocompute.tasks.gsm8k import load

    problems = load(_data("gsm8k_test.jsonl"))
    rows = [
        json.loads(line) for line in _data("gsm8k_example_model_solutions.jsonl").read_text().splitlines()
    ]
    assert [p.meta["index"] for p in problems] == list(range(len(rows)))
    for model in ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification"):
        result = grader.run(
            [(p.gold, r[model]["solution"], "gsm8k") for p, r in zip(problems, rows, strict=True)]
        )
        agree = sum(c == r[model]["is_correct"] for c, r in zip(result.correct, rows, strict=True))
        assert agree == len(rows), (model, agree)


def test_in_process_timeout_restores_an_outer_timer() -> None:
    """grade() inside someone else's SIGALRM watchdog must not cancel it."""
    import signal

    fired: list[int] = []

    def watchdog(*_: object) -> None:
        fired.append(1)

    previous = signal.signal(signal.SIGALRM, watchdog)
    try:
        signal.setitimer(signal.ITIMER_REAL, 60.0)
        start = time.monotonic()
        assert answer_correct("2", "\\boxed{2.0}", "math") is True
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert left == pytest.approx(60.0 - (time.monotonic() - start), abs=0.5)
        assert signal.getsignal(signal.SIGALRM) is watchdog and fired == []
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
