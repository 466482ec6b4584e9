"""vllm-http engine logic: balancing, failover, recovery, retries, token counts, readiness.

A small in-memory OpenAI-style server (``FakeVLLM``, on httpx.MockTransport) provokes failures a real vLLM
will not produce on demand (HTTP 500 bursts, missing token_ids, wrong choice counts); network failures
(refused connections, a server that never answers) use real sockets. The real vLLM server is exercised
in test_vllm_server.py.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from isocompute.engines.vllm_http import VLLMHTTPEngine, split_evenly
from isocompute.errors import EngineUnavailable, InputError

MODEL = "tiny"


class FakeVLLM:
    """Answers /health, /v1/models and /v1/completions for any host; ``fail[host]`` scripts failures."""

    def __init__(self, token_ids: bool = True, choices_delta: int = 0, delay: float = 0.0):
        self.token_ids = token_ids
        self.choices_delta = choices_delta
        self.delay = delay
        self.fail: dict[str, list[str]] = {}  # host → queue of "500" | "connect" | "400" | "429"
        self.down: set[str] = set()  # hosts refusing connections until removed
        self.calls: list[tuple[str, dict]] = []
        self.inflight: dict[str, int] = {}
        self.max_inflight: dict[str, int] = {}
        self.max_total = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        host = f"{request.url.host}:{request.url.port}"
        if host in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/health":
            return httpx.Response(200)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": MODEL, "root": "/models/tiny"}]})
        body = json.loads(request.content)
        self.calls.append((host, body))
        queue = self.fail.get(host) or []
        if queue:
            what = queue.pop(0)
            if what == "connect":
                raise httpx.ConnectError("connection refused", request=request)
            return httpx.Response(int(what), json={"error": {"message": f"scripted {what}"}})
        self.inflight[host] = self.inflight.get(host, 0) + 1
        self.max_inflight[host] = max(self.max_inflight.get(host, 0), self.inflight[host])
        self.max_total = max(self.max_total, sum(self.inflight.values()))
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
        finally:
            self.inflight[host] -= 1
        n = body.get("n", 1) + self.choices_delta
        # choice j has j + 1 tokens, the last being EOS (id 2)
        choices = [
            {"index": j, "text": f"{body['prompt']}#{j}", "finish_reason": "stop",
             **({"token_ids": [7] * j + [2]} if self.token_ids else {})}
            for j in reversed(range(n))  # out of order on purpose: the engine sorts by index
        ]
        usage = {"prompt_tokens": len(body["prompt"]) + 1, "completion_tokens": n * (n + 1) // 2}
        return httpx.Response(200, json={"choices": choices, "usage": usage, "model": body["model"]})


def engine_for(fake: FakeVLLM, urls: list[str], **kw) -> VLLMHTTPEngine:
    opts = {"backoff": 0.01, "max_backoff": 0.02, "cooldown": 0.2} | kw
    return VLLMHTTPEngine(urls, transport=httpx.MockTransport(fake), **opts)


def run(coro):
    return asyncio.run(coro)


A, B = "http://a.test:8000", "http://b.test:8000"


# ------------------------------------------------------------------------------------ counts


def test_counts_from_token_ids_and_order():
    fake = FakeVLLM()

    async def go():
        eng = engine_for(fake, [A])
        try:
            return await eng.generate(["p0", "prompt1"], n=4, max_tokens=8, temperature=1.0, seed=10)
        finally:
            await eng.aclose()

    out = run(go())
    assert [[c.completion_tokens for c in o] for o in out] == [[1, 2, 3, 4]] * 2
    assert [c.text for c in out[1]] == [f"prompt1#{j}" for j in range(4)]
    assert [o[0].prompt_tokens for o in out] == [3, 8]
    # model discovered from /v1/models; prompt i gets seed + i*n; token ids requested
    bodies = sorted((b for _, b in fake.calls), key=lambda b: b["prompt"])
    assert [b["seed"] for b in bodies] == [10, 14]
    assert all(b["model"] == MODEL and b["n"] == 4 and b["return_token_ids"] for b in bodies)


def test_counts_fall_back_to_even_split_with_warning(caplog):
    fake = FakeVLLM(token_ids=False)

    async def go():
        eng = engine_for(fake, [A], model=MODEL)
        try:
            return await eng.generate(["p"], n=4, max_tokens=8, temperature=1.0)
        finally:
            await eng.aclose()

    with caplog.at_level("WARNING"):
        out = run(go())
    # usage.completion_tokens = 1+2+3+4 = 10 → [3, 3, 2, 2]
    assert [c.completion_tokens for c in out[0]] == [3, 3, 2, 2]
    assert "splitting usage.completion_tokens evenly" in caplog.text


@given(st.integers(0, 10_000), st.integers(1, 64))
def test_split_evenly_invariants(total, parts):
    xs = split_evenly(total, parts)
    assert len(xs) == parts and sum(xs) == total
    assert max(xs) - min(xs) <= 1 and xs == sorted(xs, reverse=True)


# ------------------------------------------------------------------------------------ balancing


def test_least_outstanding_spreads_load_and_respects_concurrency():
    fake = FakeVLLM(delay=0.02)

    async def go():
        eng = engine_for(fake, [A, B], model=MODEL, max_concurrency=4)
        try:
            await eng.generate([f"p{i}" for i in range(40)], n=2, max_tokens=4, temperature=1.0)
            return eng.upstream_status()
        finally:
            await eng.aclose()

    status = run(go())
    served = {s["url"]: s["served"] for s in status}
    assert served[A] + served[B] == 40
    assert abs(served[A] - served[B]) <= 4
    assert fake.max_total == 4  # the semaphore's bound, reached
    assert min(fake.max_inflight.values()) >= 1


def test_failover_marks_down_then_recovers():
    fake = FakeVLLM()
    fake.down.add("b.test:8000")

    async def go():
        eng = engine_for(fake, [A, B], model=MODEL, cooldown=0.3)
        try:
            first = await eng.generate([f"p{i}" for i in range(10)], n=1, max_tokens=4, temperature=1.0)
            status_down = {s["url"]: s for s in eng.upstream_status()}
            fake.down.clear()  # B restarts
            await asyncio.sleep(0.35)
            await eng.generate([f"q{i}" for i in range(10)], n=1, max_tokens=4, temperature=1.0)
            return first, status_down, {s["url"]: s for s in eng.upstream_status()}
        finally:
            await eng.aclose()

    first, down, after = run(go())
    assert len(first) == 10  # nothing lost while B was down
    assert down[B]["up"] is False and "ConnectError" in down[B]["last_error"]
    assert down[A]["served"] == 10
    assert after[B]["up"] is True and after[B]["served"] > 0 and after[B]["failures"] == 0


def test_5xx_and_429_are_retried():
    fake = FakeVLLM()
    fake.fail["a.test:8000"] = ["500", "429", "503"]

    async def go():
        eng = engine_for(fake, [A], model=MODEL, retries=3)
        try:
            return await eng.generate(["p"], n=2, max_tokens=4, temperature=1.0)
        finally:
            await eng.aclose()

    out = run(go())
    assert [c.completion_tokens for c in out[0]] == [1, 2]
    assert len(fake.calls) == 4


@pytest.mark.parametrize(
    ("fake_kw", "fail", "retries", "exc", "match"),
    [
        ({}, ["400"], 3, InputError, r"rejected the request \(HTTP 400\)"),
        ({}, ["500"] * 3, 2, EngineUnavailable, r"all 3 attempts failed.*HTTP 500.*start a server"),
        ({}, ["connect"] * 2, 1, EngineUnavailable, r"all 2 attempts failed.*ConnectError"),
        ({"choices_delta": -1}, [], 0, EngineUnavailable, "returned 1 choices for n=2"),
    ],
)
def test_request_errors(fake_kw, fail, retries, exc, match):
    fake = FakeVLLM(**fake_kw)
    fake.fail["a.test:8000"] = list(fail)

    async def go():
        eng = engine_for(fake, [A], model=MODEL, retries=retries)
        try:
            return await eng.generate(["p"], n=2, max_tokens=4, temperature=1.0)
        finally:
            await eng.aclose()

    with pytest.raises(exc, match=match):
        run(go())
    if exc is InputError:
        assert len(fake.calls) == 1  # a 4xx is the caller's fault: not retried


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"upstreams": []}, "no upstream given"),
        ({"upstreams": ["ftp://x"]}, "not an http"),
        ({"upstreams": [A], "max_concurrency": 0}, "max_concurrency >= 1"),
        ({"upstreams": [A], "timeout": 0}, "positive timeouts"),
    ],
)
def test_constructor_errors(kwargs, match):
    with pytest.raises(InputError, match=match):
        VLLMHTTPEngine(**kwargs)


def test_generate_argument_errors():
    eng = VLLMHTTPEngine([A])
    with pytest.raises(InputError, match="n >= 1"):
        run(eng.generate(["p"], n=0, max_tokens=4, temperature=1.0))


# ------------------------------------------------------------------------------------ real sockets


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_refused_connection_says_how_to_start_a_server():
    url = f"http://127.0.0.1:{free_port()}"

    async def go():
        eng = VLLMHTTPEngine([url], model=MODEL, retries=1, backoff=0.01, connect_timeout=1.0)
        try:
            await eng.generate(["p"], n=1, max_tokens=4, temperature=1.0)
        finally:
            await eng.aclose()

    with pytest.raises(EngineUnavailable, match=r"ConnectError.*vllm-cpu-serve\.sh MODEL_DIR"):
        run(go())


def test_read_timeout_is_explicit_and_retried():
    """A server that accepts and never answers: the request times out instead of hanging."""

    async def go():
        accepted = []

        async def silent(reader, writer):
            accepted.append(1)
            await asyncio.sleep(30)

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        eng = VLLMHTTPEngine([f"http://127.0.0.1:{port}"], model=MODEL, timeout=0.3, retries=1, backoff=0.01)
        t0 = time.monotonic()
        try:
            with pytest.raises(EngineUnavailable, match="ReadTimeout"):
                await eng.generate(["p"], n=1, max_tokens=4, temperature=1.0)
            return time.monotonic() - t0, len(accepted)
        finally:
            await eng.aclose()
            server.close()

    elapsed, attempts = run(go())
    assert elapsed < 5 and attempts == 2


def test_wait_ready_needs_a_real_completion():
    """/health says 200 at once, but completions fail twice: wait_ready returns only after one succeeds."""
    fake = FakeVLLM()
    fake.fail["a.test:8000"] = ["503", "503"]

    async def go():
        eng = engine_for(fake, [A])
        try:
            ready = await eng.wait_ready(timeout=5, poll=0.01)
            return ready, eng.model
        finally:
            await eng.aclose()

    ready, model = run(go())
    assert ready == [A] and model == MODEL
    assert len(fake.calls) == 3 and fake.calls[-1][1]["max_tokens"] == 1


def test_wait_ready_times_out_with_hint():
    fake = FakeVLLM()
    fake.down.update({"a.test:8000", "b.test:8000"})

    async def go():
        eng = engine_for(fake, [A, B])
        try:
            await eng.wait_ready(timeout=0.1, poll=0.02)
        finally:
            await eng.aclose()

    with pytest.raises(EngineUnavailable, match=r"no vLLM upstream became ready.*a\.test.*b\.test.*--upstream"):
        run(go())


def test_greedy_asks_once_and_repeats():
    """vLLM rejects n > 1 at temperature 0; the engine sends n=1 and returns n equal completions."""
    fake = FakeVLLM()

    async def go():
        eng = engine_for(fake, [A], model=MODEL)
        try:
            return await eng.generate(["p", "q"], n=3, max_tokens=4, temperature=0.0)
        finally:
            await eng.aclose()

    out = run(go())
    assert all(b["n"] == 1 for _, b in fake.calls) and len(fake.calls) == 2
    assert [len(o) for o in out] == [3, 3] and out[0][0] == out[0][1] == out[0][2]
