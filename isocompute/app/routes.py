"""The HTTP endpoints: each one validates, calls the :class:`~isocompute.app.gateway.Gateway`, responds.

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

A generation request runs as a task raced against the client's disconnect (:func:`unless_disconnected`,
the pattern of vLLM's ``with_cancellation``): a client that goes away cancels the task, and with it the
upstream calls it awaits; the server logs a 499. Each request gets its deadline when it arrives
(:meth:`Gateway.deadline`), shared by everything it awaits upstream.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Body, Depends, Header, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel

from isocompute.app.accounting.auth import KeyStore, Principal, refuse_query_key
from isocompute.app.errors import ClientDisconnected, error_responses
from isocompute.app.gateway import Answer, Ask, Gateway, policy_text
from isocompute.app.runner.execute import Deadline
from isocompute.app.schemas import (
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessageOut,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    HealthResponse,
    ModelCard,
    ModelList,
    ReadyResponse,
    ReloadResponse,
    RouteDecision,
    RouteRequest,
    RouteResponse,
    Usage,
)
from isocompute.app.streaming import SSE_HEADERS, answer_events, usage_of, wait_disconnect
from isocompute.errors import ArtifactError, EngineUnavailable, InputError

log = logging.getLogger("isocompute.app")
router = APIRouter()
T = TypeVar("T")

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


# ---- request checks ----------------------------------------------------------------------------


def _log_unknown(req: BaseModel) -> None:
    if req.model_extra:
        log.info("ignoring unknown request fields: %s", ", ".join(sorted(req.model_extra)))


def _refuse_unsupported(req: ChatCompletionRequest | CompletionRequest) -> None:
    """400 for OpenAI options that would change the answer's form; we cannot honour them."""
    if req.n not in (None, 1):
        raise InputError(f"n={req.n}: the gateway returns one aggregated choice per prompt; send n=1 and "
                         "control sampling with budget / max_samples")
    if isinstance(req, ChatCompletionRequest):
        if req.logprobs or req.top_logprobs:
            raise InputError("logprobs are not supported; send logprobs=false")
        if req.tools:
            raise InputError("tools are not supported; send no tools")
        fmt = (req.response_format or {}).get("type", "text")
        if fmt != "text":
            raise InputError(f"response_format {fmt!r} is not supported; send type 'text' or omit it")
    else:
        if req.logprobs:
            raise InputError("logprobs are not supported; omit logprobs")
        if req.echo:
            raise InputError("echo=true is not supported; send echo=false")
        if req.suffix:
            raise InputError("suffix is not supported; omit it")
        if req.best_of not in (None, 1):
            raise InputError("best_of is not supported; use strategy='best_of' with budget instead")


def _text_prompts(prompt: Any) -> list[str]:
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return list(prompt)
    raise InputError("prompt must be a string or a list of strings; token-id prompts are not supported")


def _usage(answers: list[Answer]) -> Usage:
    return Usage(**usage_of(answers))


async def _stream(request: Request, gw: Gateway, caller: Principal, prompts: list[str], ask: Ask, deadline: Deadline,
                  kind: Literal["chat", "text"], options: dict[str, Any] | None, head: dict[str, Any]
                  ) -> StreamingResponse:
    """A ``stream: true`` request (:mod:`isocompute.app.streaming`): routed before the stream opens, so a
    refusal is a JSON 4xx; its waves run inside the stream, a disconnect cancelling them."""
    if options is not None and not isinstance(options.get("include_usage", False), bool):
        raise InputError("stream_options.include_usage must be true or false")
    routing = await unless_disconnected(request, gw.route(prompts, ask, principal=caller, deadline=deadline,
                                                          dry_run=False))
    events = answer_events(gw.run(prompts, routing, ask, deadline), request.receive, kind=kind, head=head,
                           include_usage=bool((options or {}).get("include_usage")),
                           keepalive_s=gw.settings.stream_keepalive_s)
    quota = {} if routing.quota is None else routing.quota.headers()  # what was left before this request
    return StreamingResponse(events, media_type="text/event-stream", headers={**SSE_HEADERS, **quota})


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result, unless the client disconnects first: then ``work`` is cancelled (its upstream
    calls with it) and :class:`ClientDisconnected` raised (499 in the log; nobody reads the answer).

    ``work`` runs in this task — only the watcher is a task of its own, which on a disconnect cancels this
    one — so a request pays no extra scheduling hop when its work is done.
    """
    me = asyncio.current_task()
    assert me is not None
    done = False

    def on_disconnect(watch: asyncio.Future[None]) -> None:
        if not done and not watch.cancelled():
            me.cancel()

    watch = asyncio.ensure_future(wait_disconnect(request.receive))
    watch.add_done_callback(on_disconnect)
    try:
        return await work
    except asyncio.CancelledError:
        if not (watch.done() and not watch.cancelled()):
            raise  # cancelled for another reason (shutdown): let it go
        me.uncancel()
        raise ClientDisconnected("the client closed the connection; its upstream work was cancelled") from None
    finally:
        done = True
        watch.cancel()


# ---- endpoints ---------------------------------------------------------------------------------


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=GENERATE_ERRORS)
async def chat_completions(req: ChatCompletionRequest, gw: GatewayDep, caller: CallerDep,
                           request: Request, response: Response) -> ChatCompletionResponse:
    """Answer a chat under a compute budget: a plan's waves of samples, one vote, one assistant message."""
    deadline = gw.deadline()
    _log_unknown(req)
    _refuse_unsupported(req)
    pin = gw.check_model(req.model)
    max_tokens, temperature, seed = gw.sampling(req.max_completion_tokens or req.max_tokens, req.temperature,
                                                req.seed)
    prompts, counts = await gw.prepare(None, req.messages, max_tokens)
    ask = Ask(req.budget, req.budget_unit, req.max_samples, req.max_waves, max_tokens, temperature, seed,
              req.strategy, req.latency_budget, pin, counts, [policy_text(req.messages)], req.messages)
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    if req.stream:
        return await _stream(request, gw, caller, prompts, ask, deadline, "chat", req.stream_options,  # type: ignore[return-value]
                             {"id": rid, "object": "chat.completion.chunk", "created": created,
                              "model": gw.settings.served_model})
    [ans] = await unless_disconnected(request, gw.answer(prompts, ask, principal=caller, deadline=deadline,
                                                         headers=response.headers))
    return ChatCompletionResponse(
        id=rid, created=created, model=gw.settings.served_model,
        choices=[ChatChoice(index=0, message=ChatMessageOut(content=ans.text), finish_reason=ans.finish_reason)],
        usage=_usage([ans]), isocompute=ans.info,
    )


@router.post("/v1/completions", response_model=CompletionResponse, responses=GENERATE_ERRORS)
async def completions(req: CompletionRequest, gw: GatewayDep, caller: CallerDep,
                      request: Request, response: Response) -> CompletionResponse:
    """Complete one prompt (or a list: one choice each) under a compute budget."""
    deadline = gw.deadline()
    _log_unknown(req)
    _refuse_unsupported(req)
    pin = gw.check_model(req.model)
    max_tokens, temperature, seed = gw.sampling(req.max_tokens, req.temperature, req.seed)
    prompts, counts = await gw.prepare(_text_prompts(req.prompt), None, max_tokens)
    ask = Ask(req.budget, req.budget_unit, req.max_samples, req.max_waves, max_tokens, temperature, seed,
              req.strategy, req.latency_budget, pin, counts)
    rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    if req.stream:
        return await _stream(request, gw, caller, prompts, ask, deadline, "text", req.stream_options,  # type: ignore[return-value]
                             {"id": rid, "object": "text_completion", "created": created,
                              "model": gw.settings.served_model})
    answers = await unless_disconnected(request, gw.answer(prompts, ask, principal=caller, deadline=deadline,
                                                           headers=response.headers))
    return CompletionResponse(
        id=rid, created=created, model=gw.settings.served_model,
        choices=[CompletionChoice(index=i, text=a.text, finish_reason=a.finish_reason, isocompute=a.info)
                 for i, a in enumerate(answers)],
        usage=_usage(answers), isocompute=answers[0].info,
    )


@router.post("/v1/route", response_model=RouteResponse, responses=ROUTE_ERRORS)
async def route(req: RouteRequest, gw: GatewayDep, caller: CallerDep, request: Request) -> RouteResponse:
    """The decision alone: a plan per prompt under the budget, without sampling (a dry run)."""
    deadline = gw.deadline()
    _log_unknown(req)
    pin = gw.check_model(req.model)
    if (req.prompt is None) == (req.messages is None):
        raise InputError("send exactly one of prompt (string or list of strings) or messages")
    max_tokens, temperature, _ = gw.sampling(None, req.temperature, None)
    prompts, counts = await gw.prepare(None if req.messages is not None else _text_prompts(req.prompt), req.messages,
                                       max_tokens)
    ask = Ask(req.budget, req.budget_unit, req.max_samples, req.max_waves, max_tokens, temperature,
              latency_budget=req.latency_budget, model=pin, prompt_tokens=counts,
              policy_prompts=None if req.messages is None else [policy_text(req.messages)])
    # A dry run must not move the controller, so it reads the internal budget without observing a cost;
    # a probe policy's probe call is upstream work, which a client that goes away cancels.
    r = await unless_disconnected(request, gw.route(prompts, ask, principal=caller, deadline=deadline))
    el = r.expected_latency
    return RouteResponse(
        model=gw.settings.served_model, budget=r.plan.budget, budget_unit=r.plan.unit,  # type: ignore[arg-type]
        budget_written=r.plan.written, internal_budget=r.internal_budget, latency_budget=r.latency_budget,
        internal_latency_budget=None if r.latency_control is None else r.latency_control.internal,
        expected_latency=None if el is None else sum(el) / len(el),
        lambda_=r.lam, rule=r.rule, rule_evidence=r.rule_evidence,
        decisions=[RouteDecision(action=r.actions[i], plan=r.plans[i].name, policy_plan=r.policy_plans[i].name,
                                 k=r.ks[i], policy_k=r.policy_ks[i], expected_cost=r.costs[i],
                                 expected_samples=None if r.expected_samples is None else r.expected_samples[i],
                                 expected_waves=None if r.expected_waves is None else r.expected_waves[i],
                                 expected_latency=None if el is None else el[i],
                                 model_action=r.model_actions[i].name if r.model_actions else None)
                   for i in range(len(prompts))],
    )


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
    """Readiness: a policy is loaded and the upstream answers real requests now (see ``app.readiness``)."""
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
    body = ReadyResponse(ready=policy_loaded and answered and not draining, policy_loaded=policy_loaded, upstream_answered=answered,
                         engine=None if gw is None else gw.engine.name, detail=detail)
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
