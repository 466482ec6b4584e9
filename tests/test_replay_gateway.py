"""The gateway over replay upstreams (``isocompute replay``, a simulator answering from recorded samples):
a parallel-stop plan served from real recorded lengths and answers — the answer, tokens and aborts the plan's
definition gives for those samples —, client streams and disconnects, usage and metrics, and each fault mode
on one of two upstreams invisible to clients. Replay servers run in threads at fast modelled rates; no
assertion bounds wall-clock time."""

from __future__ import annotations

import json
import re
import threading
import time

import httpx
import pytest

from isocompute.engines.vllm_server import free_port
from isocompute.replay.process import ReplayThread
from isocompute.replay.table import load_tables
from isocompute.replay.timing import TimingModel

# one prompt, four recorded samples (answer, completion tokens)
SAMPLES = [("5", 30), ("6", 10), (None, 50), ("5", 20)]
PROMPT = "What is 2 + 3?"
OTHER = [f"What is {i} + 1?" for i in range(8)]


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    path = tmp_path_factory.mktemp("replay-gw") / "t.jsonl"
    rows = [{"id": "p0", "prompt": PROMPT, "prompt_tokens": 7, "meta": {"task": "gsm8k", "model": "m"},
             "samples": [{"answer": a, "completion_tokens": k} for a, k in SAMPLES]}]
    rows += [{"id": f"o{i}", "prompt": p, "prompt_tokens": 6, "meta": {"task": "gsm8k"},
              "samples": [{"answer": str(i + 1), "completion_tokens": 5 + j} for j in range(4)]}
             for i, p in enumerate(OTHER)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_tables([path])


@pytest.fixture
def replays(table):
    """Two replay upstreams (threads), 1,000 tokens/s per sequence, one token per chunk."""
    ups = [ReplayThread(table, TimingModel(decode_tps=1000.0, max_tps=1e6), free_port()) for _ in range(2)]
    yield ups
    for u in ups:
        u.stop()


def serve(settings, policy):
    import uvicorn

    from isocompute.app.main import create_app

    port = free_port()
    app = create_app(settings, policy=policy)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    else:
        pytest.fail("gateway did not become ready")

    def stop():
        srv.should_exit = True
        thread.join(timeout=30)
    return url, app, stop


def gateway(ups, plan, **kw):
    from app_fakes import FakePolicy

    from isocompute.app.settings import Settings

    s = Settings(engine="vllm-http", upstreams=[u.url for u in ups], default_max_tokens=100, max_tokens_limit=200,
                 upstream_timeout_s=20, ready_interval_s=0.5, **kw)
    return serve(s, FakePolicy(plan))


def ask(url, prompt=PROMPT, **body):
    r = httpx.post(f"{url}/v1/completions", timeout=30, json={"model": "isocompute", "prompt": prompt, "budget": 4,
                                                               "seed": 3, "temperature": 1.0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def metric(text, name):
    """The sum of ``name``'s samples (``name`` may end inside a label set: ``x{reason="a"``)."""
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}[^\n]* (\S+)$", text, re.M))


@pytest.mark.parametrize("plan,answer,tokens,aborted,stopped", [
    # finish order 6@10, 5@20, 5@30, None@50: lead:m=1 fires at the first finish, the other three aborted at 10
    ("lead:m=1@4s", "6", 4 * 10, 3, "rule"),
    # lead:m=2 never leads by 2 (6, 5, 5, none): the wave runs out, every token decoded
    ("lead:m=2@4s", "5", 10 + 20 + 30 + 50, 0, "plan_end"),
    # first:m=3: the vote among the first three finishes (6, 5, 5), the fourth aborted at 30
    ("first:m=3@4s", "5", 10 + 20 + 30 + 30, 1, "rule"),
])
def test_a_parallel_stop_wave_serves_what_its_definition_gives_on_the_recorded_samples(replays, plan, answer,
                                                                                        tokens, aborted, stopped):
    url, app, stop = gateway(replays[:1], plan)
    try:
        out = ask(url, n=1)
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        upstream = httpx.get(f"{replays[0].url}/metrics", timeout=10).text
    finally:
        stop()
    info = out["isocompute"]
    assert info["answer"] == answer and info["stopped"] == stopped and info["k"] == 4
    # the wave's decode length (what latency sums): the last finish, or the stop point
    assert info["wave_runs"][0]["decode_tokens"] == {"rule": tokens // 4 if aborted == 3 else 30}.get(stopped, 50)
    assert out["usage"]["completion_tokens"] == tokens and out["usage"]["prompt_tokens"] == 7
    assert metric(metrics, "isocompute_aborted_samples_total") == aborted
    for _ in range(50):  # the upstream counts the aborted samples' tokens once their stream is closed
        if metric(upstream, "vllm:num_requests_running") == 0:
            break
        time.sleep(0.1)
        upstream = httpx.get(f"{replays[0].url}/metrics", timeout=10).text
    # the upstream decodes on until it sees the close (as vLLM does): at least what the client was charged
    assert metric(upstream, "vllm:generation_tokens_total") >= tokens
    assert metric(upstream, "vllm:num_requests_running") == 0
    assert metric(upstream, 'vllm:request_success_total{finished_reason="abort"') == (stopped == "rule")


def test_a_plans_waves_draw_each_recorded_sample_once(replays):
    url, app, stop = gateway(replays[:1], "none@1x4", upstream_max_concurrency=3)  # four waves of one sample
    try:
        out = ask(url)
        cap = app.state.gateway.engine.max_concurrency
    finally:
        stop()
    assert cap == 3  # the setting reaches the pool's engine
    assert out["isocompute"]["waves"] == 4
    assert sorted(w["tokens"] for w in out["isocompute"]["wave_runs"]) == [10, 20, 30, 50]


def test_a_client_stream_gets_the_answer_and_a_disconnect_aborts_the_upstream_samples(replays, table):
    slow = ReplayThread(table, TimingModel(decode_tps=20.0, max_tps=1e6), free_port())  # 50 tokens: 2.5 s
    url, app, stop = gateway([slow], "none@4s")
    try:
        with httpx.stream("POST", f"{url}/v1/completions", timeout=30, json={
                "model": "isocompute", "prompt": PROMPT, "budget": 4, "seed": 3, "stream": True}) as r:
            assert r.status_code == 200
            for _ in range(200):  # the wave is decoding upstream
                if slow.call(lambda s: s.sched.running) == 4:
                    break
                time.sleep(0.02)
            assert slow.call(lambda s: s.sched.running) == 4
        # the client is gone: the gateway closes the upstream stream, the replay stops its samples
        for _ in range(100):
            if slow.call(lambda s: s.sched.running) == 0:
                break
            time.sleep(0.05)
        running, aborts = slow.call(lambda s: (s.sched.running, s.success["abort"]))
        assert running == 0 and aborts == 1
        slow.call(lambda s: setattr(s.sched, "slowdown", 1 / 50))  # fast again for the full stream
        with httpx.stream("POST", f"{url}/v1/completions", timeout=30, json={
                "model": "isocompute", "prompt": PROMPT, "budget": 4, "seed": 3, "stream": True}) as r:
            body = "".join(r.iter_text())
    finally:
        stop()
        slow.stop()
    assert body.rstrip().endswith("data: [DONE]") and '"isocompute"' in body


@pytest.mark.parametrize("fault", [
    {"status": 503}, {"drop": True}, {"drop": True, "after_tokens": 3}, {"refuse_s": 60}, {"stall_s": 30},
    {"slowdown": 5},
])
def test_each_fault_on_one_of_two_upstreams_is_invisible_to_clients(replays, fault):
    url, app, stop = gateway(replays, "none@2s", upstream_stall_s=0.5)
    bad = replays[1]
    try:
        httpx.post(f"{bad.url}/admin/faults", json=fault, timeout=5).raise_for_status()
        outs = [ask(url, OTHER[i % len(OTHER)]) for i in range(12)]
        status = {u["url"]: u for u in app.state.gateway.engine.upstream_status()}
    finally:
        stop()
        bad.call(lambda s: s.clear_faults(None))  # a refusing server takes no DELETE
    # every request answered with the recorded answer of its prompt
    assert [o["isocompute"]["answer"] for o in outs] == [str(i % len(OTHER) + 1) for i in range(12)]
    if "slowdown" not in fault:  # a slow upstream still answers: it keeps its share
        assert status[replays[0].url]["served"] >= 12 - 1
