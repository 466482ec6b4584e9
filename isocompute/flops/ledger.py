"""FlopLedger: running totals of rollout, update and reward FLOPs and tokens, in two conventions.

Every ``add_*`` call charges the same work twice: in the analytic count
(:mod:`isocompute.flops.analytic`: matmuls + context-dependent attention, prefix sharing, m − 1 decode
steps) and in the RACE convention (:mod:`isocompute.flops.race`: constant · parameters · tokens). Both
totals, their update fractions ρ and the token counts travel together, merge across workers
(:meth:`FlopLedger.merge`) and round-trip through JSON (:meth:`FlopLedger.save`, atomic).

Token counts: ``prompt_tokens`` are prompt tokens the policy prefilled (once per request with prefix
sharing, once per sample without), ``completion_tokens`` the sampled tokens, ``update_tokens`` the
tokens trained on, ``reward_tokens`` the tokens the reward model read. RACE's T_rollout is
``prompt_tokens + completion_tokens``.

Example: a 2-sample request (prompt 100, completions 50 and 70, prefix sharing) on a policy of
N = 1e9 adds prompt_tokens 100, completion_tokens 120, and RACE rollout 2·1e9·220 = 4.4e11.

Ignored: wall-clock time, hardware utilisation, and anything :mod:`isocompute.flops.analytic` ignores.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from isocompute.artifacts import atomic_write_text
from isocompute.errors import InputError
from isocompute.flops import analytic
from isocompute.flops.breakdown import FlopBreakdown
from isocompute.flops.model import ModelFlops
from isocompute.flops.race import RaceConvention

SCHEMA_VERSION = 1
_TOKEN_FIELDS = ("prompt_tokens", "completion_tokens", "update_tokens", "reward_tokens", "requests", "samples")


@dataclass
class FlopLedger:
    """Accumulated FLOPs (analytic and RACE) and token counts; see the module docstring."""

    analytic: FlopBreakdown = field(default_factory=FlopBreakdown)
    race: FlopBreakdown = field(default_factory=FlopBreakdown)
    convention: RaceConvention = field(default_factory=RaceConvention)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    update_tokens: int = 0
    reward_tokens: int = 0
    requests: int = 0
    samples: int = 0

    @property
    def rho(self) -> float:
        """Analytic update fraction F_update / F_total (NaN when empty)."""
        return self.analytic.rho

    @property
    def race_rho(self) -> float:
        """RACE update fraction (NaN when empty)."""
        return self.race.rho

    def add_rollout(
        self,
        policy: ModelFlops,
        prompt_tokens: int,
        completion_tokens: Sequence[int],
        *,
        prefix_sharing: bool = True,
    ) -> float:
        """Charge one sampling request (n = len(completion_tokens)); returns its analytic FLOPs."""
        n = len(completion_tokens)
        if n == 0:
            return 0.0
        flops = analytic.request_flops(policy, prompt_tokens, completion_tokens, prefix_sharing=prefix_sharing)
        prefilled = prompt_tokens * (1 if prefix_sharing else n)
        completed = int(sum(completion_tokens))
        self.analytic += FlopBreakdown(rollout=flops)
        self.race += FlopBreakdown(rollout=self.convention.rollout(policy.n_params, prefilled + completed))
        self.prompt_tokens += prefilled
        self.completion_tokens += completed
        self.requests += 1
        self.samples += n
        return flops

    def add_update(
        self, policy: ModelFlops, sequence_tokens: Sequence[int], *, n_lora: int | None = None
    ) -> float:
        """Charge one update over sequences of the given lengths (full fine-tuning when ``n_lora`` is
        None, LoRA with ``n_lora`` adapter weights otherwise); returns its analytic FLOPs."""
        lengths = np.asarray(list(sequence_tokens), dtype=np.float64)
        if n_lora is None:
            flops = float(np.sum(analytic.train_flops(policy, lengths)))
        else:
            flops = float(np.sum(analytic.lora_update_flops(policy, lengths, n_lora)))
        tokens = int(lengths.sum())
        self.analytic += FlopBreakdown(update=flops)
        self.race += FlopBreakdown(update=self.convention.update(policy.n_params, tokens, n_lora))
        self.update_tokens += tokens
        return flops

    def add_reward(
        self,
        reward_model: ModelFlops,
        prompt_tokens: int,
        completion_tokens: Sequence[int],
        *,
        logits: analytic.Logits = "all",
    ) -> float:
        """Charge a reward/verifier pass over each prompt + completion; returns its analytic FLOPs."""
        m = np.asarray(list(completion_tokens), dtype=np.float64)
        flops = float(np.sum(analytic.reward_flops(reward_model, prompt_tokens, m, logits=logits)))
        tokens = int(prompt_tokens * m.size + m.sum())
        self.analytic += FlopBreakdown(reward=flops)
        self.race += FlopBreakdown(reward=self.convention.reward(reward_model.n_params, tokens))
        self.reward_tokens += tokens
        return flops

    def merge(self, other: FlopLedger) -> FlopLedger:
        """A new ledger with both ledgers' totals; both must use the same RACE convention."""
        if other.convention != self.convention:
            raise InputError(
                f"cannot merge ledgers kept under different RACE conventions ({self.convention} vs "
                f"{other.convention}); recompute one of them with the other's constants."
            )
        counts = {k: getattr(self, k) + getattr(other, k) for k in _TOKEN_FIELDS}
        return FlopLedger(self.analytic + other.analytic, self.race + other.race, self.convention, **counts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "analytic": self.analytic.to_dict(),
            "race": self.race.to_dict(),
            "convention": self.convention.to_dict(),
            "tokens": {k: getattr(self, k) for k in _TOKEN_FIELDS},
        }

    @classmethod
    def from_dict(cls, data: Any) -> FlopLedger:
        if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
            found = data.get("schema_version") if isinstance(data, dict) else type(data).__name__
            raise InputError(
                f"not a FLOP ledger of schema version {SCHEMA_VERSION} (found {found!r}); pass a file "
                f"written by FlopLedger.save from this isocompute version."
            )
        try:
            tokens = {k: int(data["tokens"][k]) for k in _TOKEN_FIELDS}
            convention = RaceConvention(**{k: float(v) for k, v in data["convention"].items()})
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"FLOP ledger is missing or has a malformed field ({e!r}); re-save it.") from None
        return cls(FlopBreakdown.from_dict(data.get("analytic")), FlopBreakdown.from_dict(data.get("race")),
                   convention, **tokens)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the ledger as JSON, atomically (temp file + rename)."""
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> FlopLedger:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as e:
            raise InputError(f"cannot read FLOP ledger {path}: {e.strerror or e}; check the path.") from None
        except json.JSONDecodeError as e:
            raise InputError(f"FLOP ledger {path} is not valid JSON ({e}); it may be truncated.") from None
        return cls.from_dict(data)
