"""The gateway drains before it stops: what a rolling update or a scale-down (SIGTERM) sees.

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

import json
import logging
import time
from types import FrameType
from typing import Any

import uvicorn

from isocompute.app.errors import error_body

__all__ = ["CLOSE_GRACE_S", "Drain", "DrainMiddleware", "DrainingServer", "run_server"]

log = logging.getLogger("isocompute.app")

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
