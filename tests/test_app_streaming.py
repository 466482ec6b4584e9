"""Streaming responses (``stream: true``): the official ``openai`` client streams from the gateway, raw SSE
carries keep-alive comments while waves run, usage and the ``isocompute`` object ride on the last chunks,
a refusal is still a JSON 4xx, a failure after the stream opened is an error event, and a client that goes
away cancels the upstream work."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from app_fakes import FakeEngine, FakePolicy, serve_in_thread

from isocompute.app.main import create_app
from isocompute.app.settings import Settings
from isocompute.engines.vllm_server import free_port
from isocompute.errors import EngineUnavailable
from isocompute.training.tiny import build_tokenizer


@pytest.fixture
def gateway():
    """start(engine=…, policy=…, **settings) → base URL of the app on uvicorn in a thread."""
    stops = []

    def start(engine=None, policy=None, **settings):
        engine = engine or FakeEngine()
        engine.tokenizer = build_tokenizer()
        port = free_port()
        app = create_app(Settings(**{"upstream_timeout_s": 10.0, **settings}), policy=policy or FakePolicy(),
                         engine=engine)
        stops.append(serve_in_thread(app, port))
        return f"http://127.0.0.1:{port}"

    yield start
    for stop in stops:
        stop()


def events(url, path, body, timeout=30):
    """The raw SSE lines of one streamed request (comments included)."""
    with httpx.stream("POST", f"{url}{path}", json=body, timeout=timeout) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.read()
        return [line for line in r.iter_lines() if line]


def data(lines):
    return [json.loads(x[len("data: "):]) for x in lines if x.startswith("data: ") and x != "data: [DONE]"]


def test_the_openai_client_streams_a_chat_and_reads_the_same_answer(gateway):
    from openai import OpenAI

    url = gateway(policy=FakePolicy("none@2"))
    client = OpenAI(base_url=f"{url}/v1", api_key="unused")
    msgs = [{"role": "user", "content": "What is 5 + 7?"}]
    chunks = list(client.chat.completions.create(model="isocompute", messages=msgs, stream=True,
                                                 stream_options={"include_usage": True}, extra_body={"budget": 2}))
    plain = client.chat.completions.create(model="isocompute", messages=msgs, extra_body={"budget": 2, "seed": 1})
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content == "The answer is 12."
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    last = [c for c in chunks if c.choices][-1]
    assert last.model_extra["isocompute"]["votes"] == {"12": 2} and last.model_extra["isocompute"]["k"] == 2
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage.completion_tokens == 10 and "flops" in usage.usage.model_extra
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)


def test_the_openai_client_streams_completions_one_choice_per_prompt(gateway):
    from openai import OpenAI

    client = OpenAI(base_url=f"{gateway()}/v1", api_key="unused")
    chunks = list(client.completions.create(model="isocompute", prompt=["What is 5 + 7?", "What is 6 + 6?"],
                                            stream=True, extra_body={"budget": 2}))
    assert sorted((c.choices[0].index, c.choices[0].text, c.choices[0].finish_reason) for c in chunks) == [
        (0, "The answer is 12.", "stop"), (1, "The answer is 12.", "stop")]
    assert "isocompute" in chunks[-1].model_extra and chunks[-1].usage is None  # no include_usage: no usage chunk


def test_keepalive_comments_while_the_waves_run(gateway):
    url = gateway(FakeEngine(delay=0.6), stream_keepalive_s=0.1)
    t0 = time.monotonic()
    lines = events(url, "/v1/completions", {"model": "isocompute", "prompt": "What is 5 + 7?", "budget": 2,
                                            "stream": True})
    assert time.monotonic() - t0 >= 0.6
    assert lines.count(": keep-alive") >= 3 and lines[-1] == "data: [DONE]"
    assert lines.index(": keep-alive") < min(i for i, x in enumerate(lines) if x.startswith("data: "))
    [chunk] = data(lines)
    assert chunk["object"] == "text_completion" and chunk["choices"][0]["text"] == "The answer is 12."


def test_a_refused_stream_is_an_ordinary_json_error(gateway):
    r = httpx.post(f"{gateway()}/v1/completions", timeout=30,
                   json={"model": "isocompute", "prompt": "hi", "budget": 1e9, "stream": True})
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["param"] == "budget"


def test_a_failure_after_the_stream_opened_is_an_error_event(gateway):
    url = gateway(FakeEngine(fail=EngineUnavailable("upstream down; start it")))
    lines = events(url, "/v1/chat/completions", {"model": "isocompute", "stream": True,
                                                 "messages": [{"role": "user", "content": "hi"}]})
    [err] = data(lines)
    assert lines[-1] == "data: [DONE]" and err["error"]["type"] and "upstream down" in err["error"]["message"]


def test_a_client_that_goes_away_cancels_the_upstream_work(gateway):
    engine = FakeEngine(delay=30.0)
    url = gateway(engine, stream_keepalive_s=0.05)
    with httpx.stream("POST", f"{url}/v1/completions", timeout=30,
                      json={"model": "isocompute", "prompt": "What is 5 + 7?", "budget": 2, "stream": True}) as r:
        assert next(r.iter_lines()) == ": keep-alive"  # the waves are running
    deadline = time.monotonic() + 5
    while not engine.cancelled and time.monotonic() < deadline:
        time.sleep(0.02)
    assert engine.cancelled == [["What is 5 + 7?"]]  # cancelled within seconds, not after the 30 s wave
