"""The TRL side of compute-aligned GRPO: the pinned hooks the trainer overrides, the reward functions
TRL calls (``correct``, ``aligned``, the ``step_check_score`` verifier), dataset rows and the trainer
settings the transforms need. :mod:`isocompute.training.grpo` (the config and the run) and
:mod:`isocompute.training.grpo_trainer` (the ``GRPOTrainer`` subclass) both import it.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from typing import Any

from isocompute.errors import InputError, IsoComputeError
from isocompute.tasks.base import Problem
from isocompute.tasks.grading import grade
from isocompute.training.allocation import Allocator
from isocompute.training.rewards import Objective

TRL_VERSION = "1.16.0"

# TRL methods we override, with the parameters we rely on (tests/test_grpo_contract.py pins them).
TRL_HOOKS: dict[str, tuple[str, ...]] = {
    "_calculate_rewards": ("self", "inputs", "prompts", "completions", "completion_ids_list"),
    "_generate": ("self", "prompts"),
    "_generate_and_score_completions": ("self", "inputs"),
    "compute_loss": ("self", "model", "inputs", "return_outputs", "num_items_in_batch"),
    "log": ("self", "logs", "start_time"),
}


def check_trl_contract(trainer_cls: type | None = None) -> None:
    """Raise :class:`IsoComputeError` when TRL's ``GRPOTrainer`` no longer has the hooks we override."""
    if trainer_cls is None:
        from trl import GRPOTrainer as trainer_cls
    for name, params in TRL_HOOKS.items():
        fn = getattr(trainer_cls, name, None)
        found = tuple(inspect.signature(fn).parameters) if callable(fn) else None
        if found != params:
            raise IsoComputeError(
                f"TRL's GRPOTrainer.{name} has parameters {found}, but isocompute overrides it expecting {params}. "
                f"Install the pinned version (pip install trl=={TRL_VERSION}) or port "
                "isocompute/training/grpo_trainer.py to the new hook.")


# ------------------------------------------------------------------------------------------- rewards


def completion_text(completion: Any) -> str:
    """The text of a TRL completion: a string, or a conversational list of messages (last one's content)."""
    if isinstance(completion, str):
        return completion
    return str(completion[-1]["content"]) if completion else ""


def correct(prompts: Sequence[Any], completions: Sequence[Any], gold: Sequence[str], task: Sequence[str],
            **_: Any) -> list[float]:
    """TRL reward function: 1.0 when :func:`grade` accepts the completion, else 0.0."""
    return [float(grade(Problem("", "", g, t), completion_text(c)))
            for c, g, t in zip(completions, gold, task, strict=True)]


def aligned(prompts: Sequence[Any], completions: Sequence[Any], **_: Any) -> list[float]:
    """Placeholder reward column; :meth:`~isocompute.training.grpo_trainer.AlignedGRPOTrainer._calculate_rewards` writes the advantages."""
    return [0.0] * len(completions)


_STEP = re.compile(r"(-?\d+)\s*([+\-*×−])\s*(-?\d+)\s*=\s*(-?\d+)")


def step_check_score(prompts: Sequence[Any], completions: Sequence[Any], **_: Any) -> list[float]:
    """A rule-based verifier for arith (no gold answer): the share of ``a op b = c`` steps in the
    completion that are arithmetically right, 0 when there is none.

    >>> step_check_score([""], ["2 + 3 = 5. 5 * 4 = 21. The answer is 21."])
    [0.5]
    """
    out = []
    for c in completions:
        steps = _STEP.findall(completion_text(c))
        ok = 0
        for a, op, b, r in steps:
            x, y = int(a), int(b)
            value = x + y if op == "+" else x * y if op in "*×" else x - y
            ok += value == int(r)
        out.append(ok / len(steps) if steps else 0.0)
    return out


step_check_score.__name__ = "verifier"


def problem_rows(problems: Sequence[Problem], *, chat: bool = True) -> list[dict[str, Any]]:
    """Dataset rows for TRL: ``prompt`` (chat messages or plain text), ``gold``, ``task``, ``problem_id``."""
    return [{"prompt": [{"role": "user", "content": p.prompt}] if chat else p.prompt,
             "gold": p.gold, "task": p.task, "problem_id": p.id} for p in problems]


# ------------------------------------------------------------------------------------------- trainer


def check_trainer_args(args: Any, objective: Objective, allocator: Allocator | None = None) -> None:
    """The TRL settings the transforms (and an allocator) need, checked once with the fix in each message."""
    n = args.num_generations
    if n is None or n < objective.min_generations():
        raise InputError(f"{objective.name} needs num_generations ≥ {objective.min_generations()} (k + 1 rollouts "
                         f"per prompt for the leave-one-out baseline); you passed {n}.")
    if args.scale_rewards not in ("none", False) and objective.kind != "mean":
        raise InputError(f"scale_rewards={args.scale_rewards!r} divides by the group's std, which biases the "
                         f"{objective.name} gradient; set scale_rewards='none'.")
    if allocator is not None:
        if allocator.group_size != n:
            raise InputError(f"the allocator fills groups of {allocator.group_size} rollouts but num_generations={n}; "
                             "make them equal (Pilot-Commit: n_pilot + n_commit = num_generations).")
        if args.gradient_accumulation_steps != 1 or (args.steps_per_generation or 1) != 1 or args.world_size != 1:
            raise InputError("rollout allocation decides one update at a time in one process; set "
                             "gradient_accumulation_steps=1, steps_per_generation=1 and run a single process.")
    if args.multi_objective_aggregation != "sum_then_normalize":
        raise InputError("multi_objective_aggregation must be 'sum_then_normalize' so the aligned column is the "
                         f"advantage; you passed {args.multi_objective_aggregation!r}.")
