"""The problem record shared by every task."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Problem:
    """One question with its reference answer.

    ``id`` is unique within a task (e.g. ``"gsm8k-17"``); ``prompt`` is the text given to the model;
    ``gold`` is the reference final answer as a string (None: an unlabelled prompt, sampled ungraded); ``meta`` holds task-specific fields
    (e.g. ``{"difficulty": 3}`` for arith, ``{"level": 5, "subject": "Algebra"}`` for MATH).
    """

    id: str
    prompt: str
    gold: str | None
    task: str
    meta: dict[str, Any] = field(default_factory=dict)
