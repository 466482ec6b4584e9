"""The learned continuation as a stopping rule the gateway runs: :class:`EvidenceRule`.

A plan ``Plan(waves, EvidenceRule(...), modes=parallel)`` runs like any parallel-stop plan
(:meth:`isocompute.solver.plans.plan.Plan.on_finish`), but its rule reads *evidence* beside the vote: at
each finish the runner passes the finished samples' lengths (tokens, in finish order), the samples still
running, the wave, and the tokens and latency spent so far (and per-sample confidence when its heads were
trained with it: ``needs_confidence``; the runner then asks the stream for logprobs). The rule computes the
evidence features
(:func:`isocompute.policy.evidence.features.state_features` — the very columns it was trained on, from
walks), asks the continuation heads and stops when no continuation is worth its price:
max_K Ĝ_K − λ·T̂_K − μ·L̂_K ≤ 0 (:mod:`isocompute.policy.evidence.continuation`). Its
:class:`~isocompute.solver.plans.rules.StopDecision` carries ``detail``: the features it saw, each
continuation's predicted gain, tokens and latency, and the score — what the response's ``isocompute``
object shows.

Worked example: ``evidence:lam=0.004,mu=0@4s,8s`` — two samples of four finish at 700 and 760 tokens
(unit 763) with one answer; the heads predict gains (0.001, 0.001, 0.002) for (next finish, this wave, the
plan's end) at tokens (1.9, 2.1, 10.5): every score is below 0, so the wave stops at the second finish.

Ignores: votes without evidence (an engine that reports no lengths): then the rule never stops early and
the plan runs to its end, which is safe but dear.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from isocompute.policy.evidence.continuation import Heads
from isocompute.policy.evidence.features import NAMES, state_features
from isocompute.solver.plans.rules import StopDecision, StoppingRule, vote_state

__all__ = ["EvidenceRule"]

SHOWN = ("finished", "running", "margin", "share", "log_now", "log_first", "log_leader", "tokens", "latency",
         "conf_leader")


@dataclass(frozen=True, eq=False)
class EvidenceRule(StoppingRule):
    """Stop when no continuation's predicted gain pays for its tokens at ``lam`` and latency at ``mu``."""

    kind: ClassVar[str] = "evidence"
    needs_evidence: ClassVar[bool] = True
    lam: float
    mu: float = 0.0
    unit: float = field(default=1.0, repr=False)
    heads: Heads | None = field(default=None, repr=False)

    @property
    def needs_confidence(self) -> bool:
        """Whether its heads were trained with the samples' confidence: the runner then asks the stream for
        logprobs and passes ``confidence`` in the evidence (:mod:`isocompute.app.runner.parallel_wave`)."""
        return self.heads is not None and self.heads.confidence

    @property
    def threshold(self) -> float:
        return 0.0

    @property
    def name(self) -> str:
        return f"evidence:lam={self.lam:.4g},mu={self.mu:.4g}"

    def statistic(self, states: Any) -> np.ndarray:
        return np.full(len(states.samples), -np.inf)  # no vote alone makes it stop: it needs evidence

    def should_stop(self, answers: Sequence[Hashable | None]) -> StopDecision:
        _, leader = vote_state(answers)
        return StopDecision(most_common=leader, prob=-math.inf, stop=False)

    def should_stop_given(self, answers: Sequence[Hashable | None], evidence: Mapping[str, Any]) -> StopDecision:
        """The verdict on the vote of ``answers`` with ``evidence`` (module docstring)."""
        _, leader = vote_state(answers)
        if self.heads is None or leader is None:
            return StopDecision(most_common=leader, prob=-math.inf, stop=False)
        x = state_features(list(answers), list(evidence["lengths"]), running=int(evidence["running"]),
                           wave=int(evidence["wave"]), tokens=float(evidence["tokens"]),
                           latency=float(evidence["latency"]), unit=self.unit,
                           confidence=evidence.get("confidence"))
        pred = self.heads.predict(x[None, :])
        per = pred["gain"][0] - self.lam * pred["tokens"][0] - self.mu * pred["latency"][0]
        score = float(per.max())
        detail = {
            "features": {k: (None if not math.isfinite(v) else round(float(v), 4))
                         for k, v in zip(NAMES, x, strict=True) if k in SHOWN},
            "continuations": [{"horizon": _horizon(K), "gain": round(float(g), 5), "tokens": round(float(t) * self.unit, 1),
                               "latency": round(float(lt) * self.unit, 1)}
                              for K, g, t, lt in zip(self.heads.horizons, pred["gain"][0], pred["tokens"][0],
                                                     pred["latency"][0], strict=True)],
            "score": round(score, 6), "decision": "stop" if score <= 0 else "continue",
        }
        return StopDecision(most_common=leader, prob=score, stop=score <= 0, detail=detail)


def _horizon(K: int) -> str:
    return {0: "plan_end", -1: "wave_end"}.get(K, f"next_{K}")
