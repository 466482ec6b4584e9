"""The gateway when its upstream fails (issue 12): one test per promised behaviour, each written against
the failure it reproduces (named in the test's docstring), with the small fakes of ``app_fakes.py`` and
the real vllm-http engine over an in-memory transport. The real vLLM server killed and restarted under
load is in test_app_vllm.py; the long scenario in bench/bench_fault.py.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import replace
from types import SimpleNamespace

import httpx
import pytest
from app_fakes import FakeEngine, FakePolicy, completion, make_client, serve_in_thread

from isocompute.app.main import create_app
from isocompute.app.settings import Settings
from isocompute.engines.vllm_http import VLLMHTTPEngine
from isocompute.errors import EngineUnavailable

A = "http://a.test:8000"


def free_port() -> int:
    from isocompute.engines.vllm_server import free_port as fp

    return fp()


def http_engine(handler, **kw) -> VLLMHTTPEngine:
    return VLLMHTTPEngine([A], model="tiny", transport=httpx.MockTransport(handler), **kw)


def wait_until(check, timeout: float = 5.0) -> float:
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < timeout, f"not within {timeout} s"
        time.sleep(0.02)
    return time.monotonic() - t0


def assert_openai_error(r, status):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


# ------------------------------------------------------------------------- every upstream fault is 5xx


@pytest.mark.parametrize("exc", [RuntimeError("CUDA error: device-side assert"), KeyError("choices"),
                                 httpx.DecodingError("bad gzip"), ValueError("invalid literal for int()")])
def test_an_engine_exception_is_a_502_in_openai_shape_not_a_500(exc):
    """Was: any exception an engine raised that was not EngineUnavailable became a 500 "internal error"."""
    with make_client(FakeEngine(fail=exc)) as c:
        r = c.post("/v1/completions", json=completion(budget=4))
        err = assert_openai_error(r, 502)
        assert err["code"] == "upstream_bad_response" and type(exc).__name__ in err["message"]
        assert int(r.headers["Retry-After"]) >= 1
        assert 'isocompute_upstream_errors_total{kind="bad_response",pool="default"} 1.0' in c.get("/metrics").text


def test_every_upstream_down_is_a_fast_503_with_retry_after_and_nothing_sent():
    """Was: with the only upstream down, every request knocked on it again (connect, retry, back off:
    seconds each) instead of failing at once."""
    sent = []

    def refuse(request):
        sent.append(request.url.path)
        raise httpx.ConnectError("connection refused", request=request)

    engine = http_engine(refuse, cooldown=3.0, max_cooldown=3.0, backoff=0.5)
    with make_client(engine, ready_probe_timeout_s=1.0) as c:
        assert_openai_error(c.post("/v1/completions", json=completion(budget=4)), 503)
        before = len(sent)
        walls, afters = [], []
        for _ in range(20):
            t0 = time.monotonic()
            r = c.post("/v1/completions", json=completion(budget=4))
            walls.append(time.monotonic() - t0)
            err = assert_openai_error(r, 503)
            assert err["code"] == "upstream_circuit_open" and "ConnectError" in err["message"]
            afters.append(int(r.headers["Retry-After"]))
        assert len(sent) - before <= 1  # at most the engine's own probe; no request was sent
    assert max(walls) < 0.2 and all(1 <= a <= 3 for a in afters)


def test_an_unknown_upstream_model_is_a_502_that_says_what_to_fix_and_ready_reports_it():
    """Was: vLLM's 404 for a model it does not serve became a 400 blamed on the client, and /ready kept
    waiting silently."""

    def not_served(request):
        return httpx.Response(404, json={"error": {"message": "The model `tiny` does not exist.",
                                                   "type": "NotFoundError", "code": 404}})

    with make_client(http_engine(not_served)) as c:
        err = assert_openai_error(c.post("/v1/completions", json=completion(budget=4)), 502)
        assert err["code"] == "upstream_misconfigured"
        assert re.search(r"'tiny'.*--upstream-model", err["message"])
        ready = c.get("/ready")
        assert ready.status_code == 503 and "misconfigured" in ready.json()["detail"]
        assert "--upstream-model" in ready.json()["detail"]


def test_a_client_input_refused_upstream_stays_a_400():
    def too_long(request):
        return httpx.Response(400, json={"error": {"message": "This model's maximum context length is 512"}})

    with make_client(http_engine(too_long)) as c:
        err = assert_openai_error(c.post("/v1/completions", json=completion(budget=4)), 400)
        assert "maximum context length" in err["message"]


# ------------------------------------------------------------------------------------------- readiness


class FlakyProbeEngine(FakeEngine):
    """Its first ``bad`` readiness calls raise errors no readiness code expects."""

    def __init__(self, bad=None):
        super().__init__()
        self.bad = [KeyError("data"), httpx.UnsupportedProtocol("h3")] if bad is None else list(bad)

    async def generate(self, prompts, n, max_tokens, temperature, seed=None):
        if prompts == ["1 + 1 ="] and self.bad:
            raise self.bad.pop(0)
        return await super().generate(prompts, n, max_tokens, temperature, seed)


def test_the_readiness_task_survives_any_exception():
    """Was: the probe caught three exception types; a KeyError (a malformed /v1/models reply) or a
    non-transport httpx error killed it silently and /ready stayed 503 forever."""
    with make_client(FlakyProbeEngine()) as c:
        wait_until(lambda: c.get("/ready").status_code == 200, timeout=5)


def test_ready_follows_the_upstream_down_and_back():
    """Was: /ready turned 200 after the first answer and stayed 200 whatever happened upstream."""
    engine = FakeEngine()
    with make_client(engine, ready_interval_s=0.5) as c:
        wait_until(lambda: c.get("/ready").status_code == 200)
        engine.fail = EngineUnavailable("connection refused")
        assert c.post("/v1/completions", json=completion(budget=4)).status_code == 503
        r = c.get("/ready")
        assert r.status_code == 503 and "connection refused" in r.json()["detail"]
        engine.fail = None
        assert wait_until(lambda: c.get("/ready").status_code == 200) < 1.5


def test_ready_notices_an_upstream_that_dies_without_traffic():
    engine = FakeEngine()
    with make_client(engine, ready_interval_s=0.2) as c:
        wait_until(lambda: c.get("/ready").status_code == 200)
        engine.fail = EngineUnavailable("gone")
        wait_until(lambda: c.get("/ready").status_code == 503, timeout=2)


def test_shutdown_closes_the_engine_even_when_the_readiness_task_died(monkeypatch):
    """Was: shutdown awaited the probe task, which re-raised what it died of, so the gateway and the
    engine were never closed."""
    import isocompute.app.main as main

    engine = FlakyProbeEngine(bad=[KeyError("data")] * 100)
    monkeypatch.setattr(main, "build_engine", lambda s: engine)
    app = create_app(Settings(engine="vllm-http", upstreams=[A], policy_dir=None), policy=FakePolicy())
    with make_client_for(app) as c:
        c.get("/health")
        gw = app.state.gateway
    assert engine.closed and app.state.gateway is None and gw._decide_pool._shutdown


def make_client_for(app):
    from fastapi.testclient import TestClient

    return TestClient(app, raise_server_exceptions=False)


# ------------------------------------------------------------------------------------------- accounting


def test_greedy_draws_and_charges_one_sample():
    """Was: at temperature 0 the engine copied one completion k times and the gateway charged k samples
    (tokens, FLOPs, the controller) for one."""
    engine, policy = FakeEngine(), FakePolicy()
    with make_client(engine, policy) as c:
        r = c.post("/v1/completions", json=completion(budget=8, temperature=0))  # the policy asks for 4
        assert r.status_code == 200, r.text
        metrics = c.get("/metrics").text
        ctl = next(iter(c.app.state.gateway.controllers._items.values()))
    info, usage = r.json()["isocompute"], r.json()["usage"]
    assert engine.calls == [(["What is 5 + 7?"], 1)]
    assert (info["k"], info["policy_k"], info["samples_received"]) == (1, 4, 1)
    assert usage["completion_tokens"] == 5  # one sample's
    assert "isocompute_samples_total 1.0" in metrics
    assert ctl.state().mean_cost == 1.0


def test_capped_requests_do_not_drive_the_uncapped_controller():
    """Was: the controller key ignored max_samples, so capped requests (which spend less than the budget
    whatever λ is) pushed the key's internal budget to the top of its range for everyone."""
    policy = FakePolicy()
    with make_client(policy=policy) as c:
        for _ in range(30):
            assert c.post("/v1/completions", json=completion("hard", budget=4, max_samples=2)).status_code == 200
        r = c.post("/v1/completions", json=completion("hard", budget=4))
        labels = c.get("/metrics").text
    assert r.json()["isocompute"]["internal_budget"] == 4.0  # a fresh controller for uncapped traffic
    assert 'budget_key="anonymous:4samples:max2"' in labels and 'budget_key="anonymous:4samples"' in labels


def test_labels_of_an_evicted_key_are_not_recreated():
    """Was: a request whose key was evicted while it waited upstream set its gauges again on the way out,
    so the label set grew without bound."""
    app = create_app(Settings(control_max_keys=1, upstream_timeout_s=5), policy=FakePolicy(),
                     engine=FakeEngine(delay=0.3))

    async def go():
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=10) as client:
                slow = asyncio.ensure_future(client.post("/v1/completions", json=completion(budget=2)))
                await asyncio.sleep(0.1)  # key 2 is waiting upstream; key 3 evicts it
                other = await client.post("/v1/completions", json=completion(budget=3))
                assert (await slow).status_code == other.status_code == 200
                return (await client.get("/metrics")).text

    text = asyncio.run(go())
    assert 'budget_key="anonymous:3samples"' in text
    assert 'budget_key="anonymous:2samples"' not in text


# ------------------------------------------------------------------------------------ deadlines, cancel


class ProbePolicy(FakePolicy):
    """A policy with the greedy-entropy probe (declared cost 0.5 samples). With ``reads=False`` a fallback
    rule serves: ``decide`` reads no probe and its costs leave the probe out, as the real policy's do."""

    def __init__(self, reads=True):
        from isocompute.policy.config import ProbeSpec

        super().__init__(reads=reads, rule="learned" if reads else "uniform")
        self.probe = ProbeSpec(max_tokens=2, cost=0.5, prompt_format="plain")
        self.config = SimpleNamespace(cost_unit="samples", probe=self.probe)

    def decide(self, prompts, budget, *, probe=None):
        assert (probe is not None) == self.reads and (probe is None or len(probe) == len(prompts))
        d = super().decide(prompts, budget)
        paid = 0.5 if self.reads else 0.0
        return replace(d, costs=d.costs + paid, expected_cost=d.expected_cost + paid)


class SlowHTTPEngine(FakeEngine):
    """An engine with the probe feature (``probe_entropy``: value 0.42, 1 token); the probe and the samples
    each take ``delay``."""

    async def probe_entropy(self, prompts, max_tokens):
        from isocompute.engines.probe import ProbeResult

        await asyncio.sleep(self.delay)
        return ProbeResult.of([0.42] * len(prompts), [3] * len(prompts), [1] * len(prompts), "top20")


def test_one_deadline_covers_the_probe_and_the_samples():
    """Was: the probe call and the sampling call each had upstream_timeout_s, so a request could take
    twice its deadline."""
    with make_client(SlowHTTPEngine(delay=0.6), ProbePolicy(), upstream_timeout_s=1.0) as c:
        t0 = time.monotonic()
        r = c.post("/v1/completions", json=completion(budget=4))
        elapsed = time.monotonic() - t0
    assert_openai_error(r, 504)
    assert elapsed < 1.0 + 0.3


def test_a_client_that_disconnects_cancels_its_upstream_call():
    """Was: the request kept waiting on the upstream (and the upstream kept generating) until
    upstream_timeout_s, for a client long gone."""
    engine = FakeEngine(delay=10.0)
    app = create_app(Settings(upstream_timeout_s=30, ready_probe_timeout_s=30), policy=FakePolicy(), engine=engine)
    port = free_port()
    stop = serve_in_thread(app, port)
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=completion("bye", budget=4), timeout=0.5)
        cancelled_after = wait_until(lambda: ["bye"] in engine.cancelled, timeout=3.0)
        assert "499" in httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        stop()
    assert cancelled_after < 1.0


def test_route_mirrors_the_greedy_cap():
    with make_client() as c:
        r = c.post("/v1/route", json={"prompt": "hard", "budget": 4, "temperature": 0})
    assert [(d["k"], d["policy_k"]) for d in r.json()["decisions"]] == [(1, 8)]


def test_probe_values_reach_the_policy():
    with make_client(SlowHTTPEngine(delay=0.0), ProbePolicy()) as c:
        info = c.post("/v1/completions", json=completion(budget=4)).json()["isocompute"]
    assert (info["probe"]["value"], info["probe"]["tokens"]) == (0.42, 1)
    assert info["expected_cost"] == info["k"] + 0.5


def test_a_fallback_rule_pays_for_no_probe():
    """Where the rule serving the budget reads no features (policy.needs_features is False), the probe is
    not called and not charged: the controller sees the samples alone."""
    engine = SlowHTTPEngine(delay=0.0)
    calls = []
    engine.probe_entropy = lambda *a: calls.append(a)  # must not be reached
    with make_client(engine, ProbePolicy(reads=False)) as c:
        info = c.post("/v1/completions", json=completion(budget=4)).json()["isocompute"]
        [ctl] = c.app.state.gateway.controllers._items.values()
    assert calls == [] and info["probe"] is None and info["rule"] == "uniform"
    assert info["expected_cost"] == info["k"] and ctl.state().mean_cost == info["k"]
    with make_client(SlowHTTPEngine(delay=0.0), ProbePolicy()) as c:
        c.post("/v1/completions", json=completion(budget=4))
        [ctl] = c.app.state.gateway.controllers._items.values()
    assert ctl.state().mean_cost == info["k"] + 0.5  # the learned rule's request pays its probe


def test_the_engine_sees_the_requests_deadline():
    """Was: the gateway's deadline only cancelled the engine's call, so the engine could not count the
    timeout against the upstream (see test_engines_http: a hung upstream is shut after a few deadlines)."""
    from isocompute.engines.base import REQUEST_DEADLINE

    seen = []

    class DeadlineEngine(FakeEngine):
        async def generate(self, prompts, n, max_tokens, temperature, seed=None):
            if prompts != ["1 + 1 ="]:
                seen.append(REQUEST_DEADLINE.get() - time.monotonic())
            return await super().generate(prompts, n, max_tokens, temperature, seed)

    with make_client(DeadlineEngine(), upstream_timeout_s=3.0) as c:
        assert c.post("/v1/completions", json=completion(budget=4)).status_code == 200
    assert len(seen) == 1 and 2.0 < seen[0] <= 3.0
    assert REQUEST_DEADLINE.get() is None  # reset after the call
