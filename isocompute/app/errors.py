"""HTTP errors of the gateway: the gateway-only error classes and the one mapping to OpenAI's error shape.

Every error response is ``{"error": {"message", "type", "param", "code"}}`` like OpenAI's. Domain errors
(:mod:`isocompute.errors`) map to statuses in one table, :data:`STATUS`, most specific class first:

=========================  ======  =========================  ========================================
error                      status  type                       when
=========================  ======  =========================  ========================================
``BudgetError``            400     ``invalid_request_error``  budget outside what the policy/server allows
``InputError``             400     ``invalid_request_error``  a field is out of range or unsupported
``RequestValidationError`` 422     ``invalid_request_error``  the body does not match the schema
(malformed JSON)           400     ``invalid_request_error``  the body is not JSON at all
``AuthError``              401     ``authentication_error``   missing or unknown API key
``PermissionDenied``       403     ``permission_error``       a key asks for more than it may
``ModelNotFound``          404     ``invalid_request_error``  ``model`` is not the served model
``RateLimited``            429     ``rate_limit_error``       the key's request rate is exceeded
``UpstreamMisconfigured``  502     ``upstream_error``         upstream refuses this server's settings
``UpstreamBadResponse``    502     ``upstream_error``         upstream answered with nothing usable
``CircuitOpen``            503     ``service_unavailable``    every upstream is down: not even tried
``Overloaded``             503     ``service_unavailable``    no admission slot within ``queue_timeout_s``
``EngineUnavailable``      503     ``service_unavailable``    upstream down / policy not loaded
``UpstreamTimeout``        504     ``upstream_timeout``       upstream did not answer in time
``ArtifactError``          503     ``service_unavailable``    the policy artifact cannot be loaded
``ClientDisconnected``     499     ``client_closed_request``  the client went away (nobody reads it)
=========================  ======  =========================  ========================================

502, 503, 504 and 429 carry ``Retry-After``: the error's own ``retry_after`` when it has one (the rate
limiter's next token, the circuit's next probe), else the server's ``retry_after_s``. Every failure of
an upstream is one of the 5xx above (:mod:`isocompute.app.runner.execute` maps an engine's unexpected exception
to 502). Anything else is a bug of the gateway: 500 with a generic message (the traceback goes to the
log, not to the client).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from pydantic import BaseModel

from isocompute.engines.base import CircuitOpen, UpstreamBadResponse, UpstreamMisconfigured
from isocompute.errors import (
    ArtifactError,
    BudgetError,
    EngineUnavailable,
    InputError,
    IsoComputeError,
)

log = logging.getLogger("isocompute.app")


class AuthError(IsoComputeError):
    """No API key, or one the server does not know."""


class PermissionDenied(IsoComputeError):
    """A known key asks for something it may not (a budget above its maximum, an admin action)."""


class ModelNotFound(InputError):
    """The request names a model this gateway does not serve."""


class RateLimited(IsoComputeError):
    """The key's token bucket or spend quota is empty; ``retry_after`` is when enough comes back (seconds);
    ``headers`` go out with the 429 (a quota's ``X-Quota-*``)."""

    def __init__(self, message: str, retry_after: float, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.retry_after = retry_after
        self.headers = headers or {}


class Overloaded(EngineUnavailable):
    """Every admission slot stayed taken for ``queue_timeout_s`` (``accounting.admission``): 503 at once."""


class UpstreamTimeout(EngineUnavailable):
    """The upstream call ran past the request's deadline (``upstream_timeout_s`` after it arrived)."""


class ClientDisconnected(IsoComputeError):
    """The client closed the connection before the answer; its upstream work was cancelled."""


__all__ = ["AuthError", "CircuitOpen", "ClientDisconnected", "ModelNotFound", "Overloaded", "PermissionDenied",
           "RateLimited",
           "UpstreamBadResponse", "UpstreamMisconfigured", "UpstreamTimeout", "classify", "error_body",
           "error_responses", "install_error_handlers"]


# (class, status, type, code) — most specific first; the first isinstance match wins.
STATUS: tuple[tuple[type[BaseException], int, str, str], ...] = (
    (BudgetError, 400, "invalid_request_error", "invalid_budget"),
    (ModelNotFound, 404, "invalid_request_error", "model_not_found"),
    (InputError, 400, "invalid_request_error", "invalid_value"),
    (AuthError, 401, "authentication_error", "invalid_api_key"),
    (PermissionDenied, 403, "permission_error", "permission_denied"),
    (RateLimited, 429, "rate_limit_error", "rate_limit_exceeded"),
    (UpstreamTimeout, 504, "upstream_timeout", "upstream_timeout"),
    (UpstreamMisconfigured, 502, "upstream_error", "upstream_misconfigured"),
    (UpstreamBadResponse, 502, "upstream_error", "upstream_bad_response"),
    (CircuitOpen, 503, "service_unavailable", "upstream_circuit_open"),
    (Overloaded, 503, "service_unavailable", "overloaded"),
    (EngineUnavailable, 503, "service_unavailable", "engine_unavailable"),
    (ArtifactError, 503, "service_unavailable", "policy_unavailable"),
    (ClientDisconnected, 499, "client_closed_request", "client_closed_request"),
)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body."""

    error: ErrorDetail


def error_body(message: str, type_: str, *, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def classify(exc: BaseException) -> tuple[int, str, str]:
    """``(status, type, code)`` for a domain error; ``(500, "internal_error", "internal_error")`` otherwise."""
    for cls, status, type_, code in STATUS:
        if isinstance(exc, cls):
            return status, type_, code
    return 500, "internal_error", "internal_error"


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` argument that declares error statuses of a route in the OpenAPI document."""
    descriptions = {
        400: "Invalid request (budget, field values, malformed JSON)",
        401: "Missing or unknown API key",
        403: "Not allowed for this API key",
        404: "Unknown model",
        422: "Request body does not match the schema",
        429: "Rate limit exceeded (see Retry-After)",
        502: "Upstream returned an unusable response (see Retry-After)",
        503: "Upstream or policy unavailable (see Retry-After)",
        504: "Upstream timed out (see Retry-After)",
    }
    return {s: {"model": ErrorResponse, "description": descriptions[s]} for s in statuses}


def _validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """One readable sentence per schema error, e.g. ``budget: Input should be greater than 0 (got -1)``."""
    parts, param = [], None
    for e in errors[:5]:
        loc = [str(x) for x in e.get("loc", ()) if x not in ("body",)]
        where = ".".join(loc) or "body"
        param = param or (loc[0] if loc else None)
        got = e.get("input")
        shown = "" if isinstance(got, dict | list) or got is None else f" (got {got!r:.60})"
        parts.append(f"{where}: {e.get('msg', 'invalid')}{shown}")
    more = f"; and {len(errors) - 5} more" if len(errors) > 5 else ""
    return "; ".join(parts) + more + ". Fix these fields and retry.", param


def _unparsable(exc: BaseException, body: bytes = b"") -> str | None:
    """What is wrong with a body FastAPI could not parse (its HTTP 400's cause), or None."""
    cause = exc.__cause__
    if isinstance(cause, ValueError) and "digits" in str(cause):  # Python's int-from-string limit (4300 digits)
        m = re.search(rb'"([^"\\]{1,64})"\s*:\s*-?\d{1000,}', body)
        where = f"field {m.group(1).decode(errors='replace')!r}" if m else "a field"
        return (f"{where} holds a number of more than 4300 digits, too long to read; send an ordinary number "
                "(e.g. 4) and retry")
    if isinstance(cause, UnicodeDecodeError):
        return (f"request body is not valid UTF-8 (byte {cause.start}: {cause.reason}); send JSON encoded as "
                "UTF-8 with Content-Type: application/json")
    if isinstance(cause, RecursionError):
        return "request body nests JSON arrays or objects too deeply to parse; send a flatter JSON object"
    return None


def _not_json_hint(request: Any, errors: list[Any]) -> str:
    """A hint for a body that was not read as JSON because its Content-Type does not say JSON (plain
    ``curl -d`` sends form encoding): the 422 then says so instead of only "field required"."""
    ctype = request.headers.get("content-type", "")
    if request.method != "POST" or "json" in ctype.lower():
        return ""
    if not any(e.get("loc", ())[:1] == ("body",) for e in errors):
        return ""
    got = f"Content-Type {ctype!r}" if ctype else "no Content-Type"
    return f"the body was not read as JSON ({got}); send the header Content-Type: application/json. "


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` is answered 413 in OpenAI's error shape — at once
    when its ``Content-Length`` says so, else as soon as the bytes read pass the limit — before anything
    parses it (``max_body_bytes``)."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self._refuse(send)
        seen, started = 0, False

        async def counted() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge(self.max_bytes)
            return message

        async def watched(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except _TooLarge:
            if not started:
                await self._refuse(send)

    async def _refuse(self, send: Any) -> None:
        body = json.dumps(too_large_body(self.max_bytes)).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    """A body passed :class:`BodyLimit`'s limit while it was read (FastAPI wraps it in its HTTP 400)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes)
        self.max_bytes = max_bytes


def too_large_body(max_bytes: int) -> dict[str, Any]:
    return error_body(f"request body is over this server's limit of {max_bytes} bytes (max_body_bytes); send a "
                      "smaller request", "invalid_request_error", code="body_too_large")


def install_error_handlers(app: Any, retry_after_s: int) -> None:
    """Register the handlers that turn every error into OpenAI's error shape (see the module table)."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    def respond(status: int, body: dict[str, Any], retry_after: float | None = None,
                extra: dict[str, str] | None = None) -> JSONResponse:
        headers = {"Retry-After": str(max(1, int(-(-retry_after // 1))))} if retry_after is not None else {}
        return JSONResponse(body, status_code=status, headers={**(extra or {}), **headers})

    @app.exception_handler(IsoComputeError)
    async def _domain(request: Request, exc: IsoComputeError) -> JSONResponse:
        status, type_, code = classify(exc)
        own = getattr(exc, "retry_after", None)
        retry = own if own is not None else (retry_after_s if status >= 502 else None)
        if status == 499:  # nobody reads the answer; the operator may want to know the work was cancelled
            log.info("%s %s → 499: %s", request.method, request.url.path, exc)
        if status >= 500:
            # an open circuit answers thousands of requests a second in an outage; the engine logs the
            # transitions, so each fast 503 is only worth a debug line
            log.log(logging.DEBUG if isinstance(exc, CircuitOpen) else logging.WARNING, "%s %s → %d: %s",
                    request.method, request.url.path, status, exc)
        param = getattr(exc, "param", None) or ("budget" if isinstance(exc, BudgetError) else None)
        return respond(status, error_body(str(exc), type_, param=param, code=code), retry,
                       getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        bad_json = [e for e in errors if e.get("type") == "json_invalid"]
        if bad_json:
            ctx = bad_json[0].get("ctx") or {}
            msg = (f"request body is not valid JSON ({ctx.get('error', 'parse error')}); "
                   "send a JSON object with Content-Type: application/json")
            return respond(400, error_body(msg, "invalid_request_error", code="invalid_json"))
        msg, param = _validation_message(errors)
        msg = _not_json_hint(request, errors) + msg
        return respond(422, error_body(msg, "invalid_request_error", param=param, code="invalid_request"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        type_ = "invalid_request_error" if exc.status_code < 500 else "internal_error"
        msg = str(exc.detail)
        code = str(exc.status_code)
        if exc.status_code == 404:
            msg = f"no route {request.method} {request.url.path}; see /docs for the API"
        elif exc.status_code == 405:
            allow = (exc.headers or {}).get("Allow", "")
            msg = f"method {request.method} is not allowed on {request.url.path} (allowed: {allow}); see /docs"
        elif exc.status_code == 400 and isinstance(exc.__cause__, _TooLarge):
            return respond(413, too_large_body(exc.__cause__.max_bytes))
        elif exc.status_code == 400 and (why := _unparsable(exc, await request.body())) is not None:
            msg, code = why, "invalid_json"
        return JSONResponse(error_body(msg, type_, code=code), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return respond(500, error_body("internal error; the server log has the details", "internal_error",
                                       code="internal_error"))
