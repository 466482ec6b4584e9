"""Synthetic arithmetic: the embedded default task, with difficulty knobs and a stepwise reference solution.

A problem is an integer expression over ``+``, ``-`` and ``*`` with usual precedence, asked in plain text;
the gold answer is its value as a string. One instance, as :func:`generate` returns it::

    Problem(id="arith-7-3", prompt="What is 47 + 385 - 12?", gold="420", task="arith",
            meta={"difficulty": 5, "expression": "47 + 385 - 12", "n_operands": 3, "digits": 3,
                  "ops": "+-", "carries": 2, "steps": 2})

Its reference solution (what the tiny model learns in SFT) executes one operation per sentence,
multiplications first, then left to right, and ends in the sentence the answer extractor parses::

    47 + 385 = 432. 432 - 12 = 420. The answer is 420.

Difficulty knobs (:class:`ArithSpec`): operand digits, number of operands, the operations allowed, the
size of multiplication factors and whether carries/borrows are required or forbidden. :data:`LEVELS`
maps a difficulty label 1..5 to a spec; ``mix`` weights the levels. Generation is deterministic: problem
``i`` of seed ``s`` depends only on ``(s, i, mix)``, so ``generate(10, s)`` is a prefix of ``generate(100, s)``.

``meta["carries"]`` counts carry (addition) and borrow (subtraction) events over all +/- steps, digit by
digit on magnitudes; multiplication steps contribute none. Ignores: division, parentheses, decimals.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

from isocompute.errors import InputError
from isocompute.tasks.base import Problem

TASK = "arith"


@dataclass(frozen=True, slots=True)
class ArithSpec:
    """How to draw one expression.

    ``digits``: max digits of a +/- operand (each operand has 1..digits digits, the first one exactly
    ``digits``); ``n_operands`` ≥ 2; ``ops``: allowed operators, a subset of ``"+-*"``; ``mul_digits``:
    max digits of the right factor of a ``*`` (its left factor is an ordinary operand); ``carries``:
    ``None`` any, ``False`` no carry/borrow anywhere, ``True`` at least one.
    """

    digits: int
    n_operands: int
    ops: str = "+-"
    mul_digits: int = 1
    carries: bool | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.digits <= 9:
            raise InputError(f"digits must be in 1..9; you passed {self.digits}.")
        if self.n_operands < 2:
            raise InputError(f"n_operands must be ≥ 2 (an expression needs an operator); you passed {self.n_operands}.")
        if not self.ops or set(self.ops) - set("+-*"):
            raise InputError(f"ops must be a non-empty subset of '+-*'; you passed {self.ops!r}.")
        if not 1 <= self.mul_digits <= 9:
            raise InputError(f"mul_digits must be in 1..9; you passed {self.mul_digits}.")


# Difficulty label → spec. Level 1 is single-digit addition without carries; level 5 chains three
# operands of up to three digits with a possible multiplication, which a small model executes imperfectly.
LEVELS: dict[int, ArithSpec] = {
    1: ArithSpec(digits=1, n_operands=2, ops="+", carries=False),
    2: ArithSpec(digits=1, n_operands=2, ops="+-"),
    3: ArithSpec(digits=2, n_operands=2, ops="+-"),
    4: ArithSpec(digits=2, n_operands=3, ops="+-*", mul_digits=1),
    5: ArithSpec(digits=3, n_operands=3, ops="+-*", mul_digits=1),
}

# The embedded default: a realistic mix with most mass in the middle.
DEFAULT_MIX: dict[int, float] = {1: 0.15, 2: 0.25, 3: 0.25, 4: 0.2, 5: 0.15}

_MAX_TRIES = 1000


# ---------------------------------------------------------------------------------------------- maths
def carries_add(a: int, b: int) -> int:
    """Carry events when adding non-negative ``a + b`` digit by digit. ``carries_add(47, 385) == 2``
    (7+5=12 carries, 4+8+1=13 carries, 0+3+1=4 does not)."""
    n, carry = 0, 0
    while a or b or carry:
        s = a % 10 + b % 10 + carry
        carry = int(s >= 10)
        n += carry
        a, b = a // 10, b // 10
    return n


def borrows_sub(a: int, b: int) -> int:
    """Borrow events when subtracting ``a - b`` digit by digit, ``a ≥ b ≥ 0``. ``borrows_sub(432, 12) == 0``,
    ``borrows_sub(402, 15) == 2`` (2−5 borrows, 0−1−1 borrows, 4−0−1 does not)."""
    n, borrow = 0, 0
    while a or b:
        d = a % 10 - b % 10 - borrow
        borrow = int(d < 0)
        n += borrow
        a, b = a // 10, b // 10
    return n


def step_carries(a: int, op: str, b: int) -> int:
    """Carries/borrows of one ``a op b`` step on magnitudes: ``a + b`` with equal signs (or ``a - b`` with
    opposite signs) adds magnitudes; otherwise the smaller magnitude is subtracted from the larger."""
    if op == "*":
        return 0
    same = (a >= 0) == (b >= 0)
    if (op == "+") == same:
        return carries_add(abs(a), abs(b))
    hi, lo = max(abs(a), abs(b)), min(abs(a), abs(b))
    return borrows_sub(hi, lo)


def solve_steps(operands: list[int], ops: list[str]) -> list[tuple[int, str, int, int]]:
    """The steps ``(a, op, b, result)`` that evaluate ``operands[0] ops[0] operands[1] …`` with
    ``*`` before ``+``/``-``, each level left to right.

    >>> solve_steps([3, 4, 5], ["+", "*"])
    [(4, '*', 5, 20), (3, '+', 20, 23)]
    """
    vals, rest, steps = list(operands), list(ops), []
    while "*" in rest:
        j = rest.index("*")
        a, b = vals[j], vals[j + 1]
        steps.append((a, "*", b, a * b))
        vals[j : j + 2] = [a * b]
        del rest[j]
    acc = vals[0]
    for op, b in zip(rest, vals[1:], strict=True):
        r = acc + b if op == "+" else acc - b
        steps.append((acc, op, b, r))
        acc = r
    return steps


def format_expression(operands: list[int], ops: list[str]) -> str:
    """``"47 + 385 - 12"`` from ``[47, 385, 12]`` and ``["+", "-"]``."""
    parts = [str(operands[0])]
    for op, b in zip(ops, operands[1:], strict=True):
        parts += [op, str(b)]
    return " ".join(parts)


def parse_expression(expression: str) -> tuple[list[int], list[str]]:
    """Inverse of :func:`format_expression` for non-negative operands separated by single spaces."""
    tokens = expression.split(" ")
    if len(tokens) < 3 or len(tokens) % 2 == 0:
        raise InputError(f"{expression!r} is not 'a op b [op c …]' with single spaces; write e.g. '47 + 385 - 12'.")
    try:
        operands = [int(t) for t in tokens[0::2]]
    except ValueError as e:
        raise InputError(f"{expression!r} has a non-integer operand; operands must be digits only.") from e
    ops = tokens[1::2]
    if set(ops) - set("+-*"):
        raise InputError(f"{expression!r} has an operator outside + - *; use only those.")
    return operands, ops


def reference_solution(expression: str) -> str:
    """The stepwise chain of thought for ``expression``, ending in ``"The answer is N."``.

    >>> reference_solution("47 + 385 - 12")
    '47 + 385 = 432. 432 - 12 = 420. The answer is 420.'
    """
    operands, ops = parse_expression(expression)
    steps = solve_steps(operands, ops)
    text = " ".join(f"{a} {op} {b} = {r}." for a, op, b, r in steps)
    return f"{text} The answer is {steps[-1][3]}."


def solution_for(problem: Problem) -> str:
    """:func:`reference_solution` of an arith :class:`Problem` (reads ``meta["expression"]``)."""
    return reference_solution(problem.meta["expression"])


# ------------------------------------------------------------------------------------------ sampling
def _operand(rng: random.Random, digits: int, exact: bool) -> int:
    d = digits if exact else rng.randint(1, digits)
    lo = 0 if d == 1 else 10 ** (d - 1)
    return rng.randint(lo, 10**d - 1)


def sample_expression(spec: ArithSpec, rng: random.Random) -> tuple[list[int], list[str]]:
    """Draw operands and operators for ``spec`` (rejection-sampled until the carries knob holds).

    Raises :class:`InputError` when the carries constraint is (almost) never met, e.g. ``carries=False``
    with four 9-digit operands.
    """
    for _ in range(_MAX_TRIES):
        ops = [rng.choice(spec.ops) for _ in range(spec.n_operands - 1)]
        operands = [_operand(rng, spec.digits, exact=True)]
        for op in ops:
            # the right factor of * is small; other operands span 1..digits digits
            operands.append(_operand(rng, spec.mul_digits, exact=False) if op == "*"
                            else _operand(rng, spec.digits, exact=False))
        if spec.carries is None:
            return operands, ops
        n = sum(step_carries(a, op, b) for a, op, b, _ in solve_steps(operands, ops))
        if (n > 0) == spec.carries:
            return operands, ops
    raise InputError(f"could not draw an expression meeting carries={spec.carries} for {spec} in {_MAX_TRIES} "
                     "tries; relax the carries knob or use fewer digits/operands.")


def make_problem(spec: ArithSpec, rng: random.Random, *, pid: str, difficulty: int) -> Problem:
    """One :class:`Problem` drawn from ``spec`` with ``rng``."""
    operands, ops = sample_expression(spec, rng)
    expression = format_expression(operands, ops)
    steps = solve_steps(operands, ops)
    meta = {
        "difficulty": difficulty,
        "expression": expression,
        "n_operands": len(operands),
        "digits": max(len(str(x)) for x in operands),
        "ops": "".join(sorted(set(ops), key="+-*".index)),
        "carries": sum(step_carries(a, op, b) for a, op, b, _ in steps),
        "steps": len(steps),
    }
    return Problem(id=pid, prompt=f"What is {expression}?", gold=str(steps[-1][3]),
                   task=TASK, meta=meta)


def _normalise_mix(mix: Mapping[int, float] | None, levels: Mapping[int, ArithSpec]) -> list[tuple[int, float]]:
    mix = DEFAULT_MIX if mix is None else mix
    bad = [k for k in mix if k not in levels]
    if bad:
        raise InputError(f"mix has unknown difficulty levels {bad}; use levels from {sorted(levels)}.")
    if any(w < 0 for w in mix.values()) or sum(mix.values()) <= 0:
        raise InputError(f"mix weights must be ≥ 0 with a positive sum; you passed {dict(mix)}.")
    return sorted((k, float(w)) for k, w in mix.items() if w > 0)


def generate(
    n: int,
    seed: int,
    mix: Mapping[int, float] | None = None,
    *,
    levels: Mapping[int, ArithSpec] | None = None,
) -> list[Problem]:
    """``n`` problems, ids ``arith-<seed>-<i>``, difficulty drawn from ``mix`` (level → weight, default
    :data:`DEFAULT_MIX`; weights need not sum to 1) over ``levels`` (default :data:`LEVELS`).

    Deterministic: problem ``i`` uses its own ``random.Random(f"arith:{seed}:{i}")``, so results are stable
    across processes and independent of ``n``.
    """
    if n < 0:
        raise InputError(f"n must be ≥ 0; you passed {n}.")
    levels = LEVELS if levels is None else levels
    weighted = _normalise_mix(mix, levels)
    keys, weights = [k for k, _ in weighted], [w for _, w in weighted]
    out = []
    for i in range(n):
        rng = random.Random(f"{TASK}:{seed}:{i}")
        level = rng.choices(keys, weights=weights)[0]
        out.append(make_problem(levels[level], rng, pid=f"{TASK}-{seed}-{i}", difficulty=level))
    return out
