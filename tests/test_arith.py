"""The synthetic arithmetic task: determinism, difficulty knobs, gold and reference-solution correctness."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isocompute.errors import InputError
from isocompute.tasks import arith
from isocompute.tasks.arith import (
    LEVELS,
    ArithSpec,
    borrows_sub,
    carries_add,
    generate,
    reference_solution,
    sample_expression,
    solve_steps,
    step_carries,
)
from isocompute.tasks.base import Problem

STEP = re.compile(r"(-?\d+) ([+*-]) (-?\d+) = (-?\d+)\.")


def _eval(expression: str) -> int:
    """Python's own evaluation of the expression: the independent reference for gold answers."""
    assert re.fullmatch(r"[0-9 +*-]+", expression)
    return eval(expression, {"__builtins__": {}})  # noqa: S307 - digits and + - * only, checked above


# ----------------------------------------------------------------------------------- hand-worked
def test_hand_worked_problem_and_solution():
    assert reference_solution("47 + 385 - 12") == "47 + 385 = 432. 432 - 12 = 420. The answer is 420."
    assert reference_solution("3 + 4 * 5") == "4 * 5 = 20. 3 + 20 = 23. The answer is 23."
    assert reference_solution("5 - 9 * 2 - 1") == "9 * 2 = 18. 5 - 18 = -13. -13 - 1 = -14. The answer is -14."
    assert solve_steps([2, 3, 4, 5], ["*", "+", "*"]) == [(2, "*", 3, 6), (4, "*", 5, 20), (6, "+", 20, 26)]


def test_hand_worked_carries():
    assert carries_add(47, 385) == 2
    assert carries_add(999, 1) == 3
    assert carries_add(12, 34) == 0
    assert borrows_sub(402, 15) == 2
    assert borrows_sub(432, 12) == 0
    assert borrows_sub(1000, 1) == 3
    assert step_carries(47, "+", 385) == 2
    assert step_carries(-5, "-", 7) == 1  # -5 - 7 adds magnitudes: 5 + 7 carries once
    assert step_carries(12, "-", 30) == 1  # 30 - 12 on magnitudes: 0-2 borrows, 3-1-1 does not
    assert step_carries(12, "-", 32) == 0  # 32 - 12: no borrow
    assert step_carries(-12, "+", 32) == 0  # 32 - 12 again, written as -12 + 32


# --------------------------------------------------------------------------------- determinism
def test_generate_is_deterministic_and_prefix_stable():
    a, b = generate(200, seed=3), generate(200, seed=3)
    assert a == b
    assert generate(50, seed=3) == a[:50]
    assert generate(200, seed=4) != a
    assert [p.id for p in a[:3]] == ["arith-3-0", "arith-3-1", "arith-3-2"]
    assert all(isinstance(p, Problem) and p.task == "arith" for p in a)
    assert len({p.id for p in a}) == 200


def test_default_mix_covers_every_level():
    levels = {p.meta["difficulty"] for p in generate(300, seed=0)}
    assert levels == set(LEVELS)


# ------------------------------------------------------------------------------------ gold
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gold_equals_python_evaluation_and_solution_is_consistent(seed):
    for p in generate(400, seed=seed):
        expr = p.meta["expression"]
        assert p.prompt == f"What is {expr}?"
        assert p.gold == str(_eval(expr))
        sol = arith.solution_for(p)
        assert sol.endswith(f"The answer is {p.gold}.")
        steps = STEP.findall(sol)
        assert len(steps) == p.meta["steps"] == p.meta["n_operands"] - 1
        for a, op, b, r in steps:  # every printed step is itself correct
            assert _eval(f"{a} {op} {b}".replace("- -", "+ ")) == int(r)
        assert int(steps[-1][3]) == int(p.gold)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 9999), min_size=2, max_size=6), st.data())
def test_solve_steps_matches_python_precedence(operands, data):
    ops = data.draw(st.lists(st.sampled_from("+-*"), min_size=len(operands) - 1, max_size=len(operands) - 1))
    steps = solve_steps(operands, ops)
    assert len(steps) == len(ops)
    assert steps[-1][3] == _eval(arith.format_expression(operands, ops))
    assert arith.parse_expression(arith.format_expression(operands, ops)) == (operands, ops)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 10**7), st.integers(0, 10**7))
def test_carries_agree_with_modular_definition(a, b):
    # independent definition: a carry out of digit k-1 happens iff the low k digits overflow 10^k
    digits = max(len(str(a)), len(str(b))) + 1
    expected = sum((a % 10**k + b % 10**k) >= 10**k for k in range(1, digits + 1))
    assert carries_add(a, b) == expected
    hi, lo = max(a, b), min(a, b)
    expected_borrows = sum(hi % 10**k < lo % 10**k for k in range(1, digits + 1))
    assert borrows_sub(hi, lo) == expected_borrows


# --------------------------------------------------------------------------------- knobs
@pytest.mark.parametrize("level", sorted(LEVELS))
def test_level_specs_are_honoured(level):
    spec = LEVELS[level]
    problems = generate(150, seed=7, mix={level: 1.0})
    assert {p.meta["difficulty"] for p in problems} == {level}
    for p in problems:
        operands, ops = arith.parse_expression(p.meta["expression"])
        assert len(operands) == spec.n_operands
        assert set(ops) <= set(spec.ops)
        assert len(str(operands[0])) == spec.digits
        for op, b in zip(ops, operands[1:], strict=True):
            assert len(str(b)) <= (spec.mul_digits if op == "*" else spec.digits)
        if spec.carries is False:
            assert p.meta["carries"] == 0


@pytest.mark.parametrize("carries", [True, False])
def test_carries_knob(carries):
    spec = ArithSpec(digits=2, n_operands=2, ops="+-", carries=carries)
    rng = random.Random(0)
    for _ in range(100):
        operands, ops = sample_expression(spec, rng)
        n = sum(step_carries(a, op, b) for a, op, b, _ in solve_steps(operands, ops))
        assert (n > 0) == carries


def test_difficulty_grows_with_level():
    problems = generate(1000, seed=0)
    by = {lv: [p for p in problems if p.meta["difficulty"] == lv] for lv in LEVELS}
    mean_len = [sum(len(arith.solution_for(p)) for p in by[lv]) / len(by[lv]) for lv in sorted(LEVELS)]
    assert mean_len == sorted(mean_len)


def test_mix_weights_are_respected():
    problems = generate(2000, seed=0, mix={1: 3, 5: 1})
    share = sum(p.meta["difficulty"] == 1 for p in problems) / len(problems)
    assert 0.70 < share < 0.80


# --------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: ArithSpec(digits=0, n_operands=2), "digits must be in 1..9"),
        (lambda: ArithSpec(digits=2, n_operands=1), "n_operands must be ≥ 2"),
        (lambda: ArithSpec(digits=2, n_operands=2, ops="+/"), "subset of"),
        (lambda: ArithSpec(digits=2, n_operands=2, mul_digits=0), "mul_digits"),
        (lambda: generate(5, 0, mix={9: 1.0}), "unknown difficulty levels"),
        (lambda: generate(5, 0, mix={1: -1.0, 2: 2.0}), "weights must be ≥ 0"),
        (lambda: generate(-1, 0), "n must be ≥ 0"),
        (lambda: reference_solution("1 +"), "single spaces"),
        (lambda: reference_solution("1 / 2"), "outside"),
        (lambda: reference_solution("a + 2"), "non-integer"),
        (lambda: sample_expression(ArithSpec(digits=9, n_operands=6, carries=False), random.Random(0)),
         "relax the carries knob"),
    ],
)
def test_errors(call, match):
    with pytest.raises(InputError, match=match):
        call()
