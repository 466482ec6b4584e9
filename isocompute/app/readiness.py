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

**Draining** — the gateway drains before it stops: what a rolling update or a scale-down (SIGTERM) sees.

On the first SIGTERM (or SIGINT) :class:`DrainingServer` — uvicorn's server with its signal handler
extended — starts the app's :class:`Drain`, and from then on:

* ``GET /ready`` answers 503 (``detail`` says it is draining), so a load balancer stops sending here;
* a new request gets 503 at once, in OpenAI's error shape with ``Retry-After`` (``retry_after_s``) and
  ``Connection: close`` (:class:`DrainMiddleware`; ``/health``, ``/ready`` and ``/metrics`` still answer),
  so a client retries elsewhere instead of waiting on a gateway that is going away;
* the requests already in flight run on; when the last of them is answered — or ``drain_timeout_s``
  after the signal, whichever comes first — uvicorn's own graceful shutdown begins: it stops listening,
  closes idle connections, cancels what still runs after :data:`CLOSE_GRACE_S`, runs the app's lifespan
  shutdown, and the process exits 0.

A second signal during the drain skips the rest of it (uvicorn's shutdown at once; the process then
exits by that signal, as uvicorn does); a third SIGINT forces the exit.

Ignores: websocket routes (there are none) and a delay before refusing new requests (some load balancers
keep sending for a few seconds after ``/ready`` fails; those requests get the fast 503 above).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from types import FrameType
from typing import Any

import uvicorn

from isocompute.app.errors import error_body
from isocompute.engines.base import REQUEST_DEADLINE, Engine, UpstreamBadResponse, UpstreamMisconfigured
from isocompute.errors import EngineUnavailable

__all__ = ["CLOSE_GRACE_S", "Drain", "DrainMiddleware", "DrainingServer", "UpstreamHealth", "run_server"]

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


# ---- draining on SIGTERM (module docstring) ------------------------------------------------------

CLOSE_GRACE_S = 2.0  # uvicorn's timeout_graceful_shutdown once the drain is over
PROBE_PATHS = frozenset({"/health", "/ready", "/metrics"})  # answered while draining; not counted in flight
STARTUP_FAILURE = 3  # uvicorn's exit status when the app does not start


class Drain:
    """Whether the gateway is draining (since when) and how many requests are in flight."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.since: float | None = None  # time.monotonic() of the signal
        self.inflight = 0

    @property
    def draining(self) -> bool:
        return self.since is not None

    def start(self) -> None:
        if self.since is None:
            self.since = time.monotonic()
            log.warning("draining: /ready is 503 and new requests get 503; waiting up to %.0f s for %d request(s) "
                        "in flight, then stopping", self.timeout_s, self.inflight)

    def over(self, now: float | None = None) -> bool:
        """Draining, and nothing in flight any more or the drain timeout passed."""
        if self.since is None:
            return False
        return self.inflight == 0 or (now if now is not None else time.monotonic()) - self.since >= self.timeout_s


class DrainMiddleware:
    """Pure ASGI middleware: counts the requests in flight; while draining, answers new ones 503."""

    def __init__(self, app: Any, *, drain: Drain, retry_after_s: int) -> None:
        self.app, self.drain = app, drain
        self.retry_after = str(max(1, retry_after_s)).encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in PROBE_PATHS:
            await self.app(scope, receive, send)
            return
        if self.drain.draining:
            await self._refuse(send)
            return
        self.drain.inflight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.inflight -= 1

    async def _refuse(self, send: Any) -> None:
        body = json.dumps(error_body("the gateway is shutting down (draining); retry on another replica or "
                                     "after Retry-After seconds", "service_unavailable", code="draining")).encode()
        await send({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"retry-after", self.retry_after), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


class DrainingServer(uvicorn.Server):
    """uvicorn's server, draining ``drain`` on the first signal before its own shutdown (module docstring)."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain.draining:  # a second signal: stop draining, shut down now
            super().handle_exit(sig, frame)
        else:
            self.drain.start()

    async def on_tick(self, counter: int) -> bool:
        if self.drain.over():
            self.should_exit = True
        return await super().on_tick(counter)


def run_server(app: Any, **config: Any) -> None:
    """Serve ``app`` (from :func:`~isocompute.app.main.create_app`: its ``state.drain``) on uvicorn with the
    drain; ``config`` is ``uvicorn.Config``'s keywords. Exits with uvicorn's status 3 when the app fails to
    start, as ``uvicorn.run`` does."""
    server = DrainingServer(uvicorn.Config(app, timeout_graceful_shutdown=CLOSE_GRACE_S, **config), app.state.drain)
    server.run()
    if not server.started:
        raise SystemExit(STARTUP_FAILURE)
