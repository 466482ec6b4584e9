"""Readiness: would a real request succeed now? ``GET /ready`` answers from :class:`UpstreamHealth`.

Two sources keep it current:

* every upstream call of a request — an answer sets it ready; an unavailable, misconfigured or unusable
  upstream (not a mere timeout: one slow generation says little about the next) sets it not ready;
* :meth:`UpstreamHealth.watch`, a background task making one real 1-token request: every
  ``interval_s`` while ready, and while not ready after 0.25 s, doubling up to ``interval_s`` (a
  request that finds the upstream gone wakes it at once). It survives any exception — a failure of the
  probe is a reason to be not ready, never a reason to stop probing.

A misconfigured upstream (it does not serve the model asked for) is reported in ``detail`` with the fix
and logged as an error once, not retried silently.

Ignores: per-upstream detail (the engine's ``upstream_status()`` has it) and the policy (``/ready`` checks
that a policy is loaded).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from isocompute.engines.base import REQUEST_DEADLINE, Engine, UpstreamBadResponse, UpstreamMisconfigured
from isocompute.errors import EngineUnavailable

__all__ = ["UpstreamHealth"]

log = logging.getLogger("isocompute.app")

FIRST_RETRY_S = 0.25
WAITING = "waiting for the upstream to answer a real request"


class UpstreamHealth:
    """Whether the upstream answers real requests now (``ok``), and why not (``detail``)."""

    def __init__(self) -> None:
        self.ok = False
        self.detail: str | None = WAITING
        self._wake = asyncio.Event()

    def answered(self) -> None:
        if not self.ok:
            log.info("upstream answers real requests: ready")
        self.ok, self.detail = True, None

    def failed(self, exc: BaseException) -> None:
        """Record a failed upstream call (see the module docstring for which failures count)."""
        if isinstance(exc, UpstreamMisconfigured):
            detail = f"the upstream is misconfigured: {exc}"
        elif isinstance(exc, TimeoutError):
            detail = "the upstream did not answer a 1-token request in time"
        elif isinstance(exc, EngineUnavailable):
            detail = f"the upstream is unavailable: {exc}"
        else:
            detail = f"the upstream call failed: {type(exc).__name__}: {exc}"
        if detail != self.detail:
            level = logging.ERROR if isinstance(exc, UpstreamMisconfigured) else logging.WARNING
            log.log(level, "not ready: %s", detail)
        if self.ok:
            self._wake.set()  # check again now, not after a whole interval
        self.ok, self.detail = False, detail

    async def watch(self, engine: Engine, *, interval_s: float, timeout_s: float) -> None:
        """Probe ``engine`` with one real 1-token request, forever (cancel the task to stop it)."""
        delay = FIRST_RETRY_S
        while True:
            token = REQUEST_DEADLINE.set(time.monotonic() + timeout_s)  # the engine counts a timeout too
            try:
                out = await asyncio.wait_for(engine.generate(["1 + 1 ="], 1, 1, 0.0, 0), timeout_s)
                if not out or not out[0]:
                    raise UpstreamBadResponse("the readiness request got no completion back")
                self.answered()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # any failure means "not ready", and the watch goes on
                self.failed(e)
            finally:
                REQUEST_DEADLINE.reset(token)
            self._wake.clear()
            wait = interval_s if self.ok else delay
            delay = FIRST_RETRY_S if self.ok else min(2 * delay, interval_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)
