"""Request pricing: a request's budget in every unit the gateway needs, checked against the limits.

For a request with budget ``B`` in unit ``u`` to a policy whose budgets are in unit ``p`` (each
``samples`` or ``flops``), with ``s`` the FLOPs of one sample::

    B_samples = B            if u = samples,      B / s            if u = flops
    B_policy  = B_samples    if p = samples,      B_samples · s    if p = flops

``s`` is the policy's training average when it prices in FLOPs, else this request's prompt with a
``max_tokens`` completion (an overestimate, so the first requests underspend; the budget controller,
which measures the error in the request's unit, corrects the conversion online). Checks, in order:
``B_samples ≤ max_budget`` (the server's limit is in samples), then ``B_policy`` inside the policy's
calibrated range.

The cap on samples per prompt (all of a plan's waves together) is ``min(server max_samples, request
max_samples)``, and the cap on waves ``min(server max_waves, request max_waves)``; both are 1 at
temperature 0: greedy samples are all the same sample, so the engine draws one and one is charged. The
budget controller's key is ``(caller, B, u, cap, wave cap)``: a capped request cannot spend what an
uncapped one can, so capped traffic gets its own controller instead of pulling everyone's internal
budget to the top of its range.

Worked example: ``B = 2e9`` FLOPs, a samples policy calibrated on [1, 16], ``s = 5e8`` →
``B_samples = B_policy = 4``; at temperature 0.7 with no request cap and server caps of 64 samples and
32 waves the key is ``("anonymous", 2e9, "flops", 64, 32)``, labelled ``anonymous:2e+09flops``; with
``max_samples = 2`` it is ``(…, 2, 32)``, labelled ``anonymous:2e+09flops:max2``, and with ``max_waves = 3``
``(…, 64, 3)``, labelled ``anonymous:2e+09flops:waves3``.

Ignores: the caller's own limit (``Principal.check_budget``: a permission, checked by the gateway), and
the price of the probe and extra features, which the policy already adds to every action's cost
(:meth:`BudgetPlan.charge` converts such a cost into the request's unit).
"""

from __future__ import annotations

from dataclasses import dataclass

from isocompute.app.settings import Settings
from isocompute.errors import BudgetError

__all__ = ["BudgetPlan", "budget_unit", "price_request"]


@dataclass(frozen=True, slots=True)
class BudgetPlan:
    """A request's budget, priced (see the module docstring).

    ``budget``/``unit``: ``B`` and ``u`` as the request means them (the server default when it sent
    none); ``samples``: ``B_samples``; ``policy_budget``/``policy_unit``: ``B_policy`` and ``p``;
    ``sample_flops``: ``s`` (None when both units are samples and it was not needed); ``cap``: the most
    samples per prompt; ``wave_cap``: the most waves per prompt; ``key``/``label``: the budget
    controller's key and its metric label.
    """

    budget: float
    unit: str
    samples: float
    policy_budget: float
    policy_unit: str
    sample_flops: float | None
    cap: int
    wave_cap: int
    key: tuple[str, float, str, int, int]
    label: str

    def in_request_unit(self, cost: float, unit: str) -> float:
        """``cost`` (in ``unit``) converted to the request's unit with ``sample_flops``."""
        if unit == self.unit:
            return cost
        assert self.sample_flops is not None  # price_request refused the request otherwise
        return cost * self.sample_flops if self.unit == "flops" else cost / self.sample_flops

    def charge(self, declared: float, flops: float | None) -> float:
        """What a per-request extra (the probe, an extra feature block) costs in the request's unit: its
        measured ``flops`` for a FLOP budget when known, else its ``declared`` cost (policy unit), converted."""
        if self.unit == "flops" and flops is not None:
            return flops
        return self.in_request_unit(declared, self.policy_unit)


def budget_unit(budget: float | None, unit: str | None, default_unit: str) -> str:
    """The unit a request's budget is in: as sent; a budget sent without one is in samples; no budget:
    the server default's unit."""
    return unit or (default_unit if budget is None else "samples")


def price_request(
    budget: float | None,
    unit: str | None,
    *,
    caller: str,
    policy_range: tuple[float, float],
    policy_unit: str,
    sample_flops: float | None,
    limits: Settings,
    max_samples: int | None,
    temperature: float,
    max_tokens: int,
    max_waves: int | None = None,
) -> BudgetPlan:
    """Price one request (module docstring). ``limits`` gives the server's defaults and limits
    (``default_budget``, ``default_budget_unit``, ``max_budget``, ``max_samples``, ``max_waves``); ``sample_flops`` may be
    None when the server cannot count FLOPs (no model config), which is fine unless a unit is ``flops``.

    Raises :class:`BudgetError` (→ 400) with the fix.
    """
    unit = budget_unit(budget, unit, limits.default_budget_unit)
    B = limits.default_budget if budget is None else float(budget)
    lo, hi = policy_range
    s = 1.0 if unit == policy_unit == "samples" else sample_flops
    if s is None:
        raise BudgetError("budget_unit 'flops' needs the model's config for FLOP accounting; start the gateway "
                          "with --model DIR, or send the budget in samples")
    b_samples = B if unit == "samples" else B / s
    b_policy = b_samples if policy_unit == "samples" else b_samples * s
    shown = (f"{B:g} samples" if unit == "samples" else
             f"{B:g} FLOPs (≈ {b_samples:.3g} samples of up to {max_tokens} tokens here)")
    if b_samples > limits.max_budget:
        raise BudgetError(f"budget {shown} exceeds this server's max_budget {limits.max_budget:g} samples; "
                          "send a smaller budget")
    if not (lo <= b_policy <= hi):
        raise BudgetError(f"budget {shown} is outside the policy's calibrated range [{lo:g}, {hi:g}] "
                          f"{policy_unit} per request; send a budget in that range")
    cap = 1 if temperature == 0 else min(limits.max_samples, max_samples or limits.max_samples)
    wave_cap = 1 if temperature == 0 else min(limits.max_waves, max_waves or limits.max_waves)
    label = (f"{caller}:{B:g}{unit}" + ("" if cap == limits.max_samples else f":max{cap}")
             + ("" if wave_cap == limits.max_waves else f":waves{wave_cap}"))
    return BudgetPlan(B, unit, b_samples, b_policy, policy_unit, None if unit == policy_unit == "samples" else s,
                      cap, wave_cap, (caller, B, unit, cap, wave_cap), label)
