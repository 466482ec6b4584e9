"""Outcome records in memory: :class:`Sample` and :class:`OutcomeRecord`, and their JSON line.

:func:`record_to_dict` is the line's object (optional fields that are ``None``, or an empty meta, left
out; ``"class"`` on every sample or on none); :func:`record_to_json` the line itself, validated as the
reader validates it. The format is in the :mod:`isocompute.solver.outcomes` docstring.

Ignores: files (:mod:`isocompute.solver.outcome_writer` appends lines, :mod:`isocompute.solver.outcomes`
reads them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from isocompute.solver.outcome_checks import _check_record

__all__ = ["OutcomeRecord", "Sample", "record_to_dict", "record_to_json"]


@dataclass(frozen=True, slots=True)
class Sample:
    """One graded completion; ``answer_class`` is written as ``"class"`` (module docstring)."""

    answer: str | None
    correct: bool | None  # None: ungraded (no gold), written without "correct"
    completion_tokens: int | None = None
    score: float | None = None
    answer_class: int | None = None
    logprob_mean: float | None = None
    confidence_min_window: float | None = None


@dataclass(frozen=True, slots=True)
class OutcomeRecord:
    """One prompt with its graded samples: a line of the outcome table."""

    id: str
    prompt: str
    gold: str | None  # None: no gold (traffic), written without "gold"
    samples: tuple[Sample, ...]
    prompt_tokens: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def record_to_dict(record: OutcomeRecord) -> dict[str, Any]:
    """The JSON object for ``record``; optional fields that are ``None`` (or an empty meta) are left out."""
    out: dict[str, Any] = {"id": record.id, "prompt": record.prompt}
    if record.gold is not None:
        out["gold"] = record.gold
    if record.prompt_tokens is not None:
        out["prompt_tokens"] = record.prompt_tokens
    with_class = any(s.answer_class is not None for s in record.samples)
    out["samples"] = [_sample_to_dict(s, with_class) for s in record.samples]
    if record.meta:
        out["meta"] = record.meta
    return out


def _sample_to_dict(s: Sample, with_class: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"answer": s.answer}
    if with_class:
        out["class"] = s.answer_class
    if s.correct is not None:
        out["correct"] = s.correct
    if s.completion_tokens is not None:
        out["completion_tokens"] = s.completion_tokens
    if s.score is not None:
        out["score"] = s.score
    if s.logprob_mean is not None:
        out["logprob_mean"] = s.logprob_mean
    if s.confidence_min_window is not None:
        out["confidence_min_window"] = s.confidence_min_window
    return out


def record_to_json(record: OutcomeRecord | Mapping[str, Any]) -> str:
    """One line of the table (without the newline), validated the same way the reader validates it."""
    obj = record_to_dict(record) if isinstance(record, OutcomeRecord) else dict(record)
    _check_record(obj, lambda: f"record {obj.get('id')!r}")
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
