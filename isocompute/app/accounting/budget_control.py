"""Online budget control: keep each budget key's long-run mean cost on its budget when traffic drifts.

The policy was calibrated offline so that its mean cost on *training* traffic equals the budget it is
given. Live traffic drifts (a shift from easy to hard questions changes how many samples the same λ
buys), so the gateway does not pass the client's budget ``B`` straight through: per budget key it keeps
an *internal budget* ``b`` (the budget handed to ``Policy.decide``, which maps it to λ) and corrects it by
projected dual ascent after every request with realised cost ``c``::

    e_t     = (B − c_t) / B                              # relative shortfall of this request
    I_{t+1} = clip(I_t + η · S · e_t, lo, hi)             # dual ascent, projected on the policy's range
    b_{t+1} = b_t + clip(I_{t+1} − b_t, −s·S, s·S)        # bounded step: b follows I at most s·S a request

``lo``, ``hi`` are the policy's trained budget range and ``S = b_0`` the starting internal budget, which
carries the internal unit: ``S = B`` when the client's budget is in the policy's unit (samples), and a
conversion estimate when it is not (a FLOP budget; the error ``e`` is measured in the client's unit, so
a wrong conversion is corrected like any drift). Raising ``b`` lowers λ, so this is dual ascent on λ
written in budget units (cost is monotone in λ, so the sign is always right). The step bound keeps one
outlier (a FLOP-heavy request) from swinging λ, without biasing the mean: the part of a large correction
not yet applied stays in ``I`` and is applied over the next requests. Summing the update of ``I`` gives
the identity that bounds the long-run error while ``I`` stays inside ``[lo, hi]``::

    (1/T) Σ_t e_t = (I_T − I_0) / (η · S · T)

so the mean relative error over ``T`` requests is at most ``(hi − lo) / (η·S·T)`` whatever the traffic
does. Worked example: ``B = 4``, ``η = 0.05``, and a shift that needs ``b`` to move from 4 to 6 →
accumulated error 2 / (0.05·4) = 10 request-budgets, i.e. 0.5 % of the budget over 2,000 requests.
Discrete actions are fine: ``b`` hovering between two decision thresholds mixes the two actions in the
proportion that hits ``B`` (sigma–delta modulation).

What it ignores: which prompts the correction should fall on (it shifts λ for everyone under the key,
the Lagrangian choice) and cost noise (η trades tracking speed against λ jitter; the mean is exact anyway).
When traffic is so easy or hard that ``b`` pins at ``lo``/``hi``, no λ in the trained range meets ``B``:
``saturated`` says so.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ControllerState:
    """A snapshot of one controller, for metrics and the ``isocompute`` response object."""

    target: float
    internal_budget: float
    requests: int
    mean_cost: float | None
    saturated: bool


class BudgetController:
    """Dual-ascent controller for one budget key (see the module docstring for the maths).

    ``target`` is the client's budget ``B``; ``initial`` the starting internal budget ``S`` (default
    ``B``); ``lo``/``hi`` the range of budgets the policy accepts; ``gain`` is η; ``max_step`` is s, the
    largest move of the internal budget per request, in units of ``S``.
    """

    def __init__(self, target: float, *, lo: float, hi: float, gain: float = 0.05, max_step: float = 0.5,
                 initial: float | None = None):
        if not (math.isfinite(target) and target > 0):
            raise ValueError(f"target budget must be a positive finite number; got {target}")
        if not (lo <= hi):
            raise ValueError(f"need lo <= hi; got lo={lo}, hi={hi}")
        if not (gain > 0 and max_step > 0):
            raise ValueError(f"gain and max_step must be positive; got gain={gain}, max_step={max_step}")
        self.target = float(target)
        self.lo, self.hi = float(lo), float(hi)
        self.gain, self.max_step = float(gain), float(max_step)
        start = self.target if initial is None else float(initial)
        if not (math.isfinite(start) and start > 0):
            raise ValueError(f"initial internal budget must be a positive finite number; got {initial}")
        self.internal = min(max(start, self.lo), self.hi)
        self.integral = self.internal
        self.scale = self.internal
        self.requests = 0
        self.spent = 0.0
        self.explored = 0.0  # exploration's share of spent (charge)
        self.pending = 0.0  # exploration not yet fed to the correction

    def observe(self, cost: float) -> float:
        """Record one request's realised cost and return the corrected internal budget."""
        if not math.isfinite(cost) or cost < 0:
            raise ValueError(f"cost must be a finite non-negative number; got {cost}")
        self.requests += 1
        self.spent += cost
        take = min(self.pending, self.target)  # exploration charged earlier, fed in at most a target a request
        self.pending -= take
        err = (self.target - cost - take) / self.target
        self.integral = min(max(self.integral + self.gain * self.scale * err, self.lo), self.hi)
        s = self.max_step * self.scale
        self.internal += min(max(self.integral - self.internal, -s), s)
        return self.internal

    def charge(self, cost: float) -> None:
        """Exploration's ``cost`` (capture: a prompt's full draw, made after its answer): counted in the mean
        at once, not as a request, and fed to the correction over the next requests, at most one target's
        worth each (``pending``) — one exploration costs several budgets, and taken at once it would swing λ
        and pin the internal budget at ``lo``, where the projection loses the error."""
        if not math.isfinite(cost) or cost < 0:
            raise ValueError(f"cost must be a finite non-negative number; got {cost}")
        self.spent += cost
        self.explored += cost
        self.pending += cost

    @property
    def saturated(self) -> bool:
        """True when the internal budget sits at an end of the policy's range (the target is out of reach)."""
        return self.requests > 0 and (self.integral <= self.lo or self.integral >= self.hi)

    def state(self) -> ControllerState:
        mean = self.spent / self.requests if self.requests else None
        return ControllerState(self.target, self.internal, self.requests, mean, self.saturated)


class ControllerBank:
    """One controller per budget key, least-recently-used first out beyond ``max_keys``, and at most
    ``max_per_caller`` keys per caller (a key's first element; tuples of the gateway's pricing).

    Bounding the number of keys keeps memory (and the metrics' label set) flat when clients send many
    distinct budgets; the per-caller bound makes a caller who sends many distinct budgets evict its own
    least recently used keys, never another caller's controller. ``on_evict`` is called with each evicted
    key (the gateway drops its metric labels).
    """

    def __init__(self, *, max_keys: int = 10_000, max_per_caller: int | None = None,
                 on_evict: Callable[[Hashable], None] | None = None):
        if max_keys < 1 or (max_per_caller is not None and max_per_caller < 1):
            raise ValueError(f"max_keys and max_per_caller must be >= 1; got {max_keys}, {max_per_caller}")
        self._max = max_keys
        self._per_caller = max_per_caller
        self._on_evict = on_evict
        self._items: OrderedDict[Hashable, BudgetController] = OrderedDict()
        self._counts: dict[Hashable, int] = {}

    def get(self, key: Hashable, make: Callable[[], BudgetController]) -> BudgetController:
        """The key's controller; ``make()`` builds it the first time the key is seen."""
        ctl = self._items.get(key)
        if ctl is not None:
            self._items.move_to_end(key)
            return ctl
        caller = _caller(key)
        if self._per_caller is not None and self._counts.get(caller, 0) >= self._per_caller:
            self._evict(next(k for k in self._items if _caller(k) == caller))
        ctl = self._items[key] = make()
        self._counts[caller] = self._counts.get(caller, 0) + 1
        while len(self._items) > self._max:
            self._evict(next(iter(self._items)))
        return ctl

    def peek(self, key: Hashable) -> BudgetController | None:
        """The key's controller if kept, without making one or touching its recency (a dry run's)."""
        return self._items.get(key)

    def _evict(self, key: Hashable) -> None:
        self._forget(key)
        if self._on_evict is not None:
            self._on_evict(key)

    def _forget(self, key: Hashable) -> None:
        if self._items.pop(key, None) is not None:
            caller = _caller(key)
            self._counts[caller] -= 1
            if not self._counts[caller]:
                del self._counts[caller]

    def holds(self, key: Hashable, controller: BudgetController) -> bool:
        """True while ``controller`` is still the one kept for ``key`` (not evicted meanwhile)."""
        return self._items.get(key) is controller

    def drop(self, key: Hashable) -> None:
        """Forget ``key``'s controller, if kept (``on_evict`` is not called: the caller is dropping it)."""
        self._forget(key)

    def clear(self) -> None:
        """Forget every key (after a policy reload the old internal budgets mean nothing)."""
        for key in list(self._items):
            if self._on_evict is not None:
                self._on_evict(key)
        self._items.clear()
        self._counts.clear()

    def __len__(self) -> int:
        return len(self._items)


def _caller(key: Hashable) -> Hashable:
    """Whose key it is: the first element of a pricing key ``(caller, B, unit, …)``, else the key itself."""
    return key[0] if isinstance(key, tuple) and key else key
