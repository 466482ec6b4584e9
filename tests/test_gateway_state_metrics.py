"""The metrics a dashboard and its alerts read besides the request counters (app.accounting.metrics): upstream
readiness per pool, the drain, quota store failures (read at scrape time), completion
tokens, each key's asked budget beside its realised mean, and the fixed label sets created at 0."""

from __future__ import annotations

import time

from app_fakes import FakeEngine, FakePolicy, completion
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from isocompute.app.main import create_app
from isocompute.app.settings import Settings


def scrape(c: TestClient) -> dict:
    text = c.get("/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_state_metrics_follow_the_gateway():
    app = create_app(Settings(ready_interval_s=0.5), policy=FakePolicy(), engine=FakeEngine())
    with TestClient(app) as c:
        deadline = time.monotonic() + 10
        while scrape(c).get(("isocompute_upstream_up", (("pool", "default"),))) != 1.0:
            assert time.monotonic() < deadline, "the readiness probe never answered"
            time.sleep(0.05)
        s = scrape(c)
        assert s[("isocompute_draining", ())] == 0 and s[("isocompute_drain_seconds", ())] == 0
        assert s[("isocompute_quota_store_errors_total", ())] == 0
        # created at 0 before anything happened: a dashboard's rate reads 0, not "no data"
        assert s[("isocompute_plan_stops_total", (("reason", "deadline"),))] == 0
        assert s[("isocompute_upstream_errors_total", (("kind", "timeout"), ("pool", "default")))] == 0
        r = c.post("/v1/completions", json=completion(budget=2))
        assert r.status_code == 200, r.text
        s = scrape(c)
        assert s[("isocompute_budget_target", (("budget_key", "anonymous:2samples"),))] == 2
        assert s[("isocompute_completion_tokens_total", ())] == r.json()["usage"]["completion_tokens"] > 0
        app.state.gateway.quotas.errors = 3
        app.state.drain.start()
        time.sleep(0.01)
        s = scrape(c)
        assert s[("isocompute_draining", ())] == 1 and s[("isocompute_drain_seconds", ())] > 0
        assert s[("isocompute_quota_store_errors_total", ())] == 3
        assert ("isocompute_upstream_circuit", ()) not in s  # an in-process engine has no breakers
