"""Request pricing: a request's budget in every unit the gateway needs, checked against the limits.

For a request with budget ``B`` in unit ``u`` to a policy whose budgets are in unit ``p`` (each
``samples``, ``tokens`` or ``flops``), with ``n_u`` the size of one sample in unit ``u`` (``n_samples = 1``,
``n_tokens = t`` its completion tokens, ``n_flops = s`` its FLOPs)::

    B_samples = B / n_u
    B_policy  = B                  if u = p,          B_samples · n_p    otherwise

``s`` is the policy's training average when it prices in FLOPs, else this request's prompt with a
``max_tokens`` completion; ``t`` is the policy's ``tokens_per_sample`` (one sample's mean completion
tokens on its training table) when it has one, else ``max_tokens``. The fallbacks overestimate a sample,
so the first requests underspend; the budget controller, which measures the error in the request's
unit, corrects the conversion online. A budget written ``"4x"`` (a string: a positive number followed by
x) is ``4 · t`` tokens — only for a tokens-unit policy with a ``tokens_per_sample``, whose ``1x`` the
fit's ``--budgets 1x:16x`` meant too. Checks, in order: the x form, ``B_samples ≤ max_budget`` (the
server's limit is in samples), ``B_policy`` inside the policy's calibrated range, then a latency budget
(sample lengths) inside the policy's latency range (a policy fitted without one refuses any).

The cap on samples per prompt (all of a plan's waves together) is ``min(server max_samples, request
max_samples)``, and the cap on waves ``min(server max_waves, request max_waves)``; both are 1 at
temperature 0: greedy samples are all the same sample, so the engine draws one and one is charged. The
budget controller's key is ``(caller, B, u, cap, wave cap)``, with the latency budget ``L`` appended
when the request sends one: a capped request cannot spend what an uncapped one can, and a latency budget
changes which plans the same cost budget buys, so such traffic gets its own controller instead of
pulling everyone's internal budget to the top of its range. ``B`` and ``L`` enter the key on a grid of three
significant digits (``_grid``: 4.0037 → 4.0), so budgets that differ by less than that share a controller —
a client cannot grow the controllers and their metric series with budgets differing in the tenth digit.

Worked example: ``B = 2e9`` FLOPs, a samples policy calibrated on [1, 16], ``s = 5e8`` →
``B_samples = B_policy = 4``; at temperature 0.7 with no request cap and server caps of 64 samples and
32 waves the key is ``("anonymous", 2e9, "flops", 64, 32)``, labelled ``anonymous:2e+09flops``; with
``max_samples = 2`` it is ``(…, 2, 32)``, labelled ``anonymous:2e+09flops:max2``, and with ``max_waves = 3``
``(…, 64, 3)``, labelled ``anonymous:2e+09flops:waves3``. A tokens policy with ``t = 50`` and the budget
``"4x"`` at latency budget 1.5: ``B = B_policy = 200`` tokens, ``B_samples = 4``, key
``("anonymous", 200, "tokens", 64, 32, 1.5)``, labelled ``anonymous:200tokens:lat1.5``.

Ignores: the caller's own limit (``Principal.check_budget``: a permission, checked by the gateway), and
the price of the probe and extra features, which the policy already adds to every action's cost
(:meth:`BudgetPlan.charge` converts such a cost into the request's unit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic_core import PydanticCustomError

from isocompute.app.settings import Settings
from isocompute.errors import BudgetError

__all__ = ["BudgetPlan", "budget_unit", "price_request"]


@dataclass(frozen=True, slots=True)
class BudgetPlan:
    """A request's budget, priced (see the module docstring).

    ``budget``/``unit``: ``B`` and ``u`` as the request means them (the server default when it sent
    none; a budget written ``"4x"`` resolved to tokens, and ``written`` then holds it as written);
    ``samples``: ``B_samples``; ``policy_budget``/``policy_unit``: ``B_policy`` and ``p``;
    ``sample_flops``: ``s`` and ``sample_tokens``: ``t`` (each None when neither unit needs it); ``cap``:
    the most samples per prompt; ``wave_cap``: the most waves per prompt; ``key``/``label``: the budget
    controller's key and its metric label; ``latency_budget``: the latency budget sent (sample lengths),
    None without one.
    """

    budget: float
    unit: str
    samples: float
    policy_budget: float
    policy_unit: str
    sample_flops: float | None
    cap: int
    wave_cap: int
    key: tuple[Any, ...]
    label: str
    sample_tokens: float | None = None
    written: str | None = None
    latency_budget: float | None = None

    def per_sample(self, unit: str) -> float:
        """One sample in ``unit`` (``n_u`` of the module docstring)."""
        n = 1.0 if unit == "samples" else self.sample_flops if unit == "flops" else self.sample_tokens
        assert n is not None  # price_request refused the request otherwise
        return n

    def in_request_unit(self, cost: float, unit: str) -> float:
        """``cost`` (in ``unit``) converted to the request's unit through one sample's size in each."""
        if unit == self.unit:
            return cost
        return cost / self.per_sample(unit) * self.per_sample(self.unit)

    def charge(self, declared: float, flops: float | None, tokens: float | None = None) -> float:
        """What a per-request extra (the probe, an extra feature block) costs in the request's unit: its
        measured ``flops`` for a FLOP budget, or its generated ``tokens`` for a tokens budget, when known;
        else its ``declared`` cost (policy unit), converted."""
        if self.unit == "flops" and flops is not None:
            return flops
        if self.unit == "tokens" and tokens is not None:
            return float(tokens)
        return self.in_request_unit(declared, self.policy_unit)


def budget_unit(budget: float | str | None, unit: str | None, default_unit: str) -> str:
    """The unit a request's budget is in: as sent; a number sent without one is in samples, a multiple
    (``"4x"``) in tokens; no budget: the server default's unit."""
    if unit:
        return unit
    if budget is None:
        return default_unit
    return "tokens" if isinstance(budget, str) else "samples"


def _multiple(written: str, unit: str, policy_unit: str, tokens_per_sample: float | None) -> float:
    """A budget written ``"4x"``, in tokens (module docstring), or BudgetError saying what to send."""
    if unit != "tokens":
        raise BudgetError(f"budget {written!r} is a multiple of one sample's mean tokens, so it is in tokens; "
                          f"drop budget_unit {unit!r} (or send 'tokens'), or send a number in {unit}")
    if policy_unit != "tokens":
        raise BudgetError(f"budget {written!r} (a multiple of one sample's mean tokens) is for a policy whose cost "
                          f"unit is tokens; this policy's budgets are in {policy_unit}: send a number (samples, or "
                          "budget_unit 'tokens' or 'flops')")
    if tokens_per_sample is None:
        raise BudgetError(f"budget {written!r}: this policy does not record one sample's mean tokens (fitted before "
                          "it was saved); send the budget in tokens (a number with budget_unit 'tokens') or "
                          "re-fit it")
    return float(written.strip()[:-1]) * tokens_per_sample


def _latency(latency_budget: float | None, latency_range: tuple[float, float] | None) -> float | None:
    """The latency budget sent, checked against the policy's latency range (BudgetError on
    ``latency_budget`` otherwise; the same tolerance as the policy's own check)."""
    if latency_budget is None:
        return None
    L = float(latency_budget)
    if latency_range is None:
        err = BudgetError("this policy was fitted without latency budgets; drop latency_budget, or re-fit it with "
                          "--latency-budgets LO:HI (sample lengths, e.g. 1:8)")
    elif not (latency_range[0] * (1 - 1e-9) <= L <= latency_range[1] * (1 + 1e-9)):
        lo, hi = latency_range
        err = BudgetError(f"latency budget {exact(L)} is outside the range [{lo:g}, {hi:g}] mean sample lengths per "
                          "request that this policy was trained for (1.0 = waiting for one sample); send a "
                          "latency_budget in that range")
    else:
        return L
    err.param = "latency_budget"  # type: ignore[attr-defined]  (the error body's param)
    raise err


def exact(x: float) -> str:
    """``x`` as short as ``:g`` writes it when that is exact, else in full: 16.0000001 is not shown as 16."""
    short = f"{x:g}"
    return short if float(short) == x else repr(float(x))


def _shown(B: float, unit: str, b_samples: float, written: str | None, max_tokens: int) -> str:
    """The budget as an error message shows it."""
    if written is not None:
        return f"{written} = {exact(B)} tokens"
    if unit == "samples":
        return f"{exact(B)} samples"
    if unit == "tokens":
        return f"{exact(B)} tokens (≈ {b_samples:.3g} samples)"
    return f"{exact(B)} FLOPs (≈ {b_samples:.3g} samples of up to {max_tokens} tokens here)"


def price_request(
    budget: float | str | None,
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
    tokens_per_sample: float | None = None,
    latency_budget: float | None = None,
    latency_range: tuple[float, float] | None = None,
) -> BudgetPlan:
    """Price one request (module docstring). ``limits`` gives the server's defaults and limits
    (``default_budget``, ``default_budget_unit``, ``max_budget``, ``max_samples``, ``max_waves``); ``sample_flops`` may be
    None when the server cannot count FLOPs (no model config), which is fine unless a unit is ``flops``;
    ``tokens_per_sample`` and ``latency_range`` are the policy's (None when it has none).

    Raises :class:`BudgetError` (→ 400) with the fix.
    """
    written = budget if isinstance(budget, str) else None
    unit = budget_unit(budget, unit, limits.default_budget_unit)
    B = (limits.default_budget if budget is None else
         _multiple(written, unit, policy_unit, tokens_per_sample) if written is not None else float(budget))
    units = {unit, policy_unit}
    s = sample_flops if "flops" in units else None
    t = (tokens_per_sample or float(max_tokens)) if "tokens" in units else None
    if "flops" in units and s is None:
        raise BudgetError("budget_unit 'flops' needs the model's config for FLOP accounting; start the gateway "
                          "with --model DIR, or send the budget in samples")
    n = {"samples": 1.0, "flops": s or 0.0, "tokens": t or 0.0}  # only units' own entries are read: not 0
    b_samples = B / n[unit]
    b_policy = B if unit == policy_unit else b_samples * n[policy_unit]
    shown = _shown(B, unit, b_samples, written, max_tokens)
    if b_samples > limits.max_budget:
        raise BudgetError(f"budget {shown} exceeds this server's max_budget {limits.max_budget:g} samples; "
                          "send a smaller budget")
    lo, hi = policy_range
    if not (lo <= b_policy <= hi):
        raise BudgetError(f"budget {shown} is outside the policy's calibrated range [{lo:g}, {hi:g}] "
                          f"{policy_unit} per request; send a budget in that range")
    L = _latency(latency_budget, latency_range)
    cap = 1 if temperature == 0 else min(limits.max_samples, max_samples or limits.max_samples)
    wave_cap = 1 if temperature == 0 else min(limits.max_waves, max_waves or limits.max_waves)
    Bk, Lk = _grid(B), None if L is None else _grid(L)
    label = (f"{caller}:{Bk:g}{unit}" + ("" if cap == limits.max_samples else f":max{cap}")
             + ("" if wave_cap == limits.max_waves else f":waves{wave_cap}") + ("" if Lk is None else f":lat{Lk:g}"))
    key = (caller, Bk, unit, cap, wave_cap) + (() if Lk is None else (Lk,))
    return BudgetPlan(B, unit, b_samples, b_policy, policy_unit, s, cap, wave_cap, key, label, t, written, L)


def _grid(x: float) -> float:
    """``x`` to three significant digits: the budget as the controller's key and label hold it."""
    return float(f"{x:.3g}")


def _positive(text: str) -> float | None:
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) and v > 0 else None


def budget_as_sent(v: Any) -> Any:
    """A request's ``budget`` as sent: a positive finite number; a numeric string (its number, as pydantic's
    lax mode reads it); or ``"4x"``, a positive number followed by x, kept as written (stripped)."""
    if isinstance(v, str):
        text = v.strip()
        multiple = text[-1:] in ("x", "X")
        b = _positive(text[:-1] if multiple else text)
        if b is None:
            raise PydanticCustomError("budget", "Input should be a positive number, or a positive number followed "
                                                "by x (a multiple of one sample's mean tokens, e.g. \"4x\")")
        return text if multiple else b
    if isinstance(v, int | float) and not isinstance(v, bool):  # a boolean: _Open refuses it
        if not math.isfinite(v):
            raise PydanticCustomError("finite_number", "Input should be a finite number")
        if v <= 0:
            raise PydanticCustomError("greater_than", "Input should be greater than 0")
    return v
