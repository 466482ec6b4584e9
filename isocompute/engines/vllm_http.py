"""Sampling through vLLM's (or any OpenAI-compatible server's) ``/v1/completions`` over HTTP.

One request per prompt asks for all ``n`` samples (``"n": n``), so vLLM prefills the shared prompt once.
Token counts and the reading of replies and HTTP statuses: :mod:`isocompute.engines.openai_replies`.
One call to one upstream (a POST within its time budget, the readiness check, the model listing):
:mod:`isocompute.engines.upstream_calls`.

Greedy decoding (``temperature == 0``) asks for one sample and repeats it ``n`` times, since vLLM
rejects ``n > 1`` without sampling and the samples would be identical anyway.

Seeds: vLLM gives sample ``j`` of a request with seed ``s`` the seed ``s + j``; this engine sends prompt
``i`` of a call the seed ``seed + i·n`` so no two samples of one call share a random stream.

Several upstreams are load-balanced least-outstanding-first (ties broken round-robin), each behind a
circuit breaker (:mod:`isocompute.engines.circuit`): a refused or reset connection opens an upstream at
once; ``errors_to_trip`` HTTP 5xx answers or timeouts in a row open it too
(:class:`~isocompute.engines.openai_replies.Retryable` tabulates the kinds). Only closed upstreams get
traffic. An open one is probed by the engine itself — one 1-token completion after a cooldown of
``cooldown · 2^level`` (capped at ``max_cooldown``, jittered) — and closes as soon as the probe is
answered, so a restarted server rejoins by itself within one cooldown; a failed probe raises the level.
A request that fails on one upstream is retried on the best closed one (``retries`` times; after a 429
or a 5xx with exponential backoff ``backoff · 2^attempt`` capped at ``max_backoff``, jittered); when an
upstream's connection fails, the other requests still waiting on it are retried elsewhere at once — or,
when it stops listening (a drained or stopped server refuses connections), fail fast if there is no
elsewhere. No upstream closed: the request fails at once with :class:`~isocompute.engines.base.CircuitOpen`
(its ``retry_after`` is when the next probe goes out), naming each upstream's last error and the command
that starts a server. A 401/403/404 (this server misconfigured) skips the upstream like a down one and,
when every upstream says so, raises :class:`~isocompute.engines.base.UpstreamMisconfigured` saying what
to change; other 4xx answers are the caller's and raise :class:`~isocompute.errors.InputError` unretried.

``max_concurrency`` bounds requests in flight across all upstreams (an ``asyncio.Semaphore``). Every
call has explicit connect and read timeouts and a deadline on the whole attempt (``connect_timeout +
timeout``; the probe's ``probe_timeout``), shortened to end just before the caller's deadline when it
sets one (``engines.base.REQUEST_DEADLINE``), so that a timeout is counted here rather than only
cancelled by the caller. The HTTP client, semaphore and probe tasks live in the running event loop; use
one engine within one event loop and ``await aclose()`` at the end.

``request(body)`` sends any completions body through the same balancer and retries and returns the raw
JSON (the entropy probe, :mod:`isocompute.engines.probe`, asks for ``logprobs`` that way).

``stream_wave(prompt, n, …, on_finish)`` streams one prompt's wave and closes the request when
``on_finish`` says stop (:mod:`isocompute.engines.streaming`).

``generate(…, logprobs=K)`` asks each request for ``"logprobs": K`` and returns completions with their
``logprob_mean`` and ``confidence_min_window`` (:mod:`isocompute.engines.openai_replies`); off by default.

``stream_wave(…, logprobs=K)`` asks the stream for them too: each finished sample carries its confidence
(:mod:`isocompute.engines.streaming`).

Ignores: chat completions (prompts arrive already templated), stop strings.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp
import httpx

from isocompute.engines.base import (
    Completion,
    OnFinish,
    WaveStream,
    check_generate_args,
    gather_or_cancel,
    replay_finishes,
)
from isocompute.engines.circuit import Upstream, UpstreamPool
from isocompute.engines.openai_replies import describe, parse_completions, split_evenly
from isocompute.engines.probe import TOP_LOGPROBS, ProbeResult, completion_logprobs_entropy
from isocompute.engines.streaming import stream_completions
from isocompute.engines.upstream_calls import (
    accepts_connections,
    base_url,
    check_upstream,
    fetch_model_entry,
    fetch_model_name,
    post_completions,
    with_retries,
)
from isocompute.errors import EngineUnavailable, InputError
from isocompute.tasks.confidence import DEFAULT_WINDOW

__all__ = ["START_HINT", "Upstream", "VLLMHTTPEngine", "split_evenly"]

log = logging.getLogger(__name__)

KEEPALIVE_S = 4.0  # idle connections dropped before vLLM's uvicorn closes them (5 s): no send on a closing one

START_HINT = (
    "start a server, e.g. `scripts/vllm-cpu-serve.sh MODEL_DIR 8000` on a CPU machine "
    "(after `make vllm-env`) or `vllm serve MODEL_DIR --port 8000` on a GPU machine, then pass "
    "--upstream http://127.0.0.1:8000"
)


class VLLMHTTPEngine:
    """vLLM's OpenAI completions API, load-balanced over ``upstreams`` (base URLs like
    ``http://127.0.0.1:8000``, with or without a trailing ``/v1``).

    ``model`` is the served model name; ``None`` asks the first reachable upstream's ``/v1/models``.
    ``timeout`` bounds each wait on the server — and so a whole generation, since vLLM answers a
    non-streaming request only when it is done (on CPU that can take minutes); ``connect_timeout``
    bounds the TCP connect; ``probe_timeout`` the recovery probe; ``stall_s``: an upstream that answers
    nothing that long while another can take its requests gets a 1-token check and, unanswered, loses them
    to the others (None: never; :mod:`isocompute.engines.circuit`). ``cooldown``/``max_cooldown``: the
    first and the longest wait before an open upstream is probed; ``errors_to_trip``: HTTP 5xx answers in
    a row that open an upstream. ``transport`` replaces httpx's network transport (tests use a small
    in-memory server to provoke failures a real vLLM will not produce on demand); without one the
    completions POSTs and streams go over aiohttp (the hot path), the rest — model list, probes — over httpx.
    """

    name = "vllm-http"

    def __init__(
        self,
        upstreams: list[str] | str,
        *,
        model: str | None = None,
        max_concurrency: int = 64,
        timeout: float = 600.0,
        connect_timeout: float = 5.0,
        retries: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        cooldown: float = 0.5,
        max_cooldown: float = 5.0,
        probe_timeout: float = 10.0,
        stall_s: float | None = 3.0,
        errors_to_trip: int = 3,
        return_token_ids: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        urls = [upstreams] if isinstance(upstreams, str) else list(upstreams)
        if not urls:
            raise InputError(f"no upstream given; {START_HINT}")
        if (max_concurrency < 1 or retries < 0 or errors_to_trip < 1
                or min(timeout, connect_timeout, probe_timeout, cooldown, max_cooldown, 1 if stall_s is None else stall_s) <= 0):
            raise InputError(
                "need max_concurrency >= 1, retries >= 0, errors_to_trip >= 1 and positive timeouts and "
                f"cooldowns; got max_concurrency={max_concurrency}, retries={retries}, "
                f"errors_to_trip={errors_to_trip}, timeout={timeout}, connect_timeout={connect_timeout}, "
                f"probe_timeout={probe_timeout}, stall_s={stall_s}, cooldown={cooldown}, max_cooldown={max_cooldown}"
            )
        self.pool = UpstreamPool([base_url(u) for u in urls], cooldown=cooldown, max_cooldown=max_cooldown,
                                 errors_to_trip=errors_to_trip, probe=self._probe_upstream, hint=START_HINT,
                                 listening=None if transport else lambda up: accepts_connections(up.url, connect_timeout),
                                 stall_s=stall_s, stall_check=self._check)
        self.upstreams = self.pool.upstreams
        self.model = model
        self.max_concurrency = max_concurrency
        self.timeout = httpx.Timeout(timeout, connect=connect_timeout)
        self.attempt_timeout = connect_timeout + timeout
        self.probe_timeout = probe_timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.return_token_ids = return_token_ids
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._session: aiohttp.ClientSession | None = None  # the completions POST (upstream_calls); None: httpx
        self._sem: asyncio.Semaphore | None = None
        self._warned_split = False

    # ---- protocol -------------------------------------------------------------------------------

    async def generate(
        self,
        prompts: list[str],
        n: int,
        max_tokens: int,
        temperature: float,
        seed: int | None = None,
        *,
        logprobs: int | None = None,
        confidence_window: int = DEFAULT_WINDOW,
    ) -> list[list[Completion]]:
        """Send one ``/v1/completions`` request per prompt, concurrently; results in prompt order. With
        ``logprobs=K`` each request asks for ``"logprobs": K`` and the completions carry their confidence
        (:mod:`isocompute.engines.openai_replies`)."""
        check_generate_args(n, max_tokens, temperature, logprobs, confidence_window)
        if not prompts:
            return []
        model = await self._model_name()
        # vLLM refuses n > 1 with greedy decoding (all samples would be equal): ask once, copy n times.
        n_req = 1 if temperature == 0 else n
        tasks = [
            self._complete_one(model, p, n_req, max_tokens, temperature, None if seed is None else seed + i * n,
                               logprobs, confidence_window)
            for i, p in enumerate(prompts)
        ]
        return [comps * (n // n_req) for comps in await gather_or_cancel(tasks)]

    async def stream_wave(self, prompt: str, n: int, max_tokens: int, temperature: float, seed: int | None,
                          on_finish: OnFinish, *, logprobs: int | None = None,
                          confidence_window: int = DEFAULT_WINDOW) -> WaveStream:
        """``n`` samples of ``prompt`` in one streamed request, ``on_finish`` called as each finishes; the
        request is closed (vLLM aborts it) when it returns True. Greedy: one sample, replayed ``n`` times.
        ``logprobs=K``: each finished sample's confidence (module docstring)."""
        check_generate_args(n, max_tokens, temperature, logprobs, confidence_window)
        if temperature == 0:
            [comps] = await self.generate([prompt], n, max_tokens, temperature, seed, logprobs=logprobs,
                                          confidence_window=confidence_window)
            return await replay_finishes(list(comps), on_finish)
        body: dict[str, Any] = {"model": await self._model_name(), "prompt": prompt, "n": n,
                                "max_tokens": max_tokens, "temperature": temperature}
        if seed is not None:
            body["seed"] = seed
        if self.return_token_ids:
            body["return_token_ids"] = True
        if logprobs is not None:
            body |= {"logprobs": logprobs, "return_tokens_as_token_ids": True}
        return await stream_completions(self, body, on_finish, confidence_window=confidence_window)

    async def aclose(self) -> None:
        await self.pool.aclose()
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ---- readiness ------------------------------------------------------------------------------

    async def wait_ready(self, timeout: float = 120.0, poll: float = 0.5) -> list[str]:
        """Wait until upstreams answer one real 1-token completion; return the ready URLs.

        vLLM answers ``/health`` before its engine can serve, hence the real request. Upstreams not
        ready by ``timeout`` are opened (the engine probes them and they rejoin when they answer);
        raises :class:`EngineUnavailable` when none is ready.
        """
        deadline = time.monotonic() + timeout
        ready = await asyncio.gather(*(self._wait_one(u, deadline, poll) for u in self.upstreams))
        urls = [u.url for u, ok in zip(self.upstreams, ready, strict=True) if ok]
        if not urls:
            detail = "; ".join(f"{u.url}: {u.last_error or 'not ready'}" for u in self.upstreams)
            raise EngineUnavailable(f"no vLLM upstream became ready within {timeout:.0f} s ({detail}); {START_HINT}")
        return urls

    async def _wait_one(self, up: Upstream, deadline: float, poll: float) -> bool:
        while True:
            epoch = up.breaker.epoch
            try:
                await self._check(up, max(0.1, min(self.probe_timeout, deadline - time.monotonic())))
                self.pool.answered(up)
                return True
            except Exception as e:  # whatever the upstream does, keep waiting until the deadline
                up.last_error = describe(e)
            if time.monotonic() + poll > deadline:
                self.pool.failed(up, up.last_error, epoch)
                return False
            await asyncio.sleep(poll)

    # ---- status ---------------------------------------------------------------------------------

    def upstream_status(self) -> list[dict[str, Any]]:
        """Per upstream: url, up (closed: gets traffic), state (closed/open/half_open), seconds until its
        next probe, outstanding requests, consecutive failures, served, last error, misconfigured."""
        return self.pool.status()

    # ---- the probe that closes an open upstream ---------------------------------------------

    async def _probe_upstream(self, up: Upstream) -> None:
        await self._check(up, self.probe_timeout)

    async def _check(self, up: Upstream, timeout: float) -> None:
        """One real 1-token completion on ``up`` within ``timeout`` (:func:`check_upstream`); the first
        one answered names the model when it was not given."""
        model = await check_upstream(self._ensure_client(), up.url, self.model, timeout)
        if self.model is None:
            self.model = model

    # ---- internals ------------------------------------------------------------------------------

    def _ensure_client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=self.timeout,
                transport=self._transport,
                limits=httpx.Limits(max_connections=self.max_concurrency + 2 * len(self.upstreams),
                                    max_keepalive_connections=self.max_concurrency, keepalive_expiry=KEEPALIVE_S),
            )
            self._sem = asyncio.Semaphore(self.max_concurrency)
            if self._transport is None:
                t = self.timeout
                self._session = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=self.max_concurrency + 2 * len(self.upstreams),
                                                   limit_per_host=0, keepalive_timeout=KEEPALIVE_S),
                    timeout=aiohttp.ClientTimeout(total=None, connect=t.connect, sock_read=t.read))
        return self._client

    async def _model_name(self) -> str:
        if self.model is not None:
            return self.model
        while True:
            up = self.pool.pick()  # no closed upstream: fail fast
            epoch = up.breaker.epoch
            try:
                async with asyncio.timeout(self.probe_timeout):
                    self.model = await self._fetch_model(up)
                return self.model
            except (httpx.HTTPError, TimeoutError, ValueError, LookupError, TypeError, AttributeError) as e:
                self.pool.failed(up, f"GET /v1/models: {describe(e)}", epoch)

    async def model_info(self) -> dict[str, Any]:
        """The first served model's ``/v1/models`` entry (vLLM: ``id``, ``root`` = the model path,
        ``max_model_len``) from whichever upstream answers first (all are asked at once, so a hung one
        does not hold up the others)."""

        async def ask(up: Upstream) -> dict[str, Any]:
            async with asyncio.timeout(self.probe_timeout):
                return await self._fetch_model_entry(up)

        tasks = {asyncio.ensure_future(ask(up)): up for up in self.upstreams}
        errors = []
        try:
            for next_done in asyncio.as_completed(tasks):
                try:
                    return await next_done
                except (httpx.HTTPError, TimeoutError, ValueError, LookupError, TypeError, AttributeError) as e:
                    errors.append(describe(e))
        finally:
            for t in tasks:
                t.cancel()
        raise EngineUnavailable(f"no upstream listed its model ({'; '.join(errors)}); {START_HINT}")

    async def _fetch_model_entry(self, up: Upstream) -> dict[str, Any]:
        return await fetch_model_entry(self._ensure_client(), up.url)

    async def _fetch_model(self, up: Upstream) -> str:
        return await fetch_model_name(self._ensure_client(), up.url)

    async def _complete_one(
        self, model: str, prompt: str, n: int, max_tokens: int, temperature: float, seed: int | None,
        logprobs: int | None = None, confidence_window: int = DEFAULT_WINDOW,
    ) -> list[Completion]:
        body: dict[str, Any] = {"model": model, "prompt": prompt, "n": n, "max_tokens": max_tokens,
                                "temperature": temperature}
        if seed is not None:
            body["seed"] = seed
        if self.return_token_ids:
            body["return_token_ids"] = True
        if logprobs is not None:
            body |= {"logprobs": logprobs, "return_tokens_as_token_ids": True}
        comps, split = parse_completions(await self.request(body), n, logprobs=logprobs,
                                         confidence_window=confidence_window)
        if split and not self._warned_split:
            log.warning("upstream returned no per-choice token_ids; splitting usage.completion_tokens evenly over "
                        "the choices (per-sample counts are then only right on average)")
            self._warned_split = True
        return comps

    async def request(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST one ``/v1/completions`` body through the balancer with retries; return the JSON answer.

        Generation builds its bodies in ``generate``; other callers (the entropy probe, which asks for
        ``logprobs``) send their own; a body without ``model`` gets the served one. Raises
        :class:`CircuitOpen` at once when no upstream is closed, :class:`EngineUnavailable` when every
        attempt fails, :class:`UpstreamBadResponse` for a reply that is not a JSON object.
        """
        self.pool.fail_fast()  # before queueing for the semaphore
        if "model" not in body:
            body = {"model": await self._model_name(), **body}
        httpx_client = self._ensure_client()
        client = httpx_client if self._session is None else self._session
        return await with_retries(self, lambda up, _epoch, budget: post_completions(client, up.url, body, budget),
                                  what="request", hint=f"; {START_HINT}")

    async def probe_entropy(self, prompts: list[str], max_tokens: int) -> ProbeResult:
        """Mean top-20 entropy of one greedy answer per prompt, from ``/v1/completions`` with
        ``"logprobs": 20`` (:mod:`isocompute.engines.probe`), through the balancer like any request."""
        bodies = [{"prompt": p, "n": 1, "max_tokens": max_tokens, "temperature": 0.0, "logprobs": TOP_LOGPROBS}
                  for p in prompts]
        answers = await gather_or_cancel([self.request(b) for b in bodies])
        parsed = [completion_logprobs_entropy(a) for a in answers]  # (entropy, generated, prompt tokens)
        return ProbeResult.of([h for h, _, _ in parsed], [p for _, _, p in parsed], [m for _, m, _ in parsed],
                              f"top{TOP_LOGPROBS}")

