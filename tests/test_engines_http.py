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

from isocompute.engines.base import CircuitOpen
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
        self.refused: list[str] = []  # hosts of refused connections, in order
        self.calls: list[tuple[str, dict]] = []
        self.inflight: dict[str, int] = {}
        self.max_inflight: dict[str, int] = {}
        self.max_total = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        host = f"{request.url.host}:{request.url.port}"
        if host in self.down:
            self.refused.append(host)
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
        if body.get("stream"):
            return httpx.Response(200, content=sse_body(n, body["prompt"]), headers={"content-type": "text/event-stream"})
        # choice j has j + 1 tokens, the last being EOS (id 2)
        choices = [
            {"index": j, "text": f"{body['prompt']}#{j}", "finish_reason": "stop",
             **({"token_ids": [7] * j + [2]} if self.token_ids else {})}
            for j in reversed(range(n))  # out of order on purpose: the engine sorts by index
        ]
        usage = {"prompt_tokens": len(body["prompt"]) + 1, "completion_tokens": n * (n + 1) // 2}
        return httpx.Response(200, json={"choices": choices, "usage": usage, "model": body["model"]})


def sse_body(n: int, prompt: str) -> bytes:
    """A vLLM-style stream of ``n`` choices, choice j of j + 1 tokens (one per step, the last EOS), with
    continuous usage; the total usage and [DONE] at the end."""
    lines = []
    for step in range(n):
        for j in range(step, n):
            chunk = {"choices": [{"index": j, "text": "x", "token_ids": [7 if step < j else 2],
                                  "finish_reason": "stop" if step == j else None}],
                     "usage": {"prompt_tokens": len(prompt) + 1, "completion_tokens": step + 1}}
            lines.append(f"data: {json.dumps(chunk)}\n\n")
    lines += ['data: {"choices": [], "usage": {}}\n\n', "data: [DONE]\n\n"]
    return "".join(lines).encode()


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
        # a refused connection opens the only upstream: the retry fails fast instead of knocking again
        ({}, ["connect"] * 2, 1, CircuitOpen, r"every upstream is down.*ConnectError.*start a server"),
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
    if exc in (InputError, CircuitOpen):
        assert len(fake.calls) == 1  # a 4xx is the caller's fault: not retried; an open circuit: not sent


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"upstreams": []}, "no upstream given"),
        ({"upstreams": ["ftp://x"]}, "not an http"),
        ({"upstreams": [A], "max_concurrency": 0}, "max_concurrency >= 1"),
        ({"upstreams": [A], "timeout": 0}, "positive timeouts"),
        ({"upstreams": [A], "max_cooldown": 0}, "positive timeouts and cooldowns"),
        ({"upstreams": [A], "errors_to_trip": 0}, "errors_to_trip >= 1"),
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

    with pytest.raises(EngineUnavailable, match=r"(ConnectError|ClientConnectorError).*vllm-cpu-serve\.sh MODEL_DIR"):
        run(go())


def test_read_timeout_is_explicit_and_retried():
    """A server that accepts and never answers: the request times out instead of hanging; a timeout is a
    strike against the upstream (slow is not dead), so the retry goes out; errors_to_trip of them open it."""

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
            with pytest.raises(EngineUnavailable, match="ReadTimeout|SocketTimeoutError"):  # httpx | aiohttp (the real network path)
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


# ------------------------------------------------------------------------------------ circuit breaking (issue 12)


def test_a_long_outage_neither_overflows_nor_outlives_the_upstream():
    """Regression: the cooldown was ``cooldown · 2^(failures − 1)`` on an unbounded count, so after ~1,000
    failures every later request raised OverflowError, even once the upstream was back."""
    fake = FakeVLLM()
    fake.down.add("a.test:8000")

    async def go():
        eng = engine_for(fake, [A], model=MODEL, backoff=0.0, cooldown=0.05, max_cooldown=0.2, retries=3)
        try:
            for _ in range(1500):
                with pytest.raises(EngineUnavailable):
                    await eng.generate(["p"], n=1, max_tokens=4, temperature=1.0)
            fake.down.clear()  # the server is back
            t0 = time.monotonic()
            while True:
                try:
                    await eng.generate(["p"], n=1, max_tokens=4, temperature=1.0)
                    return time.monotonic() - t0, eng.upstream_status()[0]
                except EngineUnavailable:
                    assert time.monotonic() - t0 < 2.0, "no recovery within 2 s of the upstream's return"
                    await asyncio.sleep(0.01)
        finally:
            await eng.aclose()

    recovered_after, status = run(go())
    assert recovered_after <= 0.2 + 0.3  # at most one max_cooldown, plus scheduling slack
    assert status["up"] is True and status["failures"] == 0  # a success resets the count


def test_every_upstream_cooling_down_fails_fast_with_retry_after():
    """Circuit open: once the only upstream is known down, a request fails at once, without touching the
    network, and says when to come back."""
    from isocompute.engines.base import CircuitOpen

    fake = FakeVLLM()
    fake.down.add("a.test:8000")

    async def go():
        eng = engine_for(fake, [A], model=MODEL, cooldown=5.0, max_cooldown=5.0)
        try:
            with pytest.raises(EngineUnavailable):
                await eng.generate(["p"], n=1, max_tokens=4, temperature=1.0)
            calls = len(fake.calls) + len(fake.refused)
            t0 = time.monotonic()
            with pytest.raises(CircuitOpen, match=r"a\.test:8000.*ConnectError") as info:
                await eng.generate(["p"], n=1, max_tokens=4, temperature=1.0)
            return time.monotonic() - t0, len(fake.calls) + len(fake.refused) - calls, info.value.retry_after
        finally:
            await eng.aclose()

    elapsed, new_calls, retry_after = run(go())
    assert elapsed < 0.05 and new_calls == 0
    assert 0 < retry_after <= 5.0


def test_half_open_sends_one_probe_at_a_time_and_a_dead_upstream_is_skipped():
    fake = FakeVLLM(delay=0.05)
    fake.down.add("b.test:8000")

    async def go():
        eng = engine_for(fake, [A, B], model=MODEL, cooldown=0.02, max_cooldown=0.05)
        try:
            await eng.generate([f"p{i}" for i in range(4)], n=1, max_tokens=4, temperature=1.0)
            await asyncio.sleep(0.3)  # several cooldowns: B is probed, one probe at a time
            probes = fake.refused.count("b.test:8000")
            await eng.generate([f"q{i}" for i in range(20)], n=1, max_tokens=4, temperature=1.0)
            return probes, {s["url"]: s for s in eng.upstream_status()}
        finally:
            await eng.aclose()

    probes, status = run(go())
    assert probes >= 2  # B was probed again after each cooldown, by the engine itself
    assert status[B]["served"] == 0 and status[A]["served"] == 24  # no request waited on the dead one
    assert status[B]["failures"] <= 64  # bounded however long it stays down


def test_success_resets_the_cooldown_level():
    from isocompute.engines.circuit import Breaker

    b = Breaker(base=1.0, cap=8.0, rng=lambda: 1.0)
    assert b.trip(now=0.0, epoch=b.epoch) and b.reopen_at == 1.0
    for t in (1.0, 3.0, 7.0, 15.0):
        b.begin_probe()
        b.probe_failed(now=t)
    assert b.reopen_at == 15.0 + 8.0  # 1, 2, 4, 8, then capped
    b.begin_probe()
    b.succeeded()
    assert b.closed and b.level == 0 and b.failures == 0
    assert b.trip(now=100.0, epoch=b.epoch) and b.reopen_at == 101.0  # the base cooldown again


def test_a_failure_of_a_request_sent_before_the_trip_is_not_counted_twice():
    from isocompute.engines.circuit import Breaker

    b = Breaker(base=1.0, cap=8.0, rng=lambda: 1.0)
    e = b.epoch
    assert b.trip(now=0.0, epoch=e) is True
    assert b.trip(now=0.1, epoch=e) is False  # 31 more in-flight requests failing with it change nothing
    assert b.level == 0 and b.reopen_at == 1.0


@given(st.integers(0, 10**9), st.floats(0.001, 100), st.floats(0.001, 1000), st.floats(0, 1))
def test_cooldown_is_bounded_for_any_level(level, base, cap, u):
    from isocompute.engines.circuit import cooldown_s

    c = cooldown_s(level, base=base, cap=cap, u=u)
    assert 0 < c <= min(cap, base * 2.0**60) + 1e-12 and c >= 0.5 * min(base, cap) - 1e-12


def test_unknown_model_is_the_gateways_misconfiguration_not_the_callers():
    """vLLM answers 404 for a model it does not serve: that is the server's configuration, so it is an
    upstream error saying what to fix, not an InputError blamed on the client."""
    from isocompute.engines.base import UpstreamMisconfigured

    fake = FakeVLLM()
    fake.fail["a.test:8000"] = ["404"] * 10

    async def go():
        eng = engine_for(fake, [A], model="no-such-model")
        try:
            await eng.generate(["p"], n=1, max_tokens=4, temperature=1.0)
        finally:
            await eng.aclose()

    with pytest.raises(UpstreamMisconfigured, match=r"no-such-model.*--upstream-model"):
        run(go())


@pytest.mark.parametrize(
    ("reply", "match"),
    [
        (lambda: httpx.Response(200, content=b"<html>proxy error</html>"), "not JSON"),
        (lambda: httpx.Response(200, json=["not", "an", "object"]), "cannot read"),
        (lambda: httpx.Response(200, json={"choices": ["x"], "usage": {}}), "cannot read"),
        (lambda: httpx.Response(200, json={"choices": [{"text": 3, "index": 0}],
                                           "usage": {"prompt_tokens": "many"}}), "cannot read"),
        # a reply httpx itself cannot decode: an httpx.HTTPError that is not a TransportError
        (lambda: httpx.Response(200, headers={"Content-Encoding": "gzip"}, stream=httpx.ByteStream(b"not gzip")),
         "DecodingError"),
    ],
)
def test_malformed_replies_are_bad_responses(reply, match):
    from isocompute.engines.base import UpstreamBadResponse

    def handler(request: httpx.Request) -> httpx.Response:
        return reply()

    async def go():
        eng = VLLMHTTPEngine([A], model=MODEL, transport=httpx.MockTransport(handler), retries=0)
        try:
            await eng.generate(["p"], n=1, max_tokens=4, temperature=1.0)
        finally:
            await eng.aclose()

    with pytest.raises(UpstreamBadResponse, match=match):
        run(go())


def test_requests_waiting_on_an_upstream_that_died_are_retried_elsewhere_at_once():
    """A killed server can leave requests queued on a socket nobody serves any more: when one of its
    connections fails, the others waiting there go to a live upstream instead of waiting out their
    timeouts (5 s here) — with two upstreams, one killed, no caller should see the death."""
    b_requests = []

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.host == "b.test":
            b_requests.append(body["prompt"])
            if len(b_requests) == 1:
                await asyncio.sleep(0.1)
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
            await asyncio.sleep(5.0)  # queued on the dead server's socket
        else:
            await asyncio.sleep(0.2)
        return httpx.Response(200, json={"choices": [{"index": 0, "text": body["prompt"], "token_ids": [2]}],
                                         "usage": {"prompt_tokens": 1, "completion_tokens": 1}})

    async def go():
        eng = VLLMHTTPEngine([A, B], model=MODEL, transport=httpx.MockTransport(handler), timeout=30)
        try:
            t0 = time.monotonic()
            out = await eng.generate([f"p{i}" for i in range(8)], n=1, max_tokens=4, temperature=1.0)
            return time.monotonic() - t0, out, {s["url"]: s for s in eng.upstream_status()}
        finally:
            await eng.aclose()

    elapsed, out, status = run(go())
    assert [o[0].text for o in out] == [f"p{i}" for i in range(8)]
    assert len(b_requests) >= 2  # some were waiting on B when it died
    assert elapsed < 1.0 and status[A]["served"] == 8 and status[B]["up"] is False
    assert status[A]["outstanding"] == status[B]["outstanding"] == 0


def test_a_timeout_does_not_abandon_the_others_on_a_slow_upstream():
    """Slow is not dead: one request timing out opens the upstream, but the requests already waiting
    there keep waiting for their answers."""
    calls = []

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        calls.append(body["prompt"])
        await asyncio.sleep(0.6 if body["prompt"] == "slow" else 0.3)
        return httpx.Response(200, json={"choices": [{"index": 0, "text": body["prompt"], "token_ids": [2]}],
                                         "usage": {"prompt_tokens": 1, "completion_tokens": 1}})

    async def go():
        eng = VLLMHTTPEngine([A, B], model=MODEL, transport=httpx.MockTransport(handler), timeout=0.45,
                             connect_timeout=0.01, retries=0)
        try:
            slow = asyncio.ensure_future(eng.generate(["slow"], n=1, max_tokens=4, temperature=1.0))
            others = asyncio.ensure_future(eng.generate(["a", "b"], n=1, max_tokens=4, temperature=1.0))
            return await asyncio.gather(slow, others, return_exceptions=True)
        finally:
            await eng.aclose()

    slow, others = run(go())
    assert isinstance(slow, EngineUnavailable)
    assert [o[0].text for o in others] == ["a", "b"]


def test_an_upstream_that_stops_answering_is_shut_after_a_few_deadlines():
    """A server that accepts and answers nothing: with the caller's deadline in REQUEST_DEADLINE the engine
    times out just before it, counts a strike, and after errors_to_trip strikes sends nothing there."""
    from isocompute.engines.base import REQUEST_DEADLINE

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "a.test":
            await asyncio.sleep(30)
        return httpx.Response(200, json={"choices": [{"index": 0, "text": "ok", "token_ids": [2]}],
                                         "usage": {"prompt_tokens": 1}})

    async def one(eng):
        token = REQUEST_DEADLINE.set(time.monotonic() + 0.3)
        try:
            await asyncio.wait_for(eng.generate(["p"], n=1, max_tokens=4, temperature=1.0), 0.3)
            return "ok"
        except TimeoutError:
            return "timeout"
        finally:
            REQUEST_DEADLINE.reset(token)

    async def go():
        eng = VLLMHTTPEngine([A, B], model=MODEL, transport=httpx.MockTransport(handler), timeout=60,
                             cooldown=30, max_cooldown=30)
        try:
            rounds = [sorted(await asyncio.gather(one(eng), one(eng))) for _ in range(6)]
            return rounds, eng.upstream_status()[0]
        finally:
            await eng.aclose()

    rounds, hung = run(go())
    assert sum(r.count("timeout") for r in rounds) == 3 and rounds[-3:] == [["ok", "ok"]] * 3, rounds
    assert hung["up"] is False and "no answer within" in hung["last_error"]


def test_sse_chunks_count_each_choice_from_its_token_ids_or_its_usage():
    from isocompute.engines.base import UpstreamBadResponse
    from isocompute.engines.streaming import ChoiceState, read_chunk

    states = [ChoiceState(), ChoiceState()]
    lines = ['data: {"choices":[{"index":0,"text":"4","token_ids":[7],"finish_reason":null}],'
             '"usage":{"prompt_tokens":5,"completion_tokens":1}}', "",
             'data: {"choices":[{"index":1,"text":"","finish_reason":null}],"usage":{"prompt_tokens":5,'
             '"completion_tokens":3}}',
             'data: {"choices":[{"index":0,"text":"2","token_ids":[8,9],"finish_reason":"stop"}]}',
             'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":6}}', "data: [DONE]"]
    out = [read_chunk(line, states) for line in lines]
    assert [o[0] for o in out] == [[], [], [], [0], [], []]
    assert out[0][1] == 5 and out[-1][2] is True
    assert states[0].tokens == 3 and states[0].completion(5).text == "42"  # token ids: 1 + 2
    assert states[1].tokens == 3 and states[1].finish_reason is None  # no ids: the continuous usage
    assert states[1].completion(5, "abort").finish_reason == "abort"
    with pytest.raises(UpstreamBadResponse):
        read_chunk('data: {"choices":[{"index":5}]}', states)


def test_a_streamed_wave_is_retried_at_its_start_and_stops_when_told():
    fake = FakeVLLM()
    fake.fail.update({"a:1": ["500"], "b:1": ["500"]})  # the start fails once on each: the third attempt streams
    eng = engine_for(fake, ["http://a:1", "http://b:1"])
    finished = []

    async def stop_at_second(j, c):
        finished.append((j, c.completion_tokens, c.finish_reason))
        return len(finished) == 2

    async def go():
        try:
            return await eng.stream_wave("p", 4, 8, 1.0, 5, stop_at_second)
        finally:
            await eng.aclose()

    ws = asyncio.run(go())
    assert len(fake.calls) == 3 and not fake.fail["a:1"] and not fake.fail["b:1"]
    assert all(b["stream"] and b["stream_options"]["continuous_usage_stats"] for _, b in fake.calls)
    assert finished == [(0, 1, "stop"), (1, 2, "stop")] and ws.stopped and ws.finish_order == [0, 1]
    assert [(c.completion_tokens, c.finish_reason) for c in ws.completions] == [
        (1, "stop"), (2, "stop"), (1, "abort"), (1, "abort")]  # what each had streamed at the stop


def test_a_stream_that_ends_before_its_choices_finish_is_a_bad_response():
    from isocompute.engines.base import UpstreamBadResponse

    async def cut(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": MODEL}]})
        return httpx.Response(200, content=sse_body(3, "p").split(b"\n\n")[0] + b"\n\ndata: [DONE]\n\n")

    eng = VLLMHTTPEngine(["http://a:1"], transport=httpx.MockTransport(cut))

    async def never(j, c):
        return False

    async def go():
        try:
            return await eng.stream_wave("p", 3, 8, 1.0, None, never)
        finally:
            await eng.aclose()

    with pytest.raises(UpstreamBadResponse, match="1 of 3 choices finished"):
        asyncio.run(go())


# ---- a drained upstream (issue 23): it stops listening and leaves its requests unanswered ------------


def test_requests_waiting_on_the_only_upstream_when_it_stops_listening_fail_fast():
    """SIGTERM: vLLM closes its socket and leaves the requests in flight unanswered on their open
    connections. The first refused connection abandons them even with no other upstream to go to: each —
    the streamed wave too — fails fast (CircuitOpen, a 503) instead of waiting out its timeout (30 s)."""
    refusing = []

    async def handler(request: httpx.Request) -> httpx.Response:
        if refusing:
            raise httpx.ConnectError("connection refused", request=request)
        await asyncio.sleep(30)  # in flight on the draining server: never answered
        return httpx.Response(500)

    async def never(j, c):
        return False

    async def go():
        eng = VLLMHTTPEngine([A], model=MODEL, transport=httpx.MockTransport(handler), timeout=30, cooldown=5,
                             max_cooldown=5)
        try:
            waiting = [asyncio.ensure_future(eng.generate([f"p{i}"], n=1, max_tokens=4, temperature=1.0))
                       for i in range(4)]
            waiting.append(asyncio.ensure_future(eng.stream_wave("s", 2, 4, 1.0, None, never)))
            await asyncio.sleep(0.1)
            refusing.append(True)
            t0 = time.monotonic()
            late = await asyncio.gather(eng.generate(["late"], n=1, max_tokens=4, temperature=1.0),
                                        return_exceptions=True)
            out = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 5.0)
            return time.monotonic() - t0, late + out, eng.upstream_status()[0]
        finally:
            await eng.aclose()

    elapsed, out, status = run(go())
    assert all(isinstance(o, CircuitOpen) for o in out), out
    assert elapsed < 1.0 and status["up"] is False and status["outstanding"] == 0


class RawUpstream:
    """A local TCP server speaking just enough HTTP/1.1 for the completions POST: answers each after
    ``delay`` s, or never (``answer=False``). ``stop_listening()`` closes its socket and leaves its
    connections open, as vLLM does on SIGTERM."""

    def __init__(self, *, delay: float = 0.0, answer: bool = True) -> None:
        self.delay, self.answer = delay, answer
        self.prompts: list[str] = []
        self._writers: list[asyncio.StreamWriter] = []
        self._closed = asyncio.Event()

    async def start(self) -> RawUpstream:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
                length = int(head.split("content-length:")[1].split("\r\n")[0]) if "content-length:" in head else 0
                prompt = json.loads(await reader.readexactly(length))["prompt"]
                self.prompts.append(prompt)
                if not self.answer:
                    await self._closed.wait()
                    return
                await asyncio.sleep(self.delay)
                body = json.dumps({"choices": [{"index": 0, "text": prompt, "token_ids": [2]}],
                                   "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def stop_listening(self) -> None:
        self.server.close()  # the listening socket only: the connections stay open, unanswered

    async def aclose(self) -> None:
        self.server.close()
        self._closed.set()
        for w in self._writers:
            w.close()
        await asyncio.sleep(0)


def test_requests_on_a_drained_upstream_that_gets_no_new_request_go_elsewhere_within_the_watch(caplog):
    """Two upstreams, B drained (it stops listening, its requests unanswered). The balancer sends new requests
    to A — B has more waiting — so no request of B's finds out; the pool's watch (one TCP connect per
    ``watch_interval`` while requests wait on B) sees the refusal and retries B's requests on A. Over aiohttp
    and real sockets, as in production."""

    async def go():
        a, b = await RawUpstream(delay=0.3).start(), await RawUpstream(answer=False).start()
        eng = VLLMHTTPEngine([a.url, b.url], model=MODEL, timeout=30, retries=2)
        eng.pool.watch_interval = 0.1
        try:
            t0 = time.monotonic()
            calls = asyncio.ensure_future(eng.generate([f"p{i}" for i in range(4)], n=1, max_tokens=4,
                                                       temperature=1.0))
            while len(b.prompts) < 2:
                await asyncio.sleep(0.01)
            b.stop_listening()
            out = await asyncio.wait_for(calls, 5.0)
            return time.monotonic() - t0, out, a.prompts, b.prompts, eng.upstream_status()[1]
        finally:
            await eng.aclose()
            await a.aclose()
            await b.aclose()

    with caplog.at_level("WARNING", logger="isocompute.engines"):
        elapsed, out, on_a, on_b, b = run(go())
    assert [o[0].text for o in out] == [f"p{i}" for i in range(4)]
    assert len(on_b) == 2 and sorted(on_a) == [f"p{i}" for i in range(4)]  # B's two answered by A
    assert elapsed < 2.0
    # the watch saw the refusal; a probe after it may since have replaced last_error with its own ConnectError
    assert b["up"] is False and b["outstanding"] == 0 and b["last_error"]
    assert any("refuses new connections" in r.getMessage() and "2 request(s) in flight" in r.getMessage()
               for r in caplog.records)


def test_completions_reply_with_logprobs_is_read_into_confidence():
    """The shape vLLM answers with ``"logprobs": 2, "return_tokens_as_token_ids": true``: per choice the
    sampled tokens' logprobs and, per position, the top 2 plus the sampled token when it is not among them."""
    from isocompute.engines.base import UpstreamBadResponse
    from isocompute.engines.openai_replies import parse_completions

    choice = {"index": 0, "text": "ab", "token_ids": [5, 9], "finish_reason": "stop", "logprobs": {
        "tokens": ["token_id:5", "token_id:9"], "token_logprobs": [-0.1, -3.0],
        "top_logprobs": [{"token_id:5": -0.1, "token_id:6": -2.3},
                         {"token_id:7": -0.5, "token_id:8": -1.5, "token_id:9": -3.0}]}}
    reply = {"choices": [choice], "usage": {"prompt_tokens": 4, "completion_tokens": 2}}
    [c], split = parse_completions(reply, 1, logprobs=2)
    assert not split and c.completion_tokens == 2
    assert c.logprob_mean == pytest.approx(-1.55)
    assert c.confidence_min_window == pytest.approx((1.2 + 1.0) / 2)  # the sampled -3.0 is outside the top 2
    [c], _ = parse_completions(reply, 1, logprobs=2, confidence_window=1)
    assert c.confidence_min_window == pytest.approx(1.0)
    assert parse_completions(reply, 1)[0][0].logprob_mean is None  # not asked: not read
    with pytest.raises(UpstreamBadResponse, match="cannot read"):
        parse_completions({**reply, "choices": [{**choice, "logprobs": None}]}, 1, logprobs=2)
