"""Refit: captured shards → a policy under the consensus target, compared with the serving one on held-out
captured prompts, written only where not worse; the cold-start plans a gateway without a policy serves; and a
reload under load that drops no request and answers none twice."""

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from app_fakes import FakeEngine, completion, serve_in_thread

from isocompute.app.main import create_app
from isocompute.app.runner.capture import ShardWriter
from isocompute.app.settings import Settings
from isocompute.errors import InputError
from isocompute.policy.cold_start import COLD_START, ColdStartPolicy
from isocompute.policy.loading import load_policy
from isocompute.stages.refit import RefitConfig, refit


def capture_dir(path, n=90, seed=0, samples=8, torn=True):
    """Shards as the gateway writes them: easy prompts agree, hard ones scatter; one torn last line."""
    rng = np.random.default_rng(seed)
    w = ShardWriter(path, max_bytes=1 << 20)
    for i in range(n):
        p = 0.3 + 0.65 * rng.random()
        words = " ".join(["hard"] * int(10 * (1 - p)) + ["easy"] * int(10 * p))
        ans = [("7" if rng.random() < p else str(rng.integers(0, 5))) for _ in range(samples)]
        w.write({"id": f"r{i}", "prompt": f"question {i}: {words}?", "prompt_tokens": 12,
                 "samples": [{"answer": a, "class": None, "completion_tokens": int(rng.integers(50, 200)), "finish": j}
                             for j, a in enumerate(ans)],
                 "meta": {"answer_kind": "number", "plan": "none@1", "source": "capture"}})
    w.close()
    if torn:
        with open(w.path, "ab") as f:
            f.write(b'{"prompt": "cut')
    return path


@pytest.fixture(scope="module")
def refitted(tmp_path_factory):
    d = tmp_path_factory.mktemp("refit")
    cap = capture_dir(d / "cap")
    res = refit(RefitConfig(capture=cap, out=d / "policy", actions=(1, 2, 4, 8), n_rounds=5, budgets=[2.0, 4.0]))
    return d, res


def test_refit_fits_under_consensus_compares_and_writes(refitted):
    d, res = refitted
    assert res.target == "consensus" and res.prompts == 90 and res.rows == 90
    assert any("torn last line" in n for n in res.notes)
    assert [c["budget"] for c in res.compare] == [2.0, 4.0]
    for c in res.compare:
        assert 0 < c["new"]["accuracy"] <= 1 and 0 < c["serving"]["accuracy"] <= 1
    # the prompts' text says which are hard: the learned policy beats the cold start at matched tokens
    assert res.written and "not worse: written" in res.notes[-1] and all(c["gain"] > 0 for c in res.compare)
    table = d / "cap" / "captured.jsonl"
    assert os.stat(table).st_mode & 0o777 == 0o600 and len(table.read_text().splitlines()) == 90
    pol = load_policy(d / "policy")
    assert pol.config.target == "consensus" and pol.config.cost_unit == "tokens"


def test_a_second_refit_holds_out_only_prompts_the_serving_policy_never_saw(refitted, tmp_path):
    d, _ = refitted
    assert len(load_policy(d / "policy").training_data_["captured_prompts"]) == 90
    with pytest.raises(InputError, match="only 0 captured prompts are new to the serving policy"):
        refit(RefitConfig(capture=d / "cap", out=tmp_path / "p2", policy=d / "policy", actions=(1, 2, 4, 8)))


def test_refit_refuses_too_little_traffic(tmp_path, capsys):
    from isocompute.cli import main

    cap = capture_dir(tmp_path / "cap", n=10, torn=False)
    assert main(["refit", str(cap), "--out", str(tmp_path / "p"), "--actions", "1,2,4,8"]) == 2
    assert "refit needs at least 20" in capsys.readouterr().err
    with pytest.raises(InputError, match="refit needs at least 20"):
        refit(RefitConfig(capture=cap, out=tmp_path / "p", actions=(1, 2, 4, 8)))
    with pytest.raises(InputError, match="capture directory .* does not exist"):
        refit(RefitConfig(capture=tmp_path / "nowhere", out=tmp_path / "p"))


def test_cold_start_plans_by_budget():
    pol = ColdStartPolicy(100.0)
    assert pol.budget_range == (100.0, 1600.0) and pol.cost_unit == "tokens"
    d = pol.decide(["a", "b"], 400.0)  # 4x
    assert [p.name for p in d.plans] == [COLD_START[4.0][0]] * 2 and d.rule == "cold_start"
    assert pol.decide(["a"], 50.0).plans[0].name == "none@1"  # below the grid: its smallest plan
    assert pol.decide(["a"], 1000.0).plans[0].name == COLD_START[8.0][0]  # 10x: the largest grid budget below
    with pytest.raises(InputError, match="tokens_per_sample must be > 0"):
        ColdStartPolicy(0)


def test_a_capturing_gateway_without_a_policy_serves_the_cold_start(tmp_path):
    app = create_app(Settings(upstream_timeout_s=5.0, ready_probe_timeout_s=1.0, capture_dir=tmp_path / "cap",
                              cold_start_sample_tokens=5.0), policy=None, engine=FakeEngine())
    from fastapi.testclient import TestClient

    with TestClient(app) as c:
        r = c.post("/v1/completions", json=completion(budget="4x")).json()
    assert r["isocompute"]["rule"] == "cold_start" and r["isocompute"]["policy_plan"] == COLD_START[4.0][0]
    bare = create_app(Settings(upstream_timeout_s=5.0, ready_probe_timeout_s=1.0), policy=None, engine=FakeEngine())
    with TestClient(bare) as c:  # no capture, no cold_start: as before, 503 until a reload
        assert c.post("/v1/completions", json=completion()).status_code == 503


def test_reload_under_load_drops_nothing_and_answers_once(refitted):
    d, res = refitted
    import hashlib

    admin = "adm1n"
    s = Settings(upstream_timeout_s=10.0, ready_probe_timeout_s=2.0, policy_dir=d / "policy",
                 admin_key_sha256=hashlib.sha256(admin.encode()).hexdigest())
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    stop = serve_in_thread(create_app(s, engine=FakeEngine(lengths=(60, 90, 120))), port)
    url = f"http://127.0.0.1:{port}"
    done = threading.Event()
    try:
        def send(i):
            with httpx.Client(timeout=30) as cl:
                r = cl.post(url + "/v1/completions", json=completion(f"What is {i} + 7?", budget="2x", seed=i))
                return r.status_code, r.json().get("id")

        def reload_loop():
            n = 0
            with httpx.Client(timeout=60) as cl:
                while not done.is_set():
                    r = cl.post(url + "/admin/reload", json={"policy_dir": str(d / "policy")},
                                headers={"Authorization": f"Bearer {admin}"})
                    assert r.status_code == 200, r.text
                    n += 1
            return n

        with ThreadPoolExecutor(9) as ex:
            reloads = ex.submit(reload_loop)
            got = list(ex.map(send, range(120)))
            done.set()
            n_reloads = reloads.result()
    finally:
        done.set()
        stop()
    assert n_reloads >= 1
    assert [code for code, _ in got] == [200] * 120, "no request dropped across the reloads"
    assert len({rid for _, rid in got}) == 120, "every request answered once"
    assert json.loads((d / "policy" / "policy.json").read_text())["config"]["target"] == "consensus"


def test_the_loop_cold_start_capture_refit_reload(tmp_path):
    """serve with capture (no policy: the cold start) → traffic → refit → reload → the fitted policy serves."""
    import hashlib

    from fastapi.testclient import TestClient

    prompts = [f"question {i}: " + ("hard " * 6 if i % 2 else "easy ") for i in range(40)]
    script = {p: (["The answer is 7."] * 3 + ["The answer is 5."] if i % 2 == 0 else
                  ["The answer is 1.", "The answer is 2.", "The answer is 3.", "The answer is 2."])
              for i, p in enumerate(prompts)}
    admin = "adm1n"
    cap = tmp_path / "cap"
    s = Settings(upstream_timeout_s=10.0, ready_probe_timeout_s=1.0, capture_dir=cap, explore=1.0, capture_samples=8,
                 capture_prompts=True, cold_start_sample_tokens=5.0,
                 admin_key_sha256=hashlib.sha256(admin.encode()).hexdigest())
    with TestClient(create_app(s, policy=None, engine=FakeEngine(script, lengths=(4, 6, 5, 7)))) as c:
        for p in prompts:
            r = c.post("/v1/completions", json=completion(p, budget="4x"))
            assert r.status_code == 200 and r.json()["isocompute"]["rule"] == "cold_start"
        gw = c.app.state.gateway
        while gw.capture.tasks:
            threading.Event().wait(0.02)
        res = refit(RefitConfig(capture=cap, out=tmp_path / "policy", actions=(1, 2, 4, 8), n_rounds=5,
                                budgets=[2.0, 4.0], force=True))
        assert res.written and res.prompts == 40 and res.target == "consensus"
        r = c.post("/admin/reload", json={"policy_dir": str(tmp_path / "policy")},
                   headers={"Authorization": f"Bearer {admin}"})
        assert r.status_code == 200, r.text
        after = c.post("/v1/completions", json=completion(prompts[0], budget="4x")).json()
    assert after["isocompute"]["rule"] != "cold_start"
