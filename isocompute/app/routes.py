"""The HTTP endpoints: each one hands its request to one serving method of the
:class:`~isocompute.app.gateway.Gateway` (as vLLM's routes do), which checks, runs and shapes it.

=====================  ======================================================================
endpoint               what it does
=====================  ======================================================================
POST /v1/chat/completions  chat request → one aggregated assistant message + ``isocompute``
POST /v1/completions   text prompt(s) → one aggregated choice per prompt + ``isocompute``
POST /v1/route         the decision alone (plan per prompt, λ, internal budget, rule): a dry run
GET  /v1/models        the served model id, then a multi-model policy's models (``model`` pins one)
GET  /health           the process is alive
GET  /ready            policy loaded and the upstream answers real requests now, not draining (else 503)
GET  /metrics          Prometheus text format
POST /admin/reload     reload the policy (admin key); resets the budget controllers
=====================  ======================================================================

Dependencies come in as ``Annotated[..., Depends(...)]`` (:data:`GatewayDep`, :data:`CallerDep`) so tests
can override them with ``app.dependency_overrides``.

A generation request runs raced against the client's disconnect
(:func:`~isocompute.app.streaming.unless_disconnected`, the pattern of vLLM's ``with_cancellation``): a client
that goes away cancels its work, and with it the upstream calls it awaits; the server logs a 499. Each request
gets its deadline when it arrives (:meth:`Gateway.deadline`), shared by everything it awaits upstream.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Header, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel

from isocompute.app.accounting.auth import KeyStore, Principal, refuse_query_key
from isocompute.app.errors import error_responses
from isocompute.app.gateway import Gateway
from isocompute.app.schemas import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    HealthResponse,
    ModelCard,
    ModelList,
    ReadyResponse,
    ReloadResponse,
    RouteRequest,
    RouteResponse,
)
from isocompute.errors import ArtifactError, EngineUnavailable, InputError

log = logging.getLogger("isocompute.app")
router = APIRouter()

GENERATE_ERRORS = {**error_responses(400, 401, 403, 404, 422, 429, 502, 503, 504),
                   200: {"content": {"text/event-stream": {"description": "with stream: true (app.streaming)"}}}}
ROUTE_ERRORS = error_responses(400, 401, 403, 404, 422, 429, 502, 503, 504)  # 5xx: a probe policy's probe call


async def get_gateway(request: Request) -> Gateway:
    gw = getattr(request.app.state, "gateway", None)
    if gw is None:
        raise EngineUnavailable("the gateway is starting or failed to start; retry shortly or read the server log")
    return gw


async def get_keystore(request: Request) -> KeyStore:
    ks = getattr(request.app.state, "keystore", None)
    if ks is None:
        raise EngineUnavailable("the gateway is starting; retry shortly")
    return ks


async def get_caller(
    request: Request,
    keys: Annotated[KeyStore, Depends(get_keystore)],
    authorization: Annotated[str | None, Header()] = None,
) -> Principal:
    """The authenticated caller, after its rate limit (401/429 otherwise); a key in the URL is a 401."""
    if request.url.query:
        refuse_query_key(request.query_params.keys())
    caller = keys.authenticate(authorization)
    caller.check_rate()
    return caller


# The dependencies are async on purpose: FastAPI runs a sync dependency in a worker thread, which costs
# more than the dependency itself on every request.
GatewayDep = Annotated[Gateway, Depends(get_gateway)]
CallerDep = Annotated[Principal, Depends(get_caller)]
KeysDep = Annotated[KeyStore, Depends(get_keystore)]


# ---- endpoints ---------------------------------------------------------------------------------


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=GENERATE_ERRORS)
async def chat_completions(req: ChatCompletionRequest, gw: GatewayDep, caller: CallerDep,
                           request: Request, response: Response) -> ChatCompletionResponse:
    """Answer a chat under a compute budget: a plan's waves of samples, one vote, one assistant message."""
    return await gw.chat_completions(req, caller, request, response)  # type: ignore[return-value]


@router.post("/v1/completions", response_model=CompletionResponse, responses=GENERATE_ERRORS)
async def completions(req: CompletionRequest, gw: GatewayDep, caller: CallerDep,
                      request: Request, response: Response) -> CompletionResponse:
    """Complete one prompt (or a list: one choice each) under a compute budget."""
    return await gw.completions(req, caller, request, response)  # type: ignore[return-value]


@router.post("/v1/route", response_model=RouteResponse, responses=ROUTE_ERRORS)
async def route(req: RouteRequest, gw: GatewayDep, caller: CallerDep, request: Request) -> RouteResponse:
    """The decision alone: a plan per prompt under the budget, without sampling (a dry run)."""
    return await gw.route_request(req, caller, request)


@router.get("/v1/models", response_model=ModelList)
async def models(request: Request) -> ModelList:
    """The model id this gateway serves, then the models a multi-model policy runs on (each one pins)."""
    gw: Gateway | None = getattr(request.app.state, "gateway", None)
    pinned = () if gw is None or gw.policy is None else gw.policy.models
    created = int(request.app.state.started_at)
    return ModelList(data=[ModelCard(id=m, created=created)
                           for m in (request.app.state.settings.served_model, *pinned)])


@router.get("/health", response_model=HealthResponse)
async def health() -> HealthResponse:
    """Liveness: the process answers."""
    return HealthResponse()


@router.get("/ready", response_model=ReadyResponse, responses={503: {"model": ReadyResponse}})
async def ready(request: Request) -> Any:
    """Readiness: a policy is loaded, the upstream answers real requests now (see ``app.readiness``) and an
    admission slot is free (``saturated`` otherwise: ``app.accounting.admission``)."""
    gw: Gateway | None = getattr(request.app.state, "gateway", None)
    policy_loaded = gw is not None and gw.policy is not None
    answered = gw is not None and gw.health.ok
    detail = None
    drain = getattr(request.app.state, "drain", None)
    draining = drain is not None and drain.draining
    if draining:
        detail = "the gateway is shutting down (draining the requests in flight)"
    elif gw is None:
        detail = "the gateway is starting"
    elif not answered:
        detail = gw.health.detail
    elif not policy_loaded:
        detail = "no policy loaded; start the gateway with --policy DIR or POST /admin/reload"
    adm = None if gw is None else gw.admission
    saturated = adm is not None and adm.saturated
    if saturated and detail is None:
        detail = (f"saturated: {adm.inflight} requests in flight (max_inflight {adm.max_inflight}), {adm.waiting} "
                  "waiting; a new request would queue")
    body = ReadyResponse(ready=policy_loaded and answered and not draining and not saturated,
                         policy_loaded=policy_loaded, upstream_answered=answered,
                         engine=None if gw is None else gw.engine.name, detail=detail, saturated=saturated,
                         inflight=0 if adm is None else adm.inflight)
    return JSONResponse(body.model_dump(), status_code=200 if body.ready else 503)


@router.get("/metrics", response_class=Response, responses=error_responses(401, 403))
async def metrics(request: Request, keys: KeysDep, authorization: Annotated[str | None, Header()] = None) -> Response:
    """Prometheus metrics of this app (its own registry); with ``metrics_need_admin_key`` only for the admin
    key (the labels name the callers and their budgets)."""
    if request.app.state.settings.metrics_need_admin_key:
        keys.authorize_admin(authorization)
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


class ReloadRequest(BaseModel):
    policy_dir: str | None = None


@router.post("/admin/reload", response_model=ReloadResponse, responses=error_responses(400, 401, 403, 422, 503))
async def reload_policy(
    request: Request,
    gw: GatewayDep,
    keys: KeysDep,
    body: Annotated[ReloadRequest | None, Body()] = None,
    authorization: Annotated[str | None, Header()] = None,
) -> ReloadResponse:
    """Reload the policy from ``policy_dir`` (default: the configured one). Needs the admin key."""
    who = keys.authorize_admin(authorization)
    from isocompute.app import serving_policy

    path = (body.policy_dir if body else None) or request.app.state.settings.policy_dir
    if path is None:
        raise InputError("no policy_dir configured; send {\"policy_dir\": \"DIR\"}")
    try:
        policy = await asyncio.to_thread(serving_policy.load_policy, Path(path))
    except ArtifactError as e:  # the running policy stays; the admin sent a bad directory
        raise InputError(f"cannot reload: {e}") from None
    gw.replace_policy(policy)
    # as at startup (main.py): move the new policy out of the GC's young generations, and let the old
    # one go (frozen objects are never collected) — one full collection per reload, an admin action
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    log.info("policy reloaded from %s by %s", path, who)
    return ReloadResponse(reloaded=True, policy_dir=str(path))
