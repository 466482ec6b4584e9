"""The engine's hot path — the completions POST on aiohttp (``engines.upstream_calls.post_completions``) —
against a real local HTTP server that misbehaves on purpose: each failure sorted as on httpx (``slow``,
``dead``, statuses, unreadable replies), and the engine without a test transport really using aiohttp."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest
from aiohttp import web

from isocompute.engines.base import UpstreamBadResponse
from isocompute.engines.openai_replies import Retryable
from isocompute.engines.upstream_calls import post_completions
from isocompute.engines.vllm_http import VLLMHTTPEngine
from isocompute.errors import InputError

BODIES = web.AppKey("bodies", list)
REPLY = {"choices": [{"text": "The answer is 4.", "token_ids": [1, 2, 3], "finish_reason": "stop"}],
         "usage": {"prompt_tokens": 5, "completion_tokens": 3}}


async def _reset(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Length": "1000", "Content-Type": "application/json"})
    await resp.prepare(request)
    await resp.write(b'{"choices": [')
    request.transport.close()  # closed mid-answer
    return resp


async def _slow(request: web.Request) -> web.Response:
    await asyncio.sleep(5)
    return web.json_response(REPLY)


ROUTES = {
    "ok": lambda r: web.json_response(REPLY),
    "notjson": lambda r: web.Response(text="<html>proxy error</html>"),
    "list": lambda r: web.json_response([1, 2]),
    "500": lambda r: web.Response(status=500, text="engine dead"),
    "429": lambda r: web.Response(status=429, text="busy"),
    "404": lambda r: web.Response(status=404, text="no such model"),
    "400": lambda r: web.Response(status=400, text="max_tokens too large"),
}


def _server(kind: str):
    async def handler(request: web.Request) -> web.StreamResponse:
        request.app[BODIES].append(await request.json())
        if kind == "reset":
            return await _reset(request)
        if kind == "slow":
            return await _slow(request)
        out = ROUTES[kind](request)
        return await out if asyncio.iscoroutine(out) else out

    app = web.Application()
    app[BODIES] = []
    app.router.add_post("/v1/completions", handler)
    return app


async def _call(kind: str, budget: float = 2.0):
    app = _server(kind)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as s:
            return await post_completions(s, f"http://127.0.0.1:{port}", {"model": "m", "prompt": "p"}, budget)
    finally:
        await runner.cleanup()


def test_a_good_reply_is_its_json_object():
    assert asyncio.run(_call("ok")) == REPLY


@pytest.mark.parametrize("kind, error, what", [
    ("notjson", UpstreamBadResponse, "not JSON"),
    ("list", UpstreamBadResponse, "JSON list"),
    ("400", InputError, "rejected the request"),
])
def test_unreadable_or_refused_replies_say_what_to_fix(kind, error, what):
    with pytest.raises(error, match=what):
        asyncio.run(_call(kind))


@pytest.mark.parametrize("kind, retry_kind", [("500", "error"), ("429", "busy"), ("404", "wrong"),
                                              ("reset", "dead")])
def test_failures_are_sorted_as_on_httpx(kind, retry_kind):
    with pytest.raises(Retryable) as e:
        asyncio.run(_call(kind))
    assert e.value.kind == retry_kind


def test_no_answer_within_the_budget_is_slow_not_dead():
    with pytest.raises(Retryable) as e:
        asyncio.run(_call("slow", budget=0.3))
    assert e.value.kind == "slow" and "0.3" in str(e.value)


def test_a_refused_connection_is_refused_and_opens_at_once():
    """Nobody listens (a stopped or draining server): ``refused``, which opens the upstream at once and
    abandons the requests still waiting there (circuit.py)."""
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    async def go():
        async with aiohttp.ClientSession() as s:
            return await post_completions(s, f"http://127.0.0.1:{port}", {"model": "m"}, 2.0)

    with pytest.raises(Retryable) as e:
        asyncio.run(go())
    assert e.value.kind == "refused" and e.value.hard


def test_the_engine_without_a_test_transport_posts_on_aiohttp():
    async def go():
        app = _server("ok")
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        eng = VLLMHTTPEngine(f"http://127.0.0.1:{port}", model="m")
        try:
            [[c]] = await eng.generate(["What is 2+2?"], 1, 8, 1.0, seed=3)
            return c, eng._session is not None, app[BODIES]
        finally:
            await eng.aclose()
            await runner.cleanup()

    c, on_aiohttp, bodies = asyncio.run(go())
    assert on_aiohttp and c.text == "The answer is 4." and c.completion_tokens == 3
    assert bodies == [{"model": "m", "prompt": "What is 2+2?", "n": 1, "max_tokens": 8, "temperature": 1.0,
                       "seed": 3, "return_token_ids": True}]


def test_accepts_connections_is_false_only_when_nobody_listens():
    from isocompute.engines.upstream_calls import accepts_connections

    async def go():
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        listening = await accepts_connections(url, 2.0)
        server.close()  # the socket closed: what vLLM does on SIGTERM
        await server.wait_closed()
        return listening, await accepts_connections(url, 2.0)

    assert asyncio.run(go()) == (True, False)
