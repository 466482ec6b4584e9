"""Route logic of the gateway with small fakes for the policy and the engine (STYLE 14: fakes isolate the
room; tests/test_app_e2e.py runs the real tiny model and a real fitted policy).

The fakes live in ``app_fakes.py`` (shared with test_app_faults.py): the fake policy implements the
ServingPolicy contract and returns decisions in the shape of :class:`isocompute.policy.decision.Decision`; the fake engine
returns scripted completions and records its calls, so each test can check what went upstream.
"""

from __future__ import annotations

import json
import logging
import re

import pytest
from app_fakes import ACTIONS, FakeEngine, FakePolicy, completion, make_client
from fastapi.testclient import TestClient

from isocompute.app.accounting.auth import ApiKeyRecord, hash_key
from isocompute.app.main import create_app
from isocompute.app.settings import Settings
from isocompute.errors import EngineUnavailable


def test_majority_vote_first_choice_carries_the_winner():
    engine = FakeEngine(("so 7.", "The answer is 12. (a)", "12", "The answer is 12. (b)"))
    with make_client(engine) as c:
        r = c.post("/v1/completions", json=completion(budget=8))  # easy prompt: k = 4
    assert r.status_code == 200, r.text
    body = r.json()
    info = body["isocompute"]
    assert engine.calls == [(["What is 5 + 7?"], 4)]  # one upstream call with n = k
    assert info["k"] == 4 and info["action"] == ACTIONS.index(4) and info["answer"] == "12"
    assert info["votes"] == {"7": 1, "12": 3}
    assert body["choices"][0]["text"] == "The answer is 12. (a)"  # the first sample that gave "12"
    assert info["lambda"] == pytest.approx(0.08) and info["partial"] is False
    assert body["usage"]["completion_tokens"] == 20 and body["usage"]["prompt_tokens"] == 10


def test_tie_is_broken_by_first_occurrence_when_asked():
    engine = FakeEngine(("The answer is 3.", "The answer is 9."))
    with make_client(engine, tie_break="first") as c:
        infos = [c.post("/v1/completions", json=completion(budget=4, seed=s)).json()["isocompute"] for s in range(8)]
    assert all(i["votes"] == {"3": 1, "9": 1} and i["answer"] == "3" for i in infos)


def test_ties_are_a_seeded_uniform_pick_by_default():
    """The estimators credit t tied classes 1/t each; a uniform pick is its unbiased online match: both
    tied answers win over seeds, and a seed replays its winner."""
    engine = FakeEngine(("The answer is 3.", "The answer is 9."))
    with make_client(engine) as c:
        won = [c.post("/v1/completions", json=completion(budget=4, seed=s)).json()["isocompute"]["answer"]
               for s in range(16)]
        again = [c.post("/v1/completions", json=completion(budget=4, seed=s)).json()["isocompute"]["answer"]
                 for s in range(16)]
    assert set(won) == {"3", "9"} and won == again


def test_max_samples_is_a_hard_cap():
    engine = FakeEngine()
    with make_client(engine) as c:
        info = c.post("/v1/completions", json=completion("a hard one", budget=8, max_samples=3)).json()["isocompute"]
    assert engine.calls[0][1] == 3
    assert (info["k"], info["policy_k"]) == (3, 16)


def test_batch_prompts_one_upstream_call_per_distinct_k():
    engine = FakeEngine()
    with make_client(engine) as c:
        body = c.post("/v1/completions", json=completion(["easy 1", "hard 2", "easy 3"], budget=4)).json()
    assert sorted((tuple(p), n) for p, n in engine.calls) == [(("easy 1", "easy 3"), 2), (("hard 2",), 8)]
    assert [ch["isocompute"]["k"] for ch in body["choices"]] == [2, 8, 2]
    assert [ch["index"] for ch in body["choices"]] == [0, 1, 2]


def test_partial_answer_votes_over_what_arrived():
    engine = FakeEngine(("The answer is 4.",), drop=1)
    with make_client(engine) as c:
        info = c.post("/v1/completions", json=completion(budget=8)).json()["isocompute"]
    assert info["k"] == 4 and info["samples_received"] == 3 and info["partial"] is True
    assert info["answer"] == "4"


def test_default_budget_and_unknown_fields(caplog):
    policy = FakePolicy()
    with make_client(policy=policy, default_budget=6.0) as c, caplog.at_level(logging.INFO, "isocompute.app"):
        r = c.post("/v1/completions", json=completion(frobnicate=1, top_k=3))
    assert r.status_code == 200 and r.json()["isocompute"]["budget"] == 6.0
    assert "frobnicate" in caplog.text and "top_k" in caplog.text


def test_chat_uses_the_chat_template():
    from isocompute.training.tiny import build_tokenizer

    engine = FakeEngine()
    engine.tokenizer = build_tokenizer()
    with make_client(engine) as c:
        r = c.post("/v1/chat/completions", json={
            "model": "isocompute", "budget": 2,
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}]})
    assert r.status_code == 200, r.text
    prompt = engine.calls[0][0][0]
    assert prompt == "<|system|>Be brief.<|end|><|user|>What is 2+3?<|end|><|assistant|>"
    assert r.json()["choices"][0]["message"] == {"role": "assistant", "content": "The answer is 12."}


def test_policy_sees_the_question_not_the_chat_template():
    # The policy was fitted on outcome tables' bare questions; role markers would shift its features.
    from isocompute.training.tiny import build_tokenizer

    engine, policy = FakeEngine(), FakePolicy()
    engine.tokenizer = build_tokenizer()
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}]
    with make_client(engine, policy) as c:
        r = c.post("/v1/chat/completions", json={"model": "isocompute", "budget": 2, "messages": msgs})
        assert r.status_code == 200, r.text
        r = c.post("/v1/route", json={"model": "isocompute", "budget": 2, "messages": msgs})
        assert r.status_code == 200, r.text
    assert [p for p, _ in policy.calls] == [["What is 2+3?"], ["What is 2+3?"]]
    assert engine.calls[-1][0][0] == "<|system|>Be brief.<|end|><|user|>What is 2+3?<|end|><|assistant|>"


def test_route_is_a_dry_run():
    engine, policy = FakeEngine(), FakePolicy()
    with make_client(engine, policy) as c:
        r = c.post("/v1/route", json={"prompt": ["easy", "hard"], "budget": 4, "max_samples": 4})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [(d["k"], d["policy_k"]) for d in body["decisions"]] == [(2, 2), (4, 8)]
    assert body["internal_budget"] == 4.0 and body["lambda"] == pytest.approx(0.04)
    assert engine.calls == []  # nothing but the readiness probe went upstream


def test_health_ready_models():
    with make_client() as c:
        assert c.get("/health").json() == {"status": "ok"}
        for _ in range(50):
            if c.get("/ready").status_code == 200:
                break
        assert c.get("/ready").json()["ready"] is True
        assert c.get("/v1/models").json()["data"][0]["id"] == "isocompute"


def test_ready_is_503_without_policy():
    s = Settings(ready_probe_timeout_s=1.0)
    with TestClient(create_app(s, engine=FakeEngine())) as c:
        r = c.get("/ready")
        assert r.status_code == 503 and r.json()["policy_loaded"] is False
        r = c.post("/v1/completions", json=completion())
        assert r.status_code == 503 and "no policy loaded" in r.json()["error"]["message"]


def test_budget_control_moves_the_internal_budget():
    # Hard prompts spend 2·b, so the controller must lower b below the budget to stay on 4 samples.
    # At b = 4 the fake policy spends 8; anywhere in [2, 4) it spends 4, which is on budget.
    policy = FakePolicy()
    with make_client(policy=policy) as c:
        ks = [c.post("/v1/completions", json=completion("hard", budget=4)).json()["isocompute"]["k"]
              for _ in range(30)]
        no_control = make_client(policy=FakePolicy(), budget_control=False)
        with no_control as c2:
            ks_fixed = [c2.post("/v1/completions", json=completion("hard", budget=4)).json()["isocompute"]["k"]
                        for _ in range(5)]
    budgets = [b for p, b in policy.calls if p == ["hard"]]
    assert budgets[0] == 4.0 and 2.0 <= budgets[-1] < 4.0
    assert ks[0] == 8 and set(ks[10:]) == {4}
    assert ks_fixed == [8] * 5


def test_metrics_are_exported():
    with make_client() as c:
        c.post("/v1/completions", json=completion(budget=4))
        c.post("/v1/completions", json=completion(budget=-1))
        text = c.get("/metrics").text
    for needle in ('isocompute_requests_total{route="/v1/completions",status="200"} 1.0',
                   'isocompute_requests_total{route="/v1/completions",status="422"} 1.0',
                   "isocompute_request_latency_seconds_bucket", "isocompute_k_chosen_bucket",
                   "isocompute_samples_total 2.0", 'isocompute_lambda{budget_key="anonymous:4samples"}',
                   'isocompute_internal_budget{budget_key="anonymous:4samples"}',
                   "isocompute_policy_decision_seconds_count 1.0",
                   'isocompute_upstream_latency_seconds_count{pool="default"} 1.0'):
        assert needle in text, needle


def test_two_apps_have_separate_registries():
    with make_client() as a, make_client() as b:
        a.post("/v1/completions", json=completion(budget=4))
        assert "isocompute_samples_total 2.0" in a.get("/metrics").text
        assert "isocompute_samples_total 0.0" in b.get("/metrics").text


BAD_REQUESTS = [
    # (path, body (dict, or raw str sent as-is), status, message fragment)
    ("/v1/completions", '{"model": "isocompute", "prompt": ', 400, "not valid JSON"),
    ("/v1/completions", completion(budget=-1), 422, "budget: Input should be greater than 0"),
    ("/v1/completions", '{"model": "isocompute", "prompt": "x", "budget": NaN}', 422, "budget: Input should be a finite"),
    ("/v1/completions", completion(budget=1e300), 400, "exceeds this server's max_budget"),
    ("/v1/completions", completion(budget=20), 400, r"outside the policy's calibrated range \[1, 16\]"),
    ("/v1/completions", completion(budget=0.5), 400, "outside the policy's calibrated range"),
    ("/v1/completions", completion(max_samples=0), 422, "max_samples: Input should be greater than or equal to 1"),
    ("/v1/completions", completion(budget_unit="joules"), 422, "budget_unit"),
    ("/v1/completions", completion(budget=4, budget_unit="tokens"), 400,
     r"budget 4 tokens \(≈ 0.0156 samples\) is outside the policy's calibrated range \[1, 16\] samples"),
    ("/v1/completions", completion(budget="4x"), 400, "is for a policy whose cost unit is tokens; this policy's "
                                                      "budgets are in samples: send a number"),
    ("/v1/completions", completion(budget="4y"), 422, "budget: Input should be a positive number, or a positive "
                                                      "number followed by x"),
    ("/v1/completions", completion(budget="0x"), 422, "budget: Input should be a positive number"),
    ("/v1/completions", completion(budget="4x", budget_unit="flops"), 400, "so it is in tokens; drop budget_unit"),
    ("/v1/completions", completion(latency_budget=2), 400, "fitted without latency budgets; drop latency_budget"),
    ("/v1/completions", completion(latency_budget=0), 422, "latency_budget: Input should be greater than 0"),
    ("/v1/completions", completion(latency_budget="fast"), 422, "latency_budget: Input should be a valid number"),
    ("/v1/route", {"prompt": "x", "latency_budget": 2}, 400, "fitted without latency budgets"),
    ("/v1/completions", {**completion(), "model": "gpt-4o"}, 404, "model 'gpt-4o' is not served here"),
    ("/v1/completions", completion("x" * 40_000), 400, "40000 characters; the limit is 32000"),
    ("/v1/completions", completion(""), 400, "prompt 0 is empty"),
    ("/v1/completions", completion([]), 400, "prompt is empty"),
    ("/v1/completions", completion([1, 2, 3]), 400, "token-id prompts are not supported"),
    ("/v1/completions", completion(["a"] * 40), 400, "send at most 32"),
    ("/v1/completions", completion(stream=True, stream_options={"include_usage": "yes"}), 400,
     "stream_options.include_usage must be true or false"),
    ("/v1/completions", completion(n=3), 400, "one aggregated choice"),
    ("/v1/completions", completion(max_tokens=10**6), 400, "max_tokens=1000000 exceeds"),
    ("/v1/completions", completion(temperature=5), 422, "temperature"),
    ("/v1/completions", completion(strategy="best_of"), 400, "needs a verifier"),
    ("/v1/completions", completion(budget=1e6, budget_unit="flops"), 400, "needs the model's config"),
    ("/v1/completions", {"prompt": "x"}, 422, "model: Field required"),
    ("/v1/chat/completions", {"model": "isocompute", "messages": []}, 422, "messages: List should have at least 1"),
    ("/v1/chat/completions", {"model": "isocompute", "messages": [{"role": "user", "content": "hi"}]}, 400,
     "no tokenizer"),
    ("/v1/route", {"budget": 4}, 400, "exactly one of prompt"),
    ("/v1/nope", {}, 404, "no route POST /v1/nope"),
]


@pytest.mark.parametrize(("path", "body", "status", "match"), BAD_REQUESTS)
def test_bad_input_is_4xx_with_a_fix(path, body, status, match):
    with make_client() as c:
        if isinstance(body, str):
            r = c.post(path, content=body, headers={"Content-Type": "application/json"})
        else:
            r = c.post(path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert re.search(match, err["message"]), err["message"]


@pytest.mark.parametrize(
    ("engine", "status", "match"),
    [
        (FakeEngine(fail=EngineUnavailable("upstream down; start it")), 503, "upstream down"),
        (FakeEngine(delay=3.0), 504, "did not answer within 0.3 s"),
        (FakeEngine(wrong_count=True), 502, "returned 0 results for 1 prompts"),
        (FakeEngine(drop=100), 502, "no usable sample"),
    ],
)
def test_upstream_faults(engine, status, match):
    with make_client(engine, upstream_timeout_s=0.3) as c:
        r = c.post("/v1/completions", json=completion(budget=4))
        assert r.status_code == status, r.text
        assert r.headers["Retry-After"] == "5"
        assert re.search(match, r.json()["error"]["message"])
        assert "isocompute_upstream_errors_total" in c.get("/metrics").text


def test_recovers_when_the_upstream_comes_back():
    engine = FakeEngine(fail=EngineUnavailable("down"))
    with make_client(engine) as c:
        assert c.post("/v1/completions", json=completion(budget=4)).status_code == 503
        engine.fail = None
        assert c.post("/v1/completions", json=completion(budget=4)).status_code == 200


KEY, ADMIN = "sk-team-a", "sk-admin"


def auth_client(**kw):
    rec = ApiKeyRecord(name="team-a", sha256=hash_key(KEY), max_budget=8, rate_per_s=1, burst=3)
    return make_client(api_keys=[rec], admin_key_sha256=hash_key(ADMIN), **kw)


@pytest.mark.parametrize(
    ("headers", "body", "status", "match"),
    [
        ({}, completion(budget=4), 401, "missing API key"),
        ({"Authorization": "Bearer nope"}, completion(budget=4), 401, "unknown API key"),
        ({"Authorization": f"Bearer {KEY}"}, completion(budget=12), 403, "exceeds the maximum 8"),
        ({"Authorization": f"Bearer {KEY}"}, completion(budget=4), 200, ""),
    ],
)
def test_api_keys(headers, body, status, match):
    with auth_client() as c:
        r = c.post("/v1/completions", json=body, headers=headers)
    assert r.status_code == status, r.text
    if match:
        assert match in r.json()["error"]["message"]


def test_rate_limit_token_bucket():
    with auth_client() as c:
        h = {"Authorization": f"Bearer {KEY}"}
        codes = [c.post("/v1/route", json={"prompt": "x", "budget": 2}, headers=h).status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]
        r = c.post("/v1/route", json={"prompt": "x", "budget": 2}, headers=h)
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        assert "rate limit of 1 requests/s" in r.json()["error"]["message"]


def test_admin_reload(tmp_path):
    with auth_client() as c:
        assert c.post("/admin/reload").status_code == 401
        assert c.post("/admin/reload", headers={"Authorization": f"Bearer {KEY}"}).status_code == 403
        r = c.post("/admin/reload", json={"policy_dir": str(tmp_path / "none")},
                   headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 400 and "cannot reload" in r.json()["error"]["message"]


def test_token_bucket_worked_example():
    from isocompute.app.accounting.auth import TokenBucket

    t = [0.0]
    b = TokenBucket(rate=2, burst=2, clock=lambda: t[0])
    assert (b.take(), b.take()) == (0.0, 0.0)
    assert b.take() == pytest.approx(0.5)
    t[0] = 0.5
    assert b.take() == 0.0


def test_key_file(tmp_path):
    from isocompute.app.accounting.auth import load_key_file
    from isocompute.errors import InputError

    f = tmp_path / "keys.json"
    f.write_text(json.dumps({"keys": [{"name": "a", "sha256": hash_key("k"), "max_budget": 4}]}))
    assert load_key_file(f)[0].max_budget == 4
    f.write_text(json.dumps([{"name": "a", "sha256": "k"}]))
    with pytest.raises(InputError, match="64-character hex digest"):
        load_key_file(f)





# ---- a tokens-unit policy with latency budgets (a small real fit) ------------------------------------------

TWO = ["What is 12 + 7 * 3?", "What is 345 * 12 - 7?"]


@pytest.fixture(scope="module")
def tokens_policy():
    from app_fakes import fit_tokens_policy

    return fit_tokens_policy()


def test_latency_budget_reaches_the_policy_and_is_reported(tokens_policy):
    p, L = tokens_policy, 1.0
    b = 4 * p.tokens_per_sample_
    with make_client(policy=p, budget_control=False) as c:
        r = c.post("/v1/completions", json=completion(TWO, budget="4x", latency_budget=L))
        route = c.post("/v1/route", json={"prompt": TWO, "budget": "4x", "latency_budget": L})
    assert r.status_code == 200 and route.status_code == 200, (r.text, route.text)
    ref = p.decide(TWO, b, latency_budget=L)
    assert ref.action_index.tolist() != p.decide(TWO, b).action_index.tolist()  # L changes the plans here
    infos = [ch["isocompute"] for ch in r.json()["choices"]]
    assert [i["action"] for i in infos] == ref.action_index.tolist()
    assert [i["latency_budget"] for i in infos] == [L, L]
    assert [i["expected_latency"] for i in infos] == pytest.approx(ref.expected_latency.tolist())
    body = route.json()
    assert [d["action"] for d in body["decisions"]] == ref.action_index.tolist()
    assert [d["expected_latency"] for d in body["decisions"]] == pytest.approx(ref.expected_latency.tolist())
    assert body["latency_budget"] == L and body["expected_latency"] == pytest.approx(float(ref.expected_latency.mean()))


def test_without_a_latency_budget_decisions_are_unchanged(tokens_policy):
    p = tokens_policy
    with make_client(policy=p, budget_control=False) as c:
        body = c.post("/v1/route", json={"prompt": TWO, "budget": "4x"}).json()
    ref = p.decide(TWO, 4 * p.tokens_per_sample_)
    assert [d["action"] for d in body["decisions"]] == ref.action_index.tolist()
    assert [d["expected_cost"] for d in body["decisions"]] == ref.costs.tolist()
    assert body["latency_budget"] is None and body["expected_latency"] is None
    assert all(d["expected_latency"] is None for d in body["decisions"])


def test_a_latency_budget_outside_the_range_is_a_400_naming_it(tokens_policy):
    with make_client(policy=tokens_policy) as c:
        r = c.post("/v1/completions", json=completion(budget="4x", latency_budget=5))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "latency_budget" and err["code"] == "invalid_budget"
    assert re.search(r"latency budget 5 is outside the range \[1, 2\] mean sample lengths", err["message"])


def test_a_multiple_is_tokens_of_one_mean_sample_and_a_number_is_samples(tokens_policy):
    p = tokens_policy
    t = p.tokens_per_sample_
    with make_client(policy=p, budget_control=False) as c:
        x = c.post("/v1/completions", json=completion(budget="4x")).json()["isocompute"]
        n = c.post("/v1/completions", json=completion(budget=4)).json()["isocompute"]
        tok = c.post("/v1/route", json={"prompt": "What is 2 + 2?", "budget": 4 * t, "budget_unit": "tokens"}).json()
    assert (x["budget"], x["budget_unit"], x["budget_written"]) == (pytest.approx(4 * t), "tokens", "4x")
    assert x["policy_unit"] == "tokens" and x["internal_budget"] == pytest.approx(4 * t)
    assert (n["budget"], n["budget_unit"], n["budget_written"]) == (4.0, "samples", None)
    assert n["internal_budget"] == pytest.approx(4 * t)  # 4 samples of the policy's mean sample
    assert (tok["budget_unit"], tok["budget_written"], tok["internal_budget"]) == ("tokens", None, pytest.approx(4 * t))


def _mean_cost(metrics: str, unit: str) -> float:
    [v] = [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
           if line.startswith("isocompute_mean_cost{") and f'{unit}"' in line]
    return v


def test_a_tokens_budget_is_charged_the_completion_tokens_generated(tokens_policy):
    engine = FakeEngine(("The answer is 33.", "The answer is 34."))  # every sample: 5 completion tokens
    with make_client(engine, policy=tokens_policy) as c:
        x = c.post("/v1/completions", json=completion(TWO[0], budget="4x")).json()
        assert _mean_cost(c.get("/metrics").text, "tokens") == x["usage"]["completion_tokens"] == 5 * x["isocompute"]["k"]
        n = c.post("/v1/completions", json=completion(TWO[0], budget=4)).json()
        assert _mean_cost(c.get("/metrics").text, "samples") == n["isocompute"]["k"]  # a samples budget: samples


def test_chat_takes_a_multiple_and_a_latency_budget(tokens_policy):
    from isocompute.training.tiny import build_tokenizer

    engine = FakeEngine()
    engine.tokenizer = build_tokenizer()
    with make_client(engine, tokens_policy) as c:
        r = c.post("/v1/chat/completions", json={"model": "isocompute", "budget": "2x", "latency_budget": 1.5,
                                                 "messages": [{"role": "user", "content": "What is 2+3?"}]})
    assert r.status_code == 200, r.text
    info = r.json()["isocompute"]
    assert info["budget_written"] == "2x" and info["latency_budget"] == 1.5 and info["expected_latency"] is not None
