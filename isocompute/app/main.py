"""``create_app(settings)``: the FastAPI application, with nothing loaded until its lifespan starts.

The lifespan (not the import, not ``create_app``) reads the API keys, loads the policy
(``isocompute.policy.loading.load_policy(policy_dir)``), builds the engine (``engines.registry.make_engine``), finds the model's
tokenizer (for chat templates and prompt-length checks) and its config (for FLOP accounting), starts
the math-verify pool when answers are merged as ``math`` (``answer_kind``; a missing or broken
math-verify stops the start-up with the fix), and starts the readiness task (:mod:`isocompute.app.readiness`), which keeps checking the upstream with real
requests. Shutdown stops that task and closes the gateway and the engine it built — each step even when
an earlier one fails or the shutdown itself is cancelled. Tests can pass an already-built
``policy``/``engine`` (they are then not closed) or override the route dependencies.

Several models (:mod:`isocompute.app.runner.pools`): a pool per name of ``model_upstreams`` / ``model_dirs``
(or of the ``engines`` a test injects), each with its own model facts; ``action`` serves one fixed
multi-model action (:mod:`isocompute.app.fixed_action`) instead of a fitted policy. A policy whose
``models`` have no pool stops the start-up with the flags to add.

On SIGTERM ``isocompute serve`` drains the app first (:mod:`isocompute.app.readiness`: ``/ready`` 503, new
requests 503, the requests in flight finish within ``drain_timeout_s``). Run it with ``isocompute serve`` or ``uvicorn --factory isocompute.app.main:create_app`` (settings then
come from the environment and ``ISOCOMPUTE_CONFIG``; see ``app.settings``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gc
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from isocompute import __version__
from isocompute.app import serving_policy
from isocompute.app.accounting.auth import KeyStore, load_key_file
from isocompute.app.accounting.logs import install_log_hygiene
from isocompute.app.accounting.metrics import GatewayState, Metrics, MetricsMiddleware
from isocompute.app.accounting.tracing import CallerHeaderMiddleware, TracingMiddleware, make_tracer
from isocompute.app.errors import BodyLimit, install_error_handlers
from isocompute.app.fixed_action import FixedActionPolicy
from isocompute.app.gateway import Gateway, Verifier
from isocompute.app.readiness import Drain, DrainMiddleware
from isocompute.app.routes import router
from isocompute.app.runner.batching import BatchingEngine
from isocompute.app.runner.pools import ModelPool, missing_pools, missing_pools_message
from isocompute.app.serving_policy import as_serving_policy
from isocompute.app.settings import Settings, get_settings
from isocompute.engines.base import Engine
from isocompute.errors import EngineUnavailable, InputError
from isocompute.solver.models.actions import parse_action

log = logging.getLogger("isocompute.app")


def build_engine(s: Settings) -> Engine:
    from isocompute.engines.registry import make_engine

    options: dict[str, Any] = {}
    if s.engine == "vllm-http":
        options |= {"timeout": s.upstream_timeout_s, "stall_s": s.upstream_stall_s or None,
                    "max_concurrency": s.upstream_max_concurrency}
        # model_dir is where *this* host finds the checkpoint's tokenizer and config; the upstream knows
        # the model by its own served name, which is asked for (or given) separately.
        return make_engine(s.engine, model=s.upstream_model, upstreams=s.upstreams, **options)
    return make_engine(s.engine, model=s.model_dir, upstreams=s.upstreams, **options)


def build_pool_engine(s: Settings, name: str) -> Engine:
    """Model ``name``'s engine: vLLM over its ``model_upstreams``, else in-process on its ``model_dirs`` entry
    (``engine`` when that is an in-process one, else ``transformers``)."""
    from isocompute.engines.registry import make_engine

    if name in s.model_upstreams:
        return make_engine("vllm-http", upstreams=s.model_upstreams[name], timeout=s.upstream_timeout_s,
                           stall_s=s.upstream_stall_s or None, max_concurrency=s.upstream_max_concurrency)
    kind = s.engine if s.engine in ("transformers", "vllm") else "transformers"
    return make_engine(kind, model=s.model_dirs[name])


def pool_names(s: Settings, injected: dict[str, Engine] | None) -> list[str]:
    """The named pools, in the order given: upstreams first, then model directories, then injected engines."""
    return list(dict.fromkeys([*s.model_upstreams, *s.model_dirs, *(injected or {})]))


def has_bare_pool(s: Settings, injected: Engine | None, names: list[str]) -> bool:
    """Whether there is a bare (unnamed) pool: one configured or injected, or no named pool at all."""
    return injected is not None or bool(s.upstreams) or s.model_dir is not None or not names


def model_facts(engine: Engine, model_dir: Path | None) -> tuple[Any, Any, int | None]:
    """``(tokenizer, ModelFlops, context length)`` of the served model, each ``None`` when unknown.

    The in-process engine knows its tokenizer and config; for HTTP upstreams they come from
    ``model_dir`` (the checkpoint the upstream serves).
    """
    from isocompute.flops import load_model_flops

    tokenizer = getattr(engine, "tokenizer", None)
    if tokenizer is not None:
        # A private copy: a fast tokenizer is not thread-safe (its padding state is mutated per call), and
        # the in-process engine encodes in its worker thread while the gateway counts tokens in the loop.
        tokenizer = copy.deepcopy(tokenizer)
    config: dict[str, Any] | None = None
    if hasattr(engine, "model_config"):
        config = engine.model_config()
    elif model_dir is not None and (model_dir / "config.json").is_file():
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    if tokenizer is None and model_dir is not None:
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_dir)
        except (OSError, ValueError) as e:
            log.warning("no tokenizer in %s (%s): chat requests will be refused", model_dir, e)
    flops = load_model_flops(config) if config is not None else None
    context = config.get("max_position_embeddings") if config is not None else None
    return tokenizer, flops, None if context is None else int(context)


async def upstream_model_dir(engine: Engine, timeout: float = 10.0) -> Path | None:
    """The checkpoint directory an HTTP upstream serves, when it is on this machine (vLLM lists it as the
    model's ``root``); ``None`` when the upstream cannot say or is not up yet."""
    info = getattr(engine, "model_info", None)
    if info is None:
        return None
    try:
        root = (await asyncio.wait_for(info(), timeout)).get("root")
    except (EngineUnavailable, TimeoutError) as e:
        log.warning("could not ask the upstream for its model (%s); pass --model DIR for chat and FLOPs", e)
        return None
    path = Path(str(root)) if root else None
    return path if path is not None and (path / "config.json").is_file() else None


def start_grader(s: Settings) -> Any:
    """The math-verify pool for ``answer_kind = "math"`` (started now, so a broken install fails the start-up
    with its fix, not the first request), else None. Its per-item timeout is the vote's; a hung worker is
    killed a second after its items' time."""
    if s.answer_kind != "math":
        return None
    from isocompute.tasks.grading import Grader

    grader = Grader(workers=s.grade_workers, timeout=s.vote_timeout_s, grace=1.0)
    grader.__enter__()
    return grader


def build_keystore(s: Settings) -> KeyStore:
    records = list(s.api_keys)
    if s.api_keys_file is not None:
        records += load_key_file(s.api_keys_file)
    return KeyStore(records, admin_sha256=s.admin_key_sha256)


async def start_pool(s: Settings, engine: Engine | None, model_dir: Path | None, owned: list[Engine],
                     name: str | None = None) -> tuple[Engine, ModelPool]:
    """One pool's engine (``engine`` when given — not owned —, else built from ``s``) and its facts."""
    own = engine is None
    if engine is None:
        engine = await asyncio.to_thread(build_engine if name is None else build_pool_engine, s,
                                         *(() if name is None else (name,)))
    if s.batch_requests and engine.name == "transformers":
        engine = BatchingEngine(engine, max_rows=s.batch_max_rows)
    if own:
        owned.append(engine)
    model_dir = model_dir or await upstream_model_dir(engine)
    tokenizer, model_flops, context = await asyncio.to_thread(model_facts, engine, model_dir)
    return engine, ModelPool(engine, tokenizer, model_flops, context)


async def close_all(engines: list[Engine]) -> None:
    """Close every engine, each even when an earlier close fails (the first failure is raised after)."""
    errors: list[BaseException] = []
    for e in engines:
        try:
            await e.aclose()
        except Exception as exc:  # keep closing the others
            errors.append(exc)
    if errors:
        raise errors[0]


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    from isocompute.tasks.answers.extract import extract_answer

    s: Settings = app.state.settings
    injected = app.state.injected
    install_log_hygiene()  # keys in a URL refused (auth.refuse_query_key) and blanked; client text escaped, cut
    app.state.keystore = build_keystore(s)
    policy = injected["policy"]
    if policy is None and s.policy_dir is not None:
        policy = await asyncio.to_thread(serving_policy.load_policy, s.policy_dir)
    if policy is None:
        log.warning("no policy loaded (--policy DIR): generation routes answer 503 until POST /admin/reload")
    names = pool_names(s, injected["engines"])
    if policy is not None:  # before any engine is built: a missing pool is the operator's flag to add
        missing = missing_pools(as_serving_policy(policy).models, dict.fromkeys(names))
        if missing:
            raise InputError(missing_pools_message(missing, dict.fromkeys(names)))
    owned: list[Engine] = []
    pools: dict[str, ModelPool] = {}
    try:
        engine = None
        if has_bare_pool(s, injected["engine"], names):
            engine, facts = await start_pool(s, injected["engine"], s.model_dir, owned)
        for name in names:
            given = (injected["engines"] or {}).get(name)
            pools[name] = (await start_pool(s, given, s.model_dirs.get(name), owned, name))[1]
        if engine is None:  # no bare pool: the first named one is the default
            facts = pools[names[0]]
            engine = facts.engine
        if s.action is not None:
            policy = FixedActionPolicy(parse_action(s.action), {n: p.model_flops for n, p in pools.items()},
                                       completion_tokens=s.default_max_tokens)
            missing = missing_pools(policy.models, pools)
            if missing:
                raise InputError(missing_pools_message(missing, pools, f"the action {s.action!r}"))
        grader = await asyncio.to_thread(start_grader, s)
    except BaseException:
        await close_all(owned)  # a start-up that fails leaves no engine open
        raise
    gw = Gateway(policy=policy, engine=engine, settings=s, metrics=app.state.metrics, extract=extract_answer,
                 tokenizer=facts.tokenizer, model_flops=facts.model_flops, context_limit=facts.context_limit,
                 verifier=injected["verifier"], grader=grader, pools=pools)
    app.state.gateway = gw
    app.state.metrics.initialise(sorted({gw.backend.pool, *(p.backend.pool for p in gw.pools.values())}))
    # Move what startup loaded (policy, features, tokenizer) out of the GC's young generations: rare
    # 50-70 ms full collections traversing them were seen inside decide.
    gc.freeze()
    watch = asyncio.create_task(gw.watch_upstream())
    log.info("isocompute gateway ready to accept requests (engine %s, policy %s)", engine.name,
             "loaded" if policy is not None else "missing")
    try:
        yield
    finally:
        watch.cancel()
        try:
            # never re-raises what the task died of; a cancelled shutdown still reaches the closes below
            await asyncio.wait([watch], timeout=5.0)
        finally:
            app.state.gateway = None
            try:
                gw.close()
            finally:
                try:
                    if grader is not None:
                        await asyncio.to_thread(grader.close)
                finally:
                    try:
                        await close_all(owned)
                    finally:
                        await gw.quotas.store.aclose()
                        if app.state.tracer_provider is not None:  # flush the last spans
                            await asyncio.to_thread(app.state.tracer_provider.shutdown)


def gateway_state(app: FastAPI) -> GatewayState:
    """What ``/metrics`` reads at each scrape: every backend's readiness and breakers, the drain, the quota
    store's failures (before the lifespan started: the drain only)."""
    drain: Drain = app.state.drain
    st = GatewayState(drain_seconds=None if drain.since is None else time.monotonic() - drain.since)
    gw: Gateway | None = app.state.gateway
    if gw is None:
        return st
    for b in {id(b): b for b in [gw.backend, *(p.backend for p in gw.pools.values())]}.values():
        st.upstream_up[b.pool] = b.health.ok
        status = getattr(b.engine, "upstream_status", None)
        if status is not None:
            st.circuits[b.pool] = [(u["url"], u["state"]) for u in status()]
    st.quota_store_errors = gw.quotas.errors
    return st


# The OpenAI fields the routes refuse with 400 (routes._refuse_unsupported), as the schema should state them:
# the models accept them (so the refusal can say what to send instead), the published schema does not.
REFUSED = {"n": {"maximum": 1}, "best_of": {"maximum": 1}, "echo": {"enum": [False, None]},
           "tools": {"maxItems": 0}, "suffix": {"maxLength": 0}}
REFUSED_LOGPROBS = {"ChatCompletionRequest": {"enum": [False, None]}, "CompletionRequest": {"maximum": 0}}


def truthful_openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's OpenAPI document, with the refused fields (:data:`REFUSED`) constrained to what is served."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        schemas = doc.get("components", {}).get("schemas", {})
        for name, logprobs in REFUSED_LOGPROBS.items():
            props = schemas.get(name, {}).get("properties", {})
            for field, rule in {**REFUSED, "logprobs": logprobs}.items():
                if field in props:
                    props[field].update(rule)
        app.openapi_schema = doc
    return app.openapi_schema


def create_app(
    settings: Settings | None = None,
    *,
    policy: Any = None,
    engine: Engine | None = None,
    verifier: Verifier | None = None,
    engines: dict[str, Engine] | None = None,
    span_exporter: Any = None,
) -> FastAPI:
    """The gateway app. ``settings`` default to :func:`get_settings`; ``policy``/``engine``/``verifier``
    replace what the lifespan would load, ``engines`` the named pools' engines (for tests and embedding);
    ``span_exporter`` receives the traces instead of ``otel_traces_endpoint`` (tests: the SDK's in-memory one)."""
    s = settings or get_settings()
    app = FastAPI(
        title="isocompute gateway",
        version=__version__,
        description="OpenAI-compatible gateway that spends inference compute per request under a budget.",
        lifespan=lifespan,
    )
    app.state.settings = s
    app.state.injected = {"policy": policy, "engine": engine, "verifier": verifier, "engines": engines}
    app.state.metrics = Metrics()
    app.state.metrics.watch_state(lambda: gateway_state(app))
    app.state.started_at = time.time()
    app.state.gateway = None
    app.state.drain = Drain(s.drain_timeout_s)  # started by isocompute serve's server on SIGTERM (app.readiness)
    install_error_handlers(app, s.retry_after_s)
    app.include_router(router)
    app.openapi = lambda: truthful_openapi(app)  # type: ignore[method-assign]
    paths = frozenset(getattr(r, "path", "") for r in (*app.routes, *router.routes))
    app.add_middleware(BodyLimit, max_bytes=s.max_body_bytes)
    app.add_middleware(DrainMiddleware, drain=app.state.drain, retry_after_s=s.retry_after_s)  # before the body
    tracer, app.state.tracer_provider = make_tracer(s.otel_traces_endpoint, s.otel_service_name, span_exporter)
    if tracer is not None:
        app.add_middleware(TracingMiddleware, tracer=tracer)
    if s.upstream_caller_header is not None:  # a router's fairness header on every upstream call
        app.add_middleware(CallerHeaderMiddleware, header=s.upstream_caller_header)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics, routes=paths)  # outermost: counts the drain's 503s
    return app
