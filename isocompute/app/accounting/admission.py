"""What the gateway lets in: requests in flight (:class:`Admission`) and open connections (:class:`ConnectionGuard`).

**Requests** — at most ``max_inflight`` generation requests hold a slot at once (from their intake to their
last byte, a stream's included); the next ones wait for a slot at most ``queue_timeout_s`` and are then
refused with 503 and ``Retry-After`` (:class:`Overloaded`) at once instead of queueing for minutes behind
work that cannot finish in time. ``/ready`` says ``saturated`` while every slot is taken (a load balancer
sends elsewhere); ``isocompute_requests_inflight``, ``isocompute_queue_depth`` and
``isocompute_requests_shed_total`` count them.

**Connections** — uvicorn has no header or body read timeout (a fresh connection that sends half a request
line and waits is kept for ever) and its ``limit_concurrency`` answers 503 even to ``/health``; so
``isocompute serve`` runs uvicorn's HTTP protocol with :func:`guarded_protocol`:

* a connection must send a request's headers within ``header_timeout_s`` of opening (or of its first byte
  after an idle keep-alive) — else 408 and closed — and the body within ``body_timeout_s`` after them —
  else closed (the request sees a disconnect);
* at most ``max_connections_per_client`` connections per client address and ``max_connections`` in all:
  past a bound the *oldest connection not inside a request* (reading its headers, or idle keep-alive) is
  closed to make room — so a client holding hundreds of half-open sockets cannot keep ``/health`` out —
  and the new one is closed only when every connection is inside a request.

Each closing is counted in ``isocompute_connections_closed_total{reason}``. Ignores: HTTP/2 and websockets
(not served), and addresses behind a proxy (the bound is per peer address: put the proxy's own limits first).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from isocompute.app.accounting.metrics import Metrics
from isocompute.app.errors import Overloaded

__all__ = ["Admission", "ConnectionGuard", "Overloaded", "guarded_protocol"]


class Admission:
    """``max_inflight`` slots; :meth:`slot` holds one for a request (module docstring)."""

    def __init__(self, max_inflight: int, queue_timeout_s: float, metrics: Metrics | None = None) -> None:
        self.max_inflight, self.queue_timeout_s, self.metrics = max_inflight, queue_timeout_s, metrics
        self.inflight = 0
        self.waiting = 0
        self._free = asyncio.Condition()
        self._wakers: set[asyncio.Future[None]] = set()

    @property
    def saturated(self) -> bool:
        """Every slot is taken: a new request would wait."""
        return self.inflight >= self.max_inflight

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.inflight.set(self.inflight)
            self.metrics.queue_depth.set(self.waiting)

    async def acquire(self) -> None:
        """Take a slot, waiting at most ``queue_timeout_s`` (first come, first served); raises
        :class:`Overloaded` past it."""
        if not (self.saturated or self.waiting):
            self.inflight += 1
            self._gauge()
            return
        self.waiting += 1
        self._gauge()
        try:
            async with self._free:
                await asyncio.wait_for(self._free.wait_for(lambda: not self.saturated), self.queue_timeout_s)
                self.inflight += 1
        except TimeoutError:
            if self.metrics is not None:
                self.metrics.shed.inc()
            raise Overloaded(f"the gateway is at its limit of {self.max_inflight} requests in flight and none "
                             f"finished within {self.queue_timeout_s:g} s (queue_timeout_s); retry after the "
                             "Retry-After seconds, or send to another replica") from None
        finally:
            self.waiting -= 1
            self._gauge()

    def release(self) -> None:
        """Give a slot back (once per :meth:`acquire`); the waiters re-check."""
        self.inflight -= 1
        self._gauge()
        if self.waiting:
            task = asyncio.ensure_future(self._wake())
            self._wakers.add(task)
            task.add_done_callback(self._wakers.discard)

    async def _wake(self) -> None:
        async with self._free:
            self._free.notify_all()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        await self.acquire()
        try:
            yield
        finally:
            self.release()


class ConnectionGuard:
    """The open connections of one server, by client address, oldest first (module docstring)."""

    def __init__(self, *, max_connections: int, max_per_client: int, header_timeout_s: float,
                 body_timeout_s: float, metrics: Metrics | None = None) -> None:
        self.max_connections, self.max_per_client = max_connections, max_per_client
        self.header_timeout_s, self.body_timeout_s, self.metrics = header_timeout_s, body_timeout_s, metrics
        self.all: dict[Any, None] = {}  # insertion-ordered: oldest first
        self.by_client: dict[str, dict[Any, None]] = {}

    @classmethod
    def of(cls, settings: Any, metrics: Metrics | None = None) -> ConnectionGuard:
        return cls(max_connections=settings.max_connections, max_per_client=settings.max_connections_per_client,
                   header_timeout_s=settings.header_timeout_s, body_timeout_s=settings.body_timeout_s,
                   metrics=metrics)

    def count(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.connections_closed.labels(reason).inc()

    def opened(self, conn: Any) -> bool:
        """Admit ``conn`` (making room as the module docstring says); False: it must be closed."""
        host = conn.client[0] if conn.client else ""
        mine = self.by_client.setdefault(host, {})
        for group, bound, reason in ((mine, self.max_per_client, "client_limit"),
                                     (self.all, self.max_connections, "total_limit")):
            if len(group) >= bound and not self._evict(group, reason):
                self.count(reason)
                if not mine:
                    del self.by_client[host]
                return False
        mine[conn] = None
        self.all[conn] = None
        return True

    def _evict(self, group: dict[Any, None], reason: str) -> bool:
        victim = next((c for c in group if c.outside_request()), None)
        if victim is None:
            return False
        self.count(reason)
        victim.close_by_guard()
        return True

    def closed(self, conn: Any) -> None:
        self.all.pop(conn, None)
        host = conn.client[0] if conn.client else ""
        mine = self.by_client.get(host)
        if mine is not None:
            mine.pop(conn, None)
            if not mine:
                del self.by_client[host]


REQUEST_TIMEOUT = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
                   b"connection: close\r\ncontent-length: 34\r\n\r\nrequest headers not sent in time\r\n")


def guarded_protocol(guard: ConnectionGuard, base: type | None = None) -> type:
    """uvicorn's HTTP protocol class (``base``: the one uvicorn would pick) under ``guard``: pass it as
    ``uvicorn.Config(http=...)``."""
    if base is None:
        from uvicorn.protocols.http.auto import AutoHTTPProtocol as base  # noqa: N813

    class Guarded(base):  # type: ignore[valid-type, misc]
        _timer: asyncio.TimerHandle | None = None
        _phase: str | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if not guard.opened(self):
                self.connections.discard(self)
                transport.abort()
                return
            self._arm("header")

        def connection_lost(self, exc: Exception | None) -> None:
            self._arm(None)
            guard.closed(self)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._phase is None and self.outside_request():
                self._arm("header")  # the first bytes of a new request on a kept-alive connection
            super().data_received(data)
            self._watch()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm(None)  # idle now: uvicorn's keep-alive timeout applies

        def outside_request(self) -> bool:
            """Reading a request's headers, or idle between requests (nothing of the app's running)."""
            cycle = self.cycle
            return cycle is None or cycle.response_complete

        def close_by_guard(self) -> None:
            guard.closed(self)
            self._arm(None)
            self.transport.close()

        def _watch(self) -> None:
            cycle = self.cycle
            if cycle is None or cycle.response_complete:
                return  # still the headers' phase
            if cycle.more_body:
                if self._phase != "body":
                    self._arm("body")
            else:
                self._arm(None)  # the whole request is in: the app's deadlines apply

        def _arm(self, phase: str | None) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._phase = phase
            if phase is not None:
                seconds = guard.header_timeout_s if phase == "header" else guard.body_timeout_s
                self._timer = asyncio.get_running_loop().call_later(seconds, self._expire, phase)

        def _expire(self, phase: str) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            if phase == "body" and getattr(self.flow, "read_paused", False):
                self._arm("body")  # the server itself stopped reading (the app is behind): not the client's fault
                return
            guard.count(f"{phase}_timeout")
            if phase == "header" and self.cycle is None:
                self.transport.write(REQUEST_TIMEOUT)
            guard.closed(self)
            self.transport.close()

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded
