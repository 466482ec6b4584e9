"""Per-plan channels the report averages like waves: expected tokens generated and latency per prompt.

A channel is an (N, P) array over the table's prompts and plans — with token counts on the table,
``tokens`` (expected completion tokens generated, :attr:`isocompute.policy.plans.arrays.PlanArrays.tokens`)
and ``latency`` (expected decode length until the plan's last wave ends, in the unit the caller chose: the
report divides by one sample's mean completion length on the table, so 1.0 = waiting for one sample; no
per-wave overhead). Every method's action probabilities P (n, P) are averaged over it per held-out prompt,
(P · X).sum(axis=1), as its cost and waves are; a fixed baseline scores its chosen mix on it. Without token
counts there are no channels and nothing here adds a key. Worked example: uniform at budget 2 plays
``none@2`` everywhere, so its tokens are 2 × the mean completion length and its latency the mean over
prompts of E[max of 2 lengths] / unit.

Ignores: serving effects (batching, queueing) and the wave overhead (``solve --wave-overhead`` has one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

CHANNELS = ("tokens", "latency")


def plan_channels(tokens: Any = None, latency: Any = None) -> dict[str, np.ndarray]:
    """The channels given (None: absent) as float arrays, in :data:`CHANNELS` order."""
    return {k: np.asarray(v, dtype=np.float64) for k, v in zip(CHANNELS, (tokens, latency), strict=True)
            if v is not None}


def rows_of(channels: Mapping[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    """Each channel's ``rows`` (a fold's prompts)."""
    return {k: v[rows] for k, v in channels.items()}


def method_means(ev: Any, m: int, bi: int) -> dict[str, float]:
    """Method ``m``'s mean of every channel the evaluation ``ev`` holds at budget ``bi`` (report.json keys)."""
    return {k: float(x[:, m, bi].mean()) for k in CHANNELS if (x := getattr(ev, k, None)) is not None}
