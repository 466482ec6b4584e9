"""FlopBreakdown: a compute total split into rollout, update and reward FLOPs, with ρ.

The split is the point (RACE, seed 002 §9): two runs with the same total can spend it on exploration
(rollouts), on learning (updates) or on feedback (reward-model inference). The update fraction

    ρ = F_update / F_total,   F_total = F_rollout + F_update + F_reward

summarises where a run sits. Example: rollout 6e15, update 3e15, reward 1e15 → total 1e16, ρ = 0.3.
ρ of an empty breakdown (total 0) is NaN — undefined, not zero.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from isocompute.errors import InputError


@dataclass(frozen=True)
class FlopBreakdown:
    """FLOPs spent on rollouts (policy sampling), policy updates and reward/verifier inference."""

    rollout: float = 0.0
    update: float = 0.0
    reward: float = 0.0

    @property
    def total(self) -> float:
        return self.rollout + self.update + self.reward

    @property
    def rho(self) -> float:
        """Update fraction F_update / F_total (NaN when nothing was spent)."""
        total = self.total
        return self.update / total if total > 0 else float("nan")

    def __add__(self, other: FlopBreakdown) -> FlopBreakdown:
        return FlopBreakdown(self.rollout + other.rollout, self.update + other.update, self.reward + other.reward)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> FlopBreakdown:
        try:
            values = {k: float(data[k]) for k in ("rollout", "update", "reward")}
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(
                f"a FLOP breakdown needs numeric 'rollout', 'update' and 'reward' fields ({e!r}); "
                f"was the file written by FlopLedger.save?"
            ) from None
        if any(v < 0 for v in values.values()):
            raise InputError(f"FLOP counts cannot be negative; got {values}.")
        return cls(**values)
