"""OpenTelemetry traces of the gateway's requests: off unless ``otel_traces_endpoint`` is set.

A traced request is one server span (``POST /v1/completions``, continuing the caller's W3C ``traceparent``)
with children where its work happens — ``isocompute.price``, ``isocompute.decide``, one
``isocompute.wave`` per upstream call (the W3C ``traceparent`` of that span goes upstream with the call,
:func:`isocompute.engines.upstream_calls.upstream_headers`, so vLLM's own spans join the trace),
``isocompute.vote`` and ``isocompute.charge``. Spans go to an OTLP/HTTP collector in batches
(``BatchSpanProcessor``), named by ``otel_service_name``.

The app's tracer is the request's :data:`TRACER` (a context variable its middleware sets), so two apps
in one process never share one, and code that only runs inside a request writes ``with span("…"):``
without being handed a tracer. Outside a traced request ``span`` is a no-op (one context-variable read).

A router below the gateway (llm-d's endpoint picker, the production-stack router) can be told who the caller
is: with ``upstream_caller_header`` set, every upstream call of a request carries that header with a hashed
caller id (:class:`CallerHeaderMiddleware`: of the API key's digest, or ``anonymous``; neither the key nor its
name leaves the gateway), docs/deploy-routers.md.

Ignores: metrics and logs over OTLP (Prometheus has the metrics), sampling (every traced request is kept;
sample in the collector), and the probe and readiness calls (not a request's work).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from isocompute.app.accounting.auth import hash_key
from isocompute.engines.upstream_calls import CALLER_HEADERS

__all__ = ["TRACER", "CallerHeaderMiddleware", "TracingMiddleware", "caller_id", "make_tracer", "span", "traced"]

TRACER: ContextVar[Any] = ContextVar("isocompute_tracer", default=None)
TRACED_PREFIX = "/v1/"  # generation and route requests; probes and /metrics are not traced


@contextlib.contextmanager
def span(name: str, **attributes: Any) -> Iterator[Any]:
    """A child span of the current request's (None, and nothing recorded, outside a traced request)."""
    tracer = TRACER.get()
    if tracer is None:
        yield None
        return
    with tracer.start_as_current_span(name, attributes={k: v for k, v in attributes.items() if v is not None}) as s:
        yield s


def traced(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A (synchronous) function run inside ``span(name)``."""
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            with span(name):
                return fn(*args, **kwargs)
        return inner
    return wrap


def caller_id(name: str) -> str:
    """A caller's id as a router sees it: 32 hex digits of sha256 of ``name`` (the key's sha256 digest, or
    ``anonymous``): the same on every gateway replica, and no way back to the key."""
    return hashlib.sha256(f"isocompute-caller:{name}".encode()).hexdigest()[:32]


def make_tracer(endpoint: str | None, service_name: str, exporter: Any = None) -> tuple[Any, Any]:
    """``(tracer, provider)`` exporting to the OTLP/HTTP ``endpoint`` (or to ``exporter``, e.g. the SDK's
    in-memory one in tests); ``(None, None)`` when neither is given. Shut the provider down to flush it."""
    if endpoint is None and exporter is None:
        return None, None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider.get_tracer("isocompute.gateway"), provider


class TracingMiddleware:
    """Pure ASGI middleware: one server span per ``/v1/`` request, continuing an incoming ``traceparent``,
    with the app's tracer set for the request's :func:`span` calls."""

    def __init__(self, app: Any, *, tracer: Any) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.app, self.tracer, self.propagator = app, tracer, TraceContextTextMapPropagator()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(TRACED_PREFIX):
            await self.app(scope, receive, send)
            return
        from opentelemetry.trace import SpanKind, Status, StatusCode

        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        parent = self.propagator.extract(carrier)
        status = 500

        async def send_status(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        token = TRACER.set(self.tracer)
        try:
            with self.tracer.start_as_current_span(f"{scope['method']} {scope['path']}", context=parent,
                                                   kind=SpanKind.SERVER) as s:
                try:
                    await self.app(scope, receive, send_status)
                finally:
                    s.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        s.set_status(Status(StatusCode.ERROR))
        finally:
            TRACER.reset(token)


class CallerHeaderMiddleware:
    """Pure ASGI middleware: a ``/v1/`` request's upstream calls carry ``header: caller_id(…)`` of its bearer
    key's digest (``anonymous`` without one); an unknown key is refused later by the routes, as ever."""

    def __init__(self, app: Any, *, header: str) -> None:
        self.app, self.header = app, header

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(TRACED_PREFIX):
            await self.app(scope, receive, send)
            return
        auth = dict(scope.get("headers", [])).get(b"authorization", b"").decode("latin-1")
        key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        token = CALLER_HEADERS.set(((self.header, caller_id(hash_key(key) if key else "anonymous")),))
        try:
            await self.app(scope, receive, send)
        finally:
            CALLER_HEADERS.reset(token)
