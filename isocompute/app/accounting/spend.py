"""A request's way through its key's spend quotas (:mod:`isocompute.app.accounting.quotas`), for the gateway.

* :meth:`Spend.admit` (after pricing, before any upstream call): the request's worst case reserved, with
  its cap on samples per prompt lowered to what the quota has left, or a 429;
* :meth:`Spend.released`: a request refused or failed before sampling gives its reservation back;
* :meth:`Spend.settled`: after sampling, the reservation is settled to what was generated
  (:meth:`isocompute.app.accounting.ledger.Ledger.generated`: the samples that came back and the probe) —
  a request that fails after its samples came back too, one that fails before them pays nothing for them
  (what failed calls generated is not reported), one cancelled (its client's disconnect, a drain past its
  timeout) pays what came back plus the most its calls in flight could have generated — not its whole
  reservation.

A store failing at settlement leaves the reservation charged (logged), and the response goes out.

Ignores: keys without quotas (every method passes them through untouched) and dry runs (never reserved).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from isocompute.app.accounting.auth import Principal
from isocompute.app.accounting.ledger import Ledger
from isocompute.app.accounting.quotas import Hold, Quotas
from isocompute.app.routing import Ask, Routing
from isocompute.app.runner.execute import GENERATED, Meter
from isocompute.errors import IsoComputeError

__all__ = ["Spend"]

log = logging.getLogger("isocompute.app")
T = TypeVar("T")


class Spend:
    """The gateway's quota steps over ``quotas``; ``model_flops``: each pool's FLOP model (None without a
    config), for the worst case of a FLOP quota."""

    def __init__(self, quotas: Quotas, ledger: Ledger, model_flops: list[Any]) -> None:
        self.quotas, self.ledger, self.model_flops = quotas, ledger, model_flops
        self._pending: set[asyncio.Future[None]] = set()  # settlements of cancelled requests

    async def admit(self, policy: Any, principal: Principal, ask: Ask, cap: int, n: int) -> Hold | None:
        """Reserve ``n`` prompts' worst case at ``cap`` samples each (None for a key without quotas)."""
        q = principal.quota
        if q is None:
            return None
        return await self.quotas.admit(principal.name, q, prompts=n, max_tokens=ask.max_tokens, cap=cap,
                                       probe_tokens=0 if policy.probe is None else int(policy.probe.max_tokens),
                                       sample_flops=None if q.flops_per_day is None else self.worst_flops(ask))

    def worst_flops(self, ask: Ask) -> float | None:
        """FLOPs of one sample of ``max_tokens`` on the largest model (None when one has no config)."""
        from isocompute.flops import request_flops

        if not self.model_flops or any(m is None for m in self.model_flops):
            return None
        p = max(ask.prompt_tokens or [64])
        return max(float(request_flops(m, p, [ask.max_tokens])) for m in self.model_flops)

    async def released(self, hold: Hold | None, work: Awaitable[T]) -> T:
        """``work`` (the decision); when it raises, ``hold`` is released (nothing charged)."""
        try:
            return await work
        except Exception:
            if hold is not None:
                with contextlib.suppress(IsoComputeError):
                    await hold.settle(0, 0.0)
            raise

    async def settled(self, routing: Routing, work: Callable[[Callable[[list[Any]], None] | None], Awaitable[T]]
                      ) -> T:
        """``work(on_runs)`` (the sampling; ``on_runs`` collects the runs once back), then the routing's hold
        settled to what was generated — also when ``work`` raises, and when it is cancelled (a disconnect, a
        drain past its timeout): then to the tokens that came back plus the most the calls in flight could
        have generated (:class:`~isocompute.app.runner.execute.Meter`), an upper bound of what they did."""
        hold = routing.quota
        if hold is None:
            return await work(None)
        runs: list[Any] = []
        meter = Meter()
        token = GENERATED.set(meter)
        try:
            out = await work(runs.extend)
        except asyncio.CancelledError:
            probe = 0 if routing.probe is None else sum(routing.probe.tokens)
            tokens = min(hold.tokens, meter.done + meter.inflight + probe)
            flops = hold.flops * tokens / hold.tokens if hold.tokens else 0.0
            later = asyncio.ensure_future(self._settle_at(hold, tokens, flops))  # this task is being cancelled
            self._pending.add(later)
            later.add_done_callback(self._pending.discard)
            raise
        except Exception:
            await self._settle(hold, routing, runs)
            raise
        finally:
            GENERATED.reset(token)
        await self._settle(hold, routing, runs)
        return out

    async def _settle(self, hold: Hold, routing: Routing, runs: list[Any]) -> None:
        await self._settle_at(hold, *self.ledger.generated(routing, runs))

    async def _settle_at(self, hold: Hold, tokens: int, flops: float | None) -> None:
        try:
            await hold.settle(tokens, flops)
        except IsoComputeError as e:
            log.warning("quota of key %r not settled (its reservation stays charged): %s", hold.name, e)
