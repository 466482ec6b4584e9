"""Traces (:mod:`isocompute.app.accounting.tracing`) with the OpenTelemetry SDK's in-memory exporter: a request to a
real gateway app (vllm-http to a local vLLM-shaped upstream that records the headers it gets) is one trace,
continuing the caller's ``traceparent``, with price, decide, one wave span per upstream call, vote and
charge under its server span; each upstream call carries its wave span's ``traceparent``. Off by default:
no spans and no ``traceparent`` sent. With ``upstream_caller_header`` set, every wave carries a hashed
caller id in that header (a router's fairness key).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from app_fakes import serve_in_thread

from isocompute.app.accounting.auth import hash_key
from isocompute.app.accounting.tracing import caller_id, make_tracer, span
from isocompute.app.main import create_app
from isocompute.app.settings import Settings
from isocompute.engines.vllm_server import free_port

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{CALLER_TRACE}-b7ad6b7169203331-01"


class Recording(BaseHTTPRequestHandler):
    """A vLLM-shaped upstream answering " 12"; keeps each completions request's traceparent (None if absent)."""

    seen: list[tuple[int, str | None]] = []
    fairness: list[str | None] = []

    def log_message(self, *args):
        pass

    def _json(self, data: dict) -> None:
        body = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._json({"data": [{"id": "m"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Recording.seen.append((body.get("max_tokens", 0), self.headers.get("traceparent")))
        if body.get("max_tokens") == 8:
            Recording.fairness.append(self.headers.get("x-gateway-inference-fairness-id"))
        n = body.get("n", 1)
        self._json({"choices": [{"index": j, "text": " 12", "token_ids": [7, 2], "finish_reason": "stop"}
                                for j in range(n)], "usage": {"prompt_tokens": 3, "completion_tokens": 2 * n}})


@pytest.fixture()
def upstream():
    Recording.seen, Recording.fairness = [], []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Recording)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()


def run_gateway(upstream: str, tiny_dir, exporter=None, **extra) -> httpx.Response:
    settings = Settings(model_upstreams={"m": [upstream]}, model_dirs={"m": tiny_dir}, action="m/none@1x2", **extra)
    app = create_app(settings, span_exporter=exporter)
    port = free_port()
    stop = serve_in_thread(app, port)
    try:
        return httpx.post(f"http://127.0.0.1:{port}/v1/completions", headers={"traceparent": TRACEPARENT},
                          json={"model": "isocompute", "prompt": "What is 5 + 7?", "max_tokens": 8}, timeout=30)
    finally:
        stop()


def test_a_request_is_one_trace_with_its_steps_and_the_upstream_gets_each_waves_traceparent(upstream, tiny_dir):
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    r = run_gateway(upstream, tiny_dir, exporter)
    assert r.status_code == 200, r.text
    spans = exporter.get_finished_spans()
    by_name: dict[str, list] = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    server = by_name["POST /v1/completions"][0]
    assert f"{server.context.trace_id:032x}" == CALLER_TRACE and f"{server.parent.span_id:016x}" == "b7ad6b7169203331"
    assert server.attributes["http.response.status_code"] == 200
    assert {s.context.trace_id for s in spans} == {server.context.trace_id}
    for name in ("isocompute.price", "isocompute.decide"):
        assert by_name[name][0].parent.span_id == server.context.span_id
    waves = sorted(by_name["isocompute.wave"], key=lambda s: s.attributes["wave"])
    assert [w.attributes["wave"] for w in waves] == [1, 2] and len(by_name["isocompute.vote"]) == 2
    assert len(by_name["isocompute.charge"]) == 1
    sent = [tp for max_tokens, tp in Recording.seen if max_tokens == 8]  # the request's waves, not readiness
    assert [tp.split("-")[1:3] for tp in sent] == [[CALLER_TRACE, f"{w.context.span_id:016x}"] for w in waves]


def test_tracing_is_off_by_default(upstream, tiny_dir):
    r = run_gateway(upstream, tiny_dir)
    assert r.status_code == 200, r.text
    assert Recording.seen and all(tp is None for _, tp in Recording.seen)
    assert Recording.fairness == [None, None]
    assert make_tracer(None, "x") == (None, None)
    tracer, provider = make_tracer("http://127.0.0.1:9/v1/traces", "x")  # the OTLP exporter, batched
    assert tracer is not None
    provider.shutdown()
    with span("isocompute.price") as s:  # outside a traced request: nothing recorded
        assert s is None


def test_the_routers_fairness_header_carries_a_hashed_caller_id_on_every_wave(upstream, tiny_dir):
    r = run_gateway(upstream, tiny_dir, upstream_caller_header="x-gateway-inference-fairness-id")
    assert r.status_code == 200, r.text
    assert Recording.fairness == [caller_id("anonymous")] * 2 and caller_id("anonymous") != caller_id(hash_key("k"))
    with pytest.raises(ValueError, match="upstream_caller_header"):
        Settings(upstream_caller_header="X Fairness: id")
