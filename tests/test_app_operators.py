"""What operators see: the budget controllers' series bounded per caller, dry runs that keep nothing, gauges
read after charging, and ``/metrics`` behind the admin key when asked (issue 23's operator findings)."""

from __future__ import annotations

import re

import pytest
from app_fakes import FakePolicy, completion, make_client
from hypothesis import given, settings
from hypothesis import strategies as st

from isocompute.app.accounting.auth import ApiKeyRecord, hash_key
from isocompute.app.accounting.budget_control import BudgetController, ControllerBank

A, B, ADMIN = "sk-team-a", "sk-team-b", "sk-admin"


def keyed_client(**kw):
    recs = [ApiKeyRecord(name="team-a", sha256=hash_key(A)), ApiKeyRecord(name="team-b", sha256=hash_key(B))]
    return make_client(api_keys=recs, admin_key_sha256=hash_key(ADMIN), **kw)


def bearer(key):
    return {"Authorization": f"Bearer {key}"}


def make():
    return BudgetController(4.0, lo=1.0, hi=16.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 30)), max_size=120),
       st.integers(1, 5), st.integers(1, 12))
def test_the_bank_never_holds_more_than_its_bounds_and_evicts_within_the_caller(seq, per_caller, total):
    evicted = []
    bank = ControllerBank(max_keys=total, max_per_caller=per_caller, on_evict=evicted.append)
    held: dict = {}
    for caller, b in seq:
        key = (caller, float(b), "samples", 64, 32)
        before, n_evicted = set(held), len(evicted)
        ctl = bank.get(key, make)
        assert all(bank.peek(k) is None for k in evicted[n_evicted:])  # told about exactly what went
        held[key] = ctl
        gone = [k for k in held if bank.peek(k) is None]
        for k in gone:
            del held[k]
        assert len(bank) <= total and len(bank) == len(held)
        counts = {c: sum(k[0] == c for k in held) for c in "abc"}
        assert max(counts.values()) <= per_caller
        if key not in before and len(before) < total:  # room overall: only the caller's own keys may go
            assert all(k[0] == caller for k in gone)
        assert sorted(gone) == sorted(evicted[n_evicted:])


def test_one_caller_flooding_budgets_does_not_evict_another_callers_controller():
    with keyed_client(control_max_keys=50, control_max_keys_per_caller=4) as c:
        assert c.post("/v1/completions", json=completion(budget=4), headers=bearer(B)).status_code == 200
        gw = c.app.state.gateway
        [b_key] = [k for k in gw.controllers._items if k[0] == "team-b"]
        b_ctl = gw.controllers.peek(b_key)
        for i in range(60):  # distinct budgets, real requests
            assert c.post("/v1/completions", json=completion(budget=1 + i / 10), headers=bearer(A)).status_code == 200
        assert gw.controllers.peek(b_key) is b_ctl
        assert sum(k[0] == "team-a" for k in gw.controllers._items) == 4
        text = c.get("/metrics").text
    assert len(re.findall(r'^isocompute_internal_budget\{budget_key="team-a:', text, re.M)) == 4


def test_dry_runs_keep_no_controller_and_create_no_series():
    with keyed_client() as c:
        for i in range(200):
            r = c.post("/v1/route", json={"model": "isocompute", "prompt": "hi", "budget": 1 + i / 100},
                       headers=bearer(A))
            assert r.status_code == 200
        assert len(c.app.state.gateway.controllers) == 0
        text = c.get("/metrics").text
    assert "isocompute_internal_budget{" not in text


def test_a_dry_run_reads_the_controller_a_real_request_made():
    with make_client(policy=FakePolicy("none@2"), control_gain=0.5) as c:
        c.post("/v1/completions", json=completion(budget=4))
        internal = c.app.state.gateway.controllers.peek(next(iter(c.app.state.gateway.controllers._items))).internal
        r = c.post("/v1/route", json={"model": "isocompute", "prompt": "hi", "budget": 4}).json()
    assert r["internal_budget"] == pytest.approx(internal) and internal != 4.0  # it moved, and the dry run reads it


def test_the_internal_budget_gauge_is_the_state_after_charging():
    with make_client(policy=FakePolicy("none@2"), control_gain=0.5) as c:
        r = c.post("/v1/completions", json=completion(budget=4)).json()
        text = c.get("/metrics").text
        ctl = c.app.state.gateway.controllers.peek(next(iter(c.app.state.gateway.controllers._items)))
    [gauge] = re.findall(r'^isocompute_internal_budget\{budget_key="anonymous:4samples"\} (\S+)$', text, re.M)
    assert r["isocompute"]["internal_budget"] == 4.0  # what this request was served at
    assert float(gauge) == pytest.approx(ctl.internal) and ctl.internal != 4.0  # the state it left


def test_metrics_behind_the_admin_key():
    with keyed_client(metrics_need_admin_key=True) as c:
        assert c.get("/metrics").status_code == 401
        assert c.get("/metrics", headers=bearer(A)).status_code == 403
        ok = c.get("/metrics", headers=bearer(ADMIN))
    assert ok.status_code == 200 and "isocompute_requests_total" in ok.text
    with keyed_client() as c:  # off by default: Prometheus scrapes without a key
        assert c.get("/metrics").status_code == 200


def test_budgets_share_a_controller_on_a_three_digit_grid():
    with make_client() as c:
        for i in range(100):  # 4.0000 … 4.0198: one grid cell (4.0), then 4.01, 4.02
            assert c.post("/v1/completions", json=completion(budget=4 + i * 2e-4)).status_code == 200
        keys = sorted(k[1] for k in c.app.state.gateway.controllers._items)
    assert keys == [4.0, 4.01, 4.02]


def test_metrics_label_callers_by_their_configured_names_never_by_key():
    with keyed_client() as c:
        for key in (A, B):
            assert c.post("/v1/completions", json=completion(), headers=bearer(key)).status_code == 200
        text = c.get("/metrics").text
    assert 'team-a' in text and 'team-b' in text
    assert A not in text and B not in text and hash_key(A) not in text


def test_the_gateways_own_info_lines_print_at_the_default_log_level(capfd):
    import logging

    from isocompute.cli.serve import log_at

    logger = logging.getLogger("isocompute")
    had = list(logger.handlers)
    log_at("info")  # `isocompute serve`'s default --log-level
    try:
        with make_client() as c:
            assert c.post("/v1/completions", json=completion(frobnicate=1)).status_code == 200
    finally:
        logger.setLevel(logging.NOTSET)
        logger.handlers[:] = had
    assert "ignoring unknown request fields: frobnicate" in capfd.readouterr().err


def test_log_at_writes_to_the_stderr_of_the_moment_not_the_one_it_was_first_called_under(monkeypatch):
    """Issue 29: the handler ``log_at`` installs follows ``sys.stderr``; one bound to the stream of its first call
    kept writing there (a test's closed capture) after stderr was replaced, and a second ``log_at`` added none."""
    import io
    import logging
    import sys

    from isocompute.cli.serve import log_at

    first, now = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    log_at("info")
    monkeypatch.setattr(sys, "stderr", now)
    log_at("info")
    logging.getLogger("isocompute.app").info("after the swap")
    assert "after the swap" in now.getvalue() and first.getvalue() == ""


def test_an_in_process_serve_leaves_no_logging_state_to_the_tests_after_it(tmp_path):
    """Issue 29's ordering, replayed in a child pytest: test_app_pools' in-process ``serve.run`` (which calls
    ``log_at``) and then the default-log-level test above; the logger state must not leak between them."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).parent
    ids = [f"{here / 'test_app_pools.py'}::test_serve_refuses_a_policy_on_a_model_without_a_pool_before_uvicorn_starts",
           f"{__file__}::test_the_gateways_own_info_lines_print_at_the_default_log_level"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here.parent), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                        "-p", "no:xdist", *ids], cwd=here.parent, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "2 passed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
