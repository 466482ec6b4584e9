"""The target a stage credits a sample against: gold verdicts, or agreement with its prompt's consensus.

Under ``gold`` a sample is right when its grader said so (``correct``). Under ``consensus`` — for traffic
without gold answers — its prompt's *reference class* is the plurality class of ALL its samples (null
answers never vote), and a sample is credited by agreement with it; when t classes tie at the top each is
the reference with probability 1/t, so a sample of a tied class gets credit 1/t. The reference is fixed per
prompt, so every estimator stays exact: maj@k, best-of-k and the plans' estimators score a winning class
by the mean credit of its samples, which is linear in the credit, and pass@k only needs the reference
class's size (equal for every tied class).

Worked example: answers [a, a, b, b, c, null] → a and b tie with 2 votes: credits [½, ½, ½, ½, 0, 0];
maj@6 = ½ (a and b tie in the full vote, each worth ½ → ½·½ + ½·½).

:func:`resolve_target` picks the default (gold when every sample has a verdict, else consensus);
:func:`with_target` returns the table whose ``correct`` holds the target's credit; :func:`agreement`
measures how often the consensus label and gold disagree. Ignores: where samples come from.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from isocompute.errors import InputError

__all__ = ["TARGETS", "agreement", "consensus_credit", "resolve_target", "with_target"]

TARGETS = ("gold", "consensus")


def consensus_credit(answer_codes: np.ndarray) -> np.ndarray:
    """(N, n) float credit of each sample under the consensus target (module docstring); codes dense per row,
    −1 null, < −1 padding (credit 0)."""
    codes = np.atleast_2d(np.asarray(answer_codes, dtype=np.int64))
    N = codes.shape[0]
    voting = codes >= 0
    out = np.zeros(codes.shape)
    if not voting.any():
        return out
    G = int(codes.max()) + 1
    rows = np.broadcast_to(np.arange(N)[:, None], codes.shape)
    counts = np.bincount((rows * G + codes)[voting], minlength=N * G).reshape(N, G)
    top = counts.max(axis=1, keepdims=True)
    leaders = (counts == top) & (top > 0)
    value = leaders / np.maximum(leaders.sum(axis=1, keepdims=True), 1)  # (N, G): 1/t for each tied leader
    out[voting] = value[rows[voting], codes[voting]]
    return out


def resolve_target(table: Any, target: str | None) -> str:
    """The target a stage uses on ``table``: ``target`` when given (checked), else gold when every sample has a
    verdict and consensus otherwise."""
    if target is None or target == "auto":
        return "gold" if table.has_gold else "consensus"
    if target not in TARGETS:
        raise InputError(f"unknown target {target!r}; use one of {', '.join(TARGETS)} (or leave it out: gold "
                         "when every sample has 'correct', else consensus).")
    if target == "gold" and not table.has_gold:
        n = int((~table.graded & table.mask).sum())
        raise InputError(f"--target gold needs a verdict ('correct') on every sample, but {n} samples of "
                         f"{table.source} have none; grade them (isocompute import --task …) or use --target "
                         "consensus.")
    return target


def with_target(table: Any, target: str | None = None) -> Any:
    """``table`` with ``correct`` holding ``target``'s credit (:func:`resolve_target` picks the default) and
    ``target`` set; gold returns the table's verdicts as they are."""
    t = resolve_target(table, target)
    if t == table.target:
        return table
    if t == "gold":
        raise InputError("this table already holds consensus credit; read the outcome table again for gold.")
    return dataclasses.replace(table, correct=consensus_credit(table.answer_codes), target=t)


@dataclasses.dataclass(frozen=True)
class Agreement:
    """How the consensus label compares with gold on a table with verdicts.

    ``sample_flip``: share of samples whose consensus credit (rounded: in the reference class or not) differs
    from their gold verdict; ``plurality_right``: share of prompts whose reference class is right
    (ties: the mean over the tied classes); ``n_prompts``, ``n_samples``."""

    sample_flip: float
    plurality_right: float
    n_prompts: int
    n_samples: int

    def as_dict(self) -> dict[str, float | int]:
        return dataclasses.asdict(self)


def agreement(table: Any) -> Agreement:
    """:class:`Agreement` of ``table`` (which must hold gold verdicts)."""
    if table.target != "gold" or not table.has_gold:
        raise InputError("agreement() compares consensus with gold: pass a table with a verdict on every sample.")
    credit = consensus_credit(table.answer_codes)
    gold = table.correct & (table.answer_codes >= 0)
    m = table.mask
    flip = ((credit > 0) != gold) & m
    right = (credit * gold).sum(axis=1)  # Σ over the tied reference classes' samples of 1/t · [right]
    size = np.where(credit > 0, 1.0, 0.0).sum(axis=1)
    t_share = np.where(size > 0, right / np.maximum(credit.sum(axis=1), 1e-300), 0.0)
    return Agreement(sample_flip=float(flip.sum() / m.sum()), plurality_right=float(t_share.mean()),
                     n_prompts=len(table), n_samples=int(m.sum()))
