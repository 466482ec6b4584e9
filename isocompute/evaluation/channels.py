"""Per-plan channels the report averages like waves: expected tokens generated and latency per prompt.

A channel is an (N, P) array over the table's prompts and plans — with token counts on the table,
``tokens`` (expected completion tokens generated, :attr:`isocompute.policy.plans.arrays.PlanArrays.tokens`)
and ``latency`` (:func:`latency_channel`: the expected decode length until the plan's last wave ends over
one sample's mean completion length on the table, so 1.0 = waiting for one sample, plus the report's
``--wave-overhead`` O per expected wave — solve's latency, ``L = latency_tokens / unit + O · waves``). Every
method's action probabilities P (n, P) are averaged over it per held-out prompt, (P · X).sum(axis=1), as its
cost and waves are, so a method's latency is its decode latency + O × its expected waves; a fixed baseline
scores its chosen mix on it. Without token counts there are no channels and nothing here adds a key.
:func:`add_seconds` turns every row's latency into seconds at a decode speed (``--decode-speed``).

Worked example: uniform at budget 2 plays ``none@2`` everywhere, so its tokens are 2 × the mean completion
length and its latency the mean over prompts of E[max of 2 lengths] / unit, + O (one wave); at unit = 1,735
tokens, latency 1.3 and 50 tokens/s its ``latency_s`` is 1.3 × 1,735 / 50 = 45.1 s.

The ``gold`` and ``consensus`` channels are each plan's utility under the other target
(:mod:`isocompute.solver.votes.consensus`), averaged the same way: a method's accuracy on gold beside its
accuracy on the target it was fitted and scored on.

Ignores: serving effects beyond the one overhead per wave (batching, a decode speed that varies with load).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

CHANNELS = ("tokens", "latency", "gold", "consensus")


def latency_channel(latency_tokens: Any, waves: Any, unit: float, overhead: float = 0.0) -> np.ndarray:
    """(N, P) latency in sample units: decode tokens until each wave ends over ``unit`` tokens, plus
    ``overhead`` (same units) per expected wave."""
    return np.asarray(latency_tokens, dtype=np.float64) / unit + overhead * np.asarray(waves, dtype=np.float64)


def add_seconds(entries: list[dict[str, Any]], unit: float, speed: float) -> None:
    """Every method row with a latency gets ``latency_s`` = latency × ``unit`` tokens / ``speed`` tokens
    per second (in place; ``entries``: the summary's budgets)."""
    for e in entries:
        for row in e["methods"].values():
            if row.get("latency") is not None:
                row["latency_s"] = float(row["latency"]) * unit / speed


def plan_channels(tokens: Any = None, latency: Any = None, gold: Any = None,
                  consensus: Any = None) -> dict[str, np.ndarray]:
    """The channels given (None: absent) as float arrays, in :data:`CHANNELS` order. ``gold`` /
    ``consensus``: each plan's utility under the target the evaluation is not scored on (a policy fitted
    under consensus is also scored on gold where the table has it, and one fitted on gold shows its
    consensus agreement), so every method's accuracy appears under both side by side."""
    given = (tokens, latency, gold, consensus)
    return {k: np.asarray(v, dtype=np.float64) for k, v in zip(CHANNELS, given, strict=True) if v is not None}


def rows_of(channels: Mapping[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    """Each channel's ``rows`` (a fold's prompts)."""
    return {k: v[rows] for k, v in channels.items()}


def method_means(ev: Any, m: int, bi: int) -> dict[str, float]:
    """Method ``m``'s mean of every channel the evaluation ``ev`` holds at budget ``bi`` (report.json keys)."""
    return {k: float(x[:, m, bi].mean()) for k in CHANNELS if (x := getattr(ev, k, None)) is not None}


def target_section(report: dict[str, Any]) -> list[str]:
    """Markdown: what accuracy is scored on and, per budget, every method under both targets side by side."""
    t = report.get("target")
    if not t:
        return []
    ag = t.get("agreement")
    lines = ["## Target", "", f"Accuracy is scored on **{t['scored_on']}**"
             + ("" if t["scored_on"] == "gold" else " (a sample is credited by agreement with its prompt's "
                "plurality answer over all its samples; ties split evenly)") + "."]
    if ag:
        lines[-1] += (f" Consensus vs gold on this table: {100 * ag['sample_flip']:.1f}% of samples change verdict, "
                      f"the plurality answer is right on {100 * ag['plurality_right']:.1f}% of prompts.")
    other = t.get("also")
    if other is None:
        return lines + ["", "The table has no gold verdicts: no gold accuracy to show.", ""]
    lines += ["", f"| budget | method | {t['scored_on']} | {other} |", "|---:|---|---:|---:|"]
    for e in report["budgets"]:
        for name, x in e["methods"].items():
            if x.get(other) is not None:
                lines.append(f"| {e['budget']:.4g} | {name} | {x['accuracy']:.4f} | {x[other]:.4f} |")
    return lines + [""]
