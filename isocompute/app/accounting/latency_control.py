"""Online latency control: keep each key's long-run mean latency on its latency budget when traffic drifts.

The μ controller beside the λ one (:mod:`isocompute.app.accounting.budget_control`), the same design on
the second dual. A policy fitted with latency budgets maps a latency budget ``L`` to a price ν on latency
(:mod:`isocompute.policy.latency`) through a table calibrated on *training* traffic; live traffic whose
samples run longer (or shorter) than the training table's makes the same ν wait longer (or shorter) than
``L``. So, per controller key of a request that sends a latency budget (pricing appends ``L`` to the key),
the gateway keeps an *internal latency budget* ``l`` — the one handed to ``decide(…, latency_budget=l)`` —
and corrects it after every prompt with realised latency ``r`` exactly as the budget controller corrects
the internal budget (:class:`LatencyController`: the same projected dual ascent with a bounded step)::

    e_t = (L − r_t) / L,   I_{t+1} = clip(I_t + η · L · e_t, lo, hi),   l_{t+1} = l_t + clip(I_{t+1} − l_t, ±s·L)

``lo``, ``hi``: the policy's ``latency_range``; η, s: the gateway's ``control_gain``, ``control_max_step``
(one set of settings for both controllers; ``budget_control`` off hands ``L`` itself to the policy, and
the controller then only keeps the mean for the metric). Raising ``l`` lowers ν, so the sign is that of
the budget controller; the same identity bounds the mean error, ``(1/T) Σ e_t = (I_T − I_0)/(η·L·T)``
while ``I`` stays inside the range, and ``saturated`` says when it pins at an end.

**Realised latency** (:func:`realised_latency`), in sample lengths as the policy's: for each wave drawn,
the decode length until it ended — its longest sample's completion tokens (a parallel-stop wave's aborted
samples report the tokens they had at the stop, so its longest is the finish at which the rule fired) —
summed over waves, divided by ``tokens_per_sample`` (one sample's mean completion tokens on the training
table), plus the policy's ``wave_overhead`` per wave (its fit's ``--wave-overhead``; 0 when it has none)::

    r = Σ_w max_{j ∈ w} m_j / t + O · waves

Worked example: waves of 1 and 2 samples with 30 and (40, 55) completion tokens, t = 50, O = 0.1 →
r = (30 + 55)/50 + 0.2 = 1.9.

Ignores: the cost controller's moves (both run on the same key; each corrects its own mean, and the
coupling is slow next to η) and latency in seconds (queueing, decode speed under load).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from isocompute.app.accounting.budget_control import BudgetController, ControllerBank
from isocompute.app.accounting.pricing import BudgetPlan
from isocompute.app.settings import Settings

__all__ = ["LatencyControl", "LatencyController", "LatencyRoute", "realised_latency"]


def realised_latency(waves: Sequence[Sequence[int]], tokens_per_sample: float, overhead: float = 0.0) -> float:
    """A prompt's latency in sample lengths from each wave's completion tokens (module docstring); a wave
    of which no sample came back adds its overhead only."""
    if not (math.isfinite(tokens_per_sample) and tokens_per_sample > 0):
        raise ValueError(f"tokens_per_sample must be a positive finite number; got {tokens_per_sample}")
    decode = sum(max(w, default=0) for w in waves)
    return decode / tokens_per_sample + overhead * len(waves)


class LatencyController(BudgetController):
    """The μ controller of one key: a :class:`BudgetController` whose target is the latency budget ``L``
    (sample lengths), whose range is the policy's ``latency_range`` and whose ``observe`` takes a
    prompt's realised latency; ``internal`` is the latency budget handed to the policy."""


@dataclass(frozen=True, slots=True)
class LatencyRoute:
    """A routed request's latency control: the key's controller, the internal latency budget handed to
    the policy, and what :func:`realised_latency` needs (``tokens_per_sample`` None: not measurable)."""

    controller: LatencyController
    internal: float
    tokens_per_sample: float | None
    overhead: float = 0.0

    def realised(self, waves: Sequence[Sequence[int]]) -> float | None:
        """The prompt's realised latency (sample lengths), None when the policy has no ``tokens_per_sample``."""
        if self.tokens_per_sample is None:
            return None
        return realised_latency(waves, self.tokens_per_sample, self.overhead)


class LatencyControl:
    """The gateway's μ controllers, one per key of a request with a latency budget.

    Its bank holds only keys the budget controllers' bank holds: the gateway drops a key here
    (:meth:`drop`) when that bank evicts it, so the two share the key's metric label and its LRU bound.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.bank = ControllerBank(max_keys=settings.control_max_keys)

    def route(self, plan: BudgetPlan, policy: Any, *, keep: bool = True) -> LatencyRoute | None:
        """The request's :class:`LatencyRoute` (the key's controller made on first sight; with ``keep`` False,
        a dry run's, one not yet kept is made and not kept); None without a latency budget or for a policy
        without a latency range."""
        L, rng = plan.latency_budget, policy.latency_range
        if L is None or rng is None:
            return None
        s = self.settings

        def make() -> LatencyController:
            return LatencyController(L, lo=rng[0], hi=rng[1], gain=s.control_gain, max_step=s.control_max_step)

        ctl = self.bank.get(plan.key, make) if keep else (self.bank.peek(plan.key) or make())
        assert isinstance(ctl, LatencyController)
        tps = policy.tokens_per_sample
        return LatencyRoute(ctl, ctl.internal if s.budget_control else L, None if tps is None else float(tps),
                            float(getattr(policy, "wave_overhead", 0.0) or 0.0))

    def drop(self, key: Hashable) -> None:
        self.bank.drop(key)
