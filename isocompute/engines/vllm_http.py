"""Sampling through vLLM's (or any OpenAI-compatible server's) ``/v1/completions`` over HTTP.

One request per prompt asks for all ``n`` samples (``"n": n``), so vLLM prefills the shared prompt once.
Token counts: ``prompt_tokens`` is the request's ``usage.prompt_tokens`` (one prompt, counted once);
per-sample ``completion_tokens`` is ``len(choice.token_ids)``, which vLLM returns when asked with
``"return_token_ids": true`` (vLLM ≥ 0.10.2; its usage only carries totals). A server that ignores that
field (plain OpenAI-compatible servers) gets ``usage.completion_tokens`` split evenly over the choices,
remainder to the first ones — a last resort, logged once as a warning, since then the per-sample counts
are only right on average. Example: usage 10 over 4 choices → ``[3, 3, 2, 2]``.

Greedy decoding (``temperature == 0``) asks for one sample and repeats it ``n`` times, since vLLM
rejects ``n > 1`` without sampling and the samples would be identical anyway.

Seeds: vLLM gives sample ``j`` of a request with seed ``s`` the seed ``s + j``; this engine sends prompt
``i`` of a call the seed ``seed + i·n`` so no two samples of one call share a random stream.

Several upstreams are load-balanced least-outstanding-first (ties broken round-robin). An upstream that
fails (connection error, timeout, HTTP 5xx) is marked down for a cooldown that doubles with each
consecutive failure (``cooldown``, ``2·cooldown``, … up to ``max_cooldown``); after it, one probe
request at a time goes there (half-open), so a restarted server rejoins by itself without taking the
whole backlog at once; a success clears its record. Each request is retried
``retries`` times with exponential backoff (``backoff · 2^attempt``, capped at ``max_backoff``, with
jitter), each retry going to the best upstream at that moment. When every upstream is down the
request still probes the one whose cooldown ends first rather than failing at once; when all attempts
fail it raises :class:`~isocompute.errors.EngineUnavailable` with the command that starts a server.
HTTP 4xx answers are the caller's fault and raise :class:`~isocompute.errors.InputError` unretried.

``max_concurrency`` bounds requests in flight across all upstreams (an ``asyncio.Semaphore``). Every
call has explicit connect and read timeouts. The HTTP client and semaphore are created on first use
inside the running event loop; use one engine within one event loop and ``await aclose()`` at the end.

``request(body)`` sends any completions body through the same balancer and retries and returns the raw
JSON (the entropy probe, :mod:`isocompute.engines.probe`, asks for ``logprobs`` that way).

Ignores: streaming, chat completions (prompts arrive already templated), logprobs in ``generate``, stop
strings.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx

from isocompute.engines.base import Completion, check_generate_args
from isocompute.engines.probe import TOP_LOGPROBS, ProbeResult, completion_logprobs_entropy
from isocompute.errors import EngineUnavailable, InputError

__all__ = ["Upstream", "VLLMHTTPEngine", "split_evenly", "START_HINT"]

log = logging.getLogger(__name__)

START_HINT = (
    "start a server, e.g. `scripts/vllm-cpu-serve.sh MODEL_DIR 8000` on a CPU machine "
    "(after `make vllm-env`) or `vllm serve MODEL_DIR --port 8000` on a GPU machine, then pass "
    "--upstream http://127.0.0.1:8000"
)


def split_evenly(total: int, parts: int) -> list[int]:
    """Split ``total`` into ``parts`` integers differing by at most one, larger ones first.

    >>> split_evenly(10, 4)
    [3, 3, 2, 2]
    """
    q, r = divmod(total, parts)
    return [q + 1] * r + [q] * (parts - r)


@dataclass
class Upstream:
    """One server and what the balancer knows about it (times are ``time.monotonic()`` seconds)."""

    url: str
    outstanding: int = 0
    failures: int = 0
    down_until: float = 0.0
    last_error: str = ""
    served: int = 0

    def is_up(self, now: float) -> bool:
        """Past its cooldown, and — while it is still on probation after failures — not already being
        probed, so a recovering server gets one request, not the whole backlog at once."""
        return now >= self.down_until and not (self.failures and self.outstanding)


class _Retryable(Exception):
    """Internal: an upstream failure worth another attempt (connection, timeout, 5xx, 429)."""

    def __init__(self, message: str, *, mark_down: bool = True) -> None:
        super().__init__(message)
        self.mark_down = mark_down


class VLLMHTTPEngine:
    """vLLM's OpenAI completions API, load-balanced over ``upstreams`` (base URLs like
    ``http://127.0.0.1:8000``, with or without a trailing ``/v1``).

    ``model`` is the served model name; ``None`` asks the first reachable upstream's ``/v1/models``.
    ``timeout`` bounds each wait on the server — and so a whole generation, since vLLM answers a
    non-streaming request only when it is done (on CPU that can take minutes); ``connect_timeout``
    bounds the TCP connect. ``transport`` replaces httpx's network transport (tests use a small in-memory
    server to provoke failures a real vLLM will not produce on demand).
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
        cooldown: float = 2.0,
        max_cooldown: float = 60.0,
        return_token_ids: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        urls = [upstreams] if isinstance(upstreams, str) else list(upstreams)
        if not urls:
            raise InputError(f"no upstream given; {START_HINT}")
        if max_concurrency < 1 or retries < 0 or timeout <= 0 or connect_timeout <= 0:
            raise InputError(
                "need max_concurrency >= 1, retries >= 0 and positive timeouts; got "
                f"max_concurrency={max_concurrency}, retries={retries}, timeout={timeout}, "
                f"connect_timeout={connect_timeout}"
            )
        self.upstreams = [Upstream(_base_url(u)) for u in urls]
        self.model = model
        self.max_concurrency = max_concurrency
        self.timeout = httpx.Timeout(timeout, connect=connect_timeout)
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.cooldown = cooldown
        self.max_cooldown = max_cooldown
        self.return_token_ids = return_token_ids
        self._transport = transport
        self._rr = itertools.count()
        self._client: httpx.AsyncClient | None = None
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
    ) -> list[list[Completion]]:
        """Send one ``/v1/completions`` request per prompt, concurrently; results in prompt order."""
        check_generate_args(n, max_tokens, temperature)
        if not prompts:
            return []
        model = await self._model_name()
        # vLLM refuses n > 1 with greedy decoding (all samples would be equal): ask once, copy n times.
        n_req = 1 if temperature == 0 else n
        tasks = [
            self._complete_one(
                model, p, n_req, max_tokens, temperature, None if seed is None else seed + i * n
            )
            for i, p in enumerate(prompts)
        ]
        return [comps * (n // n_req) for comps in await asyncio.gather(*tasks)]

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # ---- readiness ------------------------------------------------------------------------------

    async def wait_ready(self, timeout: float = 120.0, poll: float = 0.5) -> list[str]:
        """Wait until upstreams answer ``/health`` *and* one real 1-token completion; return the ready URLs.

        vLLM answers ``/health`` before its engine can serve, hence the real request. Upstreams not
        ready by ``timeout`` are marked down (they rejoin after a cooldown); raises
        :class:`EngineUnavailable` when none is ready.
        """
        deadline = time.monotonic() + timeout
        ready = await asyncio.gather(*(self._wait_one(u, deadline, poll) for u in self.upstreams))
        urls = [u.url for u, ok in zip(self.upstreams, ready, strict=True) if ok]
        if not urls:
            detail = "; ".join(f"{u.url}: {u.last_error or 'not ready'}" for u in self.upstreams)
            raise EngineUnavailable(f"no vLLM upstream became ready within {timeout:.0f} s ({detail}); {START_HINT}")
        return urls

    async def _wait_one(self, up: Upstream, deadline: float, poll: float) -> bool:
        client = self._ensure_client()
        while True:
            try:
                health = await client.get(f"{up.url}/health")
                if health.status_code != 200:
                    raise _Retryable(f"/health answered {health.status_code}")
                model = self.model or await self._fetch_model(up)
                r = await client.post(
                    f"{up.url}/v1/completions",
                    json={"model": model, "prompt": "1", "max_tokens": 1, "temperature": 0.0},
                )
                if r.status_code != 200:
                    raise _Retryable(f"test completion answered {r.status_code}: {r.text[:200]}")
                if self.model is None:
                    self.model = model
                up.failures, up.down_until, up.last_error = 0, 0.0, ""
                return True
            except (httpx.HTTPError, _Retryable, ValueError) as e:
                up.last_error = _describe(e)
            if time.monotonic() + poll > deadline:
                self._mark_down(up, up.last_error)
                return False
            await asyncio.sleep(poll)

    # ---- status ---------------------------------------------------------------------------------

    def upstream_status(self) -> list[dict[str, Any]]:
        """Per upstream: url, up (bool), outstanding requests, consecutive failures, served, last error."""
        now = time.monotonic()
        return [
            {
                "url": u.url,
                "up": u.is_up(now),
                "outstanding": u.outstanding,
                "failures": u.failures,
                "served": u.served,
                "last_error": u.last_error,
            }
            for u in self.upstreams
        ]

    # ---- internals ------------------------------------------------------------------------------

    def _ensure_client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=self.timeout,
                transport=self._transport,
                limits=httpx.Limits(
                    max_connections=self.max_concurrency + 2 * len(self.upstreams),
                    max_keepalive_connections=self.max_concurrency,
                ),
            )
            self._sem = asyncio.Semaphore(self.max_concurrency)
        return self._client

    async def _model_name(self) -> str:
        if self.model is not None:
            return self.model
        errors = []
        for up in self._ordered():
            try:
                self.model = await self._fetch_model(up)
                return self.model
            except (httpx.HTTPError, ValueError, KeyError, IndexError) as e:
                errors.append(f"{up.url}: {_describe(e)}")
                self._mark_down(up, _describe(e))
        raise EngineUnavailable(f"could not ask any upstream for its model ({'; '.join(errors)}); {START_HINT}")

    async def model_info(self) -> dict[str, Any]:
        """The first served model's ``/v1/models`` entry (vLLM: ``id``, ``root`` = the model path,
        ``max_model_len``) from the best upstream that answers."""
        errors = []
        for up in self._ordered():
            try:
                return await self._fetch_model_entry(up)
            except (httpx.HTTPError, ValueError, KeyError, IndexError) as e:
                errors.append(f"{up.url}: {_describe(e)}")
        raise EngineUnavailable(f"no upstream listed its model ({'; '.join(errors)}); {START_HINT}")

    async def _fetch_model_entry(self, up: Upstream) -> dict[str, Any]:
        r = await self._ensure_client().get(f"{up.url}/v1/models")
        r.raise_for_status()
        return dict(r.json()["data"][0])

    async def _fetch_model(self, up: Upstream) -> str:
        return str((await self._fetch_model_entry(up))["id"])

    def _ordered(self) -> list[Upstream]:
        """Upstreams best-first: up ones by fewest outstanding (round-robin among ties), then down ones
        by the end of their cooldown (the earliest is the one worth probing)."""
        now = time.monotonic()
        shift = next(self._rr)
        k = len(self.upstreams)
        order = [self.upstreams[(shift + i) % k] for i in range(k)]
        up = sorted((u for u in order if u.is_up(now)), key=lambda u: u.outstanding)
        down = sorted((u for u in order if not u.is_up(now)), key=lambda u: u.down_until)
        return up + down

    def _mark_down(self, up: Upstream, error: str) -> None:
        up.failures += 1
        up.last_error = error
        up.down_until = time.monotonic() + min(self.cooldown * 2 ** (up.failures - 1), self.max_cooldown)

    async def _complete_one(
        self, model: str, prompt: str, n: int, max_tokens: int, temperature: float, seed: int | None
    ) -> list[Completion]:
        body: dict[str, Any] = {
            "model": model,
            "prompt": prompt,
            "n": n,
            "max_tokens": max_tokens,
            "temperature": temperature,
        }
        if seed is not None:
            body["seed"] = seed
        if self.return_token_ids:
            body["return_token_ids"] = True
        return self._parse(await self.request(body), n)

    async def request(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST one ``/v1/completions`` body through the balancer with retries; return the JSON answer.

        Generation builds its bodies in ``generate``; other callers (the entropy probe, which asks for
        ``logprobs``) send their own; a body without ``model`` gets the served one. Raises
        :class:`EngineUnavailable` when every attempt fails.
        """
        if "model" not in body:
            body = {"model": await self._model_name(), **body}
        client = self._ensure_client()
        assert self._sem is not None
        failures: list[str] = []  # why each attempt failed, for the final message
        async with self._sem:
            for attempt in range(self.retries + 1):
                if attempt:
                    delay = min(self.backoff * 2 ** (attempt - 1), self.max_backoff)
                    await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                up = self._ordered()[0]
                up.outstanding += 1
                try:
                    data = await self._post(client, up, body)
                except _Retryable as e:
                    failures.append(f"{up.url}: {e}")
                    if e.mark_down:
                        self._mark_down(up, str(e))
                    continue
                finally:
                    up.outstanding -= 1
                up.failures, up.down_until, up.last_error = 0, 0.0, ""
                up.served += 1
                return data
        raise EngineUnavailable(
            f"all {self.retries + 1} attempts failed ({'; '.join(failures[-3:])}); {START_HINT}"
        )

    async def _post(self, client: httpx.AsyncClient, up: Upstream, body: dict[str, Any]) -> dict[str, Any]:
        try:
            r = await client.post(f"{up.url}/v1/completions", json=body)
        except httpx.TransportError as e:  # connect/read errors and timeouts
            raise _Retryable(_describe(e)) from e
        if r.status_code >= 500:
            raise _Retryable(f"HTTP {r.status_code}: {r.text[:200]}")
        if r.status_code == 429:
            raise _Retryable("HTTP 429 (overloaded)", mark_down=False)
        if r.status_code >= 400:
            raise InputError(f"upstream {up.url} rejected the request (HTTP {r.status_code}): {r.text[:500]}")
        try:
            return r.json()
        except ValueError as e:
            raise _Retryable(f"response is not JSON: {r.text[:200]}") from e

    def _parse(self, data: dict[str, Any], n: int) -> list[Completion]:
        choices = sorted(data.get("choices") or [], key=lambda c: c.get("index", 0))
        if len(choices) != n:
            raise EngineUnavailable(
                f"upstream returned {len(choices)} choices for n={n}; is it an OpenAI-compatible "
                "completions server that supports n? (vLLM does)"
            )
        usage = data.get("usage") or {}
        prompt_tokens = int(usage.get("prompt_tokens", 0))
        if all(c.get("token_ids") is not None for c in choices):
            counts = [len(c["token_ids"]) for c in choices]
        else:
            if not self._warned_split:
                log.warning(
                    "upstream returned no per-choice token_ids; splitting usage.completion_tokens "
                    "evenly over the %d choices (per-sample counts are then only right on average)",
                    n,
                )
                self._warned_split = True
            counts = split_evenly(int(usage.get("completion_tokens", 0)), n)
        return [
            Completion(c.get("text") or "", prompt_tokens, k, c.get("finish_reason") or "stop")
            for c, k in zip(choices, counts, strict=True)
        ]

    async def probe_entropy(self, prompts: list[str], max_tokens: int) -> ProbeResult:
        """Mean top-20 entropy of one greedy answer per prompt, from ``/v1/completions`` with
        ``"logprobs": 20`` (:mod:`isocompute.engines.probe`), through the balancer like any request."""
        bodies = [{"prompt": p, "n": 1, "max_tokens": max_tokens, "temperature": 0.0, "logprobs": TOP_LOGPROBS}
                  for p in prompts]
        answers = await asyncio.gather(*(self.request(b) for b in bodies))
        parsed = [completion_logprobs_entropy(a) for a in answers]  # (entropy, generated, prompt tokens)
        return ProbeResult.of([h for h, _, _ in parsed], [p for _, _, p in parsed], [m for _, m, _ in parsed],
                              f"top{TOP_LOGPROBS}")


def _base_url(url: str) -> str:
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise InputError(f"upstream {url!r} is not an http(s) URL; pass e.g. http://127.0.0.1:8000")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
