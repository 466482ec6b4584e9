"""The weighted vote and its weight function: one sample's weight from its evidence (length, confidence).

A sample with ``t`` completion tokens and confidence ``c`` (when its table or engine has one) weighs

    w = exp(−β · log((t + 1) / (T + 1)) + γ · (c − μ) / σ)

where ``T`` is the model's typical (median) completion length and ``μ``, ``σ`` the mean and standard
deviation of the confidence, all three measured on the training table. β > 0 favours short answers, γ > 0
confident ones; β = γ = 0 gives every sample weight 1, i.e. plain majority. ``T``, ``μ`` and ``σ`` only fix
the units (a factor shared by all samples of a vote cancels), so β and γ read the same across models.
A missing length or confidence drops its term (factor 1).

:func:`weighted_vote` scores each answer class by the sum of its samples' weights; null answers (class
None or < 0) never vote; the top classes share the win, each of t tied classes taking credit 1/t — the
maj@k convention of :mod:`isocompute.solver.estimators` (scores within a relative 1e-12 tie, so unit
weights tie exactly as counts do).

Worked example: classes ``[0, 1, 1, None]`` with tokens ``[100, 400, 500, 50]``, T = 200, β = 1, γ = 0:
weights ≈ [2.0, 0.50, 0.40, 3.9]; scores 0: 2.0, 1: 0.90 → class 0 wins alone (plain majority: class 1).

:class:`VoteWeights` is what a fit saves (``vote.json``, :meth:`VoteWeights.save` / :func:`load_vote`) and
what the gateway's ``strategy="weighted"`` applies. This module ignores how β and γ are chosen
(:mod:`isocompute.solver.votes.fit`) and where the evidence comes from.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from isocompute.errors import InputError

__all__ = ["CONFIDENCE_FIELDS", "TIE_RTOL", "VOTE_SCHEMA", "VoteWeights", "load_vote", "weighted_vote"]

VOTE_SCHEMA = 1
TIE_RTOL = 1e-12
CONFIDENCE_FIELDS = ("confidence_min_window", "logprob_mean")  # per-sample fields, preferred first


def weighted_vote(classes: Sequence[Hashable | None], weights: Sequence[float]) -> dict[Hashable, float]:
    """The winning classes and their credit (1/t each of t tied; empty when no sample has an answer)."""
    if len(classes) != len(weights):
        raise ValueError(f"weighted_vote needs one weight per sample; got {len(classes)} classes, "
                         f"{len(weights)} weights")
    scores: dict[Hashable, float] = {}
    for c, w in zip(classes, weights, strict=True):
        if c is None or (isinstance(c, int | np.integer) and c < 0):
            continue
        scores[c] = scores.get(c, 0.0) + float(w)
    if not scores:
        return {}
    top = max(scores.values())
    tied = [c for c, s in scores.items() if s == top or math.isclose(s, top, rel_tol=TIE_RTOL)]
    return {c: 1.0 / len(tied) for c in tied}


@dataclass(frozen=True)
class VoteWeights:
    """A fitted weight function (module docstring). ``confidence_field`` names the per-sample field the
    confidence term reads (None: no confidence term); ``fit`` is the fit's record (k, accuracies, CI, kept)."""

    beta: float = 0.0
    gamma: float = 0.0
    typical_tokens: float = 1.0
    confidence_field: str | None = None
    confidence_mean: float = 0.0
    confidence_std: float = 1.0
    fit: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for name in ("beta", "gamma", "typical_tokens", "confidence_mean", "confidence_std"):
            if not math.isfinite(float(getattr(self, name))):
                raise InputError(f"vote weights: {name} must be a finite number, got {getattr(self, name)!r}")
        if self.typical_tokens < 0 or self.confidence_std <= 0:
            raise InputError("vote weights: typical_tokens must be ≥ 0 and confidence_std > 0; refit the vote "
                             "(`bench/bench_weighted_votes.py … --save vote.json`)")
        if self.confidence_field is not None and self.confidence_field not in CONFIDENCE_FIELDS:
            raise InputError(f"vote weights: confidence_field must be one of {CONFIDENCE_FIELDS} or null, got "
                             f"{self.confidence_field!r}")

    @property
    def is_plain(self) -> bool:
        """True when every weight is 1 (the vote is plain majority)."""
        return self.beta == 0.0 and self.gamma == 0.0

    def log_weights(self, tokens: np.ndarray, confidence: np.ndarray | None = None) -> np.ndarray:
        """log w per sample (any shape); NaN tokens or confidence drop their term."""
        t = np.asarray(tokens, dtype=np.float64)
        out = np.zeros(t.shape)
        if self.beta != 0.0:
            rel = np.log((t + 1.0) / (self.typical_tokens + 1.0))
            out -= self.beta * np.where(np.isnan(rel), 0.0, rel)
        if self.gamma != 0.0 and confidence is not None:
            z = (np.asarray(confidence, dtype=np.float64) - self.confidence_mean) / self.confidence_std
            out += self.gamma * np.where(np.isnan(z), 0.0, z)
        return out

    @property
    def reads_confidence(self) -> bool:
        """Whether the weights have a confidence term (γ ≠ 0 on a named field): votes then need logprobs."""
        return self.gamma != 0 and self.confidence_field is not None

    def weights(self, tokens: Sequence[float] | np.ndarray, confidence: Sequence[float | None] | None = None
                ) -> list[float]:
        """Each sample's weight, scaled so the largest is 1 (a shared factor cancels in the vote)."""
        conf = None if confidence is None else np.array([np.nan if c is None else c for c in confidence], float)
        lw = self.log_weights(np.asarray(tokens, dtype=np.float64), conf)
        return [] if lw.size == 0 else np.exp(lw - lw.max()).tolist()

    def to_dict(self) -> dict[str, Any]:
        return {"schema": VOTE_SCHEMA, **asdict(self)}

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write ``vote.json`` atomically (temp file + rename)."""
        p = Path(path)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, p)
        return p


def load_vote(path: str | os.PathLike[str]) -> VoteWeights:
    """Read a ``vote.json`` written by :meth:`VoteWeights.save`; InputError says what is wrong with it."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{p}: cannot read the vote weights ({e}); write one with "
                         "`bench/bench_weighted_votes.py TABLE --save vote.json`") from None
    if not isinstance(data, dict) or data.get("schema") != VOTE_SCHEMA:
        raise InputError(f"{p}: not a vote.json of schema {VOTE_SCHEMA} (got "
                         f"{data.get('schema') if isinstance(data, dict) else type(data).__name__!r}); refit it")
    fields = {"beta", "gamma", "typical_tokens", "confidence_field", "confidence_mean", "confidence_std", "fit"}
    unknown = set(data) - fields - {"schema"}
    if unknown:
        raise InputError(f"{p}: unknown keys {sorted(unknown)}; a vote.json holds {sorted(fields)}")
    try:
        return VoteWeights(**{k: v for k, v in data.items() if k in fields})
    except TypeError as e:
        raise InputError(f"{p}: malformed vote weights ({e})") from None
