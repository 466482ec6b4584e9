"""The gateway drains on SIGTERM (issue 23; :mod:`isocompute.app.readiness`): ``/ready`` 503 at once, a new
request a fast 503 in OpenAI's error shape with ``Retry-After``, the requests in flight answered, then the
process exits 0 — in-process (the signal handler called by hand: a server in a thread gets no signals) and
as a real ``isocompute serve`` subprocess in front of a small local upstream that answers slowly.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import uvicorn
from app_fakes import FakeEngine, FakePolicy, completion

from isocompute.app.main import create_app
from isocompute.app.readiness import CLOSE_GRACE_S, Drain, DrainingServer
from isocompute.app.settings import Settings
from isocompute.engines.vllm_server import free_port

REPO = Path(__file__).resolve().parents[1]


def wait_for(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} not within {timeout} s"
        time.sleep(0.02)


def ready_code(url: str) -> int | None:
    try:
        return httpx.get(f"{url}/ready", timeout=5).status_code
    except httpx.TransportError:
        return None


def test_drain_is_over_when_nothing_is_in_flight_or_its_timeout_passed():
    d = Drain(timeout_s=10.0)
    d.inflight = 2
    assert not d.draining and not d.over()
    d.start()
    assert d.draining and not d.over(d.since + 9.9) and d.over(d.since + 10.0)
    d.inflight = 0
    assert d.over(d.since)


def test_a_request_in_flight_at_the_signal_is_answered_and_new_ones_get_a_fast_503():
    settings = Settings(upstream_timeout_s=10.0, ready_probe_timeout_s=5.0, retry_after_s=7, drain_timeout_s=20.0)
    app = create_app(settings, policy=FakePolicy(), engine=FakeEngine(delay=1.5))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    srv = DrainingServer(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                        timeout_graceful_shutdown=CLOSE_GRACE_S), app.state.drain)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: ready_code(url) == 200, 30, "/ready 200")  # the readiness call sleeps 1.5 s too
        slow: list[httpx.Response] = []
        client = threading.Thread(target=lambda: slow.append(
            httpx.post(f"{url}/v1/completions", json=completion(budget=2), timeout=30)))
        client.start()
        wait_for(lambda: app.state.drain.inflight == 1, 10, "the slow request in flight")
        t_signal = time.monotonic()
        srv.handle_exit(signal.SIGTERM, None)  # what uvicorn's signal handler calls
        r = httpx.get(f"{url}/ready", timeout=5)
        assert r.status_code == 503 and "draining" in r.json()["detail"]
        t0 = time.monotonic()
        late = httpx.post(f"{url}/v1/completions", json=completion(budget=2), timeout=5)
        assert time.monotonic() - t0 < 0.5 and late.status_code == 503 and late.headers["Retry-After"] == "7"
        err = late.json()["error"]
        assert (err["type"], err["code"]) == ("service_unavailable", "draining") and "shutting down" in err["message"]
        client.join(timeout=20)
        assert slow and slow[0].status_code == 200, slow
        thread.join(timeout=10)
        assert not thread.is_alive() and time.monotonic() - t_signal < 10
    finally:
        srv.should_exit = True
        thread.join(timeout=10)


class SlowUpstream(BaseHTTPRequestHandler):
    """A vLLM-shaped upstream serving model ``m``: a completion whose prompt says "slow" takes 3 s."""

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
        if "slow" in body["prompt"]:
            time.sleep(3.0)
        n = body.get("n", 1)
        self._json({"choices": [{"index": j, "text": " 12", "token_ids": [7, 2], "finish_reason": "stop"}
                                for j in range(n)], "usage": {"prompt_tokens": 3, "completion_tokens": 2 * n}})


@pytest.mark.slow
def test_isocompute_serve_drains_on_sigterm_and_exits_0(tiny_dir, tmp_path):
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), SlowUpstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "gateway.log"
    cmd = [sys.executable, "-m", "isocompute", "serve", "--upstream", f"m=http://127.0.0.1:{upstream.server_port}",
           "--model", f"m={tiny_dir}", "--action", "m/none@1", "--port", str(port), "--log-level", "warning"]
    env = {**os.environ, "ISOCOMPUTE_DRAIN_TIMEOUT_S": "20"}
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: proc.poll() is None and ready_code(url) == 200 or proc.poll() is not None, 120,
                 "the gateway ready")
        assert proc.poll() is None, log.read_text()[-3000:]
        slow: list[httpx.Response] = []
        client = threading.Thread(target=lambda: slow.append(httpx.post(
            f"{url}/v1/completions", json=completion("slow: what is 5 + 7?", budget=1), timeout=30)))
        client.start()
        time.sleep(1.0)  # the request is waiting on the upstream
        t_signal = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)  # the slow request has ~2 s to go: the gateway drains, still listening
        assert ready_code(url) == 503
        late = httpx.post(f"{url}/v1/completions", json=completion(budget=1), timeout=5)
        assert late.status_code == 503 and int(late.headers["Retry-After"]) >= 1, late.text
        client.join(timeout=30)
        assert slow and slow[0].status_code == 200, (slow, log.read_text()[-3000:])
        assert proc.wait(timeout=20) == 0, log.read_text()[-3000:]
        assert time.monotonic() - t_signal < 20
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        upstream.shutdown()
