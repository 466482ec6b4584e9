"""The gateway against hostile and careless clients, in process (issue 35's findings 1, 3–7; the slow clients and the
overload against a real ``isocompute serve`` are in test_app_slow_clients.py). Each test reproduces a finding: it
failed on the gateway before the fix (the issue's report gives the before/after)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import httpx
import pytest
from app_fakes import FakeEngine, FakePolicy, completion, make_client

from isocompute.app.accounting.auth import ApiKeyRecord, hash_key
from isocompute.app.main import create_app
from isocompute.app.settings import Settings

KEY = "sk-defence-key"
H = {"Authorization": f"Bearer {KEY}"}


def keyed(engine=None, policy=None, **quota):
    rec = ApiKeyRecord(name="team-d", sha256=hash_key(KEY), **quota)
    return make_client(engine=engine or FakeEngine(), policy=policy, api_keys=[rec])


def error(r):
    body = r.json()
    assert set(body) == {"error"}, body
    return body["error"]


# ---- 1. keys in the log ------------------------------------------------------------------------

CREDENTIALS = ["api_key", "api%5Fkey", "x-api-key", "openai_api_key", "bearer", "auth", "api_token", "secret",
               "token", "password", "api_key%5B%5D", "API-KEY", "access_token", "x%2Dapi%2Dkey"]


@pytest.mark.parametrize("name", CREDENTIALS)
def test_a_credential_in_the_query_is_refused_even_with_a_valid_header(name):
    engine = FakeEngine()
    with keyed(engine) as c:
        r = c.post(f"/v1/completions?{name}=sk-leaked-123", json=completion(budget=2), headers=H)
    assert r.status_code == 401, (name, r.status_code, r.text)
    assert "sk-leaked-123" not in r.text and engine.calls == []


@pytest.mark.parametrize("name", CREDENTIALS)
def test_the_access_log_blanks_a_credential_whatever_its_spelling(name):
    with keyed():  # the lifespan installs the access log's filter
        record = logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d',
                                   ("127.0.0.1:1", "POST", f"/v1/completions?x=1&{name}=sk-leaked-123", "1.1", 401),
                                   None)
        logging.getLogger("uvicorn.access").filter(record)
    assert "sk-leaked-123" not in record.getMessage() and "x=1" in record.getMessage()


def test_an_ordinary_query_parameter_passes():
    with keyed() as c:
        r = c.post("/v1/completions?trace=1", json=completion(budget=2), headers=H)
    assert r.status_code == 200, r.text


# ---- 5. log injection --------------------------------------------------------------------------


def test_unknown_field_names_are_escaped_and_cut_in_the_log(caplog):
    forged = 'x\nINFO:     127.0.0.1:1 - "GET /admin HTTP/1.1" 200 OK'
    with make_client() as c, caplog.at_level(logging.INFO, logger="isocompute.app"):
        r = c.post("/v1/completions", json=completion(budget=2, **{forged: 1, "e\x1b[31mred": 1, "z" * 3_000_000: 1}))
    assert r.status_code == 200
    lines = [rec.getMessage() for rec in caplog.records if "unknown request fields" in rec.getMessage()]
    assert lines, [rec.getMessage()[:200] for rec in caplog.records]
    for line in lines:
        assert "\n" not in line and "\x1b" not in line and len(line) < 2_000, line[:300]
    assert "x\\x0aINFO" in lines[0] and "e\\x1b[31mred" in lines[0]


def test_a_bearer_token_never_reaches_a_log_line(caplog):
    with make_client(), caplog.at_level(logging.INFO, logger="isocompute.app"):
        logging.getLogger("isocompute.app").info("headers: %s", "Authorization: Bearer sk-in-a-header")
    assert "sk-in-a-header" not in caplog.text and "Bearer [redacted]" in caplog.text


# ---- 7. consistent answers ---------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["weighted", "best_of"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_strategy_the_server_cannot_serve_is_a_json_400_streamed_or_not(strategy, stream):
    engine = FakeEngine()
    with make_client(engine) as c:
        r = c.post("/v1/completions", json=completion(budget=2, strategy=strategy, stream=stream))
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json"), r.text
    assert strategy in error(r)["message"] and engine.calls == []


@pytest.mark.parametrize("field", ["budget", "max_samples", "max_waves", "max_tokens", "temperature", "seed"])
def test_a_boolean_is_not_a_number(field):
    engine = FakeEngine()
    with make_client(engine) as c:
        r = c.post("/v1/completions", json=completion(**{field: True}))
    assert r.status_code == 422 and field in error(r)["message"] and "not true or false" in error(r)["message"]
    assert engine.calls == []


def test_a_number_too_long_to_read_names_its_field():
    body = '{"model": "isocompute", "prompt": "What is 5 + 7?", "budget": ' + "9" * 5000 + "}"
    with make_client() as c:
        r = c.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
    e = error(r)
    assert r.status_code == 400 and "'budget'" in e["message"] and "4300 digits" in e["message"], e
    assert e["code"] != "400"


def test_a_budget_out_of_range_is_shown_as_sent():
    with make_client() as c:
        r = c.post("/v1/completions", json=completion(budget=16.0000001))
    assert r.status_code == 400 and "16.0000001" in error(r)["message"], r.text


def test_a_429_of_a_quota_carries_the_quota_headers_and_a_true_retry_after():
    with keyed(FakeEngine(lengths=(60,)), tokens_per_window=100, window_s=600) as c:
        first = c.post("/v1/completions", json=completion(budget=16, max_tokens=64), headers=H)
        assert first.status_code == 200, first.text  # one sample fits: 60 tokens, 40 left
        r = c.post("/v1/completions", json=completion(budget=16, max_tokens=64), headers=H)
    assert r.status_code == 429, r.text
    assert {"x-quota-remaining-tokens", "x-quota-reset-seconds"} <= {k.lower() for k in r.headers}
    assert 590 <= int(r.headers["Retry-After"]) <= 600 and r.headers["X-Quota-Reset-Seconds"] == r.headers["Retry-After"]


# ---- 4. reservations ---------------------------------------------------------------------------


async def _concurrently(app, n: int, body: dict, headers: dict) -> list[httpx.Response]:
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
            return await asyncio.gather(*(c.post("/v1/completions", json=body, headers=headers, timeout=30)
                                          for _ in range(n)))


def test_a_reservation_is_sized_by_the_largest_plan_the_policy_serves():
    """The issue: 3,000 tokens per window, concurrent requests at budget 16 / max_tokens 16 — each reserved
    64 (server max_samples) × 16 = 1,024 tokens, so 2–3 ran and the rest got 429 with most of the quota unspent.
    The policy's largest plan is 16 samples: 256 tokens each, 11 fit at once."""
    rec = ApiKeyRecord(name="team-d", sha256=hash_key(KEY), tokens_per_window=3000)
    app = create_app(Settings(upstream_timeout_s=10.0, api_keys=[rec]), policy=FakePolicy(),
                     engine=FakeEngine(delay=0.3))
    rs = asyncio.run(_concurrently(app, 20, completion(budget=16, max_tokens=16), H))
    served = [r for r in rs if r.status_code == 200]
    assert {r.status_code for r in rs} <= {200, 429}
    assert len(served) >= 3000 // (16 * 16), [r.status_code for r in rs]


def test_a_disconnect_settles_the_reservation_to_what_was_in_flight():
    """A 3-wave plan (2, 2, 4 samples; 128 tokens reserved) cancelled during its first wave pays that wave's
    worst case (2 × 16 tokens), not its whole reservation."""
    rec = ApiKeyRecord(name="team-d", sha256=hash_key(KEY), tokens_per_window=10_000)
    engine = FakeEngine(delay=5.0)
    app = create_app(Settings(upstream_timeout_s=10.0, api_keys=[rec]), policy=FakePolicy("lead:m=2@2,2,4"),
                     engine=engine)

    async def go():
        async with app.router.lifespan_context(app):
            gw = app.state.gateway
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
                task = asyncio.create_task(c.post("/v1/completions", json=completion(max_tokens=16), headers=H))
                while not engine.calls:
                    await asyncio.sleep(0.01)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            store = gw.quotas.store
            for _ in range(100):  # the settlement runs in a task of its own (the request's was cancelled)
                spent = sum(a for w in store._window.values() for _, a in w)
                if spent < 8 * 16:
                    break
                await asyncio.sleep(0.01)
            return spent

    assert asyncio.run(go()) == 2 * 16


# ---- 3. admission (unit; the live overload is in test_app_slow_clients.py) ---------------------


def test_admission_sheds_past_its_queue_timeout_and_serves_in_order():
    from isocompute.app.accounting.admission import Admission
    from isocompute.app.errors import Overloaded

    async def go():
        adm = Admission(2, queue_timeout_s=0.2)
        await adm.acquire()
        await adm.acquire()
        assert adm.saturated
        with pytest.raises(Overloaded, match="max_inflight|2 requests in flight"):
            await adm.acquire()
        waiter = asyncio.create_task(adm.acquire())
        await asyncio.sleep(0.05)
        assert adm.waiting == 1
        adm.release()
        await asyncio.wait_for(waiter, 1.0)
        return adm.inflight, adm.waiting

    assert asyncio.run(go()) == (2, 0)


def test_an_overloaded_gateway_answers_503_with_retry_after_and_ready_says_saturated():
    engine = FakeEngine(delay=2.0)  # the slot's holder, long past the queue timeout even on a loaded machine
    app = create_app(Settings(upstream_timeout_s=10.0, max_inflight=1, queue_timeout_s=0.1, retry_after_s=3),
                     policy=FakePolicy(), engine=engine)

    async def go():
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
                slow = asyncio.create_task(c.post("/v1/completions", json=completion(budget=2), timeout=10))
                while not engine.calls:
                    await asyncio.sleep(0.01)
                ready = await c.get("/ready")
                shed = await c.post("/v1/completions", json=completion(budget=2), timeout=10)
                health = await c.get("/health")
                metrics = (await c.get("/metrics")).text
                return (await slow), ready, shed, health, metrics

    slow, ready, shed, health, metrics = asyncio.run(go())
    assert slow.status_code == 200 and health.status_code == 200
    assert ready.status_code == 503 and ready.json()["saturated"] and ready.json()["inflight"] == 1
    assert shed.status_code == 503 and shed.headers["Retry-After"] == "3" and error(shed)["code"] == "overloaded"
    assert "isocompute_requests_shed_total 1.0" in metrics


# ---- 6. work after a disconnect ----------------------------------------------------------------


def test_a_cancelled_in_process_generate_stops_at_the_next_decode_step(engine):
    """The issue: a 32-prompt, 400-token batch cancelled after 1 s ran to its end (≈ 4.7 s) and held the model."""
    steps = 0
    forward = engine.model.forward

    def counted(*a, **k):
        nonlocal steps
        steps += 1
        return forward(*a, **k)

    async def go():
        task = asyncio.create_task(engine.generate(["What is 5 + 7?"] * 32, 1, 400, 1.0, seed=0))
        while steps < 3:
            await asyncio.sleep(0.005)
        task.cancel()
        at_cancel = steps
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await asyncio.to_thread(engine._lock.acquire)  # the thread let go of the model
        engine._lock.release()
        return at_cancel, steps

    engine.model.forward = counted
    try:
        at_cancel, after = asyncio.run(go())
    finally:
        del engine.model.forward
    assert after - at_cancel <= 2, (at_cancel, after)
    # and the engine serves on
    # the next calls run whole: a cancelled call's flag does not cut them
    out = asyncio.run(engine.generate(["What is 5 + 7?"], 2, 8, 0.0, seed=0))
    assert [c.completion_tokens for c in out[0]] == [
        c.completion_tokens for c in engine.generate_sync(["What is 5 + 7?"], 2, 8, 0.0, seed=0)[0]]


def test_a_stream_whose_client_goes_settles_its_reservation_and_frees_its_slot():
    """A streamed request's waves run in a task of their own: its client going away mid-stream cancels them, the
    reservation settles to the first wave's worst case and the admission slot comes back."""
    from app_fakes import serve_in_thread

    from isocompute.engines.vllm_server import free_port

    rec = ApiKeyRecord(name="team-d", sha256=hash_key(KEY), tokens_per_window=10_000)
    engine = FakeEngine(delay=5.0)
    app = create_app(Settings(upstream_timeout_s=10.0, api_keys=[rec], stream_keepalive_s=0.1),
                     policy=FakePolicy("lead:m=2@2,2,4"), engine=engine)
    port = free_port()
    stop = serve_in_thread(app, port)
    try:
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", headers=H, timeout=10,
                          json=completion(max_tokens=16, stream=True)) as r:
            assert r.status_code == 200
            next(r.iter_lines())  # a keep-alive: the first wave is running
        gw = app.state.gateway
        store = gw.quotas.store
        for _ in range(1000):  # up to 10 s on a loaded machine; at once on an idle one
            spent = sum(a for w in store._window.values() for _, a in w)
            if spent < 8 * 16 and gw.admission.inflight == 0:
                break
            time.sleep(0.01)
    finally:
        stop()
    assert spent == 2 * 16 and gw.admission.inflight == 0 and ["What is 5 + 7?"] in engine.cancelled
