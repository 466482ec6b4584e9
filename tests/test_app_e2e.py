"""The gateway end to end with real components: the in-process transformers engine on the tiny model
(random weights, saved with ``training.tiny.save_tiny``) and a real LightGBM policy fitted on synthetic
arithmetic outcomes, served by uvicorn on 127.0.0.1 in a thread.

* the official ``openai`` client works unchanged (``extra_body={"budget": 4}``), errors included;
* ``usage.flops`` is the analytic FLOP count of what was generated;
* ``/ready`` and ``/metrics`` after real traffic;
* Schemathesis against the app's own OpenAPI document finds no 5xx (bounded: a few examples per route);
* online budget control with the real policy on traffic that shifts from easy to hard.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time

import httpx
import numpy as np
import pytest

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    from isocompute.policy.policy import Policy
    from isocompute.policy.synthetic import synthetic_records
    from isocompute.solver.outcomes import from_records

    table = from_records(synthetic_records(500, 16, seed=0))
    policy = Policy(learner="utility", n_rounds=40, n_components=8).fit(table)
    return policy.save(tmp_path_factory.mktemp("policy") / "policy")


@pytest.fixture(scope="module")
def server(tiny_dir, policy_dir):
    import uvicorn

    from isocompute.app.main import create_app
    from isocompute.app.settings import Settings

    # Small limits keep every generation short on CPU (k ≤ 4 samples of ≤ 16 tokens).
    s = Settings(policy_dir=policy_dir, engine="transformers", model_dir=tiny_dir, max_samples=4,
                 default_max_tokens=8, max_tokens_limit=16, max_prompt_chars=400, upstream_timeout_s=60)
    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(s), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    else:
        srv.should_exit = True
        pytest.fail("gateway did not become ready within 120 s")
    yield url
    srv.should_exit = True
    thread.join(timeout=30)


def test_openai_client_works_unchanged(server):
    import openai

    client = openai.OpenAI(base_url=f"{server}/v1", api_key="not-needed", max_retries=0)
    chat = client.chat.completions.create(
        model="isocompute", messages=[{"role": "user", "content": "What is 2 + 3?"}], max_tokens=8,
        extra_body={"budget": 4},
    )
    assert chat.object == "chat.completion" and isinstance(chat.choices[0].message.content, str)
    info = chat.model_extra["isocompute"]
    assert 1 <= info["k"] <= 4 and info["budget"] == 4 and info["lambda"] is not None
    assert sum(info["votes"].values()) <= info["k"] == info["samples_received"]
    assert chat.usage.model_extra["flops"] > 0

    comp = client.completions.create(model="isocompute", prompt=["What is 12 + 30?", "What is 7 * 8?"],
                                     max_tokens=8, extra_body={"budget": 2, "max_samples": 2})
    assert [c.index for c in comp.choices] == [0, 1]
    assert all(c.model_extra["isocompute"]["k"] <= 2 for c in comp.choices)

    with pytest.raises(openai.BadRequestError, match="outside the policy's calibrated range"):
        client.completions.create(model="isocompute", prompt="x", extra_body={"budget": 40})
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.completions.create(model="gpt-4o", prompt="x")


def test_usage_flops_is_the_analytic_count(server, tiny_dir):
    from isocompute.flops import load_model_flops, request_flops

    r = httpx.post(f"{server}/v1/completions", timeout=60, json={
        "model": "isocompute", "prompt": "What is 4 + 4?", "max_tokens": 6, "budget": 4, "max_samples": 1})
    assert r.status_code == 200, r.text
    u = r.json()["usage"]
    expected = request_flops(load_model_flops(tiny_dir), u["prompt_tokens"], [u["completion_tokens"]])
    assert u["flops"] == pytest.approx(expected) and u["prompt_tokens"] == len("What is 4 + 4?") + 1


def test_flop_budget_is_converted_and_served(server):
    r = httpx.post(f"{server}/v1/completions", timeout=60, json={
        "model": "isocompute", "prompt": "What is 4 + 4?", "max_tokens": 8, "budget": 1.5e8, "budget_unit": "flops"})
    assert r.status_code == 200, r.text
    info = r.json()["isocompute"]
    assert info["budget_unit"] == "flops" and info["flops"] > 0 and 1 <= info["internal_budget"] <= 16


def test_ready_and_metrics_after_real_traffic(server):
    assert httpx.get(f"{server}/ready").json() == {
        "ready": True, "policy_loaded": True, "upstream_answered": True, "engine": "transformers", "detail": None,
        "saturated": False, "inflight": 0}
    text = httpx.get(f"{server}/metrics").text
    for name in ("isocompute_requests_total", "isocompute_request_latency_seconds_bucket",
                 "isocompute_k_chosen_bucket", "isocompute_samples_total", "isocompute_flops_total",
                 "isocompute_lambda{", "isocompute_policy_decision_seconds_bucket"):
        assert name in text, name
    flops = [float(line.split()[-1]) for line in text.splitlines() if line.startswith("isocompute_flops_total")]
    assert flops and flops[0] > 0


def test_schemathesis_finds_no_server_errors(server):
    """Fuzz every operation of the app's own OpenAPI document with valid and invalid data; any 5xx fails, and
    so does a response its schema does not declare — its status, content type or body (bounded: 10 examples
    per operation and mode)."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import (
        content_type_conformance,
        not_a_server_error,
        response_schema_conformance,
        status_code_conformance,
    )

    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]

    schema = schemathesis.openapi.from_url(f"{server}/openapi.json")
    failures, calls = [], []
    operations = [result.ok() for result in schema.get_all_operations()]
    for operation, mode in itertools.product(operations, schemathesis.GenerationMode):
        if mode == schemathesis.GenerationMode.NEGATIVE and operation.method.upper() == "GET":
            continue  # no parameters to break


        @settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=mode))
        def fuzz(case):
            response = case.call_and_validate(base_url=server, checks=checks, timeout=60)
            calls.append((case.operation.label, response.status_code))

        try:
            fuzz()
        except Exception as e:  # collect every operation's failures before failing
            failures.append(f"{operation.label} ({mode.value}): {e}")
    assert not failures, "\n\n".join(failures)
    labels = {label for label, _ in calls}
    assert {"POST /v1/chat/completions", "POST /v1/completions", "POST /v1/route"} <= labels
    assert len(calls) >= 5 * len(operations) and all(code < 500 for _, code in calls)
    from collections import Counter

    print(f"\nschemathesis: {len(calls)} calls, statuses {dict(sorted(Counter(c for _, c in calls).items()))}")


def test_budget_control_with_the_real_policy_on_drifting_traffic(policy_dir):
    """Synthetic arithmetic traffic that shifts from easy (p ≥ 0.5) to hard (p < 0.5) questions after 400
    requests: the real policy at a fixed budget drifts off it; the controller keeps the mean on it."""
    from isocompute.app.accounting.budget_control import BudgetController
    from isocompute.policy.policy import Policy
    from isocompute.policy.synthetic import synthetic_records

    policy = Policy.load(policy_dir)
    recs = synthetic_records(6000, 1, seed=7)
    easy = [r["prompt"] for r in recs if r["meta"]["p_correct"] >= 0.5][:400]
    hard = [r["prompt"] for r in recs if r["meta"]["p_correct"] < 0.5][:1600]
    assert len(easy) == 400 and len(hard) == 1600
    traffic = easy + hard
    budget = 4.0
    fixed = float(np.mean([int(policy.decide([p], budget).k[0]) for p in traffic]))
    ctl = BudgetController(budget, lo=policy.budget_range[0], hi=policy.budget_range[1], gain=0.05)
    spent = []
    for p in traffic:
        k = int(policy.decide([p], ctl.internal).k[0])
        spent.append(k)
        ctl.observe(k)
    controlled = float(np.mean(spent))
    print(f"\nreal policy, budget {budget}: controlled {controlled:.3f} samples/request "
          f"({controlled / budget - 1:+.2%}), fixed λ {fixed:.3f} ({fixed / budget - 1:+.2%})")
    assert abs(controlled / budget - 1) <= 0.03
    assert abs(fixed / budget - 1) >= 0.10


def test_admin_reload_swaps_in_a_real_policy(tiny_dir, policy_dir):
    from fastapi.testclient import TestClient

    from isocompute.app.accounting.auth import hash_key
    from isocompute.app.main import create_app
    from isocompute.app.settings import Settings

    s = Settings(policy_dir=policy_dir, engine="transformers", model_dir=tiny_dir, admin_key_sha256=hash_key("adm"))
    with TestClient(create_app(s)) as c:
        before = c.post("/v1/route", json={"prompt": "What is 1 + 2?", "budget": 4}).json()
        r = c.post("/admin/reload", headers={"Authorization": "Bearer adm"})
        assert r.status_code == 200 and r.json() == {"reloaded": True, "policy_dir": str(policy_dir)}
        after = c.post("/v1/route", json={"prompt": "What is 1 + 2?", "budget": 4}).json()
        assert after["decisions"] == before["decisions"] and after["internal_budget"] == 4.0
        assert c.post("/admin/reload", headers={"Authorization": "Bearer nope"}).status_code == 401


def test_concurrent_requests_all_succeed(server):
    """64 requests from 32 concurrent clients on the batched in-process engine: every one answers 200
    (the engine's worker thread and the gateway's token counting never share a tokenizer)."""
    import asyncio

    async def go():
        async with httpx.AsyncClient(base_url=server, timeout=300) as client:
            sem = asyncio.Semaphore(32)

            async def one(i):
                async with sem:
                    if i % 2:
                        body = {"model": "isocompute", "budget": 4,
                                "messages": [{"role": "user", "content": f"What is {i} + {2 * i}?"}]}
                        return (await client.post("/v1/chat/completions", json=body)).status_code
                    body = {"model": "isocompute", "prompt": f"What is {i} * 3?\n", "budget": 8}
                    return (await client.post("/v1/completions", json=body)).status_code

            return await asyncio.gather(*(one(i) for i in range(64)))

    assert asyncio.run(go()) == [200] * 64


@pytest.fixture(scope="module")
def plan_policy():
    """A real policy over plans: the lead family's menu (60 plans with the uniform ladder), fitted in ~3 s.
    On these synthetic outcomes its never-worse chain serves the learned rule at budget 2, the fixed plan
    at 4 and uniform at 8, so the three budgets below see all three rules."""
    from isocompute.policy.plans.menu import resolve_plans
    from isocompute.policy.policy import Policy
    from isocompute.policy.synthetic import synthetic_records
    from isocompute.solver.outcomes import from_records

    menu = tuple(p.name for p in resolve_plans("lead", (1, 2, 4, 8, 16)))
    return Policy(learner="utility", n_rounds=20, n_components=8, plans=menu).fit(
        from_records(synthetic_records(400, 16, seed=0)))


def test_a_fitted_plan_policy_runs_its_plans_as_waves(tiny_dir, plan_policy):
    """The real fitted Policy's plans through the gateway on the real tiny model: each response runs the
    plan the policy decided (its name, waves, samples), reports the chain's rule with its evidence, and
    the controller is charged the samples drawn."""
    from fastapi.testclient import TestClient

    from isocompute.app.main import create_app
    from isocompute.app.settings import Settings

    s = Settings(engine="transformers", model_dir=tiny_dir, default_max_tokens=4, max_tokens_limit=8,
                 budget_control=False)
    prompts = ["What is 2 + 3?", "What is 123 * 45 - 67?"]
    rules, drawn = set(), []
    with TestClient(create_app(s, policy=plan_policy)) as c:
        for budget in (2.0, 4.0, 8.0):
            body = c.post("/v1/completions", json={"model": "isocompute", "prompt": prompts, "budget": budget,
                                                   "seed": 3}).json()
            d = plan_policy.decide(prompts, budget)
            for choice, plan, es in zip(body["choices"], d.plans, d.expected_samples, strict=True):
                info = choice["isocompute"]
                assert info["policy_plan"] == info["plan"] == plan.name and info["policy_k"] == plan.max_samples
                assert info["waves"] == len(info["wave_sizes"]) and info["k"] == sum(info["wave_sizes"])
                assert info["wave_sizes"] == list(plan.waves[:info["waves"]]) and info["k"] <= plan.max_samples
                assert info["stopped"] in (("rule",) if info["k"] < plan.max_samples else ("rule", "plan_end"))
                assert info["expected_samples"] == pytest.approx(es)
                assert info["rule"] == d.rule and info["rule_evidence"] == d.rule_evidence
                drawn.append(info["k"])
            rules.add(d.rule)
        ctl = list(c.app.state.gateway.controllers._items.values())
    assert rules == {"learned", "fixed_plan", "uniform"}
    assert sum(x.state().mean_cost * x.state().requests for x in ctl) == pytest.approx(sum(drawn))
