"""Hostile and malformed input gets a clear 4xx in OpenAI's error shape — never a 500, a hang or a leaked key
(issue 23's findings, each a regression test that failed before the fix)."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import httpx
import pytest
from app_fakes import FakeEngine, make_client

from isocompute.app.accounting.logs import RedactQueryKeys
from isocompute.app.main import create_app
from isocompute.app.settings import Settings
from isocompute.training.tiny import build_tokenizer


def client(**settings):
    engine = FakeEngine()
    engine.tokenizer = build_tokenizer()
    return make_client(engine, **settings), engine


def error(r):
    body = r.json()
    assert set(body) == {"error"} and {"message", "type", "code"} <= set(body["error"]), body
    return body["error"]


@pytest.mark.parametrize("path, body, where", [
    ("/v1/completions", {"model": "isocompute", "prompt": "\ud800"}, "prompt 0"),
    ("/v1/completions", {"model": "isocompute", "prompt": ["ok", "a\udfffb"]}, "prompt 1"),
    ("/v1/chat/completions", {"model": "isocompute", "messages": [{"role": "user", "content": "\ud800"}]},
     "messages[0].content"),
    ("/v1/chat/completions", {"model": "isocompute", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "x\ud800"}]}]}, "messages[0].content[0].text"),
    ("/v1/route", {"model": "isocompute", "prompt": "\ud800"}, "prompt 0"),
    ("/v1/route", {"model": "isocompute", "messages": [{"role": "user", "content": "\ud800"}]},
     "messages[0].content"),
])
def test_a_lone_surrogate_is_a_400_naming_where_it_is(path, body, where):
    c, engine = client()
    with c:
        # json.dumps escapes the lone surrogate as \ud800, exactly what a client's JSON carries
        r = c.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    e = error(r)
    assert where in e["message"] and "surrogate" in e["message"] and "U+D8" in e["message"] or "U+DF" in e["message"]
    assert engine.calls == []


def test_a_body_over_the_limit_is_a_413_before_it_is_parsed():
    c, engine = client(max_body_bytes=64 * 1024)
    big = {"model": "isocompute", "messages": [{"role": "user", "content": "a"}] * 20_000}
    with c:
        r = c.post("/v1/chat/completions", json=big)
        ok = c.post("/v1/completions", json={"model": "isocompute", "prompt": "What is 5 + 7?", "budget": 2})
    assert r.status_code == 413 and error(r)["code"] == "body_too_large"
    assert "65536 bytes (max_body_bytes)" in error(r)["message"]
    assert ok.status_code == 200 and engine.calls  # only the small one reached the engine


def test_a_body_without_a_length_is_cut_off_at_the_limit():
    c, engine = client(max_body_bytes=4096)
    chunks = [b'{"model": "isocompute", "prompt": "', *([b"a" * 1024] * 8), b'"}']
    with c:  # chunked: no Content-Length to check up front, so the bytes read are counted
        r = c.post("/v1/completions", content=iter(chunks), headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and error(r)["code"] == "body_too_large" and engine.calls == []


def test_too_many_messages_are_refused_before_the_chat_template_runs():
    c, engine = client(max_messages=8)
    with c:
        r = c.post("/v1/chat/completions", json={
            "model": "isocompute", "messages": [{"role": "user", "content": "hi"}] * 9})
    assert r.status_code == 400 and "9 messages" in error(r)["message"] and "max_messages" in error(r)["message"]
    assert engine.calls == []


def test_a_large_chat_is_templated_off_the_event_loop():
    """While a large chat is rendered and tokenised, /health answers at once (it used to wait seconds)."""
    engine = FakeEngine()
    tok = build_tokenizer()
    slow = tok.apply_chat_template

    def apply(*a, **k):
        time.sleep(1.0)  # a big template
        return slow(*a, **k)

    tok.apply_chat_template = apply
    engine.tokenizer = tok
    app = create_app(Settings(upstream_timeout_s=10.0), policy=None, engine=engine)

    async def go():
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
                msgs = [{"role": "user", "content": "word " * 5000}]
                big = asyncio.create_task(c.post("/v1/route", json={"model": "isocompute", "messages": msgs}))
                await asyncio.sleep(0.2)
                t0 = time.perf_counter()
                h = await c.get("/health")
                took = time.perf_counter() - t0
                await big
                return h.status_code, took

    status, took = asyncio.run(go())
    assert status == 200 and took < 0.5


@pytest.mark.parametrize("content, code, what", [
    (b'{"model": "isocompute", "prompt": "\xff\xfe"}', "invalid_json", "not valid UTF-8 (byte 35"),
    (b"[" * 10_000 + b"]" * 10_000, "invalid_json", "too deeply"),
])
def test_unparsable_bodies_say_what_is_wrong(content, code, what):
    c, _ = client()
    with c:
        r = c.post("/v1/completions", content=content, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and error(r)["code"] == code and what in error(r)["message"], r.text


def test_a_body_without_a_json_content_type_says_to_send_one():
    c, _ = client()
    with c:  # what plain `curl -d '{...}'` sends
        r = c.post("/v1/completions", content=b'{"model": "isocompute", "prompt": "hi"}',
                   headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 422
    assert "Content-Type: application/json" in error(r)["message"]
    assert "application/x-www-form-urlencoded" in error(r)["message"]


def test_a_text_part_without_text_says_so():
    c, _ = client()
    with c:
        r = c.post("/v1/chat/completions", json={"model": "isocompute", "messages": [
            {"role": "user", "content": [{"type": "text"}]}]})
        img = c.post("/v1/chat/completions", json={"model": "isocompute", "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})
    assert r.status_code == 400 and 'messages[0].content[0] is a text part without its "text"' in error(r)["message"]
    assert img.status_code == 400 and "'image_url' part; only text parts" in error(img)["message"]


def test_a_405_says_which_methods_are_allowed():
    c, _ = client()
    with c:
        r = c.get("/v1/completions")
    assert r.status_code == 405 and r.headers["allow"] == "POST" and "allowed: POST" in error(r)["message"]


def test_a_key_in_the_url_is_refused_and_never_logged(caplog):
    c, engine = client()
    with c:
        r = c.post("/v1/completions?api_key=sk-secret-123", json={"model": "isocompute", "prompt": "hi"})
    assert r.status_code == 401 and "Authorization: Bearer" in error(r)["message"]
    assert "sk-secret-123" not in r.text and engine.calls == []
    record = logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:1", "POST", "/v1/completions?x=1&api_key=sk-secret-123", "1.1", 401),
                               None)
    RedactQueryKeys().filter(record)
    assert "sk-secret-123" not in record.getMessage() and "api_key=[redacted]&" not in record.getMessage()
    assert record.args[2] == "/v1/completions?x=1&api_key=[redacted]"


def test_the_published_schema_states_the_refused_fields():
    c, _ = client()
    with c:
        doc = c.get("/openapi.json").json()["components"]["schemas"]
    chat, comp = doc["ChatCompletionRequest"]["properties"], doc["CompletionRequest"]["properties"]
    assert chat["n"]["maximum"] == 1 and comp["n"]["maximum"] == 1 and comp["best_of"]["maximum"] == 1
    assert "enum" not in chat["stream"] and chat["tools"]["maxItems"] == 0  # stream is served
    assert chat["logprobs"]["enum"] == [False, None] and comp["logprobs"]["maximum"] == 0
