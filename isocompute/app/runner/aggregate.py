"""Turn k sampled answers into one: plurality vote, or best-of-k under a verifier score.

Majority (plurality) vote counts each answer label — an extracted answer, or (in the gateway) its
equivalence class id; samples with no answer (``None``) do not vote. Ties between the most frequent
answers are broken by ``tie_break``:

* ``tie_break="first"``: the tied answer whose first occurrence comes earliest in sample order wins.
  Same samples in the same order → same winner, with no randomness at all.
* ``tie_break="seeded"`` (the gateway's default): a uniformly random tied answer, drawn with
  ``numpy.random.default_rng(seed)``; the same seed gives the same winner, no seed a fresh draw. The
  offline estimators give each of t tied answers credit 1/t, which is exactly the expected accuracy of
  this uniform pick (``first`` is biased toward answers the model tends to give early).

The representative sample of the winner is the first sample that gave it: its text is what the client
receives. Worked example::

    answers = ["12", None, "7", "12", "7"]
    counts  = {"12": 2, "7": 2}          # None does not vote
    tie between "12" (first at 0) and "7" (first at 2) → "first" picks "12", sample index 0

Best-of-k picks the sample with the highest verifier score (first one on ties); an answer-less sample
can still win best-of if the verifier scores it highest, since the verifier judges the whole text.

A weighted vote (:func:`weighted_vote`, a vote over several models' samples) scores answer a with
Σ_j w_j · [answer_j = a] instead of counting; ties (equal scores) are broken as above, and with every
weight equal it is exactly :func:`majority_vote`. Example: answers ``["3", "5", "5"]`` with weights
``[2, 0.5, 0.5]`` → scores 3: 2, 5: 1 → ``"3"``.

What it ignores: answer equivalence (:mod:`isocompute.app.runner.voting` merges answers into classes first;
here labels are compared as they are) and weighting votes by score.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

TieBreak = Literal["first", "seeded"]


@dataclass(frozen=True, slots=True)
class Vote:
    """The outcome of aggregating one prompt's samples.

    ``answer`` is the winning answer (``None`` when no sample had one); ``index`` is the sample whose
    text represents it; ``counts`` maps each answer to its votes in order of first occurrence;
    ``n_valid`` counts samples with an answer; ``tied`` says whether the winner was decided by a tie-break.
    """

    answer: Hashable | None
    index: int
    counts: dict[Hashable, int] = field(default_factory=dict)
    n_valid: int = 0
    tied: bool = False


def majority_vote(
    answers: Sequence[Hashable | None], *, tie_break: TieBreak = "first", seed: int | None = None
) -> Vote:
    """Plurality vote over ``answers`` (see the module docstring for ties and ``None``).

    With no answer at all the vote has ``answer=None`` and represents the first sample (index 0).
    """
    if len(answers) == 0:
        raise ValueError("majority_vote needs at least one sample")
    return _plurality(answers, None, tie_break, seed)


def weighted_vote(
    answers: Sequence[Hashable | None], weights: Sequence[float], *, tie_break: TieBreak = "first",
    seed: int | None = None,
) -> Vote:
    """Plurality by total weight (module docstring); ``counts`` are the plain votes, ``None`` does not vote."""
    if len(answers) != len(weights):
        raise ValueError(f"weighted_vote needs one weight per sample; got {len(answers)} answers, {len(weights)} weights")
    if len(answers) == 0:
        raise ValueError("weighted_vote needs at least one sample")
    return _plurality(answers, weights, tie_break, seed)


def _plurality(answers: Sequence[Hashable | None], weights: Sequence[float] | None, tie_break: TieBreak,
               seed: int | None) -> Vote:
    """The vote of :func:`majority_vote` (``weights`` None: every sample counts 1, ties exact) or of
    :func:`weighted_vote` (scores summed in floats, ties within a relative 1e-12)."""
    if tie_break not in ("first", "seeded"):
        raise ValueError(f"tie_break must be 'first' or 'seeded'; got {tie_break!r}")
    counts: dict[Hashable, int] = {}
    scores: dict[Hashable, float] = {}
    first: dict[Hashable, int] = {}
    for i, a in enumerate(answers):
        if a is None:
            continue
        counts[a] = counts.get(a, 0) + 1
        scores[a] = scores.get(a, 0.0) + (1.0 if weights is None else float(weights[i]))
        first.setdefault(a, i)
    if not counts:
        return Vote(answer=None, index=0, counts={}, n_valid=0, tied=False)
    top = max(scores.values())
    tied = [a for a, c in scores.items()  # in order of first occurrence
            if (c == top if weights is None else math.isclose(c, top, rel_tol=1e-12))]
    if len(tied) == 1 or tie_break == "first":
        winner = tied[0]
    else:
        winner = tied[int(np.random.default_rng(seed).integers(len(tied)))]
    return Vote(answer=winner, index=first[winner], counts=counts, n_valid=sum(counts.values()),
                tied=len(tied) > 1)


def best_of(answers: Sequence[Hashable | None], scores: Sequence[float]) -> Vote:
    """The sample with the highest verifier score (the earliest one among equal scores).

    ``counts`` still reports the plurality counts so clients can see agreement alongside the score.
    """
    if len(answers) == 0 or len(answers) != len(scores):
        raise ValueError(f"best_of needs one score per sample; got {len(answers)} answers, {len(scores)} scores")
    s = np.asarray(scores, dtype=float)
    if not np.all(np.isfinite(s)):
        raise ValueError("verifier scores must be finite")
    idx = int(np.argmax(s))  # argmax returns the first maximum
    counts: dict[Hashable, int] = {}
    for a in answers:
        if a is not None:
            counts[a] = counts.get(a, 0) + 1
    return Vote(answer=answers[idx], index=idx, counts=counts, n_valid=sum(counts.values()),
                tied=int(np.sum(s == s[idx])) > 1)
