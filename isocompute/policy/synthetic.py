"""Synthetic outcome tables whose difficulty follows the prompt text — a fixture for tests and benchmarks.

Each prompt is an integer expression ``"What is 47 + 385 * 6?"``. Its latent difficulty grows with the
operands' digits, the number of operands and the multiplications,

    z = 0.9 · max_digits + 0.7 · (n_operands − 2) + 1.2 · n_times − 2.6 + noise · ε,   ε ~ N(0, 1),

and each of its ``n_samples`` answers is correct with probability p = σ(−z) (σ the logistic), otherwise
one of three distractors (gold ± 1, gold ± 10, gold + 100) drawn with probabilities 0.6/0.3/0.1, so wrong
answers concentrate and majority voting can lose. ``noise`` sets how much of the difficulty the text
cannot explain (0 → fully predictable from features). Completion tokens grow with the number of
operations, so the ``flops`` cost unit has something to price.

Example: ``"What is 7 + 2?"`` (1 digit, 2 operands) has z = 0.9 − 2.6 = −1.7, p = σ(1.7) = 0.85 at
noise 0; ``"What is 123 + 456 * 7 - 89?"`` has z = 2.7 + 1.4 + 1.2 − 2.6 = 2.7, p = 0.06.

Ignores: realism of the wrong answers beyond their concentration; this is not a model of any LLM.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from isocompute.policy.features.text_rules import tokenize


def _expression(rng: np.random.Generator) -> tuple[str, int, int, int, int]:
    n_ops = int(rng.choice([2, 3, 4], p=[0.45, 0.35, 0.2]))
    digits = int(rng.choice([1, 2, 3, 4], p=[0.3, 0.3, 0.25, 0.15]))
    nums = [int(rng.integers(10 ** (digits - 1) if d == 0 else 1, 10**digits)) for d in range(n_ops)]
    ops = [str(rng.choice(["+", "-", "*"], p=[0.45, 0.35, 0.2])) for _ in range(n_ops - 1)]
    expr = str(nums[0]) + "".join(f" {o} {n}" for o, n in zip(ops, nums[1:], strict=True))
    value = eval(expr, {"__builtins__": {}})  # noqa: S307 — digits and + - * only, built just above
    return expr, int(value), digits, n_ops, ops.count("*")


def synthetic_records(n_prompts: int, n_samples: int = 16, *, seed: int = 0, noise: float = 0.5,
                      id_prefix: str = "syn") -> list[dict[str, Any]]:
    """``n_prompts`` outcome records (dicts in the outcome-table line format), deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_prompts):
        expr, gold, digits, n_ops, n_times = _expression(rng)
        z = 0.9 * digits + 0.7 * (n_ops - 2) + 1.2 * n_times - 2.6 + noise * rng.standard_normal()
        p = 1.0 / (1.0 + math.exp(z))
        prompt = f"What is {expr}?"
        right = rng.random(n_samples) < p
        wrong = rng.choice([gold + int(rng.choice([-1, 1])), gold + 10 * int(rng.choice([-1, 1])), gold + 100],
                           size=n_samples, p=[0.6, 0.3, 0.1])
        answers = np.where(right, gold, wrong)
        steps = n_ops - 1
        tokens = rng.poisson(12 * steps + 6, size=n_samples)
        out.append({
            "id": f"{id_prefix}-{i}",
            "prompt": prompt,
            "gold": str(gold),
            "prompt_tokens": len(tokenize(prompt)) + 8,
            "samples": [{"answer": str(int(a)), "correct": bool(c), "completion_tokens": int(t)}
                        for a, c, t in zip(answers, right, tokens, strict=True)],
            "meta": {"task": "synthetic-arith", "p_correct": round(p, 4)},
        })
    return out


def write_synthetic_outcomes(path: str | os.PathLike[str], n_prompts: int, n_samples: int = 16, *,
                             seed: int = 0, noise: float = 0.5) -> Path:
    """Write :func:`synthetic_records` as an outcome-table JSONL file; returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    records = synthetic_records(n_prompts, n_samples, seed=seed, noise=noise)
    p.write_text("".join(json.dumps(r) + "\n" for r in records))
    return p
